use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::record::testing::group;

fn open() -> (tempfile::TempDir, TrajectoryStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = TrajectoryStore::open(&dir.path().join("t")).unwrap();
    (dir, store)
}

const TTL: Duration = Duration::from_secs(10);

#[test]
fn scans_are_oldest_version_first_then_arrival_order() {
    let (_d, s) = open();
    for (v, seed) in [(5, 1), (2, 2), (9, 3), (2, 4), (5, 5)] {
        s.put_group(&group(v, seed, 2, 3)).unwrap();
    }
    let got: Vec<(u64, String)> = s
        .scan(0, 100)
        .unwrap()
        .into_iter()
        .map(|(k, g)| (k.version, g.prompt_id))
        .collect();
    let want: Vec<(u64, String)> = [(2, "p2"), (2, "p4"), (5, "p1"), (5, "p5"), (9, "p3")]
        .iter()
        .map(|(v, p)| (*v, p.to_string()))
        .collect();
    assert_eq!(got, want);
    let from5: Vec<u64> = s
        .scan(5, 100)
        .unwrap()
        .iter()
        .map(|(k, _)| k.version)
        .collect();
    assert_eq!(from5, [5, 5, 9]);
    assert_eq!(s.scan(5, 1).unwrap().len(), 1);
}

#[test]
fn newest_first_leases_take_the_freshest_admissible_groups() {
    let (_d, s) = open();
    for (v, seed) in [(5, 1), (2, 2), (9, 3), (7, 4), (5, 5)] {
        s.put_group(&group(v, seed, 2, 3)).unwrap();
    }
    let l = s.lease_newest(3, 2, TTL).unwrap().unwrap();
    let got: Vec<u64> = l.groups.iter().map(|(k, _)| k.version).collect();
    assert_eq!(got, [9, 7]);
    // The next one skips what is leased and never goes below v_min.
    let l2 = s.lease_newest(3, 10, TTL).unwrap().unwrap();
    let got: Vec<u64> = l2.groups.iter().map(|(k, _)| k.version).collect();
    assert_eq!(got, [5, 5]);
    assert!(
        s.lease_newest(3, 10, TTL).unwrap().is_none(),
        "v2 is below v_min"
    );
    assert_eq!(
        s.lease_at(0, 10, TTL, crate::unix_ms())
            .unwrap()
            .unwrap()
            .groups
            .len(),
        1
    );
    s.check_invariant().unwrap();
}

#[test]
fn selected_leases_take_exactly_the_groups_picked_newest_first() {
    let (_d, s) = open();
    for (v, seed) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
        s.put_group(&group(v, seed, 2, 3)).unwrap();
    }
    let mut seen = Vec::new();
    let l = s
        .lease_selected(2, 10, TTL, |c| {
            seen = c.iter().map(|(k, _)| k.version).collect();
            vec![2, 0, 0, 99]
        })
        .unwrap()
        .unwrap();
    assert_eq!(seen, [4, 3, 2], "newest first, from v_min");
    let mut got: Vec<u64> = l.groups.iter().map(|(k, _)| k.version).collect();
    got.sort_unstable();
    assert_eq!(got, [2, 4], "duplicates and out-of-range indices ignored");
    // Leased groups are not offered again; nothing picked is no lease.
    let again = s.lease_selected(0, 10, TTL, |c| {
        assert_eq!(c.len(), 2);
        vec![]
    });
    assert!(again.unwrap().is_none());
    assert_eq!(s.ack(l.id).unwrap(), 2);
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn a_caught_producers_groups_are_removed_and_counted_as_rejected() {
    let (_d, s) = open();
    let by = |seed, producer: &str| TrajectoryGroup {
        producer: producer.into(),
        ..group(3, seed, 2, 3)
    };
    s.put_groups(&[by(1, "bad"), by(2, "good"), by(3, "bad"), by(4, "bad")])
        .unwrap();
    // One of its groups is out on a lease (a batch being gathered): removed too, and the
    // ack later counts only what is left.
    let l = s.lease(0, 1, TTL).unwrap().unwrap();
    assert_eq!(s.reject_producer("bad").unwrap(), 3);
    assert_eq!(s.reject_producer("bad").unwrap(), 0);
    let c = s.counters().unwrap();
    assert_eq!((c.rejected_stored, c.pending()), (3, 1));
    assert!(s.check_invariant().unwrap().holds());
    assert_eq!(s.ack(l.id).unwrap(), 0);
    let left: Vec<String> = s
        .scan(0, 10)
        .unwrap()
        .into_iter()
        .map(|(_, g)| g.producer)
        .collect();
    assert_eq!(left, ["good"]);
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn lease_ack_deletes_and_counts() {
    let (_d, s) = open();
    let batch: Vec<_> = (0..5).map(|i| group(1 + i / 3, i, 2, 3)).collect();
    s.put_groups(&batch).unwrap();
    let l1 = s.lease_at(0, 3, TTL, 1_000).unwrap().unwrap();
    assert_eq!(l1.groups.len(), 3);
    // Leased groups are not handed out again while the lease lives.
    let l2 = s.lease_at(0, 10, TTL, 1_000).unwrap().unwrap();
    assert_eq!(l2.groups.len(), 2);
    assert!(s.lease_at(0, 10, TTL, 1_000).unwrap().is_none());
    let ids1: BTreeSet<_> = l1.groups.iter().map(|(k, _)| *k).collect();
    let ids2: BTreeSet<_> = l2.groups.iter().map(|(k, _)| *k).collect();
    assert!(ids1.is_disjoint(&ids2));
    assert_eq!(s.ack(l1.id).unwrap(), 3);
    assert!(
        matches!(s.ack(l1.id), Err(StorageError::NotFound { .. })),
        "double ack"
    );
    let c = s.counters().unwrap();
    assert_eq!(
        (c.produced, c.leased, c.consumed, c.pending()),
        (5, 5, 3, 2)
    );
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn v_min_excludes_older_versions_from_leases() {
    let (_d, s) = open();
    s.put_group(&group(1, 1, 1, 1)).unwrap();
    s.put_group(&group(4, 2, 1, 1)).unwrap();
    let l = s.lease_at(3, 10, TTL, 0).unwrap().unwrap();
    assert_eq!(
        l.groups.iter().map(|(k, _)| k.version).collect::<Vec<_>>(),
        [4]
    );
}

#[test]
fn expired_leases_become_pullable_again() {
    let (_d, s) = open();
    s.put_group(&group(1, 1, 2, 2)).unwrap();
    let l1 = s
        .lease_at(0, 10, Duration::from_millis(500), 1_000)
        .unwrap()
        .unwrap();
    assert!(
        s.lease_at(0, 10, TTL, 1_499).unwrap().is_none(),
        "still leased"
    );
    let l2 = s.lease_at(0, 10, TTL, 1_500).unwrap().unwrap();
    assert_eq!(l2.groups[0].0, l1.groups[0].0);
    // The expired lease was reclaimed: acking it is refused and deletes nothing.
    assert!(matches!(s.ack(l1.id), Err(StorageError::NotFound { .. })));
    assert_eq!(s.pending().unwrap(), 1);
    assert_eq!(s.ack(l2.id).unwrap(), 1);
    assert_eq!(s.counters().unwrap().leased, 2);
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn released_leases_are_pullable_at_once() {
    let (_d, s) = open();
    s.put_group(&group(1, 1, 2, 2)).unwrap();
    let l = s.lease_at(0, 10, TTL, 0).unwrap().unwrap();
    s.release(l.id).unwrap();
    assert!(s.lease_at(0, 10, TTL, 0).unwrap().is_some());
}

#[test]
fn prune_counts_stale_groups_even_when_leased() {
    let (_d, s) = open();
    for v in 0..6 {
        s.put_group(&group(v, v, 1, 1)).unwrap();
    }
    let l = s.lease_at(0, 2, TTL, 0).unwrap().unwrap(); // versions 0 and 1
                                                        // Leased or not, what survives a prune at 3 is counted ahead of it.
    assert_eq!(s.pending_from(3).unwrap(), 3);
    assert_eq!(s.pending_from(0).unwrap(), 6);
    assert_eq!(s.pending_from(6).unwrap(), 0);
    assert_eq!(s.prune_below(3).unwrap(), 3);
    assert_eq!(s.prune_below(3).unwrap(), 0, "idempotent");
    // The lease's groups were pruned: its ack deletes (and counts) nothing.
    assert_eq!(s.ack(l.id).unwrap(), 0);
    let c = s.counters().unwrap();
    assert_eq!(
        (c.produced, c.consumed, c.discarded_stale, c.pending()),
        (6, 0, 3, 3)
    );
    assert_eq!(
        s.versions().unwrap().keys().copied().collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn invalid_groups_are_refused_and_change_nothing_stored() {
    let (_d, s) = open();
    s.put_group(&group(1, 1, 2, 2)).unwrap();
    let mut bad = group(1, 2, 2, 2);
    bad.samples[0].loss_mask.push(1);
    let batch = vec![group(1, 3, 1, 1), bad.clone(), bad];
    assert!(matches!(
        s.put_groups(&batch),
        Err(StorageError::Invalid { .. })
    ));
    let c = s.counters().unwrap();
    assert_eq!((c.produced, c.rejected_invalid, c.pending()), (1, 2, 1));
    assert_eq!(s.scan(0, 10).unwrap().len(), 1);
}

#[test]
fn counters_and_leases_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    let lease_id = {
        let s = TrajectoryStore::open(&path).unwrap();
        s.put_groups(&(0..4).map(|i| group(2, i, 1, 1)).collect::<Vec<_>>())
            .unwrap();
        let l = s.lease_at(0, 1, TTL, u64::MAX / 4).unwrap().unwrap();
        s.ack(l.id).unwrap();
        s.prune_below(1).unwrap();
        s.lease_at(0, 1, TTL, u64::MAX / 4).unwrap().unwrap().id
    };
    let s = TrajectoryStore::open(&path).unwrap();
    let c = s.counters().unwrap();
    assert_eq!(
        (c.produced, c.leased, c.consumed, c.pending()),
        (4, 2, 1, 3)
    );
    assert_eq!(
        s.ack(lease_id).unwrap(),
        1,
        "a lease taken before the restart can be acked"
    );
    let next = s.put_group(&group(2, 99, 1, 1)).unwrap();
    assert!(next.seq >= 4, "sequence numbers continue after reopen");
    assert!(s.check_invariant().unwrap().holds());
}

/// A stopped worker's sled file cut to 1,000 bytes (the case of issue 49): the store refuses
/// to open, naming the file and the recovery, instead of opening empty with its counters
/// reset; the file is left for inspection, and put back whole it opens with every group.
#[test]
fn a_truncated_store_is_refused_naming_its_file_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    {
        let s = TrajectoryStore::open(&path).unwrap();
        s.put_groups(&(0..20).map(|i| group(3, i, 2, 4)).collect::<Vec<_>>())
            .unwrap();
    }
    let db = path.join("db");
    let whole = std::fs::read(&db).unwrap();
    assert!(whole.len() > 1000, "{} bytes", whole.len());
    std::fs::write(&db, &whole[..1000]).unwrap();
    let err = match TrajectoryStore::open(&path) {
        Ok(s) => panic!("opened with counters {:?}", s.counters().unwrap()),
        Err(e) => e,
    };
    assert!(matches!(err, StorageError::Damaged { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&db.display().to_string()) && text.contains("mv "),
        "names the file and the recovery: {text}"
    );
    // A refused open leaves the watermark as it was: refused again.
    assert!(matches!(
        TrajectoryStore::open(&path),
        Err(StorageError::Damaged { .. })
    ));
    // Restored from its backup, nothing was lost.
    std::fs::write(&db, &whole).unwrap();
    let s = TrajectoryStore::open(&path).unwrap();
    assert_eq!(s.counters().unwrap().produced, 20);
    assert_eq!(s.pending().unwrap(), 20);
    assert!(s.check_invariant().unwrap().holds());
}

/// A database that opens with fewer groups produced than its watermark recorded (it lost its
/// last writes) is refused too, as is one whose counters do not account for its records.
#[test]
fn a_store_that_lost_writes_since_its_watermark_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    {
        let s = TrajectoryStore::open(&path).unwrap();
        s.put_groups(&(0..5).map(|i| group(3, i, 2, 4)).collect::<Vec<_>>())
            .unwrap();
    }
    let mark = path.join(crate::watermark::WATERMARK_FILE);
    crate::watermark::write(&mark, [("produced", 9)]).unwrap();
    let err = TrajectoryStore::open(&path).err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("`produced` reads 5") && text.contains("9"),
        "{text}"
    );
    crate::watermark::write(&mark, [("produced", 5)]).unwrap();
    let s = TrajectoryStore::open(&path).unwrap();
    assert_eq!(s.pending().unwrap(), 5);
}

#[test]
fn pulled_groups_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    {
        let s = TrajectoryStore::open(&path).unwrap();
        let (a, b) = (group(3, 1, 2, 2), group(3, 2, 2, 2));
        let got = s
            .put_groups_dedup(&[a.clone(), b.clone(), a.clone()])
            .unwrap();
        assert!(
            got[0].is_some() && got[1].is_some() && got[2].is_none(),
            "{got:?}"
        );
        // A group that shares even one trajectory id with a stored one is a duplicate.
        let mut mixed = group(3, 9, 2, 2);
        mixed.samples[1].trajectory_id = b.samples[0].trajectory_id;
        assert_eq!(s.put_groups_dedup(&[mixed]).unwrap(), [None]);
        // Consuming a group does not make it new again.
        let l = s.lease_at(0, 10, TTL, 0).unwrap().unwrap();
        s.ack(l.id).unwrap();
        assert_eq!(
            s.put_groups_dedup(std::slice::from_ref(&a)).unwrap(),
            [None]
        );
        let c = s.counters().unwrap();
        assert_eq!(
            (c.produced, c.duplicates, c.consumed, c.pending()),
            (2, 3, 2, 0)
        );
        assert!(s.check_invariant().unwrap().holds());
    }
    // The ids survive a restart …
    let s = TrajectoryStore::open(&path).unwrap();
    assert_eq!(s.put_groups_dedup(&[group(3, 1, 2, 2)]).unwrap(), [None]);
    // … until their version falls out of the window.
    s.prune_below(4).unwrap();
    assert!(s.put_groups_dedup(&[group(3, 1, 2, 2)]).unwrap()[0].is_some());
    assert!(s.check_invariant().unwrap().holds());
}

#[derive(Debug, Clone)]
enum Op {
    Put { version: u64, n: usize },
    Lease { v_min: u64, max: usize, ttl_ms: u64 },
    Ack(usize),
    Release(usize),
    Prune(u64),
    Advance(u64),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..8, 1usize..4).prop_map(|(version, n)| Op::Put { version, n }),
        3 => (0u64..8, 1usize..5, 1u64..50).prop_map(|(v_min, max, ttl_ms)| Op::Lease { v_min, max, ttl_ms }),
        3 => (0usize..8).prop_map(Op::Ack),
        1 => (0usize..8).prop_map(Op::Release),
        1 => (0u64..8).prop_map(Op::Prune),
        2 => (1u64..40).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The store against a simple in-memory model: same groups, same lease visibility, and the
    /// accounting invariant after every operation, across reopens.
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let mut s = TrajectoryStore::open(&path).unwrap();
        let mut now = 1_000u64;
        let mut seed = 0u64;
        // model: key -> version; leased key -> (lease id, expiry)
        let mut present: BTreeMap<GroupKey, u64> = BTreeMap::new();
        let mut leased: BTreeMap<GroupKey, (u64, u64)> = BTreeMap::new();
        let mut lease_ids: Vec<u64> = Vec::new();
        let mut live: BTreeMap<u64, (u64, Vec<GroupKey>)> = BTreeMap::new();
        let (mut produced, mut consumed, mut discarded) = (0u64, 0u64, 0u64);
        for op in ops {
            match op {
                Op::Put { version, n } => {
                    let batch: Vec<_> = (0..n).map(|_| { seed += 1; group(version, seed, 2, 2) }).collect();
                    for k in s.put_groups(&batch).unwrap() {
                        prop_assert_eq!(k.version, version);
                        present.insert(k, version);
                    }
                    produced += n as u64;
                }
                Op::Lease { v_min, max, ttl_ms } => {
                    // model: reclaim expired, then the oldest unleased with v ≥ v_min
                    let expired: Vec<u64> = live.iter().filter(|(_, (e, _))| *e <= now).map(|(id, _)| *id).collect();
                    for id in expired {
                        let (_, keys) = live.remove(&id).unwrap();
                        for k in keys { if leased.get(&k).is_some_and(|(l, _)| *l == id) { leased.remove(&k); } }
                    }
                    let want: Vec<GroupKey> = present.keys().filter(|k| k.version >= v_min && !leased.contains_key(k)).take(max).copied().collect();
                    let got = s.lease_at(v_min, max, Duration::from_millis(ttl_ms), now).unwrap();
                    match got {
                        None => prop_assert!(want.is_empty()),
                        Some(l) => {
                            let keys: Vec<GroupKey> = l.groups.iter().map(|(k, _)| *k).collect();
                            prop_assert_eq!(&keys, &want);
                            for k in &keys { leased.insert(*k, (l.id, now + ttl_ms)); }
                            live.insert(l.id, (now + ttl_ms, keys));
                            lease_ids.push(l.id);
                        }
                    }
                }
                Op::Ack(i) | Op::Release(i) if lease_ids.is_empty() => { let _ = i; }
                Op::Ack(i) => {
                    let id = lease_ids[i % lease_ids.len()];
                    let got = s.ack(id);
                    // The store reclaims expired leases lazily (at the next lease call), so the
                    // model mirrors exactly its `live` set.
                    match live.remove(&id) {
                        None => prop_assert!(got.is_err()),
                        Some((_, keys)) => {
                            let mut n = 0;
                            for k in keys {
                                if present.remove(&k).is_some() { n += 1; }
                                if leased.get(&k).is_some_and(|(l, _)| *l == id) { leased.remove(&k); }
                            }
                            prop_assert_eq!(got.unwrap(), n);
                            consumed += n;
                        }
                    }
                }
                Op::Release(i) => {
                    let id = lease_ids[i % lease_ids.len()];
                    s.release(id).unwrap();
                    if let Some((_, keys)) = live.remove(&id) {
                        for k in keys { if leased.get(&k).is_some_and(|(l, _)| *l == id) { leased.remove(&k); } }
                    }
                }
                Op::Prune(v) => {
                    let stale: Vec<GroupKey> = present.keys().filter(|k| k.version < v).copied().collect();
                    prop_assert_eq!(s.prune_below(v).unwrap(), stale.len() as u64);
                    for k in &stale { present.remove(k); leased.remove(k); }
                    discarded += stale.len() as u64;
                }
                Op::Advance(ms) => now += ms,
                Op::Reopen => {
                    drop(s);
                    s = TrajectoryStore::open(&path).unwrap();
                }
            }
            let inv = s.check_invariant().unwrap();
            prop_assert!(inv.holds(), "{:?}", inv);
            prop_assert_eq!(inv.stored, present.len() as u64);
            prop_assert_eq!((inv.counters.produced, inv.counters.consumed, inv.counters.discarded_stale), (produced, consumed, discarded));
            let keys: Vec<GroupKey> = s.scan(0, usize::MAX).unwrap().into_iter().map(|(k, _)| k).collect();
            prop_assert_eq!(keys, present.keys().copied().collect::<Vec<_>>());
        }
    }
}

/// A group of version `v` numbered `seq`.
fn numbered(v: u64, seq: u64) -> TrajectoryGroup {
    TrajectoryGroup {
        seq,
        ..group(v, seq, 2, 3)
    }
}

#[test]
fn every_stored_group_is_committed_and_the_log_comes_with_the_lease() {
    let (_d, s) = open();
    assert_eq!(s.next_commit().unwrap(), None);
    let groups: Vec<_> = (0..5).map(|i| numbered(3 + i / 2, i)).collect();
    s.put_groups(&groups).unwrap();
    assert_eq!(s.next_commit().unwrap(), Some(5));
    // First contact: the log from the oldest entry, every group's version and content.
    let a = s.lease_with_log(0, 2, TTL, None).unwrap();
    assert_eq!(a.log.from, 0);
    let want: Vec<CommitRecord> = groups
        .iter()
        .map(|g| CommitRecord::Group {
            version: g.version,
            hash: g.content_hash(),
        })
        .collect();
    assert_eq!(a.log.entries, want);
    let leased: Vec<u64> = a.lease.unwrap().groups.iter().map(|(_, g)| g.seq).collect();
    assert_eq!(leased, [4, 3], "newest first");
    // The next pull supersedes that lease: the same groups are offered again, and the log
    // below what the learner has is deleted.
    let b = s.lease_with_log(0, 2, TTL, Some(5)).unwrap();
    assert_eq!(b.log.from, 5);
    assert!(b.log.entries.is_empty());
    let leased: Vec<u64> = b.lease.unwrap().groups.iter().map(|(_, g)| g.seq).collect();
    assert_eq!(leased, [4, 3], "no group is held back on a forgotten lease");
    let c = s.lease_with_log(0, 2, TTL, None).unwrap();
    assert_eq!(c.log.from, 5, "entries below 5 are gone");
    // Pruned groups keep their commitments until the learner has them.
    s.put_group(&numbered(9, 5)).unwrap();
    s.prune_below(9).unwrap();
    let d = s.lease_with_log(9, 8, TTL, Some(5)).unwrap();
    assert_eq!(d.log.entries.len(), 1);
    assert_eq!(d.lease.unwrap().groups.len(), 1);
    assert!(s.check_invariant().unwrap().holds());
}

#[test]
fn the_log_stops_at_the_first_number_not_committed_and_leases_only_what_it_covers() {
    let (_d, s) = open();
    s.put_groups(&[numbered(1, 0), numbered(1, 1), numbered(1, 3)])
        .unwrap();
    assert_eq!(s.next_commit().unwrap(), Some(4));
    let a = s.lease_with_log(0, 8, TTL, Some(0)).unwrap();
    assert_eq!(
        (a.log.from, a.log.entries.len()),
        (0, 2),
        "number 2 is missing"
    );
    let leased: Vec<u64> = a.lease.unwrap().groups.iter().map(|(_, g)| g.seq).collect();
    assert_eq!(leased, [1, 0], "group 3 is not covered by the log");
    // Asked from 2, the log starts at the next entry present: the gap shows.
    let b = s.lease_with_log(0, 8, TTL, Some(2)).unwrap();
    assert_eq!((b.log.from, b.log.entries.len()), (2, 0));
    let c = s.lease_with_log(0, 8, TTL, None).unwrap();
    assert_eq!(c.log.from, 3);
}

#[test]
fn an_abandoned_number_is_committed_so_the_next_group_takes_the_next_one() {
    let (dir, s) = open();
    s.put_group(&numbered(2, 0)).unwrap();
    s.abandon(1, 2).unwrap();
    assert_eq!(
        s.next_commit().unwrap(),
        Some(2),
        "the failed number is not reused"
    );
    s.put_group(&numbered(2, 2)).unwrap();
    // A commitment is never rewritten: neither a group's nor an abandoned one's.
    assert!(s.abandon(0, 2).is_err());
    assert!(s.abandon(1, 2).is_err());
    let a = s.lease_with_log(0, 8, TTL, Some(0)).unwrap();
    assert_eq!(
        a.log.entries.len(),
        3,
        "the log runs through the abandoned number"
    );
    assert_eq!(a.log.entries[1], CommitRecord::Abandoned { version: 2 });
    assert!(matches!(
        a.log.entries[2],
        CommitRecord::Group { version: 2, .. }
    ));
    let leased: Vec<u64> = a.lease.unwrap().groups.iter().map(|(_, g)| g.seq).collect();
    assert_eq!(leased, [2, 0]);
    assert!(s.check_invariant().unwrap().holds());
    // Durable: a reopened store keeps it.
    drop(s);
    let s = TrajectoryStore::open(&dir.path().join("t")).unwrap();
    assert_eq!(s.next_commit().unwrap(), Some(3));
    let b = s.lease_with_log(0, 8, TTL, Some(1)).unwrap();
    assert_eq!(b.log.entries[0], CommitRecord::Abandoned { version: 2 });
}

#[test]
fn the_learners_dedup_buffer_commits_nothing() {
    let (_d, s) = open();
    s.put_groups_dedup(&[numbered(1, 7)]).unwrap();
    assert_eq!(s.next_commit().unwrap(), None);
}

#[test]
fn layout_1_and_2_stores_are_upgraded_in_place_and_an_unknown_layout_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    {
        let s = TrajectoryStore::open(&path).unwrap();
        s.put_group(&numbered(1, 0)).unwrap();
        s.meta.insert(K_LAYOUT, &1u64.to_be_bytes()).unwrap();
        s.db.flush().unwrap();
    }
    {
        // Upgraded from 1; now as a layout-2 build left it.
        let s = TrajectoryStore::open(&path).unwrap();
        assert_eq!(
            s.meta.get(K_LAYOUT).unwrap().unwrap().as_ref(),
            &LAYOUT_VERSION.to_be_bytes()
        );
        s.meta.insert(K_LAYOUT, &2u64.to_be_bytes()).unwrap();
        s.db.flush().unwrap();
    }
    {
        let s = TrajectoryStore::open(&path).unwrap();
        assert_eq!(s.pending().unwrap(), 1, "its groups are kept");
        assert_eq!(
            s.meta.get(K_LAYOUT).unwrap().unwrap().as_ref(),
            &LAYOUT_VERSION.to_be_bytes()
        );
        s.meta.insert(K_LAYOUT, &9u64.to_be_bytes()).unwrap();
        s.db.flush().unwrap();
    }
    let e = TrajectoryStore::open(&path)
        .err()
        .expect("layout 9 is refused");
    assert!(e.to_string().contains("layout"), "{e}");
}
