//! Environments: the multi-turn data plane (ECHO-2 App. F, Eq. 14–22).
//!
//! An [`Environment`] is a deterministic interactive sandbox: [`Environment::reset`] with a
//! seed gives the first observation and an [`Episode`]; [`Episode::step`] takes the agent's
//! action text and answers with the next observation (or the end of the episode) and the
//! turn's reward r_t. Everything is a pure function of (parameters, seed, actions), so any
//! episode can be *replayed* from its actions: the learner recomputes the return
//! R = Σ_t r_t (Eq. 20) and checks every observation a worker recorded.
//!
//! The single-turn [`Task`]s are one-step environments through one adapter, [`TaskEnv`]:
//! `reset(index)` is the task's prompt `index`, the first action is the completion, and the
//! episode ends with the task's reward. Their code is not copied.
//!
//! Rules every environment follows (the [`Task`] rules carry over):
//! - **Deterministic.** Observations and rewards depend only on the parameters, the seed and
//!   the actions so far; randomness (a deal, an opponent's mixed strategy) is drawn from a
//!   generator derived from the seed ([`crate::util::item_rng`]), never from call order or a
//!   clock.
//! - **Total.** `step` never fails and never panics, whatever the action: empty, huge,
//!   invalid, injection-looking text is an *illegal action*, which each environment maps to
//!   a documented default (in poker: check or fold). Scans of action text are bounded.
//! - **Bounded.** [`EnvMetadata::max_turns`] bounds the agent's turns; the rollout side adds
//!   token budgets ([`Budget`]) and ends an episode that exceeds them with
//!   [`Episode::truncate`].
//! - **Rewards within range.** The return of every episode lies in
//!   [`EnvMetadata::return_range`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Prompt, Task, TaskError};

/// What an environment is, for configs, records (Ω) and operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvMetadata {
    /// Registry name (the `task_id` of trajectory groups).
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Distinct initial states (`None`: every `u64` seed is one).
    pub num_initial_states: Option<u64>,
    /// Most agent turns an episode can take (1 for a single-turn task).
    pub max_turns: u32,
    /// Smallest and largest possible episode return.
    pub return_range: (f32, f32),
    /// A sensible token budget for one agent turn.
    pub suggested_tokens_per_turn: usize,
    /// The most tokens one rendered observation takes (the next user message and the chat
    /// template's turn tokens), for the default episode budget; 64 unless the environment
    /// states it.
    #[serde(default = "default_observation_tokens")]
    pub max_observation_tokens: usize,
    /// The parameters the environment was built with (to rebuild it identically elsewhere).
    pub params: serde_json::Value,
}

fn default_observation_tokens() -> usize {
    EnvMetadata::DEFAULT_OBSERVATION_TOKENS
}

impl EnvMetadata {
    /// [`Self::max_observation_tokens`] of an environment that does not state it.
    pub const DEFAULT_OBSERVATION_TOKENS: usize = 64;

    /// True when an episode can take more than one turn.
    pub fn is_multi_turn(&self) -> bool {
        self.max_turns > 1
    }
}

/// The answer to one action.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The episode goes on with `observation` (the next user message); `reward` is r_t.
    Continue {
        /// What the agent sees next.
        observation: String,
        /// The turn's reward (e.g. the chip change of the turn).
        reward: f32,
    },
    /// The episode is over; `reward` is the last turn's r_t.
    Done {
        /// The turn's reward.
        reward: f32,
    },
}

impl Step {
    /// The turn's reward.
    pub fn reward(&self) -> f32 {
        match self {
            Step::Continue { reward, .. } | Step::Done { reward } => *reward,
        }
    }
}

/// One running episode. Not `Sync`: one thread plays it.
pub trait Episode: Send {
    /// Applies the agent's action. Total: an illegal action is the environment's default.
    fn step(&mut self, action: &str) -> Step;

    /// Ends an episode that a budget cut short (turns or tokens exhausted) and returns the
    /// reward of ending it so (e.g. a poker hand the agent folds). Default: 0.
    fn truncate(&mut self) -> f32 {
        0.0
    }

    /// A legal action in the current state for scripted play (the supervised warm start and
    /// tests), drawn with `rng`; `None` when the environment has no such notion.
    fn reference_action(&self, rng: &mut dyn rand::RngCore) -> Option<String>;

    /// [`Self::step`] for an environment that can fail (an external program that crashed,
    /// hung or answered garbage): `Err` abandons the episode — it has no reward. The engine
    /// and the replay call this one; built-in environments never fail.
    fn try_step(&mut self, action: &str) -> Result<Step, TaskError> {
        Ok(self.step(action))
    }

    /// [`Self::truncate`] for an environment that can fail.
    fn try_truncate(&mut self) -> Result<f32, TaskError> {
        Ok(self.truncate())
    }

    /// [`Self::reference_action`] for an environment that can fail.
    fn try_reference_action(
        &mut self,
        rng: &mut dyn rand::RngCore,
    ) -> Result<Option<String>, TaskError> {
        Ok(self.reference_action(rng))
    }
}

/// The start of an episode: its first observation (as a [`Prompt`]: a stable id, the text
/// the agent sees, and an answer that is never shown) and the running episode.
pub struct Start {
    /// The first observation; `id` is the seed in decimal (for a task, its prompt id).
    pub prompt: Prompt,
    /// The episode, ready for the first action.
    pub episode: Box<dyn Episode>,
}

impl std::fmt::Debug for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("prompt", &self.prompt)
            .finish()
    }
}

/// One decision of a game with an exact evaluator: the conversation that leads to it (the
/// observations and the agent's own earlier actions) and the actions the evaluator asks the
/// policy's probability of. Every other output of the policy is an illegal action, which the
/// game maps to its default (the mass `1 − Σ p` goes there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Earlier turns: (observation, the agent's action) in order.
    pub history: Vec<(String, String)>,
    /// The observation the agent answers now.
    pub observation: String,
    /// The explicit actions (their texts); the default action takes the remaining mass.
    pub choices: Vec<String>,
}

/// Exact figures of a policy in a game small enough to enumerate (Kuhn poker).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExactReport {
    /// Expected return per episode against the environment's opponent (seats averaged).
    pub ev: f64,
    /// The best any policy can get against that opponent.
    pub best_response: f64,
    /// How much a best-responding opponent wins against this policy per episode, seats
    /// averaged (0 at an equilibrium).
    pub exploitability: f64,
}

/// A game whose value for a policy can be computed exactly from the policy's action
/// probabilities at every decision (no sampling).
pub trait ExactGame: Send + Sync {
    /// Every decision the agent can face, in a fixed order.
    fn decisions(&self) -> Vec<Decision>;
    /// The exact figures of the policy with `probs[d][k]` = P(choice `k` at decision `d`).
    /// Probabilities are clamped to [0, 1] and a row summing past 1 is renormalised.
    fn evaluate(&self, probs: &[Vec<f64>]) -> Result<ExactReport, TaskError>;
    /// The opponent the figures are against (its registry name).
    fn opponent(&self) -> String;
    /// The same game without reward shaping: its sampled mean return estimates the exact
    /// EV, a check where the exact figures assume what the policy's illegal outputs lead to
    /// (`rollout::eval`, the sampled check).
    fn unshaped(&self) -> Arc<dyn Environment>;
}

/// An interactive environment (see the module docs for the rules).
pub trait Environment: Send + Sync {
    /// Registry name.
    fn name(&self) -> &str;

    /// Metadata (includes the parameters).
    fn metadata(&self) -> EnvMetadata;

    /// The system message: the rules of the game (Eq. 15's m^sys); `None` for none.
    fn system_prompt(&self) -> Option<String> {
        None
    }

    /// Starts the episode with initial state `seed` (`0..num_initial_states`, or any u64).
    fn reset(&self, seed: u64) -> Result<Start, TaskError>;

    /// The exact evaluator, for games that have one.
    fn exact(&self) -> Option<&dyn ExactGame> {
        None
    }

    /// The single-turn task behind a one-step environment ([`TaskEnv`]).
    fn as_task(&self) -> Option<&Arc<dyn Task>> {
        None
    }

    /// What learner and workers must agree on beyond the name and parameters (an external
    /// program's pin, [`crate::external::pin`]); `None` for built-in environments.
    fn pin(&self) -> Option<[u8; 32]> {
        None
    }

    /// The seed of the initial state with id `id` (the decimal seed); `None` when it is not
    /// one of this environment's.
    fn seed_of(&self, id: &str) -> Option<u64> {
        let seed: u64 = id.parse().ok()?;
        let ok = self.metadata().num_initial_states.is_none_or(|n| seed < n);
        (ok && seed.to_string() == id).then_some(seed)
    }
}

/// The one adapter from a single-turn [`Task`] to a one-step [`Environment`]: `reset(i)` is
/// prompt `i`, the first action is the completion, its reward ends the episode.
#[derive(Clone)]
pub struct TaskEnv {
    task: Arc<dyn Task>,
}

impl TaskEnv {
    /// Wraps `task`.
    pub fn new(task: Arc<dyn Task>) -> Self {
        TaskEnv { task }
    }
}

impl std::fmt::Debug for TaskEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TaskEnv").field(&self.task.name()).finish()
    }
}

struct TaskEpisode {
    task: Arc<dyn Task>,
    prompt: Prompt,
    done: bool,
}

impl Episode for TaskEpisode {
    fn step(&mut self, action: &str) -> Step {
        // A one-step episode: a second action (never sent by the rollout side) earns nothing.
        let reward = if self.done {
            self.task.metadata().reward_range.0
        } else {
            self.task.reward(&self.prompt, action).value
        };
        self.done = true;
        Step::Done { reward }
    }

    fn reference_action(&self, _: &mut dyn rand::RngCore) -> Option<String> {
        self.task.reference_completion(&self.prompt)
    }
}

impl Environment for TaskEnv {
    fn name(&self) -> &str {
        self.task.name()
    }

    fn metadata(&self) -> EnvMetadata {
        let m = self.task.metadata();
        EnvMetadata {
            name: m.name,
            description: m.description,
            num_initial_states: m.num_prompts,
            max_turns: 1,
            return_range: m.reward_range,
            suggested_tokens_per_turn: m.suggested_max_new_tokens,
            max_observation_tokens: default_observation_tokens(),
            params: m.params,
        }
    }

    fn reset(&self, seed: u64) -> Result<Start, TaskError> {
        let prompt = self.task.prompt(seed)?;
        Ok(Start {
            episode: Box::new(TaskEpisode {
                task: self.task.clone(),
                prompt: prompt.clone(),
                done: false,
            }),
            prompt,
        })
    }

    fn as_task(&self) -> Option<&Arc<dyn Task>> {
        Some(&self.task)
    }

    fn seed_of(&self, id: &str) -> Option<u64> {
        let p = self.task.prompt_by_id(id).ok()?;
        // Built-in tasks use decimal indices; look the index up through the id.
        id.parse().ok().filter(|_| p.id == id)
    }
}

/// Token budgets of an episode (the rollout side's bound on every episode; the learner's
/// replay applies the same numbers, so both agree on where a turn ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Most agent turns (the environment's `max_turns` or fewer).
    pub max_turns: u32,
    /// Most tokens the agent samples in one turn (a stop token included).
    pub max_turn_tokens: usize,
    /// Most tokens after the first prompt: the agent's and the observations' together.
    pub max_episode_tokens: usize,
}

impl Budget {
    /// The default budget of `meta`: all its turns, its suggested tokens per turn, and room
    /// for every turn plus its longest observation ([`EnvMetadata::max_observation_tokens`])
    /// per turn. The model's context bounds the episode too (`rollout::episode`).
    pub fn of(meta: &EnvMetadata) -> Self {
        let turn = meta.suggested_tokens_per_turn.max(1);
        Budget {
            max_turns: meta.max_turns.max(1),
            max_turn_tokens: turn,
            max_episode_tokens: (turn + meta.max_observation_tokens)
                .saturating_mul(meta.max_turns.max(1) as usize),
        }
    }

    /// This budget with the given overrides (`None` keeps the value); the turn count never
    /// exceeds the environment's.
    pub fn with(
        self,
        meta: &EnvMetadata,
        max_turns: Option<u32>,
        max_turn_tokens: Option<usize>,
        max_episode_tokens: Option<usize>,
    ) -> Result<Self, TaskError> {
        let b = Budget {
            max_turns: max_turns.unwrap_or(self.max_turns),
            max_turn_tokens: max_turn_tokens.unwrap_or(self.max_turn_tokens),
            max_episode_tokens: max_episode_tokens.unwrap_or(self.max_episode_tokens),
        };
        let bad = |reason: String| TaskError::InvalidParams {
            task: meta.name.clone(),
            reason,
        };
        if b.max_turns == 0 || b.max_turns > meta.max_turns.max(1) {
            return Err(bad(format!(
                "max_turns {} is outside 1..={}",
                b.max_turns, meta.max_turns
            )));
        }
        if b.max_turn_tokens == 0 || b.max_episode_tokens < b.max_turn_tokens {
            return Err(bad(format!(
                "token budgets need 0 < max_turn_tokens ({}) <= max_episode_tokens ({})",
                b.max_turn_tokens, b.max_episode_tokens
            )));
        }
        Ok(b)
    }
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
