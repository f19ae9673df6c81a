use candle_core::DType;
use policy::draw::{Draws, SampleStream};
use policy::{InferModel, SamplingParams};
use storage::Sample;

use super::*;
use crate::mask::ResponseTokens;
use crate::test_util::small_policy;

const T: f32 = 1.2;
const SEED: [u8; 32] = [7; 32];
const PRODUCER: &str = "worker";

fn params(top_p: f32) -> SamplingParams {
    SamplingParams {
        temperature: T,
        top_p,
        ..SamplingParams::new(6, vec![])
    }
}

fn settings(top_p: f32, tolerance: f32, delta: f64) -> CheckSettings {
    CheckSettings {
        rule: params(top_p).rule(),
        tolerance,
        delta,
        seed: SEED,
        check_draws: true,
    }
}

const F32: (f32, f64) = (1e-3, 1e-4);

fn group_of(seq: u64, prompt: Vec<u32>, samples: Vec<(Vec<u32>, Vec<f32>)>) -> TrajectoryGroup {
    TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: "arith".into(),
        prompt_id: "p".into(),
        version: 0,
        producer: PRODUCER.into(),
        seq,
        signature: None,
        prompt_text: String::new(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples: samples
            .into_iter()
            .enumerate()
            .map(|(k, (tokens, logprobs))| Sample {
                trajectory_id: [k as u8; 16],
                loss_mask: vec![1; tokens.len()],
                response_text: String::new(),
                reward: 0.0,
                response_tokens: tokens,
                sampler_logprobs: logprobs,
                finished_unix_ms: 0,
            })
            .collect(),
    }
}

/// An honest group: the prescribed uniforms of (SEED, PRODUCER, seq), sampled on the inference
/// path in `dtype` (f16: a half-precision worker).
fn honest(policy: &Policy, seq: u64, n: usize, top_p: f32, dtype: DType) -> TrajectoryGroup {
    let model = InferModel::new(policy, dtype).unwrap();
    let prompt = policy::ByteTokenizer.encode_prompt("7+5=");
    let draws = Draws::prescribed(&SEED, PRODUCER, seq, n);
    let out = policy::infer::generate_with(&model, &prompt, &params(top_p), &draws).unwrap();
    group_of(
        seq,
        prompt,
        out.into_iter().map(|c| (c.tokens, c.logprobs)).collect(),
    )
}

fn check(policy: &Policy, g: &TrajectoryGroup, s: &CheckSettings) -> (SpotVerdict, CheckReport) {
    let r = check_group(policy, g, s, &ResponseTokens).unwrap();
    (r.verdict(s.tolerance), r)
}

#[test]
fn honest_groups_pass_on_every_path_and_top_p() {
    let p = small_policy(1);
    for top_p in [1.0, 0.9] {
        let s = settings(top_p, F32.0, F32.1);
        for seq in 0..6 {
            let g = honest(&p, seq, 4, top_p, DType::F32);
            let (v, r) = check(&p, &g, &s);
            assert_eq!(v, SpotVerdict::Pass, "{r:?}");
            assert_eq!(r.draws_checked, 4 * 6);
            assert_eq!(r.not_drawn, 0);
        }
        // The training-forward decoders draw the same tokens from the same uniforms.
        let prompt = policy::ByteTokenizer.encode_prompt("7+5=");
        let draws = Draws::prescribed(&SEED, PRODUCER, 3, 4);
        let infer = honest(&p, 3, 4, top_p, DType::F32);
        for path in [
            policy::GenerationPath::Batched,
            policy::GenerationPath::Sequential,
        ] {
            let out =
                policy::sampling::generate_with(&p, &prompt, &params(top_p), path, &draws).unwrap();
            let tokens: Vec<&Vec<u32>> = out.iter().map(|c| &c.tokens).collect();
            let expected: Vec<&Vec<u32>> =
                infer.samples.iter().map(|s| &s.response_tokens).collect();
            assert_eq!(tokens, expected, "{path:?} top_p {top_p}");
        }
    }
}

#[test]
fn forced_tokens_with_honest_logprobs_are_not_drawn() {
    let p = small_policy(2);
    let s = settings(1.0, F32.0, F32.1);
    let mut caught = 0;
    for seq in 0..10 {
        let mut g = honest(&p, seq, 4, 1.0, DType::F32);
        // The forger writes the response it wants and reports its true log-probs.
        let want = policy::ByteTokenizer.encode_prompt("12 12");
        let lp = policy::response_logprobs(&p, &g.prompt_tokens, &want, T).unwrap();
        g.samples[1].response_tokens = want;
        g.samples[1].sampler_logprobs = lp;
        g.samples[1].loss_mask = vec![1; 5];
        let (v, r) = check(&p, &g, &s);
        assert_ne!(v, SpotVerdict::LogprobDrift, "honest log-probs: {r:?}");
        if v == SpotVerdict::NotDrawn {
            caught += 1;
            let w = r.worst_draw.unwrap();
            assert_eq!(w.sample, 1);
            assert!(w.excess > 0.0);
        }
    }
    // Five written tokens over a ~260-token vocabulary: survival ≈ Π(p + 2δ) ≈ 0.
    assert_eq!(caught, 10);
}

#[test]
fn forged_logprobs_are_drift_and_the_wrong_version_is_not_drawn() {
    let p = small_policy(3);
    let s = settings(1.0, F32.0, F32.1);
    let honest_g = honest(&p, 0, 4, 1.0, DType::F32);
    let mut g = honest_g.clone();
    g.samples[2].sampler_logprobs[3] += 0.05;
    let (v, r) = check(&p, &g, &s);
    assert_eq!(v, SpotVerdict::LogprobDrift);
    assert_eq!((r.logprobs.worst_sample, r.logprobs.worst_token), (2, 3));
    // Sampled from other weights, log-probs recomputed under the claimed ones: every
    // log-prob matches, the draws do not.
    let claimed = small_policy(4);
    let mut stale = honest_g;
    for s in &mut stale.samples {
        s.sampler_logprobs =
            policy::response_logprobs(&claimed, &stale.prompt_tokens, &s.response_tokens, T)
                .unwrap();
    }
    let (v, r) = check(&claimed, &stale, &s);
    assert_eq!(v, SpotVerdict::NotDrawn, "{r:?}");
    assert!(r.logprobs.max_abs_diff < F32.0);
    // Another producer's or group's uniforms do not fit either.
    let g = honest(&p, 5, 4, 1.0, DType::F32);
    let mut other = g.clone();
    other.seq = 6;
    assert_eq!(check(&p, &other, &s).0, SpotVerdict::NotDrawn);
    let mut other = g;
    other.producer = "someone".into();
    assert_eq!(check(&p, &other, &s).0, SpotVerdict::NotDrawn);
}

#[test]
fn an_f16_worker_passes_with_the_f16_margins() {
    let p = small_policy(5);
    let (tol, delta) = (DEFAULT_TOLERANCE.f16, DEFAULT_MARGIN.f16);
    for top_p in [1.0, 0.9] {
        let s = settings(top_p, tol, delta);
        for seq in 0..6 {
            let g = honest(&p, seq, 4, top_p, DType::F16);
            let (v, r) = check(&p, &g, &s);
            assert_eq!(v, SpotVerdict::Pass, "seq {seq} top_p {top_p}: {r:?}");
        }
    }
}

/// A multi-turn mask: tokens the environment inserted (mask 0) take no position, and a
/// turn continues its sample's counter where the previous turn ended.
#[test]
fn only_sampled_tokens_are_checked_and_positions_continue_across_turns() {
    struct Turns(Vec<Vec<u8>>);
    impl MaskRule for Turns {
        fn name(&self) -> &'static str {
            "turns"
        }
        fn mask(&self, _: &TrajectoryGroup, i: usize) -> std::result::Result<Vec<u8>, String> {
            Ok(self.0[i].clone())
        }
    }
    let p = small_policy(6);
    let model = InferModel::from_policy(&p).unwrap();
    let prompt = policy::ByteTokenizer.encode_prompt("7+5=");
    let params = SamplingParams {
        temperature: T,
        ..SamplingParams::new(3, vec![])
    };
    let stream = SampleStream::prescribed(&SEED, PRODUCER, 9, 0);
    let turn1 = policy::infer::generate_with(
        &model,
        &prompt,
        &params,
        &Draws::from_streams(vec![(stream.clone(), 0)]),
    )
    .unwrap()
    .remove(0);
    let observation = policy::ByteTokenizer.encode_prompt("ok");
    let mut context = prompt.clone();
    context.extend(&turn1.tokens);
    context.extend(&observation);
    let turn2 = policy::infer::generate_with(
        &model,
        &context,
        &params,
        &Draws::from_streams(vec![(stream, turn1.tokens.len() as u64)]),
    )
    .unwrap()
    .remove(0);
    let mut tokens = turn1.tokens.clone();
    tokens.extend(&observation);
    tokens.extend(&turn2.tokens);
    let mut logprobs = turn1.logprobs.clone();
    logprobs.extend(vec![0.0; observation.len()]);
    logprobs.extend(&turn2.logprobs);
    let mut mask = vec![1u8; 3];
    mask.extend(vec![0; observation.len()]);
    mask.extend(vec![1; 3]);
    let g = group_of(9, prompt, vec![(tokens, logprobs)]);
    let s = settings(1.0, F32.0, F32.1);
    let r = check_group(&p, &g, &s, &Turns(vec![mask.clone()])).unwrap();
    assert_eq!(
        (r.verdict(s.tolerance), r.draws_checked),
        (SpotVerdict::Pass, 6),
        "{r:?}"
    );
    // Restarting the counter in the second turn is caught.
    let restarted = policy::infer::generate_with(
        &model,
        &{
            let mut c = g.prompt_tokens.clone();
            c.extend(&turn1.tokens);
            c.extend(&observation);
            c
        },
        &params,
        &Draws::prescribed(&SEED, PRODUCER, 9, 1),
    )
    .unwrap()
    .remove(0);
    if restarted.tokens != turn2.tokens {
        let mut bad = g.clone();
        let k = 3 + observation.len();
        bad.samples[0].response_tokens[k..].copy_from_slice(&restarted.tokens);
        bad.samples[0].sampler_logprobs[k..].copy_from_slice(&restarted.logprobs);
        let r = check_group(&p, &bad, &s, &Turns(vec![mask])).unwrap();
        assert_eq!(r.verdict(s.tolerance), SpotVerdict::NotDrawn, "{r:?}");
    }
}

#[test]
fn without_draw_checks_only_logprobs_are_judged() {
    let p = small_policy(7);
    let mut s = settings(1.0, F32.0, F32.1);
    s.check_draws = false;
    let mut g = honest(&p, 0, 2, 1.0, DType::F32);
    g.seq = 99; // uniforms of another group: not looked at
    let (v, r) = check(&p, &g, &s);
    assert_eq!((v, r.draws_checked), (SpotVerdict::Pass, 0));
    let mut bad = g.clone();
    bad.samples[0].response_tokens[0] = 300; // outside the 260-token vocabulary
    assert!(matches!(
        check_group(&p, &bad, &s, &ResponseTokens),
        Err(LearnerError::Invalid(_))
    ));
}
