//! The network service: one task owns the libp2p [`Swarm`]; roles talk to it through a
//! cloneable [`Client`] (bounded command channel) and receive domain [`Event`]s (bounded event
//! channel). Modelled on rust-libp2p's `examples/file-sharing` and Lighthouse's network service.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, MessageId, TopicHash};
use libp2p::metrics::{Metrics, Recorder, Registry};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{DialError, ListenError, NetworkBehaviour, SwarmEvent};
use libp2p::{
    allow_block_list, autonat, dcutr, identify, identity::Keypair, kad, mdns, noise, ping, relay,
    yamux, Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::config::NetworkConfig;
use crate::error::{MessageError, P2pError};
use crate::messages::{
    unix_ms, Heartbeat, LocalStatus, ScoreEntry, ScoreTable, HEARTBEAT_VERSION, SCORE_TABLE_VERSION,
};
use crate::score::{PeerStats, ScoreComponents, TransferEvent};
use crate::transport::{build_transport, load_psk, psk_fingerprint};

/// Identify protocol version: nodes of other projects are told apart by it.
pub const IDENTIFY_PROTOCOL: &str = "/echo-swarm/id/1.0.0";
/// Largest gossip message (any topic). Snapshot manifests larger than this travel over streams.
pub const MAX_GOSSIP_BYTES: usize = 1024 * 1024;
/// Capacity of the command and event channels.
pub const CHANNEL_CAPACITY: usize = 1024;

/// Bulk-transfer protocol names reserved for the snapshot and trajectory planes (issue 4 and
/// later). They run over [`libp2p_stream`] (see [`Client::stream_control`]), never over
/// request-response (whose cbor codec caps messages at 1 MiB / 10 MiB).
pub mod protocols {
    use libp2p::StreamProtocol;
    /// Parent → child push of snapshot chunks as they arrive.
    pub const CHUNK_STREAM: StreamProtocol = StreamProtocol::new("/echo-swarm/chunk-stream/1.0.0");
    /// Fetch chunks by BLAKE3 hash from any holder.
    pub const CHUNK_FETCH: StreamProtocol = StreamProtocol::new("/echo-swarm/chunk-fetch/1.0.0");
    /// Learner → rollout two-phase trajectory pull (pull, then ack).
    pub const TRAJECTORY_PULL: StreamProtocol =
        StreamProtocol::new("/echo-swarm/trajectory-pull/1.0.0");
    /// Learner asks a worker for groups under a given version (sequential mode).
    pub const ROLLOUT_REQUEST: StreamProtocol =
        StreamProtocol::new("/echo-swarm/rollout-request/1.0.0");
}

/// The gossip topics of a swarm. Names: `echo/<swarm_id>/<kind>/<version>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopicKind {
    /// Every node's [`Heartbeat`], validated by the service.
    Heartbeat,
    /// The learner's [`ScoreTable`], validated by the service (only the learner may publish).
    Scores,
    /// Signed snapshot announcements (issue 4): delivered to the role as [`Event::Gossip`].
    Snapshots,
    /// Signed chain plans / activation orders (issue 4): delivered as [`Event::Gossip`].
    Plans,
}

impl TopicKind {
    pub const ALL: [TopicKind; 4] = [
        TopicKind::Heartbeat,
        TopicKind::Scores,
        TopicKind::Snapshots,
        TopicKind::Plans,
    ];

    /// The gossipsub topic name within `swarm_id`.
    pub fn topic_name(self, swarm_id: &str) -> String {
        let (kind, v) = match self {
            TopicKind::Heartbeat => ("heartbeat", HEARTBEAT_VERSION),
            TopicKind::Scores => ("scores", SCORE_TABLE_VERSION),
            TopicKind::Snapshots => ("snapshots", 1),
            TopicKind::Plans => ("plans", 1),
        };
        format!("echo/{swarm_id}/{kind}/{v}")
    }
}

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
    /// `learner`, `rollout` or `relay`.
    pub role: String,
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
        role: &str,
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
            role: role.into(),
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
    /// A valid heartbeat (already recorded in the peer table).
    Heartbeat {
        peer: PeerId,
        heartbeat: Heartbeat,
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
}

/// One row of the peer table as the status endpoint shows it (SPEC §13 field names).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerStatus {
    pub peer_id: String,
    pub role: Option<String>,
    pub addrs: Vec<String>,
    pub installed_version: Option<u64>,
    #[serde(flatten)]
    pub score: ScoreComponents,
    /// Forwarding chain and position in it (issue 4).
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
}

/// Counters since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counters {
    pub heartbeats_sent: u64,
    pub heartbeats_received: u64,
    pub messages_rejected: u64,
    pub connections_denied: u64,
    pub connection_errors: u64,
    pub events_dropped: u64,
}

/// The node's view of the swarm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub peer_id: String,
    pub role: String,
    pub swarm_id: String,
    pub listen_addrs: Vec<String>,
    pub external_addrs: Vec<String>,
    pub connected_peers: usize,
    pub private_swarm: bool,
    pub quic: bool,
    pub local: LocalStatus,
    pub counters: Counters,
    pub peers: Vec<PeerStatus>,
    /// The last score table received from the learner (workers).
    pub learner_scores: Option<ScoreTable>,
}

enum Command {
    Status(oneshot::Sender<NetworkStatus>),
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    Dial(Multiaddr, oneshot::Sender<Result<(), P2pError>>),
    SetLocal(LocalStatus),
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
    Transfer {
        peer: PeerId,
        event: TransferEvent,
    },
    Shutdown,
    // Slots for the bulk-transfer plane (issue 4): chunk streams and fetches are opened with
    // `Client::stream_control()`; their outcomes come back as `Transfer`.
}

/// Cheap-to-clone handle to the network service.
#[derive(Clone)]
pub struct Client {
    tx: mpsc::Sender<Command>,
    local_peer_id: PeerId,
    swarm_id: String,
    stream: libp2p_stream::Control,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("local_peer_id", &self.local_peer_id)
            .finish()
    }
}

impl Client {
    pub fn local_peer_id(&self) -> PeerId {
        self.local_peer_id
    }

    /// Open / accept bulk-transfer streams ([`protocols`]) — the slot for issue 4.
    pub fn stream_control(&self) -> libp2p_stream::Control {
        self.stream.clone()
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

    /// The node's view of the swarm (peer table with scores, counters).
    pub async fn status(&self) -> Result<NetworkStatus, P2pError> {
        self.ask(Command::Status).await
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

    /// Stop the service (the swarm is dropped, connections close).
    pub async fn shutdown(&self) {
        let _ = self.send(Command::Shutdown).await;
    }
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    allow: Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    kad: kad::Behaviour<kad::store::MemoryStore>,
    mdns: Toggle<mdns::tokio::Behaviour>,
    gossipsub: gossipsub::Behaviour,
    relay: relay::client::Behaviour,
    dcutr: dcutr::Behaviour,
    autonat: Toggle<autonat::Behaviour>,
    stream: libp2p_stream::Behaviour,
}

/// gossipsub v1.1 scoring, chosen for a swarm of a few to a few thousand nodes exchanging
/// sparse, small control messages (see `docs/protocol.md`, "Peer scoring in gossipsub").
fn gossip_score_params(
    topics: &[TopicHash],
) -> (gossipsub::PeerScoreParams, gossipsub::PeerScoreThresholds) {
    let mut p = gossipsub::PeerScoreParams::default();
    // Loopback testnets and NATed pools put many nodes behind one IP: do not penalise them.
    p.ip_colocation_factor_whitelist
        .insert("127.0.0.1".parse().expect("ip"));
    p.ip_colocation_factor_whitelist
        .insert("::1".parse().expect("ip"));
    p.ip_colocation_factor_threshold = 32.0;
    for t in topics {
        let tp = gossipsub::TopicScoreParams {
            topic_weight: 1.0,
            // P1: up to +1 for long-lived mesh members.
            time_in_mesh_weight: 0.01,
            time_in_mesh_quantum: Duration::from_secs(1),
            time_in_mesh_cap: 100.0,
            // P2: up to +10 for first deliveries.
            first_message_deliveries_weight: 0.5,
            first_message_deliveries_decay: 0.9,
            first_message_deliveries_cap: 20.0,
            // P3/P3b off: heartbeats are sparse (one per node every few seconds), so delivery
            // quotas would punish honest peers in small swarms.
            mesh_message_deliveries_weight: 0.0,
            mesh_failure_penalty_weight: 0.0,
            // P4: each invalid message costs 10·n² (3 invalid → −90, below graylist);
            // decays by 5 % per second.
            invalid_message_deliveries_weight: -10.0,
            invalid_message_deliveries_decay: 0.95,
            ..gossipsub::TopicScoreParams::default()
        };
        p.topics.insert(t.clone(), tp);
    }
    let th = gossipsub::PeerScoreThresholds {
        gossip_threshold: -10.0,
        publish_threshold: -50.0,
        graylist_threshold: -80.0,
        accept_px_threshold: 5.0,
        opportunistic_graft_threshold: 3.0,
    };
    (p, th)
}

struct PeerEntry {
    addrs: BTreeSet<Multiaddr>,
    connected: bool,
    agent: Option<String>,
    heartbeat: Option<(Heartbeat, Instant)>,
    heartbeats: u64,
    rejected: u64,
    stats: PeerStats,
}

impl PeerEntry {
    fn new() -> Self {
        PeerEntry {
            addrs: BTreeSet::new(),
            connected: false,
            agent: None,
            heartbeat: None,
            heartbeats: 0,
            rejected: 0,
            stats: PeerStats::default(),
        }
    }
}

/// The running service (owned by its task).
struct Service {
    swarm: Swarm<Behaviour>,
    cfg: ServiceConfig,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    libp2p_metrics: Metrics,
    topics: HashMap<TopicHash, TopicKind>,
    peers: HashMap<PeerId, PeerEntry>,
    bootstrap: Vec<(PeerId, Multiaddr)>,
    allow: HashSet<PeerId>,
    local: LocalStatus,
    counters: Counters,
    started_unix_ms: u64,
    seq: u64,
    heartbeat_interval: Duration,
    learner_scores: Option<ScoreTable>,
    kad_protocol: StreamProtocol,
}

/// Builds the swarm, starts listening and dialing, and spawns the service task.
/// Must be called from within a tokio runtime.
///
/// `seed` is the node key's ed25519 seed (`storage::NodeKey::seed`), so the peer id is the one
/// `echo-node keygen` prints. libp2p's own metrics are registered in `registry`.
pub fn start(
    seed: [u8; 32],
    cfg: ServiceConfig,
    registry: &mut Registry,
) -> Result<(Client, mpsc::Receiver<Event>, tokio::task::JoinHandle<()>), P2pError> {
    let mut seed = seed;
    let key =
        Keypair::ed25519_from_bytes(&mut seed).map_err(|e| P2pError::Transport(e.to_string()))?;
    let local_peer_id = key.public().to_peer_id();
    let net = &cfg.network;
    let psk = match &net.psk_file {
        Some(p) => Some(load_psk(p)?),
        None => None,
    };
    if let Some(psk) = &psk {
        info!(fingerprint = %psk_fingerprint(psk), "private swarm: pre-shared key loaded; TCP only (no QUIC)");
    }
    let quic = net.quic_enabled();
    let transport = build_transport(&key, psk, quic)?;
    let mut allow = HashSet::new();
    for p in &net.allow_list {
        let peer: PeerId = p.parse().map_err(|_| P2pError::Config {
            key: "network.allow_list".into(),
            reason: format!("`{p}` is not a peer id"),
        })?;
        allow.insert(peer);
    }
    let kad_protocol =
        StreamProtocol::try_from_owned(format!("/echo-swarm/{}/kad/1.0.0", cfg.swarm_id)).map_err(
            |e| P2pError::Config {
                key: "swarm_id".into(),
                reason: e.to_string(),
            },
        )?;
    let topic_hashes: Vec<(TopicHash, TopicKind)> = TopicKind::ALL
        .iter()
        .map(|k| (IdentTopic::new(k.topic_name(&cfg.swarm_id)).hash(), *k))
        .collect();
    let node_version = cfg.node_version.clone();
    let mdns_on = net.mdns;
    let autonat_on = net.autonat;
    let kad_proto = kad_protocol.clone();
    let allow_for_behaviour = allow.clone();

    let builder = SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|_| transport)
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_dns()
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_bandwidth_metrics(registry);
    let mut swarm = builder
        .with_behaviour(
            |key, relay| -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
                let peer_id = key.public().to_peer_id();
                let gcfg = gossipsub::ConfigBuilder::default()
                    .validation_mode(gossipsub::ValidationMode::Strict)
                    .validate_messages()
                    .max_transmit_size(MAX_GOSSIP_BYTES)
                    .build()?;
                let mut gossipsub = gossipsub::Behaviour::new(
                    gossipsub::MessageAuthenticity::Signed(key.clone()),
                    gcfg,
                )?
                .with_metrics(
                    registry.sub_registry_with_prefix("gossipsub"),
                    Default::default(),
                );
                let hashes: Vec<TopicHash> = topic_hashes.iter().map(|(h, _)| h.clone()).collect();
                let (params, thresholds) = gossip_score_params(&hashes);
                gossipsub.with_peer_score(params, thresholds)?;
                let mut kcfg = kad::Config::new(kad_proto);
                kcfg.set_query_timeout(Duration::from_secs(30));
                let mut kad = kad::Behaviour::with_config(
                    peer_id,
                    kad::store::MemoryStore::new(peer_id),
                    kcfg,
                );
                // Answer DHT queries even before an external address is confirmed (loopback and
                // private swarms never confirm one).
                kad.set_mode(Some(kad::Mode::Server));
                let allow = if allow_for_behaviour.is_empty() {
                    None
                } else {
                    let mut b =
                        allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
                    for p in &allow_for_behaviour {
                        b.allow_peer(*p);
                    }
                    Some(b)
                };
                let mdns = if mdns_on {
                    Some(mdns::tokio::Behaviour::new(
                        mdns::Config::default(),
                        peer_id,
                    )?)
                } else {
                    None
                };
                let autonat = autonat_on
                    .then(|| autonat::Behaviour::new(peer_id, autonat::Config::default()));
                Ok(Behaviour {
                    allow: Toggle::from(allow),
                    identify: identify::Behaviour::new(
                        identify::Config::new(IDENTIFY_PROTOCOL.to_string(), key.public())
                            .with_agent_version(format!("echo-node/{node_version}")),
                    ),
                    ping: ping::Behaviour::new(ping::Config::new()),
                    kad,
                    mdns: Toggle::from(mdns),
                    gossipsub,
                    relay,
                    dcutr: dcutr::Behaviour::new(peer_id),
                    autonat: Toggle::from(autonat),
                    stream: libp2p_stream::Behaviour::new(),
                })
            },
        )
        .map_err(|e| P2pError::Behaviour(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(120)))
        .build();
    let libp2p_metrics = Metrics::new(registry);

    for (hash, kind) in &topic_hashes {
        let t = IdentTopic::new(kind.topic_name(&cfg.swarm_id));
        debug_assert_eq!(&t.hash(), hash);
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&t)
            .map_err(|e| P2pError::Behaviour(e.to_string()))?;
    }
    for a in &net.listen {
        let addr: Multiaddr = a.parse().map_err(|e| P2pError::Listen {
            addr: a.clone(),
            reason: format!("{e}"),
        })?;
        swarm.listen_on(addr).map_err(|e| P2pError::Listen {
            addr: a.clone(),
            reason: e.to_string(),
        })?;
    }
    let mut bootstrap = Vec::new();
    for a in &net.bootstrap {
        let addr: Multiaddr = a.parse().map_err(|e| P2pError::Dial {
            addr: a.clone(),
            reason: format!("{e}"),
        })?;
        let peer = crate::peer_id_of(&addr).ok_or_else(|| P2pError::Dial {
            addr: a.clone(),
            reason: "no /p2p/<peer id>".into(),
        })?;
        swarm
            .behaviour_mut()
            .kad
            .add_address(&peer, strip_p2p(&addr));
        bootstrap.push((peer, addr));
    }
    for a in &net.relays {
        let addr: Multiaddr = a.parse().map_err(|e| P2pError::Dial {
            addr: a.clone(),
            reason: format!("{e}"),
        })?;
        if let Err(e) = swarm.listen_on(addr.clone().with(Protocol::P2pCircuit)) {
            warn!(relay = %addr, error = %e, "cannot listen via relay");
        }
    }
    let stream = swarm.behaviour().stream.new_control();
    let (cmd_tx, cmd_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let (ev_tx, ev_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let heartbeat_interval = Duration::from_millis(net.heartbeat_interval_ms);
    let client = Client {
        tx: cmd_tx,
        local_peer_id,
        swarm_id: cfg.swarm_id.clone(),
        stream,
    };
    let mut service = Service {
        swarm,
        cfg,
        commands: cmd_rx,
        events: ev_tx,
        libp2p_metrics,
        topics: topic_hashes.into_iter().collect(),
        peers: HashMap::new(),
        bootstrap,
        allow,
        local: LocalStatus {
            availability: 1.0,
            ..LocalStatus::default()
        },
        counters: Counters::default(),
        started_unix_ms: unix_ms(),
        seq: 0,
        heartbeat_interval,
        learner_scores: None,
        kad_protocol,
    };
    service.dial_bootstrap();
    info!(peer_id = %local_peer_id, quic, "network service started");
    let handle = tokio::spawn(async move { service.run().await });
    Ok((client, ev_rx, handle))
}

fn strip_p2p(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

impl Service {
    async fn run(&mut self) {
        let mut heartbeat = tokio::time::interval(self.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut scores = tokio::time::interval(self.heartbeat_interval * 5);
        scores.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut redial = tokio::time::interval(Duration::from_secs(3));
        let mut kad_bootstrap = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                ev = self.swarm.select_next_some() => self.on_swarm_event(ev),
                cmd = self.commands.recv() => match cmd {
                    None | Some(Command::Shutdown) => break,
                    Some(c) => self.on_command(c),
                },
                _ = heartbeat.tick() => self.publish_heartbeat(),
                _ = scores.tick() => if self.cfg.role == "learner" { self.publish_score_table() },
                _ = redial.tick() => { self.dial_bootstrap(); self.prune(); },
                _ = kad_bootstrap.tick() => { let _ = self.swarm.behaviour_mut().kad.bootstrap(); },
            }
        }
        info!("network service stopped");
    }

    fn emit(&mut self, ev: Event) {
        if self.events.try_send(ev).is_err() {
            self.counters.events_dropped += 1;
        }
    }

    fn dial_bootstrap(&mut self) {
        for (peer, addr) in self.bootstrap.clone() {
            if peer == *self.swarm.local_peer_id() || self.swarm.is_connected(&peer) {
                continue;
            }
            let opts = DialOpts::peer_id(peer)
                .addresses(vec![strip_p2p(&addr)])
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                debug!(%peer, error = %e, "bootstrap dial not started");
            }
        }
    }

    fn maybe_dial(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        if peer == *self.swarm.local_peer_id() || self.swarm.is_connected(&peer) {
            return;
        }
        if !self.allow.is_empty() && !self.allow.contains(&peer) {
            return;
        }
        if self.swarm.connected_peers().count() >= self.cfg.network.max_peers as usize {
            return;
        }
        let opts = DialOpts::peer_id(peer)
            .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
            .addresses(addrs)
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            debug!(%peer, error = %e, "dial not started");
        }
    }

    /// Forget peers that are gone for good (no connection, no heartbeat for 10 minutes).
    fn prune(&mut self) {
        let now = Instant::now();
        self.peers.retain(|_, e| {
            e.connected
                || e.heartbeat
                    .as_ref()
                    .is_some_and(|(_, t)| now.duration_since(*t) < Duration::from_secs(600))
        });
        metrics::gauge!("p2p_known_peers").set(self.peers.len() as f64);
        metrics::gauge!("p2p_connected_peers").set(self.swarm.connected_peers().count() as f64);
    }

    fn on_command(&mut self, c: Command) {
        match c {
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::ListenAddrs(reply) => {
                let _ = reply.send(self.swarm.listeners().cloned().collect());
            }
            Command::Dial(addr, reply) => {
                let r = self.swarm.dial(addr.clone()).map_err(|e| P2pError::Dial {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                });
                let _ = reply.send(r);
            }
            Command::SetLocal(s) => {
                // A newly installed snapshot is reported at once (the learner measures
                // T_bcast from these install reports), not at the next heartbeat tick.
                let installed = s.installed_version != self.local.installed_version;
                self.local = s;
                if installed {
                    self.publish_heartbeat();
                }
            }
            Command::Publish { topic, data, reply } => {
                let r = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .publish(IdentTopic::new(topic.clone()), data)
                    .map(|_| ())
                    .map_err(|e| P2pError::Publish {
                        topic,
                        reason: e.to_string(),
                    });
                let _ = reply.send(r);
            }
            Command::Validate {
                id,
                propagation_source,
                source,
                verdict,
            } => {
                let acceptance = match verdict {
                    Validation::Accept => MessageAcceptance::Accept,
                    Validation::Reject => MessageAcceptance::Reject,
                    Validation::Ignore => MessageAcceptance::Ignore,
                };
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .report_message_validation_result(&id, &propagation_source, acceptance);
                if verdict == Validation::Reject {
                    self.penalise(source.unwrap_or(propagation_source));
                }
            }
            Command::Transfer { peer, event } => {
                self.peers
                    .entry(peer)
                    .or_insert_with(PeerEntry::new)
                    .stats
                    .record_transfer(&event, Instant::now());
            }
            Command::Shutdown => {}
        }
    }

    fn penalise(&mut self, peer: PeerId) {
        let e = self.peers.entry(peer).or_insert_with(PeerEntry::new);
        e.rejected += 1;
        e.stats.record_failure(Instant::now());
        self.counters.messages_rejected += 1;
        metrics::counter!("p2p_messages_rejected_total").increment(1);
    }

    fn publish_heartbeat(&mut self) {
        self.seq += 1;
        let hb = Heartbeat {
            v: HEARTBEAT_VERSION,
            swarm_id: self.cfg.swarm_id.clone(),
            role: self.cfg.role.clone(),
            node_version: self.cfg.node_version.clone(),
            installed_version: self.local.installed_version,
            mu: self.local.mu,
            cost_per_hour: self.cfg.network.cost_per_hour,
            availability: self.local.availability,
            pending: self.local.pending,
            forward_rate_bps: self.local.forward_rate_bps,
            receive_rate_bps: self.local.receive_rate_bps,
            started_unix_ms: self.started_unix_ms,
            sent_unix_ms: unix_ms(),
            seq: self.seq,
        };
        let topic = IdentTopic::new(TopicKind::Heartbeat.topic_name(&self.cfg.swarm_id));
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(topic, hb.encode())
        {
            Ok(_) => {
                self.counters.heartbeats_sent += 1;
                metrics::counter!("p2p_heartbeats_sent_total").increment(1);
            }
            Err(e) => debug!(error = %e, "heartbeat not published"),
        }
    }

    fn publish_score_table(&mut self) {
        let now = Instant::now();
        let entries = self
            .peers
            .iter()
            .filter(|(_, e)| {
                e.heartbeat
                    .as_ref()
                    .is_some_and(|(h, _)| h.role != "learner")
            })
            .map(|(p, e)| {
                let c = e.stats.components(now);
                ScoreEntry {
                    peer_id: p.to_string(),
                    score: c.score,
                    speed: c.speed,
                    success: c.success,
                    stability: c.stability,
                    decay: c.decay,
                }
            })
            .collect::<Vec<_>>();
        if entries.is_empty() {
            return;
        }
        let table = ScoreTable {
            v: SCORE_TABLE_VERSION,
            swarm_id: self.cfg.swarm_id.clone(),
            sent_unix_ms: unix_ms(),
            entries,
        };
        let topic = IdentTopic::new(TopicKind::Scores.topic_name(&self.cfg.swarm_id));
        if let Err(e) = self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(topic, table.encode())
        {
            debug!(error = %e, "score table not published");
        }
    }

    fn status(&self) -> NetworkStatus {
        let now = Instant::now();
        let alive = self.heartbeat_interval * 3;
        let gs = &self.swarm.behaviour().gossipsub;
        let mut peers: Vec<PeerStatus> = self
            .peers
            .iter()
            .map(|(p, e)| {
                let hb = e.heartbeat.as_ref().map(|(h, _)| h);
                let age = e.heartbeat.as_ref().map(|(_, t)| now.duration_since(*t));
                PeerStatus {
                    peer_id: p.to_string(),
                    role: hb.map(|h| h.role.clone()),
                    addrs: e.addrs.iter().map(|a| a.to_string()).collect(),
                    installed_version: hb.and_then(|h| h.installed_version),
                    score: e.stats.components(now),
                    chain: None,
                    position: None,
                    mu: hb.map(|h| h.mu),
                    cost_per_hour: hb.map(|h| h.cost_per_hour),
                    pending: hb.map(|h| h.pending),
                    active: age.is_some_and(|a| a <= alive),
                    connected: e.connected,
                    node_version: hb.map(|h| h.node_version.clone()),
                    agent_version: e.agent.clone(),
                    availability: hb.map(|h| h.availability),
                    forward_rate_bps: hb.map(|h| h.forward_rate_bps),
                    receive_rate_bps: hb.map(|h| h.receive_rate_bps),
                    heartbeat_age_s: age.map(|a| a.as_secs_f64()),
                    heartbeats: e.heartbeats,
                    started_unix_ms: hb.map(|h| h.started_unix_ms),
                    rejected_messages: e.rejected,
                    gossip_score: gs.peer_score(p),
                }
            })
            .collect();
        peers.sort_by(|a, b| {
            b.score
                .score
                .total_cmp(&a.score.score)
                .then_with(|| a.peer_id.cmp(&b.peer_id))
        });
        NetworkStatus {
            peer_id: self.swarm.local_peer_id().to_string(),
            role: self.cfg.role.clone(),
            swarm_id: self.cfg.swarm_id.clone(),
            listen_addrs: self.swarm.listeners().map(|a| a.to_string()).collect(),
            external_addrs: self
                .swarm
                .external_addresses()
                .map(|a| a.to_string())
                .collect(),
            connected_peers: self.swarm.connected_peers().count(),
            private_swarm: self.cfg.network.psk_file.is_some(),
            quic: self.cfg.network.quic_enabled(),
            local: self.local.clone(),
            counters: self.counters.clone(),
            peers,
            learner_scores: self.learner_scores.clone(),
        }
    }

    fn on_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        self.libp2p_metrics.record(&ev);
        match ev {
            SwarmEvent::Behaviour(b) => self.on_behaviour_event(b),
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                num_established,
                ..
            } => {
                let e = self.peers.entry(peer_id).or_insert_with(PeerEntry::new);
                e.connected = true;
                if endpoint.is_dialer() {
                    e.addrs.insert(strip_p2p(endpoint.get_remote_address()));
                }
                if num_established.get() == 1 {
                    debug!(%peer_id, addr = %endpoint.get_remote_address(), "connected");
                    if self.bootstrap.iter().any(|(p, _)| *p == peer_id) {
                        let _ = self.swarm.behaviour_mut().kad.bootstrap();
                    }
                    self.emit(Event::PeerConnected(peer_id));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                if let Some(e) = self.peers.get_mut(&peer_id) {
                    e.connected = false;
                }
                debug!(%peer_id, "disconnected");
                self.emit(Event::PeerDisconnected(peer_id));
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error,
                ..
            } => {
                if let ListenError::Denied { cause } = &error {
                    self.counters.connections_denied += 1;
                    metrics::counter!("p2p_connections_denied_total").increment(1);
                    warn!(addr = %send_back_addr, %cause, "inbound connection refused (peer not in allow_list)");
                } else {
                    self.counters.connection_errors += 1;
                    metrics::counter!("p2p_connection_errors_total").increment(1);
                    info!(addr = %send_back_addr, error = %error, "inbound connection failed (wrong pre-shared key or protocol mismatch?)");
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let DialError::Denied { cause } = &error {
                    self.counters.connections_denied += 1;
                    metrics::counter!("p2p_connections_denied_total").increment(1);
                    warn!(peer = ?peer_id, %cause, "outbound connection refused (peer not in allow_list)");
                } else {
                    self.counters.connection_errors += 1;
                    metrics::counter!("p2p_connection_errors_total").increment(1);
                    debug!(peer = ?peer_id, error = %error, "dial failed");
                }
            }
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, ev: BehaviourEvent) {
        match ev {
            BehaviourEvent::Gossipsub(ev) => {
                self.libp2p_metrics.record(&ev);
                if let gossipsub::Event::Message {
                    propagation_source,
                    message_id,
                    message,
                } = ev
                {
                    self.on_gossip(propagation_source, message_id, message);
                }
            }
            BehaviourEvent::Identify(ev) => {
                self.libp2p_metrics.record(&ev);
                if let identify::Event::Received { peer_id, info, .. } = ev {
                    let speaks_kad = info.protocols.contains(&self.kad_protocol);
                    let e = self.peers.entry(peer_id).or_insert_with(PeerEntry::new);
                    e.agent = Some(info.agent_version.clone());
                    e.addrs = info
                        .listen_addrs
                        .iter()
                        .filter(|a| !is_circuit(a))
                        .cloned()
                        .collect();
                    if speaks_kad {
                        for a in &info.listen_addrs {
                            self.swarm
                                .behaviour_mut()
                                .kad
                                .add_address(&peer_id, a.clone());
                        }
                    }
                }
            }
            BehaviourEvent::Kad(ev) => {
                self.libp2p_metrics.record(&ev);
                if let kad::Event::RoutingUpdated {
                    peer, addresses, ..
                } = ev
                {
                    self.maybe_dial(peer, addresses.into_vec());
                }
            }
            BehaviourEvent::Mdns(mdns::Event::Discovered(list)) => {
                let mut by_peer: HashMap<PeerId, Vec<Multiaddr>> = HashMap::new();
                for (p, a) in list {
                    by_peer.entry(p).or_default().push(a);
                }
                for (p, addrs) in by_peer {
                    for a in &addrs {
                        self.swarm.behaviour_mut().kad.add_address(&p, a.clone());
                    }
                    self.maybe_dial(p, addrs);
                }
            }
            BehaviourEvent::Ping(ev) => self.libp2p_metrics.record(&ev),
            BehaviourEvent::Dcutr(ev) => self.libp2p_metrics.record(&ev),
            BehaviourEvent::Relay(ev) => debug!(?ev, "relay client"),
            BehaviourEvent::Autonat(autonat::Event::StatusChanged { old, new }) => {
                info!(?old, ?new, "NAT status changed");
            }
            _ => {}
        }
    }

    fn on_gossip(&mut self, propagation_source: PeerId, id: MessageId, msg: gossipsub::Message) {
        let Some(kind) = self.topics.get(&msg.topic).copied() else {
            self.reject(
                propagation_source,
                &id,
                msg.source,
                TopicKind::Heartbeat,
                MessageError::Invalid("unknown topic".into()),
            );
            return;
        };
        let source = msg.source.unwrap_or(propagation_source);
        match kind {
            TopicKind::Heartbeat => match Heartbeat::decode(&msg.data, &self.cfg.swarm_id) {
                Ok(hb) => {
                    self.accept(&id, &propagation_source);
                    self.counters.heartbeats_received += 1;
                    metrics::counter!("p2p_heartbeats_received_total").increment(1);
                    let now = Instant::now();
                    let e = self.peers.entry(source).or_insert_with(PeerEntry::new);
                    let restarted = e
                        .heartbeat
                        .as_ref()
                        .is_some_and(|(h, _)| h.started_unix_ms != hb.started_unix_ms);
                    if e.heartbeat.is_none() || restarted {
                        info!(peer = %source, role = %hb.role, restarted, "peer joined");
                    }
                    e.heartbeat = Some((hb.clone(), now));
                    e.heartbeats += 1;
                    e.stats.record_success(now);
                    self.emit(Event::Heartbeat {
                        peer: source,
                        heartbeat: hb,
                    });
                }
                Err(err) => self.reject(propagation_source, &id, Some(source), kind, err),
            },
            TopicKind::Scores => {
                let decoded = ScoreTable::decode(&msg.data, &self.cfg.swarm_id).and_then(|t| {
                    match self.cfg.learner {
                        Some(l) if l != source => Err(MessageError::Unauthorised(source)),
                        _ => Ok(t),
                    }
                });
                match decoded {
                    Ok(table) => {
                        self.accept(&id, &propagation_source);
                        self.learner_scores = Some(table.clone());
                        self.emit(Event::ScoreTable {
                            from: source,
                            table,
                        });
                    }
                    Err(err) => self.reject(propagation_source, &id, Some(source), kind, err),
                }
            }
            TopicKind::Snapshots | TopicKind::Plans => {
                let ev = Event::Gossip {
                    topic: kind,
                    message_id: id.clone(),
                    propagation_source,
                    source: msg.source,
                    data: msg.data,
                };
                if self.events.try_send(ev).is_err() {
                    self.counters.events_dropped += 1;
                    self.swarm
                        .behaviour_mut()
                        .gossipsub
                        .report_message_validation_result(
                            &id,
                            &propagation_source,
                            MessageAcceptance::Ignore,
                        );
                }
            }
        }
    }

    fn accept(&mut self, id: &MessageId, propagation_source: &PeerId) {
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, propagation_source, MessageAcceptance::Accept);
    }

    fn reject(
        &mut self,
        propagation_source: PeerId,
        id: &MessageId,
        source: Option<PeerId>,
        topic: TopicKind,
        error: MessageError,
    ) {
        let peer = source.unwrap_or(propagation_source);
        warn!(%peer, via = %propagation_source, ?topic, %error, "dropping invalid gossip message");
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, &propagation_source, MessageAcceptance::Reject);
        self.penalise(peer);
        self.emit(Event::Rejected { peer, topic, error });
    }
}

fn is_circuit(a: &Multiaddr) -> bool {
    a.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}
