//! Measures how the embedded default model does on the `arith` task after a supervised
//! warm-start of K steps (the numbers in `docs/model.md`), and the rollout engine's μ.
//!
//! Then runs a minimal on-policy GRPO loop (group-normalised advantages, token-mean
//! policy-gradient loss, AdamW) to show that RL improves the reward on two CPU cores. The real
//! learner lives in the `learner` crate; this is only a learnability probe.
//!
//! `cargo run --release -p rollout --example arith_warmstart -- [sft_steps] [eval_prompts] [rl_steps]`

use std::sync::Arc;
use std::time::Instant;

use policy::sft::{examples_from_text, warm_start, WarmStart};
use policy::{embedded_default, GenerationPath, Policy, SamplingParams, Tokenizer};
use rollout::{PolicySlot, RolloutConfig, RolloutEngine, StepOutcome};
use tasks::Task;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    let n_eval: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let rl_steps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (policy, tok) = embedded_default(0)?;
    let task = tasks::build_task("arith", &serde_json::Value::Null)?;
    let n = task.metadata().num_prompts.unwrap_or(1000);
    let prompts = (0..n)
        .map(|i| task.prompt(i))
        .collect::<Result<Vec<_>, _>>()?;
    let examples = examples_from_text(
        &tok,
        prompts.iter().map(|p| {
            (
                p.text.clone(),
                task.reference_completion(p).unwrap_or_default(),
            )
        }),
    )?;
    let eval = |policy: &Policy, label: &str| evaluate(policy, task.as_ref(), &tok, n_eval, label);
    eval(&policy, "random init")?;
    let t0 = Instant::now();
    let cfg = WarmStart {
        steps,
        ..WarmStart::default()
    };
    let losses = warm_start(&policy, &examples, &cfg)?;
    println!(
        "warm start: {steps} steps x {} examples in {:.1}s, loss {:.3} -> {:.3}",
        cfg.batch_size,
        t0.elapsed().as_secs_f64(),
        losses.first().copied().unwrap_or(f32::NAN),
        losses.last().copied().unwrap_or(f32::NAN)
    );
    eval(&policy, "after warm start")?;
    if rl_steps > 0 {
        reinforce(&policy, task.as_ref(), &tok, rl_steps)?;
        eval(&policy, "after RL")?;
    }
    engine_throughput(&policy, &task, &tok)
}

/// Greedy exact-match rate and mean sampled reward (8 samples) over `n_eval` prompts.
fn evaluate(
    policy: &Policy,
    task: &dyn Task,
    tok: &Tokenizer,
    n_eval: u64,
    label: &str,
) -> Res<()> {
    let n = task.metadata().num_prompts.unwrap_or(1000);
    let mut greedy = SamplingParams::new(8, tok.eos_ids());
    greedy.temperature = 0.0;
    let sampled = SamplingParams::new(8, tok.eos_ids());
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(9);
    let (mut exact, mut mean) = (0.0, 0.0);
    for k in 0..n_eval {
        let p = task.prompt(k * 7919 % n)?;
        let ids = tok.encode_prompt(&p.text)?;
        let g = policy::generate(policy, &ids, 1, &greedy, GenerationPath::Batched, &mut rng)?;
        exact += f64::from(task.reward(&p, &tok.decode(&g[0].tokens)?).value == 1.0);
        let s = policy::generate(policy, &ids, 8, &sampled, GenerationPath::Batched, &mut rng)?;
        for c in &s {
            mean += f64::from(task.reward(&p, &tok.decode(&c.tokens)?).value) / 8.0;
        }
    }
    println!(
        "{label}: greedy exact {:.3}, sampled mean reward {:.3} over {n_eval} prompts",
        exact / n_eval as f64,
        mean / n_eval as f64
    );
    Ok(())
}

/// `rl_steps` steps of minimal on-policy GRPO: 16 prompts × 8 samples, group-normalised
/// advantages, token-mean policy-gradient loss, AdamW at 1e-3.
fn reinforce(policy: &Policy, task: &dyn Task, tok: &Tokenizer, rl_steps: usize) -> Res<()> {
    use policy::candle_nn::{self, Optimizer};
    let mut opt = candle_nn::AdamW::new(
        policy.vars()?,
        candle_nn::ParamsAdamW {
            lr: 1e-3,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let params = SamplingParams::new(8, tok.eos_ids());
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let t0 = Instant::now();
    for step in 0..rl_steps {
        let mut prompts = Vec::new();
        let mut resps = Vec::new();
        let mut advs = Vec::new();
        let mut mean_r = 0.0;
        for _ in 0..16 {
            let p = task.prompt(task.sample_index(&mut rng))?;
            let ids = tok.encode_prompt(&p.text)?;
            let outs =
                policy::generate(policy, &ids, 8, &params, GenerationPath::Batched, &mut rng)?;
            let r: Vec<f32> = outs
                .iter()
                .map(|c| tok.decode(&c.tokens).map(|t| task.reward(&p, &t).value))
                .collect::<Result<_, _>>()?;
            let m = r.iter().sum::<f32>() / r.len() as f32;
            let sd = (r.iter().map(|x| (x - m).powi(2)).sum::<f32>() / r.len() as f32).sqrt();
            mean_r += m / 16.0;
            for (c, x) in outs.into_iter().zip(&r) {
                prompts.push(ids.clone());
                resps.push(c.tokens);
                advs.push((x - m) / (sd + 1e-4));
            }
        }
        let pairs: Vec<(&[u32], &[u32])> = prompts
            .iter()
            .zip(&resps)
            .map(|(a, b)| (a.as_slice(), b.as_slice()))
            .collect();
        let (lp, mask) = policy::batch_response_logprobs(policy, &pairs, 1.0)?;
        let adv = policy::Tensor::new(advs.as_slice(), policy.device())?.unsqueeze(1)?;
        let loss = ((lp.broadcast_mul(&adv)? * &mask)?.sum_all()? / mask.sum_all()?)?.neg()?;
        opt.backward_step(&loss)?;
        if step % 10 == 0 || step + 1 == rl_steps {
            println!(
                "rl step {step:4}  t={:6.1}s  mean reward {mean_r:.3}",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// The rollout engine's throughput on `policy` for 5 s (groups of 8, a temporary store).
fn engine_throughput(policy: &Policy, task: &Arc<dyn Task>, tok: &Tokenizer) -> Res<()> {
    let dir = std::env::temp_dir().join(format!("echo-arith-warmstart-{}", std::process::id()));
    let store = Arc::new(storage::TrajectoryStore::open(&dir)?);
    let slot = PolicySlot::new(policy.config().clone(), policy.device().clone());
    slot.install_bytes(1, &policy.to_safetensors_bytes()?)?;
    let mut engine = RolloutEngine::new(
        RolloutConfig {
            group_size: 8,
            ..RolloutConfig::default()
        },
        task.clone(),
        tok.clone(),
        store,
        slot,
    )?;
    let t0 = Instant::now();
    let mut groups = 0;
    while t0.elapsed().as_secs_f64() < 5.0 {
        if let StepOutcome::Produced { .. } = engine.step()? {
            groups += 1;
        }
    }
    let s = engine.stats().snapshot();
    println!(
        "rollout engine: {groups} groups of 8 in {:.1}s = {:.1} groups/s (EMA mu {:.1}), {} tokens, reward EMA {:.3}",
        t0.elapsed().as_secs_f64(),
        groups as f64 / t0.elapsed().as_secs_f64(),
        s.mu,
        s.tokens,
        s.reward_ema
    );
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
