//! Catch-up of older versions a delta depends on (`docs/broadcast.md`, "Catch-up"): a worker
//! that cannot apply a delta (it missed the base, joined late, or restarted behind) obtains
//! the signed manifests of the versions on the delta's chain and completes their chunks over
//! the chunk-fetch protocol — from the workers that installed them first, the learner last.
//! The role decides what to fetch (`storage::deps::plan_catch_up`) and reconstructs; this
//! module only moves and verifies bytes.
//!
//! Owns: reading an older signed manifest (from the store, else the learner's chunk-fetch
//! manifest answer for that version) and completing an older version's chunks. Must not
//! touch: the acceptance marks (an older manifest fetched as a dependency is verified against
//! the learner key and the version asked for, but never accepted as the newest, never
//! acquired or pushed), the payload's meaning.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use storage::SignedManifest;
use tracing::{debug, info};

use super::fetch::{holders_in_order, spread_offset, Holders};
use super::{blocking, Disseminator};
use crate::error::{DisseminationError, Result};

impl Disseminator {
    /// The signed manifest of `version` for a catch-up: the one in this node's store, or the
    /// learner's answer to a manifest request for exactly that version — verified (learner
    /// key, this swarm, the version asked for) and stored before any of its chunks (garbage
    /// collection then knows it: `storage::deps::retained`). `Ok(None)`: the learner no longer
    /// holds it.
    pub async fn catch_up_manifest(&self, version: u64) -> Result<Option<SignedManifest>> {
        let store = self.inner.store.clone();
        if let Some(m) = blocking(move || store.manifest(version)).await? {
            return Ok(Some(m));
        }
        let learner = self.inner.learner;
        let answer = self.fetch_catch_up(learner, version).await?;
        if answer.manifest.is_empty() {
            return Ok(None);
        }
        let bad = |reason: String| DisseminationError::Protocol {
            peer: learner,
            reason,
        };
        let signed = SignedManifest::decode(&answer.manifest)
            .map_err(|e| bad(format!("catch-up manifest: {e}")))?;
        signed
            .verify(&self.inner.cfg.learner_key)
            .map_err(|e| bad(format!("catch-up manifest v{version}: {e}")))?;
        let m = &signed.manifest;
        if m.swarm_id != self.inner.cfg.swarm_id || m.version != version {
            return Err(bad(format!(
                "asked for v{version} of {}, got v{} of {}",
                self.inner.cfg.swarm_id, m.version, m.swarm_id
            )));
        }
        let store = self.inner.store.clone();
        let s2 = signed.clone();
        blocking(move || store.put_manifest(&s2)).await?;
        Ok(Some(signed))
    }

    /// Completes every chunk of `signed`'s version (a catch-up manifest): each verified
    /// against the manifest before it is stored, from connected workers that report the
    /// version (or a newer one on its chain) installed — each requester starting at its own
    /// offset among them — and the learner last. Returns the bytes fetched; an error when
    /// chunks are still missing after every holder was asked. The chunks reach the disk
    /// before it returns (a restart finds them).
    pub async fn complete_version(&self, signed: &SignedManifest) -> Result<u64> {
        let m = &signed.manifest;
        let version = m.version;
        let mut candidates = Vec::new();
        let (mut connected, mut complete) = (HashSet::new(), HashSet::new());
        for p in self.inner.client.peers().await.unwrap_or_default() {
            if p.banned || p.peer == self.inner.local {
                continue;
            }
            if p.connected {
                connected.insert(p.peer);
            }
            if p.installed_version.is_some_and(|v| v >= version) {
                complete.insert(p.peer);
                candidates.push(p.peer);
            }
        }
        candidates.retain(|p| *p != self.inner.learner);
        candidates.push(self.inner.learner);
        let order = holders_in_order(
            candidates,
            &Holders {
                connected: &connected,
                complete: &complete,
                learner: self.inner.learner,
                spread: spread_offset(&self.inner.local, version),
                // A catch-up asks complete holders only; no parent is waited for.
                silent: None,
            },
        );
        let before = self.inner.counters.fetched_bytes.load(Ordering::Relaxed);
        for peer in order {
            loop {
                let store = self.inner.store.clone();
                let missing = blocking(move || store.missing_chunks(version)).await?;
                if missing.is_empty() {
                    break;
                }
                match self.fetch_from(peer, m, &missing).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        debug!(%peer, version, error = %e, "catch-up fetch failed");
                        break;
                    }
                }
            }
        }
        let store = self.inner.store.clone();
        let missing = blocking(move || {
            store.flush();
            store.missing_chunks(version)
        })
        .await?;
        let fetched = self.inner.counters.fetched_bytes.load(Ordering::Relaxed) - before;
        if !missing.is_empty() {
            return Err(DisseminationError::Incomplete {
                version,
                missing: missing.len(),
            });
        }
        info!(version, fetched, "catch-up version complete");
        Ok(fetched)
    }
}
