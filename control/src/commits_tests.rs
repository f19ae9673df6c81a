use super::*;

fn e(version: u64, h: u8) -> CommitEntry {
    CommitEntry {
        version,
        commitment: Commitment::Hash([h; 32]),
    }
}

fn abandoned(version: u64) -> CommitEntry {
    CommitEntry {
        version,
        commitment: Commitment::Abandoned,
    }
}

fn d(seq: u64, version: u64, h: u8) -> DeliveredGroup {
    DeliveredGroup {
        seq,
        version,
        hash: [h; 32],
    }
}

fn answer<'a>(
    asked: u64,
    v_min: u64,
    log_from: u64,
    log: &'a [CommitEntry],
    delivered: &'a [DeliveredGroup],
) -> Answer<'a> {
    Answer {
        asked,
        v_min,
        log_from,
        log,
        delivered,
        abandoning: Abandoning::Never,
    }
}

/// A book that met worker 1 already (first contact with an empty log at `from`).
fn met(from: u64) -> CommitBook<u32> {
    let mut b = CommitBook::new();
    assert_eq!(
        b.account(&1, &answer(1, 0, from, &[], &[])),
        Account::default()
    );
    assert_eq!(b.next(&1), Some(from));
    b
}

#[test]
fn first_contact_judges_nothing_and_sets_the_start() {
    let mut b = CommitBook::new();
    assert_eq!(b.next(&1), None);
    let log = [e(3, 1), e(3, 2)];
    let a = b.account(&1, &answer(4, 0, 10, &log, &[]));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(b.next(&1), Some(12));
    assert_eq!(b.outstanding(&1), 0);
}

#[test]
fn an_honest_worker_delivering_everything_is_never_struck() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1), e(6, 2)];
    let del = [d(2, 6, 2), d(1, 5, 1), d(0, 5, 0)];
    let a = b.account(&1, &answer(8, 5, 0, &log, &del));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(a.delivered, 3);
    assert_eq!(b.next(&1), Some(3));
    assert_eq!(b.outstanding(&1), 0);
}

#[test]
fn a_full_lease_leaves_the_older_numbers_outstanding_not_withheld() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1), e(6, 2), e(6, 3)];
    // Newest first, two asked: 3 and 2.
    let a = b.account(&1, &answer(2, 5, 0, &log, &[d(3, 6, 3), d(2, 6, 2)]));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(b.outstanding(&1), 2);
    // The window moves past version 5: the rest ages out, honestly.
    let a = b.account(&1, &answer(2, 6, 4, &[], &[]));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(a.stale, 2);
    assert_eq!(b.outstanding(&1), 0);
}

#[test]
fn honest_stale_entries_in_the_log_are_resolved_without_a_strike() {
    let mut b = met(0);
    let log = [
        CommitEntry {
            version: 2,
            commitment: Commitment::Omitted,
        },
        e(2, 1),
        e(7, 2),
    ];
    let a = b.account(&1, &answer(4, 7, 0, &log, &[d(2, 7, 2)]));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(a.stale, 2);
}

#[test]
fn a_short_lease_that_keeps_a_committed_group_back_is_withholding() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1), e(5, 2)];
    // Asked for 8, got two: number 1 (say, the one with an exact answer) was kept back.
    let a = b.account(&1, &answer(8, 5, 0, &log, &[d(2, 5, 2), d(0, 5, 0)]));
    assert_eq!(a.withheld, vec![1]);
    assert_eq!(a.strikes(), 1);
    // Struck once: it is resolved.
    assert_eq!(b.outstanding(&1), 0);
    let a = b.account(&1, &answer(8, 5, 3, &[], &[]));
    assert_eq!(a.strikes(), 0);
}

#[test]
fn an_empty_answer_with_committed_admissible_groups_is_withholding() {
    let mut b = met(0);
    let a = b.account(&1, &answer(4, 5, 0, &[e(5, 0), e(5, 1)], &[]));
    assert_eq!(a.withheld, vec![0, 1]);
}

#[test]
fn a_full_lease_that_skips_over_a_newer_group_is_withholding() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1), e(6, 2), e(6, 3)];
    // Two asked, two given, but 3 (the newest) was skipped for 1.
    let a = b.account(&1, &answer(2, 5, 0, &log, &[d(2, 6, 2), d(1, 5, 1)]));
    assert_eq!(a.withheld, vec![3]);
    assert_eq!(b.outstanding(&1), 1, "number 0 is older: still owed");
}

#[test]
fn a_log_that_skips_numbers_withholds_them() {
    let mut b = met(4);
    let a = b.account(&1, &answer(4, 0, 7, &[e(1, 7)], &[d(7, 1, 7)]));
    assert_eq!(a.withheld, vec![4, 5, 6]);
    assert_eq!(b.next(&1), Some(8));
}

#[test]
fn an_admissible_entry_without_a_hash_commits_to_nothing() {
    let mut b = met(0);
    let log = [CommitEntry {
        version: 5,
        commitment: Commitment::Omitted,
    }];
    let a = b.account(&1, &answer(4, 5, 0, &log, &[]));
    assert_eq!(a.withheld, vec![0]);
}

#[test]
fn delivered_groups_must_match_their_commitment() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1)];
    let a = b.account(
        &1,
        &answer(8, 5, 0, &log, &[d(0, 5, 9), d(1, 5, 1), d(2, 5, 2)]),
    );
    assert_eq!(a.mismatched, 1, "content other than committed");
    assert_eq!(a.uncommitted, 1, "number 2 was never committed");
    assert_eq!(a.delivered, 1);
    assert_eq!(a.strikes(), 2);
}

#[test]
fn a_lease_served_again_after_a_lost_ack_is_not_struck() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1)];
    let del = [d(1, 5, 1), d(0, 5, 0)];
    assert_eq!(b.account(&1, &answer(2, 5, 0, &log, &del)).strikes(), 0);
    // The ack was lost: the next pull (which supersedes the lease) gets them again.
    let a = b.account(&1, &answer(2, 5, 2, &[], &del));
    assert_eq!(a.strikes(), 0, "{a:?}");
}

#[test]
fn a_log_overlapping_what_is_known_is_not_read_twice() {
    let mut b = met(0);
    let log = [e(5, 0), e(5, 1)];
    assert_eq!(
        b.account(&1, &answer(2, 5, 0, &log, &[d(1, 5, 1), d(0, 5, 0)]))
            .strikes(),
        0
    );
    let a = b.account(&1, &answer(2, 5, 0, &log, &[]));
    assert_eq!(a.strikes(), 0, "{a:?}");
    assert_eq!(b.outstanding(&1), 0);
}

#[test]
fn workers_are_judged_independently() {
    let mut b = met(0);
    b.account(&2, &answer(1, 0, 0, &[], &[]));
    let a = b.account(&1, &answer(4, 5, 0, &[e(5, 0)], &[]));
    assert_eq!(a.withheld, vec![0]);
    let a = b.account(&2, &answer(4, 5, 0, &[e(5, 0)], &[d(0, 5, 0)]));
    assert_eq!(a.strikes(), 0);
    b.forget(&1);
    assert_eq!(b.next(&1), None);
}

proptest::proptest! {
    /// An honest worker — newest first, whole backlog on a short lease, stale entries pruned —
    /// is never struck, whatever the backlog, the ask and the window.
    #[test]
    fn an_honest_store_is_never_struck(
        rounds in proptest::collection::vec((0u64..6, 1u64..6, 0u64..3), 1..30),
    ) {
        let mut b = met(0);
        let (mut next, mut version, mut v_min) = (0u64, 0u64, 0u64);
        let mut stored: Vec<(u64, u64)> = Vec::new(); // (version, seq)
        let mut since = Vec::new();
        for (made, asked, step) in rounds {
            for _ in 0..made {
                stored.push((version, next));
                since.push(e(version, next as u8));
                next += 1;
            }
            version += step;
            v_min = v_min.max(version.saturating_sub(2));
            stored.retain(|(v, _)| *v >= v_min);
            stored.sort();
            let take = (asked as usize).min(stored.len());
            let lease: Vec<(u64, u64)> = stored.split_off(stored.len() - take);
            let del: Vec<DeliveredGroup> =
                lease.iter().rev().map(|&(v, s)| d(s, v, s as u8)).collect();
            let from = next - since.len() as u64;
            let a = b.account(&1, &answer(asked, v_min, from, &since, &del));
            proptest::prop_assert_eq!(a.strikes(), 0, "{:?}", a);
            since.clear();
        }
    }
}

#[test]
fn abandoned_numbers_are_honest_only_where_an_episode_can_fail_and_within_the_bound() {
    // A built-in task cannot fail: an abandoned admissible number is withheld.
    let mut b = met(0);
    let a = b.account(
        &1,
        &answer(4, 5, 0, &[abandoned(5), e(5, 1)], &[d(1, 5, 1)]),
    );
    assert_eq!(a.withheld, vec![0]);
    assert_eq!(a.abandoned, 0);
    // An external program: resolved without a strike; a stale abandoned entry is stale.
    let mut b = met(0);
    let up_to = Abandoning::UpTo {
        fraction: MAX_ABANDONED_FRACTION,
    };
    let log = [abandoned(2), abandoned(5), e(5, 1)];
    let a = b.account(
        &1,
        &Answer {
            abandoning: up_to,
            ..answer(4, 5, 0, &log, &[d(2, 5, 1)])
        },
    );
    assert_eq!((a.strikes(), a.abandoned, a.stale), (0, 1, 1), "{a:?}");
    assert_eq!(b.next(&1), Some(3));
    // A worker abandoning every number: the slack, then half of its admissible ones.
    let mut b = met(0);
    let log: Vec<CommitEntry> = (0..40).map(|_| abandoned(5)).collect();
    let a = b.account(
        &1,
        &Answer {
            abandoning: up_to,
            ..answer(4, 5, 0, &log, &[])
        },
    );
    // Never more than 4 + half of the 40: 24 resolved as abandoned, 16 withheld (from the
    // ninth on, every other one).
    assert_eq!(a.abandoned, 24, "{a:?}");
    assert_eq!(a.withheld.len(), 16);
    assert_eq!(&a.withheld[..3], [8, 10, 12]);
}
