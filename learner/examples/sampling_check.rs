//! Measures checkable sampling (`docs/security.md`, "Checkable sampling"): the honest numeric
//! spread of a worker in a given dtype against the learner's f32 recompute (log-probs, and the
//! cumulative probabilities the draw check compares), false positives of the spot check's
//! verdict on honest groups, the detection rate per forced token, per stale-version token, and
//! the cost of one checked group.
//!
//! ```text
//! cargo run -j2 -p learner --example sampling_check -- [--warm 60] [--groups 10000]
//!     [--dtype f32|f16|bf16] [--top-p 1.0] [--spread-groups 1000] [--forced-groups 500]
//!     [--device cpu|cuda]
//! ```
//!
//! On a GPU (`--features cuda`, `--device cuda --dtype bf16`) the same measurement gives the
//! bf16 figures: the worker samples in bf16 on the GPU, the learner recomputes in f32 there.
//!
//! Setting (the demo's): the embedded tiny model warm-started for `--warm` supervised steps
//! on `arith` (sharper than random weights, whose spread is several times smaller), groups of
//! 16 samples × 6 new tokens at temperature 1.2, uniforms prescribed for (seed, producer, group
//! number, sample, position). The worker samples on the inference path in `--dtype` (f16 on
//! the CPU stands in for half precision; bf16 inference needs CUDA in candle); the learner
//! recomputes with the f32 training forward. Margins: the defaults for that dtype
//! (`learner::verdict::DEFAULT_TOLERANCE` / `DEFAULT_MARGIN`). Prints one JSON line.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use learner::verdict::{
    check_group, CheckSettings, SpotVerdict, DEFAULT_MARGIN, DEFAULT_TOLERANCE,
};
use learner::{ResponseTokens, WorkerDtype};
use policy::rule::{token_windows, Margins, RuleParams};
use policy::{DType, Draws, InferModel, Policy, SamplingParams, Tokenizer};
use rand::{Rng, SeedableRng};
use storage::{Sample, TrajectoryGroup};
use tasks::Task;

const T: f32 = 1.2;
const N: usize = 16;
const NEW_TOKENS: usize = 6;
const SEED: [u8; 32] = [11; 32];
const PRODUCER: &str = "12D3KooWbench";

struct Setup {
    task: std::sync::Arc<dyn Task>,
    tok: Tokenizer,
    params: SamplingParams,
}

/// Honest group number `seq`, sampled by `model` with the prescribed uniforms.
fn honest(s: &Setup, model: &InferModel, seq: u64, rng: &mut impl Rng) -> Result<TrajectoryGroup> {
    let p = s.task.prompt(s.task.sample_index(rng))?;
    let prompt = s.tok.encode_prompt(&p.text)?;
    let draws = Draws::prescribed(&SEED, PRODUCER, seq, N);
    let out = policy::infer::generate_with(model, &prompt, &s.params, &draws)?;
    Ok(TrajectoryGroup {
        group_id: rng.gen(),
        task_id: "arith".into(),
        prompt_id: p.id,
        version: 0,
        producer: PRODUCER.into(),
        seq,
        signature: None,
        prompt_text: p.text,
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples: out
            .into_iter()
            .map(|c| Sample {
                trajectory_id: rng.gen(),
                loss_mask: vec![1; c.tokens.len()],
                response_text: String::new(),
                reward: 0.0,
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: 0,
            })
            .collect(),
    })
}

/// Per forced-token kind: tokens forced, of those equal to the rule's own draw (the forger
/// wrote what the rule draws: not a forgery), and detected.
#[derive(Default, Clone, Copy)]
struct Kind {
    forced: u64,
    same: u64,
    detected: u64,
}

#[derive(Default)]
struct Forced {
    likely: Kind,
    argmax: Kind,
    uniform: Kind,
    p_likely: f64,
}

/// Forces one token at a random position of every sample of `g` (three kinds, each checked
/// alone against the learner's logits at that position) and counts the detections.
fn force(
    policy: &Policy,
    g: &TrajectoryGroup,
    rule: RuleParams,
    margins: Margins,
    acc: &mut Forced,
    rng: &mut impl Rng,
) -> Result<()> {
    let pairs: Vec<(&[u32], &[u32])> = g
        .samples
        .iter()
        .map(|s| (g.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
        .collect();
    let logits = policy::batch_response_logits(policy, &pairs)?;
    for (i, (s, l)) in g.samples.iter().zip(&logits).enumerate() {
        let j = rng.gen_range(0..s.response_tokens.len());
        let honest_tok = s.response_tokens[j];
        let row = l.get(j)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let u =
            policy::SampleStream::prescribed(&SEED, PRODUCER, g.seq, i as u64).uniform(j as u64);
        // A plausible token (drawn from the model with the forger's own randomness), the most
        // probable one, and any token of the vocabulary.
        let likely = policy::rule::draw(&row, rule, rng.gen())?.token;
        let argmax = row
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (k, &x)| if x > b.1 { (k, x) } else { b })
            .0 as u32;
        let uniform = rng.gen_range(0..row.len() as u32);
        let rows = l.get(j)?.unsqueeze(0)?.repeat((3, 1))?;
        let w = token_windows(&rows, &[likely, argmax, uniform], rule, margins)?;
        for ((k, tok), w) in [&mut acc.likely, &mut acc.argmax, &mut acc.uniform]
            .into_iter()
            .zip([likely, argmax, uniform])
            .zip(&w)
        {
            k.forced += 1;
            k.same += u64::from(tok == honest_tok);
            k.detected += u64::from(!w.admits(u));
        }
        acc.p_likely += w[0].p;
    }
    Ok(())
}

/// The largest difference between a worker's and the learner's CDF bounds of each sampled
/// token of `g` (zero margins): the worker's logits from its own path (`model`, one row at a
/// time), the learner's from its f32 training forward. What the margin δ must cover.
fn cdf_spread(
    policy: &Policy,
    model: &InferModel,
    g: &TrajectoryGroup,
    rule: RuleParams,
) -> Result<f64> {
    let pairs: Vec<(&[u32], &[u32])> = g
        .samples
        .iter()
        .map(|s| (g.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
        .collect();
    let learner = policy::batch_response_logits(policy, &pairs)?;
    let zero = Margins::new(0.0, 0.0);
    let mut worst = 0f64;
    for (s, l) in g.samples.iter().zip(&learner) {
        let mut cache = model.new_cache(1, g.prompt_tokens.len() + s.response_tokens.len())?;
        let ids = policy::Tensor::new(g.prompt_tokens.as_slice(), model.device())?.unsqueeze(0)?;
        let mut rows = vec![model.forward_last(&ids, &mut cache)?];
        for &t in &s.response_tokens[..s.response_tokens.len() - 1] {
            let ids = policy::Tensor::new(&[t], model.device())?.unsqueeze(0)?;
            rows.push(model.forward_last(&ids, &mut cache)?);
        }
        let worker = policy::Tensor::cat(&rows, 0)?;
        let a = token_windows(&worker, &s.response_tokens, rule, zero)?;
        let b = token_windows(l, &s.response_tokens, rule, zero)?;
        for (a, b) in a.iter().zip(&b) {
            worst = worst
                .max((a.lower - b.lower).abs())
                .max((a.upper - b.upper).abs());
        }
    }
    Ok(worst)
}

fn rate(k: Kind) -> serde_json::Value {
    serde_json::json!({
        "forced": k.forced, "same_as_rule": k.same, "detected": k.detected,
        "rate": k.detected as f64 / k.forced.max(1) as f64,
        "rate_when_different": k.detected as f64 / (k.forced - k.same).max(1) as f64,
    })
}

fn main() -> Result<()> {
    let Args {
        warm,
        groups,
        spread_groups,
        forced_groups,
        dtype,
        top_p,
        device,
    } = parse_args()?;
    let device = policy::device::select(device)?;
    let tok = Tokenizer::byte();
    let policy = Policy::new_random(&policy::ModelConfig::tiny(), 0, &device)?;
    let task = tasks::build_task("arith", &serde_json::Value::Null)?;
    // The stale worker's weights: the same model after half the warm start.
    let old = Policy::new_random(&policy::ModelConfig::tiny(), 0, &device)?;
    if warm > 0 {
        learner::warm_start_on_task(&old, &tok, task.as_ref(), warm / 2, 0)?;
        learner::warm_start_on_task(&policy, &tok, task.as_ref(), warm, 0)?;
    }
    let params = SamplingParams {
        temperature: T,
        top_p,
        ..SamplingParams::new(NEW_TOKENS, tok.eos_ids())
    };
    let setup = Setup { task, tok, params };
    let model = InferModel::new(
        &policy,
        match dtype {
            WorkerDtype::F32 => DType::F32,
            WorkerDtype::F16 => DType::F16,
            WorkerDtype::Bf16 => DType::BF16,
        },
    )?;
    let settings = CheckSettings {
        rule: setup.params.rule(),
        tolerance: DEFAULT_TOLERANCE.of(dtype),
        delta: DEFAULT_MARGIN.of(dtype),
        seed: SEED,
        check_draws: true,
    };
    let logprobs_only = CheckSettings {
        check_draws: false,
        ..settings
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    // Honest groups: the verdict at the configured margins; the spread at zero margins.
    let (mut verdicts, mut tokens, mut max_lp, mut max_excess_0, mut worst_excess) =
        ([0u64; 4], 0usize, 0f32, 0f64, 0f64);
    let (mut t_check, mut t_gen, mut t_lp) = (0f64, 0f64, 0f64);
    let mut forced = Forced::default();
    let margins = Margins::new(settings.tolerance, settings.delta);
    for seq in 0..groups {
        let t0 = Instant::now();
        let g = honest(&setup, &model, seq, &mut rng)?;
        t_gen += t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let r = check_group(&policy, &g, &settings, &ResponseTokens)?;
        t_check += t0.elapsed().as_secs_f64();
        tokens += r.draws_checked;
        max_lp = max_lp.max(r.logprobs.max_abs_diff);
        worst_excess = worst_excess.max(r.worst_draw.map_or(0.0, |w| w.excess));
        verdicts[match r.verdict(settings.tolerance) {
            SpotVerdict::Pass => 0,
            SpotVerdict::LogprobDrift => 1,
            SpotVerdict::NotDrawn => 2,
            SpotVerdict::MarginUnearned => 3,
        }] += 1;
        if seq < spread_groups {
            max_excess_0 = max_excess_0.max(cdf_spread(&policy, &model, &g, settings.rule)?);
            let t0 = Instant::now();
            check_group(&policy, &g, &logprobs_only, &ResponseTokens)?;
            t_lp += t0.elapsed().as_secs_f64();
        }
        if seq < forced_groups {
            force(&policy, &g, settings.rule, margins, &mut forced, &mut rng)?;
        }
    }
    // Stale samples: the old weights with the prescribed uniforms, log-probs of the new ones.
    let old_model = InferModel::new(&old, model.dtype())?;
    let (stale_tokens, stale_caught_tokens, stale_groups_caught) = stale(
        &setup,
        &policy,
        &old_model,
        &settings,
        groups,
        forced_groups,
        &mut rng,
    )?;
    let p_likely = forced.p_likely / forced.likely.forced.max(1) as f64;
    println!(
        "{}",
        serde_json::json!({
            "model": "tiny", "warm_start_steps": warm, "dtype": dtype.name(), "top_p": top_p,
            "device": policy::device::describe(&device).name,
            "temperature": T, "group_size": N, "new_tokens": NEW_TOKENS,
            "tolerance": settings.tolerance, "margin": settings.delta,
            "honest": {
                "groups": groups, "tokens": tokens, "pass": verdicts[0],
                "logprob_drift": verdicts[1], "not_drawn": verdicts[2],
                "margin_unearned": verdicts[3],
                "max_abs_logprob_diff": max_lp,
                "max_draw_excess_at_margins": worst_excess,
                "spread_groups": spread_groups.min(groups),
                "cdf_spread": max_excess_0,
            },
            "forced_per_token": {
                "likely": rate(forced.likely), "mean_p_likely": p_likely,
                "argmax": rate(forced.argmax), "uniform": rate(forced.uniform),
            },
            "stale_half_warm_start": {
                "groups": forced_groups, "groups_caught": stale_groups_caught,
                "tokens": stale_tokens, "tokens_caught": stale_caught_tokens,
                "token_rate": stale_caught_tokens as f64 / stale_tokens.max(1) as f64,
            },
            "check_ms_per_group": t_check * 1e3 / groups.max(1) as f64,
            "logprob_check_only_ms_per_group": t_lp * 1e3 / spread_groups.min(groups).max(1) as f64,
            "generate_ms_per_group": t_gen * 1e3 / groups.max(1) as f64,
        })
    );
    Ok(())
}

/// The command line (see the module docs).
struct Args {
    warm: usize,
    groups: u64,
    spread_groups: u64,
    forced_groups: u64,
    dtype: WorkerDtype,
    top_p: f32,
    device: policy::DeviceChoice,
}

fn parse_args() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut o = Args {
        warm: 60,
        groups: 10_000,
        spread_groups: 1000,
        forced_groups: 500,
        dtype: WorkerDtype::F32,
        top_p: 1.0,
        device: policy::DeviceChoice::Cpu,
    };
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--warm" => o.warm = val()?.parse()?,
            "--groups" => o.groups = val()?.parse()?,
            "--spread-groups" => o.spread_groups = val()?.parse()?,
            "--forced-groups" => o.forced_groups = val()?.parse()?,
            "--top-p" => o.top_p = val()?.parse()?,
            "--dtype" => o.dtype = WorkerDtype::parse(&val()?).context("--dtype f32|f16|bf16")?,
            "--device" => o.device = val()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(o)
}

/// Stale samples: `forced_groups` groups drawn by the old weights with the prescribed
/// uniforms, carrying the new weights' log-probs (honest-looking numbers, wrong draws).
/// Returns the tokens checked, the tokens caught as not drawn, and the groups caught.
fn stale(
    setup: &Setup,
    policy: &Policy,
    old_model: &InferModel,
    settings: &CheckSettings,
    groups: u64,
    forced_groups: u64,
    rng: &mut rand::rngs::StdRng,
) -> Result<(usize, usize, u64)> {
    let (mut stale_tokens, mut stale_caught_tokens, mut stale_groups_caught) =
        (0usize, 0usize, 0u64);
    for seq in 0..forced_groups {
        let mut g = honest(setup, old_model, groups + seq, rng)?;
        for s in &mut g.samples {
            s.sampler_logprobs =
                policy::response_logprobs(policy, &g.prompt_tokens, &s.response_tokens, T)?;
        }
        let r = check_group(policy, &g, settings, &ResponseTokens)?;
        stale_tokens += r.draws_checked;
        stale_caught_tokens += r.not_drawn;
        stale_groups_caught += u64::from(r.verdict(settings.tolerance) == SpotVerdict::NotDrawn);
    }
    Ok((stale_tokens, stale_caught_tokens, stale_groups_caught))
}
