use super::*;

fn params() -> ProbationParams {
    ProbationParams::default()
}

#[test]
fn probation_checks_everything_then_the_rate_falls_with_history_to_the_floor() {
    let p = params();
    for a in 0..p.probation_groups {
        assert!(on_probation(&p, a));
        assert_eq!(check_rate(&p, a), 1.0, "probation group {a}");
    }
    assert!(!on_probation(&p, p.probation_groups));
    let n = p.probation_groups;
    assert_eq!(check_rate(&p, n), 1.0, "h = 0: c / (c + 0)");
    assert!((check_rate(&p, n + 16) - 0.5).abs() < 1e-12);
    assert!((check_rate(&p, n + 48) - 0.25).abs() < 1e-12);
    assert_eq!(check_rate(&p, n + 10_000), p.floor_rate);
    // Monotone: more verified history never means more checks.
    let rates: Vec<f64> = (0..2000).map(|a| check_rate(&p, a)).collect();
    assert!(rates.windows(2).all(|w| w[1] <= w[0]));
    assert!(rates.iter().all(|r| (p.floor_rate..=1.0).contains(r)));
}

#[test]
fn hostile_probation_params_fall_back_to_checking() {
    let nan = ProbationParams {
        floor_rate: f64::NAN,
        decay_groups: f64::NAN,
        probation_groups: 0,
    };
    assert_eq!(check_rate(&nan, 5), 1.0);
    let no_decay = ProbationParams {
        decay_groups: 0.0,
        ..params()
    };
    assert_eq!(check_rate(&no_decay, 100), no_decay.floor_rate);
    let over = ProbationParams {
        floor_rate: 7.0,
        ..params()
    };
    assert_eq!(check_rate(&over, 10_000), 1.0);
}

#[test]
fn the_forged_bound_is_the_geometric_quantile() {
    assert_eq!(forged_bound(1.0, 0.95), 0);
    assert_eq!(forged_bound(0.0, 0.95), u64::MAX);
    assert_eq!(forged_bound(f64::NAN, 0.95), u64::MAX);
    // (0.95)^59 = 0.0485 ≤ 0.05 < (0.95)^58 = 0.0510.
    assert_eq!(forged_bound(0.05, 0.95), 59);
    assert_eq!(forged_bound(0.5, 0.95), 5);
    // The definition, checked directly over a grid.
    for r in [0.01, 0.05, 0.1, 0.3, 0.5, 0.9] {
        for conf in [0.5, 0.9, 0.95, 0.99] {
            let k = forged_bound(r, conf);
            let miss = |k: u64| (1.0 - r).powi(k as i32);
            assert!(miss(k) <= 1.0 - conf + 1e-12, "{r} {conf} {k}");
            assert!(k == 0 || miss(k - 1) > 1.0 - conf, "{r} {conf} {k}");
        }
    }
}

#[test]
fn standings_count_verified_groups_and_forgetting_means_probation_again() {
    let mut s = Standings::with_cap(params(), 2);
    for _ in 0..16 {
        assert!(s.on_probation(&"a"));
        s.record_accepted(&"a");
    }
    assert!(!s.on_probation(&"a"));
    assert_eq!(s.rate(&"a"), 1.0);
    s.record_rejected(&"a");
    s.record_skipped(&"a", 3);
    assert_eq!(
        s.history(&"a"),
        PeerHistory {
            accepted: 16,
            rejected: 1,
            skipped: 3
        }
    );
    s.record_accepted(&"b");
    // Full: a third worker clears the map, so everyone is new (more checks, never fewer).
    s.record_accepted(&"c");
    assert!(s.on_probation(&"a"));
    assert_eq!(s.history(&"c").accepted, 1);
    s.forget(&"c");
    assert_eq!(s.history(&"c"), PeerHistory::default());
}

#[test]
fn the_quota_caps_one_worker_and_all_probation_workers() {
    let caps = ShareCaps::default();
    // B = 4, three established workers offering: 2 each at most, 1 from probation.
    let q = batch_quota(4, caps, 3, 3);
    assert_eq!(
        q,
        BatchQuota {
            per_peer: 2,
            probation: 1
        }
    );
    // Only one established worker has groups now: it may fill the batch (liveness), while
    // the probation share stays.
    assert_eq!(batch_quota(4, caps, 3, 1).per_peer, 4);
    assert_eq!(batch_quota(4, caps, 3, 1).probation, 1);
    // Nobody past probation yet: new workers may fill the batch.
    assert_eq!(batch_quota(4, caps, 0, 0).probation, 4);
    // Shares of 0 and hostile values.
    let zero = ShareCaps {
        max_peer_share: 0.0,
        probation_share: f64::NAN,
    };
    assert_eq!(
        batch_quota(8, zero, 4, 4),
        BatchQuota {
            per_peer: 2,
            probation: 0
        }
    );
    assert_eq!(batch_quota(8, zero, 4, 8).per_peer, 1);
    let all = ShareCaps {
        max_peer_share: 5.0,
        probation_share: 5.0,
    };
    assert_eq!(
        batch_quota(8, all, 1, 1),
        BatchQuota {
            per_peer: 8,
            probation: 8
        }
    );
}

#[test]
fn composition_respects_the_quota_whatever_the_backlog() {
    let est = |peer| Candidate {
        peer,
        probation: false,
        recent: 0,
    };
    let new = |peer| Candidate {
        peer,
        probation: true,
        recent: 0,
    };
    // Worker 0 holds a huge backlog (freshest first), worker 1 some, three sybils one each.
    let mut cands: Vec<Candidate> = (0..100).map(|_| est(0)).collect();
    cands.extend([est(1), est(1), new(2), new(3), new(4)]);
    let q = batch_quota(4, ShareCaps::default(), 2, 2);
    let picked = compose_batch(&cands, 4, q, &[]);
    let by: Vec<usize> = picked.iter().map(|&i| cands[i].peer).collect();
    // One group from each worker that offers (the sybils together within the probation
    // share: one), then worker 0's second; never more than two from worker 0.
    assert_eq!(by, [0, 0, 1, 2]);
    // A batch short of established groups takes one probation group, never two.
    let cands = [est(0), est(0), est(0), new(2), new(3), new(4)];
    let picked = compose_batch(&cands, 4, q, &[]);
    assert_eq!(picked, [0, 1, 3]);
    // What is already in the batch counts.
    let picked = compose_batch(&cands, 4, q, &[est(0), new(9)]);
    assert_eq!(picked, [0]);
    // Fair before fresh: the worker holding the newest versions (a chain head) offers its
    // groups first, but with others offering it gets its part of the batch, not the quota.
    let q3 = batch_quota(3, ShareCaps::default(), 3, 3);
    assert_eq!(q3.per_peer, 2);
    let mut cands: Vec<Candidate> = (0..10).map(|_| est(0)).collect();
    cands.extend([est(1), est(2), est(1), est(2)]);
    let picked = compose_batch(&cands, 3, q3, &[]);
    let by: Vec<usize> = picked.iter().map(|&i| cands[i].peer).collect();
    assert_eq!(by, [0, 1, 2], "one each, each worker's freshest");
    assert_eq!(picked, [0, 10, 11]);
    // B = 4 from 3 workers: the seat past the even level goes to the worker with the fewest
    // recently trained groups, not always to the freshest, so it rotates over batches.
    let q4 = batch_quota(4, ShareCaps::default(), 3, 3);
    let mut recent = [0u32; 3];
    let mut total = [0u32; 3];
    for _ in 0..30 {
        let cands: Vec<Candidate> = [0, 0, 0, 1, 1, 2, 2]
            .iter()
            .map(|&peer| Candidate {
                peer,
                probation: false,
                recent: recent[peer],
            })
            .collect();
        let picked = compose_batch(&cands, 4, q4, &[]);
        assert_eq!(picked.len(), 4);
        for &i in &picked {
            recent[cands[i].peer] += 1;
            total[cands[i].peer] += 1;
        }
    }
    assert_eq!(total, [40, 40, 40], "each worker a third of 120 groups");
    // Alone with groups, it still fills up to its quota (liveness).
    let cands: Vec<Candidate> = (0..10).map(|_| est(0)).chain([est(1)]).collect();
    let picked = compose_batch(&cands, 3, q3, &[]);
    assert_eq!(picked, [0, 1, 10]);
    // Property: over random inputs no quota is ever exceeded and nothing is picked twice.
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let b = 1 + (next() % 16) as usize;
        let caps = ShareCaps {
            max_peer_share: (next() % 101) as f64 / 100.0,
            probation_share: (next() % 101) as f64 / 100.0,
        };
        let cands: Vec<Candidate> = (0..(next() % 40))
            .map(|_| Candidate {
                peer: (next() % 6) as usize,
                probation: next() % 3 == 0,
                recent: 0,
            })
            .collect();
        let q = batch_quota(b, caps, (next() % 3) as usize, (next() % 4) as usize);
        let picked = compose_batch(&cands, b, q, &[]);
        assert!(picked.len() <= b);
        assert!(picked.windows(2).all(|w| w[0] < w[1]));
        let prob = picked.iter().filter(|&&i| cands[i].probation).count();
        assert!(prob <= q.probation, "{q:?} {prob}");
        let count = |peer| picked.iter().filter(|&&i| cands[i].peer == peer).count();
        for peer in 0..6 {
            assert!(
                count(peer) <= q.per_peer,
                "{q:?} peer {peer}: {}",
                count(peer)
            );
        }
        // Levels: a worker has two more groups than another only when that other one had
        // nothing more it could give (all its candidates picked or barred by probation).
        for (p, r) in (0..6).flat_map(|p| (0..6).map(move |r| (p, r))) {
            if count(p) > count(r) + 1 {
                let left = (0..cands.len())
                    .any(|i| cands[i].peer == r && !picked.contains(&i) && !cands[i].probation);
                assert!(!left, "{q:?}: peer {p} {} vs {r} {}", count(p), count(r));
            }
        }
    }
}

#[test]
fn a_workers_part_of_the_buffer_is_its_share_unless_it_is_alone() {
    assert_eq!(pull_share(8, 0.5, 3), 4);
    assert_eq!(pull_share(8, 0.5, 1), 8, "a lone worker fills the buffer");
    assert_eq!(pull_share(8, 1.0, 3), 8);
    assert_eq!(pull_share(8, 0.01, 3), 1, "never starved to 0");
    assert_eq!(pull_share(8, f64::NAN, 3), 8);
}

#[test]
fn skipped_numbers_are_counted_once_out_of_order_ones_are_not() {
    let mut g = SeqGaps::default();
    assert_eq!(g.see(10), 0, "the first number seen starts the count");
    // Out of order within the horizon: nothing is skipped.
    for s in [14, 12, 11, 13] {
        assert_eq!(g.see(s), 0);
    }
    assert_eq!((g.open(), g.skipped()), (0, 0));
    // 15 and 16 never come; once the worker is SKIP_HORIZON past them, they count, once.
    assert_eq!(g.see(17), 0);
    assert_eq!(g.open(), 2);
    assert_eq!(g.see(17 + SKIP_HORIZON), 2);
    assert_eq!(g.skipped(), 2);
    // A late arrival below the horizon changes nothing (it was counted).
    assert_eq!(g.see(15), 0);
    assert_eq!(g.skipped(), 2);
    // A huge jump is bounded in memory and counted as soon as it is past the horizon.
    let mut g = SeqGaps::default();
    g.see(0);
    let newly = g.see(1_000_000);
    assert!(g.open() <= SKIP_HORIZON);
    assert_eq!(newly + g.open(), 999_999);
    // The largest number does not overflow anything.
    g.see(u64::MAX);
    assert!(g.open() <= SKIP_HORIZON);
}
