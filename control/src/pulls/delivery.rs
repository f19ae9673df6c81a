//! A worker's generation rate as the learner *verified* it: the valid groups it delivered per
//! second of the time the learner was asking it for groups.
//!
//! A heartbeat's μ is the worker's word. The provisioning scheduler ranks workers by
//! ρ = cost/μ and stops activating workers once Σμ reaches its target μ* = γ·μ_min (ECHO-2
//! §3.4), so a worker claiming μ = 10⁶ would be activated first and could send every honest
//! worker to standby while it delivers a trickle. What the learner observes instead is the
//! valid groups each pull brings back (the verification pipeline stored them), and
//! [`DeliveryMeter::rate`] is their count per second of *asked* time: time during which the
//! worker was meant to generate (heartbeating, not on standby) and the learner wanted groups
//! (a shortfall in its buffer, or pulls in flight). Time the learner spends not pulling — its
//! supervised warm start, a full buffer — proves nothing about a worker and is not counted.
//!
//! Both sums decay with a time constant of [`TAU_S`] seconds of asked time (an exponentially
//! weighted rate, so it follows a change of the active set: a released worker's share moves
//! to the others), and a rate is reported once the decayed asked time reaches [`MIN_SPAN_S`].
//! While a worker is not asked, nothing decays: a standby worker's rate stays what it was —
//! the figure its claim is weighed against when the scheduler considers it again.
//!
//! The rate is a *lower bound* of what a worker can make: in a swarm that makes more than the
//! learner trains, a worker delivers its share of the learner's consumption C, not its
//! capacity. The scheduler therefore counts a claim for at most a small multiple of it
//! (`CLAIM_TOLERANCE` = 2 in the node), and the bound still lets it find enough capacity:
//! while the swarm keeps up, the active workers' deliveries sum to C, so their counted μ sums
//! to min(Σ claimed, 2·C) — above the target γ·μ_min ≈ γ·C (γ = 1.1) whenever the claims are.
//! A liar's rate is what it really delivered: counted at twice that, it cannot cover the target
//! alone, and once the honest workers it displaced are on standby the learner is short and
//! asks all the time, which measures it exactly.
//!
//! Only valid groups count (the caller passes what the pipeline stored, not duplicates or
//! refused groups), so junk buys no rate; the rate is dropped when the worker is forgotten
//! ([`DeliveryMeter::retain`]).
//!
//! Pure: the caller passes the current time in.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// Time constant of the decay, in seconds of asked time.
pub const TAU_S: f64 = 60.0;

/// A rate is reported once the decayed asked time is this long.
pub const MIN_SPAN_S: f64 = 10.0;

#[derive(Debug, Clone, Default)]
struct Record {
    /// The last observation, and whether the time since counts.
    last: Option<(Instant, bool)>,
    /// Decayed valid groups delivered.
    groups: f64,
    /// Decayed asked seconds.
    secs: f64,
}

impl Record {
    fn rate(&self) -> Option<f64> {
        (self.secs >= MIN_SPAN_S).then(|| self.groups / self.secs)
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
    /// Observes `peer` at `now`: the time since its last observation counts if that one said
    /// so; the time from now counts if `asked` (meant to generate, and the learner wants
    /// groups).
    pub fn observe(&mut self, peer: K, now: Instant, asked: bool) {
        let r = self.peers.entry(peer).or_default();
        if let Some((then, true)) = r.last {
            let dt = now.saturating_duration_since(then).as_secs_f64();
            let keep = (-dt / TAU_S).exp();
            r.groups *= keep;
            // ∫ e^(−(dt−s)/τ) ds over the interval: each asked second decays like a group.
            r.secs = r.secs * keep + TAU_S * (1.0 - keep);
        }
        r.last = Some((now, asked));
    }

    /// A pull from `peer` brought `groups` valid new groups.
    pub fn delivered(&mut self, peer: &K, groups: u64) {
        if let Some(r) = self.peers.get_mut(peer) {
            r.groups += groups as f64;
        }
    }

    /// `peer`'s verified generation rate in groups per second, once [`MIN_SPAN_S`] of asked
    /// time is behind it.
    pub fn rate(&self, peer: &K) -> Option<f64> {
        self.peers.get(peer)?.rate()
    }

    /// Every known rate.
    pub fn rates(&self) -> impl Iterator<Item = (&K, f64)> {
        self.peers
            .iter()
            .filter_map(|(k, r)| r.rate().map(|x| (k, x)))
    }

    /// Keeps only the peers `keep` says are still workers.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.peers.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    /// One observation a second from `from` to `to` (exclusive), delivering `per_s` each.
    fn run(
        m: &mut DeliveryMeter<&'static str>,
        w: &'static str,
        t0: Instant,
        span: (u32, u32),
        per_s: u64,
        asked: bool,
    ) {
        for s in span.0..span.1 {
            m.observe(w, at(t0, f64::from(s)), asked);
            m.delivered(&w, per_s);
        }
        m.observe(w, at(t0, f64::from(span.1)), asked);
    }

    #[test]
    fn the_rate_is_valid_groups_per_asked_second() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        run(&mut m, "w", t0, (0, 5), 2, true);
        assert_eq!(m.rate(&"w"), None, "5 s asked is too short");
        run(&mut m, "w", t0, (5, 30), 2, true);
        let r = m.rate(&"w").unwrap();
        assert!((r - 2.0).abs() < 0.05, "{r}");
        assert_eq!(m.rate(&"x"), None);
    }

    #[test]
    fn time_not_asked_is_not_counted_and_the_rate_is_kept_meanwhile() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        // The learner's warm start: a minute in which nothing is asked, nothing delivered.
        run(&mut m, "w", t0, (0, 60), 0, false);
        assert_eq!(m.rate(&"w"), None, "no evidence either way");
        run(&mut m, "w", t0, (60, 90), 1, true);
        let r = m.rate(&"w").unwrap();
        assert!((r - 1.0).abs() < 0.05, "{r}");
        // An hour on standby: the rate stays.
        run(&mut m, "w", t0, (90, 3690), 0, false);
        assert_eq!(m.rate(&"w"), Some(r));
    }

    #[test]
    fn the_rate_follows_a_change_within_a_few_time_constants() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        run(&mut m, "w", t0, (0, 120), 4, true);
        run(&mut m, "w", t0, (120, 420), 1, true);
        let r = m.rate(&"w").unwrap();
        assert!((r - 1.0).abs() < 0.05, "5 τ after the change: {r}");
    }

    #[test]
    fn a_liar_is_measured_by_what_it_delivers_whatever_it_claims() {
        let t0 = Instant::now();
        let mut m = DeliveryMeter::default();
        run(&mut m, "honest", t0, (0, 30), 3, true);
        run(&mut m, "liar", t0, (0, 30), 0, true);
        assert!((m.rate(&"honest").unwrap() - 3.0).abs() < 0.1);
        assert_eq!(m.rate(&"liar"), Some(0.0));
        assert_eq!(m.rates().count(), 2);
        m.retain(|k| *k == "honest");
        assert_eq!(m.rate(&"liar"), None, "forgotten");
    }
}
