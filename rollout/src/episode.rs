//! Episodes of multi-turn environments (ECHO-2 App. F): played by the model with its KV
//! cache carried across turns, replayed from their tokens by the learner, scripted for the
//! supervised warm start.
//!
//! One state machine, [`Driver`], decides where every turn ends, what the environment
//! answers, when a budget cuts the episode short and what the return is; playing and
//! replaying both drive it, so a worker and a learner that agree on (environment, chat
//! template, budget, context) agree on every token's role.
//!
//! **The trajectory** of an episode is its token sequence after the first prompt:
//! `a₁ o₁ a₂ o₂ … a_T`, where `a_t` are the tokens the model sampled in turn t (its stop
//! token included) and `o_t` the rendered next observation ([`policy::chat::Chat::next_user`]).
//! Its loss mask covers the `a_t` only (Eq. 18–19), its reward is the return Σ r_t (Eq. 20).
//!
//! **Turns and budgets.** A turn ends at the first stop token or after `limit` tokens, where
//! `limit = min(max_turn_tokens, tokens left in the episode)` and the episode's tokens are
//! bounded by `min(max_episode_tokens, context − prompt)`. A turn cut off by `max_turn_tokens`
//! is an illegal action (the empty text); an episode whose tokens, turns or next observation
//! would not fit ends there with [`tasks::env::Episode::truncate`]'s reward.
//!
//! **Actions.** A multi-turn action is strict ([`Chat::action_text`]); a one-step
//! environment (a single-turn task) gets the decoded completion, as the rollout engine's
//! single-turn path gives its task.

use policy::chat::{assistant_mask, Chat, Message, Role, Segment};
use policy::session::{Model, Session};
use policy::sft::SftExample;
use policy::{Draws, PolicyError, SamplingParams};
use tasks::env::{Budget, Environment, Episode, Step};
use tasks::{Prompt, TaskError};

/// Why an episode could not be played or replayed.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error(transparent)]
    Env(#[from] TaskError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The first prompt leaves no room for a single sampled token.
    #[error("the first prompt ({prompt} tokens) leaves no room in a context of {context}")]
    NoRoom { prompt: usize, context: usize },
}

/// Why a recorded episode does not replay: the worker's claim is not the environment's.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("the initial state cannot be rebuilt: {0}")]
    Start(EpisodeError),
    #[error("the prompt tokens are not the rendering of the initial state")]
    Prompt,
    #[error("turn {turn}: the recorded observation is not the environment's")]
    Observation { turn: u32 },
    #[error("the record ends inside turn {turn}")]
    Short { turn: u32 },
    #[error("{extra} tokens follow the end of the episode")]
    Trailing { extra: usize },
    #[error("reported return {reported}, replayed {replayed}")]
    Return { reported: f32, replayed: f32 },
    #[error("replay failed: {0}")]
    Other(EpisodeError),
}

impl ReplayError {
    /// The environment itself failed while replaying (an external program crashed, hung or
    /// answered garbage): not a verdict on the record, and nothing its producer controls.
    pub fn env_failed(&self) -> bool {
        matches!(
            self,
            ReplayError::Start(EpisodeError::Env(TaskError::External { .. }))
                | ReplayError::Other(EpisodeError::Env(TaskError::External { .. }))
        )
    }
}

/// What fixes an episode besides its seed and actions.
#[derive(Clone, Copy)]
pub struct Spec<'a> {
    pub env: &'a dyn Environment,
    pub chat: &'a Chat,
    pub budget: Budget,
    /// The model's context length.
    pub context: usize,
}

/// A finished episode: the trajectory after the first prompt and what it earned.
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    pub tokens: Vec<u32>,
    pub segments: Vec<Segment>,
    /// The sampler's log-prob of each token (0 for observation tokens); empty in replay.
    pub logprobs: Vec<f32>,
    /// Σ r_t (Eq. 20), truncation included.
    pub ret: f32,
    pub turns: u32,
    /// Ended by a budget rather than by the environment.
    pub truncated: bool,
}

impl Played {
    /// The loss mask: 1 on the assistant's tokens (Eq. 19).
    pub fn mask(&self) -> Vec<u8> {
        assistant_mask(&self.segments)
    }
}

/// The episode state machine (see the module docs).
pub struct Driver<'a> {
    spec: Spec<'a>,
    episode: Box<dyn Episode>,
    messages: Vec<Message>,
    played: Played,
    /// Tokens the episode may hold after the prompt.
    room: usize,
    done: bool,
    multi_turn: bool,
}

impl<'a> Driver<'a> {
    /// Resets the environment to `seed`: the driver, the first observation and the rendered
    /// first prompt.
    pub fn start(spec: Spec<'a>, seed: u64) -> Result<(Self, Prompt, Vec<u32>), EpisodeError> {
        let start = spec.env.reset(seed)?;
        let system = spec.env.system_prompt();
        let prompt_tokens = spec.chat.open(system.as_deref(), &start.prompt.text)?;
        let room = spec
            .budget
            .max_episode_tokens
            .min(spec.context.saturating_sub(prompt_tokens.len()));
        if room == 0 {
            return Err(EpisodeError::NoRoom {
                prompt: prompt_tokens.len(),
                context: spec.context,
            });
        }
        let mut messages: Vec<Message> = system
            .into_iter()
            .map(|s| Message::new(Role::System, s))
            .collect();
        messages.push(Message::new(Role::User, start.prompt.text.clone()));
        let driver = Driver {
            spec,
            episode: start.episode,
            messages,
            played: Played {
                tokens: Vec::new(),
                segments: Vec::new(),
                logprobs: Vec::new(),
                ret: 0.0,
                turns: 0,
                truncated: false,
            },
            room,
            done: false,
            multi_turn: spec.env.metadata().is_multi_turn(),
        };
        Ok((driver, start.prompt, prompt_tokens))
    }

    /// The most tokens the next turn may sample; `None` once the episode is over.
    pub fn next_turn(&self) -> Option<usize> {
        (!self.done).then(|| {
            self.spec
                .budget
                .max_turn_tokens
                .min(self.room - self.played.tokens.len())
        })
    }

    /// The trajectory so far (after the first prompt).
    pub fn tokens(&self) -> &[u32] {
        &self.played.tokens
    }

    /// A legal action for scripted play.
    pub fn reference_action(
        &mut self,
        rng: &mut dyn rand::RngCore,
    ) -> Result<Option<String>, EpisodeError> {
        Ok(self.episode.try_reference_action(rng)?)
    }

    fn truncate(&mut self) -> Result<(), EpisodeError> {
        self.played.ret += self.episode.try_truncate()?;
        self.played.truncated = true;
        self.done = true;
        Ok(())
    }

    /// Records an assistant turn of `tokens` (at most [`Self::next_turn`] of them) and plays
    /// it; returns the observation tokens to feed next, or `None` when the episode ended.
    pub fn finish_turn(&mut self, tokens: &[u32]) -> Result<Option<Vec<u32>>, EpisodeError> {
        let chat = self.spec.chat;
        let stop = tokens
            .last()
            .copied()
            .filter(|t| chat.stop_tokens().contains(t));
        self.played.tokens.extend_from_slice(tokens);
        self.played.segments.push(Segment {
            assistant: true,
            len: tokens.len(),
        });
        self.played.turns += 1;
        if stop.is_none() && self.played.tokens.len() >= self.room {
            self.truncate()?;
            return Ok(None);
        }
        let content = match stop {
            Some(_) => &tokens[..tokens.len() - 1],
            None => tokens,
        };
        let said = chat.tokenizer().decode(content)?;
        // A one-step environment is a single-turn task: its reward reads the completion's
        // text as the rollout engine gives it (stop token excluded, cut-offs included).
        let action = if self.multi_turn {
            chat.action_text(tokens)?.unwrap_or_default()
        } else {
            said.clone()
        };
        self.messages.push(Message::new(Role::Assistant, said));
        match self.episode.try_step(&action)? {
            Step::Done { reward } => {
                self.played.ret += reward;
                self.done = true;
                Ok(None)
            }
            Step::Continue {
                observation,
                reward,
            } => {
                self.played.ret += reward;
                if self.played.turns >= self.spec.budget.max_turns {
                    self.truncate()?;
                    return Ok(None);
                }
                let obs = chat.next_user(&self.messages, stop, &observation)?;
                // Room for the observation and at least one more sampled token.
                if self.played.tokens.len() + obs.len() >= self.room {
                    self.truncate()?;
                    return Ok(None);
                }
                self.messages.push(Message::new(Role::User, observation));
                self.played.tokens.extend_from_slice(&obs);
                self.played.segments.push(Segment {
                    assistant: false,
                    len: obs.len(),
                });
                Ok(Some(obs))
            }
        }
    }

    /// The finished episode.
    pub fn finish(self) -> Played {
        self.played
    }
}

/// Plays one episode per row of `draws` from initial state `seed` with `model`, sampling with
/// `params` (its stop tokens must be the chat's) by the canonical rule: episode `k` draws its
/// `j`-th sampled token (counted across turns) with row `k`'s uniform at position `j`. The
/// prompt is encoded once and every episode continues from a copy of that cache. Returns the
/// first observation, the prompt tokens and the episodes.
pub fn play_group(
    spec: Spec<'_>,
    model: Model<'_>,
    seed: u64,
    params: &SamplingParams,
    draws: &Draws,
) -> Result<(Prompt, Vec<u32>, Vec<Played>), EpisodeError> {
    let n = draws.len();
    let (first, prompt, prompt_tokens) = Driver::start(spec, seed)?;
    let mut base = Session::new(model, prompt_tokens.len() + first.room)?;
    base.feed(&prompt_tokens)?;
    let mut first = Some(first);
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let mut d = match first.take() {
            Some(d) => d,
            None => Driver::start(spec, seed)?.0,
        };
        let mut session = base.fork()?;
        let mut logprobs = Vec::new();
        let mut drawn = 0u64;
        while let Some(limit) = d.next_turn() {
            let c = session.sample(limit, params, &draws.row_from(k, drawn))?;
            drawn += c.tokens.len() as u64;
            logprobs.extend_from_slice(&c.logprobs);
            match d.finish_turn(&c.tokens)? {
                Some(obs) => {
                    session.feed(&obs)?;
                    logprobs.extend(std::iter::repeat_n(0.0, obs.len()));
                }
                None => break,
            }
        }
        let mut played = d.finish();
        played.logprobs = logprobs;
        out.push(played);
    }
    Ok((prompt, prompt_tokens, out))
}

/// Replays a recorded episode from initial state `seed`: re-renders the prompt, splits the
/// recorded `response` into turns by the same rules, feeds the decoded actions to the
/// environment, checks that every recorded observation is the environment's own and that
/// the return is `reported`. The replayed episode carries the segments (the learner's own
/// loss mask).
pub fn replay(
    spec: Spec<'_>,
    seed: u64,
    prompt_tokens: &[u32],
    response: &[u32],
    reported: f32,
) -> Result<Played, ReplayError> {
    let (mut d, _, prompt) = Driver::start(spec, seed).map_err(ReplayError::Start)?;
    if prompt != prompt_tokens {
        return Err(ReplayError::Prompt);
    }
    let stops = spec.chat.stop_tokens();
    let mut pos = 0;
    while let Some(limit) = d.next_turn() {
        let turn = d.played.turns + 1;
        let rest = &response[pos..];
        let len = match rest.iter().take(limit).position(|t| stops.contains(t)) {
            Some(i) => i + 1,
            None if rest.len() >= limit => limit,
            None => return Err(ReplayError::Short { turn }),
        };
        pos += len;
        let obs = d.finish_turn(&rest[..len]).map_err(ReplayError::Other)?;
        if let Some(obs) = obs {
            if response.get(pos..pos + obs.len()) != Some(obs.as_slice()) {
                return Err(ReplayError::Observation { turn });
            }
            pos += obs.len();
        }
    }
    if pos != response.len() {
        return Err(ReplayError::Trailing {
            extra: response.len() - pos,
        });
    }
    let played = d.finish();
    // Returns are sums of the environment's own f32 rewards, in the same order on both
    // sides: any difference is a lie, not rounding.
    if !(reported.is_finite() && (played.ret - reported).abs() <= 1e-6) {
        return Err(ReplayError::Return {
            reported,
            replayed: played.ret,
        });
    }
    Ok(played)
}

/// AdamW rate of a warm start on [`scripted_examples`]. Higher than a single-turn task's
/// (3e-3): the model must learn which words answer which question (Kuhn poker's
/// `check`/`bet` vs `fold`/`call`), not only an answer format. On Kuhn poker with the embedded
/// model, 200 steps at 3e-3 still leave 12–25 % of the probability on words that are no action
/// at the decisions scripted play reaches; at 1e-2 they leave 2–3 % (docs/environments.md).
pub const SCRIPTED_WARM_LR: f64 = 1e-2;

/// Supervised examples of scripted play (the warm start of an environment): episodes from
/// the seeds `seeds`, each turn the environment's reference action (drawn with `rng`); every
/// decision is one example — the conversation so far as the prompt, the action's tokens as
/// the target.
pub fn scripted_examples(
    spec: Spec<'_>,
    seeds: impl IntoIterator<Item = u64>,
    rng: &mut impl rand::RngCore,
) -> Result<Vec<SftExample>, EpisodeError> {
    let mut out = Vec::new();
    for seed in seeds {
        match scripted_episode(spec, seed, rng) {
            Ok(examples) => out.extend(examples),
            // An external program that failed in this episode: the episode is abandoned
            // (logged by the environment), the others still teach.
            Err(EpisodeError::Env(TaskError::External { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn scripted_episode(
    spec: Spec<'_>,
    seed: u64,
    rng: &mut impl rand::RngCore,
) -> Result<Vec<SftExample>, EpisodeError> {
    let mut out = Vec::new();
    let (mut d, _, prompt) = Driver::start(spec, seed)?;
    while let Some(limit) = d.next_turn() {
        let Some(action) = d.reference_action(rng)? else {
            break;
        };
        let target = spec.chat.action_tokens(&action)?;
        if target.len() > limit {
            break;
        }
        let mut context = prompt.clone();
        context.extend_from_slice(d.tokens());
        out.push(SftExample {
            prompt: context,
            target: target.clone(),
        });
        if d.finish_turn(&target)?.is_none() {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "episode_tests.rs"]
mod tests;
