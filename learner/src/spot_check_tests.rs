use policy::{InferModel, SamplingParams};
use rand::SeedableRng;
use storage::Sample;

use super::*;
use crate::test_util::small_policy;

const T: f32 = 1.2;

/// An honest group: sampled with the rollout engine's inference path (KV cache), its
/// log-probs as the sampler reported them.
fn honest_group(policy: &Policy, n: usize, seed: u64) -> TrajectoryGroup {
    let model = InferModel::from_policy(policy).unwrap();
    let prompt = policy::ByteTokenizer.encode_prompt("7+5=");
    let params = SamplingParams {
        temperature: T,
        ..SamplingParams::new(6, vec![])
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let out = policy::infer::generate(&model, &prompt, n, &params, &mut rng).unwrap();
    TrajectoryGroup {
        group_id: [seed as u8; 16],
        task_id: "arith".into(),
        prompt_id: "7+5".into(),
        version: 0,
        producer: "peer".into(),
        seq: 0,
        signature: None,
        prompt_text: "7+5=".into(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples: out
            .into_iter()
            .enumerate()
            .map(|(k, c)| Sample {
                trajectory_id: [k as u8; 16],
                loss_mask: vec![1; c.tokens.len()],
                response_text: String::new(),
                reward: k as f32,
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: 0,
            })
            .collect(),
    }
}

#[test]
fn honest_group_passes_with_margin() {
    let p = small_policy(1);
    let g = honest_group(&p, 4, 3);
    let (report, passed) = SpotRule::default().check(&p, &g, T).unwrap();
    assert!(passed, "{report:?}");
    assert_eq!(report.tokens, 4 * 6);
    // Two orders of magnitude below the tolerance on the CPU in f32.
    assert!(
        report.max_abs_diff < DEFAULT_TOLERANCE / 100.0,
        "{report:?}"
    );
}

#[test]
fn a_forgery_on_one_token_fails() {
    let p = small_policy(2);
    let honest = honest_group(&p, 4, 5);
    for delta in [0.5f32, 0.05, -0.05] {
        let mut g = honest.clone();
        g.samples[2].sampler_logprobs[3] += delta;
        let (report, passed) = SpotRule::default().check(&p, &g, T).unwrap();
        assert!(!passed, "forgery {delta} passed: {report:?}");
        assert_eq!((report.worst_sample, report.worst_token), (2, 3));
        assert!(
            (report.max_abs_diff - delta.abs()).abs() < 1e-3,
            "{report:?}"
        );
    }
}

#[test]
fn the_wrong_weights_or_temperature_fail() {
    let p = small_policy(3);
    let g = honest_group(&p, 2, 7);
    let other = small_policy(4);
    assert!(!SpotRule::default().check(&other, &g, T).unwrap().1);
    assert!(!SpotRule::default().check(&p, &g, 1.0).unwrap().1);
}

#[test]
fn tolerance_is_an_inclusive_bound_on_the_maximum() {
    let p = small_policy(5);
    let g = honest_group(&p, 2, 9);
    let exact: Vec<Vec<f32>> = g
        .samples
        .iter()
        .map(|s| s.sampler_logprobs.clone())
        .collect();
    let mut off = exact.clone();
    off[1][0] += 0.25;
    let r = compare(&g, &off).unwrap();
    assert_eq!((r.worst_sample, r.worst_token), (1, 0));
    assert!(SpotRule::new(0.3).unwrap().passes(&r));
    assert!(!SpotRule::new(0.2).unwrap().passes(&r));
    // The mean is diluted by the honest tokens; the maximum is not.
    assert!(r.mean_abs_diff < 0.25 / 2.0);
    assert_eq!(compare(&g, &exact).unwrap().max_abs_diff, 0.0);
    assert!(SpotRule::new(0.0).is_err());
    assert!(SpotRule::new(f32::NAN).is_err());
}

#[test]
fn non_finite_reported_logprobs_fail() {
    let p = small_policy(6);
    let mut g = honest_group(&p, 2, 11);
    g.samples[0].sampler_logprobs[1] = f32::NAN;
    let (r, passed) = SpotRule::default().check(&p, &g, T).unwrap();
    assert!(!passed);
    assert_eq!(r.max_abs_diff, f32::INFINITY);
}

#[test]
fn odd_groups_are_errors_not_panics() {
    let p = small_policy(7);
    let honest = honest_group(&p, 2, 13);
    let rule = SpotRule::default();
    let mut cases: Vec<(&str, TrajectoryGroup)> = Vec::new();
    let mut g = honest.clone();
    g.samples.clear();
    cases.push(("no samples", g));
    let mut g = honest.clone();
    g.prompt_tokens.clear();
    cases.push(("empty prompt", g));
    let mut g = honest.clone();
    g.samples[1].response_tokens.clear();
    g.samples[1].sampler_logprobs.clear();
    cases.push(("empty response", g));
    let mut g = honest.clone();
    g.samples[0].sampler_logprobs.pop();
    cases.push(("short log-probs", g));
    let mut g = honest.clone();
    g.samples[1].response_tokens[0] = 260; // vocabulary is 260
    cases.push(("response out of vocab", g));
    let mut g = honest.clone();
    g.prompt_tokens[0] = u32::MAX;
    cases.push(("prompt out of vocab", g));
    let mut g = honest.clone();
    g.prompt_tokens = vec![1; 63]; // context 64
    cases.push(("too long", g));
    for (what, g) in cases {
        let e = rule.check(&p, &g, T);
        assert!(matches!(e, Err(LearnerError::Invalid(_))), "{what}: {e:?}");
    }
    assert!(rule.check(&p, &honest, 0.0).is_err());
    let rows: Vec<Vec<f32>> = vec![vec![0.0]];
    assert!(compare(&honest, &rows).is_err());
}

#[test]
fn fraction_draws_about_the_expected_share_deterministically() {
    let key = [9u8; 32];
    let ids = (0u32..20_000).map(|i| {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&i.to_le_bytes());
        id
    });
    let drawn = ids
        .clone()
        .filter(|id| selected_by_fraction(id, &key, 0.05))
        .count();
    // Binomial(20000, 0.05): mean 1000, sd ≈ 31; ±5 sd.
    assert!((845..=1155).contains(&drawn), "{drawn}");
    let again = ids
        .clone()
        .filter(|id| selected_by_fraction(id, &key, 0.05))
        .count();
    assert_eq!(drawn, again);
    // Another key draws other groups.
    let other = ids
        .clone()
        .filter(|id| {
            selected_by_fraction(id, &key, 0.05) != selected_by_fraction(id, &[8; 32], 0.05)
        })
        .count();
    assert!(other > 0);
    assert!(ids.clone().all(|id| !selected_by_fraction(&id, &key, 0.0)));
    assert!(ids.clone().all(|id| selected_by_fraction(&id, &key, 1.0)));
}

#[test]
fn a_producers_first_groups_are_always_checked() {
    let mut s = SpotSampler::new(0.0, 4, [1; 32]).unwrap();
    for peer in ["a", "b"] {
        for k in 0..4u8 {
            assert_eq!(
                s.select(peer, &[k; 16]),
                Selection::FirstGroups,
                "{peer} {k}"
            );
        }
        for k in 4..50u8 {
            assert_eq!(s.select(peer, &[k; 16]), Selection::Skip);
        }
    }
    let mut all = SpotSampler::new(1.0, 0, [1; 32]).unwrap();
    assert_eq!(all.select("a", &[0; 16]), Selection::Sampled);
    assert!(SpotSampler::new(1.5, 4, [1; 32]).is_err());
    assert!(SpotSampler::new(f64::NAN, 4, [1; 32]).is_err());
}

#[test]
fn the_peer_map_is_bounded_and_forgetting_only_adds_checks() {
    let mut s = SpotSampler::with_cap(0.0, 1, [1; 32], 3).unwrap();
    for p in ["a", "b", "c"] {
        assert!(s.select(p, &[0; 16]).is_checked());
        assert!(!s.select(p, &[1; 16]).is_checked());
    }
    assert_eq!(s.tracked(), 3);
    assert!(s.select("d", &[0; 16]).is_checked());
    assert!(s.tracked() <= 3);
    // "a" was forgotten: its next group counts as a first group again.
    assert!(s.select("a", &[2; 16]).is_checked());
}
