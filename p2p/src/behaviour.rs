//! The libp2p side of the service, built once at start (after Lighthouse's
//! `service/behaviour.rs` and `service/gossipsub_scoring_parameters.rs`): the combined
//! [`Behaviour`], the swarm (transport, DNS, relay client, bandwidth metrics), and the
//! gossipsub v1.1 scoring parameters as named, documented functions.
//!
//! Owns: which behaviours a node runs and how each is configured; the identify protocol name
//! ([`IDENTIFY_PROTOCOL`]) and the per-swarm Kademlia protocol name ([`kad_protocol`]). Must not
//! touch: what happens on their events (the event loop in [`crate::service`]), topic names
//! ([`crate::topics`]), or the bulk-stream protocol names (owned by `dissemination` and `pull`).

use std::collections::HashSet;
use std::time::Duration;

use libp2p::connection_limits;
use libp2p::gossipsub::{self, IdentTopic, TopicHash};
use libp2p::metrics::Registry;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    allow_block_list, autonat, dcutr, identify, identity::Keypair, kad, mdns, noise, ping, relay,
    yamux, PeerId, StreamProtocol, Swarm, SwarmBuilder,
};
use tracing::info;

use crate::client::ServiceConfig;
use crate::error::P2pError;
use crate::role::Role;
use crate::topics::TopicKind;
use crate::transport::{build_transport, load_psk, psk_fingerprint};

/// Identify protocol version: nodes of other projects are told apart by it.
pub const IDENTIFY_PROTOCOL: &str = "/echo-swarm/id/1.0.0";
/// Largest gossip message (any topic). Snapshot manifests larger than this travel over streams.
pub const MAX_GOSSIP_BYTES: usize = 1024 * 1024;
/// How long a connection with no open stream is kept before it is closed.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(120);
/// Timeout of one Kademlia query.
const KAD_QUERY_TIMEOUT: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every behaviour a node runs. Optional ones are [`Toggle`]d off by config: the allow list
/// (private swarms), mDNS, AutoNAT, the relay server. The connection gates come first, so a
/// refused connection never reaches the others: the inbound limits, the ban list, the redial
/// backoff, the allow list. Every role runs the relay client and DCUtR, so a relayed
/// connection is upgraded to a direct one by hole punching when the NATs allow it.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    /// `network.max_inbound`, `max_per_peer`, `max_pending_inbound`.
    pub(crate) limits: connection_limits::Behaviour,
    /// Peers banned for the run (`bans`): their connections are closed and refused.
    pub(crate) banned: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    /// Dials held back from peers that keep closing our connections at once (`backoff`).
    pub(crate) backoff: crate::backoff::Behaviour,
    pub(crate) allow: Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>,
    pub(crate) identify: identify::Behaviour,
    pub(crate) ping: ping::Behaviour,
    pub(crate) kad: kad::Behaviour<kad::store::MemoryStore>,
    pub(crate) mdns: Toggle<mdns::tokio::Behaviour>,
    pub(crate) gossipsub: gossipsub::Behaviour,
    pub(crate) relay: relay::client::Behaviour,
    /// Circuit relay v2 server: a `relay` node, or `network.relay_service` ([`relay_server`]).
    pub(crate) relay_server: Toggle<relay::Behaviour>,
    pub(crate) dcutr: dcutr::Behaviour,
    pub(crate) autonat: Toggle<autonat::Behaviour>,
    pub(crate) stream: libp2p_stream::Behaviour,
}

impl crate::reachability::AsNatEvent for BehaviourEvent {
    fn as_nat_event(&self) -> crate::reachability::NatEvent<'_> {
        use crate::reachability::NatEvent;
        match self {
            BehaviourEvent::Autonat(e) => NatEvent::Autonat(e),
            BehaviourEvent::Relay(e) => NatEvent::RelayClient(e),
            BehaviourEvent::Dcutr(e) => NatEvent::Dcutr(e),
            BehaviourEvent::RelayServer(e) => NatEvent::RelayServer(e),
            _ => NatEvent::Other,
        }
    }
}

/// The Kademlia protocol of a swarm (`/echo-swarm/<swarm_id>/kad/1.0.0`): one DHT per swarm, so
/// nodes of different swarms never fill each other's routing tables.
pub(crate) fn kad_protocol(swarm_id: &str) -> Result<StreamProtocol, P2pError> {
    StreamProtocol::try_from_owned(format!("/echo-swarm/{swarm_id}/kad/1.0.0")).map_err(|e| {
        P2pError::Config {
            key: "swarm_id".into(),
            reason: e.to_string(),
        }
    })
}

/// The hashes of every topic of `swarm_id` (the topics the scoring parameters cover).
pub(crate) fn topic_hashes(swarm_id: &str) -> Vec<TopicHash> {
    TopicKind::ALL
        .iter()
        .map(|k| IdentTopic::new(k.topic_name(swarm_id)).hash())
        .collect()
}

/// Builds the swarm: the transport (TCP+noise+yamux, pnet when `psk_file` is set, QUIC when
/// enabled; its TCP sockets tracked in `sockets`), DNS, the relay client, bandwidth metrics
/// in `registry`, and [`Behaviour`].
pub(crate) fn build_swarm(
    key: Keypair,
    cfg: &ServiceConfig,
    allow: &HashSet<PeerId>,
    kad_protocol: StreamProtocol,
    registry: &mut Registry,
    sockets: crate::congestion::SocketRegistry,
) -> Result<Swarm<Behaviour>, P2pError> {
    let net = &cfg.network;
    let psk = net.psk_file.as_deref().map(load_psk).transpose()?;
    if let Some(psk) = &psk {
        info!(fingerprint = %psk_fingerprint(psk), "private swarm: pre-shared key loaded; TCP only (no QUIC)");
    }
    let transport = build_transport(&key, psk, net.quic_enabled(), sockets)?;
    let topics = topic_hashes(&cfg.swarm_id);
    let mut swarm = SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|_| transport)
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_dns()
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(|e| P2pError::Transport(e.to_string()))?
        .with_bandwidth_metrics(registry)
        .with_behaviour(|key, relay| -> Result<Behaviour, BoxError> {
            let peer_id = key.public().to_peer_id();
            Ok(Behaviour {
                limits: limits_behaviour(net),
                banned: allow_block_list::Behaviour::default(),
                backoff: crate::backoff::Behaviour::default(),
                allow: Toggle::from(allow_behaviour(allow)),
                identify: identify_behaviour(key, &cfg.node_version),
                ping: ping::Behaviour::new(ping::Config::new()),
                kad: kad_behaviour(peer_id, kad_protocol),
                mdns: Toggle::from(
                    net.mdns
                        .then(|| mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id))
                        .transpose()?,
                ),
                gossipsub: gossipsub_behaviour(key, &topics, registry)?,
                relay,
                relay_server: Toggle::from(relay_server(peer_id, cfg)),
                dcutr: dcutr::Behaviour::new(peer_id),
                autonat: Toggle::from(
                    autonat_enabled(cfg)
                        .then(|| autonat::Behaviour::new(peer_id, autonat::Config::default())),
                ),
                stream: libp2p_stream::Behaviour::new(),
            })
        })
        .map_err(|e| P2pError::Behaviour(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(IDLE_CONNECTION_TIMEOUT))
        .build();
    if cfg.role == Role::Relay {
        // A relay node is a relay by its operator's decision: advertise the hop protocol at
        // once instead of waiting for a confirmed external address (which a relay behind a
        // static port forward, or on loopback, may never get).
        if let Some(r) = swarm.behaviour_mut().relay_server.as_mut() {
            r.set_status(Some(relay::Status::Enable));
        }
    }
    Ok(swarm)
}

/// Inbound connection limits: a flood of handshakes or connections from strangers cannot
/// exhaust file descriptors or memory. Outbound connections are bounded by `max_peers` (the
/// service dials no more), so only the per-peer limit applies to them.
fn limits_behaviour(net: &crate::config::NetworkConfig) -> connection_limits::Behaviour {
    connection_limits::Behaviour::new(
        connection_limits::ConnectionLimits::default()
            .with_max_established_incoming(Some(net.max_inbound))
            .with_max_pending_incoming(Some(net.max_pending_inbound))
            .with_max_established_per_peer(Some(net.max_per_peer)),
    )
}

/// Listens on the QUIC companions of the TCP listen addresses
/// ([`crate::transport::quic_companions`]) when QUIC is on and `network.quic_auto_listen` is
/// set. A companion that cannot be bound is logged, not fatal: TCP still serves.
pub(crate) fn listen_quic_companions(
    swarm: &mut Swarm<Behaviour>,
    net: &crate::config::NetworkConfig,
) {
    if !(net.quic_enabled() && net.quic_auto_listen) {
        return;
    }
    let listen: Vec<libp2p::Multiaddr> = net.listen.iter().filter_map(|a| a.parse().ok()).collect();
    for a in crate::transport::quic_companions(&listen) {
        if let Err(e) = swarm.listen_on(a.clone()) {
            let error = crate::transport::transport_error_text(&e);
            tracing::warn!(addr = %a, %error, "cannot listen on QUIC");
        }
    }
}

/// Adds `network.external_addrs` (addresses this node is reachable at, e.g. a public IP in
/// front of a `0.0.0.0` listener) as confirmed external addresses: identify announces them
/// and a relay server hands them out in its reservations.
pub(crate) fn add_external_addrs(
    swarm: &mut Swarm<Behaviour>,
    net: &crate::config::NetworkConfig,
) -> Result<(), P2pError> {
    for a in &net.external_addrs {
        let addr: libp2p::Multiaddr = a.parse().map_err(|e| P2pError::Config {
            key: "network.external_addrs".into(),
            reason: format!("`{a}`: {e}"),
        })?;
        swarm.add_external_address(addr);
    }
    Ok(())
}

/// A new listen address: a `relay` node treats each concrete one (not `0.0.0.0`/`::`, not a
/// circuit) as external. The relay server hands its external addresses out with every
/// reservation, and a reservation without addresses is refused by the client, so a relay must
/// have at least one; on a public host, `network.external_addrs` names the public one.
pub(crate) fn on_new_listen_addr(
    swarm: &mut Swarm<Behaviour>,
    cfg: &ServiceConfig,
    addr: &libp2p::Multiaddr,
) {
    if cfg.role == Role::Relay && is_concrete(addr) {
        swarm.add_external_address(addr.clone());
    }
}

/// Not an unspecified IP and not a relay circuit: an address a peer could dial as it is.
pub(crate) fn is_concrete(addr: &libp2p::Multiaddr) -> bool {
    use libp2p::multiaddr::Protocol;
    addr.iter().all(|p| match p {
        Protocol::Ip4(ip) => !ip.is_unspecified(),
        Protocol::Ip6(ip) => !ip.is_unspecified(),
        Protocol::P2pCircuit => false,
        _ => true,
    })
}

/// The swarm's listen addresses in a stable order: direct TCP first, then QUIC, then relay
/// circuits, each group sorted. libp2p keeps them in a hash map; callers that dial "the first
/// address" of a node (address files, harnesses, nodes without QUIC) get a TCP one whenever
/// the node has one.
pub(crate) fn ordered_listeners(swarm: &Swarm<Behaviour>) -> Vec<libp2p::Multiaddr> {
    let mut v: Vec<libp2p::Multiaddr> = swarm.listeners().cloned().collect();
    v.sort_by_key(|a| (listen_rank(a), a.to_string()));
    v
}

/// 0 = direct TCP, 1 = QUIC, 2 = relay circuit.
fn listen_rank(a: &libp2p::Multiaddr) -> u8 {
    use libp2p::multiaddr::Protocol;
    if a.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
        2
    } else if a.iter().any(|p| matches!(p, Protocol::QuicV1)) {
        1
    } else {
        0
    }
}

/// Whether this node runs the relay server: always on a `relay` node, on others when
/// `network.relay_service` is set.
pub(crate) fn runs_relay_server(cfg: &ServiceConfig) -> bool {
    cfg.role == Role::Relay || cfg.network.relay_service
}

/// AutoNAT (client and server) runs when configured, and always on a `relay` node: it is the
/// swarm's reachability prober.
fn autonat_enabled(cfg: &ServiceConfig) -> bool {
    cfg.network.autonat || cfg.role == Role::Relay
}

/// The relay server with the `[network]` limits ([`relay_config`]), when it runs.
fn relay_server(peer_id: PeerId, cfg: &ServiceConfig) -> Option<relay::Behaviour> {
    runs_relay_server(cfg).then(|| relay::Behaviour::new(peer_id, relay_config(&cfg.network)))
}

/// Circuit relay v2 limits from `[network]`. libp2p's defaults (128 KiB and 2 minutes per
/// circuit) suit relays that only help hole punching; a swarm relay also carries the traffic
/// of relay-only workers (snapshots in, trajectory groups out), so the byte and duration
/// limits are config keys with larger defaults. The rate limiters stay libp2p's.
pub(crate) fn relay_config(net: &crate::config::NetworkConfig) -> relay::Config {
    relay::Config {
        max_reservations: net.relay_max_reservations as usize,
        max_reservations_per_peer: net.relay_max_reservations_per_peer as usize,
        reservation_duration: Duration::from_secs(net.relay_reservation_duration_s),
        max_circuits: net.relay_max_circuits as usize,
        max_circuits_per_peer: net.relay_max_circuits_per_peer as usize,
        max_circuit_duration: Duration::from_secs(net.relay_max_circuit_duration_s),
        max_circuit_bytes: net.relay_max_circuit_mb.saturating_mul(1 << 20),
        ..relay::Config::default()
    }
}

/// Private swarms: only allow-listed peers may hold a connection (none when the list is empty).
fn allow_behaviour(
    allow: &HashSet<PeerId>,
) -> Option<allow_block_list::Behaviour<allow_block_list::AllowedPeers>> {
    if allow.is_empty() {
        return None;
    }
    let mut b = allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
    for p in allow {
        b.allow_peer(*p);
    }
    Some(b)
}

/// Identify under [`IDENTIFY_PROTOCOL`], announcing `echo-node/<version>` as the agent and
/// pushing listen-address changes.
fn identify_behaviour(key: &Keypair, node_version: &str) -> identify::Behaviour {
    identify::Behaviour::new(
        identify::Config::new(IDENTIFY_PROTOCOL.to_string(), key.public())
            .with_agent_version(format!("echo-node/{node_version}"))
            // A relay reservation adds a listen address after the connection's first
            // identify exchange: push it, so that the relay's DHT learns the `/p2p-circuit`
            // address through which peers behind NAT are reached.
            .with_push_listen_addr_updates(true),
    )
}

/// Kademlia on the swarm's own protocol, in server mode from the start.
fn kad_behaviour(
    peer_id: PeerId,
    protocol: StreamProtocol,
) -> kad::Behaviour<kad::store::MemoryStore> {
    let mut kcfg = kad::Config::new(protocol);
    kcfg.set_query_timeout(KAD_QUERY_TIMEOUT);
    let mut kad = kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kcfg);
    // Answer DHT queries even before an external address is confirmed (loopback and private
    // swarms never confirm one).
    kad.set_mode(Some(kad::Mode::Server));
    kad
}

/// gossipsub with signed messages, strict validation, messages held until validated (the
/// service or the role reports a verdict on each), [`MAX_GOSSIP_BYTES`], metrics under
/// `gossipsub_` in `registry`, and peer scoring on `topics`.
fn gossipsub_behaviour(
    key: &Keypair,
    topics: &[TopicHash],
    registry: &mut Registry,
) -> Result<gossipsub::Behaviour, BoxError> {
    let gcfg = gossipsub::ConfigBuilder::default()
        .validation_mode(gossipsub::ValidationMode::Strict)
        .validate_messages()
        .max_transmit_size(MAX_GOSSIP_BYTES)
        .build()?;
    let mut gossipsub =
        gossipsub::Behaviour::new(gossipsub::MessageAuthenticity::Signed(key.clone()), gcfg)?
            .with_metrics(
                registry.sub_registry_with_prefix("gossipsub"),
                Default::default(),
            );
    gossipsub.with_peer_score(peer_score_params(topics), peer_score_thresholds())?;
    Ok(gossipsub)
}

// gossipsub v1.1 scoring, chosen for a swarm of a few to a few thousand nodes exchanging
// sparse, small control messages (see `docs/protocol.md`, "Peer scoring in gossipsub").

/// Peer-level scoring: [`topic_score_params`] on every topic of the swarm, and no IP
/// colocation penalty for loopback testnets or NATed pools.
pub(crate) fn peer_score_params(topics: &[TopicHash]) -> gossipsub::PeerScoreParams {
    let mut p = gossipsub::PeerScoreParams::default();
    // Loopback testnets and NATed pools put many nodes behind one IP: do not penalise them.
    p.ip_colocation_factor_whitelist
        .insert("127.0.0.1".parse().expect("ip"));
    p.ip_colocation_factor_whitelist
        .insert("::1".parse().expect("ip"));
    p.ip_colocation_factor_threshold = 32.0;
    for t in topics {
        p.topics.insert(t.clone(), topic_score_params());
    }
    p
}

/// Per-topic scoring (the same for every topic): rewards time in the mesh (P₁) and first
/// deliveries (P₂), punishes invalid messages hard (P₄); no delivery quotas (P₃, P₃b).
pub(crate) fn topic_score_params() -> gossipsub::TopicScoreParams {
    gossipsub::TopicScoreParams {
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
    }
}

/// Score thresholds: a peer stops receiving gossip below −10, its publishes are ignored below
/// −50, and it is graylisted (all its messages ignored) below −80 — three invalid messages
/// in a row (see [`topic_score_params`]). Peer exchange is accepted only from peers above +5.
pub(crate) fn peer_score_thresholds() -> gossipsub::PeerScoreThresholds {
    gossipsub::PeerScoreThresholds {
        gossip_threshold: -10.0,
        publish_threshold: -50.0,
        graylist_threshold: -80.0,
        accept_px_threshold: 5.0,
        opportunistic_graft_threshold: 3.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoring_parameters_are_valid_and_cover_every_topic() {
        let topics = topic_hashes("s");
        assert_eq!(topics.len(), TopicKind::ALL.len());
        let p = peer_score_params(&topics);
        p.validate().unwrap();
        peer_score_thresholds().validate().unwrap();
        for t in &topics {
            assert!(p.topics.contains_key(t), "{t}");
        }
    }

    #[test]
    fn three_invalid_messages_reach_the_graylist() {
        // P4 is weight · n²: the third invalid message crosses the graylist threshold.
        let tp = topic_score_params();
        let th = peer_score_thresholds();
        let p4 = |n: f64| tp.topic_weight * tp.invalid_message_deliveries_weight * n * n;
        assert!(p4(2.0) > th.graylist_threshold);
        assert!(p4(3.0) < th.graylist_threshold);
    }

    #[test]
    fn relay_limits_come_from_the_config_and_the_relay_role_forces_the_server() {
        let mut cfg = ServiceConfig::loopback("s", Role::Rollout, vec![], None);
        cfg.network.relay_max_circuit_mb = 3;
        cfg.network.relay_max_circuits = 7;
        let r = relay_config(&cfg.network);
        assert_eq!(r.max_circuit_bytes, 3 << 20);
        assert_eq!(r.max_circuits, 7);
        assert!(!runs_relay_server(&cfg) && !autonat_enabled(&cfg));
        cfg.network.relay_service = true;
        assert!(runs_relay_server(&cfg));
        cfg.network.relay_service = false;
        cfg.role = Role::Relay;
        assert!(runs_relay_server(&cfg) && autonat_enabled(&cfg));
    }

    #[test]
    fn only_concrete_addresses_are_announced() {
        let ok: libp2p::Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().unwrap();
        let any: libp2p::Multiaddr = "/ip4/0.0.0.0/tcp/1".parse().unwrap();
        let any6: libp2p::Multiaddr = "/ip6/::/udp/1/quic-v1".parse().unwrap();
        let circuit: libp2p::Multiaddr = format!(
            "/ip4/127.0.0.1/tcp/1/p2p/{}/p2p-circuit",
            crate::peer_id_from_seed([1; 32])
        )
        .parse()
        .unwrap();
        assert!(is_concrete(&ok));
        let quic: libp2p::Multiaddr = "/ip4/127.0.0.1/udp/1/quic-v1".parse().unwrap();
        assert_eq!(
            (listen_rank(&ok), listen_rank(&quic), listen_rank(&circuit)),
            (0, 1, 2)
        );
        assert!(!is_concrete(&any) && !is_concrete(&any6) && !is_concrete(&circuit));
    }

    #[test]
    fn kad_protocol_is_per_swarm() {
        assert_eq!(
            kad_protocol("demo").unwrap().as_ref(),
            "/echo-swarm/demo/kad/1.0.0"
        );
        assert!(kad_protocol("a").unwrap() != kad_protocol("b").unwrap());
    }
}
