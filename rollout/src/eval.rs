//! Evaluating a policy in an environment: **exactly**, for games with an exact evaluator
//! (Kuhn poker: the policy's probability of every action at every decision, read from its
//! log-probs without sampling), and **by sampling** episodes against the environment's
//! opponent (mean return ± standard error, ECHO-2 Table 7's chip change per hand). Also the
//! model seat of an environment's `model` opponent ([`ModelPlayer`]).

use std::sync::Arc;

use policy::chat::{Chat, Message, Role};
use policy::session::{Model, Session};
use policy::{DType, InferModel, Policy, SamplingParams};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tasks::env::{Environment, ExactReport};

use crate::episode::{play_group, EpisodeError, Spec};

/// The exact figures of a policy and what they are against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExactEval {
    #[serde(flatten)]
    pub report: ExactReport,
    /// Mean probability, over the decisions, of an output that is no legal action (it plays
    /// as the passive action).
    pub illegal_mass: f64,
    /// Above [`ILLEGAL_MASS_CHECK`] (and when asked, [`SampledCheck`]): the mean return of
    /// sampled episodes of the unshaped game ([`tasks::env::ExactGame::unshaped`]), which
    /// estimates the EV without the exact evaluator's assumption about illegal outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<Sampled>,
}

/// The illegal mass above which the exact EV does not stand alone: an illegal output's
/// conversation is not the canonical one the evaluator reads at the next decision (Kuhn
/// poker, `tasks::kuhn`, "Exact evaluation").
pub const ILLEGAL_MASS_CHECK: f64 = 0.05;

/// How to sample the check of [`exact_checked`]: `seeds` initial states × `group` episodes
/// each (one prefill per seed), with `params`, drawn from `seed`.
#[derive(Clone, Copy)]
pub struct SampledCheck<'a> {
    pub model: Model<'a>,
    pub budget: tasks::env::Budget,
    pub context: usize,
    pub params: &'a SamplingParams,
    pub seeds: u64,
    pub group: usize,
    pub seed: u64,
}

/// The rendered conversation before a decision: the system message and first observation,
/// then each earlier (action, observation) as the model reads them.
pub fn render_decision(
    chat: &Chat,
    system: Option<&str>,
    history: &[(String, String)],
    observation: &str,
) -> Result<Vec<u32>, EpisodeError> {
    let stop = chat.stop_tokens().first().copied();
    let first = history.first().map_or(observation, |(o, _)| o.as_str());
    let mut ids = chat.open(system, first)?;
    let mut messages: Vec<Message> = system
        .into_iter()
        .map(|s| Message::new(Role::System, s))
        .collect();
    messages.push(Message::new(Role::User, first));
    for (i, (_, action)) in history.iter().enumerate() {
        ids.extend(chat.action_tokens(action)?);
        messages.push(Message::new(Role::Assistant, action.clone()));
        let next = history.get(i + 1).map_or(observation, |(o, _)| o.as_str());
        ids.extend(chat.next_user(&messages, stop, next)?);
        messages.push(Message::new(Role::User, next));
    }
    Ok(ids)
}

/// The exact evaluation of `policy` in `env` (`None` when the environment has no exact
/// evaluator), at the log-prob temperature the policy samples with.
pub fn exact(
    policy: &Policy,
    chat: &Chat,
    env: &dyn Environment,
    temperature: f32,
) -> Result<Option<ExactEval>, EpisodeError> {
    exact_checked(policy, chat, env, temperature, None)
}

/// [`exact`], and when the illegal mass exceeds [`ILLEGAL_MASS_CHECK`] and `check` is given,
/// the sampled mean return of the unshaped game beside it ([`ExactEval::sampled`]).
pub fn exact_checked(
    policy: &Policy,
    chat: &Chat,
    env: &dyn Environment,
    temperature: f32,
    check: Option<SampledCheck<'_>>,
) -> Result<Option<ExactEval>, EpisodeError> {
    let Some(game) = env.exact() else {
        return Ok(None);
    };
    let probs = decision_probs(policy, chat, env, temperature)?;
    let illegal: f64 = probs
        .iter()
        .map(|p| (1.0 - p.iter().sum::<f64>()).max(0.0))
        .sum();
    let report = game.evaluate(&probs)?;
    let illegal_mass = illegal / probs.len().max(1) as f64;
    let sampled = match check {
        Some(c) if illegal_mass > ILLEGAL_MASS_CHECK => {
            let plain = game.unshaped();
            let spec = Spec {
                env: plain.as_ref(),
                chat,
                budget: c.budget,
                context: c.context,
            };
            Some(sampled_groups(
                spec,
                c.model,
                0..c.seeds,
                c.group,
                c.params,
                c.seed,
                &mut |_| {},
            )?)
        }
        _ => None,
    };
    Ok(Some(ExactEval {
        report,
        illegal_mass,
        sampled,
    }))
}

/// The policy's probability of every choice at every decision of `env`'s exact game (empty
/// without one): `exp Σ log p` of the choice's tokens and stop token after the rendered
/// conversation, from one batched forward over every (decision, choice).
pub fn decision_probs(
    policy: &Policy,
    chat: &Chat,
    env: &dyn Environment,
    temperature: f32,
) -> Result<Vec<Vec<f64>>, EpisodeError> {
    let Some(game) = env.exact() else {
        return Ok(Vec::new());
    };
    let system = env.system_prompt();
    let decisions = game.decisions();
    let mut prompts = Vec::with_capacity(decisions.len());
    let mut responses = Vec::new();
    for d in &decisions {
        prompts.push(render_decision(
            chat,
            system.as_deref(),
            &d.history,
            &d.observation,
        )?);
        responses.push(
            d.choices
                .iter()
                .map(|c| chat.action_tokens(c))
                .collect::<Result<Vec<_>, _>>()?,
        );
    }
    let pairs: Vec<(&[u32], &[u32])> = prompts
        .iter()
        .zip(&responses)
        .flat_map(|(p, rs)| rs.iter().map(move |r| (p.as_slice(), r.as_slice())))
        .collect();
    let (lp, _) = policy::batch_response_logprobs(policy, &pairs, temperature)?;
    let rows = lp
        .to_dtype(DType::F64)
        .and_then(|t| t.to_vec2::<f64>())
        .map_err(policy::PolicyError::from)?;
    let mut row = rows.iter().zip(&pairs);
    Ok(responses
        .iter()
        .map(|rs| {
            rs.iter()
                .filter_map(|_| row.next())
                .map(|(lps, (_, r))| lps[..r.len()].iter().sum::<f64>().exp())
                .collect()
        })
        .collect())
}

/// Sampled returns: mean and its standard error over `episodes` episodes, and how long the
/// episodes were.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    pub episodes: usize,
    pub mean_return: f64,
    pub stderr: f64,
    /// Mean agent turns per episode (decisions per hand in poker; a Hold'em walk is one
    /// turn whose answer changes nothing).
    pub turns_mean: f64,
    /// Episodes a budget or the model's context cut short (ended by `Episode::truncate`).
    pub truncated: usize,
}

/// Plays one episode from each seed in `seeds` (sampling with `params`, seeded by `seed0`)
/// and summarises the returns; `progress` is called after each episode.
pub fn sampled(
    spec: Spec<'_>,
    model: Model<'_>,
    seeds: std::ops::Range<u64>,
    params: &SamplingParams,
    seed0: u64,
    progress: &mut dyn FnMut(usize),
) -> Result<Sampled, EpisodeError> {
    sampled_groups(spec, model, seeds, 1, params, seed0, progress)
}

/// [`sampled`] with `group` episodes from each seed (sharing the prompt's prefill).
pub fn sampled_groups(
    spec: Spec<'_>,
    model: Model<'_>,
    seeds: std::ops::Range<u64>,
    group: usize,
    params: &SamplingParams,
    seed0: u64,
    progress: &mut dyn FnMut(usize),
) -> Result<Sampled, EpisodeError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed0);
    let mut returns = Vec::with_capacity(seeds.clone().count());
    let (mut turns, mut truncated) = (0u64, 0usize);
    for seed in seeds {
        let (_, _, eps) = play_group(
            spec,
            model,
            seed,
            params,
            &policy::Draws::from_rng(&mut rng, group.max(1)),
        )?;
        returns.extend(eps.iter().map(|e| f64::from(e.ret)));
        turns += eps.iter().map(|e| u64::from(e.turns)).sum::<u64>();
        truncated += eps.iter().filter(|e| e.truncated).count();
        progress(returns.len());
    }
    let n = returns.len();
    let mean = returns.iter().sum::<f64>() / n.max(1) as f64;
    let var = if n > 1 {
        returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Ok(Sampled {
        episodes: n,
        mean_return: mean,
        stderr: (var / n.max(1) as f64).sqrt(),
        turns_mean: turns as f64 / n.max(1) as f64,
        truncated,
    })
}

/// A model in an environment's opponent seat (Hold'em's `model` opponent, ECHO-2 Table 7's
/// "LLM opponent"): it renders its own conversation, samples one turn with a generator
/// seeded by the environment, and answers the strict action text (or nothing).
pub struct ModelPlayer {
    model: Arc<InferModel>,
    chat: Arc<Chat>,
    params: SamplingParams,
    max_turn_tokens: usize,
}

impl ModelPlayer {
    pub fn new(
        model: Arc<InferModel>,
        chat: Arc<Chat>,
        params: SamplingParams,
        max_turn_tokens: usize,
    ) -> Self {
        ModelPlayer {
            model,
            chat,
            params,
            max_turn_tokens,
        }
    }

    fn try_act(
        &self,
        system: &str,
        turns: &[(String, String)],
        observation: &str,
        seed: u64,
    ) -> Result<Option<String>, EpisodeError> {
        let prompt = render_decision(&self.chat, Some(system), turns, observation)?;
        let mut s = Session::new(
            Model::Infer(&self.model),
            prompt.len() + self.max_turn_tokens,
        )?;
        s.feed(&prompt)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let draws = policy::Draws::from_rng(&mut rng, 1);
        let c = s.sample(self.max_turn_tokens, &self.params, &draws)?;
        Ok(self.chat.action_text(&c.tokens)?)
    }
}

impl tasks::holdem::TextPolicy for ModelPlayer {
    fn act(
        &self,
        system: &str,
        turns: &[(String, String)],
        observation: &str,
        seed: u64,
    ) -> String {
        match self.try_act(system, turns, observation, seed) {
            Ok(a) => a.unwrap_or_default(),
            Err(e) => {
                tracing::debug!(error = %e, "the model opponent produced no action");
                String::new()
            }
        }
    }
}

#[cfg(test)]
#[path = "eval_tests.rs"]
mod tests;
