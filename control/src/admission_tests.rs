use super::*;

fn params() -> ProbationParams {
    ProbationParams::default()
}

/// A history of `accepted` groups spanning enough versions and time to be past probation
/// when `accepted` is enough.
fn old_history(p: &ProbationParams, accepted: u64) -> PeerHistory {
    PeerHistory {
        accepted,
        versions: p.probation_versions,
        highest_version: Some(p.probation_versions),
        first_accepted_ms: Some(0),
        ..PeerHistory::default()
    }
}

/// A clock late enough for every [`old_history`] to be past the probation time.
const LATE: u64 = 1 << 40;

#[test]
fn probation_checks_everything_then_the_rate_falls_with_history_to_the_floor() {
    let p = params();
    let rate = |a| check_rate(&p, &old_history(&p, a), LATE);
    for a in 0..p.probation_groups {
        assert!(on_probation(&p, &old_history(&p, a), LATE));
        assert_eq!(rate(a), 1.0, "probation group {a}");
    }
    assert!(!on_probation(
        &p,
        &old_history(&p, p.probation_groups),
        LATE
    ));
    let n = p.probation_groups;
    assert_eq!(rate(n), 1.0, "h = 0: c / (c + 0)");
    assert!((rate(n + 16) - 0.5).abs() < 1e-12);
    assert!((rate(n + 48) - 0.25).abs() < 1e-12);
    assert_eq!(rate(n + 10_000), p.floor_rate);
    // Monotone: more verified history never means more checks.
    let rates: Vec<f64> = (0..2000).map(rate).collect();
    assert!(rates.windows(2).all(|w| w[1] <= w[0]));
    assert!(rates.iter().all(|r| (p.floor_rate..=1.0).contains(r)));
}

#[test]
fn probation_ends_only_on_history_across_versions_and_time() {
    let p = params();
    let mut s: Standings<&str> = Standings::new(p);
    // A fast identity: a thousand accepted groups in ten seconds, all under one version.
    for i in 0..1000u64 {
        s.record_accepted(&"fast", 7, i * 10);
    }
    assert!(
        s.on_probation(&"fast", 10_000),
        "one version, 10 s: still young"
    );
    assert!(s.on_probation(&"fast", LATE), "one version: still young");
    assert_eq!(s.history(&"fast").versions, 1);
    // Cycling between two versions counts them once.
    for i in 0..100u64 {
        s.record_accepted(&"cycler", 3 + i % 2, i);
    }
    assert_eq!(s.history(&"cycler").versions, 2);
    // Versions, but not the time.
    let t_end = p.probation_secs * 1000;
    for v in 0..p.probation_versions {
        for k in 0..4 {
            s.record_accepted(&"steady", v, v * 100 + k);
        }
    }
    assert!(
        s.on_probation(&"steady", t_end - 1),
        "not yet T after its first group"
    );
    assert!(
        !s.on_probation(&"steady", t_end),
        "N groups, V versions, T elapsed"
    );
    // 32 accepted: h = 32 − 16 past probation, c / (c + h) = 1/2.
    assert!((s.rate(&"steady", t_end) - 0.5).abs() < 1e-12);
    // A worker never seen is young.
    assert!(s.on_probation(&"new", LATE));
}

#[test]
fn hostile_probation_params_fall_back_to_checking() {
    let nan = ProbationParams {
        floor_rate: f64::NAN,
        decay_groups: f64::NAN,
        probation_groups: 0,
        probation_versions: 0,
        probation_secs: 0,
    };
    assert_eq!(check_rate(&nan, &old_history(&nan, 5), LATE), 1.0);
    let no_decay = ProbationParams {
        decay_groups: 0.0,
        ..params()
    };
    assert_eq!(
        check_rate(&no_decay, &old_history(&no_decay, 100), LATE),
        no_decay.floor_rate
    );
    let over = ProbationParams {
        floor_rate: 7.0,
        ..params()
    };
    assert_eq!(check_rate(&over, &old_history(&over, 10_000), LATE), 1.0);
}

#[test]
fn the_price_of_a_new_identity_doubles_with_each_young_one_past_the_allowance() {
    let p = PowPricing::default();
    assert_eq!(pow_price(&p, 0, 1000), 0, "no work asked: nothing to price");
    assert_eq!(pow_price(&p, 12, 0), 12);
    assert_eq!(pow_price(&p, 12, p.free_young), 12);
    assert_eq!(pow_price(&p, 12, p.free_young + 3), 15);
    assert_eq!(pow_price(&p, 12, 1 << 30), 12 + p.max_surcharge);
    assert_eq!(pow_price(&p, 60, 1 << 30), 64, "never past 64 bits");
}

const F32: Margin = Margin {
    tolerance: 1e-3,
    delta: 1e-3,
};
const BF16: Margin = Margin {
    tolerance: 1.0,
    delta: 0.25,
};

#[test]
fn a_new_identity_starts_at_the_floor_and_widens_only_with_measured_spread() {
    let r = MarginRule::default();
    let none = MarginEvidence::default();
    // No evidence, an f32-exact group: the floor, whatever dtype it claims.
    assert_eq!(earned_margin(&r, F32, BF16, &none, 1e-6), F32);
    // A half-precision spread in this very group: it earns what that spread needs.
    let m = earned_margin(&r, F32, BF16, &none, 0.01);
    assert!((m.tolerance - 0.03).abs() < 1e-12, "{m:?}");
    assert!((m.delta - 0.03).abs() < 1e-12, "{m:?}");
    let m = earned_margin(&r, F32, BF16, &none, 0.1);
    assert!((m.tolerance - 0.3).abs() < 1e-12, "{m:?}");
    assert_eq!(m.delta, BF16.delta, "δ at its ceiling");
    // Never past the claimed dtype's ceiling.
    assert_eq!(earned_margin(&r, F32, BF16, &none, 5.0), BF16);
    // A worker claiming f32 is judged at f32, whatever it shows.
    assert_eq!(earned_margin(&r, F32, F32, &none, 0.5), F32);
    // History counts: a worker that showed a spread keeps its margin for a tight group.
    let mut ev = MarginEvidence::default();
    ev.record(100, 0, 0.2);
    let m = earned_margin(&r, F32, BF16, &ev, 1e-6);
    assert!((m.tolerance - 0.6).abs() < 1e-9, "{m:?}");
    // Monotone in the spread.
    let ds: Vec<f64> = [1e-6, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0]
        .iter()
        .map(|&s| earned_margin(&r, F32, BF16, &none, s).delta)
        .collect();
    assert!(ds.windows(2).all(|w| w[1] >= w[0]), "{ds:?}");
}

#[test]
fn tokens_in_the_band_beyond_an_honest_rate_withdraw_the_margins() {
    let r = MarginRule::default();
    let mut ev = MarginEvidence::default();
    // A worker faking a spread (noisy log-probs) and choosing tokens in the band: 14 of 60
    // tokens per group.
    for _ in 0..3 {
        ev.record(60, 14, 0.3);
    }
    assert!(!band_exceeded(&r, &ev), "180 tokens: not judged yet");
    let m = earned_margin(&r, F32, BF16, &ev, 0.3);
    assert!(m.delta > 0.1, "{m:?}");
    ev.record(60, 14, 0.3);
    assert!(band_exceeded(&r, &ev));
    assert_eq!(earned_margin(&r, F32, BF16, &ev, 0.3), F32);
    // An honest rate (1 in 100) over many tokens is not.
    let honest = MarginEvidence {
        groups: 100,
        tokens: 10_000,
        band_tokens: 100,
        max_spread: 0.3,
    };
    assert!(!band_exceeded(&r, &honest));
    // Hostile numbers do not widen anything.
    assert_eq!(
        earned_margin(&r, F32, BF16, &none_with(f64::NAN), f64::NAN),
        F32
    );
}

fn none_with(spread: f64) -> MarginEvidence {
    MarginEvidence {
        max_spread: spread,
        ..MarginEvidence::default()
    }
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
    let p = ProbationParams {
        probation_versions: 1,
        probation_secs: 0,
        ..params()
    };
    let mut s = Standings::with_cap(p, 2);
    for _ in 0..16 {
        assert!(s.on_probation(&"a", 0));
        s.record_accepted(&"a", 1, 0);
    }
    assert!(!s.on_probation(&"a", 0));
    assert_eq!(s.rate(&"a", 0), 1.0);
    s.record_rejected(&"a");
    s.record_skipped(&"a", 3);
    assert_eq!(
        s.history(&"a"),
        PeerHistory {
            accepted: 16,
            rejected: 1,
            skipped: 3,
            versions: 1,
            highest_version: Some(1),
            first_accepted_ms: Some(0),
        }
    );
    s.record_accepted(&"b", 1, 0);
    // Full: a third worker clears the map, so everyone is new (more checks, never fewer).
    s.record_accepted(&"c", 1, 0);
    assert!(s.on_probation(&"a", 0));
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
