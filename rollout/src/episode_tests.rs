use rand::SeedableRng;

use super::*;
use policy::{Device, InferModel, ModelConfig, Policy, Tokenizer};

fn kuhn(opponent: &str) -> std::sync::Arc<dyn Environment> {
    tasks::build_env("kuhn-poker", &serde_json::json!({ "opponent": opponent })).unwrap()
}

fn chat() -> Chat {
    Chat::for_model(Tokenizer::byte(), None, true).unwrap()
}

fn spec<'a>(env: &'a dyn Environment, chat: &'a Chat, budget: Budget) -> Spec<'a> {
    Spec {
        env,
        chat,
        budget,
        context: ModelConfig::tiny().max_position_embeddings,
    }
}

fn params() -> SamplingParams {
    let mut p = SamplingParams::new(8, vec![policy::ByteTokenizer::EOS]);
    p.temperature = 1.0;
    p
}

/// A policy that says legal words most of the time: a few supervised steps of scripted play.
fn warmed(env: &dyn Environment, chat: &Chat) -> Policy {
    let p = Policy::new_random(&ModelConfig::tiny(), 3, &Device::Cpu).unwrap();
    let s = spec(env, chat, Budget::of(&env.metadata()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let examples = scripted_examples(s, 0..400, &mut rng).unwrap();
    let cfg = policy::sft::WarmStart {
        steps: 120,
        ..policy::sft::WarmStart::default()
    };
    policy::sft::warm_start(&p, &examples, &cfg).unwrap();
    p
}

#[test]
fn played_episodes_replay_with_their_returns_observations_and_masks() {
    let env = kuhn("random");
    let chat = chat();
    let policy = warmed(env.as_ref(), &chat);
    let infer = InferModel::from_policy(&policy).unwrap();
    let s = spec(env.as_ref(), &chat, Budget::of(&env.metadata()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let (mut multi, mut legal) = (0, 0);
    for seed in 0..12u64 {
        let (prompt, prompt_tokens, eps) = play_group(
            s,
            Model::Infer(&infer),
            seed,
            &params(),
            &Draws::from_rng(&mut rng, 4),
        )
        .unwrap();
        assert_eq!(prompt.id, seed.to_string());
        for ep in &eps {
            assert_eq!(ep.tokens.len(), ep.logprobs.len());
            let mask = ep.mask();
            assert_eq!(mask.len(), ep.tokens.len());
            // Observation tokens carry no log-prob; assistant tokens end turns with EOS or
            // fill the turn budget.
            for (m, lp) in mask.iter().zip(&ep.logprobs) {
                assert!(*m == 1 || *lp == 0.0);
            }
            let r = replay(s, seed, &prompt_tokens, &ep.tokens, ep.ret).unwrap();
            assert_eq!(r.segments, ep.segments, "the learner derives the same mask");
            assert_eq!(
                (r.ret, r.turns, r.truncated),
                (ep.ret, ep.turns, ep.truncated)
            );
            multi += usize::from(ep.turns > 1);
            legal += usize::from(
                chat.action_text(&ep.tokens[..ep.segments[0].len])
                    .unwrap()
                    .is_some_and(|a| ["check", "bet", "fold", "call"].contains(&a.as_str())),
            );
            // The carried KV cache gave the log-probs of one forward over the whole history.
            let full = policy::response_logprobs(&policy, &prompt_tokens, &ep.tokens, 1.0).unwrap();
            for (i, &m) in mask.iter().enumerate() {
                if m == 1 {
                    assert!((full[i] - ep.logprobs[i]).abs() <= 1e-4, "token {i}");
                }
            }
        }
    }
    assert!(multi > 0, "some hands take two turns");
    assert!(legal > 16, "the warm start teaches the words: {legal}/48");
}

/// Plays one episode of `seed` with scripted (legal) actions; returns its prompt tokens and
/// the played episode.
fn scripted(s: Spec<'_>, seed: u64, actions: &[&str]) -> (Vec<u32>, Played) {
    let (mut d, _, prompt) = Driver::start(s, seed).unwrap();
    for a in actions {
        if d.next_turn().is_none() {
            break;
        }
        let t = s.chat.action_tokens(a).unwrap();
        if d.finish_turn(&t).unwrap().is_none() {
            break;
        }
    }
    (prompt, d.finish())
}

#[test]
fn forged_observations_returns_and_lengths_do_not_replay() {
    let env = kuhn("always-bet");
    let chat = chat();
    let s = spec(env.as_ref(), &chat, Budget::of(&env.metadata()));
    // Player 1 checks, the opponent bets, player 1 calls: two turns and an observation.
    let seed = (0..100u64)
        .find(|&seed| scripted(s, seed, &["check", "call"]).1.turns == 2)
        .unwrap();
    let (prompt, ep) = scripted(s, seed, &["check", "call"]);
    assert_eq!(
        replay(s, seed, &prompt, &ep.tokens, ep.ret).unwrap().ret,
        ep.ret
    );
    // An edited observation byte (the opponent "checks" instead of betting, say).
    let obs_at = ep.segments[0].len + 3;
    let mut forged = ep.tokens.clone();
    forged[obs_at] ^= 1;
    assert!(matches!(
        replay(s, seed, &prompt, &forged, ep.ret),
        Err(ReplayError::Observation { turn: 1 })
    ));
    // A return that is not the game's.
    assert!(matches!(
        replay(s, seed, &prompt, &ep.tokens, ep.ret + 1.0),
        Err(ReplayError::Return { .. })
    ));
    // Tokens after the end, a record cut short, another deal's prompt.
    let mut long = ep.tokens.clone();
    long.push(65);
    assert!(matches!(
        replay(s, seed, &prompt, &long, ep.ret),
        Err(ReplayError::Trailing { extra: 1 })
    ));
    let short = &ep.tokens[..ep.tokens.len() - 2];
    assert!(matches!(
        replay(s, seed, &prompt, short, ep.ret),
        Err(ReplayError::Short { turn: 2 })
    ));
    let other = (0..100u64)
        .map(|x| scripted(s, x, &[]).0)
        .find(|p| *p != prompt)
        .unwrap();
    assert!(matches!(
        replay(s, seed, &other, &ep.tokens, ep.ret),
        Err(ReplayError::Prompt)
    ));
}

#[test]
fn budgets_cut_turns_and_episodes_the_same_way_on_both_sides() {
    let env = kuhn("always-bet");
    let chat = chat();
    let meta = env.metadata();
    // Two tokens a turn: "bet" never fits, every turn is cut off and is no action (check /
    // fold); the replay splits the record identically.
    let tight = Budget::of(&meta).with(&meta, None, Some(2), None).unwrap();
    let s = spec(env.as_ref(), &chat, tight);
    let policy = Policy::new_random(&ModelConfig::tiny(), 4, &Device::Cpu).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for seed in 0..8 {
        let (_, prompt, eps) = play_group(
            s,
            Model::Train(&policy),
            seed,
            &params(),
            &Draws::from_rng(&mut rng, 3),
        )
        .unwrap();
        for ep in eps {
            assert!(ep
                .segments
                .iter()
                .filter(|g| g.assistant)
                .all(|g| g.len <= 2));
            assert_eq!(
                replay(s, seed, &prompt, &ep.tokens, ep.ret)
                    .unwrap()
                    .segments,
                ep.segments
            );
        }
    }
    // Room for one turn only: a second turn is truncated (the ante is forfeited).
    let one = Budget::of(&meta).with(&meta, Some(1), None, None).unwrap();
    let s1 = spec(env.as_ref(), &chat, one);
    let seed = (0..100u64)
        .find(|&x| {
            scripted(s, x, &["check"]).1.turns == 1
                && scripted(
                    spec(env.as_ref(), &chat, Budget::of(&meta)),
                    x,
                    &["check", "call"],
                )
                .1
                .turns
                    == 2
        })
        .unwrap();
    let (prompt, ep) = scripted(s1, seed, &["check", "call"]);
    assert!(ep.truncated && ep.turns == 1 && ep.ret == -1.0, "{ep:?}");
    assert_eq!(
        replay(s1, seed, &prompt, &ep.tokens, ep.ret).unwrap(),
        Played {
            logprobs: vec![],
            ..ep
        }
    );
}

#[test]
fn scripted_examples_are_legal_actions_in_context() {
    let env = kuhn("equilibrium");
    let chat = chat();
    let s = spec(env.as_ref(), &chat, Budget::of(&env.metadata()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let ex = scripted_examples(s, 0..50, &mut rng).unwrap();
    assert!(ex.len() >= 50, "at least one decision a hand");
    for e in &ex {
        let a = chat.action_text(&e.target).unwrap().unwrap();
        assert!(
            ["check", "bet", "fold", "call"].contains(&a.as_str()),
            "{a}"
        );
        assert_eq!(e.prompt[0], policy::ByteTokenizer::BOS);
        assert_eq!(*e.prompt.last().unwrap(), policy::ByteTokenizer::SEP);
    }
}

/// Hold'em with the embedded model's 256 positions holds one decision per hand; with a
/// config whose context fits 20 decisions (`tasks::holdem::context_for_decisions`) hands
/// play on to their end, replay, and a model of that context samples them.
#[test]
fn holdem_hands_go_past_one_decision_with_a_context_that_fits_twenty() {
    let chat = chat();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let big = ModelConfig {
        max_position_embeddings: tasks::holdem::context_for_decisions(20),
        ..ModelConfig::tiny()
    };
    for opponent in ["random", "calling"] {
        let env = tasks::build_env("holdem", &serde_json::json!({ "opponent": opponent })).unwrap();
        let budget = Budget::of(&env.metadata());
        let small = spec(env.as_ref(), &chat, budget);
        let large = Spec {
            context: big.max_position_embeddings,
            ..small
        };
        let (mut decisions, mut most, mut hands) = (0u32, 0u32, 0u32);
        for seed in 0..60u64 {
            for (s, embedded) in [(small, true), (large, false)] {
                let (mut d, _, prompt) = Driver::start(s, seed).unwrap();
                while d.next_turn().is_some() {
                    let action = d
                        .reference_action(&mut rng)
                        .unwrap()
                        .unwrap_or_else(|| "call".into());
                    if d.finish_turn(&chat.action_tokens(&action).unwrap())
                        .unwrap()
                        .is_none()
                    {
                        break;
                    }
                }
                let played = d.finish();
                if embedded {
                    assert_eq!(played.turns, 1, "{opponent} seed {seed}: 256 positions");
                    continue;
                }
                assert!(!played.truncated, "{opponent} seed {seed}: {played:?}");
                assert!(prompt.len() + played.tokens.len() <= s.context);
                let back = replay(s, seed, &prompt, &played.tokens, played.ret).unwrap();
                assert_eq!(back.turns, played.turns);
                decisions += played.turns;
                most = most.max(played.turns);
                hands += 1;
            }
        }
        let mean = f64::from(decisions) / f64::from(hands);
        assert!(
            mean > 2.0 && most >= 4,
            "{opponent}: {mean} decisions a hand, at most {most}"
        );
    }
    // A model of that context plays and samples hands (its tokens are mostly no action).
    let env = tasks::build_env("holdem", &serde_json::json!({ "opponent": "calling" })).unwrap();
    let p = Policy::new_random(&big, 3, &Device::Cpu).unwrap();
    let infer = InferModel::from_policy(&p).unwrap();
    let s = Spec {
        context: big.max_position_embeddings,
        ..spec(env.as_ref(), &chat, Budget::of(&env.metadata()))
    };
    let mut params = params();
    params.max_new_tokens = tasks::holdem::MAX_TURN_TOKENS;
    let (_, _, eps) = play_group(
        s,
        Model::Infer(&infer),
        1,
        &params,
        &Draws::from_rng(&mut rng, 2),
    )
    .unwrap();
    assert!(eps.iter().all(|e| e.turns >= 1 && !e.truncated), "{eps:?}");
}
