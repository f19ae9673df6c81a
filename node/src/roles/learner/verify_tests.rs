//! Tests of the learner's verification layers on real groups of the `arith` task.

use super::*;
use storage::{NodeKey, Sample};

const SWARM: &str = "verify-test";

struct Worker {
    key: NodeKey,
    peer: PeerId,
}

fn worker(seed: u8) -> Worker {
    let key = NodeKey::from_seed([seed; 32]);
    let peer = p2p::peer_id_from_seed(key.seed());
    Worker { key, peer }
}

fn task() -> Arc<dyn Task> {
    tasks::build_task("arith", &serde_json::Value::Null).unwrap()
}

fn seed() -> [u8; 32] {
    tasks::assign::assignment_seed(SWARM, &[9; 32])
}

/// An honest, signed group: the assigned prompt of `seq`, one correct and one wrong answer.
fn honest(w: &Worker, seq: u64) -> TrajectoryGroup {
    let (task, tok) = (task(), Tokenizer::byte());
    let index = tasks::assign::assigned_index(task.as_ref(), &seed(), &w.peer.to_base58(), seq);
    let prompt = task.prompt(index).unwrap();
    let answers = [
        task.reference_completion(&prompt).unwrap(),
        "nope".to_string(),
    ];
    let samples = answers
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let mut tokens = tok.encode(a).unwrap();
            tokens.push(policy::ByteTokenizer::EOS);
            let text = tok.decode(&tokens).unwrap();
            Sample {
                trajectory_id: [k as u8 + 1; 16],
                reward: task.reward(&prompt, &text).value,
                sampler_logprobs: vec![-0.5; tokens.len()],
                loss_mask: vec![1; tokens.len()],
                response_tokens: tokens,
                response_text: text,
                finished_unix_ms: 0,
            }
        })
        .collect();
    let mut g = TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: task.name().into(),
        prompt_id: prompt.id,
        version: 1,
        seq,
        producer: w.peer.to_base58(),
        prompt_tokens: tok.encode_prompt(&prompt.text).unwrap(),
        prompt_text: prompt.text,
        created_unix_ms: 0,
        samples,
        signature: None,
    };
    g.sign(w.key.signing_key());
    g
}

/// The node's stages behind a pipeline checking structure against `limits`.
fn verifier_with(limits: GroupLimits) -> Pipeline {
    let tok = Arc::new(Tokenizer::byte());
    Pipeline::new(limits)
        .with_stage(SignatureLayer)
        .with_stage(PromptLayer::new(task(), tok.clone(), seed()))
        .with_stage(RewardLayer {
            task: task(),
            tokenizer: tok,
        })
        .with_stage(end_layer(MAX_NEW))
        .with_stage(MaskLayer(Arc::new(learner::ResponseTokens)))
}

/// `rollout.max_new_tokens` of the tests' learner: longer than any honest test answer.
const MAX_NEW: usize = 16;

fn end_layer(max_new_tokens: usize) -> EndLayer {
    EndLayer {
        stops: Tokenizer::byte().eos_ids(),
        max_new_tokens,
        context: policy::ModelConfig::tiny().max_position_embeddings,
    }
}

fn verifier() -> Pipeline {
    verifier_with(GroupLimits::PERMISSIVE)
}

fn check(v: &Pipeline, w: &Worker, g: &TrajectoryGroup) -> Result<Checks, Rejection> {
    v.check_keyed(&w.peer.to_base58(), peer_public_key(&w.peer), 0, g)
}

/// Runs one stage alone on `g` from `w` (at check rate 1).
fn stage(s: &dyn Stage, w: &Worker, g: &TrajectoryGroup) -> Result<(), Rejection> {
    let worker = w.peer.to_base58();
    let input = StageInput {
        worker: &worker,
        worker_key: peer_public_key(&w.peer),
        group: g,
        check_rate: 1.0,
    };
    s.check(&input, &mut Checks::default())
}

fn reason(v: &Pipeline, w: &Worker, g: &TrajectoryGroup) -> Option<&'static str> {
    check(v, w, g).err().map(|e| e.as_str())
}

/// Applies `edit` and re-signs with the worker's own key (a worker lying consistently).
fn edited(w: &Worker, seq: u64, edit: impl FnOnce(&mut TrajectoryGroup)) -> TrajectoryGroup {
    let mut g = honest(w, seq);
    edit(&mut g);
    g.sign(w.key.signing_key());
    g
}

#[test]
fn honest_groups_pass_every_layer() {
    let (v, w) = (verifier(), worker(1));
    assert_eq!(
        v.stage_names(),
        [
            "structure",
            "bad_signature",
            "wrong_prompt",
            "reward_mismatch",
            "response_end",
            "mask_mismatch"
        ]
    );
    for seq in 0..20 {
        let g = honest(&w, seq);
        assert!(
            g.samples[0].reward > g.samples[1].reward,
            "one right answer"
        );
        let checks = check(&v, &w, &g).unwrap_or_else(|e| panic!("seq {seq}: {e}"));
        assert!(checks.rewards_recomputed && !checks.sampling_checked);
    }
    // A repeated pull of the same group (lost ack) is not a reuse.
    assert_eq!(reason(&v, &w, &honest(&w, 3)), None);
}

#[test]
fn signatures_must_be_the_pulled_peers() {
    let (v, w, other) = (verifier(), worker(1), worker(2));
    let mut g = honest(&w, 0);
    g.signature = None;
    assert_eq!(reason(&v, &w, &g), Some("bad_signature"));
    let mut g = honest(&w, 0);
    g.sign(other.key.signing_key());
    assert_eq!(
        reason(&v, &w, &g),
        Some("bad_signature"),
        "signed by another key"
    );
    let mut g = honest(&w, 0);
    g.samples[1].reward = 1.0; // altered after signing
    assert_eq!(reason(&v, &w, &g), Some("bad_signature"));
    // A valid group of `other`, relayed by `w`: the producer is not the pulled peer (the
    // structure stage, first in the chain, says so).
    let g = honest(&other, 0);
    assert_eq!(reason(&v, &w, &g), Some("forged_producer"));
    assert_eq!(reason(&v, &other, &g), None);
}

#[test]
fn peer_ids_give_back_their_ed25519_key() {
    let w = worker(5);
    assert_eq!(
        peer_public_key(&w.peer),
        Some(w.key.verifying_key().to_bytes())
    );
    // A hashed (non-identity) peer id embeds no key.
    assert_eq!(peer_public_key(&PeerId::random()), None);
}

#[test]
fn prompts_must_be_the_assigned_ones() {
    let (v, w) = (verifier(), worker(1));
    // The prompt of seq 1 presented as seq 0 (cherry-picking within the stream).
    let p1 = honest(&w, 1);
    let g = edited(&w, 0, |g| {
        g.prompt_id = p1.prompt_id.clone();
        g.prompt_text = p1.prompt_text.clone();
        g.prompt_tokens = p1.prompt_tokens.clone();
    });
    assert_ne!(honest(&w, 0).prompt_id, p1.prompt_id);
    assert_eq!(reason(&v, &w, &g), Some("wrong_prompt"));
    let g = edited(&w, 0, |g| g.prompt_text.push(' '));
    assert_eq!(reason(&v, &w, &g), Some("wrong_prompt"), "text");
    let g = edited(&w, 0, |g| g.prompt_tokens.insert(1, 32));
    assert_eq!(reason(&v, &w, &g), Some("wrong_prompt"), "tokens");
    let g = edited(&w, 0, |g| g.task_id = "knights-knaves".into());
    assert_eq!(reason(&v, &w, &g), Some("wrong_prompt"), "task");
    // Another worker's stream differs: its seq 0 is not ours.
    let theirs = honest(&worker(2), 0);
    let g = edited(&w, 0, |g| {
        g.prompt_id = theirs.prompt_id.clone();
        g.prompt_text = theirs.prompt_text.clone();
        g.prompt_tokens = theirs.prompt_tokens.clone();
    });
    if theirs.prompt_id != honest(&w, 0).prompt_id {
        assert_eq!(reason(&v, &w, &g), Some("wrong_prompt"));
    }
}

#[test]
fn a_sequence_number_is_used_once() {
    let (v, w) = (verifier(), worker(1));
    assert_eq!(reason(&v, &w, &honest(&w, 7)), None);
    // The same seq (so the same, assigned prompt) with another group: a second draw.
    let again = edited(&w, 7, |g| g.group_id = [0xAA; 16]);
    assert_eq!(reason(&v, &w, &again), Some("wrong_prompt"));
    // Other workers have their own numbers.
    let other = worker(2);
    assert_eq!(reason(&v, &other, &honest(&other, 7)), None);
}

#[test]
fn the_seq_ledger_is_bounded_and_refuses_what_it_forgot() {
    let mut l = SeqLedger::default();
    let p = worker(1).peer.to_base58();
    for s in 0..(SEQ_WINDOW as u64 + 10) {
        l.admit(&p, s, [1; 16]).unwrap();
    }
    assert_eq!(
        l.admit(&p, 5, [1; 16]),
        Err(SeqRefusal::BelowWindow { seq: 5, floor: 10 })
    );
    let top = SEQ_WINDOW as u64 + 5;
    assert!(l.admit(&p, top, [1; 16]).is_ok());
    assert_eq!(l.admit(&p, top, [2; 16]), Err(SeqRefusal::Reused(top)));
    for _ in 0..(MAX_TRACKED_WORKERS + 5) {
        l.admit(&PeerId::random().to_base58(), 0, [0; 16]).unwrap();
    }
    assert!(l.workers.len() <= MAX_TRACKED_WORKERS);
}

#[test]
fn rewards_are_recomputed() {
    let (v, w) = (verifier(), worker(1));
    let g = edited(&w, 0, |g| g.samples[1].reward = 1.0);
    let e = check(&v, &w, &g).unwrap_err();
    assert_eq!(e.as_str(), "reward_mismatch");
    assert!(e.to_string().contains("recomputed"), "{e}");
    let g = edited(&w, 0, |g| g.samples[0].reward -= 1e-3);
    assert_eq!(
        reason(&v, &w, &g),
        Some("reward_mismatch"),
        "small lies too"
    );
    let g = edited(&w, 0, |g| g.samples[0].reward += 1e-7);
    assert_eq!(reason(&v, &w, &g), None, "within the tolerance");
    // Text that scores but is not what the tokens say.
    let right = honest(&w, 0).samples[0].response_text.clone();
    let g = edited(&w, 0, |g| {
        g.samples[1].response_text = right;
        g.samples[1].reward = g.samples[0].reward;
    });
    assert_eq!(reason(&v, &w, &g), Some("reward_mismatch"));
    // An unknown prompt id cannot be scored (with the prompt layer off).
    let rewards_only = Pipeline::new(GroupLimits::PERMISSIVE).with_stage(RewardLayer {
        task: task(),
        tokenizer: Arc::new(Tokenizer::byte()),
    });
    let g = edited(&w, 0, |g| g.prompt_id = "no-such".into());
    assert_eq!(reason(&rewards_only, &w, &g), Some("wrong_prompt"));
}

#[test]
fn responses_end_where_a_sampler_stops() {
    let (w, v) = (worker(5), verifier());
    let eos = policy::ByteTokenizer::EOS;
    // The honest group's answers end at their stop token.
    assert_eq!(reason(&v, &w, &honest(&w, 1)), None);
    // An edit that keeps every token an honest draw but chooses where the response ends: cut
    // before its stop token (a better-scoring prefix), or continued past it.
    let retext = |s: &mut Sample| {
        s.response_text = Tokenizer::byte().decode(&s.response_tokens).unwrap();
        s.sampler_logprobs.truncate(s.response_tokens.len());
        s.sampler_logprobs.resize(s.response_tokens.len(), -0.5);
        s.loss_mask = vec![1; s.response_tokens.len()];
    };
    let cut = edited(&w, 2, |g| {
        let s = &mut g.samples[1];
        s.response_tokens.pop();
        s.response_tokens.pop();
        retext(s);
        s.reward = task()
            .reward(
                &task().prompt_by_id(&g.prompt_id).unwrap(),
                &s.response_text,
            )
            .value;
    });
    assert_eq!(reason(&v, &w, &cut), Some("response_end"));
    let e = check(&v, &w, &cut).unwrap_err().to_string();
    assert!(
        e.contains("sample 1: ends after 3 tokens without a stop token") && e.contains("16"),
        "{e}"
    );
    let continued = edited(&w, 3, |g| {
        let s = &mut g.samples[0];
        s.response_tokens
            .extend(Tokenizer::byte().encode("1").unwrap());
        retext(s);
    });
    let e = stage(&end_layer(MAX_NEW), &w, &continued).unwrap_err();
    assert_eq!(e.as_str(), "response_end");
    assert!(
        e.to_string()
            .contains("goes on for 1 tokens after its stop token"),
        "{e}"
    );
    // Without a stop token, exactly max_new_tokens is how a sampler ends...
    let full = |len: usize| {
        edited(&w, 4, |g| {
            for s in &mut g.samples {
                s.response_tokens = vec![u32::from(b'7'); len];
                retext(s);
            }
        })
    };
    assert!(stage(&end_layer(MAX_NEW), &w, &full(MAX_NEW)).is_ok());
    for len in [MAX_NEW - 1, MAX_NEW + 1] {
        assert!(stage(&end_layer(MAX_NEW), &w, &full(len)).is_err(), "{len}");
    }
    // ... or the context's end, when the prompt leaves fewer.
    let g = full(MAX_NEW);
    let short = EndLayer {
        context: g.prompt_tokens.len() + 10,
        ..end_layer(MAX_NEW)
    };
    assert!(stage(&short, &w, &g).is_err());
    assert!(stage(&short, &w, &full(10)).is_ok());
    // A stop token as the last of max_new_tokens is a stop like any other.
    let mut last = vec![u32::from(b'7'); MAX_NEW - 1];
    last.push(eos);
    let g = edited(&w, 5, |g| {
        g.samples[0].response_tokens = last;
        retext(&mut g.samples[0]);
    });
    assert!(stage(&end_layer(MAX_NEW), &w, &g).is_ok());
    assert_eq!(
        super::super::penalty::penalty(&e).strike,
        Some(super::super::penalty::Strike::InvalidGroup)
    );
}

#[test]
fn the_stages_refusals_are_penalised_by_the_one_match() {
    use super::super::penalty::{penalty, Penalty, Strike};
    let strike = |r: Rejection| penalty(&r).strike;
    let d = String::new;
    assert_eq!(
        strike(Rejection::BadSignature(d())),
        Some(Strike::BadSignature)
    );
    assert_eq!(
        strike(Rejection::WrongPrompt(d())),
        Some(Strike::WrongPrompt)
    );
    assert_eq!(
        strike(Rejection::ReplayMismatch(d())),
        Some(Strike::RewardMismatch)
    );
    assert_eq!(
        strike(Rejection::StaleSeq(d())),
        None,
        "an honest worker's late group"
    );
    assert_eq!(strike(Rejection::EnvFailed(d())), None);
    // Proof bans at once, under the strike that names what happened.
    assert_eq!(
        penalty(&Rejection::LogprobForged(d())),
        Penalty {
            strike: Some(Strike::LogprobMismatch),
            ban_at_once: true
        }
    );
}

#[test]
fn the_config_selects_the_stages() {
    let mut c = NodeConfig::new(crate::config::Role::Learner, SWARM, "d".into());
    let names = |c: &NodeConfig| {
        pipeline_for_learner(c, &[9; 32], GroupLimits::PERMISSIVE)
            .unwrap()
            .stage_names()
    };
    assert_eq!(
        names(&c),
        [
            "structure",
            "bad_signature",
            "wrong_prompt",
            "reward_mismatch",
            "response_end",
            "mask_mismatch"
        ]
    );
    c.verification.signatures = false;
    c.verification.recompute_rewards = false;
    assert_eq!(
        names(&c),
        ["structure", "wrong_prompt", "response_end", "mask_mismatch"]
    );
    c.verification.assigned_prompts = false;
    // The learner owns the loss mask, and where a response ends: those checks are never
    // switched off.
    assert_eq!(names(&c), ["structure", "response_end", "mask_mismatch"]);
    // The learner's prompt stage agrees with a worker configured with its key.
    let c = NodeConfig::new(crate::config::Role::Learner, SWARM, "d".into());
    let v = pipeline_for_learner(&c, &[9; 32], GroupLimits::PERMISSIVE).unwrap();
    let w = worker(3);
    assert_eq!(reason(&v, &w, &honest(&w, 11)), None);
    assert_eq!(v.probation(), c.verification.probation());
}

#[cfg(feature = "adversary")]
#[test]
fn every_test_only_group_attack_is_caught_where_it_should_be() {
    use crate::misbehave::Attack;
    use storage::record::DEFAULT_LOGPROB_FLOOR;
    let model = policy::ModelConfig::tiny();
    let limits = GroupLimits {
        vocab_size: model.vocab_size,
        max_context: model.max_position_embeddings,
        logprob_floor: DEFAULT_LOGPROB_FLOOR,
        group_size: 2,
    };
    let (v, w) = (verifier_with(limits), worker(1));
    let full = |g: &TrajectoryGroup| reason(&v, &w, g);
    let cases = [
        (Attack::InflatedReward, Some("reward_mismatch")),
        // In range: only the log-prob spot check can tell (not one of these layers).
        (Attack::ForgedLogprobs, None),
        (Attack::InvalidLogprob, Some("logprob_out_of_range")),
        (Attack::OutOfVocab, Some("token_out_of_vocab")),
        (Attack::Overlong, Some("too_long")),
        (Attack::BadSignature, None),
        (Attack::MaskPoisoning, Some("mask_mismatch")),
        // Forged log-probs too (once past their honest prefix).
        (Attack::LateLiar, None),
        (Attack::SybilRekey, None),
    ];
    use crate::misbehave::{LATE_LIAR_HONEST_GROUPS, SYBIL_HONEST_GROUPS};
    use crate::roles::rollout::forges;
    assert!(!forges(Attack::LateLiar, LATE_LIAR_HONEST_GROUPS - 1));
    assert!(forges(Attack::LateLiar, LATE_LIAR_HONEST_GROUPS));
    assert!(!forges(Attack::SybilRekey, SYBIL_HONEST_GROUPS - 1));
    assert!(forges(Attack::SybilRekey, SYBIL_HONEST_GROUPS));
    assert!(forges(Attack::InflatedReward, 0));
    for (seq, (attack, want)) in cases.into_iter().enumerate() {
        let mut g = honest(&w, seq as u64);
        assert_eq!(full(&g), None, "{attack}: the honest group passes");
        let before = g.clone();
        crate::roles::rollout::tamper(
            attack,
            &mut g,
            model.vocab_size,
            model.max_position_embeddings,
        );
        g.sign(w.key.signing_key());
        if attack == Attack::BadSignature {
            assert_eq!(g, before, "tamper leaves signing to the hook");
            g.sign(NodeKey::from_seed([77; 32]).signing_key());
            assert_eq!(full(&g), Some("bad_signature"));
        } else {
            assert_ne!(g, before, "{attack} changed nothing");
            g.validate()
                .unwrap_or_else(|e| panic!("{attack}: stored groups must be valid: {e}"));
            assert_eq!(full(&g), want, "{attack}");
        }
    }
}

#[test]
fn rewards_of_every_built_in_task_are_recomputed() {
    use tasks::jsonl_math::{JsonlMath, JsonlMathParams};
    let jsonl: Arc<dyn Task> = Arc::new(
        JsonlMath::from_bytes(
            JsonlMathParams {
                path: "mem".into(),
                instruction: None,
            },
            b"{\"prompt\": \"What is 6*7?\", \"answer\": \"42\"}\n{\"prompt\": \"Half of 3?\", \"answer\": \"1.5\"}\n",
        )
        .unwrap(),
    );
    let all: [Arc<dyn Task>; 3] = [
        task(),
        tasks::build_task("knights-knaves", &serde_json::Value::Null).unwrap(),
        jsonl,
    ];
    let tok = Tokenizer::byte();
    for task in all {
        for index in 0..2 {
            let prompt = task.prompt(index).unwrap();
            let right = task.reference_completion(&prompt).unwrap();
            let samples: Vec<Sample> = [right.as_str(), "I do not know."]
                .iter()
                .map(|a| {
                    let tokens = tok.encode(a).unwrap();
                    Sample {
                        trajectory_id: [0; 16],
                        reward: task.reward(&prompt, a).value,
                        sampler_logprobs: vec![-1.0; tokens.len()],
                        loss_mask: vec![1; tokens.len()],
                        response_tokens: tokens,
                        response_text: a.to_string(),
                        finished_unix_ms: 0,
                    }
                })
                .collect();
            assert!(samples[0].reward > samples[1].reward, "{}", task.name());
            let mut g = TrajectoryGroup {
                group_id: [0; 16],
                task_id: task.name().into(),
                prompt_id: prompt.id.clone(),
                version: 0,
                seq: 0,
                producer: String::new(),
                prompt_tokens: tok.encode_prompt(&prompt.text).unwrap(),
                prompt_text: prompt.text,
                created_unix_ms: 0,
                samples,
                signature: None,
            };
            assert_eq!(
                check_rewards(task.as_ref(), &tok, &g),
                Ok(()),
                "{}",
                task.name()
            );
            g.samples[1].reward = g.samples[0].reward;
            let e = check_rewards(task.as_ref(), &tok, &g).unwrap_err();
            assert_eq!(e.as_str(), "reward_mismatch", "{}: {e:?}", task.name());
        }
    }
}

/// An honest kuhn-poker group of scripted two-turn episodes where possible, assigned to
/// (`w`, `seq`), with the prompt layer's and the replay layer's views.
fn kuhn_group(w: &Worker, seq: u64) -> (TrajectoryGroup, PromptLayer, ReplayLayer) {
    let env =
        tasks::build_env("kuhn-poker", &serde_json::json!({"opponent": "always-bet"})).unwrap();
    let chat = Arc::new(Chat::for_model(Tokenizer::byte(), None, true).unwrap());
    let budget = Budget::of(&env.metadata());
    let context = policy::ModelConfig::tiny().max_position_embeddings;
    let states = env.metadata().num_initial_states;
    let index = tasks::assign::index_for(states, &seed(), &w.peer.to_base58(), seq);
    let spec = rollout::episode::Spec {
        env: env.as_ref(),
        chat: &chat,
        budget,
        context,
    };
    let mut samples = Vec::new();
    let mut prompt = (String::new(), String::new(), Vec::new());
    for (k, actions) in [["check", "call"], ["bet", "call"]].iter().enumerate() {
        let (mut d, p, tokens) = rollout::episode::Driver::start(spec, index).unwrap();
        prompt = (p.id, p.text, tokens);
        for a in actions {
            if d.next_turn().is_none()
                || d.finish_turn(&chat.action_tokens(a).unwrap())
                    .unwrap()
                    .is_none()
            {
                break;
            }
        }
        let ep = d.finish();
        samples.push(Sample {
            trajectory_id: [k as u8 + 1; 16],
            reward: ep.ret,
            sampler_logprobs: ep
                .mask()
                .iter()
                .map(|&m| if m == 1 { -0.5 } else { 0.0 })
                .collect(),
            loss_mask: ep.mask(),
            response_text: chat.tokenizer().decode(&ep.tokens).unwrap(),
            response_tokens: ep.tokens,
            finished_unix_ms: 0,
        });
    }
    let mut g = TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: "kuhn-poker".into(),
        prompt_id: prompt.0,
        version: 1,
        seq,
        producer: w.peer.to_base58(),
        prompt_text: prompt.1,
        prompt_tokens: prompt.2,
        created_unix_ms: 0,
        samples,
        signature: None,
    };
    g.sign(w.key.signing_key());
    let prompts = PromptLayer::for_env(env.clone(), chat.clone(), seed());
    let replay = ReplayLayer {
        env,
        chat,
        budget,
        context,
    };
    (g, prompts, replay)
}

#[test]
fn environment_groups_are_replayed_and_forgeries_refused() {
    let w = worker(3);
    // A seq whose hand gives the agent two turns when it checks (player 1).
    let (seq, (g, prompts, replay)) = (0..64u64)
        .map(|s| (s, kuhn_group(&w, s)))
        .find(|(_, (g, _, _))| g.samples[0].loss_mask.contains(&0))
        .unwrap();
    let _ = seq;
    assert!(stage(&prompts, &w, &g).is_ok());
    assert!(stage(&replay, &w, &g).is_ok(), "an honest group replays");
    let refused = |g: &TrajectoryGroup| match stage(&replay, &w, g) {
        Err(Rejection::ReplayMismatch(detail)) => detail,
        other => panic!("not refused: {other:?}"),
    };
    let mut forged = g.clone();
    forged.samples[0].reward += 1.0;
    assert!(refused(&forged).contains("reported return"));
    let mut forged = g.clone();
    let s = &mut forged.samples[0];
    let i = s.loss_mask.iter().position(|&m| m == 0).unwrap();
    s.response_tokens[i] ^= 1;
    s.response_text = Tokenizer::byte().decode(&s.response_tokens).unwrap();
    assert!(refused(&forged).contains("observation"));
    let mut forged = g.clone();
    forged.samples[0].loss_mask.iter_mut().for_each(|m| *m = 1);
    assert!(refused(&forged).contains("loss mask"));
    let mut forged = g.clone();
    forged.prompt_id = "x".into();
    assert!(refused(&forged).contains("initial state"));
    // The prompt layer checks the rendered initial state too.
    let mut other = g.clone();
    other.prompt_tokens.push(65);
    assert!(stage(&prompts, &w, &other).is_err());
}

/// The repository's stdlib-only test environment (`envs/testenv.py`) with `params`.
fn testenv(params: serde_json::Value) -> Arc<dyn Environment> {
    let spec = tasks::external::ExternalSpec {
        command: vec![
            "python3".into(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../envs/testenv.py").into(),
        ],
        call_timeout_ms: 5_000,
        determinism_seeds: 0,
        ..Default::default()
    };
    tasks::external::start("testenv", &params, &spec).unwrap()
}

/// An honest group of two-turn testenv episodes assigned to (`w`, `seq`), with the replay
/// layer of `replay_env`.
fn external_group(
    w: &Worker,
    seq: u64,
    env: &Arc<dyn Environment>,
    replay_env: Arc<dyn Environment>,
) -> (TrajectoryGroup, ReplayLayer) {
    let chat = Arc::new(Chat::for_model(Tokenizer::byte(), None, true).unwrap());
    let budget = Budget::of(&env.metadata());
    let context = policy::ModelConfig::tiny().max_position_embeddings;
    let index = tasks::assign::index_for(None, &seed(), &w.peer.to_base58(), seq);
    let spec = rollout::episode::Spec {
        env: env.as_ref(),
        chat: &chat,
        budget,
        context,
    };
    let mut samples = Vec::new();
    let mut prompt = (String::new(), String::new(), Vec::new());
    let mut rng = rand::rngs::mock::StepRng::new(0, 1);
    for k in 0..2u8 {
        let (mut d, p, tokens) = rollout::episode::Driver::start(spec, index).unwrap();
        prompt = (p.id, p.text, tokens);
        while d.next_turn().is_some() {
            // The first sample answers right, the second says something else.
            let a = match k {
                0 => d.reference_action(&mut rng).unwrap().unwrap(),
                _ => "no".to_string(),
            };
            if d.finish_turn(&chat.action_tokens(&a).unwrap())
                .unwrap()
                .is_none()
            {
                break;
            }
        }
        let ep = d.finish();
        samples.push(Sample {
            trajectory_id: [k + 1; 16],
            reward: ep.ret,
            sampler_logprobs: ep
                .mask()
                .iter()
                .map(|&m| if m == 1 { -0.5 } else { 0.0 })
                .collect(),
            loss_mask: ep.mask(),
            response_text: chat.tokenizer().decode(&ep.tokens).unwrap(),
            response_tokens: ep.tokens,
            finished_unix_ms: 0,
        });
    }
    let mut g = TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: "testenv".into(),
        prompt_id: prompt.0,
        version: 1,
        seq,
        producer: w.peer.to_base58(),
        prompt_text: prompt.1,
        prompt_tokens: prompt.2,
        created_unix_ms: 0,
        samples,
        signature: None,
    };
    g.sign(w.key.signing_key());
    let replay = ReplayLayer {
        env: replay_env,
        chat,
        budget,
        context,
    };
    (g, replay)
}

#[test]
fn external_episodes_are_replayed_forgeries_struck_and_env_failures_charge_nobody() {
    let w = worker(4);
    let env = testenv(serde_json::json!({"turns": 2}));
    let (g, replay) = external_group(&w, 3, &env, env.clone());
    assert_eq!(
        g.samples[0].reward, 1.0,
        "the reference answers earn the whole return"
    );
    assert_eq!(g.samples[1].reward, 0.0);
    assert!(stage(&replay, &w, &g).is_ok(), "an honest group replays");
    let mut forged = g.clone();
    forged.samples[1].reward = 1.0;
    match stage(&replay, &w, &forged) {
        Err(Rejection::ReplayMismatch(detail)) => {
            assert!(detail.contains("reported return"), "{detail}");
        }
        other => panic!("a forged return passed: {other:?}"),
    }
    // The learner's program crashes at turn 2 while replaying: refused, nobody struck.
    let crashing = testenv(serde_json::json!({"turns": 2, "fault": "crash"}));
    let (g, replay) = external_group(&w, 5, &env, crashing);
    match stage(&replay, &w, &g) {
        Err(Rejection::EnvFailed(detail)) => {
            assert!(detail.contains("exited"), "{detail}");
        }
        other => panic!("not refused: {other:?}"),
    }
}
