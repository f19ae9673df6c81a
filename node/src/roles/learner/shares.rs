//! The learner's shares (`docs/security.md`, "Probation and admission"): how the rules of
//! `control::admission` meet the buffer — which buffered groups count towards the puller's
//! target (those a batch composed under the share quota could use), how much room each
//! worker has left for its next pull, and the composition of each training batch.
//!
//! Owns: reading the buffer by producer and applying the quotas. Must not touch: the rules
//! (`control::admission`), the pull protocol or the training step.

use std::collections::HashMap;

use control::admission::{pull_share, Candidate, ShareCaps};
use learner::Pipeline;
use storage::TrajectoryGroup;

/// Groups of the buffer scanned at most per look (a buffer holds a few batches).
pub(super) const SCAN_LIMIT: usize = 4096;

/// The buffer as the puller sees it: per producer, and what counts towards its target.
#[derive(Debug, Default)]
pub(super) struct BufferView {
    /// Buffered groups (from the floor of the next step) per producer.
    pub by_producer: HashMap<String, u64>,
    /// Of those, the groups of producers on probation.
    pub probation: u64,
    /// Groups that count towards the target: each worker's up to its share, the probation
    /// workers' together up to theirs.
    pub usable: u64,
}

/// Candidates of a composition: producers numbered in order of appearance, each with its
/// count among the recently trained groups (`recent`, by producer).
pub(super) fn candidates<'a>(
    groups: impl Iterator<Item = &'a TrajectoryGroup>,
    pipeline: &Pipeline,
    recent: &HashMap<&str, u32>,
    index: &mut HashMap<String, usize>,
) -> Vec<Candidate> {
    groups
        .map(|g| {
            let next = index.len();
            let peer = *index.entry(g.producer.clone()).or_insert(next);
            Candidate {
                peer,
                probation: pipeline.on_probation(&g.producer),
                recent: recent.get(g.producer.as_str()).copied().unwrap_or(0),
            }
        })
        .collect()
}

/// Groups per producer among `producers` (the recently trained groups' producers).
pub(super) fn recent_counts(producers: &std::collections::VecDeque<String>) -> HashMap<&str, u32> {
    let mut n = HashMap::new();
    for p in producers {
        *n.entry(p.as_str()).or_default() += 1;
    }
    n
}

/// Distinct established (past probation) producers among `c`.
pub(super) fn established_offering(c: &[Candidate]) -> usize {
    let mut peers: Vec<usize> = c.iter().filter(|c| !c.probation).map(|c| c.peer).collect();
    peers.sort_unstable();
    peers.dedup();
    peers.len()
}

/// The probation part of a buffer of `target` groups: ⌊probation_share·target⌋ (at least 1)
/// once an established worker is active, else all of it.
fn probation_room(caps: ShareCaps, target: u64, established_active: usize) -> u64 {
    if established_active == 0 {
        return target;
    }
    let share = if caps.probation_share.is_finite() {
        caps.probation_share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    ((share * target as f64).floor() as u64).max(1)
}

/// Reads `groups` (the buffered ones) into a [`BufferView`] for a buffer of `target` groups
/// shared by `active` workers: each worker's groups count up to its share of the buffer
/// ([`pull_share`]), the probation workers' together up to the probation part. What a worker
/// holds beyond its share does not count towards the target, so the puller keeps asking the
/// others (a worker with a large backlog cannot fill the buffer and starve new workers of the
/// pulls that verify them).
pub(super) fn view(
    groups: &[TrajectoryGroup],
    pipeline: &Pipeline,
    caps: ShareCaps,
    target: u64,
    active: usize,
    established_active: usize,
) -> BufferView {
    let mut out = BufferView::default();
    let mut probation_peers = HashMap::new();
    for g in groups {
        *out.by_producer.entry(g.producer.clone()).or_default() += 1;
        if pipeline.on_probation(&g.producer) {
            out.probation += 1;
            probation_peers.insert(g.producer.clone(), ());
        }
    }
    let share = pull_share(target, caps.max_peer_share, active);
    let (mut established, mut probation) = (0u64, 0u64);
    for (peer, n) in &out.by_producer {
        if probation_peers.contains_key(peer) {
            probation += (*n).min(share);
        } else {
            established += (*n).min(share);
        }
    }
    out.usable = established + probation.min(probation_room(caps, target, established_active));
    out
}

/// An idle worker (no pull in flight) as [`pull_caps`] sees it.
#[derive(Debug, Clone)]
pub(super) struct Idle {
    pub(super) peer: String,
    /// Its ledger credit (`control::pulls::PullLedger::credit`).
    pub(super) credit: u64,
    pub(super) probation: bool,
    /// The groups it claims to hold (its heartbeat's `pending`).
    pub(super) claimed: u64,
}

/// What the next pull may ask of each idle worker: its ledger credit, cut to its room in the
/// buffer ([`pull_share`] less what it has buffered), and the probation workers together to
/// the probation share of the buffer (unless no established worker is active). `active` is
/// the number of admitted active workers. Returns the caps, in order, and whether each was
/// cut by the share.
///
/// The probation room goes to the probation workers that claim the most groups first. A
/// worker that claims none still has a credit of one (the ledger keeps probing it), so when
/// the room was handed out in the order of `idle`, workers claiming nothing took it from one
/// holding groups, in every round. Measured in `testnet faults` (2026-11-27): a standby worker
/// on probation and another claiming nothing took the whole room of 2, and a third, holding 4
/// groups, was never asked again after its first 7 — so it never left probation, and sat
/// paused for the whole run while the learner trained on the other workers alone.
pub(super) fn pull_caps(
    idle: &[Idle],
    buffered: &BufferView,
    probation_in_flight: u64,
    caps: ShareCaps,
    target: u64,
    active: usize,
    established_active: usize,
) -> Vec<(u64, bool)> {
    let share = pull_share(target, caps.max_peer_share, active);
    let mut probation_room = probation_room(caps, target, established_active)
        .saturating_sub(buffered.probation)
        .saturating_sub(probation_in_flight);
    let mut out: Vec<u64> = idle
        .iter()
        .map(|w| {
            let held = buffered.by_producer.get(&w.peer).copied().unwrap_or(0);
            w.credit.min(share.saturating_sub(held))
        })
        .collect();
    let mut probation: Vec<usize> = (0..idle.len()).filter(|&i| idle[i].probation).collect();
    // Most claimed first; a stable sort keeps the list's order among equal claims.
    probation.sort_by_key(|&i| std::cmp::Reverse(idle[i].claimed));
    for i in probation {
        out[i] = out[i].min(probation_room);
        probation_room -= out[i];
    }
    out.into_iter()
        .zip(idle)
        .map(|(cap, w)| (cap, cap < w.credit))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::record::{testing::group, GroupLimits};

    fn idle(peer: &str, credit: u64, probation: bool, claimed: u64) -> Idle {
        Idle {
            peer: peer.to_string(),
            credit,
            probation,
            claimed,
        }
    }

    fn by(producer: &str, seed: u64) -> TrajectoryGroup {
        TrajectoryGroup {
            producer: producer.into(),
            ..group(1, seed, 2, 3)
        }
    }

    /// A pipeline where `established` peers are past a probation of one group.
    fn pipeline(established: &[&str]) -> Pipeline {
        let p = Pipeline::with_probation(
            GroupLimits::PERMISSIVE,
            control::admission::ProbationParams {
                probation_groups: 1,
                probation_versions: 1,
                probation_secs: 0,
                ..Default::default()
            },
        );
        for (i, peer) in established.iter().enumerate() {
            p.check(peer, 0, &by(peer, i as u64)).unwrap();
        }
        p
    }

    #[test]
    fn a_dominant_workers_excess_does_not_count_and_it_gets_no_room() {
        let p = pipeline(&["a", "b"]);
        let mut groups: Vec<_> = (0..8).map(|s| by("a", s)).collect();
        groups.push(by("b", 9));
        let caps = ShareCaps::default();
        let v = view(&groups, &p, caps, 8, 2, 2);
        // Share of 8 for 2 workers: 4 each; a's other 4 do not count.
        assert_eq!((v.usable, v.by_producer["a"], v.probation), (5, 8, 0));
        let lone = view(&groups, &p, caps, 8, 1, 1);
        assert_eq!(lone.usable, 9, "a lone worker's groups all count");
        let idle = vec![idle("a", 8, false, 8), idle("b", 8, false, 8)];
        let c = pull_caps(&idle, &v, 0, caps, 8, 2, 2);
        assert_eq!(c, vec![(0, true), (3, true)]);
    }

    #[test]
    fn probation_workers_share_one_room_unless_nobody_is_established() {
        let p = pipeline(&["a"]);
        let caps = ShareCaps::default();
        let groups = vec![by("new1", 1), by("new2", 2), by("new2", 3)];
        let v = view(&groups, &p, caps, 8, 4, 1);
        assert_eq!(v.probation, 3);
        // Probation part of 8: 2 groups, all of new1's and new2's together.
        assert_eq!(v.usable, 2);
        let groups = vec![by("new1", 1)];
        let v = view(&groups, &p, caps, 8, 4, 1);
        assert_eq!(v.probation, 1);
        let idle = vec![
            idle("new1", 1, true, 1),
            idle("new2", 1, true, 1),
            idle("new3", 1, true, 1),
            idle("a", 8, false, 8),
        ];
        // Probation share of 8: 2 groups, one buffered: one more for all of them.
        let c = pull_caps(&idle, &v, 0, caps, 8, 4, 1);
        assert_eq!(c, vec![(1, false), (0, true), (0, true), (4, true)]);
        // Nobody established: no probation limit.
        let c = pull_caps(&idle, &v, 0, caps, 8, 4, 0);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 1, 1, 4]);
        // A lone worker may fill the buffer.
        let c = pull_caps(&idle[3..], &v, 0, caps, 8, 1, 1);
        assert_eq!(c, vec![(8, false)]);
    }

    #[test]
    fn the_probation_room_goes_first_to_who_holds_groups() {
        let p = pipeline(&["a"]);
        let caps = ShareCaps::default();
        let v = view(&[], &p, caps, 8, 3, 1);
        // As measured: a standby worker and a quiet one, both on probation and claiming
        // nothing (credit 1: the ledger probes), listed before one holding 4 groups.
        let idle = vec![
            idle("standby", 1, true, 0),
            idle("quiet", 1, true, 0),
            idle("holder", 2, true, 4),
            idle("a", 8, false, 8),
        ];
        // The room of 2 goes to the holder; handed out in list order it went to the other
        // two, in every round, and the holder was never asked.
        let c = pull_caps(&idle, &v, 0, caps, 8, 3, 1);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 0, 2, 4]);
        // What the holder does not need is left to the others, in list order.
        let mut small = idle.clone();
        small[2].credit = 1;
        let c = pull_caps(&small, &v, 0, caps, 8, 3, 1);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 0, 1, 4]);
    }
}
