//! Measures what the learner's log-prob spot check needs to know (`docs/security.md`,
//! "Log-prob spot checks"): the honest spread between the rollout engine's sampler log-probs
//! (the inference path with its KV cache) and the learner's recomputation (teacher-forced
//! training forward), whether one-token forgeries are caught at the default tolerance, and
//! the cost of one check (log-probs alone, and with the draw check of `learner::verdict`)
//! against one training step in the demo's setting.
//!
//! ```text
//! cargo run -j2 -p learner --example spot_check -- [--warm 60] [--groups 40] [--reps 15]
//! ```
//!
//! Setting (the demo's defaults): the embedded tiny model and byte tokenizer, the `arith` task,
//! group size 16, 6 new tokens (and a second set of groups with 64 new tokens), temperature
//! 1.2, B = 4 groups per step, GEPO with a KL weight of 0.05. The model is first warm-started
//! for `--warm` supervised steps as the demo learner does (sharper distributions than random
//! weights). Prints one JSON line.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use learner::spot_check::{compare, recompute_logprobs, SpotRule, DEFAULT_TOLERANCE};
use learner::verdict::{check_group, CheckSettings, SpotVerdict};
use learner::ResponseTokens;
use learner::{LossConfig, Objective, Trainer, TrainerConfig};
use policy::{DType, Device, InferModel, Policy, SamplingParams, Tokenizer};
use rand::{Rng, SeedableRng};
use storage::{Sample, TrajectoryGroup};
use tasks::Task;

const T: f32 = 1.2;
const N: usize = 16;
const B: usize = 4;
/// The assignment seed the prescribed uniforms derive from.
const SEED: [u8; 32] = [5; 32];

fn group(
    model: &InferModel,
    tok: &Tokenizer,
    task: &dyn Task,
    new_tokens: usize,
    rng: &mut rand::rngs::StdRng,
) -> Result<TrajectoryGroup> {
    let p = task.prompt(task.sample_index(rng))?;
    let prompt = tok.encode_prompt(&p.text)?;
    let params = SamplingParams {
        temperature: T,
        ..SamplingParams::new(new_tokens, tok.eos_ids())
    };
    let seq = rng.gen::<u64>();
    let draws = policy::Draws::prescribed(&SEED, "bench", seq, N);
    let out = policy::infer::generate_with(model, &prompt, &params, &draws)?;
    Ok(TrajectoryGroup {
        group_id: rng.gen(),
        task_id: "arith".into(),
        prompt_id: p.id.clone(),
        version: 0,
        producer: "bench".into(),
        seq,
        signature: None,
        prompt_text: p.text.clone(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples: out
            .into_iter()
            .map(|c| Sample {
                trajectory_id: rng.gen(),
                loss_mask: vec![1; c.tokens.len()],
                response_text: String::new(),
                reward: rng.gen_range(0.0..1.0),
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: 0,
            })
            .collect(),
    })
}

/// Max and mean |Δ| over `groups`, and how many one-token forgeries of `delta` are caught.
fn spread(
    policy: &Policy,
    groups: &[TrajectoryGroup],
    deltas: &[f32],
) -> Result<serde_json::Value> {
    let rule = SpotRule::default();
    let (mut max, mut sum, mut tokens) = (0f32, 0f64, 0usize);
    let mut caught = vec![0usize; deltas.len()];
    let mut honest_passed = 0usize;
    for g in groups {
        let rows = recompute_logprobs(policy, g, T)?;
        let r = compare(g, &rows)?;
        honest_passed += usize::from(rule.passes(&r));
        max = max.max(r.max_abs_diff);
        sum += f64::from(r.mean_abs_diff) * r.tokens as f64;
        tokens += r.tokens;
        for (k, &d) in deltas.iter().enumerate() {
            let mut f = g.clone();
            let s = f.samples.len() / 2;
            let j = f.samples[s].sampler_logprobs.len() - 1;
            f.samples[s].sampler_logprobs[j] += d;
            if !rule.passes(&compare(&f, &rows)?) {
                caught[k] += 1;
            }
        }
    }
    Ok(serde_json::json!({
        "groups": groups.len(), "honest_passed": honest_passed, "tokens": tokens, "max_abs_diff": max,
        "mean_abs_diff": sum / tokens.max(1) as f64,
        "forgeries": deltas.iter().zip(&caught).map(|(d, c)| serde_json::json!({"delta": d, "caught": c}))
            .collect::<Vec<_>>(),
    }))
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2] * 1e3
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut warm, mut n_groups, mut reps) = (60usize, 40usize, 15usize);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--warm" => warm = val()?.parse()?,
            "--groups" => n_groups = val()?.parse()?,
            "--reps" => reps = val()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    let (policy, tok) = policy::embedded_default(0)?;
    let task = tasks::build_task("arith", &serde_json::Value::Null)?;
    if warm > 0 {
        learner::warm_start_on_task(&policy, &tok, task.as_ref(), warm, 0)?;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let deltas = [0.5f32, 0.05, 0.01, 0.005];

    // Honest spread: f32 inference path (what a CPU worker runs) and f16 (a stand-in for the
    // half-precision path of GPU workers; bf16 needs CUDA in candle).
    let f32_model = InferModel::from_policy(&policy)?;
    anyhow::ensure!(f32_model.dtype() == DType::F32);
    let short: Vec<_> = (0..n_groups)
        .map(|_| group(&f32_model, &tok, task.as_ref(), 6, &mut rng))
        .collect::<Result<_>>()?;
    let long: Vec<_> = (0..n_groups / 4)
        .map(|_| group(&f32_model, &tok, task.as_ref(), 64, &mut rng))
        .collect::<Result<_>>()?;
    let f16_model = InferModel::new(&policy, DType::F16)?;
    let half: Vec<_> = (0..n_groups / 4)
        .map(|_| group(&f16_model, &tok, task.as_ref(), 6, &mut rng))
        .collect::<Result<_>>()?;
    let spread_short = spread(&policy, &short, &deltas)?;
    let spread_long = spread(&policy, &long, &deltas)?;
    let spread_f16 = spread(&policy, &half, &deltas)?;

    let (t_check, t_full, t_load) = time_checks(&policy, &short, reps)?;
    let t_train = time_train_steps(&policy, &f32_model, &tok, task.as_ref(), reps, &mut rng)?;
    let (check_ms, load_ms, train_ms) = (median_ms(t_check), median_ms(t_load), median_ms(t_train));
    let full_ms = median_ms(t_full);
    let fraction = learner::spot_check::DEFAULT_FRACTION;
    // Expected checks per step: fraction × B groups pulled per step.
    let per_step_ms = fraction * B as f64 * check_ms;
    println!(
        "{}",
        serde_json::json!({
            "model": "tiny", "warm_start_steps": warm, "temperature": T,
            "tolerance": DEFAULT_TOLERANCE,
            "spread_f32_6_tokens": spread_short,
            "spread_f32_64_tokens": spread_long,
            "spread_f16_6_tokens": spread_f16,
            "check_ms_median": check_ms,
            "check_with_draws_ms_median": full_ms,
            "check_with_draws_fraction_of_train_step": full_ms / train_ms,
            "snapshot_load_ms_median": load_ms,
            "train_step_ms_median": train_ms,
            "groups_per_step": B, "group_size": N, "fraction": fraction,
            "verify_ms_per_step": per_step_ms,
            "verify_fraction_of_train_step": per_step_ms / train_ms,
            "check_fraction_of_train_step": check_ms / train_ms,
        })
    );
    Ok(())
}

/// Cost of one check (demo group: 16 samples, 6 new tokens) — the log-probs alone, and the
/// full verdict with the draw check of every token — and of loading a snapshot, in seconds
/// per repetition (the first check is a warm-up and is dropped).
fn time_checks(
    policy: &Policy,
    groups: &[TrajectoryGroup],
    reps: usize,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let rule = SpotRule::default();
    let full = CheckSettings {
        rule: policy::rule::RuleParams {
            temperature: T,
            top_p: 1.0,
        },
        tolerance: DEFAULT_TOLERANCE,
        delta: learner::verdict::DEFAULT_MARGIN.f32,
        seed: SEED,
        check_draws: true,
    };
    let (mut t_check, mut t_full) = (Vec::new(), Vec::new());
    for g in groups.iter().cycle().take(reps + 1) {
        let t0 = Instant::now();
        let (_, ok) = rule.check(policy, g, T)?;
        t_check.push(t0.elapsed().as_secs_f64());
        anyhow::ensure!(ok, "an honest group failed");
        let t0 = Instant::now();
        let r = check_group(policy, g, &full, &ResponseTokens)?;
        t_full.push(t0.elapsed().as_secs_f64());
        anyhow::ensure!(
            r.verdict(full.tolerance) == SpotVerdict::Pass,
            "an honest group failed: {r:?}"
        );
    }
    t_check.remove(0); // warm-up
    t_full.remove(0);
    let bytes = policy.to_safetensors_bytes()?;
    let mut t_load = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let p = Policy::from_safetensors_bytes(policy.config(), &bytes, &Device::Cpu)?;
        t_load.push(t0.elapsed().as_secs_f64());
        drop(p);
    }
    Ok((t_check, t_full, t_load))
}

/// One training step (B = 4 fresh demo groups) per repetition after a warm-up step, in
/// seconds.
fn time_train_steps(
    policy: &Policy,
    model: &InferModel,
    tok: &Tokenizer,
    task: &dyn tasks::Task,
    reps: usize,
    rng: &mut rand::rngs::StdRng,
) -> Result<Vec<f64>> {
    let bytes = policy.to_safetensors_bytes()?;
    let mut tc = TrainerConfig {
        loss: LossConfig {
            objective: Objective::Gepo,
            kl_beta: 0.05,
            ..LossConfig::default()
        },
        temperature: T,
        groups_per_step: B,
        group_size: N,
        ..TrainerConfig::default()
    };
    tc.optim.lr = 1e-3;
    let mut trainer = Trainer::new(
        Policy::from_safetensors_bytes(policy.config(), &bytes, &Device::Cpu)?,
        tc,
    )?;
    let mut t_train = Vec::new();
    for step in 0..=reps {
        let mut batch: Vec<TrajectoryGroup> = (0..B)
            .map(|_| group(model, tok, task, 6, rng))
            .collect::<Result<_>>()?;
        for g in &mut batch {
            g.version = trainer.version();
        }
        let pipeline = learner::Pipeline::new(learner::pipeline::limits_of(policy.config(), N));
        let batch: Vec<_> = batch
            .into_iter()
            .map(|g| pipeline.verify(&g.producer.clone(), 0, g))
            .collect::<Result<_, _>>()?;
        let st = trainer.train_step(&batch)?;
        anyhow::ensure!(st.stepped, "the step did not train: {st:?}");
        if step > 0 {
            t_train.push(st.t_train_s);
        }
    }
    Ok(t_train)
}
