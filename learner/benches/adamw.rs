//! One AdamW step (`learner::AdamW::step`) over one variable of the shape of Qwen3-0.6B's tied
//! embedding, `[151936, 1024]` (155.6 M values, 622 MB in f32), with a gradient whose norm is
//! clipped (as the learner's default `max_grad_norm = 1.0` does with a gradient this size):
//! what the optimiser adds to a CPU training step at that scale, for every weight of the
//! vocabulary (`docs/gpu.md`, "AdamW in place").
//!
//! `cargo bench -p learner --bench adamw`; criterion's `--save-baseline` / `--baseline`
//! compare two builds.

use std::time::Duration;

use candle_core::{Device, Tensor, Var};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use learner::{AdamW, AdamWConfig};

fn bench(c: &mut Criterion) {
    let shape = (151_936, 1024);
    let dev = Device::Cpu;
    let var =
        Var::from_tensor(&Tensor::randn(0f32, 0.02, shape, &dev).expect("weights")).expect("var");
    let grad = Tensor::randn(0f32, 1e-3, shape, &dev).expect("gradient");
    // A gradient store that holds `grad` for the variable (candle builds stores only by
    // backpropagation).
    let mut grads = (var.as_tensor() * 0.0)
        .and_then(|t| t.sum_all())
        .and_then(|t| t.backward())
        .expect("store");
    grads.insert(var.as_tensor(), grad);
    let mut opt = AdamW::new(vec![("embed".into(), var)], AdamWConfig::default()).expect("opt");
    let mut g = c.benchmark_group("adamw");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements((shape.0 * shape.1) as u64));
    g.bench_function("qwen3_embedding", |b| {
        b.iter(|| {
            let step = opt.step(&grads).expect("step");
            assert!(step.clip_scale < 1.0, "the gradient is clipped: {step:?}");
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
