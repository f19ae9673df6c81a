//! The per-node dissemination engine: learner publication, chain/star pushes, per-chunk
//! store-and-forward, fetch-by-hash serving and repair, installation (`docs/broadcast.md`).
//!
//! Owns: the [`CHUNK_STREAM`] and [`CHUNK_FETCH`] stream handlers of one node (it registers
//! both with the node's `libp2p_stream::Control`, so there is exactly one engine per node), the
//! acceptance state of manifests and plans (last accepted versions), the per-version transfer
//! state machines (`crate::transfer`) it feeds and obeys, the bulk-stream token buckets, and
//! the dissemination counters. Must not touch: the swarm itself (only through `p2p::Client`),
//! the model (payloads are opaque bytes), how plans are ranked (`control::plan`), the wire
//! layouts (`crate::wire`, `p2p::framing`).
//!
//! By job: [`gossip`] — accepting manifests, plans and orders, plan repair on departures;
//! [`push`] — publication and the chunk stream (both ends), [`session`] — where a push's
//! stream comes from (kept open between versions, or opened anew until the child is
//! reachable); [`fetch`] — the chunk-fetch
//! protocol (both ends), catch-up and repair rounds; [`install`] — verifying and holding each
//! received chunk, driving a version to installation.
//!
//! Safety rules, in the order they are applied to every chunk a node receives (push or
//! fetch): (1) the manifest was accepted (learner key, forward-moving version); (2) the frame's
//! index is in range and its length equals the manifest's chunk length; (3) its BLAKE3 equals
//! the manifest's hash for that index — only then is it stored, and only stored chunks are
//! forwarded or served, so nothing unverified ever leaves a node or gets installed (the
//! install re-checks the root hash on assembly). A mismatch is a strike against the sender
//! (`Offence::CorruptChunk`: a failed transfer in its score and a ban at once), drops the
//! stream, and excludes the sender from repair for that version.
//!
//! Stream rules: every read and write has a deadline ([`DisseminationConfig::read_timeout`],
//! plus time for a large frame at [`MIN_RATE_BYTES_PER_S`]; a child waits for its parent's
//! next chunk up to `push_idle_timeout` more, since the parent may itself be waiting); a child
//! reads only a small hello from a parent before the learner's signature is checked; both
//! ends of every push and fetch record the transfer in the other peer's score (bytes and time
//! on success, a failure when the other end broke off). Acceptance marks persist
//! ([`storage::replay::ReplayState`], `replay_path`), so a restarted node refuses old signed
//! manifests, plans and orders.

mod account;
mod catchup;
mod config;
mod counters;
mod fetch;
mod gossip;
mod install;
mod push;
mod receive;
mod session;
mod standing;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use futures::StreamExt;
use p2p::{Client, PeerId, TokenBucket, TransferEvent};
use storage::replay::ReplayState;
use storage::{ChunkStore, Hash, PublishStats, SignedManifest};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::assembly::Assembly;
use crate::delivery::Records;
use crate::error::{DisseminationError, Result};
use crate::plan_msg::SignedPlan;
use crate::transfer::{FeedStanding, Transfer};
use crate::wire::{CHUNK_FETCH, CHUNK_STREAM};

pub use account::ForwardingView;
use config::uplink_cap;
#[cfg(feature = "adversary")]
pub use config::Fault;
pub use config::{BroadcastMode, DisseminationConfig, DEFAULT_READ_TIMEOUT};
use counters::AtomicCounters;
pub use counters::BroadcastCounters;
pub use session::{DEFAULT_SESSION_IDLE_TIMEOUT, DEFAULT_WARM_UP_BYTES};

pub(crate) use p2p::framing::frame_deadline;
/// Slowest transfer rate a frame deadline allows for: a frame of `n` bytes may take
/// `read_timeout + n / MIN_RATE_BYTES_PER_S` (`p2p::framing::frame_deadline`).
pub use p2p::framing::MIN_RATE_BYTES_PER_S;

/// `fut` within `limit`, or [`DisseminationError::Timeout`] naming `what` and `peer`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    peer: PeerId,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, fut).await.map_err(|_| {
        DisseminationError::Timeout(format!("{what} with {peer}: nothing for {limit:?}"))
    })?
}

/// What the engine tells its role.
#[derive(Debug, Clone)]
pub enum DisseminationEvent {
    /// Every chunk of `version` verified and the reassembled payload matches the root hash:
    /// the role switches to it (the install callback).
    Installed {
        version: u64,
        payload: Arc<Vec<u8>>,
        /// What `payload` is (the signed manifest's word): the full snapshot, or a delta the
        /// role applies to the base it holds, checking the named full root before it loads.
        kind: storage::PayloadKind,
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
        /// The payload's size in bytes (the signed manifest's `total_len`).
        bytes: u64,
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

/// What [`Disseminator::publish`] did.
#[derive(Debug, Clone)]
pub struct PublishReport {
    pub manifest: SignedManifest,
    pub plan: SignedPlan,
    pub stats: PublishStats,
}

struct State {
    /// Newest manifest accepted (version).
    manifest_version: Option<u64>,
    manifests: HashMap<u64, SignedManifest>,
    accepted_at: HashMap<u64, Instant>,
    plan: Option<SignedPlan>,
    /// Sequence of the newest accepted activation order.
    order_seq: Option<u64>,
    /// When the last catch-up with the learner started (see `fetch::CATCH_UP_MIN_INTERVAL`).
    last_catch_up: Option<Instant>,
    installed: Option<u64>,
    /// Per version being (or recently) acquired: what is held, who is bad, what to do next.
    /// Its presence means an acquirer was started for that version.
    transfers: HashMap<u64, Transfer>,
    pushing: HashSet<(u64, PeerId)>,
    /// The newest version a push to each child was started for (older ones end early).
    newest_push: HashMap<PeerId, u64>,
    /// Chunk streams kept open to children between versions.
    sessions: session::Sessions<PeerId, libp2p::Stream>,
    /// Children whose chunk stream is being opened ahead of the manifest (`session`).
    warming: HashSet<PeerId>,
    /// Payloads being put together, per version being acquired (taken by the install).
    assemblies: HashMap<u64, SharedAssembly>,
    /// Worker: what each version's planned parent delivered (the receipts' source).
    deliveries: Records,
    /// Worker: the parent that failed this node's last version, if any (patience per node).
    feed: FeedStanding,
    /// Learner: receipts judged, the attribution ledger, the plans and install reports they
    /// are judged against.
    accounts: account::Accounts,
}

impl State {
    fn new(receipt_horizon: Duration) -> Self {
        State {
            manifest_version: None,
            manifests: HashMap::new(),
            accepted_at: HashMap::new(),
            plan: None,
            order_seq: None,
            last_catch_up: None,
            installed: None,
            transfers: HashMap::new(),
            pushing: HashSet::new(),
            newest_push: HashMap::new(),
            sessions: Default::default(),
            warming: HashSet::new(),
            assemblies: HashMap::new(),
            deliveries: Records::new(receipt_horizon),
            feed: FeedStanding::default(),
            accounts: Default::default(),
        }
    }
}

type SharedAssembly = Arc<Mutex<Option<Assembly>>>;

/// Marks a push that still has chunks to send, from the child's reply until its last chunk is
/// written (or the push ends early): counted in `Inner::sending`, which makes a worker decline
/// chunk fetches meanwhile (`fetch::declines_fetches`).
pub(super) struct Sending<'a>(&'a AtomicUsize);

impl<'a> Sending<'a> {
    pub(super) fn start(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Sending(n)
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Inner {
    cfg: DisseminationConfig,
    client: Client,
    store: Arc<ChunkStore>,
    local: PeerId,
    learner: PeerId,
    events: mpsc::UnboundedSender<DisseminationEvent>,
    state: Mutex<State>,
    /// Bumped after every chunk stored (pushes waiting for chunks to forward watch it), and
    /// when a parent's hello arrives (acquirers waiting for it look again).
    stored: watch::Sender<u64>,
    /// The engine's tasks, and the token that stops them all ([`Disseminator::shutdown`]).
    tasks: TaskTracker,
    cancel: CancellationToken,
    /// The newest installed version, for whoever waits on installs
    /// ([`Disseminator::installed_changes`]).
    installed: watch::Sender<Option<u64>>,
    /// Bumped when a chunk stream ends (complete, broken or corrupt): acquirers re-check at
    /// once and repair instead of waiting for the stall timeout.
    kick: watch::Sender<u64>,
    uplink: TokenBucket,
    /// Pushes of this node that still have chunks to send ([`Sending`]): while any is, a
    /// worker declines chunk fetches (`fetch::declines_fetches`).
    sending: AtomicUsize,
    downlink: TokenBucket,
    counters: AtomicCounters,
    /// Acceptance marks that survive a restart.
    replay: ReplayState,
    /// Learner: held while a plan is made, stored and gossiped (`publish_as`, `announce_plan`),
    /// so that a standing plan and a publication never sign the same sequence number twice.
    planning: tokio::sync::Mutex<()>,
    /// Learner: workers its admission rule does not admit ([`Disseminator::set_no_forward`]).
    no_forward: Mutex<HashSet<PeerId>>,
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
        let replay = match &cfg.replay_path {
            None => ReplayState::in_memory(),
            Some(path) => ReplayState::open(path)?,
        };
        if let Some(path) = replay.path() {
            debug!(path = %path.display(), marks = ?replay.marks(), "replay marks loaded");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let mut control = client.stream_control();
        let pushes = control
            .accept(CHUNK_STREAM)
            .map_err(|e| open_err(client.local_peer_id(), "chunk-stream", e))?;
        let fetches = control
            .accept(CHUNK_FETCH)
            .map_err(|e| open_err(client.local_peer_id(), "chunk-fetch", e))?;
        let cfg_stall = cfg.stall_timeout;
        let inner = Arc::new(Inner {
            uplink: TokenBucket::from_mbps(uplink_cap(&cfg)),
            sending: Default::default(),
            downlink: TokenBucket::from_mbps(cfg.downlink_mbps),
            local: client.local_peer_id(),
            learner,
            cfg,
            client,
            store,
            events: tx,
            // A receipt of silence waits a quarter of the stall timeout after acceptance: an
            // honest parent's hello is there by then, however slow its link
            // (`crate::delivery`).
            state: Mutex::new(State::new(cfg_stall / 4)),
            stored: watch::channel(0).0,
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            installed: watch::channel(None).0,
            kick: watch::channel(0).0,
            counters: AtomicCounters::default(),
            replay,
            planning: tokio::sync::Mutex::new(()),
            no_forward: Mutex::new(HashSet::new()),
        });
        let d = Disseminator { inner };
        let me = d.clone();
        // Per-peer bounds on streams served at once: a peer opening streams faster than they
        // are served has the extra ones dropped (an honest parent pushes one version at a
        // time, an honest fetcher asks a few holders).
        let push_slots = p2p::stream_limits::StreamSlots::default();
        d.spawn(async move {
            let mut pushes = pushes;
            while let Some((peer, stream)) = pushes.next().await {
                let Some(slot) = push_slots.try_acquire(peer) else {
                    warn!(%peer, "too many chunk streams from one peer at once: dropped");
                    metrics::counter!("dissemination_streams_refused_total", "kind" => "push")
                        .increment(1);
                    continue;
                };
                let me2 = me.clone();
                me.spawn(async move {
                    let _slot = slot;
                    match me2.receive_push(peer, stream).await {
                        Ok(()) => {}
                        // Out-of-range index, wrong chunk length, malformed chunk frame or
                        // hello body: the sender broke the protocol — a failed transfer
                        // against its score.
                        Err(e @ DisseminationError::Protocol { .. }) => {
                            warn!(%peer, error = %e, "chunk stream protocol violation");
                            me2.charge(peer).await;
                        }
                        // A parent that went silent past the deadline: a failed transfer.
                        Err(e @ DisseminationError::Timeout(_)) => {
                            info!(%peer, error = %e, "chunk stream timed out");
                            me2.charge(peer).await;
                        }
                        Err(e) => debug!(%peer, error = %e, "chunk stream ended with an error"),
                    }
                    me2.inner.kick.send_modify(|k| *k += 1);
                });
            }
        });
        let me = d.clone();
        let fetch_slots = p2p::stream_limits::StreamSlots::default();
        d.spawn(async move {
            let mut fetches = fetches;
            while let Some((peer, stream)) = fetches.next().await {
                let Some(slot) = fetch_slots.try_acquire(peer) else {
                    warn!(%peer, "too many chunk fetches from one peer at once: dropped");
                    metrics::counter!("dissemination_streams_refused_total", "kind" => "fetch")
                        .increment(1);
                    continue;
                };
                let me2 = me.clone();
                me.spawn(async move {
                    let _slot = slot;
                    if let Err(e) = me2.serve_fetch(peer, stream).await {
                        debug!(%peer, error = %e, "chunk fetch ended with an error");
                    }
                });
            }
        });
        Ok((d, rx))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// Runs `fut` as one of the engine's tasks: stopped at its next await once the engine
    /// shuts down ([`Disseminator::shutdown`]), and awaited by [`Disseminator::stopped`].
    fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let cancel = self.inner.cancel.clone();
        self.inner.tasks.spawn(async move {
            cancel.run_until_cancelled(fut).await;
        });
    }

    fn emit(&self, ev: DisseminationEvent) {
        let _ = self.inner.events.send(ev);
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
        #[cfg(feature = "adversary")]
        if self.inner.cfg.fault == Some(Fault::CorruptOutgoing) {
            let mut v = bytes.to_vec();
            v[0] ^= 0xff;
            return Ok(v.into());
        }
        Ok(bytes)
    }

    /// Whether this worker passes nothing on now (the silent test faults; never without the
    /// `adversary` feature).
    fn silent(&self) -> bool {
        #[cfg(feature = "adversary")]
        return match self.inner.cfg.fault {
            Some(Fault::SilentForwarder) => true,
            Some(Fault::SilentAfterInstalls(n)) => {
                self.inner.counters.installs.load(Ordering::Relaxed) >= n
            }
            _ => false,
        };
        #[cfg(not(feature = "adversary"))]
        false
    }

    /// Copies of each chunk this node pushes: one (more only under the `Overfeed` test fault).
    fn copies(&self) -> usize {
        #[cfg(feature = "adversary")]
        if self.inner.cfg.fault == Some(Fault::Overfeed) {
            return config::OVERFEED_COPIES;
        }
        1
    }

    /// Evidence against `peer` (a strike: a failed transfer in its score, towards a ban, or
    /// a ban at once for proof).
    async fn strike(&self, peer: PeerId, offence: crate::Offence) {
        let _ = self.inner.client.strike(peer, offence.report()).await;
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

    /// Stops every task of the engine at its next await (streams in flight are dropped);
    /// [`Disseminator::stopped`] resolves once all have ended.
    pub fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tasks.close();
    }

    /// Resolves once every task of the engine has ended (after [`Disseminator::shutdown`]).
    pub async fn stopped(&self) {
        self.inner.tasks.wait().await;
    }

    /// Learner: the workers that must not forward to anyone — those its admission rule does not
    /// admit (no ticket, no proof of work). The next plans seat them as they seat relay-only
    /// workers (`control::plan`): at the tail of a chain or fetch-only, never a parent, so a
    /// stranger that is neither admitted nor paying cannot head a chain and stall the workers
    /// below it. Replaces the previous set.
    pub fn set_no_forward(&self, peers: HashSet<PeerId>) {
        if let Ok(mut s) = self.inner.no_forward.lock() {
            *s = peers;
        }
    }

    /// Whether `peer` may be planned as a parent ([`Disseminator::set_no_forward`]).
    fn may_forward(&self, peer: &PeerId) -> bool {
        self.inner
            .no_forward
            .lock()
            .map_or(true, |s| !s.contains(peer))
    }

    /// The newest installed version.
    pub fn installed_version(&self) -> Option<u64> {
        self.lock().installed
    }

    /// Changes with every install (the newest installed version): wait on it instead of
    /// polling [`Disseminator::installed_version`].
    pub fn installed_changes(&self) -> watch::Receiver<Option<u64>> {
        self.inner.installed.subscribe()
    }

    /// The newest accepted plan.
    pub fn current_plan(&self) -> Option<SignedPlan> {
        self.lock().plan.clone()
    }

    /// Worker: the delivery receipts due now (newest first, at most
    /// [`p2p::MAX_HEARTBEAT_RECEIPTS`]), unsigned — the node signs them with its key and
    /// hands them to its heartbeats (`crate::delivery`).
    pub fn receipts(&self) -> Vec<p2p::DeliveryReceipt> {
        self.lock().deliveries.receipts(Instant::now())
    }
}
