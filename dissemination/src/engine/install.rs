//! Acquiring a version on a worker: every received chunk is verified and held
//! ([`Disseminator::take_chunk`], the one entry for pushed and fetched chunks), copied into the
//! payload being assembled, and fed to the version's transfer state machine
//! (`crate::transfer`); the acquirer task feeds it the store's view, the plan and the reason it
//! woke, and carries out what it decides — repair, install, stop.
//!
//! Owns: the acquirer loop and installation (assembly, root-hash check, the `Installed` event,
//! garbage collection after it). Must not touch: wire formats, whom repair asks (`fetch`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use control::plan::Placement;
use control::units::mbps_to_bytes_per_s;
use p2p::PeerId;
use storage::SnapshotManifest;
use tracing::{debug, info, warn};

use super::{blocking, lock, DisseminationEvent, Disseminator, SharedAssembly};
use crate::assembly::Assembly;
use crate::error::Result;
use crate::transfer::{
    behind, hop_allowance, slow_feed, Action, Feed, Input, Transfer, Wake, HELLO_WAIT_SHARE,
};

impl Disseminator {
    /// Checks one received chunk against the manifest and stores it. `Ok(false)`: corrupt —
    /// not stored, the sender gets a `CorruptChunk` strike. Hashing and file I/O run on the
    /// blocking pool, so many streams (or many in-process nodes) do not stall the async
    /// workers.
    pub(super) async fn take_chunk(
        &self,
        from: PeerId,
        m: &SnapshotManifest,
        index: usize,
        bytes: Vec<u8>,
    ) -> Result<bool> {
        let expected = m.chunk_hashes[index];
        let ok_len = bytes.len() as u64 == m.chunk_len(index);
        let store = self.inner.store.clone();
        let assembly = self.lock().assemblies.get(&m.version).cloned();
        // `put_chunk_deferred` hashes the bytes and refuses a mismatch before anything is held:
        // that is the BLAKE3 check (done once, not here and again in the store). A verified
        // chunk is held in the store's memory tier — forwarded and assembled from there — and
        // written to disk behind.
        let verdict = blocking(move || -> Result<Option<bool>> {
            if !ok_len {
                return Ok(None);
            }
            let bytes = bytes::Bytes::from(bytes);
            match store.put_chunk_deferred(&expected, bytes.clone()) {
                Ok(new) => {
                    // Verified: into its place in the payload being assembled.
                    if let Some(a) = assembly {
                        if let Some(a) = lock(&a).as_mut() {
                            a.add(index, &bytes);
                        }
                    }
                    Ok(Some(new))
                }
                Err(storage::StorageError::HashMismatch { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        let Some(new) = verdict else {
            self.inner
                .counters
                .chunks_rejected
                .fetch_add(1, Ordering::Relaxed);
            metrics::counter!("dissemination_chunk_verification_failures_total").increment(1);
            warn!(peer = %from, version = m.version, index, "chunk failed BLAKE3 verification; dropped");
            self.apply(m.version, Input::Rejected { peer: from });
            // Evidence of bad data (not a network fault): a strike, which also counts as the
            // failed transfer in the sender's score.
            self.strike(from, crate::Offence::CorruptChunk).await;
            self.emit(DisseminationEvent::ChunkRejected {
                peer: from,
                version: m.version,
                index,
            });
            return Ok(false);
        };
        if new {
            self.inner
                .counters
                .chunks_stored
                .fetch_add(1, Ordering::Relaxed);
            self.inner.stored.send_modify(|c| *c += 1);
        } else {
            self.count(
                |c| &c.duplicate_bytes,
                m.chunk_len(index),
                "dissemination_duplicate_bytes_total",
            );
        }
        for action in self.apply(m.version, Input::Held { index, new }) {
            if let Action::Progress { stored, total } = action {
                self.emit(DisseminationEvent::Progress {
                    version: m.version,
                    stored,
                    total,
                    bytes: m.total_len,
                });
            }
        }
        Ok(true)
    }

    /// Feeds `input` to `version`'s transfer state machine; its actions (none when no
    /// acquisition of `version` was started, e.g. on the learner).
    pub(super) fn apply(&self, version: u64, input: Input) -> Vec<Action> {
        self.lock()
            .transfers
            .get_mut(&version)
            .map(|t| t.apply(input))
            .unwrap_or_default()
    }

    /// Worker: drives `version` to installation — waits for pushed chunks, repairs on stall
    /// (or at once when fetch-only), installs when complete. Started once per version: the
    /// transfer state is created here, before any chunk of it is taken.
    pub(super) fn start_acquire(&self, version: u64) {
        {
            let mut st = self.lock();
            let Some((chunks, chunk_size)) = st
                .manifests
                .get(&version)
                .map(|m| (m.manifest.chunk_hashes.len(), m.manifest.chunk_size))
            else {
                return;
            };
            if st.transfers.contains_key(&version) {
                return;
            }
            let stall = self.inner.cfg.stall_timeout;
            let hop = hop_allowance(
                chunk_size.into(),
                mbps_to_bytes_per_s(self.inner.cfg.plan.worker_mbps),
            );
            let hello_wait = st.deliveries.hello_wait(stall / HELLO_WAIT_SHARE);
            st.transfers.insert(
                version,
                Transfer::new(chunks, stall)
                    .with_hop(hop)
                    .with_hello_wait(hello_wait),
            );
            st.deliveries.accepted(version, std::time::Instant::now());
        }
        let me = self.clone();
        self.spawn(async move {
            if let Err(e) = me.acquire(version).await {
                warn!(version, error = %e, "snapshot acquisition failed");
            }
        });
    }

    pub(super) async fn acquire(&self, version: u64) -> Result<()> {
        let Some(signed) = self.lock().manifests.get(&version).cloned() else {
            return Ok(());
        };
        let r = self.acquire_manifest(&signed.manifest).await;
        {
            // The version's delivery record closes; whether its parent fed it sets this
            // node's patience with that parent (`transfer::FeedStanding`).
            let mut st = self.lock();
            let installed = st.installed == Some(version);
            let fed = st
                .deliveries
                .ended(version, installed, std::time::Instant::now())
                .map(|r| (r.parent, r.needed, r.fed_chunks));
            if let Some((parent, needed, fed)) = fed {
                st.feed.ended(parent, needed, fed);
            }
            st.assemblies.remove(&version);
        }
        // Whatever ended it (an error included), it no longer holds the fetches of newer
        // transfers back.
        self.apply(version, Input::Ended);
        r
    }

    /// Starts assembling `m`'s payload: chunks verified from now on are copied in as they
    /// arrive, and the chunks already held (a delta's unchanged ones, a resumed transfer) are
    /// copied in here.
    async fn start_assembly(&self, m: &SnapshotManifest) -> Result<()> {
        let a: SharedAssembly = Arc::new(Mutex::new(Some(Assembly::new(m))));
        self.lock().assemblies.insert(m.version, a.clone());
        let store = self.inner.store.clone();
        let hashes = m.chunk_hashes.clone();
        blocking(move || -> Result<()> {
            for (i, h) in hashes.iter().enumerate() {
                let wanted = lock(&a).as_ref().is_some_and(|a| !a.has(i));
                if wanted && store.has_chunk(h)? {
                    // A chunk file found corrupt here is dropped by the store and fetched again.
                    if let Ok(bytes) = store.get_chunk(h) {
                        if let Some(a) = lock(&a).as_mut() {
                            a.add(i, &bytes);
                        }
                    }
                }
            }
            Ok(())
        })
        .await
    }

    /// How this node receives `version` according to the current plan, and its parent there
    /// when that is a worker (`None`: the learner, or no parent).
    pub(super) fn feed(&self, version: u64) -> (Feed, Option<PeerId>) {
        let st = self.lock();
        match st.plan.as_ref().filter(|p| p.plan.version == version) {
            None => (Feed::Unplanned, None),
            Some(p) => match p.plan.to_plan().placement(&self.inner.local) {
                Some(Placement::Chain {
                    position, parent, ..
                }) => (Feed::Parent { position }, parent),
                // Named fetch-only, or not in the plan at all (a late joiner).
                _ => (Feed::FetchOnly, None),
            },
        }
    }

    /// The acquirer: on every wake it tells the transfer state machine what the store holds,
    /// how the plan feeds this node, whether a newer version overtook it, and why it woke —
    /// then does what the machine decides, and waits for the next chunk, stream end or stall.
    async fn acquire_manifest(&self, m: &SnapshotManifest) -> Result<()> {
        let version = m.version;
        self.start_assembly(m).await?;
        let mut rx = self.inner.stored.subscribe();
        let mut kick = self.inner.kick.subscribe();
        let mut wake = Wake::Check;
        loop {
            // Chunks stored and streams ended before this point are seen by the checks below.
            rx.borrow_and_update();
            kick.borrow_and_update();
            let (feed, parent) = self.feed(version);
            let (superseded, newer, behind, slow) = {
                let st = self.lock();
                // A version accepted after the installed one and before this one: skipped.
                let skipped = st
                    .manifests
                    .keys()
                    .any(|&k| k < version && st.installed.is_none_or(|i| k > i));
                let (fed, since_first) = st.deliveries.fed(version, std::time::Instant::now());
                let slow = slow_feed(
                    fed,
                    since_first,
                    m.chunk_size.into(),
                    mbps_to_bytes_per_s(self.inner.cfg.plan.worker_mbps),
                    self.inner.cfg.stall_timeout / HELLO_WAIT_SHARE,
                );
                let distrusted = st.feed.distrusts(parent.as_ref()) || slow;
                (
                    st.installed.is_some_and(|i| i >= version),
                    st.manifest_version.is_some_and(|v| v > version),
                    behind(feed, st.installed, skipped, distrusted),
                    slow,
                )
            };
            // The feed spoke: its hello for this version arrived — the planned parent's, or
            // the learner's for a first hop (`parent` names workers only). Without the
            // learner's, every first hop whose first chunk took longer than the hello wait
            // repaired a batch from the learner, against its own pushes, in every round
            // (`docs/netlab.md`, "The hello the first hops never heard").
            let hello = {
                let from = parent.unwrap_or(self.inner.learner);
                self.lock().deliveries.heard(version, &from)
            };
            let missing: Vec<usize> = if superseded {
                Vec::new()
            } else {
                let missing = self.inner.store.missing_chunks(version)?;
                missing.into_iter().map(|(i, _)| i).collect()
            };
            {
                let bytes = missing.iter().map(|&i| m.chunk_len(i)).sum();
                let mut st = self.lock();
                st.deliveries.began(version, parent, missing.len(), bytes);
            }
            let (actions, wait) = {
                let mut st = self.lock();
                // An older fetch-only transfer that is still completing has the node's fetches
                // to itself (`transfer`, "Superseded"): this one waits with its repair.
                let yield_to_older = st
                    .transfers
                    .iter()
                    .any(|(&v, t)| v < version && t.has_priority());
                let Some(t) = st.transfers.get_mut(&version) else {
                    return Ok(());
                };
                let mut actions = Vec::new();
                if superseded {
                    actions.extend(t.apply(Input::Superseded));
                } else {
                    t.apply(Input::Missing { indices: missing });
                    t.apply(Input::Plan(feed));
                    t.apply(Input::Behind(behind));
                    t.apply(Input::Hello(hello));
                    if newer {
                        actions.extend(t.apply(Input::Newer));
                    }
                }
                actions.extend(t.apply(Input::Woken(wake)));
                if yield_to_older {
                    actions.retain(|a| *a != Action::Repair);
                }
                (actions, t.stall_wait())
            };
            let mut repaired = false;
            let mut fruitless = false;
            for action in actions {
                match action {
                    Action::Stop => return Ok(()),
                    Action::Install => return self.install(version).await,
                    Action::Repair => {
                        debug!(version, ?wake, ?feed, hello, behind, slow, "repair round");
                        let n = self.repair_round(version, m, feed).await?;
                        if n > 0 {
                            info!(version, chunks = n, "fetched missing chunks from holders");
                        }
                        if self.apply(version, Input::Repaired { fetched: n }) == [Action::Stop] {
                            debug!(version, "a superseded transfer's chunks are gone: stopped");
                            return Ok(());
                        }
                        repaired = true;
                        fruitless = n == 0;
                    }
                    Action::Progress { .. } => {}
                }
            }
            if repaired && !fruitless {
                // Look again (complete now?) before waiting. After a round that found nothing,
                // a node that repairs at once (behind) waits first: no holder has more yet.
                wake = Wake::Check;
                continue;
            }
            wake = tokio::select! {
                r = rx.changed() => if r.is_err() { return Ok(()) } else { Wake::Stored },
                _ = kick.changed() => Wake::StreamEnded,
                _ = tokio::time::sleep(wait) => Wake::Timer,
            };
        }
    }

    pub(super) async fn install(&self, version: u64) -> Result<()> {
        let (assembly, manifest) = {
            let mut st = self.lock();
            let a = st.assemblies.remove(&version);
            (
                a.and_then(|a| lock(&a).take()),
                st.manifests.get(&version).cloned(),
            )
        };
        let kind = manifest
            .as_ref()
            .map_or(storage::PayloadKind::Full, |m| m.manifest.payload);
        let assembled = match (assembly, manifest) {
            (Some(a), Some(m)) => a.finish(&m.manifest),
            _ => None,
        };
        let payload = match assembled {
            Some(p) => p,
            None => {
                // Not assembled on the way in (or inconsistent): from the store, which checks
                // everything again and names what is wrong.
                let store = self.inner.store.clone();
                blocking(move || store.assemble(version)).await?
            }
        };
        let latency = {
            let mut st = self.lock();
            if st.installed.is_some_and(|i| i >= version) {
                return Ok(());
            }
            st.installed = Some(version);
            self.inner.installed.send_replace(Some(version));
            st.accepted_at
                .get(&version)
                .map_or(Duration::ZERO, |t| t.elapsed())
        };
        self.inner.counters.installs.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("dissemination_installs_total").increment(1);
        info!(
            version,
            bytes = payload.len(),
            ?latency,
            "snapshot installed"
        );
        self.emit(DisseminationEvent::Installed {
            version,
            payload: Arc::new(payload),
            kind,
            latency,
        });
        // Then keep the newest `keep` snapshots and collect chunks nothing kept references
        // (`docs/storage.md`) — after the role has the payload, not before.
        // The chunks reach the disk first: a worker killed after this install rebuilds the
        // payload from them at its restart (`docs/storage.md`, "Installed payload").
        let store = self.inner.store.clone();
        if let Err(e) = blocking(move || {
            store.flush();
            store.retain()
        })
        .await
        {
            warn!(error = %e, "chunk-store garbage collection failed");
        }
        Ok(())
    }
}
