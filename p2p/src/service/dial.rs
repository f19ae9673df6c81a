//! The service's dialing: the bootstrap peers, a discovered peer it is not connected to (at
//! most one dial under way per peer), the addresses it knows for a peer, and a dial from a
//! new local port (what a stream open asks for after a failed dial).
//!
//! Owns: when and how the service dials. Must not touch: which peers are worth keeping (the
//! peer table, `peers.rs`) or what a connection carries.

use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId};
use tracing::debug;

use super::{strip_p2p, Service};

impl Service {
    pub(super) fn dial_bootstrap(&mut self) {
        for (peer, addr) in self.bootstrap.clone() {
            if peer == *self.swarm.local_peer_id()
                || self.swarm.is_connected(&peer)
                || self.bans.contains(&peer)
            {
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

    /// Dials a discovered peer unless it is us, already connected, banned, not allow-listed,
    /// or the node is at `max_peers`.
    pub(super) fn maybe_dial(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        if peer == *self.swarm.local_peer_id()
            || self.swarm.is_connected(&peer)
            || self.bans.contains(&peer)
        {
            return;
        }
        if !self.allow.is_empty() && !self.allow.contains(&peer) {
            return;
        }
        if self.swarm.connected_peers().count() >= self.cfg.network.max_peers as usize {
            return;
        }
        self.dial_from_new_port(peer, addrs);
    }

    /// Every address this node holds for `peer`: its bootstrap entry, the peer table's
    /// (connections it dialed, identify) and its last heartbeat's dial hints. Kademlia forgets
    /// an address after a failed dial; these stay until the peer is forgotten.
    pub(super) fn known_addrs(&self, peer: &PeerId) -> Vec<Multiaddr> {
        let mut out: Vec<Multiaddr> = self
            .bootstrap
            .iter()
            .filter(|(p, _)| p == peer)
            .map(|(_, a)| strip_p2p(a))
            .collect();
        if let Some(e) = self.peers.get(peer) {
            out.extend(e.dial_addrs());
        }
        out.sort();
        out.dedup();
        out
    }

    /// Dials `peer` (at `addrs` and whatever addresses the behaviours know) unless connected
    /// or already being dialed, from a new local port, not the listening one: two peers that
    /// learn of each other at the same moment (each other's heartbeat dial hints) dial each
    /// other at once, and two TCP dials from both listening ports can meet as one
    /// simultaneous-open connection on which both ends start the Noise handshake as
    /// initiator ("input error"). Bootstrap dials keep the listening port: behind a NAT, the
    /// address the bootstrap peer observes for them is the one hole punching needs.
    pub(super) fn dial_from_new_port(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        let opts = DialOpts::peer_id(peer)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .addresses(addrs)
            .extend_addresses_through_behaviour()
            .allocate_new_port()
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            debug!(%peer, error = %e, "dial not started");
        }
    }
}
