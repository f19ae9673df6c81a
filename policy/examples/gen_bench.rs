//! Generation throughput of the inference path versus the training-forward decoder, and the
//! log-prob spread of the inference path's dtype against the learner's f32 forward.
//!
//! Random weights (seed 0), one prompt of `--prompt-len` tokens, `--batch` samples of exactly
//! `--new-tokens` tokens (no stop token), temperature 1. Prints one line per (path, batch):
//! generated tokens / wall seconds (prefill included, weight conversion excluded), then the
//! max and mean |Δ log-prob| between the inference path's sampled log-probs and
//! `response_logprobs` of the f32 training forward on the same tokens.
//!
//! ```text
//! cargo run --release -p policy --example gen_bench -- --shape tiny --batch 1,8,16
//! cargo run --release -p policy --features cuda --example gen_bench -- \
//!     --device cuda --dtype bf16 --batch 1,16,64 --new-tokens 256 --shape qwen3-0.6b
//! ```
//!
//! Options: `--device auto|cpu|cuda[:N]` (auto), `--dtype f32|bf16|f16` (the device's
//! default), `--shape tiny|small|qwen3-0.6b` (tiny; `small` is Qwen3-shaped: the 151,936-token
//! vocabulary with 4 layers of width 256), `--batch 1,8,16`, `--new-tokens 32`,
//! `--prompt-len 16`, `--paths infer,batched` (which paths to time), `--check-samples N`
//! (how many samples of the largest batch to compare, default all; 0 skips the check).

use std::time::Instant;

use policy::{
    device, infer, response_logprobs, Arch, DType, DeviceChoice, GenerationPath, InferModel,
    ModelConfig, Policy, SamplingParams,
};
use rand::SeedableRng;

fn shape(name: &str) -> ModelConfig {
    match name {
        "tiny" => ModelConfig::tiny(),
        "qwen3-0.6b" => ModelConfig::qwen3_0_6b(),
        "small" => ModelConfig {
            arch: Arch::Qwen3,
            hidden_size: 256,
            intermediate_size: 768,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 4096,
            ..ModelConfig::qwen3_0_6b()
        },
        other => panic!("unknown --shape {other} (tiny, small, qwen3-0.6b)"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut device_choice = DeviceChoice::Auto;
    let mut dtype: Option<DType> = None;
    let mut shape_name = "tiny".to_string();
    let mut batches = vec![1usize, 8, 16];
    let mut new_tokens = 32usize;
    let mut prompt_len = 16usize;
    let mut paths = vec![GenerationPath::Infer, GenerationPath::Batched];
    let mut check: Option<usize> = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => device_choice = val()?.parse()?,
            "--dtype" => {
                dtype = Some(match val()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    d => return Err(format!("unknown --dtype {d}").into()),
                })
            }
            "--shape" => shape_name = val()?,
            "--batch" => {
                batches = val()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--new-tokens" => new_tokens = val()?.parse()?,
            "--prompt-len" => prompt_len = val()?.parse()?,
            "--check-samples" => check = Some(val()?.parse()?),
            "--paths" => {
                paths = val()?
                    .split(',')
                    .map(|p| match p {
                        "infer" => Ok(GenerationPath::Infer),
                        "batched" => Ok(GenerationPath::Batched),
                        other => Err(format!("unknown path {other} (infer, batched)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let dev = device::select(device_choice)?;
    let info = device::describe(&dev);
    let cfg = shape(&shape_name);
    let dtype = dtype.unwrap_or_else(|| infer::default_dtype(&dev));
    println!(
        "device {} ({}, cc {}), shape {shape_name} ({} params), inference dtype {dtype:?}, \
         prompt {prompt_len}, new tokens {new_tokens}",
        info.kind,
        info.name,
        info.compute_capability.as_deref().unwrap_or("-"),
        cfg.num_params()
    );
    let t0 = Instant::now();
    let policy = Policy::new_random(&cfg, 0, &dev)?;
    let model = InferModel::new(&policy, dtype)?;
    println!("weights ready in {:.2}s", t0.elapsed().as_secs_f64());
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| (i * 7919 % cfg.vocab_size.min(256)) as u32)
        .collect();
    let params = SamplingParams::new(new_tokens, vec![]);
    let run =
        |path: GenerationPath, n: usize, new: usize| -> policy::Result<Vec<policy::Completion>> {
            let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
            let p = SamplingParams::new(new, vec![]);
            match path {
                GenerationPath::Infer => infer::generate(&model, &prompt, n, &p, &mut rng),
                other => policy::generate(&policy, &prompt, n, &p, other, &mut rng),
            }
        };
    let mut last = Vec::new();
    for &path in &paths {
        // Warm-up: kernel loading, allocator, BLAS handles.
        run(path, 1, 2)?;
        for &n in &batches {
            let t = Instant::now();
            let out = run(path, n, params.max_new_tokens)?;
            let secs = t.elapsed().as_secs_f64();
            let toks: usize = out.iter().map(|c| c.tokens.len()).sum();
            println!(
                "path {path:?} batch {n}: {toks} tokens in {secs:.3}s = {:.1} tokens/s",
                toks as f64 / secs
            );
            if path == GenerationPath::Infer {
                last = out;
            }
        }
    }
    let k = check.unwrap_or(last.len()).min(last.len());
    if k > 0 {
        let (mut worst, mut sum, mut count) = (0f32, 0f64, 0usize);
        for c in &last[..k] {
            let reference = response_logprobs(&policy, &prompt, &c.tokens, 1.0)?;
            for (a, b) in c.logprobs.iter().zip(&reference) {
                let d = (a - b).abs();
                worst = worst.max(d);
                sum += f64::from(d);
                count += 1;
            }
        }
        println!(
            "log-prob spread, inference path ({dtype:?}) vs training forward (F32), {k} samples, \
             {count} tokens: max |Δ| = {worst:.3e}, mean |Δ| = {:.3e}",
            sum / count.max(1) as f64
        );
    }
    Ok(())
}
