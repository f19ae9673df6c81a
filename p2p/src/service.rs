//! The network service task: the one owner of the libp2p [`Swarm`]. Roles talk to it through
//! a cloneable [`Client`] (bounded command channel) and receive domain [`Event`]s (bounded
//! event channel). Modelled on rust-libp2p's `examples/file-sharing` and Lighthouse's network
//! service.
//!
//! Owns: [`start`] (build the swarm, listen, dial, spawn the task) and the event loop — client
//! commands, the heartbeat, score-table, re-dial and Kademlia timers; the reaction to swarm
//! and behaviour events is in `service/swarm_events.rs`, dialing in `service/dial.rs`, the
//! gossip half (publishing and validating messages) in `service/gossip.rs`, strikes and bans
//! in `service/bans.rs`. Must not touch: behaviour configuration (`behaviour.rs`), topic
//! names ([`crate::topics`]), the peer-table, ban, rate-limit and membership-scaling rules
//! (`peers.rs`, `bans.rs`, `hbgate.rs`, `membership.rs`) or what roles do with events.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::gossipsub::IdentTopic;
use libp2p::metrics::{Metrics, Registry};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::DialError;
use libp2p::{
    allow_block_list, connection_limits, identity::Keypair, Multiaddr, PeerId, StreamProtocol,
    Swarm,
};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::bans::{BanList, MAX_BANS};
use crate::behaviour::{self, Behaviour};
use crate::circuit::CircuitListeners;
use crate::client::{
    BanView, Client, Command, Event, NetworkCounters, NetworkStatus, PeerStatus, ServiceConfig,
};
use crate::config::NetworkConfig;
use crate::error::P2pError;
use crate::membership::{self, Intervals};
use crate::messages::{LocalStatus, ScoreTable};
use crate::peers::{self, PeerEntry};
use crate::role::Role;
use crate::topics::{parse_topic, TopicKind};
use storage::unix_ms;

mod bans;
mod diagnose;
mod dial;
mod gossip;
mod swarm_events;

/// Capacity of the command and event channels.
pub const CHANNEL_CAPACITY: usize = 1024;
/// The learner publishes its score table every this many heartbeat intervals.
const SCORE_TABLE_EVERY_HEARTBEATS: u32 = 5;
/// Disconnected bootstrap peers are re-dialed (and the peer table pruned) this often.
const REDIAL_INTERVAL: Duration = Duration::from_secs(3);
/// A Kademlia bootstrap (random walk) runs this often.
const KAD_BOOTSTRAP_INTERVAL: Duration = Duration::from_secs(30);

/// What [`start`] returns: the client handle, the event stream, and the service task.
pub type Started = (Client, mpsc::Receiver<Event>, tokio::task::JoinHandle<()>);

/// Builds the swarm, starts listening and dialing, and spawns the service task.
/// Must be called from within a tokio runtime.
///
/// `seed` is the node key's ed25519 seed (`storage::NodeKey::seed`), so the peer id is the one
/// `echo-node keygen` prints. libp2p's own metrics are registered in `registry`.
pub fn start(
    seed: [u8; 32],
    cfg: ServiceConfig,
    registry: &mut Registry,
) -> Result<Started, P2pError> {
    let key = keypair_from_seed(seed)?;
    let local_peer_id = key.public().to_peer_id();
    let allow = parse_allow_list(&cfg.network.allow_list)?;
    let kad_protocol = behaviour::kad_protocol(&cfg.swarm_id)?;
    let sockets = crate::congestion::SocketRegistry::new(cfg.network.restart_congestion);
    let mut swarm = behaviour::build_swarm(
        key,
        &cfg,
        &allow,
        kad_protocol.clone(),
        registry,
        sockets.clone(),
    )?;
    let libp2p_metrics = Metrics::new(registry);
    subscribe_all(&mut swarm, &cfg.swarm_id)?;
    listen(&mut swarm, &cfg.network)?;
    behaviour::listen_quic_companions(&mut swarm, &cfg.network);
    behaviour::add_external_addrs(&mut swarm, &cfg.network)?;
    let bootstrap = add_bootstrap_peers(&mut swarm, &cfg.network.bootstrap)?;
    let circuits = listen_via_relays(&cfg.network)?;

    let (cmd_tx, cmd_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let (ev_tx, ev_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let stream = swarm.behaviour().stream.new_control();
    let ban_view = BanView::default();
    let (changes, changes_rx) = tokio::sync::watch::channel(0u64);
    let client = Client::new(
        cmd_tx,
        local_peer_id,
        cfg.swarm_id.clone(),
        stream,
        ban_view.clone(),
        sockets,
        changes_rx,
    );
    let quic = cfg.network.quic_enabled();
    let nat = crate::reachability::NatTracker::new(behaviour::runs_relay_server(&cfg));
    let mut service = Service {
        nat,
        circuits,
        pacer: crate::hbgate::HeartbeatPacer::default(),
        heartbeat_interval: Duration::from_millis(cfg.network.heartbeat_interval_ms),
        intervals: Intervals::for_swarm(
            Duration::from_millis(cfg.network.heartbeat_interval_ms),
            1,
        ),
        swarm,
        cfg,
        commands: cmd_rx,
        events: ev_tx,
        changes,
        libp2p_metrics,
        peers: HashMap::new(),
        bootstrap,
        allow,
        local: LocalStatus {
            availability: 1.0,
            ..LocalStatus::default()
        },
        counters: NetworkCounters::default(),
        started_unix_ms: unix_ms(),
        seq: 0,
        learner_scores: None,
        kad_protocol,
        bans: BanList::new(MAX_BANS),
        ban_view,
        authored: Default::default(),
        warned: HashMap::new(),
        contributions: HashMap::new(),
    };
    service.dial_bootstrap();
    metrics::gauge!("p2p_banned_peers").set(0.0);
    service.circuits.tick(&mut service.swarm);
    info!(peer_id = %local_peer_id, quic, "network service started");
    let handle = tokio::spawn(async move { service.run().await });
    Ok((client, ev_rx, handle))
}

/// The node's libp2p identity from its ed25519 seed.
fn keypair_from_seed(seed: [u8; 32]) -> Result<Keypair, P2pError> {
    let mut seed = seed;
    Keypair::ed25519_from_bytes(&mut seed).map_err(|e| P2pError::Transport(e.to_string()))
}

/// `network.allow_list` as peer ids.
fn parse_allow_list(list: &[String]) -> Result<HashSet<PeerId>, P2pError> {
    list.iter()
        .map(|p| {
            p.parse().map_err(|_| P2pError::Config {
                key: "network.allow_list".into(),
                reason: format!("`{p}` is not a peer id"),
            })
        })
        .collect()
}

/// Subscribes to every topic of the swarm.
fn subscribe_all(swarm: &mut Swarm<Behaviour>, swarm_id: &str) -> Result<(), P2pError> {
    for &kind in TopicKind::ALL {
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&IdentTopic::new(kind.topic_name(swarm_id)))
            .map_err(|e| P2pError::Behaviour(e.to_string()))?;
    }
    Ok(())
}

/// Listens on every `network.listen` address; one another process listens on is refused
/// first ([`crate::transport::probe_listen_addrs`]).
fn listen(swarm: &mut Swarm<Behaviour>, net: &NetworkConfig) -> Result<(), P2pError> {
    crate::transport::probe_listen_addrs(&net.listen)?;
    for a in &net.listen {
        let addr: Multiaddr = a.parse().map_err(|e| P2pError::Listen {
            addr: a.clone(),
            reason: format!("{e}"),
        })?;
        if crate::circuit::is_circuit(&addr) {
            continue; // opened once the relay is connected (`listen_via_relays`)
        }
        swarm.listen_on(addr).map_err(|e| P2pError::Listen {
            addr: a.clone(),
            reason: crate::transport::transport_error_text(&e),
        })?;
    }
    Ok(())
}

/// Adds the bootstrap peers (each address must end in `/p2p/<peer id>`) to Kademlia and
/// returns them for the re-dial timer.
fn add_bootstrap_peers(
    swarm: &mut Swarm<Behaviour>,
    addrs: &[String],
) -> Result<Vec<(PeerId, Multiaddr)>, P2pError> {
    let mut bootstrap = Vec::new();
    for a in addrs {
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
    Ok(bootstrap)
}

/// The relays to reserve a slot on: `network.relays` and the `/p2p-circuit` addresses of
/// `network.listen`. Each listener opens once its relay is connected (`circuit`); a relay
/// that cannot be used is logged, not fatal.
fn listen_via_relays(net: &NetworkConfig) -> Result<CircuitListeners, P2pError> {
    let parse = |a: &String| -> Result<Multiaddr, P2pError> {
        a.parse().map_err(|e| P2pError::Dial {
            addr: a.clone(),
            reason: format!("{e}"),
        })
    };
    let listen = net
        .listen
        .iter()
        .map(parse)
        .collect::<Result<Vec<_>, _>>()?;
    let relays = net
        .relays
        .iter()
        .map(parse)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CircuitListeners::new(&listen, &relays))
}

fn strip_p2p(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

/// Which gate refused a connection, for the log.
fn denial(cause: &libp2p::swarm::ConnectionDenied) -> &'static str {
    if cause
        .downcast_ref::<connection_limits::Exceeded>()
        .is_some()
    {
        "connection limit reached: network.max_inbound / max_per_peer / max_pending_inbound"
    } else if cause.downcast_ref::<allow_block_list::Blocked>().is_some() {
        "peer banned for the run"
    } else if crate::backoff::held_back(cause) {
        "redial backoff: the peer closed our last connections at once"
    } else if cause
        .downcast_ref::<allow_block_list::NotAllowed>()
        .is_some()
    {
        "peer not in allow_list"
    } else {
        "denied by a behaviour"
    }
}

fn is_circuit(a: &Multiaddr) -> bool {
    a.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}

/// The running service (owned by its task).
struct Service {
    swarm: Swarm<Behaviour>,
    cfg: ServiceConfig,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    /// Bumped whenever the peer view may have changed (`Client::peer_changes`).
    changes: tokio::sync::watch::Sender<u64>,
    libp2p_metrics: Metrics,
    peers: HashMap<PeerId, PeerEntry>,
    bootstrap: Vec<(PeerId, Multiaddr)>,
    allow: HashSet<PeerId>,
    /// Connection failures warned about, and when: each one is named once a minute.
    warned: HashMap<String, std::time::Instant>,
    /// The learner's account of each worker's groups, for its score tables
    /// ([`Client::set_contributions`]).
    contributions: HashMap<PeerId, crate::messages::Contribution>,
    local: LocalStatus,
    counters: NetworkCounters,
    started_unix_ms: u64,
    seq: u64,
    /// `network.heartbeat_interval_ms`.
    heartbeat_interval: Duration,
    /// The effective heartbeat, rate-limit and alive intervals for the swarm size this node
    /// counts (`membership`), recomputed at each heartbeat.
    intervals: Intervals,
    learner_scores: Option<ScoreTable>,
    kad_protocol: StreamProtocol,
    /// Peers banned for the run (bounded); mirrored in `ban_view` for the clients.
    bans: BanList,
    ban_view: BanView,
    /// Digests of what the learner published on its own topics (replay or forgery).
    authored: crate::authored::Authored,
    /// Reachability and connection kinds (`reachability`), fed every swarm event.
    nat: crate::reachability::NatTracker,
    /// Listeners through relays (`circuit`).
    circuits: CircuitListeners,
    /// When this node's install reports may go out (`hbgate`: at most one per half interval).
    pacer: crate::hbgate::HeartbeatPacer,
}

impl Service {
    async fn run(&mut self) {
        let mut heartbeat = tokio::time::interval(self.intervals.send);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut scores =
            tokio::time::interval(self.heartbeat_interval * SCORE_TABLE_EVERY_HEARTBEATS);
        scores.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut redial = tokio::time::interval(REDIAL_INTERVAL);
        let mut kad_bootstrap = tokio::time::interval(KAD_BOOTSTRAP_INTERVAL);
        loop {
            let report_due = self.report_due();
            let report_held = self.pacer.due(self.intervals.send).is_some();
            tokio::select! {
                ev = self.swarm.select_next_some() => self.on_swarm_event(ev),
                cmd = self.commands.recv() => match cmd {
                    None | Some(Command::Shutdown) => break,
                    Some(c) => self.on_command(c),
                },
                _ = heartbeat.tick() => {
                    self.publish_heartbeat();
                    if let Some(t) = self.update_intervals() {
                        heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + t, t);
                        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    }
                },
                // A held install report falls due (`hbgate::HeartbeatPacer`).
                _ = tokio::time::sleep_until(report_due.into()), if report_held => {
                    self.publish_heartbeat();
                },
                _ = scores.tick() => if self.cfg.role == Role::Learner { self.publish_score_table() },
                _ = redial.tick() => { self.dial_bootstrap(); self.circuits.tick(&mut self.swarm); self.prune(); },
                _ = kad_bootstrap.tick() => { let _ = self.swarm.behaviour_mut().kad.bootstrap(); },
            }
        }
        info!("network service stopped");
    }

    fn emit(&mut self, ev: Event) {
        // The peer view changed: wake whoever waits on it (`Client::peer_changes`), also
        // when the event itself is dropped below.
        if matches!(
            ev,
            Event::PeerConnected(_)
                | Event::PeerDisconnected(_)
                | Event::Heartbeat { .. }
                | Event::PeerBanned { .. }
        ) {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        if self.events.try_send(ev).is_err() {
            self.counters.events_dropped += 1;
        }
    }

    fn peer(&mut self, peer: PeerId) -> &mut PeerEntry {
        if self.peers.len() >= membership::MAX_KNOWN_PEERS && !self.peers.contains_key(&peer) {
            // A full table: make room (down to 15/16 of the cap, so that a stream of fresh
            // identities pays the O(n) eviction once per cap/16 insertions, not each time).
            self.evict(membership::MAX_KNOWN_PEERS - membership::MAX_KNOWN_PEERS / 16);
        }
        self.peers.entry(peer).or_default()
    }

    /// Forgets the stalest unprotected peers down to `cap` ([`membership::evict`]).
    fn evict(&mut self, cap: usize) {
        let rows: Vec<_> = self
            .peers
            .iter()
            .map(|(p, e)| {
                let (heard, protected) = e.eviction_key();
                (*p, heard, protected)
            })
            .collect();
        for p in membership::evict(&rows, cap) {
            self.peers.remove(&p);
        }
    }

    /// When the held install report is due (far in the future when none is held).
    fn report_due(&self) -> Instant {
        self.pacer
            .due(self.intervals.send)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    /// Recounts the swarm (this node and the peers active under the current alive window)
    /// and recomputes the intervals; returns the new send interval if it changed.
    fn update_intervals(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let alive = self.intervals.alive * peers::ALIVE_HEARTBEAT_INTERVALS;
        let heard = self
            .peers
            .values()
            .filter(|e| {
                e.ban.is_none()
                    && e.heartbeat
                        .as_ref()
                        .is_some_and(|(_, t)| now.duration_since(*t) <= alive)
            })
            .count();
        let new = Intervals::for_swarm(self.heartbeat_interval, heard + 1);
        let old = std::mem::replace(&mut self.intervals, new);
        if new.send != old.send {
            info!(
                swarm_size = heard + 1,
                interval_ms = new.send.as_millis() as u64,
                "heartbeat interval rescaled to the swarm size"
            );
            metrics::gauge!("p2p_heartbeat_interval_seconds").set(new.send.as_secs_f64());
            return Some(new.send);
        }
        None
    }

    /// Forgets peers that are gone for good ([`PeerEntry::is_gone`]; banned ones are kept).
    fn prune(&mut self) {
        let now = Instant::now();
        let forget_after = self.intervals.forget_after();
        self.peers.retain(|_, e| !e.is_gone(now, forget_after));
        self.evict(membership::MAX_KNOWN_PEERS);
        metrics::gauge!("p2p_known_peers").set(self.peers.len() as f64);
        metrics::gauge!("p2p_connected_peers").set(self.swarm.connected_peers().count() as f64);
    }

    fn on_command(&mut self, c: Command) {
        match c {
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::ListenAddrs(reply) => {
                let _ = reply.send(behaviour::ordered_listeners(&self.swarm));
            }
            Command::Connect(peer, reply) => {
                if peer != *self.swarm.local_peer_id() && !self.swarm.is_connected(&peer) {
                    let known = self.known_addrs(&peer);
                    self.dial_from_new_port(peer, known);
                }
                let _ = reply.send(());
            }
            Command::Dial(addr, reply) => {
                let r = self.swarm.dial(addr.clone());
                if let Err(DialError::Denied { cause }) = &r {
                    // A held-back dial is this node's own gate, not a refused connection.
                    if !crate::backoff::held_back(cause) {
                        self.count_denied();
                    }
                    debug!(%addr, %cause, "dial refused ({})", denial(cause));
                }
                let r = r.map_err(|e| P2pError::Dial {
                    addr: addr.to_string(),
                    reason: match &e {
                        DialError::Denied { cause } => format!("{e} ({})", denial(cause)),
                        _ => e.to_string(),
                    },
                });
                let _ = reply.send(r);
            }
            Command::SetContributions(c) => self.contributions = c,
            Command::SetLocal(s) => {
                // A newly installed snapshot is reported at once (the learner measures
                // T_bcast from these install reports), not at the next heartbeat tick —
                // unless this node heartbeated less than half an interval ago: then at that
                // half interval, so that receivers never count a flood (`hbgate`).
                let installed = s.installed_version != self.local.installed_version;
                self.local = s;
                if installed && self.pacer.install(Instant::now(), self.intervals.send) {
                    self.publish_heartbeat();
                }
            }
            Command::Publish { topic, data, reply } => {
                let learner_only = matches!(
                    parse_topic(&topic),
                    Ok((_, TopicKind::Snapshots | TopicKind::Plans))
                );
                if learner_only && self.cfg.learner == Some(*self.swarm.local_peer_id()) {
                    self.authored.record(&data);
                }
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
            } => self.on_verdict(&id, propagation_source, source, verdict),
            Command::Transfer { peer, event } => {
                self.peer(peer)
                    .stats
                    .record_transfer(&event, Instant::now());
            }
            Command::Strike { peer, report } => self.strike(peer, report),
            Command::Ban { peer, label } => self.strike_and_ban(peer, label),
            Command::Peers(reply) => {
                let now = Instant::now();
                let iv = self.intervals.alive;
                let _ = reply.send(self.peers.iter().map(|(p, e)| e.view(p, now, iv)).collect());
            }
            Command::Shutdown => {}
        }
    }

    fn status(&self) -> NetworkStatus {
        let now = Instant::now();
        let gs = &self.swarm.behaviour().gossipsub;
        let mut peers: Vec<PeerStatus> = self
            .peers
            .iter()
            .map(|(p, e)| PeerStatus {
                connection: self.nat.connection(p),
                ..e.status(p, now, self.intervals.alive, gs.peer_score(p))
            })
            .collect();
        peers::sort_for_status(&mut peers);
        NetworkStatus {
            peer_id: self.swarm.local_peer_id().to_string(),
            role: self.cfg.role,
            swarm_id: self.cfg.swarm_id.clone(),
            listen_addrs: behaviour::ordered_listeners(&self.swarm)
                .iter()
                .map(ToString::to_string)
                .collect(),
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
            reachability: self.nat.reachability(),
            nat: self.nat.status(),
        }
    }
}
