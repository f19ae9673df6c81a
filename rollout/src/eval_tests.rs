use rand::SeedableRng;

use super::*;
use crate::episode::{scripted_examples, Driver};
use policy::{Device, ModelConfig, Tokenizer};
use tasks::env::Budget;

fn kuhn(opponent: &str) -> Arc<dyn Environment> {
    tasks::build_env("kuhn-poker", &serde_json::json!({ "opponent": opponent })).unwrap()
}

fn spec<'a>(env: &'a dyn Environment, chat: &'a Chat) -> Spec<'a> {
    Spec {
        env,
        chat,
        budget: Budget::of(&env.metadata()),
        context: ModelConfig::tiny().max_position_embeddings,
    }
}

#[test]
fn decisions_render_as_the_episodes_do() {
    let env = kuhn("random");
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let system = env.system_prompt();
    for d in env.exact().unwrap().decisions() {
        // An episode that reaches this decision by the same history.
        let reach = |seed: u64| -> Option<Vec<u32>> {
            let (mut drv, first, prompt) = Driver::start(spec(env.as_ref(), &chat), seed).ok()?;
            let want = d.history.first().map_or(&d.observation, |h| &h.0);
            if first.text != *want {
                return None;
            }
            let mut last = None;
            for (_, a) in &d.history {
                last = Some(drv.finish_turn(&chat.action_tokens(a).unwrap()).unwrap()?);
            }
            let rendered_obs = chat
                .tokenizer()
                .decode(last.as_deref().unwrap_or(&[]))
                .unwrap();
            if !d.history.is_empty() && !rendered_obs.contains(&d.observation) {
                return None;
            }
            let mut played = prompt;
            played.extend_from_slice(drv.tokens());
            Some(played)
        };
        let played = (0..2000u64)
            .find_map(reach)
            .expect("a seed reaches the decision");
        let rendered =
            render_decision(&chat, system.as_deref(), &d.history, &d.observation).unwrap();
        assert_eq!(rendered, played, "{d:?}");
    }
}

/// The exact evaluation reads the same policy the episodes play: the frequency of each first
/// action in sampled episodes matches the probability read from the log-probs at that
/// decision, and the mean return matches the exact value.
#[test]
fn exact_evaluation_agrees_with_sampled_episodes() {
    let env = kuhn("always-bet");
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let policy = Policy::new_random(&ModelConfig::tiny(), 3, &Device::Cpu).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let ex = scripted_examples(spec(env.as_ref(), &chat), 0..400, &mut rng).unwrap();
    let cfg = policy::sft::WarmStart {
        steps: 120,
        ..policy::sft::WarmStart::default()
    };
    policy::sft::warm_start(&policy, &ex, &cfg).unwrap();
    let e = exact(&policy, &chat, env.as_ref(), 1.0).unwrap().unwrap();
    assert!((e.report.best_response - 1.0 / 3.0).abs() < 1e-9);
    let probs = decision_probs(&policy, &chat, env.as_ref(), 1.0).unwrap();
    let decisions = env.exact().unwrap().decisions();
    let infer = InferModel::from_policy(&policy).unwrap();
    let mut params = SamplingParams::new(8, chat.stop_tokens());
    params.temperature = 1.0;
    // First decisions: (times reached, times each choice was played), by observation.
    let mut seen: std::collections::HashMap<String, (f64, Vec<f64>)> = Default::default();
    let mut returns = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for seed in 0..300u64 {
        let s = spec(env.as_ref(), &chat);
        let (first, _, eps) = crate::episode::play_group(
            s,
            Model::Infer(&infer),
            seed,
            &params,
            &policy::Draws::from_rng(&mut rng, 8),
        )
        .unwrap();
        for ep in eps {
            returns.push(f64::from(ep.ret));
            let turn = &ep.tokens[..ep.segments[0].len];
            let entry = seen
                .entry(first.text.clone())
                .or_insert((0.0, vec![0.0; 2]));
            entry.0 += 1.0;
            for (k, c) in ["check", "bet", "fold", "call"].iter().enumerate() {
                if *turn == chat.action_tokens(c).unwrap()[..] {
                    entry.1[k % 2] += 1.0;
                }
            }
        }
    }
    let mut checked = 0;
    for (d, p) in decisions
        .iter()
        .zip(&probs)
        .filter(|(d, _)| d.history.is_empty())
    {
        let Some((n, counts)) = seen.get(&d.observation) else {
            continue;
        };
        for k in 0..2 {
            let f = counts[k] / n;
            let se = (p[k] * (1.0 - p[k]) / n).sqrt().max(1e-3);
            assert!(
                (f - p[k]).abs() < 4.5 * se,
                "{}: {f} vs {} ({n} episodes)",
                d.observation,
                p[k]
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 12,
        "most first decisions were reached: {checked}"
    );
    let n = returns.len() as f64;
    let mean = returns.iter().sum::<f64>() / n;
    let se = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0) / n).sqrt();
    // Paths through an illegal first word reach player 1's second decision with another
    // history than the evaluator's (at most 2 chips of difference each); episodes of one seed
    // are not independent, hence the wider band.
    let slack = 6.0 * se + 2.0 * e.illegal_mass;
    assert!(
        (mean - e.report.ev).abs() < slack,
        "sampled {mean} ± {se}, exact {} (illegal mass {})",
        e.report.ev,
        e.illegal_mass
    );
    // No exact evaluator for a game without one.
    let holdem = tasks::build_env("holdem", &serde_json::Value::Null).unwrap();
    assert!(exact(&policy, &chat, holdem.as_ref(), 1.0)
        .unwrap()
        .is_none());
}

#[test]
fn a_model_opponent_is_deterministic_from_the_seed() {
    let policy = Policy::new_random(&ModelConfig::tiny(), 8, &Device::Cpu).unwrap();
    let chat = Arc::new(Chat::for_model(Tokenizer::byte(), None, true).unwrap());
    let player = Arc::new(ModelPlayer::new(
        Arc::new(InferModel::from_policy(&policy).unwrap()),
        chat.clone(),
        SamplingParams::new(8, chat.stop_tokens()),
        8,
    ));
    let env = tasks::holdem::Holdem::with_model_opponent(Default::default(), player).unwrap();
    let play = |seed| {
        let start = env.reset(seed).unwrap();
        let mut ep = start.episode;
        let mut obs = vec![start.prompt.text];
        loop {
            match ep.step("call") {
                tasks::env::Step::Continue { observation, .. } => obs.push(observation),
                tasks::env::Step::Done { reward } => return (obs, reward),
            }
        }
    };
    for seed in 0..5 {
        assert_eq!(play(seed), play(seed));
    }
}

/// With much illegal mass the exact figure gets the sampled EV of the unshaped game beside
/// it: an untrained model says no word, plays passive (folds to every bet of `always-bet`,
/// −1 a hand), and the reward shaping's penalty is not in the sampled chips.
#[test]
fn much_illegal_mass_brings_the_sampled_ev_of_the_unshaped_game() {
    let env = tasks::build_env(
        "kuhn-poker",
        &serde_json::json!({ "opponent": "always-bet", "illegal_penalty": 1.0 }),
    )
    .unwrap();
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let policy = Policy::new_random(&ModelConfig::tiny(), 3, &Device::Cpu).unwrap();
    let infer = InferModel::from_policy(&policy).unwrap();
    let mut params = SamplingParams::new(8, chat.stop_tokens());
    params.temperature = 1.0;
    let s = spec(env.as_ref(), &chat);
    let check = SampledCheck {
        model: Model::Infer(&infer),
        budget: s.budget,
        context: s.context,
        params: &params,
        seeds: 16,
        group: 4,
        seed: 1,
    };
    let e = exact_checked(&policy, &chat, env.as_ref(), 1.0, Some(check))
        .unwrap()
        .unwrap();
    assert!(e.illegal_mass > 0.9, "{e:?}");
    assert!((e.report.ev + 1.0).abs() < 0.05, "{e:?}");
    let sampled = e.sampled.expect("a sampled check above the threshold");
    assert_eq!(sampled.episodes, 64);
    assert!((sampled.mean_return + 1.0).abs() < 0.1, "{sampled:?}");
    // The shaped game's own returns pay the penalty too.
    let shaped =
        sampled_groups(s, Model::Infer(&infer), 0..16, 4, &params, 1, &mut |_| {}).unwrap();
    assert!(shaped.mean_return < -1.5, "{shaped:?}");
    assert!(shaped.turns_mean >= 1.0);
    // Not asked, not sampled.
    let e = exact(&policy, &chat, env.as_ref(), 1.0).unwrap().unwrap();
    assert_eq!(e.sampled, None);
}
