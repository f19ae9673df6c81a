//! The public face of the network service: the cloneable [`Client`] handle and the commands
//! it sends, the domain [`Event`]s the service emits, the role's [`Validation`] verdict, and the
//! status view ([`NetworkStatus`], [`PeerStatus`], [`NetworkCounters`]).
//!
//! Owns: the types roles see and the bounded command channel protocol. Must not touch: the
//! swarm (only the service task in [`crate::service`] does) or any libp2p behaviour.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, RwLock};

use libp2p::gossipsub::MessageId;
use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::NetworkConfig;
use crate::congestion::SocketRegistry;
use crate::error::{MessageError, P2pError};
use crate::messages::{Heartbeat, LocalStatus, ScoreTable};
use crate::report::{PeerReport, ReportLabel};
use crate::role::Role;
use crate::score::{ScoreComponents, TransferEvent};
use crate::topics::TopicKind;
use crate::view::PeerView;

/// The role's verdict on a message delivered as [`Event::Gossip`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validation {
    /// Valid: forward it.
    Accept,
    /// Invalid: drop, penalise the sender (gossipsub P₄ and the ECHO score).
    Reject,
    /// Not useful but not malicious (e.g. an old version): drop without penalty.
    Ignore,
}

/// What the service needs besides `[network]`.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub network: NetworkConfig,
    pub swarm_id: String,
    /// The role this node gossips in its heartbeats (the learner also publishes score tables).
    pub role: Role,
    /// Software version gossiped in heartbeats.
    pub node_version: String,
    /// The swarm's learner (from `learner_public_key`): only it may publish score tables.
    pub learner: Option<PeerId>,
}

impl ServiceConfig {
    /// A node for a swarm on this machine: TCP on 127.0.0.1 (any free port), no QUIC, no
    /// AutoNAT, 200 ms heartbeats — what in-process tests and loopback testnets use.
    pub fn loopback(
        swarm_id: &str,
        role: Role,
        bootstrap: Vec<String>,
        learner: Option<PeerId>,
    ) -> Self {
        ServiceConfig {
            network: NetworkConfig {
                listen: vec!["/ip4/127.0.0.1/tcp/0".into()],
                bootstrap,
                heartbeat_interval_ms: 200,
                autonat: false,
                quic: false,
                ..NetworkConfig::default()
            },
            swarm_id: swarm_id.into(),
            role,
            node_version: env!("CARGO_PKG_VERSION").into(),
            learner,
        }
    }
}

/// Domain events for the roles.
#[derive(Debug, Clone)]
pub enum Event {
    PeerConnected(PeerId),
    PeerDisconnected(PeerId),
    /// A valid heartbeat (already recorded in the peer table). Boxed: with its receipts it
    /// is the largest event by far.
    Heartbeat {
        peer: PeerId,
        heartbeat: Box<Heartbeat>,
    },
    /// A valid score table from the learner.
    ScoreTable {
        from: PeerId,
        table: ScoreTable,
    },
    /// A message on a role-validated topic; the receiver must call [`Client::report_validation`].
    Gossip {
        topic: TopicKind,
        message_id: MessageId,
        propagation_source: PeerId,
        source: Option<PeerId>,
        data: Vec<u8>,
    },
    /// A message that failed validation (dropped; its sender was penalised).
    Rejected {
        peer: PeerId,
        topic: TopicKind,
        error: MessageError,
    },
    /// `peer` reached `network.ban_after_strikes` and is banned for the run (disconnected and
    /// refused from now on); `reason` is the label of the strike that reached the threshold
    /// (or of the report that banned at once).
    PeerBanned {
        peer: PeerId,
        reason: ReportLabel,
    },
}

/// One row of the peer table as the status endpoint shows it (field names: `docs/protocol.md`,
/// "Admin endpoint").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerStatus {
    pub peer_id: String,
    pub role: Option<Role>,
    pub addrs: Vec<String>,
    /// The dial hints of the peer's last heartbeat ([`crate::Heartbeat::addrs`]): where it
    /// says it can be reached, whether or not this node ever connected to it.
    #[serde(default)]
    pub dial_hints: Vec<String>,
    pub installed_version: Option<u64>,
    #[serde(flatten)]
    pub score: ScoreComponents,
    /// Forwarding chain and position in it.
    pub chain: Option<u32>,
    pub position: Option<u32>,
    pub mu: Option<f64>,
    pub cost_per_hour: Option<f64>,
    pub pending: Option<u64>,
    /// Alive: a heartbeat within the last 3 heartbeat intervals (the scheduler's active set
    /// refines this later).
    pub active: bool,
    pub connected: bool,
    pub node_version: Option<String>,
    pub agent_version: Option<String>,
    pub availability: Option<f64>,
    pub forward_rate_bps: Option<f64>,
    pub receive_rate_bps: Option<f64>,
    pub heartbeat_age_s: Option<f64>,
    pub heartbeats: u64,
    pub started_unix_ms: Option<u64>,
    pub rejected_messages: u64,
    /// gossipsub v1.1 score of the peer (None while unknown).
    pub gossip_score: Option<f64>,
    /// The device its heartbeats report (None before the first, or from an older node).
    #[serde(default)]
    pub device: Option<crate::messages::DeviceReport>,
    /// Banned for the run (never active, never in the learner's score table, refused on
    /// every connection). See `docs/security.md`, "Strikes and bans".
    #[serde(default)]
    pub banned: bool,
    /// The label of the strike that reached the threshold ([`ReportLabel::as_str`]), when
    /// banned.
    #[serde(default)]
    pub ban_reason: Option<String>,
    /// Strikes against the peer so far (each also a failed event in its ECHO score).
    #[serde(default)]
    pub strikes: u64,
    /// Those strikes per label ([`ReportLabel::as_str`] → count).
    #[serde(default)]
    pub strikes_by_reason: BTreeMap<String, u64>,
    /// How peers can reach it, as its heartbeats report (None before the first, or from an
    /// older node).
    #[serde(default)]
    pub reachability: Option<crate::reachability::Reachability>,
    /// How this node is connected to it now (`direct`, `holepunched`, `relayed`).
    #[serde(default)]
    pub connection: Option<crate::reachability::ConnectionKind>,
    /// Versions this rollout worker's installed snapshot trails the version this node works
    /// with (the learner: the newest it published); filled by the node's status view,
    /// `null` when either is unknown.
    #[serde(default)]
    pub install_lag: Option<u64>,
    /// The admission credential of its last heartbeat ([`crate::Heartbeat::admission`]),
    /// for the learner's admission check; not shown in status.
    #[serde(default, skip_serializing)]
    pub admission: Option<String>,
}

/// Counters of the network service since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkCounters {
    pub heartbeats_sent: u64,
    pub heartbeats_received: u64,
    pub messages_rejected: u64,
    pub connections_denied: u64,
    pub connection_errors: u64,
    pub events_dropped: u64,
    /// Strikes counted against peers (all reasons).
    pub strikes: u64,
    /// Peers banned since start (a ban forgotten past the cap is still counted).
    pub bans: u64,
    /// Heartbeats dropped by the per-source rate limit.
    pub heartbeats_ignored: u64,
}

/// The node's view of the swarm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub peer_id: String,
    pub role: Role,
    pub swarm_id: String,
    pub listen_addrs: Vec<String>,
    pub external_addrs: Vec<String>,
    pub connected_peers: usize,
    pub private_swarm: bool,
    pub quic: bool,
    pub local: LocalStatus,
    pub counters: NetworkCounters,
    pub peers: Vec<PeerStatus>,
    /// The last score table received from the learner (workers).
    pub learner_scores: Option<ScoreTable>,
    /// This node's reachability (the class its heartbeats carry).
    #[serde(default)]
    pub reachability: crate::reachability::Reachability,
    /// NAT traversal: AutoNAT verdict, relay reservations, hole punches, how each peer is
    /// connected, and the relay server's load when this node serves as a relay.
    #[serde(default)]
    pub nat: crate::reachability::NatStatus,
}

/// What a [`Client`] asks of the service task.
pub(crate) enum Command {
    Status(oneshot::Sender<NetworkStatus>),
    Peers(oneshot::Sender<Vec<PeerView>>),
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    Dial(Multiaddr, oneshot::Sender<Result<(), P2pError>>),
    /// Dial `peer` by id from a new local port unless connected or being dialed; replies
    /// once the dial has started (or was not needed).
    Connect(PeerId, oneshot::Sender<()>),
    SetLocal(LocalStatus),
    /// The learner's account of each worker's groups, carried in its next score tables.
    SetContributions(std::collections::HashMap<PeerId, crate::messages::Contribution>),
    Publish {
        topic: String,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<(), P2pError>>,
    },
    Validate {
        id: MessageId,
        propagation_source: PeerId,
        source: Option<PeerId>,
        verdict: Validation,
    },
    /// The outcome of a bulk transfer (streams are opened with [`Client::stream_control`]).
    Transfer {
        peer: PeerId,
        event: TransferEvent,
    },
    /// Evidence of misbehaviour by `peer` (see [`PeerReport`]).
    Strike {
        peer: PeerId,
        report: PeerReport,
    },
    /// A strike that bans at once ([`Client::ban`]).
    Ban {
        peer: PeerId,
        label: ReportLabel,
    },
    Shutdown,
}

/// The set of banned peers, written by the service task and read by every [`Client`]
/// without a round trip through the command channel.
pub(crate) type BanView = Arc<RwLock<HashSet<PeerId>>>;

/// Opens of one stream ([`Client::open_stream`]) while dials to the peer fail.
pub const OPEN_ATTEMPTS: u32 = 3;

/// Cheap-to-clone handle to the network service.
#[derive(Clone)]
pub struct Client {
    tx: mpsc::Sender<Command>,
    local_peer_id: PeerId,
    swarm_id: String,
    stream: libp2p_stream::Control,
    banned: BanView,
    sockets: SocketRegistry,
    changes: watch::Receiver<u64>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("local_peer_id", &self.local_peer_id)
            .finish()
    }
}

impl Client {
    pub(crate) fn new(
        tx: mpsc::Sender<Command>,
        local_peer_id: PeerId,
        swarm_id: String,
        stream: libp2p_stream::Control,
        banned: BanView,
        sockets: SocketRegistry,
        changes: watch::Receiver<u64>,
    ) -> Self {
        Client {
            tx,
            local_peer_id,
            swarm_id,
            stream,
            banned,
            sockets,
            changes,
        }
    }

    pub fn local_peer_id(&self) -> PeerId {
        self.local_peer_id
    }

    /// Gives the TCP connections to `peer` a fresh congestion-control model before a bulk
    /// transfer paced at `rate_bytes_per_s`, where BBR's estimate has gone stale (below 80 % of
    /// that rate: [`crate::congestion`]; it does while a connection carries only gossip), or
    /// always with an infinite rate (a transfer this node paces itself); returns how many
    /// sockets were restarted. Cheap (a lock and up to three socket options
    /// per socket; no round trip to the service task).
    pub fn restart_congestion(&self, peer: &PeerId, rate_bytes_per_s: f64) -> usize {
        self.sockets.restart(peer, rate_bytes_per_s)
    }

    /// Open / accept bulk-transfer streams. The protocol names live with the crates that own
    /// the protocols (`dissemination`, `pull`); p2p only carries the streams. To open one to
    /// a peer this node may not be connected to, prefer [`Client::open_stream`].
    pub fn stream_control(&self) -> libp2p_stream::Control {
        self.stream.clone()
    }

    /// Opens a `protocol` stream to `peer`, dialing it first if not connected — from a new
    /// local port. (`libp2p_stream` would dial from the listening port. When the peer dials
    /// this node from its own listening port at the same moment, for a Kademlia query, the
    /// two TCP dials meet as one simultaneous-open connection on which both ends start the
    /// Noise handshake as initiator, and the open fails with "input error". A forwarder's
    /// first push to a child it never met did, in first rounds at 100 ms RTT.)
    ///
    /// A dial that was already under way when the open asked (a Kademlia query's, which may
    /// meet the peer's own that way) fails every open waiting on the peer; such an open is
    /// tried again, at most [`OPEN_ATTEMPTS`] times in all, each with a new dial of its own.
    pub async fn open_stream(
        &self,
        peer: PeerId,
        protocol: libp2p::StreamProtocol,
    ) -> Result<libp2p::Stream, libp2p_stream::OpenStreamError> {
        let mut attempt = 1;
        loop {
            // Once the service has started the dial, the stream's own dial finds the peer
            // being dialed and is not made; the open waits for this connection. A stopped
            // service leaves the open to fail by itself.
            let _ = self.ask(|r| Command::Connect(peer, r)).await;
            match self
                .stream
                .clone()
                .open_stream(peer, protocol.clone())
                .await
            {
                Err(libp2p_stream::OpenStreamError::Io(e))
                    if e.kind() == std::io::ErrorKind::NotConnected && attempt < OPEN_ATTEMPTS =>
                {
                    tracing::debug!(%peer, attempt, error = %e, "dial failed under a stream open; dialing again");
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn send(&self, c: Command) -> Result<(), P2pError> {
        self.tx.send(c).await.map_err(|_| P2pError::ServiceStopped)
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, P2pError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx)).await?;
        rx.await.map_err(|_| P2pError::ServiceStopped)
    }

    /// The node's view of the swarm for people: the admin endpoint's `/status` (peer ids as
    /// text, every counter). Roles decide on [`Client::peers`] / [`Client::workers`] instead.
    pub async fn status(&self) -> Result<NetworkStatus, P2pError> {
        self.ask(Command::Status).await
    }

    /// Every peer in the table, typed ([`PeerView`]), in no particular order.
    pub async fn peers(&self) -> Result<Vec<PeerView>, P2pError> {
        self.ask(Command::Peers).await
    }

    /// The rollout workers by the one rule ([`PeerView::is_worker`]).
    pub async fn workers(&self) -> Result<Vec<PeerView>, P2pError> {
        let mut peers = self.peers().await?;
        peers.retain(PeerView::is_worker);
        Ok(peers)
    }

    /// Changes whenever the peer view may have: a heartbeat arrived, a peer connected,
    /// disconnected or was banned. Wait on it (`changed()`) and read [`Client::peers`] /
    /// [`Client::workers`] again, instead of polling. Closed once the service stops.
    pub fn peer_changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Addresses the node listens on (resolved ports).
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, P2pError> {
        self.ask(Command::ListenAddrs).await
    }

    /// Dial an address (with or without `/p2p/<id>`).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), P2pError> {
        self.ask(|r| Command::Dial(addr, r)).await?
    }

    /// The role's fields for the next heartbeats.
    pub async fn set_local_status(&self, status: LocalStatus) -> Result<(), P2pError> {
        self.send(Command::SetLocal(status)).await
    }

    /// The learner's account of what it did with each worker's groups: its score tables
    /// carry it from now on (each row's `contribution`; the strikes are the service's own
    /// count). Replaces the previous map.
    pub async fn set_contributions(
        &self,
        contributions: std::collections::HashMap<PeerId, crate::messages::Contribution>,
    ) -> Result<(), P2pError> {
        self.send(Command::SetContributions(contributions)).await
    }

    /// Publish bytes on one of the swarm's topics.
    pub async fn publish(&self, topic: TopicKind, data: Vec<u8>) -> Result<(), P2pError> {
        let topic = topic.topic_name(&self.swarm_id);
        self.ask(|reply| Command::Publish { topic, data, reply })
            .await?
    }

    /// Publish arbitrary bytes on a topic by name (diagnostics and tests: e.g. a malformed
    /// heartbeat). The node must be subscribed to the topic for peers to route it.
    pub async fn publish_raw(&self, topic: String, data: Vec<u8>) -> Result<(), P2pError> {
        self.ask(|reply| Command::Publish { topic, data, reply })
            .await?
    }

    /// Verdict on an [`Event::Gossip`] message.
    pub async fn report_validation(
        &self,
        id: MessageId,
        propagation_source: PeerId,
        source: Option<PeerId>,
        verdict: Validation,
    ) -> Result<(), P2pError> {
        self.send(Command::Validate {
            id,
            propagation_source,
            source,
            verdict,
        })
        .await
    }

    /// Feed a finished bulk transfer into the peer's ECHO score.
    pub async fn record_transfer(
        &self,
        peer: PeerId,
        event: TransferEvent,
    ) -> Result<(), P2pError> {
        self.send(Command::Transfer { peer, event }).await
    }

    /// Count a strike against `peer` under `report.label` (a failed transfer in its ECHO
    /// score; past the ban threshold, or at once for [`Severity::Fatal`], the peer is banned
    /// for the run). Never blocks on a full channel for long: the command channel is bounded
    /// like every other command.
    ///
    /// [`Severity::Fatal`]: crate::report::Severity::Fatal
    pub async fn strike(&self, peer: PeerId, report: PeerReport) -> Result<(), P2pError> {
        self.send(Command::Strike { peer, report }).await
    }

    /// Counts one strike under `label` and bans `peer` at once, whatever its count: for
    /// evidence the caller knows no honest node produces (a proof-level verification
    /// failure), and to restore the bans of a previous run. Never this node or the learner.
    pub async fn ban(&self, peer: PeerId, label: ReportLabel) -> Result<(), P2pError> {
        self.send(Command::Ban { peer, label }).await
    }

    /// Whether `peer` is banned for the run. Cheap (a shared set behind a read lock, no
    /// message to the service): roles may call it before every pull, push or answer. A
    /// strike sent with [`Client::strike`] takes effect once the service has processed it.
    pub fn is_banned(&self, peer: &PeerId) -> bool {
        self.banned.read().is_ok_and(|b| b.contains(peer))
    }

    /// Every peer banned now (at most [`crate::MAX_BANS`]), in no particular order.
    pub fn banned_peers(&self) -> Vec<PeerId> {
        self.banned
            .read()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Stop the service (the swarm is dropped, connections close).
    pub async fn shutdown(&self) {
        let _ = self.send(Command::Shutdown).await;
    }
}
