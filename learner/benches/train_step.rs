//! One learner training step on the CPU — forward, log-prob loss, backward and AdamW — for the
//! shapes that `scripts/bench/train_step_torch.py` times with PyTorch, so that the two can be
//! compared like for like (`docs/gpu.md`, "CPU: one training step, candle vs PyTorch").
//!
//! Models (random weights):
//! - `tiny`: the embedded default ([`policy::ModelConfig::tiny`]): hidden 128, 3 layers, 4 heads,
//!   2 KV heads, head_dim 32, intermediate 384, vocab 260, tied embeddings.
//! - `small`: hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, intermediate 768,
//!   vocab 4096, tied embeddings.
//!
//! Batches: 16 sequences × 24 tokens (the learner's usual group) and 4 × 128 (a longer case).
//! Loss: minus the mean log-prob of the input ids themselves (no shift; the cost is the same as
//! next-token cross-entropy). AdamW: `learner::AdamW` with its default config (global-norm
//! clipping at 1.0, no weight decay) — PyTorch side: `clip_grad_norm_` + `torch.optim.AdamW`.
//!
//! Threads: candle's CPU matmul (the `gemm` crate) and rayon both read `RAYON_NUM_THREADS`;
//! run with `RAYON_NUM_THREADS=1` and `=2` to match `torch.set_num_threads(1)` / `(2)`.
//! `BENCH_CLOCK=cpu` times process CPU time instead of wall time (for a shared, loaded host;
//! the PyTorch script's `--clock cpu` does the same).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use learner::{AdamW, AdamWConfig};
use policy::{token_logprobs, Arch, Device, ModelConfig, Policy, Tensor};

/// The `small` benchmark model; must match `small_config()` in the PyTorch script.
fn small() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: 4096,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        max_position_embeddings: 512,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

/// CPU time consumed so far by all threads of this process (Linux: the sum of
/// `/proc/self/task/*/schedstat`, nanoseconds). Used instead of wall time with
/// `BENCH_CLOCK=cpu`, so that a loaded shared machine does not inflate the numbers: with one
/// thread it equals the step's wall time on an idle core; with several it is their sum.
fn process_cpu_time() -> Duration {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(ns)
}

fn bench(c: &mut Criterion) {
    let cpu_clock = std::env::var("BENCH_CLOCK").is_ok_and(|v| v == "cpu");
    let mut g = c.benchmark_group("train_step");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    for (model, cfg) in [("tiny", ModelConfig::tiny()), ("small", small())] {
        for (bsz, t) in [(16usize, 24usize), (4, 128)] {
            g.throughput(Throughput::Elements((bsz * t) as u64));
            g.bench_function(format!("{model}/{bsz}x{t}"), |b| {
                // Built here, so that a filtered run builds only the models it times.
                let p = Policy::new_random(&cfg, 0, &Device::Cpu).expect("model");
                let mut opt = AdamW::new(p.named_vars().expect("vars"), AdamWConfig::default())
                    .expect("optimiser");
                let ids: Vec<u32> = (0..bsz * t)
                    .map(|i| ((i * 7919 + 13) % cfg.vocab_size) as u32)
                    .collect();
                let ids = Tensor::from_vec(ids, (bsz, t), p.device()).expect("ids");
                let mut step = || {
                    let logits = p.forward(&ids).expect("forward");
                    let lp = token_logprobs(&logits, &ids, 1.0).expect("log-probs");
                    let loss = lp.mean_all().expect("mean").neg().expect("neg");
                    opt.backward_step(&loss).expect("step")
                };
                if cpu_clock {
                    b.iter_custom(|iters| {
                        let t0 = process_cpu_time();
                        for _ in 0..iters {
                            std::hint::black_box(step());
                        }
                        process_cpu_time() - t0
                    })
                } else {
                    b.iter(&mut step)
                }
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
