//! The service's handling of swarm events: connections opened and closed, listen addresses,
//! denied and failed connections (counted), and the behaviours' events — identify, mDNS,
//! Kademlia, AutoNAT, relay and hole punching, and gossipsub messages (handed to
//! `service/gossip.rs` for validation).
//!
//! Owns: the reaction to what the swarm reports. Must not touch: the event loop and the
//! commands (`service.rs`), the validation rules (`service/gossip.rs`).

use std::collections::HashMap;

use libp2p::gossipsub;
use libp2p::metrics::Recorder;
use libp2p::swarm::{DialError, ListenError, SwarmEvent};
use libp2p::{autonat, identify, kad, mdns, Multiaddr, PeerId};
use tracing::{debug, info, warn};

use super::{denial, diagnose, is_circuit, strip_p2p, Service};

/// How long a connection failure, once warned about, stays quiet for the same peer or host.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The IP part of an address (a remote's port changes with every connection).
fn host_of(addr: &Multiaddr) -> String {
    addr.iter()
        .find(|p| {
            matches!(
                p,
                libp2p::multiaddr::Protocol::Ip4(_) | libp2p::multiaddr::Protocol::Ip6(_)
            )
        })
        .map_or_else(|| addr.to_string(), |p| p.to_string())
}
use crate::behaviour::{self, BehaviourEvent};
use crate::client::Event;

impl Service {
    pub(super) fn on_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        self.libp2p_metrics.record(&ev);
        self.nat.observe(&ev);
        self.circuits.on_swarm_event(&mut self.swarm, &ev);
        match ev {
            SwarmEvent::Behaviour(b) => self.on_behaviour_event(b),
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
                behaviour::on_new_listen_addr(&mut self.swarm, &self.cfg, &address);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                num_established,
                ..
            } => {
                let e = self.peer(peer_id);
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
                peer_id,
                ..
            } => {
                if let ListenError::Denied { cause } = &error {
                    self.count_denied();
                    let why = denial(cause);
                    let not_allowed = cause
                        .downcast_ref::<libp2p::allow_block_list::NotAllowed>()
                        .is_some();
                    match peer_id {
                        Some(p) if not_allowed => {
                            if self.first_warning(&format!("allow {p}")) {
                                warn!(
                                    peer = %p,
                                    addr = %send_back_addr,
                                    "inbound connection refused: peer {p} is not in network.allow_list \
                                     (add \"{p}\" to it to let this node in)"
                                );
                            }
                        }
                        _ => {
                            warn!(peer = ?peer_id, addr = %send_back_addr, %cause, "inbound connection refused ({why})")
                        }
                    }
                } else {
                    self.count_connection_error();
                    let from = host_of(&send_back_addr);
                    if self.first_warning(&format!("in {from}")) {
                        let error = diagnose::listen_error_text(&error);
                        warn!(
                            addr = %send_back_addr,
                            %error,
                            private_swarm = self.cfg.network.psk_file.is_some(),
                            "inbound connection failed in its handshake: {}",
                            diagnose::HANDSHAKE_HINT
                        );
                    }
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let DialError::Denied { cause } = &error {
                    if crate::backoff::held_back(cause) {
                        // Our own gate, not the peer's refusal: expected, and frequent while
                        // Kademlia queries or the bootstrap redial keep asking.
                        debug!(peer = ?peer_id, %cause, "dial held back");
                        return;
                    }
                    self.count_denied();
                    let why = denial(cause);
                    warn!(peer = ?peer_id, %cause, "outbound connection refused ({why})");
                } else {
                    self.count_connection_error();
                    let bootstrap =
                        peer_id.is_some_and(|p| self.bootstrap.iter().any(|(b, _)| *b == p));
                    let failure = diagnose::dial_failure(&error);
                    let key = format!("out {peer_id:?}");
                    match failure.kind {
                        diagnose::DialFailureKind::Handshake => {
                            if self.first_warning(&key) {
                                warn!(
                                    peer = ?peer_id,
                                    error = %failure.text,
                                    private_swarm = self.cfg.network.psk_file.is_some(),
                                    "connection failed in its handshake: {}",
                                    diagnose::HANDSHAKE_HINT
                                );
                            }
                        }
                        diagnose::DialFailureKind::Unreachable if bootstrap => {
                            if self.first_warning(&key) {
                                warn!(
                                    peer = ?peer_id,
                                    error = %failure.text,
                                    "bootstrap peer cannot be reached (is it running, is the address in \
                                     network.bootstrap right, does a firewall block it?)"
                                );
                            }
                        }
                        diagnose::DialFailureKind::Unreachable
                        | diagnose::DialFailureKind::Other => {
                            if bootstrap && self.first_warning(&key) {
                                warn!(peer = ?peer_id, error = %failure.text, "dialing a bootstrap peer failed");
                            } else {
                                debug!(peer = ?peer_id, error = %failure.text, "dial failed");
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether a warning about `what` is the first in [`WARN_EVERY`]: a peer that keeps
    /// failing the same way is named once a minute, not on every redial.
    pub(super) fn first_warning(&mut self, what: &str) -> bool {
        let now = std::time::Instant::now();
        self.warned
            .retain(|_, t| now.duration_since(*t) < WARN_EVERY);
        if self.warned.len() >= 1024 || self.warned.contains_key(what) {
            return false;
        }
        self.warned.insert(what.to_string(), now);
        true
    }

    pub(super) fn count_denied(&mut self) {
        self.counters.connections_denied += 1;
        metrics::counter!("p2p_connections_denied_total").increment(1);
    }

    pub(super) fn count_connection_error(&mut self) {
        self.counters.connection_errors += 1;
        metrics::counter!("p2p_connection_errors_total").increment(1);
    }

    pub(super) fn on_behaviour_event(&mut self, ev: BehaviourEvent) {
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
                    self.on_identified(peer_id, info);
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
            BehaviourEvent::Mdns(mdns::Event::Discovered(list)) => self.on_mdns_discovered(list),
            BehaviourEvent::Ping(ev) => self.libp2p_metrics.record(&ev),
            BehaviourEvent::Dcutr(ev) => self.libp2p_metrics.record(&ev),
            BehaviourEvent::Relay(ev) => debug!(?ev, "relay client"),
            BehaviourEvent::Autonat(autonat::Event::StatusChanged { old, new }) => {
                info!(?old, ?new, "NAT status changed");
            }
            _ => {}
        }
    }

    /// Identify told us a peer's agent and listen addresses: keep the direct ones, and feed
    /// all of them to Kademlia if the peer speaks this swarm's DHT.
    pub(super) fn on_identified(&mut self, peer_id: PeerId, info: identify::Info) {
        let speaks_kad = info.protocols.contains(&self.kad_protocol);
        let e = self.peer(peer_id);
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

    pub(super) fn on_mdns_discovered(&mut self, list: Vec<(PeerId, Multiaddr)>) {
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
}
