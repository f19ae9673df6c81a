//! Capacity provisioning (ECHO-2 §3.3–3.4, App. B, App. C.2.1; `docs/learner.md`).
//!
//! **Overlap condition.** The learner never idles if, within the κ steps between two
//! publications, the next snapshot is disseminated *and* the pool produces the κ·R
//! trajectories those steps consume: `κ·T_train ≥ T_bcast + κR / Σμ_i` (eq. 1), i.e.
//! `Σμ_i ≥ μ_min(κ) = κR / (κ·T_train − T_bcast)` (eq. 2), defined only when
//! `κ·T_train > T_bcast` — otherwise no pool keeps the learner busy and we say so.
//!
//! **Target.** `μ_target = γ·μ_min` with `γ > 1` (1.1 in the paper) to absorb noise and a
//! single fault without reconfiguring.
//!
//! **Selection.** Minimising Σc_i subject to Σμ_i ≥ μ_target is a knapsack; online, the paper's
//! greedy ranks workers by unit throughput cost `ρ_i = c_i/μ_i` and activates the cheapest
//! prefix that reaches the target (eq. 3 and below).
//!
//! **Closed loop with hysteresis.** μ estimates fluctuate, so [`Scheduler`] only acts after the
//! pool has stayed below the target (activate) or above `target·(1 + margin)` (release the most
//! expensive) for a sustained interval; inside that band nothing changes, so noise cannot make
//! it flap. An active worker that becomes *unavailable* (heartbeats stopped) is a fault, not
//! noise: it is dropped and replaced at once (App. D).

use std::collections::BTreeSet;

/// γ: the capacity margin of `μ_target = γ·μ_min` (1.1 in ECHO-2). The same γ defines when a
/// broadcast is over: T_bcast ends once a fraction `q = 1/γ` of the active workers installed
/// the snapshot ([`broadcast_done`]) — the slack γ leaves in capacity is the share of workers
/// that may still be installing.
pub const GAMMA: f64 = 1.1;

/// T_bcast of a snapshot `version` is over once `⌈n/γ⌉` of the `n` active workers report (in
/// their heartbeats' install reports) a version at least as new. With no worker it is not
/// defined (false).
pub fn broadcast_done(installed: &[Option<u64>], version: u64) -> bool {
    let n = installed.len();
    if n == 0 {
        return false;
    }
    let need = ((n as f64) / GAMMA).ceil() as usize;
    installed
        .iter()
        .filter(|v| v.is_some_and(|v| v >= version))
        .count()
        >= need.max(1)
}

/// One T_bcast measurement of a published version, in seconds: exact (⌈n/γ⌉ of the active
/// workers installed it, or a newer one), or a *lower bound* — the version had not completed
/// when it was given up (superseded long enough that the learner stopped waiting) or when the
/// estimate was read (still in flight): its T_bcast is at least `secs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BcastSample {
    pub secs: f64,
    pub lower_bound: bool,
}

/// An estimate of T_bcast ([`t_bcast_estimate`]): `lower_bound` means the true median is at
/// least `secs`, and every figure derived from it (μ_min, μ_target, the Δ_max bounds) is a
/// bound in the same direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BcastEstimate {
    pub secs: f64,
    pub lower_bound: bool,
}

/// The median of recent T_bcast samples, counting a lower bound at its value (the upper
/// median for an even count). Why not the median of the completed ones only: versions that
/// never complete are exactly the slow ones, and leaving them out shows the last good median
/// however long the swarm has been starving (0.15 s on screen while a worker was 232 versions
/// behind). A lower bound is never above its true value, so the median of the samples is
/// never above the true median; it is exact only when no lower bound sorts at or below it
/// (otherwise that sample's true value may lie above it and move the median up), and is then
/// flagged a lower bound. `None` without samples.
pub fn t_bcast_estimate(samples: &[BcastSample]) -> Option<BcastEstimate> {
    let mut v: Vec<BcastSample> = samples
        .iter()
        .copied()
        .filter(|s| s.secs.is_finite() && s.secs >= 0.0)
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let i = v.len() / 2;
    Some(BcastEstimate {
        secs: v[i].secs,
        lower_bound: v[..=i].iter().any(|s| s.lower_bound),
    })
}

/// When the broadcast of `version` ended ([`broadcast_done`]'s rule): the install time of the
/// `⌈n/γ⌉`-th worker to hold it, from `(installed version, when installed)` per active worker.
/// None while not done, or when a needed install time is unknown (an older node): the caller
/// then takes the time it noticed. A worker holding a newer version counts with that
/// version's install time — later than its install of `version`, so the figure stays an upper
/// bound. Generic over the clock (`Instant` in the node, numbers in tests).
pub fn broadcast_completed_at<T: Ord + Copy>(
    installed: &[(Option<u64>, Option<T>)],
    version: u64,
) -> Option<T> {
    let versions: Vec<Option<u64>> = installed.iter().map(|(v, _)| *v).collect();
    if !broadcast_done(&versions, version) {
        return None;
    }
    let need = ((installed.len() as f64) / GAMMA).ceil().max(1.0) as usize;
    let mut times = Vec::with_capacity(installed.len());
    for (v, t) in installed {
        if v.is_some_and(|v| v >= version) {
            times.push((*t)?);
        }
    }
    times.sort_unstable();
    times.get(need - 1).copied()
}

/// Result of the capacity requirement (eq. 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Requirement {
    /// `μ_min` in trajectories per second.
    Feasible { mu_min: f64 },
    /// `κ·T_train ≤ T_bcast`: dissemination alone outlasts κ training steps, so the learner
    /// idles whatever the pool. Raise κ (i.e. S) or lower T_bcast.
    Infeasible { kappa_t_train: f64, t_bcast: f64 },
}

/// `μ_min(κ) = κR / (κ·T_train − T_bcast)` (ECHO-2 eq. 2). `r` = trajectories per step.
pub fn mu_min(kappa: u32, r: f64, t_train: f64, t_bcast: f64) -> Requirement {
    let kt = f64::from(kappa) * t_train;
    // Written so that NaN inputs land in the infeasible branch.
    let feasible = kappa > 0 && kt > t_bcast && r > 0.0;
    if !feasible {
        return Requirement::Infeasible {
            kappa_t_train: kt,
            t_bcast,
        };
    }
    Requirement::Feasible {
        mu_min: f64::from(kappa) * r / (kt - t_bcast),
    }
}

/// Conservative staleness bound, eq. 7: `κ + ⌈(T_bcast + R/μ_pool) / T_train⌉ − 1`.
/// `None` when the pool produces nothing (unbounded).
pub fn delta_max_conservative(
    kappa: u32,
    t_bcast: f64,
    r: f64,
    mu_pool: f64,
    t_train: f64,
) -> Option<u64> {
    let defined = mu_pool > 0.0 && t_train > 0.0; // false for NaN too
    if !defined {
        return None;
    }
    let n = ((t_bcast + r / mu_pool) / t_train).ceil().max(0.0) as u64;
    Some((u64::from(kappa) + n).saturating_sub(1))
}

/// The bound once the overlap condition holds, eq. 12: `κ + ⌈(1 − 1/κ)·T_bcast / T_train⌉`.
pub fn delta_max_under_overlap(kappa: u32, t_bcast: f64, t_train: f64) -> Option<u64> {
    let defined = kappa > 0 && t_train > 0.0;
    if !defined {
        return None;
    }
    let k = f64::from(kappa);
    Some(kappa as u64 + ((1.0 - 1.0 / k) * t_bcast / t_train).ceil().max(0.0) as u64)
}

/// What the scheduler knows about one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo<P> {
    pub id: P,
    /// Declared cost c_i ($/h).
    pub cost_per_hour: f64,
    /// Measured throughput μ_i (trajectories/s) over the heartbeat window.
    pub mu: f64,
    /// Availability bit a_i (heartbeats arriving).
    pub available: bool,
}

impl<P> WorkerInfo<P> {
    /// `ρ_i = c_i / μ_i`; a worker with no measured throughput is infinitely expensive.
    pub fn rho(&self) -> f64 {
        if self.mu > 0.0 {
            self.cost_per_hour / self.mu
        } else {
            f64::INFINITY
        }
    }
}

/// Order by ρ ascending; ties: higher μ first (fewer workers), then id (deterministic).
fn by_rho<P: Ord>(a: &WorkerInfo<P>, b: &WorkerInfo<P>) -> std::cmp::Ordering {
    a.rho()
        .partial_cmp(&b.rho())
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(b.mu.partial_cmp(&a.mu).unwrap_or(std::cmp::Ordering::Equal))
        .then(a.id.cmp(&b.id))
}

/// A chosen active set.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection<P> {
    pub active: Vec<P>,
    pub mu: f64,
    pub cost_per_hour: f64,
    /// `Some(missing μ)` when even every available worker does not reach the target.
    pub shortfall: Option<f64>,
}

/// The cheapest-ρ prefix of the available workers whose Σμ reaches `target` (ECHO-2 §3.4).
pub fn select_cheapest<P: Clone + Ord>(workers: &[WorkerInfo<P>], target: f64) -> Selection<P> {
    let mut pool: Vec<&WorkerInfo<P>> = workers
        .iter()
        .filter(|w| w.available && w.mu > 0.0)
        .collect();
    pool.sort_by(|a, b| by_rho(a, b));
    let mut sel = Selection {
        active: Vec::new(),
        mu: 0.0,
        cost_per_hour: 0.0,
        shortfall: None,
    };
    for w in pool {
        if sel.mu >= target {
            break;
        }
        sel.active.push(w.id.clone());
        sel.mu += w.mu;
        sel.cost_per_hour += w.cost_per_hour;
    }
    if sel.mu < target {
        sel.shortfall = Some(target - sel.mu);
    }
    sel
}

/// Scheduler settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Release only when μ_pool exceeds `target·(1 + release_margin)`.
    pub release_margin: f64,
    /// Seconds a deviation must persist before the scheduler acts.
    pub sustain_s: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            release_margin: 0.25,
            sustain_s: 30.0,
        }
    }
}

/// A decision of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<P> {
    Activate(P),
    Release(P),
}

/// Closed-loop provisioning with hysteresis (see the module docs).
#[derive(Debug, Clone)]
pub struct Scheduler<P> {
    cfg: SchedulerConfig,
    active: BTreeSet<P>,
    below_since: Option<f64>,
    above_since: Option<f64>,
}

impl<P: Clone + Ord> Scheduler<P> {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler {
            cfg,
            active: BTreeSet::new(),
            below_since: None,
            above_since: None,
        }
    }

    pub fn active(&self) -> &BTreeSet<P> {
        &self.active
    }

    /// Adopts an existing active set (e.g. the workers already generating when the target
    /// first becomes known), so that the next ticks start from the real state.
    pub fn set_active(&mut self, active: impl IntoIterator<Item = P>) {
        self.active = active.into_iter().collect();
        self.below_since = None;
        self.above_since = None;
    }

    /// `μ_pool = Σ_{i ∈ A} a_i μ_i` (eq. 4).
    pub fn mu_pool(&self, workers: &[WorkerInfo<P>]) -> f64 {
        workers
            .iter()
            .filter(|w| w.available && self.active.contains(&w.id))
            .map(|w| w.mu)
            .sum()
    }

    /// One control tick at time `now_s`; returns the activations and releases to carry out
    /// (already applied to the scheduler's active set).
    pub fn tick(&mut self, now_s: f64, workers: &[WorkerInfo<P>], target: f64) -> Vec<Action<P>> {
        let mut actions = Vec::new();
        // Faults first: an active worker that stopped heartbeating is dropped at once.
        let mut fault = false;
        for w in workers {
            if !w.available && self.active.remove(&w.id) {
                actions.push(Action::Release(w.id.clone()));
                fault = true;
            }
        }
        let known: BTreeSet<&P> = workers.iter().map(|w| &w.id).collect();
        let gone: Vec<P> = self
            .active
            .iter()
            .filter(|p| !known.contains(p))
            .cloned()
            .collect();
        for p in gone {
            self.active.remove(&p);
            actions.push(Action::Release(p));
            fault = true;
        }

        let pool = self.mu_pool(workers);
        if pool < target {
            self.above_since = None;
            let since = *self.below_since.get_or_insert(now_s);
            if fault || now_s - since >= self.cfg.sustain_s {
                let mut standby: Vec<&WorkerInfo<P>> = workers
                    .iter()
                    .filter(|w| w.available && w.mu > 0.0 && !self.active.contains(&w.id))
                    .collect();
                standby.sort_by(|a, b| by_rho(a, b));
                let mut mu = pool;
                for w in standby {
                    if mu >= target {
                        break;
                    }
                    mu += w.mu;
                    self.active.insert(w.id.clone());
                    actions.push(Action::Activate(w.id.clone()));
                }
                self.below_since = None;
            }
        } else if pool > target * (1.0 + self.cfg.release_margin) {
            self.below_since = None;
            let since = *self.above_since.get_or_insert(now_s);
            if now_s - since >= self.cfg.sustain_s {
                let mut active: Vec<&WorkerInfo<P>> = workers
                    .iter()
                    .filter(|w| self.active.contains(&w.id))
                    .collect();
                active.sort_by(|a, b| by_rho(b, a)); // most expensive first
                let mut mu = pool;
                for w in active {
                    if mu - w.mu >= target {
                        mu -= w.mu;
                        self.active.remove(&w.id);
                        actions.push(Action::Release(w.id.clone()));
                    }
                }
                self.above_since = None;
            }
        } else {
            // Inside the band [target, target·(1+margin)]: no action, timers reset.
            self.below_since = None;
            self.above_since = None;
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(secs: f64) -> BcastSample {
        BcastSample {
            secs,
            lower_bound: false,
        }
    }

    fn at_least(secs: f64) -> BcastSample {
        BcastSample {
            secs,
            lower_bound: true,
        }
    }

    #[test]
    fn t_bcast_counts_unfinished_versions_as_lower_bounds() {
        assert_eq!(t_bcast_estimate(&[]), None);
        let e = t_bcast_estimate(&[exact(0.2), exact(0.1), exact(0.3)]).unwrap();
        assert_eq!(
            e,
            BcastEstimate {
                secs: 0.2,
                lower_bound: false
            }
        );
        // Versions that never completed: the median moves up to them and says "at least".
        let starving = [exact(0.15), exact(0.14), at_least(9.0), at_least(40.0)];
        let e = t_bcast_estimate(&starving).unwrap();
        assert_eq!(e.secs, 9.0);
        assert!(e.lower_bound);
        // A short-lived lower bound below the median taints it: its true value may be above.
        let e = t_bcast_estimate(&[at_least(0.05), exact(0.2), exact(0.3)]).unwrap();
        assert_eq!(e.secs, 0.2);
        assert!(e.lower_bound);
        // A lower bound above the median cannot move it.
        let e = t_bcast_estimate(&[exact(0.1), exact(0.2), at_least(5.0)]).unwrap();
        assert_eq!(e.secs, 0.2);
        assert!(!e.lower_bound);
        // Only an unfinished version so far.
        let e = t_bcast_estimate(&[at_least(1.5), exact(f64::NAN)]).unwrap();
        assert_eq!((e.secs, e.lower_bound), (1.5, true));
    }

    #[test]
    fn broadcast_completion_is_the_install_time_of_the_needed_worker() {
        // n = 4 → ⌈4/1.1⌉ = 4 workers needed.
        let w = |v: u64, t: u32| (Some(v), Some(t));
        assert_eq!(
            broadcast_completed_at(&[w(3, 10), w(3, 30), w(3, 20), (Some(2), Some(5))], 3),
            None
        );
        assert_eq!(
            broadcast_completed_at(&[w(3, 10), w(3, 30), w(3, 20), w(4, 25)], 3),
            Some(30)
        );
        // n = 11 → 10 needed: the tenth earliest install, whatever order the reports came in.
        let mut many: Vec<_> = (0..11u32).map(|k| w(7, 100 - k)).collect();
        many.swap(0, 5);
        assert_eq!(broadcast_completed_at(&many, 7), Some(99));
        // An install time unknown (an older node) among those needed: not computable.
        let mut old = vec![w(3, 10), w(3, 12)];
        old.push((Some(3), None));
        assert_eq!(broadcast_completed_at(&old, 3), None);
    }

    #[test]
    fn broadcast_ends_when_a_fraction_one_over_gamma_installed() {
        // q = 1/1.1: 10 workers need ⌈9.09⌉ = 10, 11 need 10, 2 need 2, 1 needs 1.
        let mut v = vec![Some(5); 10];
        assert!(broadcast_done(&v, 5));
        v[0] = Some(4);
        assert!(!broadcast_done(&v, 5));
        v.push(Some(6));
        assert!(broadcast_done(&v, 5), "10 of 11 suffice");
        assert!(!broadcast_done(&[Some(5), None], 5));
        assert!(broadcast_done(&[Some(7)], 5), "a newer install counts");
        assert!(!broadcast_done(&[], 0), "undefined without workers");
    }

    fn w(id: &str, cost: f64, mu: f64) -> WorkerInfo<String> {
        WorkerInfo {
            id: id.into(),
            cost_per_hour: cost,
            mu,
            available: true,
        }
    }

    #[test]
    fn mu_min_and_the_infeasible_case() {
        // κ = 2, R = 64, T_train = 10 s, T_bcast = 4 s: 128 / 16 = 8 trajectories/s.
        assert_eq!(
            mu_min(2, 64.0, 10.0, 4.0),
            Requirement::Feasible { mu_min: 8.0 }
        );
        // κ = 1, T_train = 3 s ≤ T_bcast = 4 s: no pool keeps the learner busy.
        assert_eq!(
            mu_min(1, 64.0, 3.0, 4.0),
            Requirement::Infeasible {
                kappa_t_train: 3.0,
                t_bcast: 4.0
            }
        );
        assert!(
            matches!(mu_min(2, 64.0, 2.0, 4.0), Requirement::Infeasible { .. }),
            "equality is infeasible"
        );
        assert!(matches!(
            mu_min(0, 64.0, 10.0, 4.0),
            Requirement::Infeasible { .. }
        ));
    }

    #[test]
    fn staleness_bounds() {
        // eq. 7: κ=2, T_bcast=4, R=64, μ_pool=8 → ⌈(4 + 8)/10⌉ = 2 → 2 + 2 − 1 = 3
        assert_eq!(delta_max_conservative(2, 4.0, 64.0, 8.0, 10.0), Some(3));
        assert_eq!(delta_max_conservative(2, 4.0, 64.0, 0.0, 10.0), None);
        // eq. 12: κ=2: 2 + ⌈0.5·4/10⌉ = 3 (App. B.4: Δ ≤ 3 for κ = 2 when T_bcast ≤ 2 T_train)
        assert_eq!(delta_max_under_overlap(2, 4.0, 10.0), Some(3));
        assert_eq!(delta_max_under_overlap(1, 40.0, 10.0), Some(1));
    }

    #[test]
    fn greedy_takes_the_cheapest_rho_prefix() {
        let ws = vec![
            w("a", 3.0, 1.0),
            w("b", 2.0, 2.0),
            w("c", 1.0, 0.5),
            w("d", 4.0, 8.0),
        ];
        // ρ: a 3, b 1, c 2, d 0.5 → order d, b, c, a
        let s = select_cheapest(&ws, 9.0);
        assert_eq!(s.active, ["d", "b"]);
        assert_eq!((s.mu, s.cost_per_hour, s.shortfall), (10.0, 6.0, None));
        let s = select_cheapest(&ws, 100.0);
        assert_eq!(s.active.len(), 4);
        assert_eq!(
            s.shortfall,
            Some(100.0 - 11.5),
            "not enough workers is reported"
        );
        // Ties in ρ: the faster worker first, then by id.
        let ties = vec![w("x", 1.0, 1.0), w("y", 2.0, 2.0), w("w", 2.0, 2.0)];
        assert_eq!(select_cheapest(&ties, 4.0).active, ["w", "y"]);
        // Unavailable or unmeasured workers are never chosen.
        let mut off = w("z", 0.1, 10.0);
        off.available = false;
        assert!(select_cheapest(&[off, w("q", 1.0, 0.0)], 1.0)
            .active
            .is_empty());
    }

    #[test]
    fn no_flapping_under_noise_inside_the_band() {
        let mut s = Scheduler::new(SchedulerConfig {
            release_margin: 0.25,
            sustain_s: 30.0,
        });
        let mut ws = vec![w("a", 1.0, 5.0), w("b", 1.0, 5.0), w("c", 5.0, 5.0)];
        let acts = s.tick(0.0, &ws, 9.0);
        // Below target from the start: nothing before the sustain interval…
        assert!(acts.is_empty());
        let acts = s.tick(30.0, &ws, 9.0);
        assert_eq!(
            acts,
            [Action::Activate("a".into()), Action::Activate("b".into())]
        );
        // …then noisy μ within ±10 % (pool 9.2–10.8 vs band [9, 11.25]) for a long time.
        for k in 0..200 {
            let jitter = if k % 2 == 0 { 0.92 } else { 1.08 };
            ws[0].mu = 5.0 * jitter;
            ws[1].mu = 5.0 * jitter;
            assert!(s.tick(31.0 + k as f64, &ws, 9.0).is_empty(), "tick {k}");
        }
        // Short dips below the target shorter than the sustain interval do not act either.
        ws[0].mu = 3.0;
        for k in 0..29 {
            assert!(s.tick(300.0 + k as f64, &ws, 9.0).is_empty());
        }
        ws[0].mu = 5.0;
        assert!(s.tick(329.0, &ws, 9.0).is_empty());
        assert_eq!(s.active().len(), 2);
    }

    #[test]
    fn a_failed_worker_is_replaced_at_once_by_the_cheapest_standby() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        let mut ws = vec![
            w("a", 1.0, 5.0),
            w("b", 1.0, 5.0),
            w("c", 5.0, 5.0),
            w("d", 2.0, 5.0),
        ];
        s.tick(0.0, &ws, 9.0);
        s.tick(100.0, &ws, 9.0);
        assert_eq!(s.active().iter().cloned().collect::<Vec<_>>(), ["a", "b"]);
        ws[1].available = false;
        let acts = s.tick(101.0, &ws, 9.0);
        assert_eq!(
            acts,
            [Action::Release("b".into()), Action::Activate("d".into())]
        );
        // A worker that disappears from the list entirely is a fault too.
        let acts = s.tick(102.0, &ws[..3], 9.0);
        assert_eq!(
            acts,
            [Action::Release("d".into()), Action::Activate("c".into())]
        );
    }

    #[test]
    fn sustained_surplus_releases_the_most_expensive_first() {
        let mut s = Scheduler::new(SchedulerConfig {
            release_margin: 0.25,
            sustain_s: 10.0,
        });
        let ws = vec![
            w("a", 1.0, 5.0),
            w("b", 9.0, 5.0),
            w("c", 2.0, 5.0),
            w("d", 3.0, 5.0),
        ];
        s.tick(0.0, &ws, 20.0);
        assert_eq!(s.tick(10.0, &ws, 20.0).len(), 4);
        // The target drops (e.g. T_train grew): pool 20 > 8·1.25 = 10 for 10 s → release.
        assert!(s.tick(20.0, &ws, 8.0).is_empty());
        let acts = s.tick(30.0, &ws, 8.0);
        assert_eq!(
            acts,
            [Action::Release("b".into()), Action::Release("d".into())]
        );
        assert_eq!(s.mu_pool(&ws), 10.0);
        assert!(s.mu_pool(&ws) >= 8.0, "never releases below the target");
    }
}
