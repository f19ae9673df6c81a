//! A worker's generation rate as the learner *verified* it: the valid groups it delivered per
//! second of the time it was meant to generate.
//!
//! A heartbeat's μ is the worker's word. The provisioning scheduler ranks workers by
//! ρ = cost/μ and stops activating workers once Σμ reaches its target μ* = γ·μ_min (ECHO-2
//! §3.4), so a worker claiming μ = 10⁶ would be activated first and could send every honest
//! worker to standby while it delivers a trickle. What the learner observes instead is the
//! valid groups each pull brings back (the verification pipeline stored them), and
//! [`DeliveryMeter::rate`] is their count over the last [`WINDOW_S`] seconds of the worker's
//! active time.
//!
//! That rate is a *lower bound* of what the worker can make: in a swarm that makes more than
//! the learner trains, a pull takes only the learner's shortfall, and a worker delivers its
//! share of the learner's consumption C, not its capacity. The scheduler therefore counts a
//! claim for at most a small multiple of it (`CLAIM_TOLERANCE` = 2 in the node), and the
//! bound still lets it find enough capacity: while the swarm keeps up, the active workers'
//! deliveries sum to C, so their counted μ sums to min(Σ claimed, 2·C) — above the target
//! γ·μ_min ≈ γ·C (γ = 1.1, for a κ large enough that T_bcast is small against κ·T_train)
//! whenever the claims are. A liar's rate is what it really delivered: counted at twice that,
//! it can no longer cover the target alone.
//!
//! - Time counts only while the worker is meant to generate: the caller marks it
//!   [`DeliveryMeter::active`] each round it is (heartbeating, not on standby) and
//!   [`DeliveryMeter::idle`] otherwise. Idle, its rate is frozen at what it was (a standby
//!   worker delivers nothing, and its last verified rate is what its claim is weighed against
//!   when the scheduler considers it again).
//! - A rate is reported once the active stretch is [`MIN_SPAN_S`] long (or frozen from an
//!   earlier one): a worker that just joined, or was just activated, is taken at its word
//!   until then.
//! - Only valid groups count (the caller passes what the pipeline stored, not duplicates or
//!   refused groups), so junk buys no rate.
//! - The rate is dropped when the worker is forgotten ([`DeliveryMeter::retain`]).
//!
//! Pure: the caller passes the current time in.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The measured window of active time, in seconds: long enough to hold several pulls of a slow
/// worker, short enough to follow a change of the active set (a released worker's share moves
/// to the others).
pub const WINDOW_S: f64 = 60.0;

/// An active stretch is measured once it is this long.
pub const MIN_SPAN_S: f64 = 10.0;

/// Deliveries kept per worker at most (a pull a second fills the window well within it).
const MAX_DELIVERIES: usize = 4096;

#[derive(Debug, Clone, Default)]
struct Record {
    /// Start of the current active stretch.
    active_from: Option<Instant>,
    /// Valid groups delivered in the current stretch, by time (within the window).
    deliveries: VecDeque<(Instant, u64)>,
    /// The rate when the worker last went idle.
    frozen: Option<f64>,
}

impl Record {
    fn live_rate(&self, now: Instant) -> Option<f64> {
        let from = self.active_from?;
        let span = now.saturating_duration_since(from).as_secs_f64();
        if span < MIN_SPAN_S {
            return None;
        }
        let window = span.min(WINDOW_S);
        let since = now.checked_sub(Duration::from_secs_f64(window));
        let groups: u64 = self
            .deliveries
            .iter()
            .filter(|(t, _)| since.is_none_or(|s| *t >= s))
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add);
        Some(groups as f64 / window)
    }
}

/// Verified generation rates per worker (see the module doc).
#[derive(Debug, Clone)]
pub struct DeliveryMeter<K> {
    peers: HashMap<K, Record>,
}

impl<K> Default for DeliveryMeter<K> {
    fn default() -> Self {
        DeliveryMeter {
            peers: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> DeliveryMeter<K> {
    /// `peer` is meant to generate at `now` (a stretch starts if none is open).
    pub fn active(&mut self, peer: K, now: Instant) {
        let r = self.peers.entry(peer).or_default();
        r.active_from.get_or_insert(now);
    }

    /// `peer` is not meant to generate at `now` (standby, or not heartbeating): its stretch
    /// ends, and its rate is frozen at what it was.
    pub fn idle(&mut self, peer: &K, now: Instant) {
        if let Some(r) = self.peers.get_mut(peer) {
            if let Some(rate) = r.live_rate(now) {
                r.frozen = Some(rate);
            }
            r.active_from = None;
            r.deliveries.clear();
        }
    }

    /// A pull from `peer` that ended at `now` brought `groups` valid new groups. Deliveries
    /// outside an active stretch are not counted.
    pub fn delivered(&mut self, peer: &K, now: Instant, groups: u64) {
        let Some(r) = self.peers.get_mut(peer) else {
            return;
        };
        if r.active_from.is_none() || groups == 0 {
            return;
        }
        r.deliveries.push_back((now, groups));
        let keep = now.checked_sub(Duration::from_secs_f64(WINDOW_S));
        while r.deliveries.len() > MAX_DELIVERIES
            || r.deliveries
                .front()
                .is_some_and(|(t, _)| keep.is_some_and(|k| *t < k))
        {
            r.deliveries.pop_front();
        }
    }

    /// `peer`'s verified generation rate in groups per second at `now`: over the current
    /// active stretch once it spans [`MIN_SPAN_S`], else as frozen when it last went idle.
    pub fn rate(&self, peer: &K, now: Instant) -> Option<f64> {
        let r = self.peers.get(peer)?;
        r.live_rate(now).or(r.frozen)
    }

    /// Every known rate at `now`.
    pub fn rates(&self, now: Instant) -> impl Iterator<Item = (&K, f64)> {
        self.peers
            .keys()
            .filter_map(move |k| self.rate(k, now).map(|r| (k, r)))
    }

    /// Keeps only the peers `keep` says are still workers.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.peers.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    #[test]
    fn the_rate_is_valid_groups_per_second_of_the_active_window() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        // Not active yet: deliveries are not counted, and there is no rate.
        m.delivered(&"w", t0, 5);
        assert_eq!(m.rate(&"w", t0), None);
        m.active("w", t0);
        m.delivered(&"w", at(t0, 2.0), 4);
        assert_eq!(
            m.rate(&"w", at(t0, 5.0)),
            None,
            "a stretch under MIN_SPAN_S"
        );
        m.delivered(&"w", at(t0, 8.0), 6);
        assert_eq!(m.rate(&"w", at(t0, 10.0)), Some(1.0));
        // Active again next round: the stretch goes on.
        m.active("w", at(t0, 10.0));
        assert_eq!(m.rate(&"w", at(t0, 20.0)), Some(0.5));
        // Past the window only its last WINDOW_S seconds count.
        m.delivered(&"w", at(t0, 65.0), 30);
        assert_eq!(m.rate(&"w", at(t0, 70.0)), Some(0.5), "30 groups in 60 s");
        assert_eq!(m.rate(&"x", t0), None);
    }

    #[test]
    fn idle_time_is_not_measured_and_the_rate_is_frozen_meanwhile() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        m.active("w", t0);
        m.delivered(&"w", at(t0, 5.0), 20);
        m.idle(&"w", at(t0, 10.0));
        assert_eq!(m.rate(&"w", at(t0, 10.0)), Some(2.0));
        // An hour on standby: no deliveries counted, the rate stays 2.
        m.delivered(&"w", at(t0, 100.0), 50);
        assert_eq!(m.rate(&"w", at(t0, 3600.0)), Some(2.0));
        // Activated again: the frozen rate stands until the new stretch is measured.
        m.active("w", at(t0, 3600.0));
        assert_eq!(m.rate(&"w", at(t0, 3605.0)), Some(2.0));
        m.delivered(&"w", at(t0, 3606.0), 5);
        assert_eq!(m.rate(&"w", at(t0, 3610.0)), Some(0.5));
        // An idle worker that never completed a stretch has no rate.
        m.active("v", t0);
        m.idle(&"v", at(t0, 3.0));
        assert_eq!(m.rate(&"v", at(t0, 60.0)), None);
    }

    #[test]
    fn a_liar_is_measured_by_what_it_delivers_whatever_it_claims() {
        // Two workers share a learner consuming 4 groups/s; the meter never sees a claim.
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        for w in ["honest", "liar"] {
            m.active(w, t0);
        }
        for s in 1..=30 {
            m.delivered(&"honest", at(t0, f64::from(s)), 3);
            m.delivered(&"liar", at(t0, f64::from(s)), 1);
        }
        assert_eq!(m.rate(&"honest", at(t0, 30.0)), Some(3.0));
        assert_eq!(m.rate(&"liar", at(t0, 30.0)), Some(1.0));
        let all: HashMap<&str, f64> = m.rates(at(t0, 30.0)).map(|(k, r)| (*k, r)).collect();
        assert_eq!(all.len(), 2);
        m.retain(|k| *k == "honest");
        assert_eq!(m.rate(&"liar", at(t0, 30.0)), None, "forgotten");
    }
}
