//! Publication and the sending end of the chunk stream ([`CHUNK_STREAM`], `docs/protocol.md`,
//! "Chunk stream"): the learner's publish and a node's pushes to its children in the plan
//! (sending each chunk as soon as it is held: store-and-forward per chunk). The receiving end
//! is `receive`.
//!
//! Owns: the sending end of the chunk stream — its deadlines, the small hello (the child checks
//! the learner's signature before reading anything large) and the sending transfer records.
//! Must not touch: verification (`install::take_chunk`), acceptance rules (`gossip`), the
//! plan's ranking (`control::plan`).

use std::time::Instant;

use control::plan::{ChainPlan, Placement};
use control::seats::seat;
use control::units::mbps_to_bytes_per_s;
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use p2p::framing::{read_frame, write_frame, FrameError};
use p2p::{PeerId, TopicKind};
use storage::{Hash, PayloadKind, SignedManifest, SnapshotManifest};
use tracing::{debug, info, trace, warn};

use super::{
    blocking, frame_deadline, within, BroadcastMode, Disseminator, PublishReport, Sending, State,
};
use crate::error::{DisseminationError, Result};
use crate::plan_msg::{PlanMessage, SignedPlan};
use crate::wire::{self, Reply, StreamHello, MAX_STATUS_BYTES, STATUS_OK};

/// How a push ended without a stream error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PushEnd {
    /// Every chunk sent and the child confirmed them.
    Confirmed,
    /// The child reported a chunk that failed verification.
    ChildFailed,
    /// The child refused the hello (holds newer, or cannot verify it).
    Refused,
    /// This node's own parent stalled: nothing new to forward for `push_idle_timeout`.
    Stalled,
    /// A push of a newer version to the same child began: this one ended early (the child
    /// confirmed what it got), so that a slow link carries the newest version, not a queue of
    /// old ones.
    Superseded,
}

/// How far a push got: chunk bytes sent, and whether the child answered the hello.
#[derive(Debug, Default)]
struct Progress {
    sent: u64,
    replied: bool,
}

/// A framing error on a chunk frame: a length above the manifest's chunk length or a
/// malformed varint ([`FrameError::is_violation`]) means the sender broke the protocol —
/// charged like a wrong index; anything else is the stream failing.
pub(super) fn chunk_frame_err(peer: PeerId, e: FrameError) -> DisseminationError {
    if e.is_violation() {
        DisseminationError::Protocol {
            peer,
            reason: e.to_string(),
        }
    } else {
        DisseminationError::Io {
            peer,
            source: e.into(),
        }
    }
}

impl Disseminator {
    /// Learner: publish `payload` as snapshot `version` to `workers` (`(peer, score)`, ranked
    /// as given: no seat draw; the active workers of `p2p::Client::workers` when `None`).
    /// Returns once the pushes to the first hops are started. The chunks are pushed from
    /// slices of `payload` (no copy); their files
    /// are written behind.
    pub async fn publish(
        &self,
        version: u64,
        model_config_hash: Hash,
        payload: bytes::Bytes,
        workers: Option<Vec<(PeerId, f64)>>,
    ) -> Result<PublishReport> {
        self.publish_as(
            version,
            model_config_hash,
            payload,
            PayloadKind::Full,
            workers,
        )
        .await
    }

    /// [`Self::publish`] with the payload's kind named in the signed manifest: a
    /// [`PayloadKind::Delta`] payload travels, is verified per hop and is stored like any
    /// other; only the receiving role reconstructs the full payload from it.
    pub async fn publish_as(
        &self,
        version: u64,
        model_config_hash: Hash,
        payload: bytes::Bytes,
        kind: PayloadKind,
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
                let mut manifest = SnapshotManifest::build(
                    &swarm_id,
                    version,
                    model_config_hash,
                    &payload,
                    chunk_size,
                    &learner_key,
                )?;
                manifest.payload = kind;
                manifest.check()?;
                let manifest = manifest.sign(&key)?;
                let stats = store.publish(&manifest, &payload)?;
                if let Err(e) = store.retain() {
                    warn!(error = %e, "chunk-store garbage collection failed");
                }
                Ok((manifest, stats))
            })
            .await?
        };
        let _planning = self.inner.planning.lock().await;
        let plan = self.plan_for(version, workers).await?;
        {
            let mut st = self.lock();
            st.manifest_version = Some(version);
            st.manifests.insert(version, manifest.clone());
            st.accepted_at.insert(version, Instant::now());
            st.plan = Some(plan.clone());
            let chunk = u64::from(manifest.manifest.chunk_size);
            st.accounts.planned(version, chunk, &plan.plan.to_plan());
        }
        info!(
            version,
            chains = plan.plan.chains.len(),
            fetch_only = plan.plan.fetch_only.len(),
            new_chunks = stats.new_chunks,
            "publishing snapshot"
        );
        debug!(version, chains = ?plan.plan.chains, fetch_only = ?plan.plan.fetch_only, "plan");
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

    /// Learner: the plan for `version` over `workers` (`None`: the active workers, seats
    /// drawn), from the previous plan's order; the current plan itself when it is for this
    /// version and names the same chains (an announced standing plan), else signed with the
    /// next sequence number for `version`.
    pub(super) async fn plan_for(
        &self,
        version: u64,
        workers: Option<Vec<(PeerId, f64)>>,
    ) -> Result<SignedPlan> {
        let key = self.signing_key()?;
        let cfg = &self.inner.cfg;
        // A list given by the caller is ranked as given: no seat draw.
        let draw = workers.is_none();
        // (peer, score, relay-only): a worker whose heartbeats say it is reachable only
        // through a relay ends a chain and never forwards (`control::plan`); so does one the
        // learner does not admit (`Disseminator::set_no_forward`).
        let workers: Vec<(PeerId, f64, bool)> = match workers {
            Some(w) => w
                .into_iter()
                .map(|(p, s)| (p, s, !self.may_forward(&p)))
                .collect(),
            None => self
                .inner
                .client
                .workers()
                .await?
                .into_iter()
                .filter(|w| w.active)
                .map(|w| {
                    (
                        w.peer,
                        w.score,
                        w.relay_only() || !self.may_forward(&w.peer),
                    )
                })
                .collect(),
        };
        let plan: ChainPlan<PeerId> = match cfg.mode {
            // Starting from the previous version's plan keeps parent–child pairs (and their
            // push sessions) while scores only drift (`control::plan`, "Stability"); a new
            // plan epoch re-draws the seats, and the forwarding ledger's separations,
            // demotions and exclusions apply (`control::seats`, `account`).
            BroadcastMode::Chain => {
                let prev = self.lock().plan.as_ref().map(|p| p.plan.clone());
                let live: Vec<PeerId> = workers.iter().map(|w| w.0).collect();
                let prev_version = prev.as_ref().map(|p| p.version);
                let seating = self.seating(version, prev_version, &live, draw);
                let prev = prev.map(|p| p.to_plan());
                seat(&workers, &cfg.plan, prev.as_ref(), &seating)
            }
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
            let same_version = st.plan.as_ref().filter(|p| p.plan.version == version);
            if let Some(p) = same_version.filter(|p| p.plan.to_plan() == plan) {
                return Ok(p.clone());
            }
            same_version.map_or(0, |p| p.plan.seq + 1)
        };
        PlanMessage::from_plan(&cfg.swarm_id, version, seq, &cfg.learner_key, &plan).sign(&key)
    }

    /// Starts a push to this node's child(ren) in the current plan for every version it holds
    /// the manifest of — once per `(version, child)`.
    pub(super) fn start_forwarding(&self) {
        if self.silent() {
            return;
        }
        let targets: Vec<(u64, PeerId)> = {
            let st = self.lock();
            let Some(v) = st.plan.as_ref().map(|p| p.plan.version) else {
                return;
            };
            if !st.manifests.contains_key(&v) {
                return;
            }
            self.children(&st)
                .into_iter()
                .filter(|c| !st.pushing.contains(&(v, *c)))
                .map(|c| (v, c))
                .collect()
        };
        for (v, child) in targets {
            {
                let mut st = self.lock();
                st.pushing.insert((v, child));
                let newest = st.newest_push.entry(child).or_insert(v);
                *newest = (*newest).max(v);
            }
            // Older pushes to this child look again, and end (`PushEnd::Superseded`).
            self.inner.stored.send_modify(|_| {});
            let me = self.clone();
            self.spawn(async move {
                if let Err(e) = me.push(v, child).await {
                    info!(%child, version = v, error = %e, "push ended early");
                }
            });
        }
    }

    /// Whom this node pushes to under the current plan: the first hop of every chain (the
    /// learner) or its one child (a worker in a chain that is not its tail).
    pub(super) fn children(&self, st: &State) -> Vec<PeerId> {
        let Some(plan) = &st.plan else {
            return Vec::new();
        };
        if self.is_learner() {
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
        }
    }

    /// Parent side of a chunk stream to `child`: the hello, the child's bitmap, then every
    /// chunk it lacks as soon as this node holds it, then the empty header frame and the
    /// child's status. The transfer is recorded in the child's score: bytes and time when the
    /// child confirms every chunk, a failure when it broke off or reports one. The stream is
    /// the one kept open to `child` since its previous confirmed push when there is one
    /// (`session`), and is kept for its next push when this one is confirmed.
    pub(super) async fn push(&self, version: u64, child: PeerId) -> Result<()> {
        let (manifest, plan) = {
            let st = self.lock();
            (st.manifests.get(&version).cloned(), st.plan.clone())
        };
        let Some(manifest) = manifest else {
            return Ok(());
        };
        let plan = plan.filter(|p| p.plan.version == version);
        let limit = self.inner.cfg.read_timeout;
        let mut kept = self.session_or_warm_up(child).await;
        loop {
            let reused = kept.is_some();
            let mut s = match kept.take() {
                Some(s) => s,
                None => self.open_push_stream(version, child).await?,
            };
            let started = Instant::now();
            let mut progress = Progress::default();
            let end = self
                .push_on(&mut s, &manifest, plan.as_ref(), child, &mut progress)
                .await;
            // A kept stream that fails before the child's reply was closed at the child's end
            // while idle (its wait ran out, it restarted): not a failed transfer — once more
            // on a new stream.
            if reused && !progress.replied && end.is_err() {
                debug!(%child, version, error = ?end.err(), "kept chunk stream was closed; opening a new one");
                self.count(
                    |c| &c.sessions_stale,
                    1,
                    "dissemination_push_sessions_stale_total",
                );
                continue;
            }
            if reused {
                self.count(
                    |c| &c.sessions_reused,
                    1,
                    "dissemination_push_sessions_reused_total",
                );
            }
            match &end {
                Ok(PushEnd::Confirmed | PushEnd::Superseded) => {
                    self.credit(child, progress.sent, started.elapsed()).await
                }
                Ok(PushEnd::Refused | PushEnd::Stalled) => {}
                // The child reported a failure, dropped the stream, broke the protocol or went
                // silent: a failed transfer in its score. Local errors (the store) are not its.
                Ok(PushEnd::ChildFailed)
                | Err(
                    DisseminationError::Io { .. }
                    | DisseminationError::Timeout(_)
                    | DisseminationError::Protocol { .. }
                    | DisseminationError::Decode { .. },
                ) => self.charge(child).await,
                Err(_) => {}
            }
            if matches!(end, Ok(PushEnd::Confirmed | PushEnd::Superseded)) {
                self.keep_session(child, s);
            } else {
                let _ = tokio::time::timeout(limit, s.close()).await;
            }
            return match end? {
                PushEnd::Stalled => Err(DisseminationError::Timeout(format!(
                    "no new chunk of v{version} to forward to {child}"
                ))),
                PushEnd::ChildFailed => Err(DisseminationError::Protocol {
                    peer: child,
                    reason: format!("reported a failed transfer of v{version}"),
                }),
                PushEnd::Confirmed | PushEnd::Refused | PushEnd::Superseded => Ok(()),
            };
        }
    }

    /// The parent's side of one transfer on a chunk stream; records how far it got in
    /// `progress`.
    async fn push_on<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: &mut S,
        manifest: &SignedManifest,
        plan: Option<&SignedPlan>,
        child: PeerId,
        progress: &mut Progress,
    ) -> Result<PushEnd> {
        let version = manifest.manifest.version;
        let limit = self.inner.cfg.read_timeout;
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        self.restart_stale_congestion(child, version);
        let Some(held) = self.offer(s, manifest, plan, child, progress).await? else {
            return Ok(PushEnd::Refused);
        };
        let ended_early = match self
            .send_missing(s, manifest, &held, child, progress)
            .await?
        {
            Some(ended_early) => ended_early,
            None => return Ok(PushEnd::Stalled),
        };
        // An empty header frame ends the stream; the child answers with its status once the
        // last chunk is verified.
        within(limit, "ending the stream", child, async {
            write_frame(s, &[]).await.map_err(io)?;
            s.flush().await.map_err(io)
        })
        .await?;
        let status = within(limit, "the child's status", child, async {
            read_frame(s, MAX_STATUS_BYTES, "stream status")
                .await
                .map_err(|e| chunk_frame_err(child, e))
        })
        .await?;
        debug!(%child, version, ?status, ended_early, "push complete");
        Ok(match (status == [STATUS_OK], ended_early) {
            (false, _) => PushEnd::ChildFailed,
            (true, false) => PushEnd::Confirmed,
            (true, true) => PushEnd::Superseded,
        })
    }

    /// Before a push: a kept connection's congestion control may have learnt a tiny
    /// bandwidth from the gossip it carried since the last push (`p2p::congestion`). When
    /// this node paces the push itself (an uplink cap), the push is app-limited: BBR is
    /// restarted every time, which measured best there (1.21× against 1.46× the bound at
    /// N = 8, 100 ms, 0.5 % loss). When the path is the limit, only a stale model (below 80 %
    /// of B̂w) is restarted: a restart's STARTUP overshoot queues at the bottleneck (1.64×
    /// with every push restarted against 1.43× with models kept, `docs/netlab.md`).
    fn restart_stale_congestion(&self, child: PeerId, version: u64) {
        let pace = if self.inner.uplink.is_limited() {
            f64::INFINITY
        } else {
            mbps_to_bytes_per_s(self.inner.cfg.plan.worker_mbps)
        };
        let restarted = self.inner.client.restart_congestion(&child, pace);
        if restarted > 0 {
            trace!(%child, version, restarted, "congestion control restarted");
        }
    }

    /// The transfer's opening: the hello (the signed manifest, inline when small enough, and
    /// the plan), then the child's reply: the bitmap of the chunks it holds, or `None` when it
    /// refuses (it holds a newer version, or cannot verify the manifest).
    async fn offer<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: &mut S,
        manifest: &SignedManifest,
        plan: Option<&SignedPlan>,
        child: PeerId,
        progress: &mut Progress,
    ) -> Result<Option<Vec<u8>>> {
        let version = manifest.manifest.version;
        let limit = self.inner.cfg.read_timeout;
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        let plan_bytes = plan.map(|p| p.encode());
        let encoded = manifest.encode();
        let hello = StreamHello::new(version, &encoded, plan_bytes.as_deref());
        // A child without the manifest asks the learner for it before it replies: open, ask,
        // read (each within the deadline).
        let reply_wait = if hello.manifest.is_empty() {
            frame_deadline(limit * 3, encoded.len() as u64)
        } else {
            limit
        };
        within(limit, "sending the hello", child, async {
            write_frame(s, &hello.encode()).await.map_err(io)?;
            s.flush().await.map_err(io)
        })
        .await?;
        debug!(%child, version, "hello sent");
        let n = manifest.manifest.chunk_hashes.len();
        let reply = within(reply_wait, "the stream reply", child, async {
            read_frame(s, Reply::max_len(n), "stream reply")
                .await
                .map_err(|e| chunk_frame_err(child, e))
        })
        .await?;
        progress.replied = true;
        Ok(match Reply::decode(&reply, n)? {
            Reply::Refuse => {
                debug!(%child, version, "child refused the stream (holds a newer version?)");
                None
            }
            Reply::Accept { held } => Some(held),
        })
    }

    /// Sends every chunk the child does not hold, each as soon as this node holds it (a
    /// relay forwards what its own parent has delivered so far), under the uplink cap.
    /// Returns whether a newer version's push to this child ended it early, or `None` when
    /// no new chunk arrived for `push_idle_timeout` (stalled).
    async fn send_missing<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: &mut S,
        manifest: &SignedManifest,
        held: &[u8],
        child: PeerId,
        progress: &mut Progress,
    ) -> Result<Option<bool>> {
        let m = &manifest.manifest;
        let version = m.version;
        let limit = self.inner.cfg.read_timeout;
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        let n = m.chunk_hashes.len();
        let mut pending: Vec<usize> = (0..n).filter(|&i| !wire::bit(held, i)).collect();
        let mut rx = self.inner.stored.subscribe();
        let _sending = Sending::start(&self.inner.sending);
        let superseded = || {
            let st = self.lock();
            st.newest_push.get(&child).is_some_and(|&v| v > version)
        };
        let mut ended_early = false;
        while !pending.is_empty() && !ended_early {
            rx.borrow_and_update();
            let mut done = Vec::new();
            for &i in &pending {
                if superseded() {
                    ended_early = true;
                    break;
                }
                let h = &m.chunk_hashes[i];
                if !self.inner.store.has_chunk(h)? {
                    continue;
                }
                let bytes = self.read_chunk(*h).await?;
                self.inner.uplink.acquire(bytes.len() as u64).await;
                let deadline = frame_deadline(limit, bytes.len() as u64);
                for _ in 0..self.copies() {
                    within(deadline, "sending a chunk", child, async {
                        write_frame(s, &wire::encode_index(i)).await.map_err(io)?;
                        write_frame(s, &bytes).await.map_err(io)
                    })
                    .await?;
                }
                progress.sent += bytes.len() as u64;
                self.count(
                    |c| &c.pushed_bytes,
                    bytes.len() as u64,
                    "dissemination_pushed_bytes_total",
                );
                done.push(i);
            }
            pending.retain(|i| !done.contains(i));
            if done.is_empty() && !ended_early {
                within(limit, "flushing chunks", child, async {
                    s.flush().await.map_err(io)
                })
                .await?;
                match tokio::time::timeout(self.inner.cfg.push_idle_timeout, rx.changed()).await {
                    Ok(Ok(())) => {}
                    _ => return Ok(None),
                }
            }
        }
        Ok(Some(ended_early))
    }
}
