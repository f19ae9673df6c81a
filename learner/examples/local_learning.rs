//! ECHO-2 Algorithm 1 in one process: the embedded default model learns the `arith` task.
//!
//! Rollout engine(s) on their own threads generate groups into a real `TrajectoryStore` (temp
//! dir) under the snapshot installed in a `PolicySlot`; the learner leases admissible groups
//! (`v_τ ≥ v − S`), trains when B groups (R = B·n trajectories) are in hand, acks them, prunes
//! stale groups, and installs its snapshot every κ steps. `--sequential` is ECHO's sequential
//! mode: install the current version, generate B groups under it, then train (no overlap).
//!
//! ```text
//! cargo run --release -p learner --example local_learning -- \
//!     [--steps 1000000] [--minutes 8] [--staleness 3] [--objective gepo|grpo|dr_grpo|gspo] \
//!     [--sequential] [--json] [--warm-steps 60] [--lr 1e-3] [--kl-beta 0.05] [--groups 4] \
//!     [--group-size 16] [--max-operand 9] [--temperature 1.2] [--max-new-tokens 6] \
//!     [--engines 1] [--kappa K] [--seed 0] [--eval-every 0]
//! ```
//!
//! The defaults (GEPO, S = 3, B = 4 groups × n = 16, T = 1.2 for sampling *and* the learner's
//! log-probs, lr 1e-3, KL β = 0.05 to the warm-started policy, `a+b=` with a, b ≤ 9, 8 minutes)
//! are the ones measured in docs/learner.md to make the reward rise clearly on two CPU cores.
//!
//! The optional warm-start (`--warm-steps`, 0 = off) is supervised next-token training on
//! reference answers (`policy::sft`): it teaches the answer *format* so that RL sees non-zero,
//! varied rewards (see docs/model.md and docs/learner.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use learner::{AdamWConfig, LossConfig, Objective, Trainer, TrainerConfig};
use policy::{embedded_default, GenerationPath, Policy, SamplingParams, Tokenizer};
use rand::SeedableRng;
use rollout::{PolicySlot, RolloutConfig, RolloutEngine, StepOutcome};
use storage::TrajectoryStore;
use tasks::Task;

#[derive(Debug, Clone)]
struct Args {
    steps: u64,
    minutes: f64,
    staleness: u64,
    kappa: Option<u64>,
    objective: Objective,
    sequential: bool,
    json: bool,
    warm_steps: usize,
    lr: f64,
    kl_beta: f64,
    groups: usize,
    group_size: usize,
    max_operand: u64,
    temperature: f32,
    max_new_tokens: usize,
    engines: usize,
    seed: u64,
    eval_every: u64,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        steps: 1_000_000,
        minutes: 8.0,
        staleness: 3,
        kappa: None,
        objective: Objective::Gepo,
        sequential: false,
        json: false,
        warm_steps: 60,
        lr: 1e-3,
        kl_beta: 0.05,
        groups: 4,
        group_size: 16,
        max_operand: 9,
        temperature: 1.2,
        max_new_tokens: 6,
        engines: 1,
        seed: 0,
        eval_every: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = val()?.parse()?,
            "--minutes" => a.minutes = val()?.parse()?,
            "--staleness" => a.staleness = val()?.parse()?,
            "--kappa" => a.kappa = Some(val()?.parse()?),
            "--objective" => a.objective = val()?.parse()?,
            "--sequential" => a.sequential = true,
            "--json" => a.json = true,
            "--warm-steps" => a.warm_steps = val()?.parse()?,
            "--lr" => a.lr = val()?.parse()?,
            "--kl-beta" => a.kl_beta = val()?.parse()?,
            "--groups" => a.groups = val()?.parse()?,
            "--group-size" => a.group_size = val()?.parse()?,
            "--max-operand" => a.max_operand = val()?.parse()?,
            "--temperature" => a.temperature = val()?.parse()?,
            "--max-new-tokens" => a.max_new_tokens = val()?.parse()?,
            "--engines" => a.engines = val()?.parse()?,
            "--seed" => a.seed = val()?.parse()?,
            "--eval-every" => a.eval_every = val()?.parse()?,
            "-h" | "--help" => {
                println!("see the module docs of learner/examples/local_learning.rs");
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if a.engines == 0 {
        bail!("--engines must be >= 1");
    }
    Ok(a)
}

/// Greedy exact-match rate and mean sampled reward (4 samples) over a fixed prompt set.
fn evaluate(policy: &Policy, task: &dyn Task, tok: &Tokenizer, a: &Args) -> Result<(f64, f64)> {
    let n = task.metadata().num_prompts.unwrap_or(1000);
    let k = n.min(100);
    let mut greedy = SamplingParams::new(a.max_new_tokens, tok.eos_ids());
    greedy.temperature = 0.0;
    let mut sampled = SamplingParams::new(a.max_new_tokens, tok.eos_ids());
    sampled.temperature = a.temperature;
    let mut rng = rand::rngs::StdRng::seed_from_u64(12345);
    let (mut exact, mut mean) = (0.0, 0.0);
    for i in 0..k {
        let p = task.prompt(i * 7919 % n)?;
        let ids = tok.encode_prompt(&p.text)?;
        let g = policy::generate(policy, &ids, 1, &greedy, GenerationPath::Batched, &mut rng)?;
        exact += f64::from(task.reward(&p, &tok.decode(&g[0].tokens)?).value == 1.0);
        for c in policy::generate(policy, &ids, 4, &sampled, GenerationPath::Batched, &mut rng)? {
            mean += f64::from(task.reward(&p, &tok.decode(&c.tokens)?).value) / 4.0;
        }
    }
    Ok((exact / k as f64, mean / k as f64))
}

fn main() -> Result<()> {
    let a = parse_args()?;
    let say = |s: String| {
        if !a.json {
            println!("{s}");
        }
    };
    let t_start = Instant::now();
    let (policy, tok) = embedded_default(a.seed)?;
    let task = tasks::build_task(
        "arith",
        &serde_json::json!({"max_operand": a.max_operand, "ops": "+"}),
    )?;

    // 1. Optional supervised warm-start (format only; documented deviation from pure RL).
    let warm = warm_start(&policy, &tok, task.as_ref(), &a)?;
    let before = evaluate(&policy, task.as_ref(), &tok, &a)?;
    say(format!(
        "eval before RL: greedy exact {:.3}, sampled mean reward {:.3}",
        before.0, before.1
    ));

    // 2. Learner, store, rollout engine(s).
    let cfg = trainer_config(&a);
    let kappa = cfg.kappa();
    let mut trainer = Trainer::new(policy, cfg)?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(TrajectoryStore::open(dir.path())?);
    let slot = PolicySlot::new(
        trainer.policy().config().clone(),
        trainer.policy().device().clone(),
    );
    slot.install_bytes(trainer.version(), &trainer.snapshot_bytes()?)?;
    let mut engines = Engines::start(&a, &task, &tok, &store, &slot)?;
    say(format!(
        "mode {}, objective {:?}, S = {}, kappa = {kappa}, B = {} groups x n = {} (R = {}), lr {}, T {}",
        mode(&a),
        a.objective,
        a.staleness,
        a.groups,
        a.group_size,
        a.groups * a.group_size,
        a.lr,
        a.temperature
    ));

    // 3. Algorithm 1.
    let pipeline =
        learner::Pipeline::new(learner::pipeline::limits_of(trainer.policy().config(), 0));
    let budget = Duration::from_secs_f64(a.minutes * 60.0);
    let t_rl = Instant::now();
    let mut totals = Totals::default();
    while totals.steps < a.steps && t_rl.elapsed() < budget {
        // Gather B admissible groups (the idle time / bubble of the learner).
        let t_wait = Instant::now();
        let (hand, leases) = engines.gather(&a, &store, trainer.lease_floor())?;
        let idle = t_wait.elapsed().as_secs_f64();
        // Through the verification pipeline's structure stage, as a node's learner does.
        let hand: Vec<_> = hand
            .into_iter()
            .map(|g| pipeline.verify(&g.producer.clone(), 0, g))
            .collect::<Result<_, _>>()?;
        let st = trainer.train_step(&hand)?;
        for id in leases {
            store.ack(id)?;
        }
        if st.stepped && (a.sequential || trainer.should_publish()) {
            slot.install_bytes(trainer.version(), &trainer.snapshot_bytes()?)?;
        }
        totals.pruned += store.prune_below(trainer.lease_floor())?;
        if !totals.record(&st, idle) {
            continue; // every group in hand was dropped (e.g. all zero-advantage): gather again
        }
        let steps = totals.steps;
        let eval = if a.eval_every > 0 && steps % a.eval_every == 0 {
            Some(evaluate(trainer.policy(), task.as_ref(), &tok, &a)?)
        } else {
            None
        };
        print_step(&a, steps, t_rl.elapsed().as_secs_f64(), idle, &st, eval);
    }
    engines.stop()?;
    let rl_secs = t_rl.elapsed().as_secs_f64();
    let after = evaluate(trainer.policy(), task.as_ref(), &tok, &a)?;
    let invariant = store.check_invariant()?.holds();
    let run = Run {
        kappa,
        warm,
        version: trainer.version(),
        rl_secs,
        total_secs: t_start.elapsed().as_secs_f64(),
        before,
        after,
        invariant,
    };
    print_summary(&a, &totals, &run);
    Ok(())
}

fn mode(a: &Args) -> &'static str {
    if a.sequential {
        "sequential"
    } else {
        "async"
    }
}

/// The supervised warm-start (`--warm-steps`, 0 = off), as a JSON record for the summary.
fn warm_start(
    policy: &Policy,
    tok: &Tokenizer,
    task: &dyn Task,
    a: &Args,
) -> Result<serde_json::Value> {
    if a.warm_steps == 0 {
        return Ok(serde_json::Value::Null);
    }
    let t0 = Instant::now();
    let w = learner::warm_start_on_task(policy, tok, task, a.warm_steps, a.seed)?;
    let secs = t0.elapsed().as_secs_f64();
    if !a.json {
        println!(
            "warm-start: {} steps x {} examples, lr {}, {secs:.1}s, loss {:.3} -> {:.3}",
            w.steps, w.batch_size, w.lr, w.loss_first, w.loss_last
        );
    }
    Ok(
        serde_json::json!({"steps": w.steps, "batch_size": w.batch_size, "lr": w.lr,
        "seconds": secs, "loss_first": w.loss_first, "loss_last": w.loss_last}),
    )
}

fn trainer_config(a: &Args) -> TrainerConfig {
    TrainerConfig {
        loss: LossConfig {
            objective: a.objective,
            kl_beta: a.kl_beta,
            ..LossConfig::default()
        },
        optim: AdamWConfig {
            lr: a.lr,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            ..AdamWConfig::default()
        },
        temperature: a.temperature,
        staleness: a.staleness,
        kappa: a.kappa,
        groups_per_step: a.groups,
        group_size: a.group_size,
        micro_batch_tokens: TrainerConfig::default().micro_batch_tokens,
        ..TrainerConfig::default()
    }
}

/// The rollout side: engines on their own threads (async), or one stepped inline before each
/// training step (`--sequential`: ECHO's sequential mode, no overlap).
struct Engines {
    running: Vec<rollout::RunningEngine>,
    inline: Option<RolloutEngine>,
}

type Leased = (Vec<storage::TrajectoryGroup>, Vec<u64>);

impl Engines {
    fn start(
        a: &Args,
        task: &Arc<dyn Task>,
        tok: &Tokenizer,
        store: &Arc<TrajectoryStore>,
        slot: &PolicySlot,
    ) -> Result<Self> {
        let mut sampling = SamplingParams::new(a.max_new_tokens, tok.eos_ids());
        sampling.temperature = a.temperature;
        let engine = |i: usize| {
            let cfg = RolloutConfig {
                group_size: a.group_size,
                sampling: sampling.clone(),
                // Producers run at most a few batches ahead of the learner.
                max_pending_groups: (2 * a.groups) as u64,
                seed: a.seed * 1000 + i as u64,
                producer: format!("local-{i}"),
                idle_poll: Duration::from_millis(2),
                ..RolloutConfig::default()
            };
            RolloutEngine::new(cfg, task.clone(), tok.clone(), store.clone(), slot.clone())
        };
        if a.sequential {
            return Ok(Engines {
                running: Vec::new(),
                inline: Some(engine(0)?),
            });
        }
        let running = (0..a.engines)
            .map(|i| Ok(engine(i)?.spawn()?))
            .collect::<Result<_>>()?;
        Ok(Engines {
            running,
            inline: None,
        })
    }

    /// B admissible groups leased from the store (sequential: generated first, under the
    /// version installed now), and their lease ids.
    fn gather(&mut self, a: &Args, store: &TrajectoryStore, floor: u64) -> Result<Leased> {
        if let Some(engine) = self.inline.as_mut() {
            let mut made = 0;
            while made < a.groups {
                if let StepOutcome::Produced { .. } = engine.step()? {
                    made += 1;
                }
            }
        }
        let (mut hand, mut leases) = (Vec::new(), Vec::new());
        while hand.len() < a.groups {
            match store.lease(floor, a.groups - hand.len(), Duration::from_secs(60))? {
                Some(l) => {
                    leases.push(l.id);
                    hand.extend(l.groups.into_iter().map(|(_, g)| g));
                }
                None => {
                    if self.running.iter().any(|r| r.is_finished()) {
                        bail!("a rollout engine stopped");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        Ok((hand, leases))
    }

    fn stop(self) -> Result<()> {
        for r in self.running {
            r.stop()?;
        }
        Ok(())
    }
}

/// What the run accumulates over its steps.
#[derive(Default)]
struct Totals {
    steps: u64,
    idle: f64,
    train: f64,
    delta_hist: BTreeMap<u64, u64>,
    delta_max: u64,
    dropped_stale: usize,
    dropped_zero: usize,
    pruned: u64,
    rewards: Vec<f64>,
    ivars: Vec<f64>,
}

impl Totals {
    /// Adds one training step's statistics; false when it did not step (every group in hand
    /// was dropped), which counts only the drops and the idle time.
    fn record(&mut self, st: &learner::StepStats, idle: f64) -> bool {
        self.idle += idle;
        self.dropped_stale += st.groups_stale;
        self.dropped_zero += st.groups_zero_advantage;
        if !st.stepped {
            return false;
        }
        self.steps += 1;
        self.train += st.t_train_s;
        for (d, c) in &st.staleness_histogram {
            *self.delta_hist.entry(*d).or_default() += c;
        }
        self.delta_max = self.delta_max.max(st.staleness_max);
        self.rewards.push(st.reward_mean);
        self.ivars.push(st.importance_weight_variance);
        true
    }

    fn bubble(&self) -> f64 {
        self.idle / (self.idle + self.train)
    }
}

fn print_step(
    a: &Args,
    steps: u64,
    t: f64,
    idle: f64,
    st: &learner::StepStats,
    eval: Option<(f64, f64)>,
) {
    if a.json {
        println!(
            "{}",
            serde_json::json!({"step": steps, "t": t, "idle_s": idle,
                "bubble": idle / (idle + st.t_train_s), "stats": st, "eval": eval})
        );
        return;
    }
    println!(
        "step {steps:4} v {:4} t {t:6.1}s reward {:.3} (sd {:.3}) loss {:+.4} idle {:.2}s train {:.2}s Δmax {} used {} zero-adv {} stale {} kl {:+.4} ivar {:.2e} |g| {:.3}{}",
        st.version,
        st.reward_mean,
        st.reward_std,
        st.loss,
        idle,
        st.t_train_s,
        st.staleness_max,
        st.groups_used,
        st.groups_zero_advantage,
        st.groups_stale,
        st.kl_sampler_learner,
        st.importance_weight_variance,
        st.grad_norm,
        eval.map(|(e, r)| format!(" | eval exact {e:.3} reward {r:.3}")).unwrap_or_default()
    );
}

/// The run's outcome beside the per-step totals.
struct Run {
    kappa: u64,
    warm: serde_json::Value,
    version: u64,
    rl_secs: f64,
    total_secs: f64,
    /// (greedy exact, sampled reward) before and after RL.
    before: (f64, f64),
    after: (f64, f64),
    invariant: bool,
}

fn print_summary(a: &Args, t: &Totals, r: &Run) {
    let avg = |xs: &[f64]| {
        if xs.is_empty() {
            f64::NAN
        } else {
            xs.iter().sum::<f64>() / xs.len() as f64
        }
    };
    let w = (t.rewards.len() / 5).max(1);
    let first = avg(&t.rewards[..w.min(t.rewards.len())]);
    let last = avg(&t.rewards[t.rewards.len().saturating_sub(w)..]);
    let (steps, rl_secs) = (t.steps, r.rl_secs);
    let ((exact0, reward0), (exact1, reward1)) = (r.before, r.after);
    let summary = serde_json::json!({
        "mode": mode(a),
        "objective": format!("{:?}", a.objective), "staleness": a.staleness, "kappa": r.kappa,
        "groups": a.groups, "group_size": a.group_size, "lr": a.lr, "kl_beta": a.kl_beta, "temperature": a.temperature,
        "max_operand": a.max_operand, "warm_start": r.warm,
        "steps": steps, "version": r.version, "rl_seconds": rl_secs,
        "total_seconds": r.total_secs,
        "steps_per_hour": steps as f64 * 3600.0 / rl_secs,
        "train_seconds": t.train, "idle_seconds": t.idle,
        "bubble_ratio": t.bubble(),
        "batch_reward_first_fifth": first, "batch_reward_last_fifth": last,
        "eval_before": {"greedy_exact": exact0, "sampled_reward": reward0},
        "eval_after": {"greedy_exact": exact1, "sampled_reward": reward1},
        "staleness_histogram": t.delta_hist, "staleness_max": t.delta_max,
        "importance_weight_variance_mean": avg(&t.ivars),
        "groups_dropped_stale": t.dropped_stale, "groups_dropped_zero_advantage": t.dropped_zero,
        "groups_pruned_in_store": t.pruned, "store_invariant_holds": r.invariant,
    });
    if !a.json {
        println!(
            "summary: {steps} steps in {rl_secs:.0}s ({:.0} steps/h), batch reward {first:.3} -> {last:.3} (first/last fifth), \
             eval sampled reward {reward0:.3} -> {reward1:.3}, greedy exact {exact0:.3} -> {exact1:.3}, bubble {:.2}, Δmax {}, \
             Δ histogram {:?}, mean ivar {:.2e}, dropped stale {} / zero-adv {}, pruned {}, invariant {}",
            steps as f64 * 3600.0 / rl_secs,
            t.bubble(),
            t.delta_max,
            t.delta_hist,
            avg(&t.ivars),
            t.dropped_stale,
            t.dropped_zero,
            t.pruned,
            r.invariant
        );
    }
    println!("{summary}");
}
