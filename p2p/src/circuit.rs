//! Listening through relays: the `/p2p-circuit` listeners of `network.listen` and
//! `network.relays`, kept alive across relay restarts.
//!
//! A relay reservation must be requested on an established connection to the relay: asking
//! for it while the connection is still being dialed makes libp2p's relay client start a
//! second dial that the swarm refuses (one dial per peer at a time), and the listener closes
//! at once. So circuit listeners are opened when the connection to their relay is up, and
//! re-opened (on the service's re-dial tick) when they close while the relay stays connected.
//!
//! Owns: [`CircuitListeners`] — which relays this node listens through and the listener of
//! each. Must not touch: what the relay client does on the wire (libp2p) or the rest of the
//! event loop (the service calls [`CircuitListeners::on_swarm_event`] and
//! [`CircuitListeners::tick`]).

use std::collections::BTreeMap;

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, Swarm};
use tracing::{debug, info};

use crate::behaviour::{Behaviour, BehaviourEvent};

/// Whether `addr` listens through a relay (`…/p2p/<relay>/p2p-circuit`).
pub fn is_circuit(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}

/// One relay this node listens through.
#[derive(Debug)]
struct Circuit {
    /// The relay's address with `/p2p/<relay>` (no `/p2p-circuit`).
    relay_addr: Multiaddr,
    listener: Option<ListenerId>,
}

/// The relays this node listens through and their listeners.
#[derive(Debug, Default)]
pub(crate) struct CircuitListeners {
    circuits: BTreeMap<PeerId, Circuit>,
}

impl CircuitListeners {
    /// From the circuit addresses of `network.listen` and the relays of `network.relays`.
    /// An address without a relay peer id is skipped (config validation names it).
    pub(crate) fn new(listen: &[Multiaddr], relays: &[Multiaddr]) -> Self {
        let mut circuits = BTreeMap::new();
        let relay_part = |a: &Multiaddr| -> Multiaddr {
            a.iter()
                .take_while(|p| !matches!(p, Protocol::P2pCircuit))
                .collect()
        };
        for a in listen
            .iter()
            .filter(|a| is_circuit(a))
            .map(relay_part)
            .chain(relays.iter().cloned())
        {
            if let Some(peer) = crate::peer_id_of(&a) {
                circuits.entry(peer).or_insert(Circuit {
                    relay_addr: a,
                    listener: None,
                });
            }
        }
        CircuitListeners { circuits }
    }

    /// Listens through `relay` if it is one of ours, connected, and has no listener.
    fn ensure_listener(&mut self, swarm: &mut Swarm<Behaviour>, relay: PeerId) {
        let Some(c) = self.circuits.get_mut(&relay) else {
            return;
        };
        if c.listener.is_some() || !swarm.is_connected(&relay) {
            return;
        }
        let addr = c.relay_addr.clone().with(Protocol::P2pCircuit);
        match swarm.listen_on(addr.clone()) {
            Ok(id) => {
                info!(%addr, "requesting a relay reservation");
                c.listener = Some(id);
            }
            Err(e) => debug!(%addr, error = %e, "cannot listen through the relay"),
        }
    }

    /// Opens a listener when a relay's connection comes up; forgets one that closed.
    pub(crate) fn on_swarm_event(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ev: &SwarmEvent<BehaviourEvent>,
    ) {
        match ev {
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } if !endpoint.is_relayed() => self.ensure_listener(swarm, *peer_id),
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => {
                for (relay, c) in &mut self.circuits {
                    if c.listener == Some(*listener_id) {
                        info!(%relay, ?reason, "relay listener closed; it is re-opened while the relay is connected");
                        c.listener = None;
                    }
                }
            }
            _ => {}
        }
    }

    /// Periodic: dials relays that are not connected, re-opens closed listeners.
    pub(crate) fn tick(&mut self, swarm: &mut Swarm<Behaviour>) {
        let relays: Vec<(PeerId, Multiaddr)> = self
            .circuits
            .iter()
            .map(|(p, c)| (*p, c.relay_addr.clone()))
            .collect();
        for (relay, addr) in relays {
            if swarm.is_connected(&relay) {
                self.ensure_listener(swarm, relay);
            } else {
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(relay)
                    .addresses(vec![addr])
                    .build();
                if let Err(e) = swarm.dial(opts) {
                    debug!(%relay, error = %e, "relay dial not started");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuits_come_from_listen_and_relays_once_per_relay() {
        let r1 = crate::peer_id_from_seed([1; 32]);
        let r2 = crate::peer_id_from_seed([2; 32]);
        let listen: Vec<Multiaddr> = [
            "/ip4/127.0.0.1/tcp/0".to_string(),
            format!("/ip4/127.0.0.1/tcp/9/p2p/{r1}/p2p-circuit"),
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        let relays: Vec<Multiaddr> = [
            format!("/ip4/127.0.0.1/tcp/9/p2p/{r1}"),
            format!("/ip4/10.0.0.1/udp/9/quic-v1/p2p/{r2}"),
            "/ip4/10.0.0.2/tcp/1".to_string(),
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        let c = CircuitListeners::new(&listen, &relays);
        assert_eq!(c.circuits.keys().copied().collect::<Vec<_>>().len(), 2);
        assert_eq!(
            c.circuits[&r1].relay_addr.to_string(),
            format!("/ip4/127.0.0.1/tcp/9/p2p/{r1}")
        );
        assert!(c.circuits.contains_key(&r2));
        assert!(is_circuit(&listen[1]) && !is_circuit(&listen[0]));
        assert!(CircuitListeners::new(&listen[..1], &[]).circuits.is_empty());
    }
}
