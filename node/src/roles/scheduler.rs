//! The learner's provisioning scheduler in the node (ECHO-2 §3.4, App. D; `docs/learner.md`).
//!
//! Every [`TICK`] it reads the workers' heartbeats (declared cost c_i, measured μ_i,
//! availability), decides which rollout workers generate (active) and which stay connected but
//! idle (standby), and gossips the decision as a learner-signed activation order
//! (`dissemination::order_msg`) whenever it changes and every `announce_interval_ms`.
//!
//! μ_i is the worker's claim, counted for at most [`CLAIM_TOLERANCE`] times the rate the
//! learner verified — valid groups delivered per second of the time the learner asked for
//! groups (`control::pulls::DeliveryMeter`) — once it has one ([`Candidate::counted_mu`]): a worker
//! claiming μ = 10⁶ is ranked and summed at what it delivers, so it cannot send the honest
//! workers to standby (`docs/security.md`).
//!
//! Two policies:
//! - **Target** (default): μ_target = γ·μ_min from the online medians of T_train and T_bcast
//!   (computed by the learner). `control::capacity::Scheduler` keeps the cheapest-ρ prefix
//!   that reaches it, with hysteresis, and replaces a failed worker at once. Until the target
//!   is known every worker is active; a worker that has not yet produced (μ unknown) is active
//!   on probation so that its μ gets measured.
//! - **Fixed** (`scheduler.active_workers = K`): exactly the K cheapest available workers by
//!   ρ (workers not yet measured rank after measured ones, by cost) — an operator override,
//!   also what makes the standby/failover behaviour testable on a noisy machine.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::SchedulerStatus;
use crate::config::{Ranking, SchedulerConfig};
use control::capacity::{Scheduler, SchedulerConfig as Hysteresis, WorkerInfo};
use dissemination::Disseminator;

pub const TICK: Duration = Duration::from_millis(500);

/// How much more than its verified rate a worker's claimed μ may count for. The verified rate
/// is a lower bound: a worker delivers its share of what the learner consumes (C), not what it
/// could make. While the swarm keeps up the active workers' deliveries sum to C, so their
/// counted μ sums to min(Σ claims, 2·C), above the target γ·μ_min ≈ 1.1·C when the claims are
/// (the scheduler can still release surplus workers); a liar counts for at most twice what it
/// really delivers.
pub const CLAIM_TOLERANCE: f64 = 2.0;

/// One worker as the scheduler sees it (`Id`: its peer id; tests use names).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<Id = p2p::PeerId> {
    pub id: Id,
    pub cost_per_hour: f64,
    /// Groups per second, as its heartbeat claims (0 = not measured yet).
    pub mu: f64,
    /// Groups per second, as the learner verified (`control::pulls::DeliveryMeter`), once
    /// known.
    pub verified: Option<f64>,
    pub available: bool,
}

impl<Id> Candidate<Id> {
    /// The μ the scheduler ranks and sums: the claim, at most [`CLAIM_TOLERANCE`] × the
    /// verified rate once there is one.
    pub fn counted_mu(&self) -> f64 {
        let claimed = if self.mu.is_finite() {
            self.mu.max(0.0)
        } else {
            0.0
        };
        match self.verified {
            Some(v) if v.is_finite() => claimed.min(CLAIM_TOLERANCE * v.max(0.0)),
            _ => claimed,
        }
    }

    /// Whether anything is known of its rate: a worker that is not is active on probation.
    fn measured(&self) -> bool {
        self.mu > 0.0 || self.verified.is_some()
    }
}

/// Fixed policy: the `k` cheapest available workers — measured ones by ρ = c/μ (μ as
/// [`Candidate::counted_mu`]) first, then unmeasured ones by cost, ties by id — are active;
/// every other worker is on standby.
pub fn fixed_selection<Id: Clone + Ord>(cands: &[Candidate<Id>], k: usize) -> (Vec<Id>, Vec<Id>) {
    let mut avail: Vec<&Candidate<Id>> = cands.iter().filter(|c| c.available).collect();
    avail.sort_by(|a, b| {
        let key = |c: &Candidate<Id>| {
            let mu = c.counted_mu();
            if !c.measured() {
                (1, c.cost_per_hour)
            } else if mu > 0.0 {
                (0, c.cost_per_hour / mu)
            } else {
                // Verified to deliver nothing: last of the measured ones.
                (0, f64::INFINITY)
            }
        };
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then(a.id.cmp(&b.id))
    });
    let active: Vec<Id> = avail.iter().take(k).map(|c| c.id.clone()).collect();
    let standby = cands
        .iter()
        .filter(|c| !active.contains(&c.id))
        .map(|c| c.id.clone())
        .collect();
    (active, standby)
}

/// Ablation baseline: `k` available workers in a fixed pseudo-random order (BLAKE3 of the
/// peer id's text; stable across ticks, so the choice does not flap), ignoring cost and μ.
pub fn random_selection<Id: Clone + PartialEq + std::fmt::Display>(
    cands: &[Candidate<Id>],
    k: usize,
) -> (Vec<Id>, Vec<Id>) {
    let mut avail: Vec<&Candidate<Id>> = cands.iter().filter(|c| c.available).collect();
    avail.sort_by_cached_key(|c| *blake3::hash(c.id.to_string().as_bytes()).as_bytes());
    let active: Vec<Id> = avail.iter().take(k).map(|c| c.id.clone()).collect();
    let standby = cands
        .iter()
        .filter(|c| !active.contains(&c.id))
        .map(|c| c.id.clone())
        .collect();
    (active, standby)
}

/// The scheduler's state between ticks.
pub struct State<Id = p2p::PeerId> {
    cfg: SchedulerConfig,
    hysteresis: Scheduler<Id>,
    seeded: bool,
    started: Instant,
    last: Option<(Vec<Id>, Vec<Id>)>,
    last_sent: Option<Instant>,
    last_seq: u64,
    orders: u64,
    /// What `/status` shows.
    view: SchedulerStatus,
}

impl<Id: Clone + Ord + std::fmt::Display> State<Id> {
    pub fn new(cfg: SchedulerConfig) -> Self {
        let hysteresis = Scheduler::new(Hysteresis {
            release_margin: cfg.release_margin,
            sustain_s: cfg.sustain_s,
        });
        State {
            cfg,
            hysteresis,
            seeded: false,
            started: Instant::now(),
            last: None,
            last_sent: None,
            last_seq: 0,
            orders: 0,
            view: SchedulerStatus::default(),
        }
    }

    /// What `/status` shows.
    pub fn view(&self) -> SchedulerStatus {
        self.view.clone()
    }

    /// The workers the last order put on standby (they generate nothing meanwhile).
    pub fn standby(&self) -> &[Id] {
        self.last.as_ref().map_or(&[], |(_, sb)| sb.as_slice())
    }

    /// Decides active / standby for this tick (`mu_target` in groups/s when known).
    pub fn decide(
        &mut self,
        cands: &[Candidate<Id>],
        mu_target: Option<f64>,
    ) -> (Vec<Id>, Vec<Id>) {
        if let Some(k) = self.cfg.active_workers {
            return if self.cfg.ranking == Ranking::Random {
                random_selection(cands, k)
            } else {
                fixed_selection(cands, k)
            };
        }
        let Some(target) = mu_target else {
            let active = cands
                .iter()
                .filter(|c| c.available)
                .map(|c| c.id.clone())
                .collect();
            let standby = cands
                .iter()
                .filter(|c| !c.available)
                .map(|c| c.id.clone())
                .collect();
            return (active, standby);
        };
        let measured: Vec<WorkerInfo<Id>> = cands
            .iter()
            .filter(|c| c.measured())
            .map(|c| WorkerInfo {
                id: c.id.clone(),
                cost_per_hour: c.cost_per_hour,
                mu: c.counted_mu(),
                available: c.available,
            })
            .collect();
        if !self.seeded {
            // Everyone generated until now: start from that.
            self.hysteresis.set_active(
                measured
                    .iter()
                    .filter(|w| w.available)
                    .map(|w| w.id.clone()),
            );
            self.seeded = true;
        }
        self.hysteresis
            .tick(self.started.elapsed().as_secs_f64(), &measured, target);
        let chosen: BTreeSet<&Id> = self.hysteresis.active().iter().collect();
        let (active, standby): (Vec<&Candidate<Id>>, Vec<&Candidate<Id>>) = cands
            .iter()
            .partition(|c| c.available && (chosen.contains(&c.id) || !c.measured()));
        (
            active.into_iter().map(|c| c.id.clone()).collect(),
            standby.into_iter().map(|c| c.id.clone()).collect(),
        )
    }
}

/// Runs the scheduler until the network service stops. `verified` reads the learner's
/// verified rates (the puller's `control::pulls::DeliveryMeter`).
pub async fn run(
    client: p2p::Client,
    dissem: Disseminator,
    state: std::sync::Arc<Mutex<State>>,
    mu_target: impl Fn() -> Option<f64> + Send + 'static,
    verified: impl Fn() -> HashMap<p2p::PeerId, f64> + Send + 'static,
) {
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let Ok(workers) = client.workers().await else {
            return;
        };
        let rates = verified();
        let cands: Vec<Candidate> = workers
            .iter()
            .map(|p| Candidate {
                id: p.peer,
                cost_per_hour: p.cost_per_hour.unwrap_or(0.0),
                mu: p.mu.unwrap_or(0.0),
                verified: rates.get(&p.peer).copied(),
                available: p.active,
            })
            .collect();
        let target = mu_target();
        let (send, seq, active, standby) = {
            let Ok(mut st) = state.lock() else { return };
            let (active, standby) = st.decide(&cands, target);
            let changed = st.last.as_ref() != Some(&(active.clone(), standby.clone()));
            let due = st
                .last_sent
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(st.cfg.announce_interval_ms));
            let send = !cands.is_empty() && (changed || due);
            if changed {
                tracing::info!(?active, ?standby, "scheduler: new activation order");
            }
            let seq = (storage::unix_ms()).max(st.last_seq + 1);
            if send {
                st.last_seq = seq;
                st.last_sent = Some(Instant::now());
                st.orders += 1;
            }
            st.last = Some((active.clone(), standby.clone()));
            let sum = |ids: &[p2p::PeerId], f: fn(&Candidate) -> f64| -> f64 {
                cands.iter().filter(|c| ids.contains(&c.id)).map(f).sum()
            };
            st.view = SchedulerStatus {
                enabled: true,
                policy: Some(
                    if st.cfg.active_workers.is_some() {
                        "fixed"
                    } else {
                        "target"
                    }
                    .into(),
                ),
                ranking: Some(st.cfg.ranking),
                active_workers: st.cfg.active_workers,
                active: active.iter().map(ToString::to_string).collect(),
                standby: standby.iter().map(ToString::to_string).collect(),
                active_cost_per_hour: sum(&active, |c| c.cost_per_hour),
                active_mu: sum(&active, Candidate::counted_mu),
                verified_mu: cands
                    .iter()
                    .filter_map(|c| Some((c.id.to_string(), c.verified?)))
                    .collect(),
                claims_capped: cands
                    .iter()
                    .filter(|c| c.counted_mu() < c.mu)
                    .map(|c| c.id.to_string())
                    .collect(),
                mu_target: target,
                orders_published: st.orders,
            };
            (send, seq, active, standby)
        };
        if send {
            if let Err(e) = dissem.publish_order(seq, active, standby).await {
                tracing::debug!(error = %e, "activation order not gossiped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, cost: f64, mu: f64, available: bool) -> Candidate<String> {
        Candidate {
            id: id.into(),
            cost_per_hour: cost,
            mu,
            verified: None,
            available,
        }
    }

    fn verified(mut c: Candidate<String>, v: f64) -> Candidate<String> {
        c.verified = Some(v);
        c
    }

    #[test]
    fn a_claim_counts_for_at_most_twice_the_verified_rate() {
        let honest = verified(c("h", 1.0, 2.0, true), 1.5);
        assert_eq!(honest.counted_mu(), 2.0, "within the tolerance: the claim");
        let liar = verified(c("l", 1.0, 1e6, true), 1.5);
        assert_eq!(liar.counted_mu(), 3.0);
        assert_eq!(
            c("u", 1.0, 1e6, true).counted_mu(),
            1e6,
            "unverified: the claim"
        );
        let junk = verified(c("j", 1.0, f64::NAN, true), f64::INFINITY);
        assert_eq!(junk.counted_mu(), 0.0);
        // Verified to deliver nothing: measured (no probation), counted 0.
        let idle = verified(c("z", 0.0, 0.0, true), 0.0);
        assert!(idle.measured());
        assert_eq!(idle.counted_mu(), 0.0);
    }

    #[test]
    fn a_worker_claiming_a_huge_mu_is_ranked_by_what_it_delivers() {
        // "liar" is dear but claims 10⁶ groups/s; "a" and "b" are cheap and honest.
        let mut cands = [
            c("a", 0.1, 2.0, true),
            c("b", 0.1, 2.0, true),
            c("liar", 1.0, 1e6, true),
        ];
        assert_eq!(
            fixed_selection(&cands, 2).0,
            ["liar", "a"],
            "the claim wins"
        );
        cands[2].verified = Some(2.0);
        assert_eq!(
            fixed_selection(&cands, 2).0,
            ["a", "b"],
            "its verified rate loses"
        );

        // Target policy, 3 groups/s: on its claim the liar alone covers it and, once the
        // surplus is sustained, both honest workers go to standby.
        let mut cands = cands.to_vec();
        cands[2].verified = None;
        let mut st = State::new(SchedulerConfig {
            enabled: true,
            sustain_s: 0.0,
            ..SchedulerConfig::default()
        });
        st.decide(&cands, Some(3.0));
        let (act, sb) = st.decide(&cands, Some(3.0));
        assert_eq!(
            (act, sb),
            (vec!["liar".to_string()], vec!["a".into(), "b".into()])
        );
        // Verified at 0.25 groups/s it counts 0.5: the pool is short, and the honest workers
        // are activated again, cheapest first, until the target is met ...
        cands[2].verified = Some(0.25);
        let (act, sb) = st.decide(&cands, Some(3.0));
        assert_eq!(act, ["a", "b", "liar"]);
        assert!(sb.is_empty());
        // ... then the surplus releases the dearest by ρ: the liar.
        let (act, sb) = st.decide(&cands, Some(3.0));
        assert_eq!(
            (act, sb),
            (vec!["a".to_string(), "b".into()], vec!["liar".into()])
        );
    }

    #[test]
    fn fixed_keeps_the_cheapest_by_rho_and_replaces_a_failed_one() {
        let cands = [
            c("a", 0.1, 2.0, true),
            c("b", 0.1, 1.0, true),
            c("c", 1.0, 2.0, true),
            c("d", 0.2, 0.0, true), // not measured yet: after the measured ones
        ];
        let (act, sb) = fixed_selection(&cands, 2);
        assert_eq!(act, ["a", "b"]);
        assert_eq!(sb, ["c", "d"]);
        // "a" fails: the next by ρ is "c" (ρ 0.5); "d" is unmeasured.
        let mut failed = cands.clone();
        failed[0].available = false;
        let (act, sb) = fixed_selection(&failed, 2);
        assert_eq!(act, ["b", "c"]);
        assert_eq!(sb, ["a", "d"]);
        // Before anyone is measured, cost decides.
        let fresh = [
            c("x", 1.0, 0.0, true),
            c("y", 0.1, 0.0, true),
            c("z", 0.5, 0.0, true),
        ];
        assert_eq!(fixed_selection(&fresh, 2).0, ["y", "z"]);
    }

    #[test]
    fn random_ranking_ignores_cost_but_is_stable() {
        let cands: Vec<Candidate<String>> = (0..6)
            .map(|i| c(&format!("w{i}"), f64::from(i), 1.0, true))
            .collect();
        let (a, _) = random_selection(&cands, 3);
        assert_eq!(a, random_selection(&cands, 3).0, "same choice every tick");
        assert_eq!(a.len(), 3);
        let mut rev = cands.clone();
        rev.reverse();
        let mut b = random_selection(&rev, 3).0;
        let mut a2 = a.clone();
        a2.sort();
        b.sort();
        assert_eq!(a2, b, "independent of the order heartbeats arrive in");
    }

    #[test]
    fn without_a_target_everyone_available_is_active_and_probation_is_active() {
        let mut st = State::new(SchedulerConfig {
            enabled: true,
            sustain_s: 0.0,
            ..SchedulerConfig::default()
        });
        let cands = [
            c("a", 0.1, 1.0, true),
            c("b", 5.0, 1.0, true),
            c("n", 9.0, 0.0, true),
        ];
        let (act, _) = st.decide(&cands, None);
        assert_eq!(act.len(), 3);
        // Target 1.0 groups/s: "a" alone reaches it; "b" (expensive) goes to standby once the
        // surplus is sustained (sustain 0 here); "n" is unmeasured and stays on probation.
        st.decide(&cands, Some(1.0));
        let (act, sb) = st.decide(&cands, Some(1.0));
        assert_eq!(act, ["a", "n"]);
        assert_eq!(sb, ["b"]);
    }
}
