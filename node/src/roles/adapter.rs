//! Adapter versions at the roles (`docs/broadcast.md`, "Adapter snapshots"): what a LoRA
//! learner publishes ([`Shipping`]: the frozen base once as a full version, or not at all when
//! every node builds it from its own `[model]`, then only the adapters, in the snapshot dtype),
//! and how a worker installs an adapter version onto the base it holds ([`Bases`]), refusing
//! one trained on another base with both identities named ([`AdapterRefused`]).
//!
//! The dissemination engine carries an adapter payload like any other (chunked, verified per
//! hop, capped, repaired); the signed manifest names the base ([`storage::PayloadKind::Adapter`]).
//! A refusal happens at install, after the chunks were verified and forwarded: the payload is
//! what the learner signed, so no forwarder is at fault and none is struck.

use std::sync::Arc;

use anyhow::Context;
use policy::lora::Adapters;
use policy::{DType, Policy};
use storage::{hash_bytes, ChunkStore, Hash, PayloadKind};

use crate::config::NodeConfig;

/// The learner's side of a LoRA run: the base's identity and where workers get it.
#[derive(Debug, Clone, Copy)]
pub struct Shipping {
    /// `policy::lora::base_hash` of the frozen base (rounded to the snapshot dtype).
    pub base_hash: Hash,
    /// The version published as the base's full payload (version 0), or `None` when the base
    /// is the model every node builds from its `[model]` (no warm start).
    pub base_version: Option<u64>,
}

impl Shipping {
    /// The shipping plan of a learner whose frozen base is `base`: a warm-started base
    /// exists only on the learner, so it is published as version 0; otherwise the workers
    /// build it themselves.
    pub fn of(base: &Policy, warm_started: bool) -> anyhow::Result<Self> {
        Ok(Shipping {
            base_hash: base_identity(base)?,
            base_version: warm_started.then_some(0),
        })
    }

    /// The payload of `version` of `policy` (a LoRA policy) in `dtype`, with its manifest
    /// kind: the base as a full payload at the base version, the adapters otherwise.
    pub fn payload(
        &self,
        policy: &Policy,
        version: u64,
        dtype: DType,
    ) -> anyhow::Result<(Vec<u8>, PayloadKind)> {
        if self.base_version == Some(version) {
            let base = policy.base_view()?.to_safetensors_bytes_as(dtype)?;
            return Ok((base, PayloadKind::Full));
        }
        let adapters = policy
            .lora()
            .context("a LoRA run's policy has adapters")?
            .to_safetensors_bytes_as(policy.config(), dtype)?;
        let kind = PayloadKind::Adapter {
            base_version: self.base_version,
            base_hash: self.base_hash,
        };
        Ok((adapters, kind))
    }
}

/// What a delta of adapter payload `cur` against the previous one `prev` would save: the
/// fraction of stored values (bf16 or f32 words) that changed, and the size of the sparse
/// bf16 delta (`policy::delta`) as a fraction of `cur` (`None` for f32 payloads). `None` when
/// the two are not the same layout. Measured per published version (`docs/broadcast.md`,
/// "Adapter snapshots": with LoRA's learning rate nearly every value changes, so adapters go
/// out whole).
pub fn changed_fraction(prev: &[u8], cur: &[u8]) -> Option<(f64, Option<f64>)> {
    let header = |b: &[u8]| -> Option<usize> {
        let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        8usize.checked_add(usize::try_from(n).ok()?)
    };
    let start = header(cur)?;
    if prev.len() != cur.len() || header(prev)? != start || prev.get(..start) != cur.get(..start) {
        return None;
    }
    let word = match Adapters::stored_dtype(cur).ok()? {
        DType::BF16 => 2,
        _ => 4,
    };
    let (a, b) = (prev.get(start..)?, cur.get(start..)?);
    let words = a.len() / word;
    if words == 0 {
        return None;
    }
    let changed = a
        .chunks_exact(word)
        .zip(b.chunks_exact(word))
        .filter(|(x, y)| x != y)
        .count();
    let delta = (word == 2)
        .then(|| policy::delta::encode(prev, cur).ok())
        .flatten()
        .map(|d| d.len() as f64 / cur.len() as f64);
    Some((changed as f64 / words as f64, delta))
}

/// `policy::lora::base_hash` of `policy`'s weights (its base, for a LoRA policy).
pub fn base_identity(policy: &Policy) -> anyhow::Result<Hash> {
    let vars = policy.named_vars()?;
    Ok(policy::lora::base_hash(
        vars.iter().map(|(n, v)| (n.as_str(), v.as_tensor())),
    )?)
}

/// Why an adapter version was not installed. Nothing was loaded; the worker keeps sampling
/// with the version it has.
#[derive(Debug, thiserror::Error)]
pub enum AdapterRefused {
    /// The adapters were trained on another base than any this worker holds.
    #[error(
        "adapter v{version} is trained on base {expected}, this worker holds base {held} \
         ({held_from}): refused"
    )]
    BaseMismatch {
        version: u64,
        expected: String,
        held: String,
        held_from: String,
    },
    /// The payload does not decode as adapters of this model.
    #[error("adapter v{version}: {source}")]
    Payload {
        version: u64,
        source: policy::PolicyError,
    },
}

/// The bases a worker can put adapters on: the last full version it installed (a LoRA
/// run's published base), the one the manifest names from its chunk store, and its own
/// configured model rounded to the adapters' dtype. Identities are computed once, when an
/// adapter version first needs them.
pub struct Bases {
    config: NodeConfig,
    model: policy::ModelConfig,
    chunks: Arc<ChunkStore>,
    /// The last full version installed, and its identity once computed.
    published: Option<(u64, Arc<Policy>, Option<Hash>)>,
    /// The configured model's identity per dtype, and the model itself once it matched.
    local: Option<(DType, Hash, Option<Arc<Policy>>)>,
}

impl Bases {
    /// The bases of a worker configured by `config` for snapshots of `model`, whose chunk
    /// store is `chunks`.
    pub fn new(config: NodeConfig, model: policy::ModelConfig, chunks: Arc<ChunkStore>) -> Self {
        Bases {
            config,
            model,
            chunks,
            published: None,
            local: None,
        }
    }

    /// Records that full version `version` (weights `policy`) is installed.
    pub fn installed_full(&mut self, version: u64, policy: Arc<Policy>) {
        self.published = Some((version, policy, None));
    }

    /// The policy of adapter version `version` (`payload`, manifest kind `Adapter`) on the base
    /// it names, sharing the base's storage; refused when no held base has its identity.
    pub fn adapt(
        &mut self,
        version: u64,
        payload: &[u8],
        base_version: Option<u64>,
        base_hash: Hash,
    ) -> anyhow::Result<Policy> {
        let bad = |source| AdapterRefused::Payload { version, source };
        let dtype = Adapters::stored_dtype(payload).map_err(bad)?;
        let base = self.base(version, base_version, base_hash, dtype)?;
        let adapters =
            Adapters::from_safetensors_bytes(base.config(), payload, &policy::Device::Cpu)
                .map_err(bad)?;
        Ok(base.adapted(adapters).map_err(bad)?)
    }

    fn base(
        &mut self,
        version: u64,
        base_version: Option<u64>,
        want: Hash,
        dtype: DType,
    ) -> anyhow::Result<Arc<Policy>> {
        // The named base version from the chunk store when it is not the one installed (a
        // restart, or adapters that overtook their base).
        if let Some(b) = base_version.filter(|b| self.published.as_ref().is_none_or(|p| p.0 != *b))
        {
            if self.chunks.missing_chunks(b).is_ok_and(|m| m.is_empty()) {
                let bytes = self.chunks.assemble(b)?;
                let p = Policy::from_safetensors_bytes(&self.model, &bytes, &policy::Device::Cpu)?;
                self.published = Some((b, Arc::new(p), None));
            }
        }
        let mut held = None;
        if let Some((v, p, h)) = &mut self.published {
            if base_version.is_none_or(|b| b == *v) {
                let hash = match h {
                    Some(h) => *h,
                    None => *h.insert(base_identity(p)?),
                };
                if hash == want {
                    return Ok(p.clone());
                }
                held = Some((hash, format!("published v{v}")));
            }
        }
        let (hash, model) = self.local(dtype)?;
        if hash == want {
            if let Some(m) = model {
                return Ok(m);
            }
        }
        let (held, held_from) =
            held.unwrap_or((hash, format!("the configured model in {dtype:?}")));
        Err(AdapterRefused::BaseMismatch {
            version,
            expected: hex::encode(want),
            held: hex::encode(held),
            held_from,
        }
        .into())
    }

    /// The configured model rounded to `dtype`: its identity, and the model while it is in
    /// use as a base (kept only when some adapter version named it).
    fn local(&mut self, dtype: DType) -> anyhow::Result<(Hash, Option<Arc<Policy>>)> {
        if let Some((d, h, m)) = &self.local {
            if *d == dtype {
                return Ok((*h, m.clone()));
            }
        }
        let (p, _) = super::build_model(&self.config, &policy::Device::Cpu)?;
        p.round_weights_to(dtype)?;
        let h = base_identity(&p)?;
        tracing::info!(base = %hex::encode(h), ?dtype, "identity of the configured model as an adapter base");
        let p = Arc::new(p);
        self.local = Some((dtype, h, Some(p.clone())));
        Ok((h, Some(p)))
    }

    /// Drops the configured model (its identity stays known): a published base is installed,
    /// adapter versions name that one.
    fn release_local(&mut self) {
        if let Some((_, _, m)) = &mut self.local {
            *m = None;
        }
    }
}

/// Installs version `version` from the payload the engine (or the chunk store) delivered:
/// a full payload (after `delta` reconstructs it) into `slot`, an adapter payload onto its
/// base. Returns the BLAKE3 of the installed payload, hex.
pub fn install(
    slot: &rollout::PolicySlot,
    bases: &mut Bases,
    version: u64,
    payload: &[u8],
    kind: PayloadKind,
) -> anyhow::Result<String> {
    let root = hex::encode(hash_bytes(payload));
    match kind {
        PayloadKind::Adapter {
            base_version,
            base_hash,
        } => {
            let p = bases.adapt(version, payload, base_version, base_hash)?;
            slot.install(version, Arc::new(p))?;
        }
        _ => {
            slot.install_bytes(version, payload)?;
            if let Some(cur) = slot.current().filter(|c| c.version == version) {
                bases.installed_full(version, cur.policy.clone());
                bases.release_local();
            }
        }
    }
    Ok(root)
}

/// Installs the newest snapshot the chunk store rebuilds (a restarted worker resumes at once):
/// a delta version from its keyframe and the deltas since (`catchup::restore`, every link
/// checked against its signed root), an adapter version onto the base it names. Returns the
/// version, its payload (the base of the next delta) and the payload's root (hex), as
/// [`install`] hashed it.
pub fn install_stored(
    slot: &rollout::PolicySlot,
    bases: &mut Bases,
    chunks: &ChunkStore,
) -> anyhow::Result<Option<(u64, Vec<u8>, String)>> {
    let Some((v, payload)) = super::catchup::restore(chunks)? else {
        return Ok(None);
    };
    let kind = chunks
        .manifest(v)?
        .map_or(PayloadKind::Full, |m| m.manifest.payload);
    let root = install(slot, bases, v, &payload, kind)?;
    Ok(Some((v, payload, root)))
}

#[cfg(test)]
#[path = "adapter_tests.rs"]
mod tests;
