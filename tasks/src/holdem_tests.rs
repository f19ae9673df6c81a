use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::env::Budget;

fn env(opponent: &str, betting: &str) -> Holdem {
    Holdem::from_params(&serde_json::json!({ "opponent": opponent, "betting": betting })).unwrap()
}

/// Plays `seed` answering every decision with `policy(observation)`; returns
/// (observations, return).
fn play(env: &Holdem, seed: u64, policy: impl Fn(&str) -> String) -> (Vec<String>, f32) {
    let start = env.reset(seed).unwrap();
    let mut obs = vec![start.prompt.text];
    let mut ep = start.episode;
    let mut ret = 0.0;
    for _ in 0..env.metadata().max_turns {
        match ep.step(&policy(obs.last().unwrap())) {
            Step::Continue {
                observation,
                reward,
            } => {
                ret += reward;
                obs.push(observation);
            }
            Step::Done { reward } => return (obs, ret + reward),
        }
    }
    (obs, ret + ep.truncate())
}

#[test]
fn hands_are_deterministic_and_replay_from_their_actions() {
    for betting in ["no-limit", "limit"] {
        for opp in RULE_BASED {
            let e = env(opp, betting);
            for seed in 0..20 {
                let a = play(&e, seed, |_| "call".into());
                let b = play(&e, seed, |_| "call".into());
                assert_eq!(a, b, "{opp} {betting} seed {seed}");
                let (lo, hi) = e.metadata().return_range;
                assert!((lo..=hi).contains(&a.1), "{a:?}");
            }
        }
    }
    // Different seeds deal different hands.
    let e = env("calling", "no-limit");
    let firsts: std::collections::BTreeSet<String> =
        (0..20).map(|s| e.reset(s).unwrap().prompt.text).collect();
    assert!(firsts.len() > 15, "{firsts:?}");
}

#[test]
fn the_observation_shows_the_agent_its_cards_and_the_pot() {
    let e = env("calling", "no-limit");
    let start = e.reset(3).unwrap();
    let t = &start.prompt.text;
    assert!(
        t.starts_with("Hand: ") && t.contains("Board: -.") && t.contains("Pot: "),
        "{t}"
    );
    // Calling down to the river shows five board cards.
    let (obs, _) = play(&e, 3, |_| "check".into());
    assert!(obs.len() >= 4, "{obs:?}");
    let last = obs.last().unwrap();
    let board = last
        .split("Board: ")
        .nth(1)
        .unwrap()
        .split('.')
        .next()
        .unwrap();
    assert_eq!(board.split(' ').count(), 5, "{last}");
}

#[test]
fn against_a_calling_station_folding_loses_the_blind_and_showdowns_settle_chips() {
    let e = env("calling", "no-limit");
    for seed in 0..40 {
        let seat = e.seat(seed);
        let (_, r) = play(&e, seed, |_| "fold".into());
        // The dealer folds its small blind; the big blind checks it down against the caller.
        let want: &[f32] = if seat == 0 {
            &[-0.5]
        } else {
            &[-1.0, 0.0, 1.0]
        };
        assert!(want.contains(&r), "seat {seat}: {r}");
        let (_, shove) = play(&e, seed, |_| "all-in".into());
        assert!(
            shove.abs() == 100.0 || shove == 0.0,
            "all-in vs a caller: ±stack or a split, {shove}"
        );
    }
}

#[test]
fn illegal_actions_are_the_passive_one() {
    let e = env("random", "no-limit");
    let huge = "raise 10".repeat(1000);
    for seed in 0..30 {
        let passive = play(&e, seed, |o| {
            if o.contains(" fold, call") {
                "fold"
            } else {
                "check"
            }
            .into()
        });
        for bad in [
            "",
            "Raise 10",
            "raise 1",
            "raise 999999",
            "raise -5",
            "check please",
            huge.as_str(),
        ] {
            let got = play(&e, seed, |_| bad.to_string());
            assert_eq!(got, passive, "seed {seed} {:?}", &bad[..bad.len().min(12)]);
        }
    }
}

#[test]
fn limit_raises_are_fixed_and_capped() {
    let e = env("all-in", "limit");
    for seed in 0..20 {
        let (obs, r) = play(&e, seed, |_| "raise".into());
        // Four bets a street of 2 chips (preflop, flop) and 4 chips (turn, river): at most
        // 8 + 8 + 16 + 16 = 48 chips a side, 24 big blinds.
        assert!(r.abs() <= 24.0, "{r} {obs:?}");
        for o in &obs {
            let pot: f32 = o
                .split("Pot: ")
                .nth(1)
                .unwrap()
                .split('.')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(pot <= 96.0, "{o}");
            if let Some(to) = o.split("raise to ").nth(1) {
                let to: f32 = to.split(['.', ',']).next().unwrap().parse().unwrap();
                assert!(to % 2.0 == 0.0 && to <= 16.0, "fixed sizes: {o}");
            }
        }
    }
}

#[test]
fn truncation_plays_passively_to_the_end() {
    let e = env("calling", "no-limit");
    for seed in 0..20 {
        let mut ep = e.reset(seed).unwrap().episode;
        let r = ep.truncate();
        assert!(
            (-1.0..=1.5).contains(&r),
            "check/fold to showdown vs a caller: {r}"
        );
        assert_eq!(ep.step("call"), Step::Done { reward: 0.0 });
    }
}

struct Fixed {
    calls: AtomicUsize,
}

impl TextPolicy for Fixed {
    fn act(&self, system: &str, turns: &[(String, String)], obs: &str, _seed: u64) -> String {
        assert_eq!(system, RULES);
        assert!(obs.starts_with("Hand: "));
        assert!(turns.iter().all(|(_, a)| a == "call"));
        self.calls.fetch_add(1, Ordering::Relaxed);
        "call".into()
    }
}

#[test]
fn a_model_opponent_is_asked_once_per_decision_and_replays() {
    let policy = Arc::new(Fixed {
        calls: AtomicUsize::new(0),
    });
    let params = HoldemParams::default();
    let e = Holdem::with_model_opponent(params, policy.clone()).unwrap();
    let vs_caller = env("calling", "no-limit");
    for seed in 0..10 {
        let before = policy.calls.load(Ordering::Relaxed);
        let (obs, r) = play(&e, seed, |_| "call".into());
        let asked = policy.calls.load(Ordering::Relaxed) - before;
        // A model that always calls plays like the calling station; every decision once.
        assert_eq!((obs.clone(), r), play(&vs_caller, seed, |_| "call".into()));
        assert!(
            asked <= obs.len() + 1,
            "asked {asked} times for {} turns",
            obs.len()
        );
    }
    let e = Holdem::from_params(&serde_json::json!({"opponent": "model"})).unwrap_err();
    assert!(e.to_string().contains("model"), "{e}");
}

#[test]
fn bad_parameters_are_clear_errors() {
    for p in [
        serde_json::json!({"opponent": "shark"}),
        serde_json::json!({"betting": "pot-limit"}),
        serde_json::json!({"stack_bb": 1}),
        serde_json::json!({"seat": 3}),
    ] {
        let e = Holdem::from_params(&p).unwrap_err();
        assert!(e.to_string().contains("holdem"), "{e}");
    }
}

/// A model opponent that checks or folds.
struct Passive;

impl TextPolicy for Passive {
    fn act(&self, _: &str, _: &[(String, String)], obs: &str, _seed: u64) -> String {
        if obs.contains(" fold, call") {
            "fold"
        } else {
            "check"
        }
        .into()
    }
}

fn passive(o: &str) -> String {
    if o.contains(" fold, call") {
        "fold"
    } else {
        "check"
    }
    .into()
}

#[test]
fn walks_count_as_hands_the_agent_wins_without_a_decision() {
    // Passive self-play: the dealer folds its small blind, so the agent loses 0.5 bb as
    // dealer and wins 0.5 bb as big blind (a walk), by its seat alone.
    let e = Holdem::with_model_opponent(HoldemParams::default(), Arc::new(Passive)).unwrap();
    let mut total = 0.0;
    for seed in 0..200 {
        let (obs, r) = play(&e, seed, passive);
        let want = if e.seat(seed) == 0 { -0.5 } else { 0.5 };
        assert_eq!(r, want, "seed {seed}: {obs:?}");
        if e.seat(seed) == 1 {
            assert_eq!(obs.len(), 1);
            assert!(
                obs[0].contains("Opponent: fold. The hand is over: you win 1 chip."),
                "{}",
                obs[0]
            );
            // Whatever the answer, the walk pays the same and has no scripted action.
            let mut ep = e.reset(seed).unwrap().episode;
            assert_eq!(ep.reference_action(&mut rand::thread_rng()), None);
            assert_eq!(ep.step("raise 5000"), Step::Done { reward: 0.5 });
            assert_eq!(ep.step("call"), Step::Done { reward: 0.0 });
        }
        total += r;
    }
    // The seat is a fair coin of the seed: about as many hands in each seat.
    assert!(total.abs() <= 10.0, "{total}");
    // Against `random` (it folds owing with 25 %), some hands are walks and count +0.5.
    let e = env("random", "no-limit");
    let walks = (0..400)
        .filter(|&s| e.reset(s).unwrap().prompt.text.contains("The hand is over"))
        .inspect(|&s| assert_eq!(play(&e, s, passive).1, 0.5))
        .count();
    // Expected 400 × 1/2 × 1/4 = 50.
    assert!((25..=80).contains(&walks), "{walks} walks in 400 hands");
}

#[test]
fn the_random_opponent_raises_by_rs_pokers_rule() {
    use rand::SeedableRng;
    let cards = game::deck();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Preflop, the dealer first: both players still need to act, so the cap is 3 × pot
    // (3 chips) = 9; the minimum raise is to 4.
    let g = Game::new(&cards, 200.0, false);
    let mut raises = Vec::new();
    for _ in 0..2000 {
        if let Move::RaiseTo(x) = random_move(&g, &mut rng) {
            raises.push(x);
        }
    }
    assert!(
        raises.iter().all(|&x| (4.0..9.0).contains(&x)),
        "{raises:?}"
    );
    assert!(
        raises.iter().any(|&x| x > 8.0),
        "the cap is 9, not 2 × pot = 6"
    );
    assert!(
        raises.iter().any(|x| x.fract() != 0.0),
        "amounts are not rounded"
    );
    // The big blind after the dealer's call: one player to act, cap 2 × pot (4) = 8.
    let mut g = Game::new(&cards, 200.0, false);
    g.play(Move::Call);
    let mut raises = Vec::new();
    for _ in 0..2000 {
        if let Move::RaiseTo(x) = random_move(&g, &mut rng) {
            raises.push(x);
        }
    }
    assert!(!raises.is_empty());
    assert!(
        raises.iter().all(|&x| (4.0..8.0).contains(&x)),
        "{raises:?}"
    );
    assert!(raises.iter().any(|&x| x > 7.0), "{raises:?}");
}

#[test]
fn observations_fit_the_stated_context_budget() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut longest = 0;
    for (opp, stack) in [("random", 10_000), ("random", 100), ("all-in", 10_000)] {
        let e =
            Holdem::from_params(&serde_json::json!({"opponent": opp, "stack_bb": stack})).unwrap();
        for seed in 0..300 {
            let start = e.reset(seed).unwrap();
            let first = start.prompt.text.len();
            assert!(
                first <= MAX_FIRST_OBSERVATION_BYTES,
                "{first}: {}",
                start.prompt.text
            );
            let mut ep = start.episode;
            let mut obs = start.prompt.text;
            for _ in 0..e.metadata().max_turns {
                longest = longest.max(obs.len());
                assert!(
                    obs.len() <= MAX_OBSERVATION_BYTES,
                    "{} bytes: {obs}",
                    obs.len()
                );
                let action = ep
                    .reference_action(&mut rng)
                    .unwrap_or_else(|| "call".into());
                // A reference raise is one the grammar accepts: a whole amount.
                if let Some(n) = action.strip_prefix("raise ") {
                    assert!(n.parse::<u32>().is_ok(), "{action}");
                }
                match ep.step(&action) {
                    Step::Continue { observation, .. } => obs = observation,
                    Step::Done { .. } => break,
                }
            }
        }
    }
    assert!(longest > 120, "the bound is not loose by far: {longest}");
    // Two decisions never fit the embedded model's 256 positions.
    assert!(context_for_decisions(2) > 256);
    let meta = env("calling", "no-limit").metadata();
    let b = Budget::of(&meta);
    assert!(b.max_episode_tokens + MAX_FIRST_PROMPT_BYTES >= context_for_decisions(20));
}
