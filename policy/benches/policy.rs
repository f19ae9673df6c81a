//! Throughput of the embedded default model on this machine's CPU.
//!
//! - `generate/batched_n8`: one prompt, 8 samples, 16 new tokens each (no stop token), batched
//!   KV-cache path — the rollout worker's loop. Throughput = generated tokens.
//! - `generate/infer_n8`: the same on the inference path (`policy::infer`, weights prepared
//!   once outside the timed loop, as the rollout engine does per snapshot).
//! - `generate/sequential_n8`: the same with the batch-1 KV-cache path.
//! - `train/forward_backward`: a batch of 16 sequences × 24 tokens, log-prob loss + backward —
//!   the learner's step without the optimiser. Throughput = tokens.
//! - `logprob/qwen_vocab_256`: `token_logprobs` forward + backward alone on a leaf `[256,
//!   151936]` of logits (Qwen3's vocabulary), temperature 1 and 0.7 — the vocabulary-wide
//!   part of a learner step, whose cost the one-node log-prob (`policy::model::target_logprob`)
//!   changed. Throughput = tokens.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use policy::{
    embedded_default, generate, token_logprobs, ByteTokenizer, GenerationPath, SamplingParams,
    Tensor,
};
use rand::SeedableRng;

fn bench(c: &mut Criterion) {
    let (p, _tok) = embedded_default(0).expect("model");
    let prompt = ByteTokenizer.encode_prompt("17+25=");
    let params = SamplingParams::new(16, vec![]);
    let mut g = c.benchmark_group("generate");
    g.sample_size(10);
    g.throughput(Throughput::Elements(8 * 16));
    for (name, path) in [
        ("batched_n8", GenerationPath::Batched),
        ("sequential_n8", GenerationPath::Sequential),
    ] {
        g.bench_function(name, |b| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(1);
            b.iter(|| generate(&p, &prompt, 8, &params, path, &mut rng).expect("generate"))
        });
    }
    let model = policy::InferModel::from_policy(&p).expect("infer model");
    g.bench_function("infer_n8", |b| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        b.iter(|| policy::infer::generate(&model, &prompt, 8, &params, &mut rng).expect("generate"))
    });
    g.finish();

    let (bsz, t) = (16usize, 24usize);
    let ids: Vec<u32> = (0..bsz * t).map(|i| (i * 7 % 250) as u32).collect();
    let ids = Tensor::from_vec(ids, (bsz, t), p.device()).expect("ids");
    let mut g = c.benchmark_group("train");
    g.sample_size(10);
    g.throughput(Throughput::Elements((bsz * t) as u64));
    g.bench_function("forward_backward", |b| {
        b.iter(|| {
            let logits = p.forward(&ids).expect("forward");
            let lp = token_logprobs(&logits, &ids, 1.0).expect("lp");
            let loss = lp.mean_all().expect("mean").neg().expect("neg");
            loss.backward().expect("backward")
        })
    });
    g.finish();

    let (rows, vocab) = (256usize, 151_936usize);
    let dev = p.device();
    let logits =
        policy::Var::from_tensor(&Tensor::randn(0f32, 3.0, (rows, vocab), dev).expect("logits"))
            .expect("var");
    let targets: Vec<u32> = (0..rows).map(|i| (i * 7919 % vocab) as u32).collect();
    let targets = Tensor::from_vec(targets, rows, dev).expect("targets");
    let mut g = c.benchmark_group("logprob");
    g.sample_size(10);
    g.throughput(Throughput::Elements(rows as u64));
    for (name, temperature) in [("qwen_vocab_256", 1.0f32), ("qwen_vocab_256_t0.7", 0.7)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let lp = token_logprobs(logits.as_tensor(), &targets, temperature).expect("lp");
                lp.sum_all().expect("sum").backward().expect("backward")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
