//! Inference-path tests: agreement with the training forward (the learner's log-probs),
//! identical samples to the training-forward decoder, Qwen2 biases, half precision.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use super::*;
use crate::config::Arch;
use crate::sampling::{self, GenerationPath};

fn tiny(seed: u64) -> Policy {
    Policy::new_random(&ModelConfig::tiny(), seed, &Device::Cpu).unwrap()
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

const PROMPTS: [&[u32]; 3] = [&[1, 2, 3], &[200, 17, 42, 99, 5, 6, 7, 8], &[33]];

#[test]
fn sampled_logprobs_match_the_training_forward() {
    let policy = tiny(3);
    let model = InferModel::from_policy(&policy).unwrap();
    assert_eq!(model.dtype(), DType::F32);
    let mut worst = 0f32;
    for (temperature, top_p) in [(1.0, 1.0), (0.7, 0.9)] {
        let params = SamplingParams {
            temperature,
            top_p,
            max_new_tokens: 24,
            stop_tokens: vec![],
        };
        for (k, prompt) in PROMPTS.iter().enumerate() {
            let out = generate(&model, prompt, 4, &params, &mut rng(k as u64)).unwrap();
            assert_eq!(out.len(), 4);
            for c in &out {
                assert_eq!(c.tokens.len(), 24);
                let reference =
                    sampling::response_logprobs(&policy, prompt, &c.tokens, temperature).unwrap();
                for (a, b) in c.logprobs.iter().zip(&reference) {
                    worst = worst.max((a - b).abs());
                }
            }
        }
    }
    assert!(worst < 1e-4, "max |Δ log-prob| = {worst}");
}

#[test]
fn same_samples_as_the_training_forward_decoder() {
    let policy = tiny(5);
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 16,
        // Frequent stops so rows leave the batch at different steps.
        stop_tokens: (0..260).filter(|t| t % 9 == 0).collect(),
    };
    for prompt in PROMPTS {
        let fast = crate::generate(
            &policy,
            prompt,
            6,
            &params,
            GenerationPath::Infer,
            &mut rng(9),
        )
        .unwrap();
        let slow = sampling::generate(
            &policy,
            prompt,
            6,
            &params,
            GenerationPath::Batched,
            &mut rng(9),
        )
        .unwrap();
        assert_eq!(fast.len(), slow.len());
        for (f, s) in fast.iter().zip(&slow) {
            assert_eq!(f.tokens, s.tokens);
            assert_eq!(f.stopped, s.stopped);
            if f.stopped {
                assert!(params.stop_tokens.contains(f.tokens.last().unwrap()));
            }
            for (a, b) in f.logprobs.iter().zip(&s.logprobs) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
        assert!(fast.iter().any(|c| c.stopped) || fast.iter().all(|c| c.tokens.len() == 16));
    }
}

#[test]
fn qwen2_layout_with_biases_matches() {
    let cfg = ModelConfig {
        arch: Arch::Qwen2,
        attention_bias: true,
        tie_word_embeddings: false,
        num_key_value_heads: 1,
        ..ModelConfig::tiny()
    };
    let policy = Policy::new_random(&cfg, 11, &Device::Cpu).unwrap();
    // Non-zero biases, so a dropped or misplaced bias shows.
    for (name, var) in policy.named_vars().unwrap() {
        if name.ends_with(".bias") {
            let n = var.dims()[0];
            let b: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.05).collect();
            var.set(&Tensor::from_vec(b, n, &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    let model = InferModel::new(&policy, DType::F32).unwrap();
    let prompt = [4u32, 8, 15, 16, 23, 42];
    let response = [7u32, 1, 250, 3];
    let fast = response_logprobs(&model, &prompt, &response, 1.0).unwrap();
    let slow = sampling::response_logprobs(&policy, &prompt, &response, 1.0).unwrap();
    for (a, b) in fast.iter().zip(&slow) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn half_precision_runs_and_stays_close() {
    let policy = tiny(7);
    let prompt = [10u32, 20, 30, 40];
    let response = [50u32, 60, 70, 80, 90];
    let reference = sampling::response_logprobs(&policy, &prompt, &response, 1.0).unwrap();
    // bf16 needs CUDA (no CPU bf16 matmul in candle 0.9): refused with a clear error here.
    let e = InferModel::new(&policy, DType::BF16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("CUDA"), "{e}");
    for dtype in [DType::F16] {
        let model = InferModel::new(&policy, dtype).unwrap();
        let lp = response_logprobs(&model, &prompt, &response, 1.0).unwrap();
        for (a, b) in lp.iter().zip(&reference) {
            // f16 keeps 11 significant bits: the error is ~1e-3 on the tiny model.
            assert!((a - b).abs() < 0.1, "{dtype:?}: {a} vs {b}");
        }
        let out = generate(
            &model,
            &prompt,
            3,
            &SamplingParams::new(5, vec![]),
            &mut rng(1),
        )
        .unwrap();
        assert!(out
            .iter()
            .all(|c| c.tokens.len() == 5 && c.logprobs.iter().all(|l| l.is_finite())));
    }
    assert!(InferModel::new(&policy, DType::U32).is_err());
}

#[test]
fn refuses_bad_inputs() {
    let policy = tiny(1);
    let model = InferModel::from_policy(&policy).unwrap();
    let params = SamplingParams::new(4, vec![]);
    assert!(generate(&model, &[], 2, &params, &mut rng(0)).is_err());
    assert!(generate(&model, &[999], 2, &params, &mut rng(0)).is_err());
    let long = vec![1u32; 256];
    assert!(generate(&model, &long, 2, &params, &mut rng(0)).is_err());
    assert!(generate(&model, &[1], 0, &params, &mut rng(0))
        .unwrap()
        .is_empty());
    // Generation stops at the context limit.
    let near = vec![1u32; 250];
    let out = generate(
        &model,
        &near,
        2,
        &SamplingParams::new(50, vec![]),
        &mut rng(0),
    )
    .unwrap();
    assert!(out.iter().all(|c| c.tokens.len() == 6));
}

/// The inference path records no gradient graph: its weights are detached copies, so neither
/// the logits nor the preallocated cache it writes in place carry an op.
#[test]
fn inference_path_records_no_graph() {
    let policy = tiny(5);
    for spec in [
        InferSpec::for_device(&Device::Cpu),
        InferSpec {
            dtype: DType::F16,
            f32_head: true,
            device: Device::Cpu,
        },
    ] {
        let model = InferModel::build(&policy, &spec).unwrap();
        let mut cache = model.new_cache(1, 16).unwrap();
        let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
        let logits = model.forward_last(&ids, &mut cache).unwrap();
        assert!(!logits.track_op());
        cache.repeat_batch(2).unwrap();
        let next = Tensor::new(&[[5u32], [6]], &Device::Cpu).unwrap();
        assert!(!model.forward_last(&next, &mut cache).unwrap().track_op());
        assert!(cache
            .layers
            .iter()
            .all(|(k, v)| !k.track_op() && !v.track_op()));
    }
}

/// An f32 head in f32 is the f32 model; in f16 it runs and stays close to the training
/// forward (the spread with and without it is measured by `examples/gen_bench.rs`).
#[test]
fn f32_head_options() {
    let policy = tiny(7);
    let prompt = [10u32, 20, 30, 40];
    let response = [50u32, 60, 70, 80, 90];
    let plain = InferModel::new(&policy, DType::F32).unwrap();
    let spec = InferSpec {
        dtype: DType::F32,
        f32_head: true,
        device: Device::Cpu,
    };
    let head = InferModel::build(&policy, &spec).unwrap();
    assert_eq!(
        response_logprobs(&plain, &prompt, &response, 1.0).unwrap(),
        response_logprobs(&head, &prompt, &response, 1.0).unwrap()
    );
    let reference = sampling::response_logprobs(&policy, &prompt, &response, 1.0).unwrap();
    let half = InferModel::build(
        &policy,
        &InferSpec {
            dtype: DType::F16,
            ..spec
        },
    )
    .unwrap();
    assert_eq!(half.dtype(), DType::F16);
    let lp = response_logprobs(&half, &prompt, &response, 1.0).unwrap();
    for (a, b) in lp.iter().zip(&reference) {
        assert!((a - b).abs() < 0.1, "{a} vs {b}");
    }
}

#[test]
fn phased_generation_samples_the_same_and_times_every_decode_step() {
    let policy = tiny(5);
    let model = InferModel::from_policy(&policy).unwrap();
    let params = SamplingParams::new(12, vec![]);
    let draws = Draws::from_rng(&mut rng(9), 3);
    let plain = generate_with(&model, PROMPTS[1], &params, &draws).unwrap();
    let (phased, phases) = generate_phased(&model, PROMPTS[1], &params, &draws).unwrap();
    assert_eq!(plain, phased);
    // One forward per token after the first (the prefill gives the first token's logits).
    assert_eq!(phases.steps, 11);
    let parts = phases.launch_s + phases.device_s + phases.copy_s;
    assert!(parts > 0.0 && parts <= phases.total_s, "{phases:?}");
}
