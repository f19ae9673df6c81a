//! Data-plane tasks: prompt sources with stable ids, verifiable reward functions, metadata.
//!
//! Owns: the [`Task`] trait, the built-in tasks ([`arith`], [`jsonl_math`],
//! [`knights_knaves`]), the registry ([`build_task`]) and the prompt assignment of rollout
//! workers ([`assign`]); the multi-turn [`env::Environment`] interface, the one adapter that
//! makes every task a one-step environment ([`env::TaskEnv`]), the built-in environments
//! ([`kuhn`] with its exact evaluator, [`holdem`]) and their registry ([`build_env`]); external
//! environments, programs speaking the environment protocol ([`external`]).
//! Must not touch: models, tokenizers, storage or networking — a task or an environment
//! sees text only (an external one runs as a child process without network).
//!
//! Adding a task is one self-contained file implementing [`Task`] plus one line in
//! [`REGISTRY`]; adding an environment, one file implementing [`env::Environment`] plus one
//! line in [`ENV_REGISTRY`]; see `docs/tasks.md` and `docs/environments.md`.

pub mod arith;
pub mod assign;
pub mod env;
pub mod external;
pub mod holdem;
pub mod jsonl_math;
pub mod knights_knaves;
pub mod kuhn;
pub mod util;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Errors of task construction and prompt lookup. Rewarding never fails: a bad completion
/// simply earns a low reward.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Unknown task name in a config.
    #[error("unknown task {0:?} (built in: {list})", list = REGISTRY.iter().map(|r| r.0).chain(ENV_REGISTRY.iter().map(|r| r.0)).collect::<Vec<_>>().join(", "))]
    UnknownTask(String),
    /// A task parameter is missing or invalid.
    #[error("task {task}: invalid parameter: {reason}")]
    InvalidParams {
        /// Task name.
        task: String,
        /// What is wrong.
        reason: String,
    },
    /// A prompt id or index does not exist in this task.
    #[error("task {task}: no prompt with id {id:?}")]
    UnknownPrompt {
        /// Task name.
        task: String,
        /// The requested id.
        id: String,
    },
    /// The task's data file could not be read.
    #[error("task {task}: cannot read {path}: {reason}")]
    Data {
        /// Task name.
        task: String,
        /// File path.
        path: String,
        /// What went wrong (with line number where it applies).
        reason: String,
    },
    /// An external environment failed (crashed, hung, answered garbage or out of range):
    /// the episode is abandoned and has no reward.
    #[error("environment {env}: {error}")]
    External {
        /// Environment name.
        env: String,
        /// What went wrong.
        error: external::ExternalError,
    },
    /// Prompt generation failed (should not happen for valid parameters).
    #[error("task {task}: {reason}")]
    Generation {
        /// Task name.
        task: String,
        /// What went wrong.
        reason: String,
    },
}

/// One prompt: a stable id, the text shown to the model, and the reference answer used by the
/// reward function (never shown to the model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// Stable id: the same task with the same parameters maps it to the same prompt forever.
    pub id: String,
    /// Text given to the model (before the model's prompt template).
    pub text: String,
    /// Reference answer.
    pub answer: String,
}

/// A reward with machine-readable details (what was extracted, why it scored so).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// The scalar reward, within [`TaskMetadata::reward_range`].
    pub value: f32,
    /// Details for logs and audits.
    pub details: serde_json::Value,
}

/// Metadata about a task, recorded with trajectories (Ω) and shown to operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMetadata {
    /// Registry name (the `task_id` of trajectory groups).
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Number of distinct prompts (`None` = effectively unbounded generator).
    pub num_prompts: Option<u64>,
    /// Smallest and largest possible reward.
    pub reward_range: (f32, f32),
    /// A sensible `max_new_tokens` for this task.
    pub suggested_max_new_tokens: usize,
    /// The parameters the task was built with (to rebuild it identically elsewhere).
    pub params: serde_json::Value,
}

/// A data-plane task: a prompt source plus a verifiable reward.
///
/// Implementations must be deterministic: `prompt(i)` and `reward(p, c)` depend only on the
/// task parameters and the arguments, so the learner can recompute any worker's reward.
pub trait Task: Send + Sync {
    /// Registry name.
    fn name(&self) -> &str;

    /// Metadata (includes the parameters).
    fn metadata(&self) -> TaskMetadata;

    /// The prompt with index `index` (`0..num_prompts`, or any u64 for generators).
    fn prompt(&self, index: u64) -> Result<Prompt, TaskError>;

    /// Rewards a completion (decoded text, stop token excluded). Never panics, whatever the
    /// input (empty, huge, U+FFFD from invalid UTF-8, several answers, injection attempts).
    fn reward(&self, prompt: &Prompt, completion: &str) -> Reward;

    /// A correct completion for `prompt` (for the supervised format warm-start and tests).
    fn reference_completion(&self, prompt: &Prompt) -> Option<String> {
        Some(prompt.answer.clone())
    }

    /// Looks a prompt up by its id. The default understands the decimal index ids that
    /// [`Task::prompt`] of the built-in tasks produce.
    fn prompt_by_id(&self, id: &str) -> Result<Prompt, TaskError> {
        let unknown = || TaskError::UnknownPrompt {
            task: self.name().to_string(),
            id: id.to_string(),
        };
        let index: u64 = id.parse().map_err(|_| unknown())?;
        let p = self.prompt(index)?;
        if p.id == id {
            Ok(p)
        } else {
            Err(unknown())
        }
    }

    /// Rewards raw completion bytes (invalid UTF-8 is replaced by U+FFFD first).
    fn reward_bytes(&self, prompt: &Prompt, completion: &[u8]) -> Reward {
        self.reward(prompt, &String::from_utf8_lossy(completion))
    }

    /// Draws a prompt index uniformly (over `num_prompts`, or all of u64 for generators).
    fn sample_index(&self, rng: &mut dyn rand::RngCore) -> u64 {
        use rand::Rng;
        match self.metadata().num_prompts {
            Some(0) => 0,
            Some(n) => rng.gen_range(0..n),
            None => rng.gen(),
        }
    }
}

/// Builds a task from its parameters (a JSON object; `null` = defaults).
pub type TaskBuilder = fn(&serde_json::Value) -> Result<Arc<dyn Task>, TaskError>;

/// Built-in tasks by name. Adding a task: a new module plus one line here.
pub const REGISTRY: &[(&str, TaskBuilder)] = &[
    ("arith", |p| Ok(Arc::new(arith::Arith::from_params(p)?))),
    ("jsonl-math", |p| {
        Ok(Arc::new(jsonl_math::JsonlMath::from_params(p)?))
    }),
    ("knights-knaves", |p| {
        Ok(Arc::new(knights_knaves::KnightsKnaves::from_params(p)?))
    }),
];

/// Builds the task `name` with `params`.
pub fn build_task(name: &str, params: &serde_json::Value) -> Result<Arc<dyn Task>, TaskError> {
    REGISTRY
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| b(params))
        .unwrap_or_else(|| Err(TaskError::UnknownTask(name.to_string())))
}

/// Builds an environment from its parameters (a JSON object; `null` = defaults).
pub type EnvBuilder = fn(&serde_json::Value) -> Result<Arc<dyn env::Environment>, TaskError>;

/// Built-in multi-turn environments by name. Adding one: a new module plus one line here.
pub const ENV_REGISTRY: &[(&str, EnvBuilder)] = &[
    ("kuhn-poker", |p| Ok(Arc::new(kuhn::Kuhn::from_params(p)?))),
    ("holdem", |p| Ok(Arc::new(holdem::Holdem::from_params(p)?))),
];

/// Builds the environment `name`: a multi-turn one from [`ENV_REGISTRY`], or a single-turn
/// task from [`REGISTRY`] as a one-step [`env::TaskEnv`].
pub fn build_env(
    name: &str,
    params: &serde_json::Value,
) -> Result<Arc<dyn env::Environment>, TaskError> {
    if let Some((_, b)) = ENV_REGISTRY.iter().find(|(n, _)| *n == name) {
        return b(params);
    }
    match build_task(name, params) {
        Ok(task) => Ok(Arc::new(env::TaskEnv::new(task))),
        Err(TaskError::UnknownTask(_)) => Err(TaskError::UnknownTask(name.to_string())),
        Err(e) => Err(e),
    }
}

/// Deserialises task parameters, with a clear error naming the task.
pub fn parse_params<T: serde::de::DeserializeOwned + Default>(
    task: &str,
    params: &serde_json::Value,
) -> Result<T, TaskError> {
    if params.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(params.clone()).map_err(|e| TaskError::InvalidParams {
        task: task.to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_builds_defaults_and_rejects_unknown() {
        assert!(build_task("arith", &serde_json::Value::Null).is_ok());
        assert!(build_task("knights-knaves", &serde_json::Value::Null).is_ok());
        // jsonl-math needs a path.
        assert!(build_task("jsonl-math", &serde_json::Value::Null).is_err());
        let e = build_task("nope", &serde_json::Value::Null).err().unwrap();
        assert!(e.to_string().contains("arith"));
        let e = build_task("arith", &serde_json::json!({"max_operand": "x"}))
            .err()
            .unwrap();
        assert!(e.to_string().contains("arith"), "{e}");
    }

    #[test]
    fn prompt_ids_are_stable_and_resolvable() {
        for name in ["arith", "knights-knaves"] {
            let t = build_task(name, &serde_json::Value::Null).unwrap();
            let last = t.metadata().num_prompts.map_or(u64::MAX, |n| n - 1);
            for i in [0u64, 1, 17, last] {
                let p = t.prompt(i).unwrap();
                assert_eq!(t.prompt(i).unwrap(), p);
                assert_eq!(t.prompt_by_id(&p.id).unwrap(), p);
                let r = t.reward(&p, &t.reference_completion(&p).unwrap());
                assert_eq!(r.value, t.metadata().reward_range.1, "{name} {i}: {r:?}");
            }
            assert!(t.prompt_by_id("not-an-id").is_err());
        }
    }
}
