//! The per-node dissemination engine: learner publication, chain/star pushes, per-chunk
//! store-and-forward, fetch-by-hash serving and repair, installation.
//!
//! Owns: the `CHUNK_STREAM` and `CHUNK_FETCH` stream handlers of one node (it registers both
//! with the node's `libp2p_stream::Control`, so there is exactly one engine per node), the
//! acceptance state of manifests and plans (last accepted versions), the bulk-stream token
//! buckets, and the dissemination counters. Must not touch: the swarm itself (only through
//! `p2p::Client`), the model (payloads are opaque bytes), how plans are ranked
//! (`control::plan`).
//!
//! Safety rules, in the order they are applied to every chunk a node receives (push or
//! fetch): (1) the manifest was accepted (learner key, forward-moving version); (2) the frame's
//! index is in range and its length equals the manifest's chunk length; (3) its BLAKE3 equals
//! the manifest's hash for that index — only then is it stored, and only stored chunks are
//! forwarded or served, so nothing unverified ever leaves a node or gets installed (the
//! install re-checks the root hash on assembly). A mismatch counts as a failed transfer
//! against the sender (`PeerScore`), drops the stream, and excludes the sender from repair
//! for that version.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::plan::{plan_chains, ChainPlan, Placement, PlanParams};
use ed25519_dalek::{SigningKey, VerifyingKey};
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use p2p::{protocols, Client, PeerId, TokenBucket, TopicKind, TransferEvent, Validation};
use storage::{ChunkStore, Hash, PublishStats, SignedManifest, SnapshotManifest};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::assembly::Assembly;
use crate::error::{DisseminationError, Result};
use crate::order_msg::{ActivationOrder, SignedOrder};
use crate::plan_msg::{PlanMessage, SignedPlan, MAX_PLAN_BYTES};
use crate::wire::{self, END_OF_STREAM, FETCH_MAGIC, MAX_FETCH_BATCH, STREAM_MAGIC};

/// How the learner sends a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Scored forwarding chains (ECHO-2 §4.2).
    Chain,
    /// The learner pushes to every worker itself (baseline).
    Star,
}

/// Deliberate misbehaviour, for tests of the verification and repair paths only: never set
/// outside tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Flip one byte of every chunk this node pushes or serves.
    CorruptOutgoing,
}

/// Settings of one node's engine.
#[derive(Debug, Clone)]
pub struct DisseminationConfig {
    pub swarm_id: String,
    /// The swarm's learner key: the only signer of manifests and plans accepted.
    pub learner_key: VerifyingKey,
    /// The learner's signing key (learner nodes only).
    pub signing_key: Option<SigningKey>,
    pub mode: Mode,
    /// Chain-planning inputs (`B0`, `B̂w`, score thresholds).
    pub plan: PlanParams,
    /// Snapshot chunk size in bytes (SPEC §5: 1 MiB).
    pub chunk_size: u32,
    /// Upload cap in Mbit/s (0 = unlimited); on the learner this is `B0`.
    pub uplink_mbps: f64,
    /// Download cap in Mbit/s (0 = unlimited).
    pub downlink_mbps: f64,
    /// A child that receives no chunk for this long fetches the missing ones elsewhere.
    pub stall_timeout: Duration,
    /// A push that waits this long for its next chunk (its own parent stalled) gives up.
    pub push_idle_timeout: Duration,
    pub fault: Option<Fault>,
}

impl DisseminationConfig {
    pub fn new(swarm_id: &str, learner_key: VerifyingKey) -> Self {
        DisseminationConfig {
            swarm_id: swarm_id.to_string(),
            learner_key,
            signing_key: None,
            mode: Mode::Chain,
            plan: PlanParams::default(),
            chunk_size: 1 << 20,
            uplink_mbps: 0.0,
            downlink_mbps: 0.0,
            stall_timeout: Duration::from_secs(5),
            push_idle_timeout: Duration::from_secs(60),
            fault: None,
        }
    }
}

/// What the engine tells its role.
#[derive(Debug, Clone)]
pub enum DisseminationEvent {
    /// Every chunk of `version` verified and the reassembled payload matches the root hash:
    /// the role switches to it (the install callback).
    Installed {
        version: u64,
        payload: Arc<Vec<u8>>,
        /// Since the manifest was accepted by this node.
        latency: Duration,
    },
    /// One more chunk of `version` verified and stored: `stored` chunks of it were newly
    /// stored by this node so far (chunks already held, e.g. unchanged since an earlier
    /// version, are not counted).
    Progress {
        version: u64,
        stored: usize,
        total: usize,
    },
    /// The learner's scheduler (re)stated this node's state in an accepted activation order:
    /// `active` = generate, otherwise stand by (stay connected, keep installing snapshots).
    Activation { seq: u64, active: bool },
    /// A chunk from `peer` failed verification (nothing was stored or forwarded).
    ChunkRejected {
        peer: PeerId,
        version: u64,
        index: usize,
    },
}

/// Byte and chunk counters since start.
#[derive(Debug, Default)]
struct Counters {
    pushed_bytes: AtomicU64,
    push_received_bytes: AtomicU64,
    fetched_bytes: AtomicU64,
    served_bytes: AtomicU64,
    chunks_stored: AtomicU64,
    chunks_rejected: AtomicU64,
    installs: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Chunk payload bytes this node sent on chunk streams (learner pushes and forwarding).
    pub pushed_bytes: u64,
    /// Chunk payload bytes received (and verified) on chunk streams.
    pub push_received_bytes: u64,
    /// Chunk payload bytes received (and verified) through fetches.
    pub fetched_bytes: u64,
    /// Chunk payload bytes served to fetches.
    pub served_bytes: u64,
    pub chunks_stored: u64,
    pub chunks_rejected: u64,
    pub installs: u64,
}

/// What [`Disseminator::publish`] did.
#[derive(Debug, Clone)]
pub struct PublishReport {
    pub manifest: SignedManifest,
    pub plan: SignedPlan,
    pub stats: PublishStats,
}

#[derive(Default)]
struct State {
    /// Newest manifest accepted (version).
    manifest_version: Option<u64>,
    manifests: HashMap<u64, SignedManifest>,
    accepted_at: HashMap<u64, Instant>,
    plan: Option<SignedPlan>,
    /// Sequence of the newest accepted activation order.
    order_seq: Option<u64>,
    installed: Option<u64>,
    acquiring: HashSet<u64>,
    pushing: HashSet<(u64, PeerId)>,
    /// Peers that served a corrupt chunk, per version: never asked again for it.
    bad: HashMap<u64, HashSet<PeerId>>,
    stored_per_version: HashMap<u64, usize>,
    /// Payloads being put together, per version being acquired (taken by the install).
    assemblies: HashMap<u64, SharedAssembly>,
    tasks: Vec<JoinHandle<()>>,
}

type SharedAssembly = Arc<Mutex<Option<Assembly>>>;

struct Inner {
    cfg: DisseminationConfig,
    client: Client,
    store: Arc<ChunkStore>,
    local: PeerId,
    learner: PeerId,
    events: mpsc::UnboundedSender<DisseminationEvent>,
    state: Mutex<State>,
    /// Bumped after every chunk stored (pushes waiting for chunks to forward watch it).
    stored: watch::Sender<u64>,
    /// Bumped when a chunk stream ends (complete, broken or corrupt): acquirers re-check at
    /// once and repair instead of waiting for the stall timeout.
    kick: watch::Sender<u64>,
    uplink: TokenBucket,
    downlink: TokenBucket,
    counters: Counters,
}

/// Handle to a node's dissemination engine (cheap to clone).
#[derive(Clone)]
pub struct Disseminator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Disseminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disseminator")
            .field("local", &self.inner.local)
            .finish()
    }
}

fn open_err(peer: PeerId, protocol: &'static str, e: impl std::fmt::Display) -> DisseminationError {
    DisseminationError::Open {
        peer,
        protocol,
        reason: e.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` (hashing, file I/O) on the blocking pool, off the async workers that drive the
/// swarm and the streams; a task that panicked is a [`DisseminationError::Task`].
async fn blocking<T, E>(f: impl FnOnce() -> std::result::Result<T, E> + Send + 'static) -> Result<T>
where
    T: Send + 'static,
    E: Into<DisseminationError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DisseminationError::Task(e.to_string()))?
        .map_err(Into::into)
}

impl Disseminator {
    /// Starts the engine: registers the chunk-stream and chunk-fetch handlers on `client`'s
    /// stream control. Returns the handle and the role's event stream.
    pub fn start(
        cfg: DisseminationConfig,
        client: Client,
        store: Arc<ChunkStore>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<DisseminationEvent>)> {
        let learner = p2p::peer_id_from_public(cfg.learner_key.to_bytes())?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut control = client.stream_control();
        let pushes = control
            .accept(protocols::CHUNK_STREAM)
            .map_err(|e| open_err(client.local_peer_id(), "chunk-stream", e))?;
        let fetches = control
            .accept(protocols::CHUNK_FETCH)
            .map_err(|e| open_err(client.local_peer_id(), "chunk-fetch", e))?;
        let inner = Arc::new(Inner {
            uplink: TokenBucket::from_mbps(cfg.uplink_mbps),
            downlink: TokenBucket::from_mbps(cfg.downlink_mbps),
            local: client.local_peer_id(),
            learner,
            cfg,
            client,
            store,
            events: tx,
            state: Mutex::new(State::default()),
            stored: watch::channel(0).0,
            kick: watch::channel(0).0,
            counters: Counters::default(),
        });
        let d = Disseminator { inner };
        let me = d.clone();
        let t1 = tokio::spawn(async move {
            let mut pushes = pushes;
            while let Some((peer, stream)) = pushes.next().await {
                let me2 = me.clone();
                let h = tokio::spawn(async move {
                    match me2.receive_push(peer, stream).await {
                        Ok(()) => {}
                        // Out-of-range index, wrong length, oversized or malformed hello: the
                        // sender broke the protocol — a failed transfer against its score.
                        Err(e @ DisseminationError::Protocol { .. }) => {
                            warn!(%peer, error = %e, "chunk stream protocol violation");
                            me2.charge(peer).await;
                        }
                        Err(e) => debug!(%peer, error = %e, "chunk stream ended with an error"),
                    }
                    me2.inner.kick.send_modify(|k| *k += 1);
                });
                me.track(h);
            }
        });
        let me = d.clone();
        let t2 = tokio::spawn(async move {
            let mut fetches = fetches;
            while let Some((peer, stream)) = fetches.next().await {
                let me2 = me.clone();
                let h = tokio::spawn(async move {
                    if let Err(e) = me2.serve_fetch(peer, stream).await {
                        debug!(%peer, error = %e, "chunk fetch ended with an error");
                    }
                });
                me.track(h);
            }
        });
        d.track(t1);
        d.track(t2);
        Ok((d, rx))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    fn track(&self, h: JoinHandle<()>) {
        let mut st = self.lock();
        st.tasks.retain(|t| !t.is_finished());
        st.tasks.push(h);
    }

    fn emit(&self, ev: DisseminationEvent) {
        let _ = self.inner.events.send(ev);
    }

    /// Adds to one of the counters and its Prometheus mirror.
    fn count(&self, which: impl Fn(&Counters) -> &AtomicU64, n: u64, metric: &'static str) {
        which(&self.inner.counters).fetch_add(n, Ordering::Relaxed);
        metrics::counter!(metric).increment(n);
    }

    /// A held chunk, to push or serve: from the store's memory tier when there (verified on
    /// arrival), else read from disk and re-verified on the blocking pool. With the
    /// `CorruptOutgoing` test fault, one byte is flipped.
    async fn read_chunk(&self, hash: Hash) -> Result<bytes::Bytes> {
        let bytes = match self.inner.store.cached_chunk(&hash) {
            Some(b) => b,
            None => {
                let store = self.inner.store.clone();
                blocking(move || store.get_chunk(&hash)).await?
            }
        };
        if self.inner.cfg.fault == Some(Fault::CorruptOutgoing) {
            let mut v = bytes.to_vec();
            v[0] ^= 0xff;
            return Ok(v.into());
        }
        Ok(bytes)
    }

    /// One failed transfer against `peer`'s ECHO score.
    async fn charge(&self, peer: PeerId) {
        let failed = TransferEvent {
            bytes: 0,
            duration: Duration::ZERO,
            success: false,
        };
        let _ = self.inner.client.record_transfer(peer, failed).await;
    }

    /// One successful transfer of `bytes` in `duration` for `peer`'s ECHO score (nothing when
    /// no bytes moved).
    async fn credit(&self, peer: PeerId, bytes: u64, duration: Duration) {
        if bytes > 0 {
            let ev = TransferEvent {
                bytes,
                duration,
                success: true,
            };
            let _ = self.inner.client.record_transfer(peer, ev).await;
        }
    }

    /// The learner's signing key (`NotLearner` on a worker).
    fn signing_key(&self) -> Result<SigningKey> {
        self.inner
            .cfg
            .signing_key
            .clone()
            .ok_or(DisseminationError::NotLearner)
    }

    fn is_learner(&self) -> bool {
        self.inner.cfg.signing_key.is_some()
    }

    /// Stops every task of the engine (streams in flight are dropped).
    pub fn shutdown(&self) {
        for t in self.lock().tasks.drain(..) {
            t.abort();
        }
    }

    pub fn counters(&self) -> CounterSnapshot {
        let c = &self.inner.counters;
        CounterSnapshot {
            pushed_bytes: c.pushed_bytes.load(Ordering::Relaxed),
            push_received_bytes: c.push_received_bytes.load(Ordering::Relaxed),
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            served_bytes: c.served_bytes.load(Ordering::Relaxed),
            chunks_stored: c.chunks_stored.load(Ordering::Relaxed),
            chunks_rejected: c.chunks_rejected.load(Ordering::Relaxed),
            installs: c.installs.load(Ordering::Relaxed),
        }
    }

    /// The newest installed version.
    pub fn installed_version(&self) -> Option<u64> {
        self.lock().installed
    }

    /// The newest accepted plan.
    pub fn current_plan(&self) -> Option<SignedPlan> {
        self.lock().plan.clone()
    }

    // ---------------------------------------------------------------- acceptance

    /// Verdict on a manifest: `Accept` (newer, or the same one again), `Ignore` (older: a
    /// replay), `Reject` (undecodable, wrong swarm, not signed by the learner key).
    pub fn accept_manifest(&self, signed: &SignedManifest) -> Validation {
        if let Err(e) = signed.verify(&self.inner.cfg.learner_key) {
            warn!(error = %e, "rejecting manifest");
            return Validation::Reject;
        }
        let v = signed.manifest.version;
        if signed.manifest.swarm_id != self.inner.cfg.swarm_id {
            warn!(swarm = %signed.manifest.swarm_id, "rejecting manifest of another swarm");
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            match st.manifest_version {
                Some(cur) if v < cur => return Validation::Ignore,
                Some(cur) if v == cur => {
                    return if st.manifests.get(&v) == Some(signed) {
                        Validation::Accept
                    } else {
                        Validation::Ignore
                    };
                }
                _ => {}
            }
            st.manifest_version = Some(v);
            st.manifests.insert(v, signed.clone());
            // Per-version bookkeeping is kept for the last 8 versions only.
            let recent = |k: &u64| k.saturating_add(8) > v;
            st.manifests.retain(|k, _| recent(k));
            st.accepted_at.retain(|k, _| recent(k));
            st.bad.retain(|k, _| recent(k));
            st.stored_per_version.retain(|k, _| recent(k));
            st.acquiring.retain(recent);
            st.pushing.retain(|(k, _)| recent(k));
            st.accepted_at.insert(v, Instant::now());
        }
        if let Err(e) = self.inner.store.put_manifest(signed) {
            warn!(error = %e, version = v, "cannot store manifest");
            return Validation::Ignore;
        }
        info!(
            version = v,
            chunks = signed.manifest.chunk_hashes.len(),
            "manifest accepted"
        );
        if !self.is_learner() {
            self.start_acquire(v);
        }
        self.start_forwarding();
        Validation::Accept
    }

    /// Verdict on a plan, with the same rules; a newer plan (re)starts forwarding.
    pub fn accept_plan(&self, signed: &SignedPlan) -> Validation {
        if let Err(e) = signed.verify(&self.inner.cfg.learner_key) {
            warn!(error = %e, "rejecting plan");
            return Validation::Reject;
        }
        let p = &signed.plan;
        if p.swarm_id != self.inner.cfg.swarm_id {
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            if let Some(cur) = &st.plan {
                let (cv, cs) = (cur.plan.version, cur.plan.seq);
                if (p.version, p.seq) < (cv, cs) {
                    return Validation::Ignore;
                }
                if (p.version, p.seq) == (cv, cs) {
                    return if cur == signed {
                        Validation::Accept
                    } else {
                        Validation::Ignore
                    };
                }
            }
            st.plan = Some(signed.clone());
        }
        debug!(version = p.version, seq = p.seq, "plan accepted");
        self.start_forwarding();
        Validation::Accept
    }

    /// Verdict on an activation order: the learner's key and signature, this swarm, a
    /// sequence that moves forward. An accepted order that names this node is passed to the
    /// role as [`DisseminationEvent::Activation`].
    pub fn accept_order(&self, signed: &SignedOrder) -> Validation {
        let o = match signed.verify(&self.inner.cfg.learner_key) {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "rejecting activation order");
                return Validation::Reject;
            }
        };
        if o.swarm_id != self.inner.cfg.swarm_id {
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            if st.order_seq.is_some_and(|s| o.seq <= s) {
                return Validation::Ignore;
            }
            st.order_seq = Some(o.seq);
        }
        if let Some(active) = o.state_of(&self.inner.local) {
            debug!(seq = o.seq, active, "activation order accepted");
            let _ = self
                .inner
                .events
                .send(DisseminationEvent::Activation { seq: o.seq, active });
        }
        Validation::Accept
    }

    /// Learner: sign and gossip an activation order (`seq` must grow; use the clock in ms).
    pub async fn publish_order(
        &self,
        seq: u64,
        active: Vec<PeerId>,
        standby: Vec<PeerId>,
    ) -> Result<SignedOrder> {
        let key = self.signing_key()?;
        let signed = ActivationOrder {
            swarm_id: self.inner.cfg.swarm_id.clone(),
            seq,
            created_unix_ms: storage::now_unix_ms(),
            learner_key: self.inner.cfg.learner_key.to_bytes(),
            active,
            standby,
        }
        .sign(&key)?;
        self.inner
            .client
            .publish(TopicKind::Plans, signed.encode())
            .await?;
        Ok(signed)
    }

    /// Validates a Snapshots / Plans gossip message (the role reports the verdict).
    pub fn on_gossip(&self, topic: TopicKind, data: &[u8]) -> Validation {
        match topic {
            TopicKind::Snapshots => match SignedManifest::decode(data) {
                Ok(m) => self.accept_manifest(&m),
                Err(e) => {
                    warn!(error = %e, "undecodable manifest");
                    Validation::Reject
                }
            },
            TopicKind::Plans if SignedOrder::is_order(data) => match SignedOrder::decode(data) {
                Ok(o) => self.accept_order(&o),
                Err(e) => {
                    warn!(error = %e, "undecodable activation order");
                    Validation::Reject
                }
            },
            TopicKind::Plans => match SignedPlan::decode(data) {
                Ok(p) => self.accept_plan(&p),
                Err(e) => {
                    warn!(error = %e, "undecodable plan");
                    Validation::Reject
                }
            },
            _ => Validation::Ignore,
        }
    }

    /// Learner: a peer went away. If it forwards in the current plan, excise it (its tail
    /// moves up to its nearest surviving ancestor, `ChainPlan::excise`), re-sign with the next
    /// sequence number, gossip, and push to any new first hop.
    pub async fn on_peer_disconnected(&self, peer: PeerId) {
        let Ok(key) = self.signing_key() else {
            return;
        };
        let new = {
            let mut st = self.lock();
            let Some(cur) = st.plan.clone() else { return };
            let mut plan = cur.plan.to_plan();
            if !plan.excise(&peer) {
                return;
            }
            let mut msg = PlanMessage::from_plan(
                &self.inner.cfg.swarm_id,
                cur.plan.version,
                cur.plan.seq + 1,
                &self.inner.cfg.learner_key,
                &plan,
            );
            msg.created_unix_ms = storage::now_unix_ms();
            match msg.sign(&key) {
                Ok(s) => {
                    st.plan = Some(s.clone());
                    s
                }
                Err(_) => return,
            }
        };
        info!(%peer, seq = new.plan.seq, "excised a departed forwarder; plan re-signed");
        if let Err(e) = self
            .inner
            .client
            .publish(TopicKind::Plans, new.encode())
            .await
        {
            debug!(error = %e, "re-signed plan not gossiped");
        }
        self.start_forwarding();
    }

    // ---------------------------------------------------------------- learner

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
        let workers = match workers {
            Some(w) => w,
            None => self
                .inner
                .client
                .status()
                .await?
                .peers
                .into_iter()
                .filter(|p| p.active && p.role.as_deref() == Some("rollout"))
                .filter_map(|p| Some((p.peer_id.parse().ok()?, p.score.score)))
                .collect(),
        };
        let plan: ChainPlan<PeerId> = match cfg.mode {
            Mode::Chain => plan_chains(&workers, &cfg.plan),
            Mode::Star => {
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

    // ---------------------------------------------------------------- pushing

    /// Starts a push to this node's child(ren) in the current plan for every version it holds
    /// the manifest of — once per `(version, child)`.
    fn start_forwarding(&self) {
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

    async fn push(&self, version: u64, child: PeerId) -> Result<()> {
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
                .open_stream(child, protocols::CHUNK_STREAM),
        )
        .await
        .map_err(|_| DisseminationError::Timeout(format!("opening a chunk stream to {child}")))?
        .map_err(|e| open_err(child, "chunk-stream", e))?;
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        s.write_all(STREAM_MAGIC).await.map_err(io)?;
        wire::write_blob(&mut s, &manifest.encode())
            .await
            .map_err(io)?;
        wire::write_blob(&mut s, &plan.map(|p| p.encode()).unwrap_or_default())
            .await
            .map_err(io)?;
        s.flush().await.map_err(io)?;
        if wire::read_u8(&mut s).await.map_err(io)? != 0 {
            debug!(%child, version, "child refused the stream (holds a newer version?)");
            return Ok(());
        }
        let m = &manifest.manifest;
        let n = m.chunk_hashes.len();
        let held = wire::read_blob(&mut s, "bitmap", n.div_ceil(8) as u32)
            .await
            .map_err(io)?;
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
                s.write_all(&(i as u32).to_be_bytes()).await.map_err(io)?;
                wire::write_blob(&mut s, &bytes).await.map_err(io)?;
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
        s.write_all(&END_OF_STREAM.to_be_bytes())
            .await
            .map_err(io)?;
        s.write_all(&0u32.to_be_bytes()).await.map_err(io)?;
        s.close().await.map_err(io)?;
        debug!(%child, version, "push complete");
        Ok(())
    }

    // ---------------------------------------------------------------- receiving

    /// Checks one received chunk against the manifest and stores it. `Ok(false)`: corrupt —
    /// not stored, the sender is charged. Hashing and file I/O run on the blocking pool, so
    /// many streams (or many in-process nodes) do not stall the async workers.
    async fn take_chunk(
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
            self.lock().bad.entry(m.version).or_default().insert(from);
            self.charge(from).await;
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
            // Counted, not recomputed: `missing_chunks` per chunk would be O(n²) per snapshot.
            let stored = {
                let mut st = self.lock();
                let c = st.stored_per_version.entry(m.version).or_insert(0);
                *c += 1;
                *c
            };
            self.emit(DisseminationEvent::Progress {
                version: m.version,
                stored,
                total: m.chunk_hashes.len(),
            });
        }
        Ok(true)
    }

    async fn receive_push<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        wire::expect_magic(&mut s, STREAM_MAGIC).await.map_err(io)?;
        let mbytes = wire::read_blob(&mut s, "manifest", wire::MAX_MANIFEST_BYTES)
            .await
            .map_err(io)?;
        let pbytes = wire::read_blob(&mut s, "plan", MAX_PLAN_BYTES as u32)
            .await
            .map_err(io)?;
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
                s.write_all(&[1]).await.map_err(io)?;
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
        s.write_all(&[0]).await.map_err(io)?;
        wire::write_blob(&mut s, &wire::bitmap(n, |i| held[i]))
            .await
            .map_err(io)?;
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
            let index = wire::read_u32(&mut s).await.map_err(io)?;
            if index == END_OF_STREAM {
                break;
            }
            let index = index as usize;
            if index >= n {
                return Err(DisseminationError::Protocol {
                    peer,
                    reason: format!("chunk index {index} of {n}"),
                });
            }
            let len = wire::read_u32(&mut s).await.map_err(io)?;
            if u64::from(len) != m.chunk_len(index) {
                return Err(DisseminationError::Protocol {
                    peer,
                    reason: format!(
                        "chunk {index}: {len} bytes, manifest says {}",
                        m.chunk_len(index)
                    ),
                });
            }
            let mut buf = vec![0u8; len as usize];
            s.read_exact(&mut buf).await.map_err(io)?;
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
    fn received(&self, len: u32) -> u64 {
        self.count(
            |c| &c.push_received_bytes,
            u64::from(len),
            "dissemination_push_received_bytes_total",
        );
        u64::from(len)
    }

    // ---------------------------------------------------------------- fetch

    async fn serve_fetch<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        wire::expect_magic(&mut s, FETCH_MAGIC).await.map_err(io)?;
        let version = wire::read_u64(&mut s).await.map_err(io)?;
        let count = wire::read_u32(&mut s).await.map_err(io)?;
        if count == 0 {
            return self.serve_manifest(peer, s, version).await;
        }
        if count > MAX_FETCH_BATCH {
            return Err(DisseminationError::Protocol {
                peer,
                reason: format!("fetch of {count} chunks > {MAX_FETCH_BATCH}"),
            });
        }
        let mut hashes = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let mut h = [0u8; 32];
            s.read_exact(&mut h).await.map_err(io)?;
            hashes.push(h);
        }
        for h in hashes {
            if !self.inner.store.has_chunk(&h)? {
                s.write_all(&[0]).await.map_err(io)?;
                continue;
            }
            let bytes = self.read_chunk(h).await?;
            self.inner.uplink.acquire(bytes.len() as u64).await;
            s.write_all(&[1]).await.map_err(io)?;
            wire::write_blob(&mut s, &bytes).await.map_err(io)?;
            self.count(
                |c| &c.served_bytes,
                bytes.len() as u64,
                "dissemination_served_bytes_total",
            );
        }
        s.close().await.map_err(io)?;
        Ok(())
    }

    /// A fetch with no hashes asks for the signed manifest of `version` (`u64::MAX`: the newest
    /// held) and the current plan for it: how a late joiner or restarted worker catches up.
    async fn serve_manifest<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
        version: u64,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let (manifest, plan) = {
            let st = self.lock();
            let v = if version == u64::MAX {
                st.manifest_version
            } else {
                Some(version)
            };
            let m = v.and_then(|v| st.manifests.get(&v).cloned());
            let p = st.plan.clone().filter(|p| {
                m.as_ref()
                    .is_some_and(|m| m.manifest.version == p.plan.version)
            });
            (m, p)
        };
        wire::write_blob(&mut s, &manifest.map(|m| m.encode()).unwrap_or_default())
            .await
            .map_err(io)?;
        wire::write_blob(&mut s, &plan.map(|p| p.encode()).unwrap_or_default())
            .await
            .map_err(io)?;
        s.close().await.map_err(io)?;
        Ok(())
    }

    /// Worker: a connection to the learner (at start, after a restart) or a learner heartbeat
    /// announcing a newer installed version than any manifest accepted here → ask the learner
    /// for its newest signed manifest and plan (verified like gossip), then acquire it.
    pub fn catch_up(&self, peer: PeerId, announced: Option<u64>) {
        if self.is_learner() || peer != self.inner.learner {
            return;
        }
        if let (Some(a), Some(have)) = (announced, self.lock().manifest_version) {
            if a <= have {
                return;
            }
        }
        let me = self.clone();
        let h = tokio::spawn(async move {
            if let Err(e) = me.request_manifest(peer).await {
                debug!(%peer, error = %e, "catch-up request failed");
            }
        });
        self.track(h);
    }

    /// Opens a chunk-fetch stream to `peer`, giving up after `limit`.
    async fn open_fetch(&self, peer: PeerId, limit: Duration) -> Result<p2p::Stream> {
        tokio::time::timeout(
            limit,
            self.inner
                .client
                .stream_control()
                .open_stream(peer, protocols::CHUNK_FETCH),
        )
        .await
        .map_err(|_| DisseminationError::Timeout(format!("opening a fetch stream to {peer}")))?
        .map_err(|e| open_err(peer, "chunk-fetch", e))
    }

    async fn request_manifest(&self, peer: PeerId) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let mut s = self.open_fetch(peer, Duration::from_secs(10)).await?;
        let mut req = Vec::with_capacity(16);
        req.extend_from_slice(FETCH_MAGIC);
        req.extend_from_slice(&u64::MAX.to_be_bytes());
        req.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&req).await.map_err(io)?;
        s.flush().await.map_err(io)?;
        let m = wire::read_blob(&mut s, "manifest", wire::MAX_MANIFEST_BYTES)
            .await
            .map_err(io)?;
        let p = wire::read_blob(&mut s, "plan", MAX_PLAN_BYTES as u32)
            .await
            .map_err(io)?;
        // Plan first: the acquirer then knows at once that this node is not in a chain.
        if !p.is_empty() {
            self.on_gossip(TopicKind::Plans, &p);
        }
        if !m.is_empty() {
            self.on_gossip(TopicKind::Snapshots, &m);
        }
        Ok(())
    }

    /// Fetches up to [`MAX_FETCH_BATCH`] of `wanted` (index, hash) from `peer`; returns how
    /// many verified chunks were stored. A corrupt chunk ends the exchange.
    async fn fetch_from(
        &self,
        peer: PeerId,
        m: &SnapshotManifest,
        wanted: &[(usize, Hash)],
    ) -> Result<usize> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let mut s = self.open_fetch(peer, Duration::from_secs(5)).await?;
        let batch = &wanted[..wanted.len().min(MAX_FETCH_BATCH as usize)];
        let mut req = Vec::with_capacity(16 + 32 * batch.len());
        req.extend_from_slice(FETCH_MAGIC);
        req.extend_from_slice(&m.version.to_be_bytes());
        req.extend_from_slice(&(batch.len() as u32).to_be_bytes());
        for (_, h) in batch {
            req.extend_from_slice(h);
        }
        s.write_all(&req).await.map_err(io)?;
        s.flush().await.map_err(io)?;
        let started = Instant::now();
        let mut got = 0usize;
        let mut bytes_in = 0u64;
        for &(index, _) in batch {
            if wire::read_u8(&mut s).await.map_err(io)? == 0 {
                continue;
            }
            let bytes = wire::read_blob(&mut s, "chunk", m.chunk_len(index) as u32)
                .await
                .map_err(io)?;
            let len = bytes.len() as u64;
            self.inner.downlink.acquire(len).await;
            if !self.take_chunk(peer, m, index, bytes).await? {
                return Ok(got);
            }
            got += 1;
            bytes_in += len;
            self.count(
                |c| &c.fetched_bytes,
                len,
                "dissemination_fetched_bytes_total",
            );
        }
        self.credit(peer, bytes_in, started.elapsed()).await;
        Ok(got)
    }

    /// One repair round: asks every candidate holder in turn for what is still missing.
    /// Candidates: the plan's other workers (own chain's ancestors first), the learner last
    /// (it holds everything but its uplink is the scarce resource).
    async fn repair_round(&self, version: u64, m: &SnapshotManifest) -> Result<usize> {
        let (plan, bad) = {
            let st = self.lock();
            (
                st.plan.clone().filter(|p| p.plan.version == version),
                st.bad.get(&version).cloned().unwrap_or_default(),
            )
        };
        let mut candidates: Vec<PeerId> = Vec::new();
        if let Some(p) = &plan {
            for c in &p.plan.chains {
                if let Some(k) = c.iter().position(|x| *x == self.inner.local) {
                    candidates.extend(c[..k].iter().rev().copied());
                }
            }
            for c in &p.plan.chains {
                candidates.extend(c.iter().copied());
            }
            candidates.extend(p.plan.fetch_only.iter().copied());
        }
        candidates.push(self.inner.learner);
        let mut seen = HashSet::new();
        candidates.retain(|c| *c != self.inner.local && !bad.contains(c) && seen.insert(*c));
        let mut total = 0;
        for peer in candidates {
            loop {
                let missing = self.inner.store.missing_chunks(version)?;
                if missing.is_empty() {
                    return Ok(total);
                }
                if self
                    .lock()
                    .bad
                    .get(&version)
                    .is_some_and(|b| b.contains(&peer))
                {
                    break;
                }
                match self.fetch_from(peer, m, &missing).await {
                    Ok(0) => break,
                    Ok(n) => total += n,
                    Err(e) => {
                        debug!(%peer, error = %e, "fetch failed");
                        break;
                    }
                }
            }
        }
        Ok(total)
    }

    /// Worker: drives `version` to installation — waits for pushed chunks, repairs on stall
    /// (or at once when fetch-only), installs when complete.
    fn start_acquire(&self, version: u64) {
        if !self.lock().acquiring.insert(version) {
            return;
        }
        let me = self.clone();
        let h = tokio::spawn(async move {
            if let Err(e) = me.acquire(version).await {
                warn!(version, error = %e, "snapshot acquisition failed");
            }
        });
        self.track(h);
    }

    async fn acquire(&self, version: u64) -> Result<()> {
        let Some(signed) = self.lock().manifests.get(&version).cloned() else {
            return Ok(());
        };
        let r = self.acquire_manifest(&signed.manifest).await;
        self.lock().assemblies.remove(&version);
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

    async fn acquire_manifest(&self, m: &SnapshotManifest) -> Result<()> {
        let version = m.version;
        self.start_assembly(m).await?;
        let mut rx = self.inner.stored.subscribe();
        let mut kick = self.inner.kick.subscribe();
        let stall = self.inner.cfg.stall_timeout;
        loop {
            {
                let st = self.lock();
                if st.installed.is_some_and(|i| i >= version)
                    || st.manifest_version.is_some_and(|v| v > version)
                {
                    return Ok(());
                }
            }
            rx.borrow_and_update();
            kick.borrow_and_update();
            if self.inner.store.missing_chunks(version)?.is_empty() {
                return self.install(version).await;
            }
            // Fetch-only: named so by the plan, or not in the plan at all (a late joiner).
            let fetch_only = self.lock().plan.as_ref().is_some_and(|p| {
                p.plan.version == version
                    && !matches!(
                        p.plan.to_plan().placement(&self.inner.local),
                        Some(Placement::Chain { .. })
                    )
            });
            let wait = if fetch_only { stall / 4 } else { stall };
            let stalled = tokio::select! {
                r = rx.changed() => if r.is_err() { return Ok(()) } else { false },
                _ = kick.changed() => true,
                _ = tokio::time::sleep(wait) => true,
            };
            if stalled || fetch_only {
                let n = self.repair_round(version, m).await?;
                if n > 0 {
                    info!(version, chunks = n, "fetched missing chunks from holders");
                }
            }
        }
    }

    async fn install(&self, version: u64) -> Result<()> {
        let (assembly, manifest) = {
            let mut st = self.lock();
            let a = st.assemblies.remove(&version);
            (
                a.and_then(|a| lock(&a).take()),
                st.manifests.get(&version).cloned(),
            )
        };
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
            latency,
        });
        // Then keep the newest `keep` snapshots and collect chunks nothing kept references
        // (SPEC §5) — after the role has the payload, not before.
        let store = self.inner.store.clone();
        if let Err(e) = blocking(move || store.retain()).await {
            warn!(error = %e, "chunk-store garbage collection failed");
        }
        Ok(())
    }
}
