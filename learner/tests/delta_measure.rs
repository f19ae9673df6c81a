//! How many bf16 values a real learner step changes, and what a sparse delta snapshot costs
//! (`docs/broadcast.md`, "Delta snapshots"). Ignored by default (minutes on a CPU):
//!
//! ```text
//! DELTA_SHAPE=0.6b DELTA_STEPS=3 cargo test --release -p learner --test delta_measure -- --ignored --nocapture
//! ```
//!
//! `DELTA_SHAPE` is `0.6b` (Qwen3-0.6B's shape, random weights), `small` or `tiny` (the
//! embedded default). For each learning rate (1e-6, 1e-5 and the embedded default 1e-3) a
//! fresh model (same seed) takes `DELTA_STEPS` real GRPO steps through [`Trainer`] on groups
//! it sampled itself; after each step the bf16 payload is delta-coded against the previous
//! one. One JSON line per step: the fraction of bf16 values that changed, the bytes of a full
//! f32 payload, a full bf16 payload and the delta, encode and apply times. The test asserts
//! the round trip is bit-exact; the numbers are measurements, not assertions.

use std::time::Instant;

use candle_core::Device;
use learner::{AdamWConfig, LossConfig, Pipeline, Trainer, TrainerConfig, Verified};
use policy::delta;
use policy::{Arch, DType, ModelConfig, Policy};
use storage::TrajectoryGroup;

#[path = "../src/test_util.rs"]
mod test_util;
use test_util::{sampled_group, T};

fn shape() -> (String, ModelConfig) {
    let name = std::env::var("DELTA_SHAPE").unwrap_or_else(|_| "tiny".into());
    let cfg = match name.as_str() {
        "0.6b" => ModelConfig::qwen3_0_6b(),
        "small" => ModelConfig {
            arch: Arch::Qwen3,
            vocab_size: 4096,
            hidden_size: 256,
            intermediate_size: 768,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 64,
            ..ModelConfig::tiny()
        },
        _ => ModelConfig::tiny(),
    };
    (name, cfg)
}

/// Fraction of the bf16 values (after the identical headers) whose bits differ.
fn changed_fraction(a: &[u8], b: &[u8]) -> f64 {
    let start = 8 + u64::from_le_bytes(a[..8].try_into().unwrap()) as usize;
    let (a, b) = (&a[start..], &b[start..]);
    let n = a.len() / 2;
    let changed = (0..n)
        .filter(|&i| a[2 * i..2 * i + 2] != b[2 * i..2 * i + 2])
        .count();
    changed as f64 / n as f64
}

#[test]
#[ignore = "minutes of CPU; run by hand for docs/broadcast.md"]
fn delta_sizes_on_real_learner_steps() {
    let (name, cfg) = shape();
    let steps: u64 = std::env::var("DELTA_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let default_lr = AdamWConfig::default().lr;
    for lr in [1e-6, 1e-5, default_lr] {
        let policy = Policy::new_random(&cfg, 7, &Device::Cpu).expect("model");
        let tc = TrainerConfig {
            loss: LossConfig::default(),
            optim: AdamWConfig {
                lr,
                ..AdamWConfig::default()
            },
            temperature: T,
            staleness: 3,
            kappa: None,
            groups_per_step: 2,
            group_size: 4,
            micro_batch_tokens: 0,
            ..TrainerConfig::default()
        };
        let mut tr = Trainer::new(policy, tc).expect("trainer");
        let pipeline = Pipeline::new(learner::pipeline::limits_of(tr.policy().config(), 4));
        let mut prev = tr.policy().to_safetensors_bytes_as(DType::BF16).unwrap();
        for step in 1..=steps {
            let gs: Vec<Verified<TrajectoryGroup>> = (0..2)
                .map(|k| {
                    let g = sampled_group(
                        tr.policy(),
                        tr.version(),
                        100 * step + k,
                        6,
                        &format!("worker-{}", 100 * step + k),
                        false,
                    );
                    pipeline.verify("measure", 0, g).expect("verified")
                })
                .collect();
            let t0 = Instant::now();
            let st = tr.train_step(&gs).expect("step");
            let train_s = t0.elapsed().as_secs_f64();
            assert!(st.stepped);
            let full_f32 = tr.policy().to_safetensors_bytes().unwrap().len();
            let t0 = Instant::now();
            let new = tr.policy().to_safetensors_bytes_as(DType::BF16).unwrap();
            let serialise_s = t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            let d = delta::encode(&prev, &new).expect("encode");
            let encode_s = t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            let back = delta::apply(&prev, &d).expect("apply");
            let apply_s = t0.elapsed().as_secs_f64();
            assert!(back == new, "delta round trip is not bit-exact");
            println!(
                "{}",
                serde_json::json!({
                    "shape": name, "params": cfg.num_params(), "lr": lr, "step": step,
                    "changed_fraction": changed_fraction(&prev, &new),
                    "full_f32_bytes": full_f32, "full_bf16_bytes": new.len(),
                    "delta_bytes": d.len(),
                    "delta_ratio": d.len() as f64 / new.len() as f64,
                    "train_s": train_s, "serialise_bf16_s": serialise_s,
                    "encode_s": encode_s, "apply_s": apply_s,
                })
            );
            prev = new;
        }
    }
}
