//! A worker's way onto the learner's delta chain (`docs/broadcast.md`, "Catch-up"): at start,
//! the installed payload rebuilt from the durable chunk store ([`restore`]); when a delta
//! arrives whose base it does not hold (it missed a version, joined late, or restarted
//! behind), the deltas after what it holds — or the keyframe and the deltas since — fetched
//! over the chunk-fetch protocol and applied ([`catch_up`]). What to fetch is the pure rule
//! `storage::deps::plan_catch_up`; the dissemination engine moves and verifies the bytes
//! (`Disseminator::catch_up_manifest`, `Disseminator::complete_version`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use dissemination::Disseminator;
use storage::deps::{base_of, plan_catch_up, CatchUpPlan, Link};
use storage::{ChunkStore, SignedManifest};

use super::delta::apply_chain;
use crate::api::{InstalledPayload, PayloadPosition};

/// What the worker's status shows of its payload on the delta chain.
#[derive(Default)]
pub struct PayloadStats {
    installed: Mutex<Option<InstalledPayload>>,
    catch_ups: AtomicU64,
    catch_up_bytes: AtomicU64,
    restored: Mutex<Option<u64>>,
}

impl PayloadStats {
    /// `(installed payload, catch-ups, catch-up bytes, restored version)`.
    pub fn view(&self) -> (Option<InstalledPayload>, u64, u64, Option<u64>) {
        (
            self.installed.lock().ok().and_then(|g| g.clone()),
            self.catch_ups.load(Ordering::Relaxed),
            self.catch_up_bytes.load(Ordering::Relaxed),
            self.restored.lock().ok().and_then(|g| *g),
        )
    }

    pub fn set_installed(&self, p: InstalledPayload) {
        if let Ok(mut g) = self.installed.lock() {
            *g = Some(p);
        }
    }

    pub fn set_restored(&self, version: u64) {
        if let Ok(mut g) = self.restored.lock() {
            *g = Some(version);
        }
    }

    pub fn caught_up(&self, bytes: u64) {
        self.catch_ups.fetch_add(1, Ordering::Relaxed);
        self.catch_up_bytes.fetch_add(bytes, Ordering::Relaxed);
        metrics::counter!("node_catch_ups_total").increment(1);
        metrics::counter!("node_catch_up_bytes_total").increment(bytes);
    }
}

/// Where `version` stands on its chain, from the manifests the store holds: a keyframe, or a
/// delta so many links above the keyframe named (`None` when a link is no longer held).
pub fn position(store: &ChunkStore, version: u64) -> anyhow::Result<InstalledPayload> {
    let mut deltas = 0u64;
    let mut v = version;
    let keyframe = loop {
        let Some(m) = store.manifest(v)? else {
            break None;
        };
        match base_of(m.manifest.payload) {
            None => break Some(v),
            Some(b) if deltas < storage::deps::MAX_CHAIN as u64 => {
                deltas += 1;
                v = b;
            }
            Some(_) => break None,
        }
    };
    Ok(InstalledPayload {
        version,
        position: if deltas == 0 && keyframe == Some(version) {
            PayloadPosition::Keyframe
        } else {
            PayloadPosition::Delta
        },
        keyframe_version: keyframe,
        deltas_since_keyframe: deltas,
    })
}

/// The newest version whose full payload the durable chunk store rebuilds — its keyframe's
/// chunks and every delta after it, each checked against its signed manifest (the keyframe's
/// root hash, every delta's full root): what a restarted worker installs, and the base of the
/// next delta. `None` when nothing complete is held.
pub fn restore(store: &ChunkStore) -> anyhow::Result<Option<(u64, Vec<u8>)>> {
    for v in store.versions()?.into_iter().rev() {
        match super::delta::assemble_full(store, v) {
            Ok(Some(full)) => return Ok(Some((v, full))),
            Ok(None) => {}
            Err(e) => tracing::warn!(version = v, error = %e, "stored snapshot not rebuilt"),
        }
    }
    Ok(None)
}

/// The full payload of `target` for a worker that holds the full payload of `held` (if any)
/// and cannot apply `target` directly: the manifests of `target`'s chain are read (the store's,
/// else the learner's for that version) until the plan reaches what is held or a keyframe,
/// the planned versions' chunks are completed from holders, and the chain is applied — every
/// link checked against its signed full root. Returns the payload and the bytes fetched.
pub async fn catch_up(
    dissem: &Disseminator,
    store: &Arc<ChunkStore>,
    held: Option<(u64, Arc<Vec<u8>>)>,
    target: u64,
) -> anyhow::Result<Option<(Arc<Vec<u8>>, u64)>> {
    let held_version = held.as_ref().map(|(v, _)| *v);
    let mut links = BTreeMap::new();
    let mut manifests: BTreeMap<u64, SignedManifest> = BTreeMap::new();
    let (from, versions) = loop {
        match plan_catch_up(&links, held_version, target) {
            CatchUpPlan::UpToDate => return Ok(None),
            CatchUpPlan::Unreachable => {
                anyhow::bail!("v{target}: its chain of deltas does not end at a keyframe")
            }
            CatchUpPlan::NeedManifest(v) => {
                let m = dissem
                    .catch_up_manifest(v)
                    .await?
                    .with_context(|| format!("the learner no longer holds v{v}"))?;
                let s = store.clone();
                let missing = tokio::task::spawn_blocking(move || s.missing_chunks(v)).await??;
                let missing_bytes = missing.iter().map(|(i, _)| m.manifest.chunk_len(*i)).sum();
                links.insert(
                    v,
                    Link {
                        base: base_of(m.manifest.payload),
                        missing_bytes,
                    },
                );
                manifests.insert(v, m);
            }
            CatchUpPlan::Apply {
                from,
                versions,
                bytes,
            } => {
                tracing::info!(
                    target,
                    ?from,
                    ?versions,
                    bytes,
                    "catching up on the delta chain"
                );
                break (from, versions);
            }
        }
    };
    let mut fetched = 0;
    for v in &versions {
        fetched += dissem.complete_version(&manifests[v]).await?;
    }
    let start = from.and(held).map(|(_, p)| p);
    let s = store.clone();
    let full = tokio::task::spawn_blocking(move || {
        apply_chain(&s, start.as_deref().map(|p| &p[..]), &versions)
    })
    .await??;
    Ok(Some((Arc::new(full), fetched)))
}

/// Makes the chunk store hold the published base `base` that an adapter version names, for a
/// worker that joined after the base went out (the engine pushes the newest version only): its
/// signed manifest is asked of the learner and its chunks are fetched by hash from holders —
/// a catch-up to a keyframe ([`catch_up`]). The adapter install then finds the base in the
/// store (`adapter::Bases`). Nothing to do when the store holds it; a failure is logged, and
/// the install refuses as without it.
pub async fn fetch_base(
    dissem: Option<&Disseminator>,
    store: &Arc<ChunkStore>,
    base: u64,
    stats: &PayloadStats,
) {
    let s = store.clone();
    let held =
        tokio::task::spawn_blocking(move || s.missing_chunks(base).is_ok_and(|m| m.is_empty()))
            .await
            .unwrap_or(false);
    let Some(d) = dissem.filter(|_| !held) else {
        return;
    };
    match catch_up(d, store, None, base).await {
        Ok(Some((_, bytes))) => {
            stats.caught_up(bytes);
            tracing::info!(base, fetched_bytes = bytes, "fetched the adapters' base");
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(base, error = %format!("{e:#}"), "the adapters' base not fetched"),
    }
}

/// Whether an install failed only for want of the delta's base (the catch-up's case); a
/// delta that does not decode or reconstruct is refused, not caught up around.
pub fn needs_catch_up(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<super::delta::DeltaRefused>(),
        Some(super::delta::DeltaRefused::NoBase { .. })
    )
}

/// Catches up to `version` from what `base` holds ([`catch_up`]) and loads the result into
/// `slot`; its full payload and BLAKE3 root (hex), counted in `stats`.
pub async fn catch_up_and_load(
    dissem: Option<&Disseminator>,
    store: &Arc<ChunkStore>,
    slot: &rollout::PolicySlot,
    base: &super::delta::DeltaBase,
    version: u64,
    stats: &PayloadStats,
) -> anyhow::Result<(Arc<Vec<u8>>, String)> {
    let d = dissem.context("no dissemination engine to catch up with")?;
    let (full, bytes) = catch_up(d, store, base.held(), version)
        .await?
        .with_context(|| format!("v{version} is held already"))?;
    let slot = slot.clone();
    let r = tokio::task::spawn_blocking(move || {
        slot.install_bytes(version, &full)?;
        let root = hex::encode(storage::hash_bytes(&full));
        anyhow::Ok((full, root))
    })
    .await??;
    stats.caught_up(bytes);
    tracing::info!(version, fetched_bytes = bytes, "caught up");
    Ok(r)
}

impl PayloadStats {
    /// Records where the newly installed `version` stands on its chain (from the store's
    /// manifests, off the async workers).
    pub async fn note_installed(&self, store: &Arc<ChunkStore>, version: u64) {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || position(&s, version)).await {
            Ok(Ok(p)) => self.set_installed(p),
            Ok(Err(e)) => tracing::debug!(version, error = %e, "chain position unknown"),
            Err(e) => tracing::debug!(version, error = %e, "chain position task failed"),
        }
    }
}
