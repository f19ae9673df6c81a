//! Forwarding-chain planning (ECHO-2 §4.2, App. C.3; `docs/broadcast.md`) as pure functions.
//!
//! The learner's uplink `B0` can feed `N_ch = max(1, ⌊B0 / B̂w⌋)` workers at full per-worker
//! bandwidth `B̂w` at once; every further worker would only split that uplink. So the learner
//! sends to `N_ch` *first hops* and every worker forwards to at most one child (fan-out 1),
//! store-and-forward per chunk: a chain of length `L` finishes after about
//! `M/B̂w + (L − 1)·c/B̂w` (snapshot size `M`, chunk size `c`), which grows with `L` only by one
//! chunk time per hop.
//!
//! Placement rules, in order:
//! 1. Workers whose score is at or below `exclude_below` do not forward at all: they are
//!    *fetch-only* (they fetch chunks by hash from any holder: "out of forwarding" in `docs/broadcast.md`).
//! 2. The others are ranked by score, best first (ties broken by peer id, so every node
//!    computes the same plan); *degraded* workers (score below `degraded_below`) are ranked
//!    after all healthy ones, so they land toward the tails where a slow link delays nobody.
//! 3. The first `N_ch` in that order are first hops; the rest are appended to the chain tails
//!    round-robin in rank order (worker `k` joins chain `k mod N_ch`), which keeps the chains
//!    within one of each other in length and puts the best forwarders nearest the learner.
//!
//! Relay-only workers (reachable only through a relay: `p2p::Reachability::Relayed`) never
//! forward to a child — every byte they forward would cross the relay twice, on a circuit
//! with byte and time limits. [`replan`] plans the others by the rules
//! above, then puts each relay-only worker at the tail of a chain (at most one per chain,
//! shortest chain first), or alone in a chain of its own while fewer than `N_ch` chains
//! exist; the rest are fetch-only.
//!
//! Repair: removing a failed worker reattaches its child (and so its whole tail) to the failed
//! worker's parent — its nearest surviving ancestor, or the learner for a first hop.
//!
//! Stability: a new version's plan starts from the previous plan's rank order and swaps two
//! workers only when the later one outscores the earlier by more than [`REPLAN_MARGIN`] (or
//! is of a better class: healthy before degraded). Scores move a little with every transfer,
//! and a plan re-sorted on every move changes parent–child pairs each version; a new pair
//! starts cold (a new chunk stream with a small window on a connection whose congestion
//! state was not built by bulk traffic), which measured 0.9 s slower per hop at 100 ms RTT
//! than a pair that keeps its push session (`docs/netlab.md`). Without a previous plan (or
//! with a margin of 0) the order is exactly rules 2–3.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

use crate::units::mbps_to_bytes_per_s;

/// Inputs of a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanParams {
    /// Learner uplink budget `B0` (Mbit/s).
    pub learner_mbps: f64,
    /// Per-worker forwarding bandwidth `B̂w` (Mbit/s).
    pub worker_mbps: f64,
    /// Workers scoring below this are placed after all healthy ones.
    pub degraded_below: f64,
    /// Workers scoring at or below this do not forward (fetch-only).
    pub exclude_below: f64,
    /// Versions per plan epoch: at the first version of each epoch the learner re-draws the
    /// chain seats (`crate::seats`).
    pub epoch_versions: u64,
}

/// Default versions per plan epoch (`crate::seats` re-draws the seats at each epoch's first
/// version). At κ = 2 and a step a second a seat lasts about 16 s, so a worker that holds a
/// chain's head by chance (or by its key) gives it up within seconds; the push sessions of the
/// pairs that change start cold once per epoch instead of once per version.
pub const EPOCH_VERSIONS: u64 = 8;

impl Default for PlanParams {
    fn default() -> Self {
        PlanParams {
            learner_mbps: 300.0,
            worker_mbps: 100.0,
            degraded_below: 40.0,
            exclude_below: 10.0,
            epoch_versions: EPOCH_VERSIONS,
        }
    }
}

/// `N_ch = max(1, ⌊B0 / B̂w⌋)`.
pub fn n_chains(learner_mbps: f64, worker_mbps: f64) -> usize {
    if !(learner_mbps.is_finite() && worker_mbps.is_finite())
        || worker_mbps <= 0.0
        || learner_mbps <= 0.0
    {
        return 1;
    }
    ((learner_mbps / worker_mbps).floor() as usize).max(1)
}

/// A forwarding plan: `chains[j][0]` receives from the learner, `chains[j][k+1]` from
/// `chains[j][k]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainPlan<P> {
    pub chains: Vec<Vec<P>>,
    /// Workers that do not forward and fetch chunks from any holder.
    pub fetch_only: Vec<P>,
}

/// Where a worker sits in a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement<P> {
    /// In chain `chain` at `position` (0 = first hop); `parent` `None` means the learner.
    Chain {
        chain: usize,
        position: usize,
        parent: Option<P>,
        child: Option<P>,
    },
    FetchOnly,
}

/// Score points (of 100) by which a worker must outscore one ranked before it in the previous
/// plan before a new plan puts it first (module docs, "Stability"). Five points are a third
/// of Stability's weight, 14 points of success rate (one failed transfer in seven), or a
/// factor of 3.2 in speed (Speed is logarithmic: 10 points per decade, half of it in the
/// score). One lossy WAN hop's speed samples spread over 40–100 Mbit/s on the same link
/// (`docs/netlab.md`), 4 score points: a smaller margin would re-plan on noise.
pub const REPLAN_MARGIN: f64 = 5.0;

/// Builds the plan for `workers` given as `(peer, score)`.
pub fn plan_chains<P: Clone + Ord>(workers: &[(P, f64)], params: &PlanParams) -> ChainPlan<P> {
    plan_chains_after(workers, params, &[], &BTreeSet::new(), REPLAN_MARGIN)
}

/// [`plan_chains`] that keeps the rank order `prev` (the previous plan's
/// [`ChainPlan::rank_order`]) wherever the scores allow it (module docs, "Stability").
fn plan_chains_after<P: Clone + Ord>(
    workers: &[(P, f64)],
    params: &PlanParams,
    prev: &[P],
    demoted: &BTreeSet<P>,
    margin: f64,
) -> ChainPlan<P> {
    let mut forwarders: Vec<(P, f64)> = Vec::new();
    let mut fetch_only = Vec::new();
    for w in workers {
        let forwards = w.1 > params.exclude_below; // a NaN score does not forward
        if !forwards {
            fetch_only.push(w.0.clone());
        } else {
            forwarders.push(w.clone());
        }
    }
    fetch_only.sort();
    let order = rank(forwarders, params, prev, demoted, margin);
    let n = n_chains(params.learner_mbps, params.worker_mbps).min(order.len());
    let mut chains: Vec<Vec<P>> = vec![Vec::new(); n];
    for (k, w) in order.into_iter().enumerate() {
        chains[k % n.max(1)].push(w);
    }
    ChainPlan { chains, fetch_only }
}

/// Rule 2's order: healthy before degraded before `demoted` (`crate::forwarding`: workers
/// whose forwarding was found slow), then by score descending, then by peer id — but
/// starting from `prev` (its members in its order, newcomers after them in rule 2's order),
/// and each next place goes to the first remaining worker that no remaining worker beats:
/// none is of a better class, and none of its class scores more than [`REPLAN_MARGIN`] above
/// it. With `prev` empty the first remaining worker is always the best one, so the result is
/// rule 2's order exactly.
fn rank<P: Clone + Ord>(
    forwarders: Vec<(P, f64)>,
    params: &PlanParams,
    prev: &[P],
    demoted: &BTreeSet<P>,
    margin: f64,
) -> Vec<P> {
    let class_of = |w: &(P, f64)| {
        if demoted.contains(&w.0) {
            2u8
        } else {
            u8::from(w.1 < params.degraded_below)
        }
    };
    let mut forwarders: Vec<(P, f64, u8)> = forwarders
        .into_iter()
        .map(|w| {
            let c = class_of(&w);
            (w.0, w.1, c)
        })
        .collect();
    forwarders.sort_by(|a, b| {
        a.2.cmp(&b.2)
            .then(b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal))
            .then(a.0.cmp(&b.0))
    });
    let at: BTreeMap<&P, usize> = prev.iter().enumerate().map(|(i, p)| (p, i)).collect();
    // A stable sort: newcomers (usize::MAX) keep rule 2's order among themselves.
    let mut pending = forwarders;
    pending.sort_by_key(|w| at.get(&w.0).copied().unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let best = pending.iter().map(|w| w.2).min().unwrap_or(0);
        let top = pending
            .iter()
            .filter(|w| w.2 == best)
            .map(|w| w.1)
            .fold(f64::NEG_INFINITY, f64::max);
        // The worker scoring `top` itself qualifies, so there is always one.
        let i = pending
            .iter()
            .position(|w| w.2 == best && w.1 >= top - margin)
            .unwrap_or(0);
        out.push(pending.remove(i).0);
    }
    out
}

/// The plan for workers given as `(peer, score, relay_only)`, after the plan `prev` of the
/// previous version if any: relay-only workers end chains and never have a child (module
/// docs), and the rank order of `prev` stands wherever the scores allow ("Stability"), for
/// the direct workers and the relay-only tails alike. Without relay-only workers and without
/// `prev` the plan is exactly [`plan_chains`]'s.
pub fn replan<P: Clone + Ord>(
    workers: &[(P, f64, bool)],
    params: &PlanParams,
    prev: Option<&ChainPlan<P>>,
) -> ChainPlan<P> {
    let prev = prev.map(ChainPlan::rank_order).unwrap_or_default();
    replan_after(workers, params, &prev, &BTreeSet::new(), REPLAN_MARGIN)
}

/// [`replan`] after the rank order `prev`, which stands unless a worker outscores an earlier
/// one by more than `margin`, with `demoted` workers ranked after every other forwarder of
/// their kind (direct or relay-only).
pub(crate) fn replan_after<P: Clone + Ord>(
    workers: &[(P, f64, bool)],
    params: &PlanParams,
    prev: &[P],
    demoted: &BTreeSet<P>,
    margin: f64,
) -> ChainPlan<P> {
    let direct: Vec<(P, f64)> = workers
        .iter()
        .filter(|w| !w.2)
        .map(|w| (w.0.clone(), w.1))
        .collect();
    let mut plan = plan_chains_after(&direct, params, prev, demoted, margin);
    let mut relayed: Vec<(P, f64)> = Vec::new();
    for w in workers.iter().filter(|w| w.2) {
        if w.1 > params.exclude_below {
            relayed.push((w.0.clone(), w.1));
        } else {
            plan.fetch_only.push(w.0.clone());
        }
    }
    // Best first, ties by peer id (every node computes the same plan); degraded ones last.
    let relayed = rank(relayed, params, prev, demoted, margin);
    let n_ch = n_chains(params.learner_mbps, params.worker_mbps);
    // Chains whose tail may still take a relay-only worker (none has one yet).
    let mut open: Vec<usize> = (0..plan.chains.len()).collect();
    for w in relayed {
        if plan.chains.len() < n_ch {
            // A spare first-hop slot: the learner sends to it directly; no child follows.
            plan.chains.push(vec![w]);
            continue;
        }
        // The shortest open chain (ties: the lowest index) gets it as its tail.
        let pick = open
            .iter()
            .enumerate()
            .min_by_key(|(_, &j)| (plan.chains[j].len(), j))
            .map(|(i, _)| i);
        match pick {
            Some(i) => {
                let j = open.remove(i);
                plan.chains[j].push(w);
            }
            None => plan.fetch_only.push(w),
        }
    }
    plan.fetch_only.sort();
    plan
}

impl<P: Clone> ChainPlan<P> {
    /// The forwarders level by level: every chain's first hop, then every second hop, and so
    /// on — for a plan laid out by rule 3, the rank order it was laid out from.
    pub fn rank_order(&self) -> Vec<P> {
        (0..self.chains.iter().map(Vec::len).max().unwrap_or(0))
            .flat_map(|level| self.chains.iter().filter_map(move |c| c.get(level)))
            .cloned()
            .collect()
    }
}

impl<P: Clone + Eq + Hash> ChainPlan<P> {
    /// Longest chain length `L`.
    pub fn max_len(&self) -> usize {
        self.chains.iter().map(Vec::len).max().unwrap_or(0)
    }

    pub fn placement(&self, peer: &P) -> Option<Placement<P>> {
        for (j, chain) in self.chains.iter().enumerate() {
            if let Some(k) = chain.iter().position(|p| p == peer) {
                return Some(Placement::Chain {
                    chain: j,
                    position: k,
                    parent: k.checked_sub(1).map(|i| chain[i].clone()),
                    child: chain.get(k + 1).cloned(),
                });
            }
        }
        self.fetch_only
            .contains(peer)
            .then_some(Placement::FetchOnly)
    }

    /// Parent of every forwarding worker (`None` = the learner).
    pub fn parents(&self) -> HashMap<P, Option<P>> {
        let mut out = HashMap::new();
        for chain in &self.chains {
            for (k, p) in chain.iter().enumerate() {
                out.insert(p.clone(), k.checked_sub(1).map(|i| chain[i].clone()));
            }
        }
        out
    }

    /// Repair: removes `failed`; its tail moves up to its parent (its nearest surviving
    /// ancestor). Returns whether the plan changed. An emptied chain is dropped.
    pub fn excise(&mut self, failed: &P) -> bool {
        let before = self.fetch_only.len();
        self.fetch_only.retain(|p| p != failed);
        let mut changed = before != self.fetch_only.len();
        for chain in &mut self.chains {
            if let Some(k) = chain.iter().position(|p| p == failed) {
                chain.remove(k);
                changed = true;
            }
        }
        self.chains.retain(|c| !c.is_empty());
        changed
    }
}

/// Time for every worker of a chain plan to hold the snapshot: `M/B̂w + (L − 1)·c/B̂w` (seconds;
/// sizes in bytes, bandwidth in Mbit/s).
pub fn chain_bound_s(size_bytes: f64, chunk_bytes: f64, worker_mbps: f64, max_len: usize) -> f64 {
    let bw = mbps_to_bytes_per_s(worker_mbps);
    size_bytes / bw + (max_len.saturating_sub(1) as f64) * chunk_bytes / bw
}

/// Star (learner sends to all `n` workers over its uplink): `max(M/B̂w, n·M/B0)`.
pub fn star_bound_s(size_bytes: f64, worker_mbps: f64, learner_mbps: f64, n: usize) -> f64 {
    let bw = mbps_to_bytes_per_s(worker_mbps);
    let b0 = mbps_to_bytes_per_s(learner_mbps);
    (size_bytes / bw).max(n as f64 * size_bytes / b0)
}

impl<P: Clone + Ord> ChainPlan<P> {
    /// Every worker the plan names: its chain members and its fetch-only workers.
    pub fn members(&self) -> BTreeSet<P> {
        self.chains
            .iter()
            .flatten()
            .chain(&self.fetch_only)
            .cloned()
            .collect()
    }
}

/// Whether no published version is still on its way: every active worker (`installed`: the
/// versions their install reports name) holds `published` or newer. With no worker, or
/// nothing published, nothing is in flight.
///
/// This is stricter than the end of a T_bcast measurement (`crate::capacity::broadcast_done`,
/// ⌈n/γ⌉ of the workers): a plan for the next version replaces the plan the last pushes run
/// on, so it may go out only when no worker still waits for one of them.
pub fn nothing_in_flight(installed: &[Option<u64>], published: Option<u64>) -> bool {
    published.is_none_or(|v| installed.iter().all(|i| i.is_some_and(|i| i >= v)))
}

/// Standing plans (`docs/broadcast.md`, "Warm streams for the first version"): whether the
/// learner announces the plan of its next version now, before that version exists, so that
/// every parent opens its chunk stream to a new child — and grows its window with filler —
/// ahead of the first chunk. Due when there are active workers (`active`: each with the
/// version its install reports name), nothing published is in flight
/// ([`nothing_in_flight`]), and the next plan will have new pairs: the active workers are
/// not the ones the current plan (`planned`: [`ChainPlan::members`]) was made for — a
/// swarm's first workers after the learner published its start-up version, a worker that
/// joined, one that left — or the next version re-draws the seats (`redraw_next`: it starts
/// a plan epoch, `crate::seats::redraws`). A new pair's first push otherwise dials,
/// negotiates and ramps its stream after publication: measured at N = 8, 100 ms RTT and
/// 0.5 % loss, a run's first version took 2.3–3.5 × the chain bound against 1.3–2.1 × with
/// its plan announced ahead, and the version that starts a plan epoch was the slowest of the
/// later ones in most runs. Otherwise nothing is announced (the plan made at publication
/// stands).
pub fn standing_plan_due<P: Clone + Ord>(
    planned: Option<&BTreeSet<P>>,
    active: &[(P, Option<u64>)],
    published: Option<u64>,
    redraw_next: bool,
) -> bool {
    if active.is_empty() {
        return false;
    }
    let installed: Vec<Option<u64>> = active.iter().map(|a| a.1).collect();
    if !nothing_in_flight(&installed, published) {
        return false;
    }
    let now: BTreeSet<P> = active.iter().map(|a| a.0.clone()).collect();
    redraw_next || planned != Some(&now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(scores: &[f64]) -> Vec<(String, f64)> {
        scores
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("w{i:02}"), *s))
            .collect()
    }

    fn reach(scores: &[(f64, bool)]) -> Vec<(String, f64, bool)> {
        scores
            .iter()
            .enumerate()
            .map(|(i, (s, r))| (format!("w{i:02}"), *s, *r))
            .collect()
    }

    /// Workers `w00`, `w01`, … with these scores, none relay-only.
    fn direct(scores: &[f64]) -> Vec<(String, f64, bool)> {
        reach(&scores.iter().map(|&s| (s, false)).collect::<Vec<_>>())
    }

    /// No relay-only worker has a child.
    fn relay_only_are_tails(plan: &ChainPlan<String>, ws: &[(String, f64, bool)]) {
        for chain in &plan.chains {
            for p in &chain[..chain.len() - 1] {
                let relay_only = ws.iter().any(|w| &w.0 == p && w.2);
                assert!(!relay_only, "{p} forwards to a child: {plan:?}");
            }
        }
    }

    #[test]
    fn without_relay_only_workers_the_plan_is_unchanged() {
        let p = PlanParams::default();
        let ws = reach(&[
            (90.0, false),
            (50.0, false),
            (30.0, false),
            (5.0, false),
            (70.0, false),
        ]);
        let plain: Vec<(String, f64)> = ws.iter().map(|w| (w.0.clone(), w.1)).collect();
        assert_eq!(replan(&ws, &p, None), plan_chains(&plain, &p));
    }

    #[test]
    fn relay_only_workers_end_chains_shortest_first_then_fetch_only() {
        let p = PlanParams::default(); // N_ch = 3
                                       // Five direct workers (chains of 2, 2, 1) and four relay-only ones, one of them the
                                       // best scorer: it still never forwards.
        let ws = reach(&[
            (90.0, false),
            (80.0, false),
            (70.0, false),
            (60.0, false),
            (50.0, false),
            (99.0, true),
            (45.0, true),
            (44.0, true),
            (43.0, true),
        ]);
        let plan = replan(&ws, &p, None);
        assert_eq!(
            plan.chains,
            vec![
                vec!["w00".to_string(), "w03".into(), "w06".into()],
                vec!["w01".to_string(), "w04".into(), "w07".into()],
                vec!["w02".to_string(), "w05".into()],
            ]
        );
        assert_eq!(plan.fetch_only, ["w08"]);
        relay_only_are_tails(&plan, &ws);
    }

    #[test]
    fn relay_only_workers_fill_spare_first_hops_alone() {
        let p = PlanParams::default(); // N_ch = 3
        let ws = reach(&[
            (60.0, false),
            (50.0, true),
            (40.0, true),
            (30.0, true),
            (5.0, true),
        ]);
        let plan = replan(&ws, &p, None);
        assert_eq!(
            plan.chains,
            vec![
                vec!["w00".to_string(), "w03".into()],
                vec!["w01".to_string()],
                vec!["w02".to_string()],
            ]
        );
        // Below `exclude_below` stays fetch-only whatever its reachability.
        assert_eq!(plan.fetch_only, ["w04"]);
        relay_only_are_tails(&plan, &ws);
    }

    #[test]
    fn relay_only_workers_never_forward_in_any_mix() {
        // Every mix of up to 8 workers (bit k: worker k is relay-only), chains 1..=4.
        for n in 1..=8usize {
            for mask in 0..(1u32 << n) {
                for learner_mbps in [100.0, 200.0, 400.0] {
                    let p = PlanParams {
                        learner_mbps,
                        ..PlanParams::default()
                    };
                    let ws: Vec<(String, f64, bool)> = (0..n)
                        .map(|k| (format!("w{k}"), 20.0 + 7.0 * k as f64, mask >> k & 1 == 1))
                        .collect();
                    let plan = replan(&ws, &p, None);
                    relay_only_are_tails(&plan, &ws);
                    // Everyone is placed exactly once.
                    let placed =
                        plan.chains.iter().map(Vec::len).sum::<usize>() + plan.fetch_only.len();
                    assert_eq!(placed, n);
                    assert!(plan.chains.len() <= n_chains(learner_mbps, p.worker_mbps));
                }
            }
        }
    }

    #[test]
    fn chain_count_follows_the_uplink_ratio() {
        assert_eq!(n_chains(300.0, 100.0), 3);
        assert_eq!(n_chains(299.0, 100.0), 2);
        assert_eq!(n_chains(50.0, 100.0), 1, "at least one chain");
        assert_eq!(n_chains(300.0, 0.0), 1);
        assert_eq!(n_chains(f64::NAN, 100.0), 1);
    }

    #[test]
    fn best_workers_are_first_hops_and_the_rest_round_robin() {
        // Scores: w00..w07 = 90, 80, …, 20 (w07 = 20 is degraded with the default 40).
        let ws = workers(&[90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 42.0, 20.0]);
        let plan = plan_chains(&ws, &PlanParams::default());
        let names = |c: &Vec<String>| c.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        let got: Vec<String> = plan.chains.iter().map(names).collect();
        assert_eq!(got, ["w00,w03,w06", "w01,w04,w07", "w02,w05"]);
        assert!(plan.fetch_only.is_empty());
        assert_eq!(plan.max_len(), 3);
        assert_eq!(
            plan.placement(&"w04".to_string()),
            Some(Placement::Chain {
                chain: 1,
                position: 1,
                parent: Some("w01".into()),
                child: Some("w07".into())
            })
        );
        assert_eq!(
            plan.placement(&"w00".to_string()),
            Some(Placement::Chain {
                chain: 0,
                position: 0,
                parent: None,
                child: Some("w03".into())
            })
        );
    }

    #[test]
    fn degraded_workers_go_to_the_tails_and_failed_ones_out_of_forwarding() {
        // w00 has the best raw rank but is degraded (30 < 40); w01 is excluded (5 ≤ 10).
        let ws = workers(&[30.0, 5.0, 90.0, 80.0, 70.0, 60.0]);
        let plan = plan_chains(&ws, &PlanParams::default());
        assert_eq!(plan.fetch_only, ["w01"]);
        assert_eq!(plan.chains[0], ["w02", "w05"]);
        assert_eq!(
            plan.chains[1],
            ["w03", "w00"],
            "the degraded worker lands at a tail"
        );
        assert_eq!(plan.chains[2], ["w04"]);
        assert_eq!(
            plan.placement(&"w01".to_string()),
            Some(Placement::FetchOnly)
        );
    }

    #[test]
    fn fewer_workers_than_chains() {
        let plan = plan_chains(&workers(&[50.0, 60.0]), &PlanParams::default());
        assert_eq!(
            plan.chains,
            [vec!["w01".to_string()], vec!["w00".to_string()]]
        );
        let empty: ChainPlan<String> = plan_chains(&[], &PlanParams::default());
        assert!(empty.chains.is_empty() && empty.max_len() == 0);
    }

    #[test]
    fn ties_are_broken_by_peer_id_so_every_node_agrees() {
        let a = plan_chains(&workers(&[50.0; 5]), &PlanParams::default());
        let mut shuffled = workers(&[50.0; 5]);
        shuffled.reverse();
        assert_eq!(plan_chains(&shuffled, &PlanParams::default()), a);
    }

    #[test]
    fn excising_a_forwarder_reattaches_its_tail_to_its_parent() {
        let ws = workers(&[90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 42.0]);
        let mut plan = plan_chains(
            &ws,
            &PlanParams {
                learner_mbps: 100.0,
                ..Default::default()
            },
        );
        assert_eq!(
            plan.chains[0],
            ["w00", "w01", "w02", "w03", "w04", "w05", "w06"]
        );
        assert!(plan.excise(&"w02".to_string()));
        assert_eq!(plan.parents()[&"w03".to_string()], Some("w01".to_string()));
        assert!(plan.excise(&"w00".to_string()));
        assert_eq!(
            plan.parents()[&"w01".to_string()],
            None,
            "a first hop's child now hears from the learner"
        );
        assert!(!plan.excise(&"nobody".to_string()));
        for p in ["w01", "w03", "w04", "w05"] {
            plan.excise(&p.to_string());
        }
        assert!(plan.excise(&"w06".to_string()));
        assert!(plan.chains.is_empty());
    }

    fn chain_names(plan: &ChainPlan<String>) -> Vec<String> {
        plan.chains.iter().map(|c| c.join(",")).collect()
    }

    #[test]
    fn the_previous_order_stands_while_scores_move_within_the_margin() {
        let p = PlanParams::default();
        let before = direct(&[90.0, 89.0, 88.0, 87.0, 86.0, 85.0, 84.0, 83.0]);
        let prev = replan(&before, &p, None);
        assert_eq!(
            chain_names(&prev),
            ["w00,w03,w06", "w01,w04,w07", "w02,w05"]
        );
        // Every score moves by up to 4 points, reversing the order.
        let after = direct(&[86.0, 86.5, 87.0, 87.5, 88.0, 88.5, 89.0, 89.5]);
        assert_ne!(replan(&after, &p, None), prev, "a fresh plan would reorder");
        assert_eq!(replan(&after, &p, Some(&prev)), prev);
        // The plan's own rank order reproduces it.
        assert_eq!(
            prev.rank_order(),
            ["w00", "w01", "w02", "w03", "w04", "w05", "w06", "w07"]
        );
    }

    #[test]
    fn a_clear_overtake_or_a_class_change_reorders() {
        let p = PlanParams::default();
        let scores = [90.0, 89.0, 88.0, 87.0, 86.0, 85.0];
        let prev = replan(&direct(&scores), &p, None);
        assert_eq!(chain_names(&prev), ["w00,w03", "w01,w04", "w02,w05"]);
        // w05 now outscores everyone before it by more than the margin: it leads; w01 fell
        // to degraded: it goes to the last place; the others keep their order.
        let mut now = scores;
        now[5] = 96.0;
        now[1] = 35.0;
        let next = replan(&direct(&now), &p, Some(&prev));
        assert_eq!(chain_names(&next), ["w05,w03", "w00,w04", "w02,w01"]);
        // A rise to the top score that stays within the margin of every worker before it
        // (the lowest of them, w04, has 86) does not move it.
        let mut now = scores;
        now[5] = 86.0 + REPLAN_MARGIN - 0.5;
        assert_eq!(replan(&direct(&now), &p, Some(&prev)), prev);
    }

    #[test]
    fn newcomers_and_departures_keep_the_others_in_order() {
        let p = PlanParams::default();
        let prev = replan(&direct(&[90.0, 85.0, 80.0, 75.0]), &p, None);
        assert_eq!(chain_names(&prev), ["w00,w03", "w01", "w02"]);
        // w01 left; w04 (best score) and w05 (worst, relay-only) joined.
        let now = reach(&[
            (88.0, false),
            (0.0, false),
            (82.0, false),
            (77.0, false),
            (99.0, false),
            (70.0, true),
        ]);
        let now: Vec<_> = now.into_iter().filter(|w| w.0 != "w01").collect();
        let next = replan(&now, &p, Some(&prev));
        // w04 outscores everyone by more than the margin and leads; w00, w02, w03 follow in
        // their old order; the relay-only newcomer ends the shortest chain.
        assert_eq!(chain_names(&next), ["w04,w03", "w00,w05", "w02"]);
        relay_only_are_tails(&next, &now);
    }

    #[test]
    fn bounds_match_the_paper_formulas() {
        // M = 64 MB, c = 1 MB, B̂w = 100 Mbit/s (12.5 MB/s): M/B̂w = 5.12 s; L = 3 adds 2·0.08 s.
        let m = 64e6;
        assert!((chain_bound_s(m, 1e6, 100.0, 3) - (5.12 + 0.16)).abs() < 1e-9);
        // Star with 8 workers over 300 Mbit/s: 8·64e6/37.5e6 = 13.653 s.
        assert!((star_bound_s(m, 100.0, 300.0, 8) - 8.0 * m / 37.5e6).abs() < 1e-9);
        assert!((star_bound_s(m, 100.0, 300.0, 1) - 5.12).abs() < 1e-9);
    }

    #[test]
    fn a_standing_plan_is_due_only_between_versions_and_for_new_pairs() {
        let plan = ChainPlan {
            chains: vec![vec!["a", "b"], vec!["c"]],
            fetch_only: vec!["d"],
        };
        let planned = plan.members();
        assert_eq!(planned, BTreeSet::from(["a", "b", "c", "d"]));
        let all = |v: Option<u64>| vec![("a", v), ("b", v), ("c", v), ("d", v)];
        let due = |active: &[(&str, Option<u64>)], redraw: bool| {
            standing_plan_due(Some(&planned), active, Some(3), redraw)
        };
        // The workers the plan was made for, same seats: nothing to announce.
        assert!(!due(&all(Some(3)), false));
        // The next version starts a plan epoch (new seats, new pairs): due.
        assert!(due(&all(Some(3)), true));
        // A worker joined and holds the published version (it caught up): due.
        let mut joined = all(Some(3));
        joined.push(("e", Some(3)));
        assert!(due(&joined, false));
        // ... but not while any active worker still waits for it, new seats or not: the new
        // plan would replace the one its push runs on.
        joined[4].1 = Some(2);
        assert!(!due(&joined, false));
        assert!(!due(&joined, true));
        joined[4].1 = None;
        assert!(!due(&joined, false));
        // A worker left: due.
        assert!(due(&all(Some(3))[..3], false));
        // The first workers, before any plan; with nothing published, nothing is in flight.
        assert!(standing_plan_due(None, &all(None), None, false));
        assert!(standing_plan_due(None, &all(Some(0)), Some(0), false));
        // No worker: nothing to plan for.
        assert!(!standing_plan_due::<&str>(None, &[], Some(0), true));
    }

    #[test]
    fn nothing_is_in_flight_once_every_worker_holds_the_newest_version() {
        assert!(nothing_in_flight(&[], Some(4)));
        assert!(nothing_in_flight(&[None, Some(1)], None));
        assert!(nothing_in_flight(&[Some(4), Some(5)], Some(4)));
        // Stricter than a T_bcast measurement's ⌈n/γ⌉: one worker short is in flight.
        let ten_of_eleven: Vec<Option<u64>> =
            (0..11).map(|i| Some(if i == 0 { 3 } else { 4 })).collect();
        assert!(crate::capacity::broadcast_done(&ten_of_eleven, 4));
        assert!(!nothing_in_flight(&ten_of_eleven, Some(4)));
    }
}
