//! Publication and the chunk stream ([`CHUNK_STREAM`], `docs/protocol.md`, "Chunk
//! stream"): the learner's publish, a node's pushes to its children in the plan (sending each
//! chunk as soon as it is held: store-and-forward per chunk), and receiving a push.
//!
//! Owns: both ends of the chunk stream. Must not touch: verification (`install::take_chunk`),
//! acceptance rules (`gossip`), the plan's ranking (`control::plan`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use control::plan::{plan_chains_with_reachability, ChainPlan, Placement};
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use p2p::framing::{read_frame, write_frame};
use p2p::{PeerId, TopicKind, Validation};
use storage::{Hash, SignedManifest, SnapshotManifest};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{blocking, open_err, BroadcastMode, Disseminator, PublishReport};
use crate::error::{DisseminationError, Result};
use crate::plan_msg::{PlanMessage, SignedPlan};
use crate::wire::{self, Hello, Reply, CHUNK_STREAM, MAX_HELLO_BYTES, MAX_INDEX_BYTES};

/// A framing error on a chunk frame: `InvalidData` (a length above the manifest's chunk
/// length, a malformed varint) means the sender broke the protocol — charged like a wrong
/// index; anything else is the stream failing.
fn chunk_frame_err(peer: PeerId, e: std::io::Error) -> DisseminationError {
    if e.kind() == std::io::ErrorKind::InvalidData {
        DisseminationError::Protocol {
            peer,
            reason: e.to_string(),
        }
    } else {
        DisseminationError::Io { peer, source: e }
    }
}

impl Disseminator {
    /// Learner: publish `payload` as snapshot `version` to `workers` (`(peer, score)`; the
    /// peer table's active rollout workers when `None`). Returns once the pushes to the first
    /// hops are started. The chunks are pushed from slices of `payload` (no copy); their files
    /// are written behind.
    pub async fn publish(
        &self,
        version: u64,
        model_config_hash: Hash,
        payload: bytes::Bytes,
        workers: Option<Vec<(PeerId, f64)>>,
    ) -> Result<PublishReport> {
        let key = self.signing_key()?;
        let cfg = &self.inner.cfg;
        // Hashing the chunks, storing them and collecting old versions take a CPU pass over
        // the payload and some file I/O (≈ 0.3 s for 256 MB): off the async workers, which
        // also drive the swarm and the streams.
        let (manifest, stats) = {
            let (swarm_id, chunk_size, learner_key) =
                (cfg.swarm_id.clone(), cfg.chunk_size, cfg.learner_key);
            let (store, key) = (self.inner.store.clone(), key.clone());
            blocking(move || -> Result<_> {
                let manifest = SnapshotManifest::build(
                    &swarm_id,
                    version,
                    model_config_hash,
                    &payload,
                    chunk_size,
                    &learner_key,
                )?
                .sign(&key)?;
                let stats = store.publish(&manifest, &payload)?;
                if let Err(e) = store.retain() {
                    warn!(error = %e, "chunk-store garbage collection failed");
                }
                Ok((manifest, stats))
            })
            .await?
        };
        // (peer, score, relay-only): a worker whose heartbeats say it is reachable only
        // through a relay ends a chain and never forwards (`control::plan`).
        let workers: Vec<(PeerId, f64, bool)> = match workers {
            Some(w) => w.into_iter().map(|(p, s)| (p, s, false)).collect(),
            None => self
                .inner
                .client
                .status()
                .await?
                .peers
                .into_iter()
                .filter(|p| p.active && p.role == Some(p2p::Role::Rollout))
                .filter_map(|p| {
                    let relay_only = p.reachability.is_some_and(|r| r.relay_only());
                    Some((p.peer_id.parse().ok()?, p.score.score, relay_only))
                })
                .collect(),
        };
        let plan: ChainPlan<PeerId> = match cfg.mode {
            BroadcastMode::Chain => plan_chains_with_reachability(&workers, &cfg.plan),
            BroadcastMode::Star => {
                let mut ws: Vec<PeerId> = workers.iter().map(|w| w.0).collect();
                ws.sort();
                ChainPlan {
                    chains: ws.into_iter().map(|w| vec![w]).collect(),
                    fetch_only: Vec::new(),
                }
            }
        };
        let seq = {
            let st = self.lock();
            st.plan
                .as_ref()
                .filter(|p| p.plan.version == version)
                .map_or(0, |p| p.plan.seq + 1)
        };
        let plan = PlanMessage::from_plan(&cfg.swarm_id, version, seq, &cfg.learner_key, &plan)
            .sign(&key)?;
        {
            let mut st = self.lock();
            st.manifest_version = Some(version);
            st.manifests.insert(version, manifest.clone());
            st.accepted_at.insert(version, Instant::now());
            st.plan = Some(plan.clone());
        }
        info!(
            version,
            chains = plan.plan.chains.len(),
            fetch_only = plan.plan.fetch_only.len(),
            new_chunks = stats.new_chunks,
            "publishing snapshot"
        );
        for (topic, bytes) in [
            (TopicKind::Snapshots, manifest.encode()),
            (TopicKind::Plans, plan.encode()),
        ] {
            if let Err(e) = self.inner.client.publish(topic, bytes).await {
                debug!(error = %e, ?topic, "not gossiped (no mesh peers yet?)");
            }
        }
        self.start_forwarding();
        Ok(PublishReport {
            manifest,
            plan,
            stats,
        })
    }

    /// Starts a push to this node's child(ren) in the current plan for every version it holds
    /// the manifest of — once per `(version, child)`.
    pub(super) fn start_forwarding(&self) {
        let targets: Vec<(u64, PeerId)> = {
            let st = self.lock();
            let Some(plan) = &st.plan else { return };
            let v = plan.plan.version;
            if !st.manifests.contains_key(&v) {
                return;
            }
            let children: Vec<PeerId> = if self.is_learner() {
                plan.plan
                    .chains
                    .iter()
                    .filter_map(|c| c.first().copied())
                    .collect()
            } else {
                match plan.plan.to_plan().placement(&self.inner.local) {
                    Some(Placement::Chain { child: Some(c), .. }) => vec![c],
                    _ => Vec::new(),
                }
            };
            children
                .into_iter()
                .filter(|c| !st.pushing.contains(&(v, *c)))
                .map(|c| (v, c))
                .collect()
        };
        for (v, child) in targets {
            self.lock().pushing.insert((v, child));
            let me = self.clone();
            let h = tokio::spawn(async move {
                if let Err(e) = me.push(v, child).await {
                    info!(%child, version = v, error = %e, "push ended early");
                }
            });
            self.track(h);
        }
    }

    /// Parent side of a chunk stream to `child`: the hello, the child's bitmap, then every
    /// chunk it lacks as soon as this node holds it, then the empty header frame.
    pub(super) async fn push(&self, version: u64, child: PeerId) -> Result<()> {
        let (manifest, plan) = {
            let st = self.lock();
            (st.manifests.get(&version).cloned(), st.plan.clone())
        };
        let Some(manifest) = manifest else {
            return Ok(());
        };
        let plan = plan.filter(|p| p.plan.version == version);
        let mut s = tokio::time::timeout(
            Duration::from_secs(10),
            self.inner
                .client
                .stream_control()
                .open_stream(child, CHUNK_STREAM),
        )
        .await
        .map_err(|_| DisseminationError::Timeout(format!("opening a chunk stream to {child}")))?
        .map_err(|e| open_err(child, "chunk-stream", e))?;
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        let hello = Hello {
            manifest: manifest.encode(),
            plan: plan.map(|p| p.encode()).unwrap_or_default(),
        };
        write_frame(&mut s, &hello.encode()).await.map_err(io)?;
        s.flush().await.map_err(io)?;
        let m = &manifest.manifest;
        let n = m.chunk_hashes.len();
        let reply = read_frame(&mut s, Reply::max_len(n), "stream reply")
            .await
            .map_err(io)?;
        let held = match Reply::decode(&reply, n)? {
            Reply::Refuse => {
                debug!(%child, version, "child refused the stream (holds a newer version?)");
                return Ok(());
            }
            Reply::Accept { held } => held,
        };
        let mut pending: Vec<usize> = (0..n).filter(|&i| !wire::bit(&held, i)).collect();
        let mut rx = self.inner.stored.subscribe();
        while !pending.is_empty() {
            rx.borrow_and_update();
            let mut sent = Vec::new();
            for &i in &pending {
                let h = &m.chunk_hashes[i];
                if !self.inner.store.has_chunk(h)? {
                    continue;
                }
                let bytes = self.read_chunk(*h).await?;
                self.inner.uplink.acquire(bytes.len() as u64).await;
                write_frame(&mut s, &wire::encode_index(i))
                    .await
                    .map_err(io)?;
                write_frame(&mut s, &bytes).await.map_err(io)?;
                self.count(
                    |c| &c.pushed_bytes,
                    bytes.len() as u64,
                    "dissemination_pushed_bytes_total",
                );
                sent.push(i);
            }
            pending.retain(|i| !sent.contains(i));
            if sent.is_empty() {
                s.flush().await.map_err(io)?;
                match tokio::time::timeout(self.inner.cfg.push_idle_timeout, rx.changed()).await {
                    Ok(Ok(())) => {}
                    _ => {
                        return Err(DisseminationError::Timeout(format!(
                            "no new chunk of v{version} to forward to {child}"
                        )))
                    }
                }
            }
        }
        // An empty header frame ends the stream.
        write_frame(&mut s, &[]).await.map_err(io)?;
        s.close().await.map_err(io)?;
        debug!(%child, version, "push complete");
        Ok(())
    }

    /// Child side of a chunk stream: accept the hello's manifest (and plan), answer with the
    /// bitmap of chunks already held, then verify and hold each chunk as it arrives — one is
    /// verified while the next is read — until the empty header frame.
    pub(super) async fn receive_push<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let hello = read_frame(&mut s, MAX_HELLO_BYTES, "stream hello")
            .await
            .map_err(io)?;
        let Hello {
            manifest: mbytes,
            plan: pbytes,
        } = Hello::decode(&hello).map_err(|e| DisseminationError::Protocol {
            peer,
            reason: e.to_string(),
        })?;
        let verdict = match SignedManifest::decode(&mbytes) {
            Ok(m) => (self.accept_manifest(&m), Some(m)),
            Err(_) => (Validation::Reject, None),
        };
        let manifest = match verdict {
            (Validation::Accept, Some(m)) => m,
            (v, _) => {
                if v == Validation::Reject {
                    self.charge(peer).await;
                }
                write_frame(&mut s, &Reply::Refuse.encode())
                    .await
                    .map_err(io)?;
                let _ = s.close().await;
                return Ok(());
            }
        };
        if !pbytes.is_empty() {
            if let Ok(p) = SignedPlan::decode(&pbytes) {
                let _ = self.accept_plan(&p);
            }
        }
        let m = &manifest.manifest;
        let n = m.chunk_hashes.len();
        let store = &self.inner.store;
        let mut held = Vec::with_capacity(n);
        for h in &m.chunk_hashes {
            held.push(store.has_chunk(h)?);
        }
        let reply = Reply::Accept {
            held: wire::bitmap(n, |i| held[i]),
        };
        write_frame(&mut s, &reply.encode()).await.map_err(io)?;
        s.flush().await.map_err(io)?;
        let started = Instant::now();
        let mut bytes_in = 0u64;
        // One chunk is verified (and stored, and copied into the assembly) while the next one
        // is read off the stream.
        let manifest = Arc::new(manifest.clone());
        let mut verifying: Option<(u32, JoinHandle<Result<bool>>)> = None;
        let settle = |v: Option<(u32, JoinHandle<Result<bool>>)>| async move {
            match v {
                None => Ok(None),
                Some((len, h)) => h
                    .await
                    .map_err(|e| DisseminationError::Task(e.to_string()))?
                    .map(|ok| Some((len, ok))),
            }
        };
        loop {
            let header = read_frame(&mut s, MAX_INDEX_BYTES, "chunk header")
                .await
                .map_err(|e| chunk_frame_err(peer, e))?;
            let index = match wire::decode_index(&header) {
                Ok(Some(i)) => i,
                // The empty header: the parent has sent everything.
                Ok(None) => break,
                Err(e) => {
                    return Err(DisseminationError::Protocol {
                        peer,
                        reason: e.to_string(),
                    })
                }
            };
            let Some(index) = usize::try_from(index).ok().filter(|&i| i < n) else {
                return Err(DisseminationError::Protocol {
                    peer,
                    reason: format!("chunk index {index} of {n}"),
                });
            };
            // Refused before allocating when longer than the manifest's chunk length.
            let expected = m.chunk_len(index);
            let buf = read_frame(&mut s, expected as usize, "chunk")
                .await
                .map_err(|e| chunk_frame_err(peer, e))?;
            let len = buf.len() as u32;
            if u64::from(len) != expected {
                return Err(DisseminationError::Protocol {
                    peer,
                    reason: format!("chunk {index}: {len} bytes, manifest says {expected}"),
                });
            }
            self.inner.downlink.acquire(u64::from(len)).await;
            let (me, m) = (self.clone(), manifest.clone());
            let next =
                tokio::spawn(async move { me.take_chunk(peer, &m.manifest, index, buf).await });
            match settle(verifying.replace((len, next))).await? {
                // Corrupt: drop the stream; the rest comes from elsewhere (repair).
                Some((_, false)) => return Ok(()),
                Some((l, true)) => bytes_in += self.received(l),
                None => {}
            }
        }
        match settle(verifying).await? {
            Some((_, false)) => return Ok(()),
            Some((l, true)) => bytes_in += self.received(l),
            None => {}
        }
        self.credit(peer, bytes_in, started.elapsed()).await;
        Ok(())
    }

    /// Counts `len` pushed bytes received and verified; returns them.
    pub(super) fn received(&self, len: u32) -> u64 {
        self.count(
            |c| &c.push_received_bytes,
            u64::from(len),
            "dissemination_push_received_bytes_total",
        );
        u64::from(len)
    }
}
