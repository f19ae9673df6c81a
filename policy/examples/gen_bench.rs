//! Generation throughput of the inference path versus the training-forward decoder, and the
//! log-prob spread of the inference path's dtype against the learner's f32 forward.
//!
//! Random weights (seed 0), one prompt of `--prompt-len` tokens, `--batch` samples of exactly
//! `--new-tokens` tokens (no stop token), temperature 1. Prints one line per (path, batch):
//! generated tokens / wall seconds (prefill included, weight conversion excluded), then the
//! max and mean |Δ log-prob| between the inference path's sampled log-probs and
//! `response_logprobs` of the f32 training forward on the same tokens. For the inference path
//! it also splits a decode step's wall time (`step_ms`: issuing the kernels, waiting for the
//! device, copying the logits to the host, and the rest — the host-side sampling rule,
//! bookkeeping and the prefill's share), which says whether decode is bound by the device,
//! by kernel launches or by the host.
//!
//! ```text
//! cargo run --release -p policy --example gen_bench -- --shape tiny --batch 1,8,16
//! cargo run --release -p policy --features cuda --example gen_bench -- \
//!     --device cuda --dtype bf16 --batch 1,16,64 --new-tokens 256 --shape qwen3-0.6b
//! ```
//!
//! Options: `--device auto|cpu|cuda[:N]` (auto), `--dtype f32|bf16|f16` (the device's
//! default), `--shape tiny|small|qwen3-0.6b|qwen3-8b` (tiny; `small` is Qwen3-shaped: the
//! 151,936-token vocabulary with 4 layers of width 256), `--batch 1,8,16`, `--new-tokens 32`,
//! `--prompt-len 16`, `--paths infer,batched|none` (which paths to time), `--groups G`,
//! `--group-size N` (16), `--max-batch B` (256): G groups of N samples in flight, decoded
//! together in a bucket of at most B slots with continuous batching (`infer::batch`; its
//! figures under `groups_in_flight`, with the same `step_ms` split), `--rule-check ROWS` (the
//! canonical rule's device kernel, or its CPU emulation on a CPU, against the CPU rule on
//! ROWS random bf16 rows: `rule_device::check_against_rule`), `--check-samples N`
//! (how many samples of the largest batch to compare, default all; 0 skips the check),
//! `--f32-head true|false` (final norm and output projection in f32 with a half-precision
//! dtype; default false, as `InferSpec::for_device`), `--warm-start STEPS` (supervised steps
//! on byte-level two-digit additions first, `tiny` shape only: a trained model's peaked
//! distributions show the half-precision spread that random weights hide), `--json` (one JSON
//! line with every figure at the end, for `scripts/gpu-smoke.sh`).

use std::time::Instant;

use policy::sft::{warm_start, SftExample, WarmStart};
use policy::{
    device, infer, response_logprobs, Arch, ByteTokenizer, DType, DeviceChoice, Draws,
    GenerationPath, InferModel, InferSpec, ModelConfig, Policy, SamplingParams,
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
        // Qwen/Qwen3-8B: 36 layers of width 4096, untied embeddings (8.2 B parameters).
        "qwen3-8b" => ModelConfig {
            hidden_size: 4096,
            intermediate_size: 12_288,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            tie_word_embeddings: false,
            ..ModelConfig::qwen3_0_6b()
        },
        other => panic!("unknown --shape {other} (tiny, small, qwen3-0.6b, qwen3-8b)"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        device_choice,
        dtype,
        shape_name,
        batches,
        new_tokens,
        prompt_len,
        paths,
        check,
        f32_head,
        warm,
        json,
        groups,
        group_size,
        max_batch,
        rule_check,
    } = parse_args()?;
    let dev = device::select(device_choice)?;
    let info = device::describe(&dev);
    let cfg = shape(&shape_name);
    let mut spec = InferSpec::for_device(&dev);
    if let Some(d) = dtype {
        spec.dtype = d;
    }
    if let Some(h) = f32_head {
        spec.f32_head = h;
    }
    let dtype = spec.dtype;
    println!(
        "device {} ({}, cc {}), shape {shape_name} ({} params), inference dtype {dtype:?} \
         (f32 head: {}), prompt {prompt_len}, new tokens {new_tokens}",
        info.kind,
        info.name,
        info.compute_capability.as_deref().unwrap_or("-"),
        cfg.num_params(),
        spec.f32_head
    );
    let t0 = Instant::now();
    let policy = Policy::new_random(&cfg, 0, &dev)?;
    if warm > 0 {
        let losses = warm_start(
            &policy,
            &additions(),
            &WarmStart {
                steps: warm,
                ..WarmStart::default()
            },
        )?;
        println!(
            "warm start: {warm} steps, loss {:.3} -> {:.3}",
            losses[0],
            losses[losses.len() - 1]
        );
    }
    let model = InferModel::build(&policy, &spec)?;
    println!("weights ready in {:.2}s", t0.elapsed().as_secs_f64());
    let prompt: Vec<u32> = if warm > 0 {
        ByteTokenizer.encode_prompt("37+45=") // what the warm start taught
    } else {
        (0..prompt_len)
            .map(|i| (i * 7919 % cfg.vocab_size.min(256)) as u32)
            .collect()
    };
    let params = SamplingParams::new(new_tokens, vec![]);
    // The inference path also reports where its decode time went (`infer::DecodePhases`).
    type Run = (Vec<policy::Completion>, Option<infer::DecodePhases>);
    let run = |path: GenerationPath, n: usize, new: usize| -> policy::Result<Run> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
        let p = SamplingParams::new(new, vec![]);
        match path {
            GenerationPath::Infer => {
                let draws = Draws::from_rng(&mut rng, n);
                let (out, phases) = infer::generate_phased(&model, &prompt, &p, &draws)?;
                Ok((out, Some(phases)))
            }
            other => Ok((
                policy::generate(&policy, &prompt, n, &p, other, &mut rng)?,
                None,
            )),
        }
    };
    let mut last = Vec::new();
    let mut rates = Vec::new();
    for &path in &paths {
        // Warm-up: kernel loading, allocator, BLAS handles.
        run(path, 1, 2)?;
        for &n in &batches {
            let t = Instant::now();
            let (out, phases) = run(path, n, params.max_new_tokens)?;
            let secs = t.elapsed().as_secs_f64();
            let toks: usize = out.iter().map(|c| c.tokens.len()).sum();
            println!(
                "path {path:?} batch {n}: {toks} tokens in {secs:.3}s = {:.1} tokens/s",
                toks as f64 / secs
            );
            let per_step = phases.map(|p| step_split(&p));
            if let Some(s) = &per_step {
                println!("  per decode step, ms: {s}");
            }
            rates.push(serde_json::json!({
                "path": format!("{path:?}").to_lowercase(), "batch": n,
                "tokens": toks, "secs": secs, "tokens_per_s": toks as f64 / secs,
                "step_ms": per_step,
            }));
            if path == GenerationPath::Infer {
                last = out;
            }
        }
    }
    // Groups in flight: `groups` prompts of `group_size` samples each, decoded together in a
    // bucket of at most `max_batch` slots (`infer::batch`), each prompt prefilled once.
    let mut in_flight = serde_json::Value::Null;
    // The canonical rule's kernel (its CPU emulation on a CPU) against the CPU rule.
    let mut rule = serde_json::Value::Null;
    if rule_check > 0 {
        let t = Instant::now();
        let c = policy::rule_device::check_against_rule(&dev, rule_check, 46)?;
        println!(
            "rule kernel ({}) vs the CPU rule: {} rows, {} boundary, {} mismatched, max |Δ \
             log-prob| {:.2e}, {:.1}s: {}",
            if c.on_device {
                "device"
            } else {
                "CPU emulation"
            },
            c.rows,
            c.boundary_rows,
            c.mismatched_rows,
            c.max_logprob_diff,
            t.elapsed().as_secs_f64(),
            if c.ok() { "ok" } else { "NOT OK" }
        );
        rule = serde_json::json!({
            "rows": c.rows, "boundary_rows": c.boundary_rows, "mismatched_rows": c.mismatched_rows,
            "max_logprob_diff": c.max_logprob_diff, "on_device": c.on_device, "ok": c.ok(),
            "secs": t.elapsed().as_secs_f64(),
        });
    }
    let mut spread_prompt = prompt.clone();
    if groups > 0 {
        let prompts: Vec<Vec<u32>> = (0..groups)
            .map(|g| {
                let mut p = prompt.clone();
                p[0] = ((g * 31 + 1) % cfg.vocab_size.min(256)) as u32;
                p
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(4646);
        let all: Vec<Draws> = (0..groups)
            .map(|_| Draws::from_rng(&mut rng, group_size))
            .collect();
        let requests: Vec<infer::batch::GroupRequest<'_>> = prompts
            .iter()
            .zip(&all)
            .map(|(p, d)| infer::batch::GroupRequest {
                prompt: p,
                draws: d,
            })
            .collect();
        // Warm-up of the bucket's kernels.
        infer::batch::generate_groups(&model, &requests[..1], &SamplingParams::new(2, vec![]), 1)?;
        let t = Instant::now();
        let (out, phases) =
            infer::batch::generate_groups_phased(&model, &requests, &params, max_batch)?;
        let secs = t.elapsed().as_secs_f64();
        let toks: usize = out.iter().flatten().map(|c| c.tokens.len()).sum();
        let rows = infer::batch::bucket_rows(max_batch.min(groups * group_size));
        println!(
            "groups in flight: {groups} x {group_size} samples, bucket {rows} slots: {toks} \
             tokens in {secs:.3}s = {:.1} tokens/s",
            toks as f64 / secs
        );
        let split = step_split(&phases);
        println!("  per decode step, ms: {split}");
        in_flight = serde_json::json!({
            "groups": groups, "group_size": group_size, "max_batch": max_batch,
            "bucket_rows": rows, "new_tokens": new_tokens, "tokens": toks, "secs": secs,
            "tokens_per_s": toks as f64 / secs, "step_ms": split,
        });
        if last.is_empty() {
            spread_prompt = prompts[0].clone();
            last = out.into_iter().next().unwrap_or_default();
        }
    }
    let k = check.unwrap_or(last.len()).min(last.len());
    let spread = logprob_spread(&policy, &spread_prompt, &last[..k], dtype)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "device": info.kind, "device_name": info.name, "shape": shape_name,
                "params": cfg.num_params(), "dtype": format!("{dtype:?}").to_lowercase(),
                "f32_head": spec.f32_head, "warm_start_steps": warm, "prompt_len": prompt_len,
                "new_tokens": new_tokens, "throughput": rates, "groups_in_flight": in_flight,
                "rule_check": rule,
                "logprob_spread": spread,
            })
        );
    }
    Ok(())
}

/// One decode step's wall time split into its phases, in milliseconds: issuing the kernels,
/// waiting for the device, copying the logits to the host, and the rest (the canonical
/// sampling rule on the host, bookkeeping, and the prefill spread over the steps).
fn step_split(p: &infer::DecodePhases) -> serde_json::Value {
    let steps = p.steps.max(1) as f64;
    let ms = |s: f64| (s / steps * 1e4).round() / 10.0;
    let rest = p.total_s - p.launch_s - p.device_s - p.copy_s;
    serde_json::json!({
        "steps": p.steps, "launch": ms(p.launch_s), "device": ms(p.device_s),
        "copy": ms(p.copy_s), "rest": ms(rest), "total": ms(p.total_s),
    })
}

/// The command line (see the module docs).
struct Args {
    device_choice: DeviceChoice,
    dtype: Option<DType>,
    shape_name: String,
    batches: Vec<usize>,
    new_tokens: usize,
    prompt_len: usize,
    paths: Vec<GenerationPath>,
    check: Option<usize>,
    f32_head: Option<bool>,
    warm: usize,
    json: bool,
    groups: usize,
    group_size: usize,
    max_batch: usize,
    rule_check: usize,
}

fn parse_args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut o = Args {
        device_choice: DeviceChoice::Auto,
        dtype: None,
        shape_name: "tiny".to_string(),
        batches: vec![1, 8, 16],
        new_tokens: 32,
        prompt_len: 16,
        paths: vec![GenerationPath::Infer, GenerationPath::Batched],
        check: None,
        f32_head: None,
        warm: 0,
        json: false,
        groups: 0,
        group_size: 16,
        max_batch: 256,
        rule_check: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => o.device_choice = val()?.parse()?,
            "--dtype" => {
                o.dtype = Some(match val()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    d => return Err(format!("unknown --dtype {d}").into()),
                })
            }
            "--shape" => o.shape_name = val()?,
            "--batch" => {
                o.batches = val()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--new-tokens" => o.new_tokens = val()?.parse()?,
            "--prompt-len" => o.prompt_len = val()?.parse()?,
            "--check-samples" => o.check = Some(val()?.parse()?),
            "--f32-head" => o.f32_head = Some(val()?.parse()?),
            "--warm-start" => o.warm = val()?.parse()?,
            "--json" => o.json = true,
            "--groups" => o.groups = val()?.parse()?,
            "--group-size" => o.group_size = val()?.parse()?,
            "--max-batch" => o.max_batch = val()?.parse()?,
            "--rule-check" => o.rule_check = val()?.parse()?,
            "--paths" => {
                o.paths = val()?
                    .split(',')
                    .filter(|p| *p != "none")
                    .map(|p| match p {
                        "infer" => Ok(GenerationPath::Infer),
                        "batched" => Ok(GenerationPath::Batched),
                        other => Err(format!("unknown path {other} (infer, batched)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (--help lists them)").into()),
        }
    }
    Ok(o)
}

/// What `--help` prints (the module doc's options).
const USAGE: &str = "gen_bench: generation throughput and log-prob spread (random weights)
  --device auto|cpu|cuda[:N]   (auto)
  --dtype f32|bf16|f16         (the device's default)
  --shape tiny|small|qwen3-0.6b|qwen3-8b (tiny)
  --batch 1,8,16   --new-tokens 32   --prompt-len 16
  --paths infer,batched|none   which paths to time
  --groups G                   also G groups in flight (0: none), decoded together
  --group-size N               samples per group (16)
  --max-batch B                slots of the groups' bucket (256)
  --rule-check ROWS            the rule's kernel (its CPU emulation on a CPU) against the
                               CPU rule on ROWS random bf16 rows
  --check-samples N            samples of the largest batch compared (default all; 0 skips)
  --f32-head true|false        final norm and head in f32 with a half-precision dtype
  --warm-start STEPS           supervised steps first (tiny shape only)
  --json                       one JSON line with every figure at the end";

/// The inference path's log-probs of `completions` (sampled in `dtype`) against the
/// training forward's (F32): the largest and mean absolute difference per token.
fn logprob_spread(
    policy: &Policy,
    prompt: &[u32],
    completions: &[policy::Completion],
    dtype: DType,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let k = completions.len();
    if k == 0 {
        return Ok(serde_json::Value::Null);
    }
    let (mut worst, mut sum, mut count) = (0f32, 0f64, 0usize);
    for c in completions {
        let reference = response_logprobs(policy, prompt, &c.tokens, 1.0)?;
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
    Ok(serde_json::json!({
        "samples": k, "tokens": count, "max_abs": worst, "mean_abs": sum / count.max(1) as f64,
    }))
}

/// Byte-level two-digit additions (`BOS "a+b=" SEP` → the sum and EOS): something a tiny
/// model learns in a few dozen steps, so that its next-token distributions become peaked.
fn additions() -> Vec<SftExample> {
    let tok = ByteTokenizer;
    let mut out = Vec::new();
    for a in (0..100).step_by(7) {
        for b in (0..100).step_by(3) {
            let mut target: Vec<u32> = format!("{}", a + b).bytes().map(u32::from).collect();
            target.push(ByteTokenizer::EOS);
            out.push(SftExample {
                prompt: tok.encode_prompt(&format!("{a}+{b}=")),
                target,
            });
        }
    }
    out
}
