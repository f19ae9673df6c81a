//! Test-only group attacks that need the model (`ECHO_NODE_MISBEHAVE`, see
//! [`crate::misbehave`]): a worker whose groups are consistent in every number the learner
//! can recompute — signed, on the assigned prompt, true rewards, log-probs equal to the
//! learner's — but whose tokens were not drawn the way the learner prescribes.
//!
//! - `forced_tokens`: every other sample's response is written, not sampled (the fixed
//!   [`FORCED_TEXT`] and a stop token), with its true log-probs under the installed policy
//!   (one teacher-forced forward, the spot check's own computation) and its true reward.
//! - `stale_version`: the worker samples with the first snapshot it installed, forever, with
//!   the very uniforms the learner prescribes, and reports log-probs recomputed under the
//!   version it claims (the installed one).
//!
//! Only the prescribed-sampling check of the learner's spot check (`learner::verdict`) can
//! tell. Owns: these two forgeries. Must not touch: the defences, or honest nodes (the rollout
//! role builds a [`Forger`] only for a process started with one of these attacks).

use std::sync::Arc;

use anyhow::Context;
use policy::{Draws, GenerationPath, SamplingParams, Tokenizer};
use rollout::{InstalledPolicy, PolicySlot};
use storage::TrajectoryGroup;
use tasks::Task;

use crate::misbehave::Attack;

/// What a `forced_tokens` worker writes instead of sampling.
pub const FORCED_TEXT: &str = "7777";

/// The model-aware forger of a misbehaving worker.
pub struct Forger {
    slot: PolicySlot,
    task: Arc<dyn Task>,
    tokenizer: Tokenizer,
    /// The assignment seed: `stale_version` samples with the prescribed uniforms.
    seed: [u8; 32],
    /// The worker's sampling parameters (stop tokens included).
    params: SamplingParams,
    /// The first snapshot this worker installed (`stale_version` samples with it).
    oldest: Option<Arc<InstalledPolicy>>,
}

impl Forger {
    pub fn new(
        slot: PolicySlot,
        task: Arc<dyn Task>,
        tokenizer: Tokenizer,
        seed: [u8; 32],
        params: SamplingParams,
    ) -> Self {
        Forger {
            slot,
            task,
            tokenizer,
            seed,
            params,
            oldest: None,
        }
    }

    /// Carries out `attack` on the finished group `g`. `Ok(false)` when it cannot this time
    /// (a newer snapshot installed since `g` was generated; `stale_version` before any older
    /// snapshot exists): the group stays honest.
    pub fn forge(&mut self, attack: Attack, g: &mut TrajectoryGroup) -> anyhow::Result<bool> {
        let Some(installed) = self.slot.current() else {
            return Ok(false);
        };
        let oldest = self.oldest.get_or_insert_with(|| installed.clone()).clone();
        if installed.version != g.version {
            return Ok(false);
        }
        let prompt = self.task.prompt_by_id(&g.prompt_id)?;
        match attack {
            Attack::ForcedTokens => {
                let mut tokens = self.tokenizer.encode(FORCED_TEXT)?;
                tokens.extend(self.params.stop_tokens.first());
                for s in g.samples.iter_mut().skip(1).step_by(2) {
                    self.rewrite(s, &installed, &g.prompt_tokens, &prompt, tokens.clone())?;
                }
            }
            Attack::StaleVersion => {
                if oldest.version == installed.version {
                    return Ok(false);
                }
                let draws = Draws::prescribed(&self.seed, &g.producer, g.seq, g.samples.len());
                let old = policy::generate_with(
                    &oldest.policy,
                    &g.prompt_tokens,
                    &self.params,
                    GenerationPath::Infer,
                    &draws,
                )
                .context("sampling with the old snapshot")?;
                for (s, c) in g.samples.iter_mut().zip(old) {
                    // Log-probs of the claimed version: what a check of log-probs alone sees.
                    self.rewrite(s, &installed, &g.prompt_tokens, &prompt, c.tokens)?;
                }
            }
            Attack::FalseDtype => {
                // Its own choice inside bf16's margin: the prescribed uniforms, moved.
                let draws = Draws::prescribed(&self.seed, &g.producer, g.seq, g.samples.len())
                    .nudged(
                        crate::misbehave::FALSE_DTYPE_POSITIONS,
                        crate::misbehave::FALSE_DTYPE_NUDGE,
                    );
                let chosen = policy::generate_with(
                    &installed.policy,
                    &g.prompt_tokens,
                    &self.params,
                    GenerationPath::Infer,
                    &draws,
                )
                .context("sampling with chosen uniforms")?;
                let mut changed = false;
                for (s, c) in g.samples.iter_mut().zip(chosen) {
                    changed |= s.response_tokens != c.tokens;
                    self.rewrite(s, &installed, &g.prompt_tokens, &prompt, c.tokens)?;
                }
                return Ok(changed);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Gives sample `s` the response `tokens`, with every number the learner recomputes made
    /// true for them: log-probs under the installed (claimed) version, text, reward, mask.
    fn rewrite(
        &self,
        s: &mut storage::Sample,
        installed: &InstalledPolicy,
        prompt_tokens: &[u32],
        prompt: &tasks::Prompt,
        tokens: Vec<u32>,
    ) -> anyhow::Result<()> {
        let t = self.params.logprob_temperature();
        s.sampler_logprobs =
            policy::response_logprobs(&installed.policy, prompt_tokens, &tokens, t)?;
        s.response_text = self.tokenizer.decode(&tokens)?;
        s.reward = self.task.reward(prompt, &s.response_text).value;
        s.loss_mask = vec![1; tokens.len()];
        s.response_tokens = tokens;
        Ok(())
    }
}
