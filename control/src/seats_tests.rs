use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::*;
use crate::plan::{replan, Placement};

fn ws(scores: &[f64]) -> Vec<(String, f64, bool)> {
    scores
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("w{i:02}"), *s, false))
        .collect()
}

fn one_chain() -> PlanParams {
    PlanParams {
        learner_mbps: 100.0,
        ..PlanParams::default()
    }
}

#[test]
fn epochs_and_when_seats_are_redrawn() {
    assert_eq!(epoch(0, 8), 0);
    assert_eq!(epoch(15, 8), 1);
    assert_eq!(epoch(5, 0), 5, "an epoch of 0 versions is read as 1");
    assert!(redraws(0, None, 8), "the first plan draws");
    assert!(!redraws(7, Some(6), 8));
    assert!(redraws(8, Some(7), 8));
    assert!(redraws(20, Some(3), 8));
}

#[test]
fn without_a_draw_or_accountability_the_plan_is_replans() {
    let w = ws(&[90.0, 80.0, 70.0, 60.0, 50.0]);
    let p = PlanParams::default();
    let prev = replan(&w, &p, None);
    assert_eq!(seat(&w, &p, None, &Seating::default()), prev);
    assert_eq!(
        seat(&w, &p, Some(&prev), &Seating::default()),
        replan(&w, &p, Some(&prev))
    );
}

/// Over many epochs every worker of a band of equal scores heads the chain about equally
/// often — none holds it by its peer id — and the draw depends only on the seed.
#[test]
fn equal_workers_take_turns_at_the_head() {
    let w = ws(&[90.0; 4]);
    let p = one_chain();
    let mut heads: BTreeMap<String, u32> = BTreeMap::new();
    for epoch in 0..400u64 {
        let s = Seating {
            redraw: Some(epoch.wrapping_mul(0x9E37_79B9)),
            ..Seating::default()
        };
        let plan = seat(&w, &p, None, &s);
        assert_eq!(plan.chains[0].len(), 4);
        *heads.entry(plan.chains[0][0].clone()).or_default() += 1;
    }
    assert_eq!(heads.len(), 4, "{heads:?}");
    assert!(
        heads.values().all(|&n| (60..=140).contains(&n)),
        "{heads:?}"
    );
    let s = Seating {
        redraw: Some(7),
        ..Seating::default()
    };
    assert_eq!(seat(&w, &p, None, &s), seat(&w, &p, None, &s));
}

/// The draw shuffles only within bands: a clearly better worker still leads, a degraded one
/// still trails.
#[test]
fn a_draw_keeps_clearly_different_scores_in_order() {
    let w = ws(&[99.0, 75.0, 70.0, 60.0, 20.0]);
    for seed in 0..50 {
        let order = drawn_order(&w, &PlanParams::default(), seed, &BTreeMap::new());
        assert_eq!(order[0], "w00");
        assert_eq!(order[4], "w04");
        let mid: BTreeSet<&String> = order[1..4].iter().collect();
        assert_eq!(mid.len(), 3);
    }
}

/// A suspect parent gets a child, and not the one it is separated from.
#[test]
fn a_suspect_parent_is_given_another_child() {
    let w = ws(&[95.0, 90.0, 85.0]);
    let p = one_chain();
    // The draw put the suspect `w02` at the tail; it had failed `w01`.
    let s = Seating {
        separated: vec![("w02".into(), "w01".into())],
        suspects: ["w02".to_string()].into(),
        ..Seating::default()
    };
    let plan = seat(&w, &p, None, &s);
    let placement = plan.placement(&"w02".to_string());
    let Some(Placement::Chain { child: Some(c), .. }) = placement else {
        panic!("{plan:?}");
    };
    assert_eq!(c, "w00", "{plan:?}");
}

/// A draw seats the workers never (or least recently) seated with a child first within their
/// band: over epochs every worker forwards.
#[test]
fn forwarding_seats_rotate() {
    let w = ws(&[90.0, 90.0, 90.0, 90.0]);
    for seed in 0..50 {
        let s = Seating {
            redraw: Some(seed),
            last_parent: [("w00".to_string(), 7), ("w02".to_string(), 9)].into(),
            ..Seating::default()
        };
        let plan = seat(&w, &one_chain(), None, &s);
        let first: BTreeSet<&str> = plan.chains[0][..2].iter().map(String::as_str).collect();
        assert_eq!(first, ["w01", "w03"].into(), "{plan:?}");
        assert_eq!(plan.chains[0][2..], ["w00", "w02"], "{plan:?}");
    }
}

#[test]
fn demoted_workers_end_chains_and_excluded_ones_fetch_only() {
    let w = ws(&[95.0, 90.0, 85.0, 80.0]);
    let s = Seating {
        demoted: ["w00".to_string()].into(),
        excluded: ["w01".to_string()].into(),
        ..Seating::default()
    };
    let plan = seat(&w, &one_chain(), None, &s);
    assert_eq!(plan.chains, [vec!["w02", "w03", "w00"]]);
    assert_eq!(plan.fetch_only, ["w01"]);
}

#[test]
fn a_separated_child_moves_to_another_parent() {
    let w = ws(&[95.0, 90.0, 85.0]);
    let p = one_chain();
    let before = seat(&w, &p, None, &Seating::default());
    assert_eq!(before.chains, [vec!["w00", "w01", "w02"]]);
    let s = Seating {
        separated: vec![("w00".into(), "w01".into())],
        ..Seating::default()
    };
    let after = seat(&w, &p, Some(&before), &s);
    assert_eq!(after.chains, [vec!["w00", "w02", "w01"]]);
    // The child at the tail: it moves up past its parent, which keeps a child.
    let s = Seating {
        separated: vec![("w01".into(), "w02".into())],
        ..Seating::default()
    };
    let after = seat(&w, &p, Some(&before), &s);
    assert_eq!(after.chains, [vec!["w02", "w01", "w00"]]);
    // Separated both ways from its neighbours with no seat left: fetch-only.
    let s = Seating {
        separated: vec![
            ("w00".into(), "w01".into()),
            ("w02".into(), "w01".into()),
            ("w01".into(), "w00".into()),
        ],
        ..Seating::default()
    };
    let plan = seat(&w, &p, Some(&before), &s);
    assert_eq!(plan.chains, [vec!["w00", "w02"]]);
    assert_eq!(plan.fetch_only, ["w01"]);
}

/// Whatever the scores, draw, demotions, exclusions and separations: every worker is placed
/// once, no separated pair is seated, excluded workers fetch, relay-only workers never
/// forward.
#[test]
fn every_seating_respects_its_rules() {
    let mut rng = SplitMix64(42);
    for case in 0..600 {
        let n = 1 + (rng.next() % 9) as usize;
        let w: Vec<(String, f64, bool)> = (0..n)
            .map(|i| {
                let score = (rng.next() % 100) as f64;
                (format!("w{i}"), score, rng.next().is_multiple_of(5))
            })
            .collect();
        let pick = |rng: &mut SplitMix64| format!("w{}", rng.next() % n as u64);
        let separated: Vec<(String, String)> = (0..rng.next() % 6)
            .map(|_| (pick(&mut rng), pick(&mut rng)))
            .collect();
        let s = Seating {
            redraw: rng.next().is_multiple_of(2).then(|| rng.next()),
            separated: separated.clone(),
            demoted: (0..rng.next() % 3).map(|_| pick(&mut rng)).collect(),
            excluded: (0..rng.next() % 2).map(|_| pick(&mut rng)).collect(),
            suspects: (0..rng.next() % 3).map(|_| pick(&mut rng)).collect(),
            last_parent: (0..rng.next() % 3)
                .map(|_| (pick(&mut rng), rng.next() % 10))
                .collect(),
        };
        let p = PlanParams {
            learner_mbps: [100.0, 200.0, 300.0][case % 3],
            ..PlanParams::default()
        };
        let plan = seat(&w, &p, None, &s);
        let mut seen = HashSet::new();
        for c in &plan.chains {
            for x in c {
                assert!(seen.insert(x.clone()), "{x} twice: {plan:?}");
            }
            for pair in c.windows(2) {
                let pair = (pair[0].clone(), pair[1].clone());
                assert!(!separated.contains(&pair), "{pair:?} seated: {plan:?}");
                let relay = w.iter().any(|x| x.0 == pair.0 && x.2);
                assert!(!relay, "relay-only {} forwards: {plan:?}", pair.0);
            }
        }
        for x in &plan.fetch_only {
            assert!(seen.insert(x.clone()), "{x} twice: {plan:?}");
        }
        assert_eq!(seen.len(), n, "{plan:?}");
        for x in &s.excluded {
            assert_eq!(plan.placement(x), Some(Placement::FetchOnly));
        }
    }
}
