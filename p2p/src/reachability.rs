//! Reachability: how other peers can reach this node, learned from what the NAT-traversal
//! behaviours observe, and how each connection was made.
//!
//! Owns: the [`Reachability`] classes gossiped in heartbeats and shown in `status`, the pure
//! [`classify`] rule over [`Observations`], and [`NatTracker`] — the bookkeeping the service
//! task feeds with swarm events (AutoNAT verdicts, relay reservations, DCUtR outcomes,
//! connection endpoints, and the relay server's reservations and circuits when this node
//! serves as a relay). Must not touch: the swarm itself (the service calls
//! [`NatTracker::observe`] with each event), behaviour configuration (`behaviour`), or what
//! planners do with the classes (`control::plan` puts relay-only nodes at chain tails).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{autonat, dcutr, relay, PeerId};
use serde::{Deserialize, Serialize};

/// The NAT-traversal events [`NatTracker`] reads, borrowed from the service's behaviour
/// event (which implements [`AsNatEvent`]; this module does not know the behaviour type).
pub(crate) enum NatEvent<'a> {
    Autonat(&'a autonat::Event),
    RelayClient(&'a relay::client::Event),
    Dcutr(&'a dcutr::Event),
    RelayServer(&'a relay::Event),
    Other,
}

/// A behaviour event seen as a [`NatEvent`].
pub(crate) trait AsNatEvent {
    fn as_nat_event(&self) -> NatEvent<'_>;
}

/// How other peers can reach a node (wire spelling lowercase: `"public"`, `"holepunch"`,
/// `"relayed"`, `"unknown"`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Reachability {
    /// AutoNAT confirmed a public address: peers dial it directly.
    Public,
    /// Behind NAT, holds a relay reservation, and a relayed connection was upgraded to a
    /// direct one by hole punching (DCUtR) at least once.
    Holepunch,
    /// Reachable only through a relay: holds a reservation but hole punching has not (yet)
    /// succeeded. Its traffic crosses the relay, so it must not forward snapshots.
    Relayed,
    /// Nothing observed yet (also every node on loopback, where AutoNAT never confirms).
    #[default]
    Unknown,
}

impl Reachability {
    /// Every class, in declaration order.
    pub const ALL: &[Reachability] = <Reachability as strum::VariantArray>::VARIANTS;

    /// The wire spelling (the serde name, and `Display`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Only relay-only nodes are kept from forwarding: every byte they forward would cross
    /// the relay twice (in and out), on a circuit with byte and duration limits. `Unknown`
    /// forwards (older nodes and loopback swarms report nothing).
    pub const fn relay_only(self) -> bool {
        matches!(self, Reachability::Relayed)
    }
}

/// The latest AutoNAT verdict on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NatVerdict {
    Public,
    Private,
    #[default]
    Unknown,
}

/// The facts [`classify`] decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observations {
    pub autonat: NatVerdict,
    /// Relay reservations currently held.
    pub reservations: usize,
    /// Relayed connections upgraded to direct ones by DCUtR (since start).
    pub holepunch_successes: u64,
}

/// The reachability rule:
/// 1. AutoNAT says public → [`Reachability::Public`] (the strongest evidence: strangers dialed
///    us back).
/// 2. A relay reservation and at least one successful hole punch → [`Reachability::Holepunch`].
/// 3. A relay reservation and no successful hole punch → [`Reachability::Relayed`]: until hole
///    punching has worked once, the only proven way in is the relay. A node that is
///    hole-punchable gets there as soon as a peer reaches it through the relay (DCUtR runs on
///    every relayed connection), so the conservative class corrects itself.
/// 4. Anything else → [`Reachability::Unknown`] (including "private, no reservation": that
///    node is unreachable inbound; `echo-node doctor` tells its operator to set `relays`).
pub fn classify(o: &Observations) -> Reachability {
    match (o.autonat, o.reservations > 0, o.holepunch_successes > 0) {
        (NatVerdict::Public, _, _) => Reachability::Public,
        (_, true, true) => Reachability::Holepunch,
        (_, true, false) => Reachability::Relayed,
        _ => Reachability::Unknown,
    }
}

/// How this node is connected to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionKind {
    /// A direct connection (TCP or QUIC).
    Direct,
    /// A direct connection made by hole punching a relayed one (DCUtR).
    Holepunched,
    /// Only through a relay (`/p2p-circuit`).
    Relayed,
}

/// The relay server's load (a `relay` node, or one with `network.relay_service` on).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RelayServerStatus {
    /// Reservations held now (one per peer).
    pub reservations: usize,
    /// Circuits open now.
    pub circuits: usize,
    pub reservations_accepted_total: u64,
    pub reservations_denied_total: u64,
    pub circuits_accepted_total: u64,
    pub circuits_denied_total: u64,
}

/// The NAT-traversal section of the status view (`"nat"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NatStatus {
    pub reachability: Reachability,
    pub autonat: NatVerdict,
    /// Relays this node holds a reservation on (peer ids).
    pub reservations: Vec<String>,
    pub holepunch_successes: u64,
    pub holepunch_failures: u64,
    /// Each connected peer (by peer id) and how the connection was made.
    pub connections: BTreeMap<String, ConnectionKind>,
    /// Present when this node serves as a relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_server: Option<RelayServerStatus>,
}

/// Per-peer connection bookkeeping.
#[derive(Debug, Default)]
struct PeerConns {
    direct: BTreeSet<ConnectionId>,
    relayed: BTreeSet<ConnectionId>,
    holepunched: bool,
}

/// What the service knows of this node's reachability and connections (fed by
/// [`NatTracker::observe`], read by the status view and the heartbeat).
#[derive(Debug, Default)]
pub(crate) struct NatTracker {
    autonat: NatVerdict,
    reservations: BTreeSet<PeerId>,
    holepunch_successes: u64,
    holepunch_failures: u64,
    conns: HashMap<PeerId, PeerConns>,
    relay_server: Option<(RelayServerStatus, BTreeSet<PeerId>)>,
}

impl NatTracker {
    /// A tracker; `relay_server` when this node runs the relay server behaviour.
    pub(crate) fn new(relay_server: bool) -> Self {
        NatTracker {
            relay_server: relay_server.then(Default::default),
            ..NatTracker::default()
        }
    }

    /// This node's class now ([`classify`]).
    pub(crate) fn reachability(&self) -> Reachability {
        classify(&Observations {
            autonat: self.autonat,
            reservations: self.reservations.len(),
            holepunch_successes: self.holepunch_successes,
        })
    }

    /// How this node is connected to `peer`, if it is.
    pub(crate) fn connection(&self, peer: &PeerId) -> Option<ConnectionKind> {
        let c = self.conns.get(peer)?;
        if !c.direct.is_empty() {
            Some(if c.holepunched {
                ConnectionKind::Holepunched
            } else {
                ConnectionKind::Direct
            })
        } else if !c.relayed.is_empty() {
            Some(ConnectionKind::Relayed)
        } else {
            None
        }
    }

    pub(crate) fn status(&self) -> NatStatus {
        NatStatus {
            reachability: self.reachability(),
            autonat: self.autonat,
            reservations: self.reservations.iter().map(ToString::to_string).collect(),
            holepunch_successes: self.holepunch_successes,
            holepunch_failures: self.holepunch_failures,
            connections: self
                .conns
                .keys()
                .filter_map(|p| Some((p.to_string(), self.connection(p)?)))
                .collect(),
            relay_server: self.relay_server.as_ref().map(|(s, _)| s.clone()),
        }
    }

    /// Feeds one swarm event (called by the service for every event, before it handles it).
    pub(crate) fn observe<B: AsNatEvent>(&mut self, ev: &SwarmEvent<B>) {
        match ev {
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } => {
                let c = self.conns.entry(*peer_id).or_default();
                if endpoint.is_relayed() {
                    c.relayed.insert(*connection_id);
                } else {
                    c.direct.insert(*connection_id);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                if let Some(c) = self.conns.get_mut(peer_id) {
                    c.direct.remove(connection_id);
                    c.relayed.remove(connection_id);
                }
                if *num_established == 0 {
                    self.conns.remove(peer_id);
                    // A reservation lives on the connection to its relay.
                    self.reservations.remove(peer_id);
                }
            }
            // A reservation ends with its listener (the relay refused a renewal, or the
            // listener was closed) even while the relay stays connected.
            SwarmEvent::ExpiredListenAddr { address, .. } => self.drop_reservation(address),
            SwarmEvent::ListenerClosed { addresses, .. } => {
                for a in addresses {
                    self.drop_reservation(a);
                }
            }
            SwarmEvent::Behaviour(b) => self.observe_behaviour(b.as_nat_event()),
            _ => {}
        }
    }

    /// Forgets the reservation behind a `/p2p/<relay>/p2p-circuit` listen address.
    fn drop_reservation(&mut self, addr: &libp2p::Multiaddr) {
        if let Some(relay) = relay_of_circuit(addr) {
            self.reservations.remove(&relay);
        }
    }

    fn observe_behaviour(&mut self, ev: NatEvent<'_>) {
        match ev {
            NatEvent::Autonat(autonat::Event::StatusChanged { new, .. }) => {
                self.autonat = match new {
                    autonat::NatStatus::Public(_) => NatVerdict::Public,
                    autonat::NatStatus::Private => NatVerdict::Private,
                    autonat::NatStatus::Unknown => NatVerdict::Unknown,
                };
            }
            NatEvent::RelayClient(relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                ..
            }) => {
                self.reservations.insert(*relay_peer_id);
            }
            NatEvent::Dcutr(dcutr::Event {
                remote_peer_id,
                result,
            }) => match result {
                Ok(_) => {
                    tracing::info!(peer = %remote_peer_id, "hole punch: relayed connection upgraded to a direct one");
                    self.holepunch_successes += 1;
                    self.conns.entry(*remote_peer_id).or_default().holepunched = true;
                    metrics::counter!("p2p_holepunch_total", "result" => "ok").increment(1);
                }
                Err(e) => {
                    tracing::info!(peer = %remote_peer_id, error = %e, "hole punch failed");
                    self.holepunch_failures += 1;
                    metrics::counter!("p2p_holepunch_total", "result" => "failed").increment(1);
                }
            },
            NatEvent::RelayServer(ev) => self.observe_relay_server(ev),
            _ => {}
        }
    }

    fn observe_relay_server(&mut self, ev: &relay::Event) {
        let Some((s, holders)) = self.relay_server.as_mut() else {
            return;
        };
        match ev {
            relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
                s.reservations_accepted_total += 1;
                holders.insert(*src_peer_id);
            }
            relay::Event::ReservationReqDenied { .. } => s.reservations_denied_total += 1,
            relay::Event::ReservationClosed { src_peer_id }
            | relay::Event::ReservationTimedOut { src_peer_id } => {
                holders.remove(src_peer_id);
            }
            relay::Event::CircuitReqAccepted { .. } => {
                s.circuits_accepted_total += 1;
                s.circuits += 1;
            }
            relay::Event::CircuitReqDenied { .. } => s.circuits_denied_total += 1,
            relay::Event::CircuitClosed { .. } => s.circuits = s.circuits.saturating_sub(1),
            _ => {}
        }
        s.reservations = holders.len();
        metrics::gauge!("p2p_relay_reservations").set(s.reservations as f64);
        metrics::gauge!("p2p_relay_circuits").set(s.circuits as f64);
    }
}

/// The relay of a circuit address: the `/p2p/<relay>` right before `/p2p-circuit`.
pub(crate) fn relay_of_circuit(addr: &libp2p::Multiaddr) -> Option<PeerId> {
    use libp2p::multiaddr::Protocol;
    let mut last = None;
    for p in addr.iter() {
        match p {
            Protocol::P2p(id) => last = Some(id),
            Protocol::P2pCircuit => return last,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_of_a_circuit_address_is_the_peer_before_p2p_circuit() {
        let relay = crate::peer_id_from_seed([1; 32]);
        let me = crate::peer_id_from_seed([2; 32]);
        let a: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/1/p2p/{relay}/p2p-circuit/p2p/{me}")
            .parse()
            .unwrap();
        assert_eq!(relay_of_circuit(&a), Some(relay));
        let direct: libp2p::Multiaddr =
            format!("/ip4/127.0.0.1/tcp/1/p2p/{relay}").parse().unwrap();
        assert_eq!(relay_of_circuit(&direct), None);
    }

    fn obs(autonat: NatVerdict, reservations: usize, successes: u64) -> Observations {
        Observations {
            autonat,
            reservations,
            holepunch_successes: successes,
        }
    }

    #[test]
    fn autonat_public_wins() {
        for (r, s) in [(0, 0), (1, 0), (1, 3)] {
            assert_eq!(
                classify(&obs(NatVerdict::Public, r, s)),
                Reachability::Public
            );
        }
    }

    #[test]
    fn a_reservation_is_relayed_until_a_hole_punch_succeeds() {
        for nat in [NatVerdict::Private, NatVerdict::Unknown] {
            assert_eq!(classify(&obs(nat, 1, 0)), Reachability::Relayed);
            assert_eq!(classify(&obs(nat, 2, 1)), Reachability::Holepunch);
        }
    }

    #[test]
    fn without_reservation_or_verdict_it_is_unknown() {
        assert_eq!(classify(&Observations::default()), Reachability::Unknown);
        assert_eq!(
            classify(&obs(NatVerdict::Private, 0, 0)),
            Reachability::Unknown
        );
        // A past hole punch without a reservation proves nothing about inbound reachability.
        assert_eq!(
            classify(&obs(NatVerdict::Unknown, 0, 5)),
            Reachability::Unknown
        );
    }

    #[test]
    fn only_relayed_is_relay_only_and_the_wire_spelling_is_lowercase() {
        for &r in Reachability::ALL {
            assert_eq!(r.relay_only(), r == Reachability::Relayed);
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<Reachability>(&json).unwrap(), r);
        }
        assert!(serde_json::from_str::<Reachability>("\"nat\"").is_err());
    }

    #[test]
    fn tracker_starts_unknown_and_reports_relay_server_only_when_enabled() {
        let t = NatTracker::new(false);
        assert_eq!(t.reachability(), Reachability::Unknown);
        assert!(t.status().relay_server.is_none());
        let t = NatTracker::new(true);
        assert_eq!(t.status().relay_server, Some(RelayServerStatus::default()));
    }
}
