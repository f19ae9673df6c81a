//! One learner step (forward, backward, AdamW) of a model of a given shape on a given device,
//! on synthetic groups: what `docs/gpu.md` reports as "a learner step" on a GPU host, and the
//! same program on the CPU.
//!
//! ```text
//! cargo run --release -p learner --example train_step -- \
//!     [--device cpu|cuda|cuda:N] [--shape tiny|small|qwen3-0.6b] [--groups 4] [--group-size 8] \
//!     [--prompt-len 32] [--response-len 64] [--steps 5] [--kl] [--micro-batch-tokens 4096] \
//!     [--lora-rank R] [--base-dtype f32|bf16] [--layers L] [--elementary] \
//!     [--keep-freed-memory] [--on-thread] [--lr LR] [--warm-start] [--warm-steps W] \
//!     [--warm-lr LR] [--bf16-stats PATH] [--precision auto|bf16|f16|f32] [--recompute] \
//!     [--query-chunk N] [--tf32 true|false] [--peak-tflops X]
//! # on a GPU host, with a binary built by scripts/build-cuda.sh's environment:
//! cargo run --release -p learner --features cuda --example train_step -- --device cuda --shape qwen3-0.6b
//! ```
//!
//! Random weights (nothing is downloaded), random prompt and response tokens, random rewards
//! (so no group has all-equal rewards), sampler log-probs set to the learner's own at step 0's
//! weights' scale (a constant: the ratio is not 1, which changes no cost). The learner keeps
//! f32 master weights on the device. Prints one JSON line: median and every step's time (and
//! the process's minor page faults in each step), tokens per second (prompt + response tokens of the batch / step time), the memory the memory model
//! predicts for the configuration (`policy::memory::learner_bytes`) and, on the CPU, the
//! process's peak resident memory (`VmHWM`; on a GPU `scripts/gpu-smoke.sh` samples the
//! device's memory while this runs). `--lora-rank R` trains LoRA adapters of rank R (α = 2R,
//! all seven projections) on the frozen random base instead of every weight; the base is held
//! in `policy::lora::frozen_base_dtype` for a bf16 run (bf16 on CUDA, f32 on the CPU) unless
//! `--base-dtype` says otherwise (`bf16` on the CPU runs the GPU's bf16-base path, widened per
//! matmul).
//!
//! Memory: the JSON also carries `host_peak_live_bytes`, the most heap bytes this process held
//! at once (every allocation is counted, so on the CPU it is what the tensors really took,
//! without the allocator's slack), and `predicted_bytes_at_len`, the memory model's count for
//! the largest pass this run really makes (`learner::trainer::largest_pass`: its tokens and
//! sequence length, not the budget's worst case).
//! `--elementary` runs the elementary-op path a GPU takes (no fused CPU kernels), so the CPU
//! peak then measures the GPU's autograd graph; `--layers L` keeps only L decoder layers of the
//! shape, so a large shape's per-layer and vocabulary terms can be measured in the CPU's memory.
//!
//! Compute: `--precision` sets the learner's compute dtype (`learner::Precision`: bf16 on
//! CUDA, f32 on the CPU by default), `--recompute` recomputes activations layer by layer with
//! attention in chunks of `--query-chunk` queries. `--tf32` (default true on CUDA) turns on
//! candle's reduced-precision f32 GEMM (TF32) for the f32 matmuls left, process-wide. The JSON
//! reports `mfu`: model FLOPs per second — 6·P per token for full fine-tuning (forward 2·P,
//! backward 4·P), 4·P for LoRA (the frozen base's forward and its input gradients; the
//! adapters' FLOPs are not counted), a recomputed forward never counted — over the peak of
//! the device: `--peak-tflops`, else 989.4 TFLOP/s for bf16/f16 and 494.7 for TF32 on CUDA
//! (H100/H200 SXM dense), 66.9 for f32 without TF32; on the CPU none unless given (`mfu` null).
//! Shapes `qwen3-4b`, `qwen3-8b` and `qwen3-32b` are the Hugging Face configs' shapes.
//!
//! Heap: `--on-thread` trains on a spawned thread, as the node does (its learner trains on a
//! blocking thread of its runtime), and `--keep-freed-memory` first makes the node's CPU
//! learner's heap setting (`learner::heap`; `docs/gpu.md`, "Page faults at large shapes").
//!
//! bf16 drift (`docs/storage.md`, "How many bf16 values a step changes"): `--lr` sets AdamW's
//! learning rate; `--warm-start` rounds the random weights to bf16 first and starts a fresh
//! optimiser on them, as a learner that loads a bf16 checkpoint does (`--warm-steps W` first
//! trains W steps at `--warm-lr`, default 1e-4, then rounds and restarts the optimiser);
//! `--bf16-stats PATH` writes one JSON line per step (step 0 included, untimed warm-up or not)
//! with the fraction of bf16 values that changed against the version one and two steps before,
//! per tensor kind, the rounding predictions (`support/bf16_drift.rs`), and the bytes of the
//! format-2 deltas from those versions against the full bf16 payload.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use learner::{Trainer, TrainerConfig};
use policy::{Device, ModelConfig, Policy};
use rand::SeedableRng;

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

#[path = "../src/test_util.rs"]
mod test_util;

mod support {
    pub mod bf16_drift;
}
use support::bf16_drift;

fn shape(name: &str) -> Result<ModelConfig> {
    let tiny = ModelConfig::tiny();
    Ok(match name {
        "tiny" => tiny,
        // A small Qwen3 shape that still trains on two CPU cores.
        "small" => ModelConfig {
            vocab_size: 4096,
            hidden_size: 256,
            intermediate_size: 768,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 1024,
            ..tiny
        },
        // Qwen3-0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128,
        // intermediate 3072, vocab 151,936, tied embeddings.
        "qwen3-0.6b" => ModelConfig::qwen3_0_6b(),
        "qwen3-4b" => ModelConfig::qwen3_4b(),
        "qwen3-8b" => ModelConfig::qwen3_8b(),
        "qwen3-32b" => ModelConfig::qwen3_32b(),
        other => bail!(
            "unknown --shape {other} (tiny, small, qwen3-0.6b, qwen3-4b, qwen3-8b, qwen3-32b)"
        ),
    })
}

fn device(name: &str) -> Result<Device> {
    let choice: policy::DeviceChoice = name.parse()?;
    Ok(policy::device::select(choice)?)
}

/// Peak resident memory of this process (`VmHWM` of `/proc/self/status`), bytes; 0 if unknown.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Field `n` (1-based, as proc(5) numbers them) of `/proc/self/stat`; `None` if unknown.
/// Fields are counted after the parenthesised command name (field 2), which may hold spaces.
fn self_stat(n: usize) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// CPU time this process has used (user + system: fields 14 and 15, in clock ticks of
/// 1/100 s), seconds; 0 if unknown. On a CPU shared with other work, the step's CPU time is
/// steadier than its wall time.
fn cpu_seconds() -> f64 {
    let ticks = self_stat(14).zip(self_stat(15)).map(|(u, s)| u + s);
    ticks.map_or(0.0, |t| t as f64 / 100.0)
}

/// Minor page faults this process has taken (field 10); 0 if unknown. A page the kernel must
/// zero before first use counts one: what a step costs when its large blocks are mapped
/// afresh (`learner::heap`).
fn minor_faults() -> u64 {
    self_stat(10).unwrap_or(0)
}

/// The command line (see the module's doc).
struct Args {
    dev: String,
    shape_name: String,
    groups: usize,
    n: usize,
    prompt_len: usize,
    response_len: usize,
    steps: usize,
    kl: bool,
    micro: usize,
    lora_rank: usize,
    base_dtype: Option<policy::DType>,
    layers: Option<usize>,
    elementary: bool,
    keep_freed_memory: bool,
    on_thread: bool,
    lr: Option<f64>,
    warm_start: bool,
    warm_steps: usize,
    warm_lr: f64,
    bf16_stats: Option<String>,
    precision: learner::Precision,
    recompute: bool,
    query_chunk: usize,
    tf32: Option<bool>,
    peak_tflops: Option<f64>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        dev: "cpu".to_string(),
        shape_name: "tiny".to_string(),
        groups: 4,
        n: 8,
        prompt_len: 32,
        response_len: 64,
        steps: 5,
        kl: false,
        micro: TrainerConfig::default().micro_batch_tokens,
        lora_rank: 0,
        base_dtype: None,
        layers: None,
        elementary: false,
        keep_freed_memory: false,
        on_thread: false,
        lr: None,
        warm_start: false,
        warm_steps: 0,
        warm_lr: 1e-4,
        bf16_stats: None,
        precision: learner::Precision::Auto,
        recompute: false,
        query_chunk: 0,
        tf32: None,
        peak_tflops: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut val = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--device" => a.dev = val()?,
            "--shape" => a.shape_name = val()?,
            "--groups" => a.groups = val()?.parse()?,
            "--group-size" => a.n = val()?.parse()?,
            "--prompt-len" => a.prompt_len = val()?.parse()?,
            "--response-len" => a.response_len = val()?.parse()?,
            "--steps" => a.steps = val()?.parse()?,
            "--kl" => a.kl = true,
            "--micro-batch-tokens" => a.micro = val()?.parse()?,
            "--lora-rank" => a.lora_rank = val()?.parse()?,
            "--layers" => a.layers = Some(val()?.parse::<usize>()?),
            "--elementary" => a.elementary = true,
            "--keep-freed-memory" => a.keep_freed_memory = true,
            "--on-thread" => a.on_thread = true,
            "--lr" => a.lr = Some(val()?.parse()?),
            "--warm-start" => a.warm_start = true,
            "--warm-steps" => a.warm_steps = val()?.parse()?,
            "--warm-lr" => a.warm_lr = val()?.parse()?,
            "--bf16-stats" => a.bf16_stats = Some(val()?),
            "--precision" => a.precision = val()?.parse()?,
            "--recompute" => a.recompute = true,
            "--query-chunk" => a.query_chunk = val()?.parse()?,
            "--tf32" => a.tf32 = Some(val()?.parse()?),
            "--peak-tflops" => a.peak_tflops = Some(val()?.parse()?),
            "--base-dtype" => {
                a.base_dtype = Some(match val()?.as_str() {
                    "f32" => policy::DType::F32,
                    "bf16" => policy::DType::BF16,
                    other => bail!("unknown --base-dtype {other} (f32, bf16)"),
                })
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (--help lists them)"),
        }
    }
    Ok(a)
}

/// The bf16 payloads of the last two versions, for the delta sizes of `--bf16-stats`.
struct Versions {
    prev: Vec<u8>,
    prev2: Option<Vec<u8>>,
}

/// Bytes of the format-2 deltas (`policy::delta::encode`) to the newest version from the one
/// (κ = 1) and two (κ = 2) before, and of its full payload.
struct DeltaSizes {
    full_bytes: usize,
    k1: usize,
    k2: Option<usize>,
    encode_s: f64,
}

impl Versions {
    fn new(payload: Vec<u8>) -> Versions {
        Versions {
            prev: payload,
            prev2: None,
        }
    }

    fn push(&mut self, payload: Vec<u8>) -> Result<DeltaSizes> {
        let t0 = Instant::now();
        let k1 = policy::delta::encode(&self.prev, &payload)?.len();
        let encode_s = t0.elapsed().as_secs_f64();
        let k2 = match &self.prev2 {
            Some(p) => Some(policy::delta::encode(p, &payload)?.len()),
            None => None,
        };
        let sizes = DeltaSizes {
            full_bytes: payload.len(),
            k1,
            k2,
            encode_s,
        };
        self.prev2 = Some(std::mem::replace(&mut self.prev, payload));
        Ok(sizes)
    }
}

/// What `--help` prints (the module doc's options).
const USAGE: &str = "train_step: one learner step (forward, backward, AdamW) on synthetic groups
  --device cpu|cuda|cuda:N (cpu)   --shape tiny|small|qwen3-0.6b (tiny)   --layers L
  --groups 4   --group-size 8   --prompt-len 32   --response-len 64   --steps 5
  --kl                      with the KL reference
  --micro-batch-tokens N    tokens per forward/backward pass (the trainer's default)
  --lora-rank R             train LoRA adapters of rank R on the frozen base
  --base-dtype f32|bf16     the frozen base's dtype (LoRA)
  --elementary              the elementary-op path a GPU takes (no fused CPU kernels)
  --keep-freed-memory       the node's CPU learner heap setting
  --on-thread               train on a spawned thread, as the node does
  --lr LR                   AdamW's learning rate (the trainer's default)
  --warm-start              round the weights to bf16 and start a fresh optimiser on them
  --warm-steps W --warm-lr LR   train W steps at LR before the warm start (0, 1e-4)
  --bf16-stats PATH         one JSON line per step: bf16 values changed, per tensor kind
  --precision P             auto|bf16|f16|f32 compute (auto: bf16 on CUDA, f32 on the CPU)
  --recompute               recompute activations per layer, attention in query chunks
  --query-chunk N           queries per attention chunk when recomputing (1024)
  --tf32 true|false         TF32 for f32 matmuls (CUDA; default true there)
  --peak-tflops X           the device's peak for MFU (default: by device and dtype)
Prints one JSON line: step times, tokens/s, predicted and measured memory.";

fn main() -> Result<()> {
    let args = parse_args()?;
    // First, before any thread: the node's CPU learner does the same (`learner::heap`).
    let heap = args
        .keep_freed_memory
        .then(learner::heap::keep_freed_memory);
    if args.on_thread {
        // Where the node trains: a thread other than `main` (a blocking thread of its runtime),
        // whose allocations glibc serves from another arena unless the heap setting says not.
        std::thread::spawn(move || run(args, heap))
            .join()
            .map_err(|_| anyhow::anyhow!("the training thread panicked"))?
    } else {
        run(args, heap)
    }
}

fn run(args: Args, heap: Option<learner::heap::HeapSetting>) -> Result<()> {
    let Args {
        dev,
        shape_name,
        groups,
        n,
        prompt_len,
        response_len,
        steps,
        kl,
        micro,
        lora_rank,
        base_dtype,
        layers,
        elementary,
        keep_freed_memory: _,
        on_thread,
        lr,
        warm_start,
        warm_steps,
        warm_lr,
        bf16_stats,
        precision,
        recompute,
        query_chunk,
        tf32,
        peak_tflops,
    } = args;
    // The trainer runs its forwards on this thread.
    policy::model::use_elementary_ops(elementary);
    let mut cfg = shape(&shape_name)?;
    if let Some(l) = layers {
        anyhow::ensure!(l >= 1, "--layers must be at least 1");
        cfg.num_hidden_layers = l;
    }
    let device = device(&dev)?;
    anyhow::ensure!(
        prompt_len + response_len <= cfg.max_position_embeddings,
        "prompt + response longer than the model's context"
    );
    let tf32 = tf32.unwrap_or(device.is_cuda()) && device.is_cuda();
    // Process-wide; a no-op without the CUDA backend.
    policy::candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
    let mut policy = Policy::new_random(&cfg, 0, &device)?;
    let mut tc = TrainerConfig {
        groups_per_step: groups,
        group_size: n,
        temperature: 1.0,
        micro_batch_tokens: micro,
        precision,
        recompute,
        query_chunk,
        ..TrainerConfig::default()
    };
    let compute = tc.compute(&device);
    tc.loss.kl_beta = if kl { 0.05 } else { 0.0 };
    if let Some(lr) = lr {
        tc.optim.lr = lr;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    if warm_steps > 0 || warm_start {
        anyhow::ensure!(lora_rank == 0, "--warm-start trains the full model");
        if warm_steps > 0 {
            let mut wc = tc.clone();
            wc.optim.lr = warm_lr;
            let pipeline = learner::Pipeline::new(learner::pipeline::limits_of(&cfg, 0));
            let mut tr = Trainer::new(policy, wc)?;
            for _ in 0..warm_steps {
                let batch = test_util::synthetic_groups(
                    &mut rng,
                    groups,
                    n,
                    prompt_len,
                    response_len,
                    cfg.vocab_size as u32,
                    tr.version(),
                );
                let batch: Vec<_> = batch
                    .into_iter()
                    .map(|g| pipeline.verify("bench", 0, g))
                    .collect::<Result<_, _>>()?;
                tr.train_step(&batch)?;
            }
            policy = tr.policy().no_grad()?;
        }
        // What a learner holds after loading a bf16 checkpoint: f32 masters on the bf16 grid,
        // and (a new trainer below) a fresh optimiser.
        let bytes = policy.to_safetensors_bytes_as(policy::DType::BF16)?;
        drop(policy);
        policy = Policy::from_safetensors_bytes(&cfg, &bytes, &device)?;
    }
    let lora = (lora_rank > 0).then(|| policy::LoraConfig::new(lora_rank, 2.0 * lora_rank as f64));
    let base_dtype =
        base_dtype.unwrap_or_else(|| policy::lora::frozen_base_dtype(&device, policy::DType::BF16));
    let training = match &lora {
        Some(lora) => policy::memory::Training::Lora { lora, base_dtype },
        None => kl.into(),
    };
    let predicted =
        policy::memory::learner_bytes_with(&cfg, training, compute, tc.tokens_per_pass(&cfg));
    let budget = tc.micro_batch_tokens;
    let policy = match &lora {
        Some(l) => policy.with_base_dtype(base_dtype)?.with_lora(l, 0)?,
        None => policy,
    };
    let pipeline = learner::Pipeline::new(learner::pipeline::limits_of(policy.config(), 0));
    let lr_used = tc.optim.lr;
    let mut trainer = Trainer::new(policy, tc)?;
    let mut drift = match &bf16_stats {
        Some(path) => {
            let tracker = bf16_drift::Tracker::new(trainer.policy(), lr_used)?;
            let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
            use std::io::Write;
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "step": 0, "lr": lr_used, "shape": shape_name, "warm_start": warm_start,
                    "warm_steps": warm_steps, "warm_lr": warm_lr, "groups": groups,
                    "group_size": n, "prompt_len": prompt_len, "response_len": response_len,
                    "initial": bf16_drift::to_json(&tracker.initial()),
                })
            )?;
            out.flush()?;
            let payload = trainer
                .policy()
                .to_safetensors_bytes_as(policy::DType::BF16)?;
            Some((tracker, out, Versions::new(payload)))
        }
        None => None,
    };
    let vocab = cfg.vocab_size as u32;
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    let mut faults = Vec::new();
    // (padded tokens, sequence length) of the largest pass run, for the memory model's count.
    let mut largest = (0, 0);
    // Step 0 warms up (allocations, kernel loading); the rest are timed.
    for step in 0..=steps {
        let batch = test_util::synthetic_groups(
            &mut rng,
            groups,
            n,
            prompt_len,
            response_len,
            vocab,
            trainer.version(),
        );
        largest = largest.max(learner::trainer::largest_pass(&batch, budget));
        let batch: Vec<_> = batch
            .into_iter()
            .map(|g| pipeline.verify("bench", 0, g))
            .collect::<Result<_, _>>()?;
        let (t0, c0, f0) = (Instant::now(), cpu_seconds(), minor_faults());
        let st = trainer.train_step(&batch)?;
        anyhow::ensure!(st.stepped, "the step did not train: {st:?}");
        let step_s = t0.elapsed().as_secs_f64();
        if let Some((tracker, out, versions)) = drift.as_mut() {
            use std::io::Write;
            let stats = tracker.step(trainer.policy())?;
            let payload = trainer
                .policy()
                .to_safetensors_bytes_as(policy::DType::BF16)?;
            let deltas = versions.push(payload)?;
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "step": step + 1, "lr": lr_used, "step_s": step_s,
                    "kinds": bf16_drift::to_json(&stats),
                    "full_bytes": deltas.full_bytes, "delta_k1_bytes": deltas.k1,
                    "delta_k2_bytes": deltas.k2, "delta_encode_s": deltas.encode_s,
                })
            )?;
            out.flush()?;
        }
        if step > 0 {
            times.push(step_s);
            cpu_times.push(cpu_seconds() - c0);
            faults.push(minor_faults() - f0);
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let tokens = groups * n * (prompt_len + response_len);
    let (pass, len) = largest;
    let predicted_at_len = policy::memory::training_state_bytes_with(&cfg, training, compute)
        + policy::memory::pass_activation_bytes_with(&cfg, training, compute, len, pass);
    // Model FLOPs per token (see the module doc) and the device's peak.
    let per_param = if lora.is_some() { 4.0 } else { 6.0 };
    let flops_per_token = per_param * cfg.num_params() as f64;
    let half = compute.dtype != policy::DType::F32;
    let peak = peak_tflops.or(match (device.is_cuda(), half, tf32) {
        (true, true, _) => Some(989.4),
        (true, false, true) => Some(494.7),
        (true, false, false) => Some(66.9),
        (false, ..) => None,
    });
    let tokens_per_s = tokens as f64 / median;
    let mfu = peak.map(|p| flops_per_token * tokens_per_s / (p * 1e12));
    println!(
        "{}",
        serde_json::json!({
            "device": if device.is_cuda() { "cuda" } else { "cpu" },
            "shape": shape_name, "params": cfg.num_params(),
            "groups": groups, "group_size": n, "prompt_len": prompt_len,
            "response_len": response_len, "kl": kl, "micro_batch_tokens": micro,
            "lora_rank": lora_rank,
            "base_dtype": format!("{:?}", if lora.is_some() { base_dtype } else { policy::DType::F32 }),
            "layers": cfg.num_hidden_layers, "elementary": elementary,
            "on_thread": on_thread, "heap": heap.map(|h| format!("{h:?}")),
            "predicted_bytes": predicted, "predicted_bytes_at_len": predicted_at_len,
            "pass_tokens": pass,
            "host_peak_rss_bytes": peak_rss(),
            "host_peak_live_bytes": counting_alloc::peak(),
            "step_ms_median": median * 1e3,
            "step_ms": times.iter().map(|t| t * 1e3).collect::<Vec<_>>(),
            "step_cpu_ms": cpu_times.iter().map(|t| t * 1e3).collect::<Vec<_>>(),
            "step_minor_faults": faults,
            "tokens_per_s": tokens_per_s,
            "precision": format!("{:?}", compute.dtype), "recompute": recompute,
            "query_chunk": compute.recompute, "tf32": tf32,
            "model_flops_per_token": flops_per_token, "peak_tflops": peak, "mfu": mfu,
            "mfu_note": if peak.is_none() { Some("no stated peak for this device: pass --peak-tflops") } else { None },
        })
    );
    Ok(())
}
