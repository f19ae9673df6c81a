//! The typed peer view roles decide on: [`PeerView`] rows from [`crate::Client::peers`] and
//! [`crate::Client::workers`], and the one rule for who is a worker ([`PeerView::is_worker`]).
//!
//! Owns: the view's type and the worker rule. The status view ([`crate::PeerStatus`]) is for
//! people (peer ids as strings, every counter); roles, the dissemination engine and the
//! learner's puller read this one instead, so no peer id is ever parsed back from text.
//! Must not touch: the peer table itself (the service builds the rows from it).

use libp2p::PeerId;

use crate::messages::DeviceReport;
use crate::reachability::Reachability;
use crate::role::Role;

/// One peer as this node sees it now: what its last heartbeat said and how this node stands
/// with it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerView {
    pub peer: PeerId,
    /// The role its heartbeats carry (None before the first).
    pub role: Option<Role>,
    /// Alive: not banned, and a heartbeat within the last 3 heartbeat intervals.
    pub active: bool,
    /// A connection to it is open now.
    pub connected: bool,
    /// Banned for the run.
    pub banned: bool,
    /// The snapshot version its last heartbeat reports installed.
    pub installed_version: Option<u64>,
    /// Trajectory groups it claims to hold (unchecked: a claim).
    pub pending: Option<u64>,
    /// Its measured throughput μ_i, groups/s.
    pub mu: Option<f64>,
    /// Its declared cost c_i, $/h.
    pub cost_per_hour: Option<f64>,
    /// Its ECHO-2 score (0–100).
    pub score: f64,
    /// How peers can reach it, as its heartbeats report.
    pub reachability: Option<Reachability>,
    /// The device and sampling dtype its heartbeats report (self-reported: the learner picks
    /// the spot-check tolerance of that dtype by it).
    pub device: Option<DeviceReport>,
    /// The admission credential its heartbeats carry (hex; unchecked: the learner's gate
    /// decides on it).
    pub admission: Option<String>,
    /// When it installed `installed_version`, on this node's clock: the arrival of the
    /// heartbeat that reported it less the install age it states (`Heartbeat::install_age_ms`,
    /// at most a minute). None before an install report.
    pub installed_at: Option<std::time::Instant>,
}

impl PeerView {
    /// The one rule for who is a rollout worker — whom the learner pulls from, schedules,
    /// plans chains over and counts for T_bcast: a peer whose heartbeats say `rollout`, that
    /// is connected to this node and not banned. Those of them that are also
    /// [`PeerView::active`] (heartbeating now) are the ones chains are planned over and whose
    /// install reports end a broadcast.
    pub fn is_worker(&self) -> bool {
        self.role == Some(Role::Rollout) && self.connected && !self.banned
    }

    /// A worker that reaches others only through a relay: it ends a chain and never forwards.
    pub fn relay_only(&self) -> bool {
        self.reachability.is_some_and(Reachability::relay_only)
    }
}

/// The installed versions of the active workers among `peers` and when they installed them:
/// the population whose install reports end a broadcast's T_bcast
/// (`control::capacity::broadcast_done`, `broadcast_completed_at`).
pub fn active_install_times(peers: &[PeerView]) -> Vec<(Option<u64>, Option<std::time::Instant>)> {
    peers
        .iter()
        .filter(|p| p.is_worker() && p.active)
        .map(|p| (p.installed_version, p.installed_at))
        .collect()
}

/// The installed versions of the active workers among `peers`: the population whose install
/// reports end a broadcast's T_bcast (`control::capacity::broadcast_done`).
pub fn active_installs(peers: &[PeerView]) -> Vec<Option<u64>> {
    peers
        .iter()
        .filter(|p| p.is_worker() && p.active)
        .map(|p| p.installed_version)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(role: Option<Role>, connected: bool, banned: bool, active: bool) -> PeerView {
        PeerView {
            peer: PeerId::random(),
            role,
            active,
            connected,
            banned,
            installed_version: Some(3),
            pending: None,
            mu: None,
            cost_per_hour: None,
            score: 0.0,
            reachability: None,
            device: None,
            admission: None,
            installed_at: None,
        }
    }

    #[test]
    fn a_worker_is_a_connected_unbanned_rollout_peer() {
        let r = Some(Role::Rollout);
        assert!(view(r, true, false, false).is_worker());
        assert!(!view(r, false, false, true).is_worker());
        assert!(!view(r, true, true, false).is_worker());
        assert!(!view(Some(Role::Learner), true, false, true).is_worker());
        assert!(!view(None, true, false, true).is_worker());
    }

    #[test]
    fn only_active_workers_count_for_installs() {
        let r = Some(Role::Rollout);
        let peers = [
            view(r, true, false, true),
            view(r, true, false, false),
            view(Some(Role::Learner), true, false, true),
            view(r, false, false, true),
        ];
        assert_eq!(active_installs(&peers), vec![Some(3)]);
    }
}
