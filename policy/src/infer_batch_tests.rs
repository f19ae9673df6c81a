//! Static-buffer decoding against the per-group decode, and groups batched against one group
//! at a time. The stated tolerance: the same tokens, log-probs within 1e-5 (f32 on the CPU;
//! the attention sums run over a longer, masked window, so they may round differently).

use candle_core::Device;
use rand::SeedableRng;

use super::*;
use crate::config::{Arch, ModelConfig};
use crate::weights::Policy;

const LOGPROB_TOLERANCE: f32 = 1e-5;

fn model(cfg: &ModelConfig, seed: u64) -> InferModel {
    InferModel::from_policy(&Policy::new_random(cfg, seed, &Device::Cpu).unwrap()).unwrap()
}

fn same(a: &[Completion], b: &[Completion], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: sample {k}");
        assert_eq!(x.stopped, y.stopped, "{what}: sample {k}");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!(
                (p - q).abs() <= LOGPROB_TOLERANCE,
                "{what}: sample {k}: {p} vs {q}"
            );
        }
    }
}

fn draws(seed: u64, n: usize) -> Draws {
    Draws::from_rng(&mut rand::rngs::StdRng::seed_from_u64(seed), n)
}

/// One group through the static buffers = today's decode (`infer::generate_with`), token for
/// token: with and without truncation, greedy, stops that end rows at different steps, and
/// responses that cross an attention window (tiny's context is 256, a window 128).
#[test]
fn static_buffer_decode_matches_the_per_group_decode() {
    let m = model(&ModelConfig::tiny(), 7);
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[200, 17, 42, 99, 5, 6, 7, 8], &[33]];
    for (temperature, top_p, max_new, stops) in [
        (1.0, 1.0, 150, vec![]),
        (
            0.8,
            0.9,
            40,
            (0..260).filter(|t| t % 11 == 0).collect::<Vec<u32>>(),
        ),
        (0.0, 1.0, 20, vec![]),
    ] {
        let params = SamplingParams {
            temperature,
            top_p,
            max_new_tokens: max_new,
            stop_tokens: stops,
        };
        for (i, prompt) in prompts.iter().enumerate() {
            let d = draws(i as u64, 5);
            let want = super::super::generate_with(&m, prompt, &params, &d).unwrap();
            for max_batch in [1, 5, 8] {
                let got = generate_groups(
                    &m,
                    &[GroupRequest { prompt, draws: &d }],
                    &params,
                    max_batch,
                )
                .unwrap();
                same(
                    &got[0],
                    &want,
                    &format!("T {temperature}, batch {max_batch}"),
                );
            }
        }
    }
}

/// A Qwen2-shaped model (q/k/v biases, no QK norm) takes the same path.
#[test]
fn static_buffer_decode_covers_biases() {
    let cfg = ModelConfig {
        arch: Arch::Qwen2,
        attention_bias: true,
        ..ModelConfig::tiny()
    };
    let m = model(&cfg, 3);
    let params = SamplingParams::new(30, vec![]);
    let d = draws(9, 3);
    let want = super::super::generate_with(&m, &[5, 6, 7], &params, &d).unwrap();
    let got = generate_groups(
        &m,
        &[GroupRequest {
            prompt: &[5, 6, 7],
            draws: &d,
        }],
        &params,
        4,
    )
    .unwrap();
    same(&got[0], &want, "qwen2");
}

/// 8 groups in flight in a bucket smaller than their samples (continuous batching: slots
/// refilled as samples stop) give every sample the tokens it gets one group at a time.
#[test]
fn eight_groups_batched_match_one_group_at_a_time() {
    let m = model(&ModelConfig::tiny(), 11);
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        max_new_tokens: 48,
        stop_tokens: (0..260).filter(|t| t % 13 == 0).collect(),
    };
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|g| (0..(3 + 2 * g)).map(|i| (i * 31 + g * 7) % 250).collect())
        .collect();
    let all: Vec<Draws> = (0..8).map(|g| draws(100 + g, 4)).collect();
    let groups: Vec<GroupRequest<'_>> = prompts
        .iter()
        .zip(&all)
        .map(|(p, d)| GroupRequest {
            prompt: p,
            draws: d,
        })
        .collect();
    let one_at_a_time: Vec<Vec<Completion>> = groups
        .iter()
        .map(|g| generate_groups(&m, std::slice::from_ref(g), &params, 4).unwrap())
        .map(|mut v| v.remove(0))
        .collect();
    // 32 samples through 16 slots, and through 8.
    for max_batch in [12, 8] {
        let batched = generate_groups(&m, &groups, &params, max_batch).unwrap();
        assert_eq!(batched.len(), 8);
        for (g, (a, b)) in batched.iter().zip(&one_at_a_time).enumerate() {
            same(a, b, &format!("group {g}, max_batch {max_batch}"));
        }
    }
    // And each group one at a time equals today's per-group decode.
    for (g, r) in groups.iter().enumerate() {
        let want = super::super::generate_with(&m, r.prompt, &params, r.draws).unwrap();
        same(&one_at_a_time[g], &want, &format!("group {g} alone"));
    }
    // Lengths differ (stops), so slots were refilled mid-decode.
    let lens: std::collections::BTreeSet<usize> = one_at_a_time
        .iter()
        .flatten()
        .map(|c| c.tokens.len())
        .collect();
    assert!(lens.len() > 3, "{lens:?}");
}

#[test]
fn buckets_windows_and_bad_requests() {
    assert_eq!(bucket_rows(0), 1);
    assert_eq!(bucket_rows(5), 8);
    assert_eq!(bucket_rows(256), 256);
    let m = model(&ModelConfig::tiny(), 1);
    let params = SamplingParams::new(300, vec![]);
    let d = draws(1, 2);
    // max_new_tokens beyond the context: bounded by it (256 - prompt).
    let out = generate_groups(
        &m,
        &[GroupRequest {
            prompt: &[1, 2, 3, 4],
            draws: &d,
        }],
        &params,
        2,
    )
    .unwrap();
    assert!(out[0].iter().all(|c| c.tokens.len() == 252));
    // A prompt out of the vocabulary or filling the context is refused.
    for prompt in [vec![9999u32], vec![1u32; 256], vec![]] {
        let r = generate_groups(
            &m,
            &[GroupRequest {
                prompt: &prompt,
                draws: &d,
            }],
            &params,
            2,
        );
        assert!(r.is_err(), "{} tokens", prompt.len());
    }
    // A bucket refuses a step of the wrong width and a prompt that does not fit.
    let mut b = StaticBatch::new(&m, 2, 8).unwrap();
    assert!(b.step(&m, &[1], &[true], None).is_err());
    let mut long = m.new_cache(1, 9).unwrap();
    let ids = Tensor::new(&[1u32; 9], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    m.forward_native(&ids, &mut long).unwrap();
    assert!(b.admit(0, &long).is_err());
    assert!(b.is_empty());
}
