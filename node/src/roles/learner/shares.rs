//! The learner's shares (`docs/security.md`, "Probation and admission"): how the rules of
//! `control::admission` meet the buffer — which buffered groups count towards the puller's
//! target (those a batch composed under the share quota could use), how much room each
//! worker has left for its next pull, and the composition of each training batch.
//!
//! Owns: reading the buffer by producer and applying the quotas. Must not touch: the rules
//! (`control::admission`), the pull protocol or the training step.

use std::collections::HashMap;

use control::admission::{batch_quota, compose_batch, pull_share, Candidate, ShareCaps};
use learner::Pipeline;
use storage::TrajectoryGroup;

/// Groups of the buffer scanned at most per look (a buffer holds a few batches).
pub(super) const SCAN_LIMIT: usize = 4096;

/// The buffer as the puller sees it: per producer, and what a batch of `target` could use.
#[derive(Debug, Default)]
pub(super) struct BufferView {
    /// Buffered groups (from the floor of the next step) per producer.
    pub by_producer: HashMap<String, u64>,
    /// Of those, the groups of producers on probation.
    pub probation: u64,
    /// Groups a composition of `target` under the share quota would take.
    pub usable: u64,
}

/// Candidates of a composition: producers numbered in order of appearance.
pub(super) fn candidates<'a>(
    groups: impl Iterator<Item = &'a TrajectoryGroup>,
    pipeline: &Pipeline,
    index: &mut HashMap<String, usize>,
) -> Vec<Candidate> {
    groups
        .map(|g| {
            let next = index.len();
            let peer = *index.entry(g.producer.clone()).or_insert(next);
            Candidate {
                peer,
                probation: pipeline.on_probation(&g.producer),
            }
        })
        .collect()
}

/// Distinct established (past probation) producers among `c`.
pub(super) fn established_offering(c: &[Candidate]) -> usize {
    let mut peers: Vec<usize> = c.iter().filter(|c| !c.probation).map(|c| c.peer).collect();
    peers.sort_unstable();
    peers.dedup();
    peers.len()
}

/// Reads `groups` (the buffered ones, newest first) into a [`BufferView`] for a buffer of
/// `target` groups.
pub(super) fn view(
    groups: &[TrajectoryGroup],
    pipeline: &Pipeline,
    caps: ShareCaps,
    target: u64,
    established_active: usize,
) -> BufferView {
    let mut index = HashMap::new();
    let cands = candidates(groups.iter(), pipeline, &mut index);
    let quota = batch_quota(
        target as usize,
        caps,
        established_active,
        established_offering(&cands),
    );
    let usable = compose_batch(&cands, target as usize, quota, &[]).len() as u64;
    let mut out = BufferView {
        usable,
        ..BufferView::default()
    };
    for (g, c) in groups.iter().zip(&cands) {
        *out.by_producer.entry(g.producer.clone()).or_default() += 1;
        out.probation += u64::from(c.probation);
    }
    out
}

/// What the next pull may ask of each idle worker: its ledger credit, cut to its room in the
/// buffer ([`pull_share`] less what it has buffered), and the probation workers together to
/// the probation share of the buffer (unless no established worker is active). `idle` is
/// `(peer, credit, on probation)`; `active` the number of admitted active workers.
/// Returns the caps, in order, and whether each was cut by the share.
pub(super) fn pull_caps(
    idle: &[(String, u64, bool)],
    buffered: &BufferView,
    probation_in_flight: u64,
    caps: ShareCaps,
    target: u64,
    active: usize,
    established_active: usize,
) -> Vec<(u64, bool)> {
    let share = pull_share(target, caps.max_peer_share, active);
    let mut probation_room = if established_active == 0 {
        u64::MAX
    } else {
        let p = (caps.probation_share.clamp(0.0, 1.0) * target as f64).floor() as u64;
        p.max(1)
            .saturating_sub(buffered.probation)
            .saturating_sub(probation_in_flight)
    };
    idle.iter()
        .map(|(peer, credit, probation)| {
            let held = buffered.by_producer.get(peer).copied().unwrap_or(0);
            let room = share.saturating_sub(held);
            let mut cap = (*credit).min(room);
            if *probation {
                cap = cap.min(probation_room);
                probation_room -= cap.min(probation_room);
            }
            (cap, cap < *credit)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::record::{testing::group, GroupLimits};

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
        let v = view(&groups, &p, caps, 8, 2);
        // Quota for 8: 4 per worker; a's other 4 are not usable.
        assert_eq!((v.usable, v.by_producer["a"], v.probation), (5, 8, 0));
        let idle = vec![("a".to_string(), 8, false), ("b".to_string(), 8, false)];
        let c = pull_caps(&idle, &v, 0, caps, 8, 2, 2);
        assert_eq!(c, vec![(0, true), (3, true)]);
    }

    #[test]
    fn probation_workers_share_one_room_unless_nobody_is_established() {
        let p = pipeline(&["a"]);
        let caps = ShareCaps::default();
        let groups = vec![by("new1", 1)];
        let v = view(&groups, &p, caps, 8, 1);
        assert_eq!(v.probation, 1);
        let idle = vec![
            ("new1".to_string(), 1, true),
            ("new2".to_string(), 1, true),
            ("new3".to_string(), 1, true),
            ("a".to_string(), 8, false),
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
}
