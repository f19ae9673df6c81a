//! Supervised warm start on a task's reference answers (documented deviation from pure RL,
//! see docs/learner.md): it teaches the tiny embedded model the answer *format* so that RL
//! sees non-zero, varied rewards from its first step. Used by the node's learner role and by
//! `examples/local_learning.rs`.

use policy::sft::{examples_from_text, warm_start, WarmStart};
use policy::{Policy, Tokenizer};
use tasks::Task;

use crate::{LearnerError, Result};

/// What [`warm_start_on_task`] did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WarmReport {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub examples: usize,
    pub loss_first: f32,
    pub loss_last: f32,
}

/// Trains `policy` in place for `steps` supervised steps on up to `max_examples` prompts of
/// `task` with their reference completions. A task without reference completions is an error.
pub fn warm_start_on_task(
    policy: &Policy,
    tokenizer: &Tokenizer,
    task: &dyn Task,
    steps: usize,
    seed: u64,
) -> Result<WarmReport> {
    const MAX_EXAMPLES: u64 = 4096;
    let n = task
        .metadata()
        .num_prompts
        .unwrap_or(MAX_EXAMPLES)
        .min(MAX_EXAMPLES);
    let mut pairs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let p = task
            .prompt(i)
            .map_err(|e| LearnerError::Invalid(format!("warm start: prompt {i}: {e}")))?;
        if let Some(reference) = task.reference_completion(&p) {
            pairs.push((p.text, reference));
        }
    }
    if pairs.is_empty() {
        return Err(LearnerError::Invalid(format!(
            "warm start: task `{}` has no reference completions (set warm_start_steps = 0)",
            task.name()
        )));
    }
    let examples = examples_from_text(tokenizer, pairs)?;
    let cfg = WarmStart {
        steps,
        seed,
        ..WarmStart::default()
    };
    let losses = warm_start(policy, &examples, &cfg)?;
    Ok(WarmReport {
        steps,
        batch_size: cfg.batch_size,
        lr: cfg.lr,
        examples: examples.len(),
        loss_first: losses.first().copied().unwrap_or(f32::NAN),
        loss_last: losses.last().copied().unwrap_or(f32::NAN),
    })
}
