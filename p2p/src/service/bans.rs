//! The service's side of strikes and bans: counting a strike, and carrying a ban out on the
//! swarm (disconnect, block list, gossipsub blacklist, Kademlia), keeping the shared
//! [`crate::client::BanView`], the counters and the metrics in step.
//!
//! Owns: [`Service::strike`] and [`Service::ban`]. Must not touch: the rules themselves (the
//! threshold and the bounded ban list are in `bans`, the per-peer tally in `peers`), or who
//! decides that a peer earned a strike and what it is called (roles, via `Client::strike`
//! with their own offence's [`crate::PeerReport`]; the gossip validation in
//! `service/gossip.rs`, with a [`NetOffence`]).

use std::time::Instant;

use libp2p::PeerId;
use tracing::warn;

use super::Service;
use crate::bans::reaches_ban;
use crate::client::Event;
use crate::report::{NetOffence, PeerReport, ReportLabel, Severity};

impl Service {
    /// Counts one strike against `peer` (a failed event in its ECHO score) under the report's
    /// label and bans it once its strikes reach `network.ban_after_strikes`, or at once for a
    /// [`Severity::Fatal`] report. Strikes against this node itself are ignored; the swarm's
    /// configured learner is scored but never banned (it is the trust root: a worker that
    /// banned it would leave the swarm).
    pub(super) fn strike(&mut self, peer: PeerId, report: PeerReport) {
        let reason = report.label;
        if report.severity == Severity::Fatal {
            return self.strike_and_ban(peer, reason);
        }
        if peer == *self.swarm.local_peer_id() {
            return;
        }
        let total = self.peer(peer).record_strike(reason, Instant::now());
        self.count_strike(peer, reason, total);
        self.ban_if_due(peer, reason, total);
    }

    /// A gossip message from `peer` failed validation: counted as a rejected message and a
    /// [`NetOffence::BadMessage`] strike.
    pub(super) fn strike_bad_message(&mut self, peer: PeerId) {
        if peer == *self.swarm.local_peer_id() {
            return;
        }
        let total = self.peer(peer).record_rejection(Instant::now());
        let reason = NetOffence::BadMessage.label();
        self.count_strike(peer, reason, total);
        self.ban_if_due(peer, reason, total);
    }

    /// Evidence no honest node can produce ([`Severity::Fatal`]): one strike, and the peer is
    /// banned at once whatever its count (never this node or the learner).
    pub(super) fn strike_and_ban(&mut self, peer: PeerId, reason: ReportLabel) {
        if peer == *self.swarm.local_peer_id() {
            return;
        }
        let total = self.peer(peer).record_strike(reason, Instant::now());
        self.count_strike(peer, reason, total);
        if !self.bans.contains(&peer) && self.cfg.learner != Some(peer) {
            self.ban(peer, reason, total);
        }
    }

    fn count_strike(&mut self, peer: PeerId, reason: ReportLabel, total: u64) {
        warn!(%peer, %reason, total, "strike");
        self.counters.strikes += 1;
        metrics::counter!("p2p_strikes_total", "reason" => reason.as_str()).increment(1);
    }

    fn ban_if_due(&mut self, peer: PeerId, reason: ReportLabel, total: u64) {
        if self.bans.contains(&peer)
            || self.cfg.learner == Some(peer)
            || !reaches_ban(total, self.cfg.network.ban_after_strikes)
        {
            return;
        }
        self.ban(peer, reason, total);
    }

    /// Bans `peer` for the run: recorded (bounded list; the oldest ban forgotten past the cap
    /// is lifted), its connections closed and refused both ways, its gossip ignored, and
    /// removed from the DHT routing table.
    fn ban(&mut self, peer: PeerId, reason: ReportLabel, strikes: u64) {
        if let Some(old) = self.bans.ban(peer, reason) {
            self.lift(old);
        }
        self.peer(peer).ban = Some(reason);
        let b = self.swarm.behaviour_mut();
        b.banned.block_peer(peer);
        b.gossipsub.blacklist_peer(&peer);
        b.kad.remove_peer(&peer);
        let _ = self.swarm.disconnect_peer_id(peer);
        if let Ok(mut v) = self.ban_view.write() {
            v.insert(peer);
        }
        self.counters.bans += 1;
        metrics::counter!("p2p_bans_total").increment(1);
        metrics::gauge!("p2p_banned_peers").set(self.bans.len() as f64);
        warn!(%peer, %reason, strikes, "peer banned for the run");
        self.emit(Event::PeerBanned { peer, reason });
    }

    /// Forgets the ban of `peer` (pushed out of the bounded list): it may connect again and
    /// its entry becomes prunable like any other.
    fn lift(&mut self, peer: PeerId) {
        let b = self.swarm.behaviour_mut();
        b.banned.unblock_peer(peer);
        b.gossipsub.remove_blacklisted_peer(&peer);
        if let Some(e) = self.peers.get_mut(&peer) {
            e.ban = None;
        }
        if let Ok(mut v) = self.ban_view.write() {
            v.remove(&peer);
        }
        warn!(%peer, "oldest ban forgotten (ban list full)");
    }
}
