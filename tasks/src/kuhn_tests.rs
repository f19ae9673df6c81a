use rand::{Rng, SeedableRng};

use super::*;

const VALUE: f64 = -1.0 / 18.0;

#[test]
fn the_equilibrium_family_is_worth_minus_one_eighteenth_to_player_one() {
    for alpha in [0.0, 0.1, 1.0 / 6.0, 0.25, 1.0 / 3.0] {
        let eq = Strategy::equilibrium(alpha);
        assert!((ev_p1(&eq, &eq) - VALUE).abs() < 1e-9, "alpha {alpha}");
        // Neither seat can gain by deviating: the best responses earn exactly the value.
        assert!(
            (best_response_p1(&eq) - VALUE).abs() < 1e-9,
            "alpha {alpha}"
        );
        assert!(
            (best_response_p2(&eq) + VALUE).abs() < 1e-9,
            "alpha {alpha}"
        );
        let r = evaluate(&eq, &eq);
        assert!(r.exploitability.abs() < 1e-9, "{r:?}");
        assert!(r.ev.abs() < 1e-9, "seats averaged, the game is fair: {r:?}");
    }
}

/// Against `always-bet` (bets and calls everything), derived by hand:
/// - as player 1: with K bet (called: +2); with Q checking and calling or betting both
///   average 0 (the opponent holds J or K), checking then folding loses 1; with J check and
///   fold to the bet (−1) beats betting (−2). (2 + 0 − 1)/3 = 1/3.
/// - as player 2 facing the bet: call with K (+2), with Q calling averages 0 (> −1 for a
///   fold), fold J (−1). (2 + 0 − 1)/3 = 1/3.
///
/// So the best response is worth 1/3 per hand; a uniformly random policy loses 3/8:
/// as player 1 its K, Q, J hands are worth 1.25, −0.25, −1.75 (mean −1/4), as player 2
/// 0.5, −0.5, −1.5 (mean −1/2).
#[test]
fn best_response_to_always_bet_is_one_third_as_derived_by_hand() {
    let maniac = Strategy::constant(1.0);
    assert!((best_response_p1(&maniac) - 1.0 / 3.0).abs() < 1e-12);
    assert!((best_response_p2(&maniac) - 1.0 / 3.0).abs() < 1e-12);
    let r = evaluate(&Strategy::constant(0.5), &maniac);
    assert!((r.best_response - 1.0 / 3.0).abs() < 1e-12, "{r:?}");
    assert!((r.ev + 3.0 / 8.0).abs() < 1e-12, "{r:?}");
    // Against a player that always passes, betting or checking-then-betting wins the ante.
    let passive = evaluate(&Strategy::constant(1.0), &Strategy::constant(0.0));
    assert!((passive.best_response - 1.0).abs() < 1e-12, "{passive:?}");
}

#[test]
fn exploitability_is_positive_away_from_equilibrium() {
    for s in [
        Strategy::constant(0.5),
        Strategy::constant(1.0),
        Strategy::tight(),
    ] {
        let r = evaluate(&s, &Strategy::equilibrium(0.0));
        assert!(r.exploitability > 1e-3, "{s:?}: {r:?}");
        assert!(r.ev <= r.best_response + 1e-12, "{r:?}");
    }
}

fn kuhn(opponent: &str) -> Kuhn {
    Kuhn::from_params(&serde_json::json!({ "opponent": opponent })).unwrap()
}

/// Plays `seed` with the agent following `s` (coin flips from `rng`); returns the return.
fn play(env: &Kuhn, seed: u64, s: &Strategy, rng: &mut impl Rng) -> f32 {
    let start = env.reset(seed).unwrap();
    let (seat, c1, c2) = env.deal(seed);
    let card = if seat == 0 { c1 } else { c2 };
    let mut ep = start.episode;
    let mut obs = start.prompt.text;
    let mut ret = 0.0;
    loop {
        let h = usize::from(obs.contains("bets"));
        let (pass, aggr) = words(seat, h);
        let a = if rng.gen::<f64>() < s.0[info_set(seat, card, h)] {
            aggr
        } else {
            pass
        };
        match ep.step(a) {
            Step::Continue {
                observation,
                reward,
            } => {
                ret += reward;
                obs = observation;
            }
            Step::Done { reward } => return ret + reward,
        }
    }
}

#[test]
fn sampled_episodes_agree_with_the_exact_value() {
    let env = kuhn("equilibrium");
    let policy = Strategy::constant(0.5);
    let exact = env
        .evaluate(&(0..12).map(|_| vec![0.5, 0.5]).collect::<Vec<_>>())
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let n = 40_000;
    let returns: Vec<f64> = (0..n)
        .map(|seed| f64::from(play(&env, seed, &policy, &mut rng)))
        .collect();
    let mean = returns.iter().sum::<f64>() / n as f64;
    let var = returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    assert!(
        (mean - exact.ev).abs() < 4.0 * se,
        "sampled {mean} ± {se}, exact {}",
        exact.ev
    );
}

#[test]
fn episodes_are_deterministic_and_replay_from_their_actions() {
    let env = kuhn("random");
    for seed in 0..200u64 {
        let a = env.reset(seed).unwrap();
        let b = env.reset(seed).unwrap();
        assert_eq!(a.prompt, b.prompt);
        assert_eq!(a.prompt.id, seed.to_string());
        let (mut ea, mut eb) = (a.episode, b.episode);
        for action in ["bet", "call"] {
            let (x, y) = (ea.step(action), eb.step(action));
            assert_eq!(x, y);
            if matches!(x, Step::Done { .. }) {
                break;
            }
        }
    }
    // Seeds spread over seats and deals.
    let starts: std::collections::BTreeSet<String> = (0..200)
        .map(|s| env.reset(s).unwrap().prompt.text)
        .collect();
    assert_eq!(
        starts.len(),
        9,
        "3 cards × (first, second after check, second after bet)"
    );
}

#[test]
fn illegal_actions_are_the_passive_one_and_nothing_panics() {
    let env = kuhn("always-bet");
    let huge = "bet ".repeat(1 << 18);
    for seed in 0..50u64 {
        let start = env.reset(seed).unwrap();
        let (seat, h) = (
            env.deal(seed).0,
            usize::from(start.prompt.text.contains("bets")),
        );
        let passive = env.reset(seed).unwrap().episode.step(words(seat, h).0);
        for bad in [
            "",
            "BET",
            " bet",
            "bet\n",
            "<|eos|>",
            huge.as_str(),
            "\u{fffd}",
        ] {
            let x = env.reset(seed).unwrap().episode.step(bad);
            assert_eq!(x, passive, "seed {seed} {:?}", &bad[..bad.len().min(8)]);
        }
        // Actions after the end earn nothing.
        let mut ep = env.reset(seed).unwrap().episode;
        while let Step::Continue { .. } = ep.step("call") {}
        assert_eq!(ep.step("bet"), Step::Done { reward: 0.0 });
    }
}

/// The shaping penalty: an illegal action plays exactly as the passive one (same
/// observations, same chips) and its turn's reward is lowered by the penalty; legal words
/// pay nothing; the return stays in the declared range; the exact evaluator counts chips only.
#[test]
fn an_illegal_action_pays_the_shaping_penalty_on_top_of_the_passive_outcome() {
    let params = |p: f64| KuhnParams {
        opponent: "random".into(),
        illegal_penalty: p,
        ..KuhnParams::default()
    };
    let (plain, shaped) = (
        Kuhn::new(params(0.0)).unwrap(),
        Kuhn::new(params(1.0)).unwrap(),
    );
    let lower = |s: Step, by: f32| match s {
        Step::Continue {
            observation,
            reward,
        } => Step::Continue {
            observation,
            reward: reward - by,
        },
        Step::Done { reward } => Step::Done {
            reward: reward - by,
        },
    };
    let (lo, hi) = shaped.metadata().return_range;
    for seed in 0..200u64 {
        let seat = plain.deal(seed).0;
        let h = usize::from(plain.reset(seed).unwrap().prompt.text.contains("bets"));
        let (pass, aggr) = words(seat, h);
        for legal in [pass, aggr] {
            assert_eq!(
                shaped.reset(seed).unwrap().episode.step(legal),
                plain.reset(seed).unwrap().episode.step(legal)
            );
        }
        let passive = plain.reset(seed).unwrap().episode.step(pass);
        for bad in ["", "folds", "raise"] {
            let x = shaped.reset(seed).unwrap().episode.step(bad);
            assert_eq!(x, lower(passive.clone(), 1.0), "seed {seed} {bad:?}");
        }
        // Illegal words throughout: the worst return, inside the range.
        let mut ep = shaped.reset(seed).unwrap().episode;
        let mut ret = 0.0;
        loop {
            match ep.step("?") {
                Step::Continue { reward, .. } => ret += reward,
                Step::Done { reward } => break ret += reward,
            }
        }
        assert!((lo..=hi).contains(&ret), "{ret} outside {lo}..{hi}");
        assert_eq!(shaped.reset(seed).unwrap().episode.truncate(), -2.0);
    }
    let probs = vec![vec![0.3, 0.5]; 12];
    assert_eq!(
        ExactGame::evaluate(&shaped, &probs).unwrap(),
        ExactGame::evaluate(&plain, &probs).unwrap()
    );
    assert!(Kuhn::new(params(-0.5)).is_err() && Kuhn::new(params(f64::NAN)).is_err());
}

#[test]
fn returns_stay_in_range_and_truncation_forfeits_the_ante() {
    let env = kuhn("random");
    let (lo, hi) = env.metadata().return_range;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for seed in 0..500 {
        let r = play(&env, seed, &Strategy::constant(0.5), &mut rng);
        assert!((lo..=hi).contains(&r), "{r}");
        let mut ep = env.reset(seed).unwrap().episode;
        assert_eq!(ep.truncate(), -1.0);
    }
}

#[test]
fn decisions_are_the_environment_observations_in_info_set_order() {
    let env = kuhn("equilibrium");
    let d = env.decisions();
    assert_eq!(d.len(), 12);
    for seed in 0..300u64 {
        let (seat, c1, c2) = env.deal(seed);
        let card = if seat == 0 { c1 } else { c2 };
        let start = env.reset(seed).unwrap();
        let h = usize::from(start.prompt.text.contains("bets"));
        let dec = &d[info_set(seat, card, h)];
        assert_eq!(dec.observation, start.prompt.text);
        assert!(dec.history.is_empty());
        // Player 1's second decision follows its own check.
        if seat == 0 {
            let mut ep = start.episode;
            if let Step::Continue { observation, .. } = ep.step("check") {
                let dec = &d[info_set(0, card, 1)];
                assert_eq!(dec.observation, observation);
                assert_eq!(
                    dec.history,
                    vec![(start.prompt.text.clone(), "check".to_string())]
                );
            }
        }
    }
    // Exact evaluation of the equilibrium itself through the decision table.
    let eq = Strategy::equilibrium(0.0);
    let probs: Vec<Vec<f64>> = eq.0.iter().map(|&p| vec![1.0 - p, p]).collect();
    let vs_eq = env.evaluate(&probs).unwrap();
    assert!(vs_eq.ev.abs() < 1e-9 && vs_eq.exploitability.abs() < 1e-9);
    assert!(env.evaluate(&probs[..3]).is_err());
}

#[test]
fn bad_parameters_are_clear_errors() {
    for p in [
        serde_json::json!({"opponent": "shark"}),
        serde_json::json!({"alpha": 0.5}),
        serde_json::json!({"seat": 2}),
        serde_json::json!({"bogus": 1}),
    ] {
        let e = Kuhn::from_params(&p).unwrap_err();
        assert!(e.to_string().contains("kuhn-poker"), "{e}");
    }
    let fixed = Kuhn::from_params(&serde_json::json!({"seat": 1})).unwrap();
    assert!((0..50).all(|s| fixed.deal(s).0 == 1));
}
