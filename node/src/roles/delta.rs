//! Delta snapshots at the roles (`docs/broadcast.md`, "Delta snapshots"): the learner's
//! choice between a keyframe and a sparse bf16 delta against the payload it published last
//! ([`DeltaPublisher`]), and a worker's reconstruction of the full payload from a delta and
//! the payload it installed last ([`DeltaBase`]). The codec is `policy::delta`; the dissemination
//! engine carries a delta's bytes like any payload (chunked, verified per hop, forwarded
//! before anything is reconstructed), and the signed manifest names the base version and the
//! BLAKE3 root of the full payload ([`storage::PayloadKind`]).

use std::sync::Arc;

use policy::delta::{self, DeltaError};
use storage::{hash_bytes, Hash, PayloadKind};

/// The learner's side: what the previously published bf16 payload was, and when the last
/// keyframe went out.
pub struct DeltaPublisher {
    keyframe_every: u64,
    base: Option<Published>,
    last_keyframe: Option<u64>,
}

/// The version published last: the base of the next delta.
struct Published {
    version: u64,
    full: bytes::Bytes,
    /// BLAKE3 of `full`: known from a delta's manifest, hashed once otherwise.
    root: std::sync::OnceLock<Hash>,
}

impl DeltaPublisher {
    pub fn new(keyframe_every: u64) -> Self {
        DeltaPublisher {
            keyframe_every,
            base: None,
            last_keyframe: None,
        }
    }

    pub fn keyframe_every(&self) -> u64 {
        self.keyframe_every
    }

    /// What to publish as `version` whose full bf16 payload is `full`: the delta against the
    /// last published payload and its manifest kind, or `full` itself as a keyframe
    /// (`policy::delta::is_keyframe`; also when the payloads cannot be delta-coded); with
    /// the BLAKE3 root of `full`. CPU-bound (passes over both payloads): call it off the
    /// async workers.
    pub fn prepare(&self, version: u64, full: &bytes::Bytes) -> (bytes::Bytes, PayloadKind, Hash) {
        let full_root = hash_bytes(full);
        let keyframe = (full.clone(), PayloadKind::Full, full_root);
        let Some(Published {
            version: base_version,
            full: base,
            root,
        }) = &self.base
        else {
            return keyframe;
        };
        if *base_version >= version {
            return keyframe;
        }
        let base_root = *root.get_or_init(|| hash_bytes(base));
        let d = match delta::encode_hashed(base, base_root, full, full_root) {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(version, error = %e, "publishing a keyframe: no delta possible");
                return keyframe;
            }
        };
        if delta::is_keyframe(
            version,
            self.last_keyframe,
            self.keyframe_every,
            d.len(),
            full.len(),
        ) {
            return keyframe;
        }
        let kind = PayloadKind::Delta {
            base_version: *base_version,
            full_root,
        };
        (bytes::Bytes::from(d), kind, full_root)
    }

    /// Records that `version` (full payload `full`) went out as `kind`: it is the next base.
    pub fn published(&mut self, version: u64, full: bytes::Bytes, kind: PayloadKind) {
        let root = std::sync::OnceLock::new();
        match kind {
            PayloadKind::Full => self.last_keyframe = Some(version),
            PayloadKind::Delta { full_root, .. } => {
                let _ = root.set(full_root);
            }
            PayloadKind::Adapter { .. } => {}
        }
        self.base = Some(Published {
            version,
            full,
            root,
        });
    }
}

/// Why a delta version was not installed. Nothing was loaded; the worker stays on the
/// version it has and installs the next keyframe (or a delta against what it holds).
#[derive(Debug, thiserror::Error)]
pub enum DeltaRefused {
    /// The delta needs a base this worker does not hold (it missed a version, joined late or
    /// restarted).
    #[error("delta v{version} needs base v{needed}, this worker holds {held:?}")]
    NoBase {
        version: u64,
        needed: u64,
        held: Option<u64>,
    },
    /// The delta does not decode against the held base, or does not reconstruct what it names.
    #[error("delta v{version}: {source}")]
    Delta { version: u64, source: DeltaError },
    /// The delta reconstructed a payload, but not the one the signed manifest names.
    #[error("delta v{version} reconstructs root {found}, the manifest names {expected}")]
    RootMismatch {
        version: u64,
        expected: String,
        found: String,
    },
}

/// The worker's side: the full payload it installed last, the base of the next delta.
#[derive(Default, Clone)]
pub struct DeltaBase {
    held: Option<(u64, Arc<Vec<u8>>)>,
}

impl DeltaBase {
    /// The full payload of `version` from what the engine delivered: `payload` itself for a
    /// full payload; for a delta, the delta applied to the held base, accepted only if the
    /// base is the one the manifest names and the result hashes to the manifest's full root.
    pub fn full_payload(
        &self,
        version: u64,
        payload: Arc<Vec<u8>>,
        kind: PayloadKind,
    ) -> Result<Arc<Vec<u8>>, DeltaRefused> {
        let (base_version, full_root) = match kind {
            PayloadKind::Full | PayloadKind::Adapter { .. } => return Ok(payload),
            PayloadKind::Delta {
                base_version,
                full_root,
            } => (base_version, full_root),
        };
        let base = match &self.held {
            Some((v, b)) if *v == base_version => b,
            other => {
                return Err(DeltaRefused::NoBase {
                    version,
                    needed: base_version,
                    held: other.as_ref().map(|(v, _)| *v),
                })
            }
        };
        // `apply` checks the result against the hash the delta names: that hash must be the
        // signed root (no second pass over the full payload). Checked first, from the header.
        let found = delta::result_hash(&payload)
            .map_err(|source| DeltaRefused::Delta { version, source })?;
        if found != full_root {
            return Err(DeltaRefused::RootMismatch {
                version,
                expected: hex::encode(full_root),
                found: hex::encode(found),
            });
        }
        // A copy of the held base, rewritten in place: the held one stays the base until the
        // new version is installed.
        let full = delta::apply(base, &payload)
            .map_err(|source| DeltaRefused::Delta { version, source })?;
        Ok(Arc::new(full))
    }

    /// Records that `version`'s full payload `full` is installed: the base of the next delta.
    pub fn installed(&mut self, version: u64, full: Arc<Vec<u8>>) {
        self.held = Some((version, full));
    }

    /// The version held and its full payload.
    pub fn held(&self) -> Option<(u64, Arc<Vec<u8>>)> {
        self.held.clone()
    }

    /// Whether `version` is not newer than the version held (nothing to install).
    pub fn has(&self, version: u64) -> bool {
        self.held.as_ref().is_some_and(|(v, _)| *v >= version)
    }
}

/// The full payload of `version` from a chunk store that holds full payloads and deltas: the
/// chain of deltas back to the nearest full payload, applied forward ([`apply_chain`]).
/// `Ok(None)` when a link is no longer held (its manifest or a chunk).
pub fn assemble_full(store: &storage::ChunkStore, version: u64) -> anyhow::Result<Option<Vec<u8>>> {
    let mut chain = Vec::new();
    let mut v = version;
    loop {
        let Some(m) = store.manifest(v)? else {
            return Ok(None);
        };
        // A full or an adapter payload is whole (an adapter's base is not part of it).
        chain.push(v);
        match storage::deps::base_of(m.manifest.payload) {
            None => break,
            Some(b) if chain.len() < storage::deps::MAX_CHAIN => v = b,
            Some(_) => return Ok(None),
        }
    }
    chain.reverse();
    for &v in &chain {
        if !store.missing_chunks(v)?.is_empty() {
            return Ok(None);
        }
    }
    apply_chain(store, None, &chain).map(Some)
}

/// Applies `versions` (held complete in `store`, ascending) in order to `start` (the full
/// payload of the version before the first; `None` when the first is a full payload): a full
/// or adapter payload is taken as it is (the store checked its root hash on assembly), a delta is
/// applied to the payload before it and its result checked against the full root its signed
/// manifest names. The last version's full payload.
pub fn apply_chain(
    store: &storage::ChunkStore,
    start: Option<&[u8]>,
    versions: &[u64],
) -> anyhow::Result<Vec<u8>> {
    let mut cur: Option<Vec<u8>> = None;
    for &v in versions {
        let m = store
            .manifest(v)?
            .ok_or_else(|| anyhow::anyhow!("v{v}: manifest no longer held"))?
            .manifest;
        let bytes = store.assemble(v)?;
        let next = match m.payload {
            // Whole payloads (an adapter version is applied to its base at install, not here).
            PayloadKind::Full | PayloadKind::Adapter { .. } => bytes,
            kind => {
                // Checked before anything is applied: then the payload is rewritten in place
                // (one full payload in memory, not two), restored if the delta is refused.
                if delta::result_hash(&bytes)? != m.full_root() {
                    anyhow::bail!("delta v{v} does not reconstruct its signed full root");
                }
                let mut full = match cur.take() {
                    Some(p) => p,
                    None => start
                        .ok_or_else(|| anyhow::anyhow!("delta v{v} ({kind:?}) has no base"))?
                        .to_vec(),
                };
                // `apply_in_place` checks the result against the hash the delta names.
                delta::apply_in_place(&mut full, &bytes)?;
                full
            }
        };
        cur = Some(next);
    }
    cur.ok_or_else(|| anyhow::anyhow!("an empty chain"))
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
