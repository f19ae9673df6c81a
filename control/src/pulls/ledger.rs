//! What the learner has *observed* of each worker's pulls, and the per-worker credit derived
//! from it: how many groups a worker may be asked for in the next pull.
//!
//! A worker's heartbeat claims how many groups it holds (`pending`). Followed blindly, a peer
//! claiming `u64::MAX` would get nearly every pull (the split is proportional to holdings), and
//! the honest workers' groups would age out of the staleness window on their disks. So the
//! claim is only an upper bound: the credit is `min(claimed, observed)`, where `observed` is an
//! estimate the learner keeps from what the worker actually delivered:
//!
//! - a new worker starts at one group ([`LedgerParams::initial`]): a fresh identity costs an
//!   attacker nothing, so what it has not shown it delivers is not credited (probation,
//!   `crate::admission`); an honest worker doubles its way up with full pulls;
//! - a pull that comes back full (delivered = asked) moves the estimate towards *twice* what
//!   was asked (the worker may hold more: multiplicative growth, as a transport's slow start),
//!   a partial one towards what was delivered, an empty one towards 0 — an exponentially
//!   weighted moving average ([`LedgerParams::alpha`]);
//! - a failed pull (timeout, protocol violation, refused) halves the estimate and puts the
//!   worker in a backoff that doubles with each consecutive failure (capped), during which it
//!   gets no credit at all;
//! - the estimate never falls below [`LedgerParams::floor`] groups, so a worker that was empty
//!   for a while is still probed and can grow back by delivering;
//! - sequence numbers a worker skipped for good (`crate::admission::SeqGaps`: it withheld
//!   groups it had made) come off its estimate one for one ([`PullLedger::record_skipped`]);
//! - a worker with a pull in flight gets no credit (one pull per worker at a time), and no
//!   pull asks for more than [`LedgerParams::max_groups_per_pull`];
//! - when each worker's last pull began is kept ([`PullLedger::due`]): a worker not asked for
//!   a while is probed first (`crate::pulls::allocate_probing`), whatever its credit.
//!
//! An inflated claim therefore buys nothing beyond the worker's delivered rate, an honest
//! worker keeps the share it demonstrates, and a failing worker backs off. Only *valid* groups
//! count as delivered (the caller passes stored + duplicates, not the refused ones), so junk
//! does not grow a worker's credit either.
//!
//! Pure: the caller passes the current time in (`Instant`) and carries decisions out.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Tuning of a [`PullLedger`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LedgerParams {
    /// Most groups one pull may ask of one worker.
    pub max_groups_per_pull: u64,
    /// Estimate of a worker never pulled from (groups per pull).
    pub initial: f64,
    /// Weight of the newest observation in the moving average, in (0, 1].
    pub alpha: f64,
    /// Lowest estimate: a worker is always probed with at least this many groups (outside a
    /// backoff).
    pub floor: f64,
    /// Backoff after the first failure in a row; doubled with each further one.
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
}

impl Default for LedgerParams {
    fn default() -> Self {
        LedgerParams {
            max_groups_per_pull: 64,
            // A new identity is credited one group: probation (`crate::admission`).
            initial: 1.0,
            alpha: 0.5,
            floor: 1.0,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// The learner's record of one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerRecord {
    /// Groups per pull the worker is believed able to deliver.
    pub estimate: f64,
    /// Groups asked by the pull in flight, if any.
    pub in_flight: Option<u64>,
    pub consecutive_failures: u32,
    /// No credit before this instant (after a failure).
    pub retry_at: Option<Instant>,
    /// Valid groups delivered so far.
    pub delivered: u64,
    /// When its last pull began (`None`: never asked).
    pub last_started: Option<Instant>,
}

/// Per-worker pull records, keyed by peer (generic so this crate stays free of the network).
#[derive(Debug, Clone)]
pub struct PullLedger<K> {
    params: LedgerParams,
    peers: HashMap<K, PeerRecord>,
}

impl<K: Hash + Eq + Clone> PullLedger<K> {
    pub fn new(params: LedgerParams) -> Self {
        PullLedger {
            params,
            peers: HashMap::new(),
        }
    }

    pub fn params(&self) -> &LedgerParams {
        &self.params
    }

    fn fresh(&self) -> PeerRecord {
        PeerRecord {
            estimate: self.params.initial.max(self.params.floor),
            in_flight: None,
            consecutive_failures: 0,
            retry_at: None,
            delivered: 0,
            last_started: None,
        }
    }

    fn entry(&mut self, peer: K) -> &mut PeerRecord {
        let fresh = self.fresh();
        self.peers.entry(peer).or_insert(fresh)
    }

    /// The record of `peer` (`None` before anything was recorded).
    pub fn record(&self, peer: &K) -> Option<&PeerRecord> {
        self.peers.get(peer)
    }

    /// How many groups the next pull may ask of `peer`, which claims to hold `claimed`:
    /// `min(claimed, ⌈estimate⌉, max_groups_per_pull)`, or 0 while a pull to it is in flight
    /// or it is backing off after a failure.
    pub fn credit(&self, peer: &K, claimed: u64, now: Instant) -> u64 {
        let fresh = self.fresh();
        let r = self.peers.get(peer).unwrap_or(&fresh);
        if r.in_flight.is_some() || r.retry_at.is_some_and(|t| now < t) {
            return 0;
        }
        // `estimate` is finite and ≥ floor ≥ 0 (every update keeps it so); the cast saturates.
        let observed = r.estimate.ceil() as u64;
        claimed.min(observed).min(self.params.max_groups_per_pull)
    }

    /// A pull asking `asked` groups of `peer` was started at `now`.
    pub fn started(&mut self, peer: K, asked: u64, now: Instant) {
        let r = self.entry(peer);
        r.in_flight = Some(asked);
        r.last_started = Some(now);
    }

    /// The pulls in flight: each worker with one, the groups it asked for, and when it began.
    pub fn in_flight(&self) -> impl Iterator<Item = (&K, u64, Instant)> + '_ {
        self.peers
            .iter()
            .filter_map(|(k, r)| Some((k, r.in_flight?, r.last_started?)))
    }

    /// Whether `peer` is due a probe at `now`: never asked, or its last pull began `after` or
    /// longer ago.
    pub fn due(&self, peer: &K, now: Instant, after: Duration) -> bool {
        self.peers
            .get(peer)
            .and_then(|r| r.last_started)
            .is_none_or(|t| now.saturating_duration_since(t) >= after)
    }

    /// A pull asking `asked` groups of `peer` returned `delivered` valid groups (0: empty).
    pub fn record_delivery(&mut self, peer: K, asked: u64, delivered: u64) {
        let p = self.params;
        let r = self.entry(peer);
        r.in_flight = None;
        r.consecutive_failures = 0;
        r.retry_at = None;
        r.delivered = r.delivered.saturating_add(delivered);
        // A full pull says "at least this many": aim above it so the credit can grow. More
        // than asked cannot be delivered (the pull refuses it), but clamp anyway.
        let delivered = delivered.min(asked) as f64;
        let target = if asked > 0 && delivered >= asked as f64 {
            2.0 * delivered
        } else {
            delivered
        };
        r.estimate = blend(r.estimate, target, p);
    }

    /// A pull to `peer` failed (timed out, broke the protocol, was refused or could not open).
    pub fn record_failure(&mut self, peer: K, now: Instant) {
        let p = self.params;
        let r = self.entry(peer);
        r.in_flight = None;
        r.consecutive_failures = r.consecutive_failures.saturating_add(1);
        r.estimate = (r.estimate / 2.0).max(p.floor);
        let doublings = (r.consecutive_failures - 1).min(16);
        let wait = p.backoff.saturating_mul(1 << doublings).min(p.max_backoff);
        r.retry_at = Some(now + wait);
    }

    /// `peer` skipped `n` of its group numbers for good (withheld groups it made): each
    /// counts as a group it did not deliver, taken off its estimate (never below the floor).
    pub fn record_skipped(&mut self, peer: K, n: u64) {
        let p = self.params;
        let r = self.entry(peer);
        r.estimate = (r.estimate - n as f64).max(p.floor.max(0.0));
    }

    /// Keeps only the records of peers `keep` says are still workers (the others left or were
    /// banned): the ledger is as large as the current set of workers.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.peers.retain(|k, _| keep(k));
    }

    /// Drops `peer`'s record (it left, or was banned).
    pub fn forget(&mut self, peer: &K) {
        self.peers.remove(peer);
    }
}

/// One moving-average step, kept within `[floor, max_groups_per_pull·2]` and finite.
fn blend(old: f64, target: f64, p: LedgerParams) -> f64 {
    let alpha = if p.alpha.is_finite() {
        p.alpha.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let cap = p.max_groups_per_pull.max(1).saturating_mul(2) as f64;
    let x = old + alpha * (target - old);
    if x.is_finite() {
        x.clamp(p.floor.max(0.0), cap.max(p.floor))
    } else {
        p.floor.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pulls::allocate_capped;

    fn ledger() -> PullLedger<&'static str> {
        PullLedger::new(LedgerParams::default())
    }

    /// One pull round as the puller runs it: credits from claims, a capped split of `need`,
    /// then each worker delivers `min(asked, holds)`.
    fn round(
        l: &mut PullLedger<&'static str>,
        workers: &[(&'static str, u64, u64)], // (peer, claimed, really holds)
        need: u64,
        r: usize,
        now: Instant,
    ) -> Vec<u64> {
        let credits: Vec<u64> = workers
            .iter()
            .map(|(p, claim, _)| l.credit(p, *claim, now))
            .collect();
        let shares = allocate_capped(need, &credits, r);
        for ((p, _, holds), &ask) in workers.iter().zip(&shares) {
            if ask > 0 {
                l.started(p, ask, Instant::now());
                l.record_delivery(p, ask, ask.min(*holds));
            }
        }
        shares
    }

    #[test]
    fn a_new_peer_starts_at_one_group_and_the_claim_bounds_the_credit() {
        let mut l = ledger();
        let now = Instant::now();
        assert_eq!(
            l.credit(&"new", u64::MAX, now),
            1,
            "credit 1, whatever it claims"
        );
        assert_eq!(l.credit(&"new", 0, now), 0);
        // Full pulls double their way up.
        let mut credits = vec![];
        for _ in 0..5 {
            let c = l.credit(&"new", 1000, now);
            credits.push(c);
            l.started("new", c, Instant::now());
            l.record_delivery("new", c, c);
        }
        assert_eq!(credits, [1, 2, 3, 5, 8]);
        assert_eq!(l.credit(&"new", 3, now), 3, "never more than claimed");
    }

    #[test]
    fn skipped_numbers_come_off_the_credit() {
        let mut l = ledger();
        let now = Instant::now();
        for _ in 0..6 {
            let c = l.credit(&"w", 1000, now);
            l.started("w", c, Instant::now());
            l.record_delivery("w", c, c);
        }
        let before = l.credit(&"w", 1000, now);
        l.record_skipped("w", 4);
        assert_eq!(l.credit(&"w", 1000, now), before - 4);
        l.record_skipped("w", u64::MAX);
        assert_eq!(l.credit(&"w", 1000, now), 1, "never below the floor");
    }

    #[test]
    fn an_inflated_claim_gets_no_more_than_its_observed_rate() {
        // The liar claims u64::MAX but really holds 2 groups per round; the honest worker
        // claims and holds 40. The liar's credit follows what it delivers, not its claim.
        let mut l = ledger();
        let now = Instant::now();
        let workers = [("liar", u64::MAX, 2), ("honest", 40, 40)];
        let mut liar_asked = 0;
        for r in 0..20 {
            let shares = round(&mut l, &workers, 48, r, now);
            if r >= 10 {
                liar_asked += shares[0];
            }
        }
        assert!(
            l.credit(&"liar", u64::MAX, now) <= 3,
            "{:?}",
            l.record(&"liar")
        );
        assert!(liar_asked <= 10 * 3, "liar asked {liar_asked} in 10 rounds");
        assert_eq!(l.credit(&"honest", 40, now), 40, "honest keeps its share");
    }

    #[test]
    fn honest_workers_keep_their_share_next_to_a_liar() {
        // Without the ledger (claims as weights) a u64::MAX claim takes ~all of a need of 30.
        let naive = super::super::allocate_pulls(30, &[u64::MAX, 20, 20], 0);
        assert!(naive[0] >= 29, "{naive:?}");
        // With it, once observed, the liar (holds 1) gets about its rate and the two honest
        // workers (hold 20 each) most of the need.
        let mut l = ledger();
        let now = Instant::now();
        let workers = [("liar", u64::MAX, 1), ("a", 20, 20), ("b", 20, 20)];
        let mut last = vec![];
        for r in 0..12 {
            last = round(&mut l, &workers, 30, r, now);
        }
        assert!(last[0] <= 2, "{last:?}");
        assert!(last[1] + last[2] >= 28, "{last:?}");
        assert_eq!(last.iter().sum::<u64>(), 30);
    }

    #[test]
    fn a_full_pull_grows_the_credit_up_to_the_per_pull_cap() {
        let mut l = ledger();
        let now = Instant::now();
        let mut credits = vec![];
        for _ in 0..12 {
            let c = l.credit(&"w", 1000, now);
            credits.push(c);
            l.started("w", c, Instant::now());
            l.record_delivery("w", c, c);
        }
        assert!(credits.windows(2).all(|w| w[1] >= w[0]), "{credits:?}");
        assert_eq!(*credits.last().unwrap(), 64, "{credits:?}");
    }

    #[test]
    fn empty_pulls_shrink_the_credit_to_the_floor_but_not_to_zero() {
        let mut l = ledger();
        let now = Instant::now();
        for _ in 0..20 {
            l.started("w", 8, Instant::now());
            l.record_delivery("w", 8, 0);
        }
        assert_eq!(l.credit(&"w", 100, now), 1, "still probed with one group");
    }

    #[test]
    fn a_failing_peer_backs_off_and_recovers_by_delivering() {
        // A worker credited a batch (8 groups) before it fails.
        let mut l = PullLedger::new(LedgerParams {
            initial: 8.0,
            ..LedgerParams::default()
        });
        let t0 = Instant::now();
        l.started("w", 8, Instant::now());
        l.record_failure("w", t0);
        assert_eq!(l.credit(&"w", 100, t0), 0, "backing off");
        assert_eq!(
            l.credit(&"w", 100, t0 + Duration::from_secs(1)),
            4,
            "halved"
        );
        // Consecutive failures: the backoff doubles (up to its cap), the estimate halves down
        // to the floor.
        let mut t = t0 + Duration::from_secs(1);
        for k in 1..10u32 {
            l.record_failure("w", t);
            let wait = Duration::from_secs(1 << k.min(6)).min(Duration::from_secs(60));
            assert_eq!(l.credit(&"w", 100, t + wait - Duration::from_millis(1)), 0);
            t += wait;
            assert!(l.credit(&"w", 100, t) >= 1);
        }
        assert_eq!(l.credit(&"w", 100, t), 1);
        // A delivery clears the backoff.
        l.record_delivery("w", 1, 1);
        assert!(l.record(&"w").unwrap().retry_at.is_none());
        assert_eq!(l.credit(&"w", 100, t), 2);
    }

    #[test]
    fn a_worker_is_due_a_probe_when_not_asked_for_a_while() {
        let mut l = ledger();
        let t0 = Instant::now();
        let after = Duration::from_secs(1);
        assert!(l.due(&"w", t0, after), "never asked");
        l.started("w", 2, t0);
        assert!(!l.due(&"w", t0 + Duration::from_millis(999), after));
        // An answer does not reset the clock: it runs from when the pull began.
        l.record_delivery("w", 2, 2);
        assert!(!l.due(&"w", t0 + Duration::from_millis(500), after));
        assert!(l.due(&"w", t0 + after, after));
        // A clock read before the pull began is no probe yet.
        assert!(!l.due(&"w", t0.checked_sub(after).unwrap_or(t0), after));
    }

    #[test]
    fn the_pulls_in_flight_are_listed_with_their_groups_and_start() {
        let mut l = ledger();
        let t0 = Instant::now();
        l.started("a", 3, t0);
        l.started("b", 2, t0 + Duration::from_millis(5));
        l.record_delivery("b", 2, 2);
        let now: Vec<_> = l.in_flight().map(|(k, g, t)| (*k, g, t)).collect();
        assert_eq!(now, [("a", 3, t0)]);
        l.record_failure("a", t0);
        assert_eq!(l.in_flight().count(), 0);
    }

    #[test]
    fn one_pull_in_flight_per_worker() {
        let mut l = ledger();
        let now = Instant::now();
        l.started("w", 8, Instant::now());
        assert_eq!(l.credit(&"w", 100, now), 0);
        l.record_delivery("w", 8, 8);
        assert!(l.credit(&"w", 100, now) > 1);
        l.forget(&"w");
        assert_eq!(l.credit(&"w", 100, now), 1, "forgotten: a new peer again");
    }

    #[test]
    fn hostile_params_and_counts_never_panic() {
        let mut l = PullLedger::new(LedgerParams {
            alpha: f64::NAN,
            initial: f64::INFINITY,
            max_groups_per_pull: u64::MAX,
            ..LedgerParams::default()
        });
        let now = Instant::now();
        l.record_delivery("w", u64::MAX, u64::MAX);
        l.record_delivery("w", 0, 5);
        let _ = l.credit(&"w", u64::MAX, now);
        for _ in 0..100 {
            l.record_failure("w", now);
        }
        assert_eq!(l.record(&"w").unwrap().consecutive_failures, 100);
    }
}
