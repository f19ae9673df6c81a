//! The service's peer table: what the node knows of each peer, and the pure rules over it —
//! when a peer counts as active, when it is forgotten, how it is shown in the status view,
//! and which peers the learner's score table lists (a banned peer: never active, never
//! forgotten while banned, never listed).
//!
//! Owns: [`PeerEntry`] and those rules (no I/O, the clock is passed in). Must not touch: the
//! swarm or the channels (the event loop in [`crate::service`] calls in here), the ECHO-2
//! score formulas (in [`crate::score`]), the ban and rate-limit rules (in `bans`, `hbgate`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use libp2p::{Multiaddr, PeerId};

use crate::bans::Strikes;
use crate::client::PeerStatus;
use crate::hbgate::HeartbeatGate;
use crate::messages::{Heartbeat, ScoreEntry};
use crate::report::{NetOffence, ReportLabel};
use crate::role::Role;
use crate::score::PeerStats;
use crate::view::PeerView;

/// A peer is active while its last heartbeat is at most this many heartbeat intervals old:
/// one or two lost heartbeats do not take a peer out of the active set.
pub(crate) const ALIVE_HEARTBEAT_INTERVALS: u32 = 3;
/// A peer with no connection and no heartbeat for this long is gone for good and forgotten,
/// at the default heartbeat interval; the service scales it with the effective interval
/// (`membership::Intervals::forget_after`).
#[cfg(test)]
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(600);

/// How a valid heartbeat relates to the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The peer's first heartbeat: it joined.
    First,
    /// A heartbeat from a restarted process (a new `started_unix_ms`): it joined again.
    Restart,
    /// Another heartbeat of the same process.
    Regular,
}

/// What the node knows of one peer.
#[derive(Debug, Default)]
pub(crate) struct PeerEntry {
    /// Addresses it listens on (from identify) or that we dialed it at.
    pub(crate) addrs: BTreeSet<Multiaddr>,
    pub(crate) connected: bool,
    /// Its identify agent version.
    pub(crate) agent: Option<String>,
    /// Its last valid heartbeat and when it arrived.
    pub(crate) heartbeat: Option<(Heartbeat, Instant)>,
    pub(crate) heartbeats: u64,
    /// Messages from it that failed validation.
    pub(crate) rejected: u64,
    /// The inputs of its ECHO-2 score.
    pub(crate) stats: PeerStats,
    /// Strikes against it, per reason.
    pub(crate) strikes: Strikes,
    /// Banned for the run, with the strike that reached the threshold (set and lifted only
    /// by the service, together with its ban list).
    pub(crate) ban: Option<ReportLabel>,
    /// The per-source heartbeat rate limit.
    pub(crate) heartbeat_gate: HeartbeatGate,
}

impl PeerEntry {
    /// Where the peer may be dialed: the addresses of connections this node dialed and those
    /// identify reported, then its last heartbeat's dial hints (those that parse).
    pub(crate) fn dial_addrs(&self) -> impl Iterator<Item = Multiaddr> + '_ {
        let hints = self.heartbeat.iter().flat_map(|(hb, _)| &hb.addrs);
        self.addrs
            .iter()
            .cloned()
            .chain(hints.filter_map(|a| a.parse().ok()))
    }

    /// Records a valid heartbeat and says whether the peer just joined ([`Arrival`]). Not a
    /// score event: successes come from transfers only (see [`crate::score`]).
    pub(crate) fn record_heartbeat(&mut self, hb: Heartbeat, now: Instant) -> Arrival {
        let arrival = match &self.heartbeat {
            None => Arrival::First,
            Some((h, _)) if h.started_unix_ms != hb.started_unix_ms => Arrival::Restart,
            Some(_) => Arrival::Regular,
        };
        self.heartbeat = Some((hb, now));
        self.heartbeats += 1;
        arrival
    }

    /// Records a strike (one failed score event) and returns the peer's strike total.
    pub(crate) fn record_strike(&mut self, reason: ReportLabel, now: Instant) -> u64 {
        self.stats.record_failure(now);
        self.strikes.add(reason)
    }

    /// Records a message from this peer that failed validation: a
    /// [`NetOffence::BadMessage`] strike. Returns the peer's strike total.
    pub(crate) fn record_rejection(&mut self, now: Instant) -> u64 {
        self.rejected += 1;
        self.record_strike(NetOffence::BadMessage.label(), now)
    }

    /// Keep the entry while banned, connected, or heard from within `forget_after`.
    pub(crate) fn is_gone(&self, now: Instant, forget_after: Duration) -> bool {
        !(self.ban.is_some()
            || self.connected
            || self
                .heartbeat
                .as_ref()
                .is_some_and(|(_, t)| now.duration_since(*t) < forget_after))
    }

    /// When its last heartbeat arrived, and whether it must never be evicted from a full
    /// table (connected or banned): its row in `membership::evict`.
    pub(crate) fn eviction_key(&self) -> (Option<Instant>, bool) {
        (
            self.heartbeat.as_ref().map(|(_, t)| *t),
            self.connected || self.ban.is_some(),
        )
    }

    /// The peer's row in the learner's score table: every peer that heartbeats, except
    /// learners (the table ranks workers) and banned peers.
    pub(crate) fn score_entry(&self, peer: &PeerId, now: Instant) -> Option<ScoreEntry> {
        let (hb, _) = self.heartbeat.as_ref()?;
        if hb.role == Role::Learner || self.ban.is_some() {
            return None;
        }
        let c = self.stats.components(now);
        Some(ScoreEntry {
            peer_id: peer.to_string(),
            score: c.score,
            speed: c.speed,
            success: c.success,
            stability: c.stability,
            decay: c.decay,
            contribution: None,
        })
    }

    /// Active while not banned and the last heartbeat is at most
    /// [`ALIVE_HEARTBEAT_INTERVALS`] × `heartbeat_interval` old.
    fn is_active(&self, now: Instant, heartbeat_interval: Duration) -> bool {
        let alive = heartbeat_interval * ALIVE_HEARTBEAT_INTERVALS;
        self.ban.is_none()
            && self
                .heartbeat
                .as_ref()
                .is_some_and(|(_, t)| now.duration_since(*t) <= alive)
    }

    /// The peer's typed row ([`PeerView`]) for the roles.
    pub(crate) fn view(
        &self,
        peer: &PeerId,
        now: Instant,
        heartbeat_interval: Duration,
    ) -> PeerView {
        let hb = self.heartbeat.as_ref().map(|(h, _)| h);
        PeerView {
            peer: *peer,
            role: hb.map(|h| h.role),
            active: self.is_active(now, heartbeat_interval),
            connected: self.connected,
            banned: self.ban.is_some(),
            installed_version: hb.and_then(|h| h.installed_version),
            pending: hb.map(|h| h.pending),
            mu: hb.map(|h| h.mu),
            cost_per_hour: hb.map(|h| h.cost_per_hour),
            score: self.stats.components(now).score,
            reachability: hb.and_then(|h| h.reachability),
            device: hb.and_then(|h| h.device.clone()),
            admission: hb.and_then(|h| h.admission.clone()),
            installed_at: self.heartbeat.as_ref().and_then(|(h, arrived)| {
                h.installed_version?;
                let age = h
                    .install_age_ms
                    .unwrap_or(0)
                    .min(crate::messages::MAX_INSTALL_AGE_MS);
                arrived.checked_sub(Duration::from_millis(age))
            }),
        }
    }

    /// The peer's row in the status view (active as in [`PeerEntry::view`]).
    pub(crate) fn status(
        &self,
        peer: &PeerId,
        now: Instant,
        heartbeat_interval: Duration,
        gossip_score: Option<f64>,
    ) -> PeerStatus {
        let hb = self.heartbeat.as_ref().map(|(h, _)| h);
        let age = self.heartbeat.as_ref().map(|(_, t)| now.duration_since(*t));
        PeerStatus {
            peer_id: peer.to_string(),
            role: hb.map(|h| h.role),
            addrs: self.addrs.iter().map(|a| a.to_string()).collect(),
            dial_hints: hb.map(|h| h.addrs.clone()).unwrap_or_default(),
            installed_version: hb.and_then(|h| h.installed_version),
            score: self.stats.components(now),
            chain: None,
            position: None,
            mu: hb.map(|h| h.mu),
            cost_per_hour: hb.map(|h| h.cost_per_hour),
            pending: hb.map(|h| h.pending),
            active: self.is_active(now, heartbeat_interval),
            connected: self.connected,
            node_version: hb.map(|h| h.node_version.clone()),
            agent_version: self.agent.clone(),
            availability: hb.map(|h| h.availability),
            forward_rate_bps: hb.map(|h| h.forward_rate_bps),
            receive_rate_bps: hb.map(|h| h.receive_rate_bps),
            heartbeat_age_s: age.map(|a| a.as_secs_f64()),
            heartbeats: self.heartbeats,
            started_unix_ms: hb.map(|h| h.started_unix_ms),
            rejected_messages: self.rejected,
            gossip_score,
            device: hb.and_then(|h| h.device.clone()),
            banned: self.ban.is_some(),
            ban_reason: self.ban.map(|r| r.as_str().to_string()),
            strikes: self.strikes.total(),
            strikes_by_reason: self.strikes.by_reason(),
            reachability: hb.and_then(|h| h.reachability),
            connection: None,
            install_lag: None,
            admission: hb.and_then(|h| h.admission.clone()),
        }
    }
}

/// Status order: best ECHO score first, ties by peer id (a stable table between refreshes).
pub(crate) fn sort_for_status(peers: &mut [PeerStatus]) {
    peers.sort_by(|a, b| {
        b.score
            .score
            .total_cmp(&a.score.score)
            .then_with(|| a.peer_id.cmp(&b.peer_id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::HEARTBEAT_VERSION;

    fn hb(role: Role, started_unix_ms: u64) -> Heartbeat {
        Heartbeat {
            v: HEARTBEAT_VERSION,
            swarm_id: "s".into(),
            role,
            node_version: "0.1.0".into(),
            installed_version: Some(2),
            mu: 1.0,
            cost_per_hour: 0.5,
            availability: 1.0,
            pending: 3,
            forward_rate_bps: 0.0,
            receive_rate_bps: 0.0,
            started_unix_ms,
            sent_unix_ms: started_unix_ms,
            seq: 1,
            device: None,
            reachability: None,
            addrs: Vec::new(),
            receipts: Vec::new(),
            admission: None,
            install_age_ms: None,
        }
    }

    #[test]
    fn joins_are_first_heartbeats_and_restarts() {
        let t0 = Instant::now();
        let mut e = PeerEntry::default();
        assert_eq!(e.record_heartbeat(hb(Role::Rollout, 1), t0), Arrival::First);
        assert_eq!(
            e.record_heartbeat(hb(Role::Rollout, 1), t0),
            Arrival::Regular
        );
        assert_eq!(
            e.record_heartbeat(hb(Role::Rollout, 2), t0),
            Arrival::Restart
        );
        assert_eq!(e.heartbeats, 3);
    }

    #[test]
    fn heartbeats_are_not_successes() {
        // Spamming heartbeats must not erase failures from the ECHO score.
        let t0 = Instant::now();
        let mut e = PeerEntry::default();
        e.record_rejection(t0);
        let before = e.stats.components(t0);
        for _ in 0..100 {
            e.record_heartbeat(hb(Role::Rollout, 1), t0);
        }
        let after = e.stats.components(t0);
        assert_eq!(after, before);
        assert_eq!((after.successes, after.failures), (0, 1));
        assert_eq!(after.success, 0.0);
    }

    #[test]
    fn strikes_count_per_reason_and_a_ban_shows_in_the_status_row() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let iv = Duration::from_secs(1);
        let mut e = PeerEntry::default();
        e.record_heartbeat(hb(Role::Rollout, 1), t0);
        assert_eq!(e.record_strike(ReportLabel::new("corrupt_chunk"), t0), 1);
        assert_eq!(e.record_rejection(t0), 2);
        let s = e.status(&p, t0, iv, None);
        assert!(s.active && !s.banned && s.ban_reason.is_none());
        assert_eq!(
            (s.strikes, s.rejected_messages, s.score.failures),
            (2, 1, 2)
        );
        assert_eq!(s.strikes_by_reason["corrupt_chunk"], 1);
        assert_eq!(s.strikes_by_reason["bad_message"], 1);
        e.ban = Some(NetOffence::BadMessage.label());
        let s = e.status(&p, t0, iv, None);
        assert!(s.banned && !s.active);
        assert_eq!(s.ban_reason.as_deref(), Some("bad_message"));
        // Banned: kept for the run, never in the score table.
        assert_eq!(e.score_entry(&p, t0), None);
        assert!(!e.is_gone(t0 + FORGET_AFTER * 10, FORGET_AFTER));
        // The status JSON of an older node (no ban fields) still reads.
        let mut v = serde_json::to_value(&s).unwrap();
        for k in ["banned", "ban_reason", "strikes", "strikes_by_reason"] {
            v.as_object_mut().unwrap().remove(k);
        }
        let old: PeerStatus = serde_json::from_value(v).unwrap();
        assert!(!old.banned && old.strikes == 0);
    }

    #[test]
    fn active_within_three_intervals_and_forgotten_after_ten_minutes() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let iv = Duration::from_millis(200);
        let mut e = PeerEntry::default();
        assert!(!e.status(&p, t0, iv, None).active);
        assert!(e.is_gone(t0, FORGET_AFTER));
        e.record_heartbeat(hb(Role::Rollout, 1), t0);
        let s = e.status(&p, t0 + iv * 3, iv, Some(1.5));
        assert!(s.active);
        assert_eq!(
            (s.role, s.pending, s.gossip_score),
            (Some(Role::Rollout), Some(3), Some(1.5))
        );
        assert!(
            !e.status(&p, t0 + iv * 3 + Duration::from_millis(1), iv, None)
                .active
        );
        assert!(!e.is_gone(t0 + FORGET_AFTER - Duration::from_millis(1), FORGET_AFTER));
        assert!(e.is_gone(t0 + FORGET_AFTER, FORGET_AFTER));
        e.connected = true;
        assert!(!e.is_gone(t0 + FORGET_AFTER * 2, FORGET_AFTER));
    }

    #[test]
    fn the_score_table_lists_workers_only() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let mut e = PeerEntry::default();
        assert_eq!(e.score_entry(&p, t0), None);
        e.record_heartbeat(hb(Role::Learner, 1), t0);
        assert_eq!(e.score_entry(&p, t0), None);
        for role in [Role::Rollout, Role::Relay] {
            e.record_heartbeat(hb(role, 1), t0);
            assert_eq!(e.score_entry(&p, t0).unwrap().peer_id, p.to_string());
        }
        e.record_rejection(t0);
        assert_eq!((e.rejected, e.stats.components(t0).failures), (1, 1));
        assert_eq!(e.strikes.total(), 1);
    }

    #[test]
    fn status_rows_sort_by_score_then_peer_id() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(1);
        let mut good = PeerEntry::default();
        good.stats.record_transfer(
            &crate::score::TransferEvent {
                bytes: 1_000_000,
                duration: Duration::from_secs(1),
                success: true,
            },
            t0,
        );
        let fresh = PeerEntry::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut rows = vec![
            fresh.status(&a, t0, iv, None),
            fresh.status(&b, t0, iv, None),
            good.status(&c, t0, iv, None),
        ];
        sort_for_status(&mut rows);
        assert_eq!(rows[0].peer_id, c.to_string());
        assert!(rows[1].peer_id < rows[2].peer_id);
    }
}
