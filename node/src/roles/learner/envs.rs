//! What the learner does for multi-turn environments beyond training: the supervised warm
//! start on scripted play (the environment's reference actions teach the action format), and
//! the exact evaluation of every published version for games that have an exact evaluator
//! (Kuhn poker) — written to `<data_dir>/metrics/eval.jsonl`, drawn by the admin page, and
//! summarised by `echo-node demo`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use policy::chat::Chat;
use policy::{Policy, Tokenizer};
use rollout::eval::ExactEval;
use tasks::env::Environment;

use crate::api::EvalPoint;
use crate::config::NodeConfig;

/// Episodes of scripted play the warm start draws its examples from.
const WARM_EPISODES: u64 = 2048;

/// Supervised warm start of `policy` on scripted play of the configured multi-turn
/// environment: every decision of [`WARM_EPISODES`] episodes (reference actions drawn with
/// the model seed) is one example, at [`rollout::episode::SCRIPTED_WARM_LR`].
pub fn warm_start(
    config: &NodeConfig,
    policy: &Policy,
    tokenizer: &Tokenizer,
    env: &dyn Environment,
) -> anyhow::Result<learner::WarmReport> {
    use rand::SeedableRng;
    let chat = super::super::build_chat(config, tokenizer.clone(), env)?;
    let spec = rollout::episode::Spec {
        env,
        chat: &chat,
        budget: config.task.budget(env)?,
        context: policy.config().max_position_embeddings,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.model.seed);
    let examples = rollout::episode::scripted_examples(spec, 0..WARM_EPISODES, &mut rng)
        .context("scripted play for the warm start")?;
    anyhow::ensure!(
        !examples.is_empty(),
        "environment `{}` has no reference actions (set learner.warm_start_steps = 0)",
        env.name()
    );
    let cfg = policy::sft::WarmStart {
        steps: config.learner.warm_start_steps,
        seed: config.model.seed,
        lr: rollout::episode::SCRIPTED_WARM_LR,
        ..policy::sft::WarmStart::default()
    };
    let losses = policy::sft::warm_start(policy, &examples, &cfg)?;
    Ok(learner::WarmReport {
        steps: cfg.steps,
        batch_size: cfg.batch_size,
        lr: cfg.lr,
        examples: examples.len(),
        loss_first: losses.first().copied().unwrap_or(f32::NAN),
        loss_last: losses.last().copied().unwrap_or(f32::NAN),
    })
}

/// Seeds × episodes per seed of the sampled check beside an exact figure that has more
/// illegal mass than `rollout::eval::ILLEGAL_MASS_CHECK` (128 Kuhn hands, one prefill per
/// seed: a standard error of about 0.1 chip).
const CHECK_SEEDS: u64 = 16;
const CHECK_GROUP: usize = 8;

/// The exact evaluator of the configured environment, if it has one.
pub struct Evaluator {
    env: Arc<dyn Environment>,
    chat: Chat,
    temperature: f32,
    budget: tasks::env::Budget,
    log: PathBuf,
}

impl Evaluator {
    /// `None` when the environment has no exact evaluator. `temperature` is the log-prob
    /// temperature the workers sample with.
    pub fn for_learner(config: &NodeConfig, temperature: f32) -> anyhow::Result<Option<Self>> {
        let env = super::super::build_env(config)?;
        if env.exact().is_none() {
            return Ok(None);
        }
        let tokenizer = super::verify::learner_tokenizer(config)?;
        let chat = super::super::build_chat(config, tokenizer, env.as_ref())?;
        Ok(Some(Evaluator {
            budget: config.task.budget(env.as_ref())?,
            env,
            chat,
            temperature,
            log: eval_log(&config.data_dir),
        }))
    }

    /// The opponent the figures are against.
    pub fn opponent(&self) -> String {
        self.env.exact().map(|g| g.opponent()).unwrap_or_default()
    }

    /// Evaluates `policy` as `version` and appends the result to `eval.jsonl`; a failure is
    /// logged, never fatal.
    pub fn evaluate(&self, policy: &Policy, version: u64) -> Option<EvalPoint> {
        let r = policy::InferModel::from_policy(policy)
            .map_err(rollout::episode::EpisodeError::from)
            .and_then(|infer| {
                let mut params = policy::SamplingParams::new(
                    self.budget.max_turn_tokens,
                    self.chat.stop_tokens(),
                );
                params.temperature = self.temperature;
                let check = rollout::eval::SampledCheck {
                    model: policy::session::Model::Infer(&infer),
                    budget: self.budget,
                    context: policy.config().max_position_embeddings,
                    params: &params,
                    seeds: CHECK_SEEDS,
                    group: CHECK_GROUP,
                    seed: version,
                };
                rollout::eval::exact_checked(
                    policy,
                    &self.chat,
                    self.env.as_ref(),
                    self.temperature,
                    Some(check),
                )
            });
        let e: ExactEval = match r {
            Ok(Some(e)) => e,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, version, "exact evaluation failed");
                return None;
            }
        };
        let point = EvalPoint {
            version,
            ev: e.report.ev,
            best_response: e.report.best_response,
            exploitability: e.report.exploitability,
            illegal_mass: e.illegal_mass,
            sampled_ev: e.sampled.map(|s| s.mean_return),
            sampled_stderr: e.sampled.map(|s| s.stderr),
        };
        tracing::info!(version, ev = point.ev, best_response = point.best_response,
            exploitability = point.exploitability, illegal_mass = point.illegal_mass,
            sampled_ev = ?point.sampled_ev, opponent = %self.opponent(), "exact evaluation");
        if let Err(e) = append(&self.log, &point, &self.opponent()) {
            tracing::warn!(error = %e, "writing eval.jsonl");
        }
        Some(point)
    }
}

/// `<data_dir>/metrics/eval.jsonl`: one line per evaluated version.
pub fn eval_log(data_dir: &Path) -> PathBuf {
    data_dir.join("metrics").join("eval.jsonl")
}

fn append(path: &Path, p: &EvalPoint, opponent: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut line = serde_json::to_value(p).unwrap_or_default();
    line["opponent"] = opponent.into();
    writeln!(f, "{line}")
}
