//! Chain seats (`docs/broadcast.md`, "Seats"): which worker sits where in the learner's plan
//! for one version, on top of the ranking rules of [`crate::plan`].
//!
//! **No seat is permanent.** Workers of equal score are ranked by peer id, and a plan keeps the
//! previous order while scores move within [`crate::plan::REPLAN_MARGIN`]: left alone, whoever
//! has the lowest peer id among equals holds the head of a chain for the whole run — by luck
//! of its key, or by grinding keys for it (a silent forwarder at a chain's head starves the
//! chain). So the learner re-draws the seats at the first version of every *plan epoch*
//! ([`PlanParams::epoch_versions`] versions; [`EPOCH_VERSIONS`] by default): workers are
//! ranked by the plan's rules, cut into bands of similar score (each band holds the workers
//! within [`DRAW_MARGIN`] of its best one, of the same class), and each band is shuffled with a
//! seed only the learner knows ([`drawn_order`]) — and then ordered by when the worker last
//! had a child in a plan, least recently (or never) first, so that forwarding seats rotate
//! and every worker is seen forwarding every few epochs (a tail forwards to nobody, and a
//! worker that never forwards can never be caught not forwarding).
//! Within an epoch the order stands as before, so parent–child pairs and their push sessions
//! survive score noise. Why whole epochs and not every version: a new pair starts cold
//! (`docs/netlab.md`, "Push sessions").
//!
//! **Accountability** (`crate::forwarding`): workers found slow are *demoted* (ranked after
//! every other forwarder, so they end chains), workers found silent are *excluded* (fetch-only
//! for the run), and pairs under suspicion are *separated*: no plan seats the child under
//! that parent ([`separate`] swaps the child with another worker, or makes it fetch-only
//! when no seat is left).
//!
//! Owns: the draw, the separation rule and the assembly of a plan from them ([`seat`]).
//! Must not touch: the ranking rules themselves ([`crate::plan`]), who is at fault
//! ([`crate::forwarding`]), where the seed comes from (the learner's key, `dissemination`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::plan::{replan_after, ChainPlan, PlanParams, REPLAN_MARGIN};

/// Score points within which workers count as similar for a draw: 20, wider than the plan's
/// [`REPLAN_MARGIN`]. Scores spread with a worker's record as much as with its speed — the
/// Stability term alone (15 points) separates a worker with ten judged transfers from one
/// with three — and a band as narrow as the margin left the workers the plan measured least
/// (a chain's tail forwards nothing) at the tails for good. Twenty points still keep a worker
/// more than a factor of ten slower than another (Speed is 10 points per decade) from being
/// drawn past it by chance alone.
pub const DRAW_MARGIN: f64 = 20.0;

/// Default versions per plan epoch (defined with [`PlanParams`]).
pub use crate::plan::EPOCH_VERSIONS;

/// The plan epoch of `version`.
pub fn epoch(version: u64, epoch_versions: u64) -> u64 {
    version / epoch_versions.max(1)
}

/// Whether the plan for `version` re-draws its seats: the first plan, or the first of a new
/// epoch after the previous plan's version `prev`.
pub fn redraws(version: u64, prev: Option<u64>, epoch_versions: u64) -> bool {
    prev.is_none_or(|p| epoch(p, epoch_versions) != epoch(version, epoch_versions))
}

/// What the learner adds to the ranking rules for one plan.
#[derive(Debug, Clone)]
pub struct Seating<P> {
    /// `Some(seed)`: re-draw the seats ([`drawn_order`]); `None`: keep the previous order.
    pub redraw: Option<u64>,
    /// `(parent, child)` pairs no plan may seat.
    pub separated: Vec<(P, P)>,
    /// Ranked after every other forwarder.
    pub demoted: BTreeSet<P>,
    /// Fetch-only whatever their score.
    pub excluded: BTreeSet<P>,
    /// Parents under suspicion: each gets a seat with a child when one can be had
    /// ([`give_children`]).
    pub suspects: BTreeSet<P>,
    /// The version of each worker's newest plan seat with a child (absent: never): a draw
    /// puts the least recently seated first in their band.
    pub last_parent: BTreeMap<P, u64>,
}

impl<P> Default for Seating<P> {
    fn default() -> Self {
        Seating {
            redraw: None,
            separated: Vec::new(),
            demoted: BTreeSet::new(),
            excluded: BTreeSet::new(),
            suspects: BTreeSet::new(),
            last_parent: BTreeMap::new(),
        }
    }
}

/// The plan for `workers` (`(peer, score, relay_only)`) after `prev`, with `s` applied
/// (module docs). Without any of it this is [`crate::plan::replan`].
pub fn seat<P: Clone + Ord + std::hash::Hash>(
    workers: &[(P, f64, bool)],
    params: &PlanParams,
    prev: Option<&ChainPlan<P>>,
    s: &Seating<P>,
) -> ChainPlan<P> {
    let (out, live): (Vec<_>, Vec<_>) = workers
        .iter()
        .cloned()
        .partition(|w| s.excluded.contains(&w.0));
    let order = match s.redraw {
        Some(seed) => drawn_order(&live, params, seed, &s.last_parent),
        None => prev.map(ChainPlan::rank_order).unwrap_or_default(),
    };
    let margin = if s.redraw.is_some() {
        DRAW_MARGIN
    } else {
        REPLAN_MARGIN
    };
    let mut plan = replan_after(&live, params, &order, &s.demoted, margin);
    let relay_only: HashSet<P> = live.iter().filter(|w| w.2).map(|w| w.0.clone()).collect();
    give_children(&mut plan, &s.suspects, &relay_only);
    separate(&mut plan, &s.separated, &relay_only);
    plan.fetch_only.extend(out.into_iter().map(|w| w.0));
    plan.fetch_only.sort();
    plan
}

/// A seeded rank order (module docs): the plan's rule-2 order (class, then score, then peer
/// id), cut into bands of one class whose scores lie within [`DRAW_MARGIN`] of the band's
/// best, each band shuffled by `seed` and then stably sorted by `last_parent` (never seated
/// with a child first, then the least recently). Given to the ranking as the previous order,
/// it stands: no worker of a band outscores another of it by more than the margin.
pub fn drawn_order<P: Clone + Ord>(
    workers: &[(P, f64, bool)],
    params: &PlanParams,
    seed: u64,
    last_parent: &BTreeMap<P, u64>,
) -> Vec<P> {
    let class = |score: f64| u8::from(score < params.degraded_below);
    let mut ws: Vec<(P, f64)> = workers.iter().map(|w| (w.0.clone(), w.1)).collect();
    ws.sort_by(|a, b| {
        class(a.1)
            .cmp(&class(b.1))
            .then(b.1.total_cmp(&a.1))
            .then(a.0.cmp(&b.0))
    });
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(ws.len());
    let mut i = 0;
    while i < ws.len() {
        let (top, c) = (ws[i].1, class(ws[i].1));
        let end = (i..ws.len())
            .find(|&j| class(ws[j].1) != c || ws[j].1 < top - DRAW_MARGIN)
            .unwrap_or(ws.len());
        let mut band: Vec<P> = ws[i..end].iter().map(|w| w.0.clone()).collect();
        // Fisher–Yates, then the least recently seated with a child first (a stable sort:
        // the shuffle orders the ties).
        for k in (1..band.len()).rev() {
            let j = (rng.next() % (k as u64 + 1)) as usize;
            band.swap(k, j);
        }
        band.sort_by_key(|p| last_parent.get(p).copied());
        out.extend(band);
        i = end;
    }
    out
}

/// Gives every suspect parent a child: one at a chain's tail swaps places with the nearest
/// worker before it in rank order that has a child (not another suspect, never a relay-only
/// one). Attribution moves the *child* of a suspect edge; the parent must have another child
/// for its next versions to tell whether it is at fault. If the swap seats it over a child it
/// is separated from, [`separate`] — which runs next and never swaps a child with its own
/// parent — moves that child on.
pub fn give_children<P: Clone + Ord + std::hash::Hash>(
    plan: &mut ChainPlan<P>,
    suspects: &BTreeSet<P>,
    relay_only: &HashSet<P>,
) {
    for s in suspects {
        if relay_only.contains(s) {
            continue;
        }
        let Some((j, k)) = (0..plan.chains.len()).find_map(|j| {
            let k = plan.chains[j].iter().position(|x| x == s)?;
            Some((j, k))
        }) else {
            continue;
        };
        if k + 1 < plan.chains[j].len() {
            continue;
        }
        let seats = rank_seats(plan);
        let at = seats.iter().position(|&x| x == (j, k)).unwrap_or(0);
        let swap = seats[..at].iter().rev().copied().find(|&(j2, k2)| {
            let other = &plan.chains[j2][k2];
            k2 + 1 < plan.chains[j2].len()
                && !suspects.contains(other)
                && !relay_only.contains(other)
        });
        if let Some((j2, k2)) = swap {
            let other = std::mem::replace(&mut plan.chains[j2][k2], s.clone());
            plan.chains[j][k] = other;
        }
    }
}

/// Every seat of `plan` in rank order: first hops, then second hops, and so on.
fn rank_seats<P: Clone + Eq + std::hash::Hash>(plan: &ChainPlan<P>) -> Vec<(usize, usize)> {
    (0..plan.max_len())
        .flat_map(|k| (0..plan.chains.len()).map(move |j| (j, k)))
        .filter(|&(j, k)| k < plan.chains[j].len())
        .collect()
}

/// Seats no child under a parent it is separated from: the child swaps places with the nearest
/// worker after it in rank order (else before it; never its parent there, never a relay-only
/// one) with which neither seat is separated — the parent keeps its seat and gets another
/// child; when there is none the child becomes fetch-only (it fetches from holders; nobody
/// waits for it).
pub fn separate<P: Clone + Ord + std::hash::Hash>(
    plan: &mut ChainPlan<P>,
    pairs: &[(P, P)],
    relay_only: &HashSet<P>,
) {
    if pairs.is_empty() {
        return;
    }
    let bad: HashSet<(P, P)> = pairs.iter().cloned().collect();
    let parent_of = |plan: &ChainPlan<P>, j: usize, k: usize| {
        k.checked_sub(1).map(|i| plan.chains[j][i].clone())
    };
    // Whether the worker `w` may sit at (j, k): neither its parent there nor its child there
    // (the worker now at k + 1, unless that is `w`'s swap partner) is separated from it.
    let fits = |plan: &ChainPlan<P>, w: &P, j: usize, k: usize, partner: &P| {
        let parent_ok = parent_of(plan, j, k)
            .map(|p| if &p == w { partner.clone() } else { p })
            .is_none_or(|p| !bad.contains(&(p, w.clone())));
        let child_ok = plan.chains[j]
            .get(k + 1)
            .map(|c| if c == w { partner.clone() } else { c.clone() })
            .is_none_or(|c| !bad.contains(&(w.clone(), c)));
        parent_ok && child_ok
    };
    // A bounded number of passes: every swap removes at least one violation.
    for _ in 0..=plan.chains.iter().map(Vec::len).sum::<usize>() {
        let violation = (0..plan.chains.len()).find_map(|j| {
            (1..plan.chains[j].len()).find_map(|k| {
                let pair = (plan.chains[j][k - 1].clone(), plan.chains[j][k].clone());
                bad.contains(&pair).then_some((j, k))
            })
        });
        let Some((j, k)) = violation else { return };
        let child = plan.chains[j][k].clone();
        // Seats in rank order, from the child's own on: first those after it (the suspect
        // child moves back, not up), then those before it, nearest first; never its parent's
        // (a parent and child that trade places leave the parent without a child to tell).
        let mut seats = rank_seats(plan);
        seats.retain(|&s| s != (j, k - 1));
        let at = seats.iter().position(|&s| s == (j, k)).unwrap_or(0);
        let mut order = seats[at + 1..]
            .iter()
            .chain(seats[..at].iter().rev())
            .copied();
        let swap = order.find(|&(j2, k2)| {
            let other = plan.chains[j2][k2].clone();
            !relay_only.contains(&other)
                && !relay_only.contains(&child)
                && fits(plan, &child, j2, k2, &other)
                && fits(plan, &other, j, k, &child)
        });
        match swap {
            Some((j2, k2)) => {
                let other = std::mem::replace(&mut plan.chains[j2][k2], child);
                plan.chains[j][k] = other;
            }
            None => {
                // No seat left for it: fetch-only. Its child moves up to its parent.
                plan.chains[j].remove(k);
                plan.fetch_only.push(child);
            }
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed seeded generator, enough to
/// shuffle a band; the seed's secrecy, not the generator, is what makes the draw unpredictable.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
#[path = "seats_tests.rs"]
mod tests;
