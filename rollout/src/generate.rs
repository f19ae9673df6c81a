//! Generation of one group: the installed policy's inference model on the slot's device, the
//! group's deterministic seed and ids, and the two paths that fill it — single-turn samples of
//! a task's assigned prompt ([`RolloutEngine::single_turn`]) and whole episodes of a
//! multi-turn environment ([`RolloutEngine::episodes`]).
//!
//! Owns: [`RolloutEngine::produce_group`], [`RolloutEngine::produce_groups`] (several
//! groups decoded in one batch) and their helpers. Must not touch: the loop around it
//! (pausing, standby, storing: `RolloutEngine::step` in the crate root) or the slot.

use std::sync::Arc;

use policy::infer::batch::GroupRequest;
use policy::{Draws, GenerationPath, InferModel, InferSpec, Policy, SamplingParams};
use rand::{Rng, SeedableRng};
use storage::{Sample, TrajectoryGroup};
use tasks::Task;

use crate::{episode, InstalledPolicy, RolloutEngine, RolloutError};

/// One number's outcome in [`RolloutEngine::produce_groups`].
#[derive(Debug)]
pub enum Made {
    /// A group, signed, not stored yet.
    Group(Box<TrajectoryGroup>),
    /// No group: an episode of number `seq` (attempted under `version`) failed in the
    /// environment program ([`RolloutError::is_environment_failure`]).
    Abandoned {
        seq: u64,
        version: u64,
        error: RolloutError,
    },
}

/// What a group is made from before any token is drawn.
struct GroupPlan {
    seq: u64,
    index: u64,
    task: Option<Arc<dyn Task>>,
    params: SamplingParams,
    draws: Draws,
    created: u64,
}

impl RolloutEngine {
    fn id(&self, seq: u64, sample: u64) -> [u8; 16] {
        let mut h = blake3::Hasher::new();
        h.update(&self.nonce);
        h.update(&seq.to_le_bytes());
        h.update(&sample.to_le_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out
    }

    /// The inference-path model of `installed`, converted once per installed version on the
    /// slot's device ([`InferSpec::for_device`]: bf16 on CUDA, f32 on the CPU, unless
    /// `infer_dtype` says otherwise). Converted in host memory, then copied: the device never
    /// holds the f32 weights.
    fn infer_model(
        &mut self,
        installed: &InstalledPolicy,
    ) -> Result<Arc<InferModel>, RolloutError> {
        if let Some((version, model)) = &self.infer {
            if *version == installed.version {
                return Ok(model.clone());
            }
        }
        // Drop the previous version's copy before converting the new one (peak memory).
        self.infer = None;
        let mut spec = InferSpec::for_device(self.slot.device());
        if let Some(dtype) = self.cfg.infer_dtype {
            spec.dtype = dtype;
        }
        let model = Arc::new(InferModel::build(&installed.policy, &spec)?);
        self.infer = Some((installed.version, model.clone()));
        Ok(model)
    }

    /// `installed`'s f32 policy on the slot's device (the training-forward paths).
    fn device_policy(&mut self, installed: &InstalledPolicy) -> Result<Arc<Policy>, RolloutError> {
        let device = self.slot.device();
        if installed.policy.device().same_device(device) {
            return Ok(installed.policy.clone());
        }
        if let Some((version, p)) = &self.on_device {
            if *version == installed.version {
                return Ok(p.clone());
            }
        }
        self.on_device = None;
        let p = Arc::new(installed.policy.to_device(device)?);
        self.on_device = Some((installed.version, p.clone()));
        Ok(p)
    }

    /// Generates the next group under the currently installed version, signed (see
    /// [`Self::with_signer`]) but not stored. `None` when no snapshot is installed; an
    /// episode the environment program failed is an error (see [`Self::produce_groups`]).
    pub fn produce_group(&mut self) -> Result<Option<TrajectoryGroup>, RolloutError> {
        match self.produce_one()? {
            None => Ok(None),
            Some(Made::Group(g)) => Ok(Some(*g)),
            Some(Made::Abandoned { error, .. }) => Err(error),
        }
    }

    fn produce_one(&mut self) -> Result<Option<Made>, RolloutError> {
        let Some(installed) = self.slot.current() else {
            return Ok(None);
        };
        let plan = self.plan_group()?;
        let made = match plan.task.clone() {
            Some(task) => self.single_turn(
                &task,
                &installed,
                plan.index,
                &plan.params,
                &plan.draws,
                plan.seq,
            ),
            None => self.episodes(&installed, plan.index, &plan.params, &plan.draws, plan.seq),
        };
        match made {
            Ok((prompt, prompt_tokens, samples)) => Ok(Some(Made::Group(Box::new(
                self.finish_group(&plan, &installed, prompt, prompt_tokens, samples),
            )))),
            Err(error) if error.is_environment_failure() => Ok(Some(Made::Abandoned {
                seq: plan.seq,
                version: installed.version,
                error,
            })),
            Err(e) => Err(e),
        }
    }

    /// Generates `k` groups under the installed version, the samples of all of them decoded
    /// in one batch of at most `rollout.max_batch` sequences (`policy::infer::batch`:
    /// continuous batching, one prefill per prompt), each signed but not stored. A
    /// single-turn task on the inference path only; otherwise, or for `k = 1`, the groups are
    /// made one after another. Every group carries the version its tokens were drawn under
    /// (the one installed when this call began) and its own sequence number and draws, so it
    /// is the group [`Self::produce_group`] would have made, up to the numeric noise of the
    /// batch (`docs/gpu.md`, "Many groups in flight"). A number whose episode the environment
    /// program failed is [`Made::Abandoned`] (the caller commits it as such, so the next
    /// group takes the next number and initial state). Empty when no snapshot is installed.
    pub fn produce_groups(&mut self, k: usize) -> Result<Vec<Made>, RolloutError> {
        let Some(installed) = self.slot.current() else {
            return Ok(Vec::new());
        };
        let batched =
            k > 1 && self.cfg.path == GenerationPath::Infer && self.env.as_task().is_some();
        if !batched {
            let mut out = Vec::with_capacity(k);
            for _ in 0..k.max(1) {
                out.extend(self.produce_one()?);
            }
            return Ok(out);
        }
        let task = self.env.as_task().cloned().expect("a single-turn task");
        let plans = (0..k)
            .map(|_| self.plan_group())
            .collect::<Result<Vec<_>, _>>()?;
        let mut prompts = Vec::with_capacity(k);
        for plan in &plans {
            let prompt = task.prompt(plan.index)?;
            let tokens = self.chat.tokenizer().encode_prompt(&prompt.text)?;
            prompts.push((prompt, tokens));
        }
        let model = self.infer_model(&installed)?;
        let requests: Vec<GroupRequest<'_>> = plans
            .iter()
            .zip(&prompts)
            .map(|(plan, (_, tokens))| GroupRequest {
                prompt: tokens,
                draws: &plan.draws,
            })
            .collect();
        let max_batch = self.cfg.max_batch.max(self.cfg.group_size);
        let completions =
            policy::infer::batch::generate_groups(&model, &requests, &plans[0].params, max_batch)?;
        let mut out = Vec::with_capacity(k);
        for ((plan, (prompt, tokens)), done) in plans.iter().zip(prompts).zip(completions) {
            let samples = self.rewarded(&task, &prompt, plan.seq, done)?;
            out.push(Made::Group(Box::new(
                self.finish_group(plan, &installed, prompt, tokens, samples),
            )));
        }
        Ok(out)
    }

    /// The next group's sequence number, prompt index, sampling parameters and draws.
    fn plan_group(&mut self) -> Result<GroupPlan, RolloutError> {
        let seq = self.next_seq()?;
        let mut seed = blake3::Hasher::new();
        seed.update(b"echo-swarm/rollout/group");
        seed.update(&self.cfg.seed.to_le_bytes());
        seed.update(&seq.to_le_bytes());
        let mut rng = rand::rngs::StdRng::from_seed(*seed.finalize().as_bytes());
        let task = self.env.as_task().cloned();
        let states = self.env.metadata().num_initial_states;
        // Drawn in every case, so the sampling stream that follows is the same either way.
        let mut index = match &task {
            Some(t) => t.sample_index(&mut rng),
            None => match states {
                Some(n) => rng.gen_range(0..n.max(1)),
                None => rng.gen(),
            },
        };
        if let Some(assigned) = &self.cfg.assignment_seed {
            index = tasks::assign::index_for(states, assigned, &self.cfg.producer, seq);
        }
        let mut params = self.cfg.sampling.clone();
        params.stop_tokens = self.stop_tokens.clone();
        // The uniforms: prescribed by the assignment seed (the learner can check every
        // token against them), or drawn from the group's seed for local use.
        let n = self.cfg.group_size;
        let draws = match &self.cfg.assignment_seed {
            Some(seed) => Draws::prescribed(seed, &self.cfg.producer, seq, n),
            None => Draws::from_rng(&mut rng, n),
        };
        Ok(GroupPlan {
            seq,
            index,
            task,
            params,
            draws,
            created: storage::unix_ms(),
        })
    }

    /// The finished, signed group of `plan`.
    fn finish_group(
        &mut self,
        plan: &GroupPlan,
        installed: &InstalledPolicy,
        prompt: tasks::Prompt,
        prompt_tokens: Vec<u32>,
        samples: Vec<Sample>,
    ) -> TrajectoryGroup {
        let mut group = TrajectoryGroup {
            group_id: self.id(plan.seq, u64::MAX),
            task_id: self.env.name().to_string(),
            prompt_id: prompt.id,
            version: installed.version,
            seq: plan.seq,
            producer: self.cfg.producer.clone(),
            prompt_text: prompt.text,
            prompt_tokens,
            created_unix_ms: plan.created,
            samples,
            signature: None,
        };
        self.seal(&mut group);
        group
    }

    /// `n` completions of prompt `index` of a single-turn task, each rewarded by the task.
    fn single_turn(
        &mut self,
        task: &Arc<dyn Task>,
        installed: &InstalledPolicy,
        index: u64,
        params: &SamplingParams,
        draws: &Draws,
        seq: u64,
    ) -> Result<(tasks::Prompt, Vec<u32>, Vec<Sample>), RolloutError> {
        let prompt = task.prompt(index)?;
        let prompt_tokens = self.chat.tokenizer().encode_prompt(&prompt.text)?;
        let completions = match self.cfg.path {
            GenerationPath::Infer => {
                let model = self.infer_model(installed)?;
                policy::infer::generate_with(&model, &prompt_tokens, params, draws)?
            }
            path => policy::generate_with(
                &*self.device_policy(installed)?,
                &prompt_tokens,
                params,
                path,
                draws,
            )?,
        };
        let samples = self.rewarded(task, &prompt, seq, completions)?;
        Ok((prompt, prompt_tokens, samples))
    }

    /// The samples of a single-turn group: each completion decoded and rewarded by the task.
    fn rewarded(
        &self,
        task: &Arc<dyn Task>,
        prompt: &tasks::Prompt,
        seq: u64,
        completions: Vec<policy::Completion>,
    ) -> Result<Vec<Sample>, RolloutError> {
        let finished = storage::unix_ms();
        let mut samples = Vec::with_capacity(completions.len());
        for (k, c) in completions.into_iter().enumerate() {
            let text = self.chat.tokenizer().decode(&c.tokens)?;
            let reward = task.reward(prompt, &text);
            samples.push(Sample {
                trajectory_id: self.id(seq, k as u64),
                loss_mask: vec![1; c.tokens.len()],
                response_tokens: c.tokens,
                response_text: text,
                reward: reward.value,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: finished,
            });
        }
        Ok(samples)
    }

    /// `n` episodes of a multi-turn environment from initial state `seed` (ECHO-2 Eq. 21's
    /// group: one initial state), each sample's reward its return.
    fn episodes(
        &mut self,
        installed: &InstalledPolicy,
        seed: u64,
        params: &SamplingParams,
        draws: &Draws,
        seq: u64,
    ) -> Result<(tasks::Prompt, Vec<u32>, Vec<Sample>), RolloutError> {
        let (infer, train);
        let model = if matches!(self.cfg.path, GenerationPath::Infer) {
            infer = self.infer_model(installed)?;
            policy::session::Model::Infer(&infer)
        } else {
            // The training-forward paths run on the slot's device (decoded in host memory).
            train = self.device_policy(installed)?;
            policy::session::Model::Train(&train)
        };
        let spec = episode::Spec {
            env: self.env.as_ref(),
            chat: &self.chat,
            budget: self.budget,
            context: self.slot.model_config().max_position_embeddings,
        };
        // The canonical rule with the group's draws: sample k's j-th sampled token (across
        // turns) uses row k's uniform j — what the learner's draw check draws again.
        let (prompt, prompt_tokens, played) =
            episode::play_group(spec, model, seed, params, draws)?;
        let finished = storage::unix_ms();
        let mut samples = Vec::with_capacity(played.len());
        for (k, ep) in played.into_iter().enumerate() {
            samples.push(Sample {
                trajectory_id: self.id(seq, k as u64),
                loss_mask: ep.mask(),
                response_text: self.chat.tokenizer().decode(&ep.tokens)?,
                response_tokens: ep.tokens,
                reward: ep.ret,
                sampler_logprobs: ep.logprobs,
                finished_unix_ms: finished,
            });
        }
        Ok((prompt, prompt_tokens, samples))
    }
}
