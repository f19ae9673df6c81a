//! The learner's training core (ECHO-2 Algorithm 1; `docs/learner.md`): bounded-staleness admission,
//! batch assembly, one optimisation step on a batch of trajectory groups, and checkpoints.
//!
//! Everything here is I/O-free except [`Trainer::save`] / [`Trainer::load`]: leasing, acking
//! and pruning groups in a [`storage::TrajectoryStore`] and publishing snapshots are the
//! caller's job (see `examples/local_learning.rs` and, later, the node).
//!
//! ## Rules
//! - **Versions.** The learner's version `v` starts at 0 (the initial snapshot) and grows by 1
//!   per optimiser step. A group carries the version `v_τ` of the snapshot that generated it.
//! - **Admissibility** ([`Window::admissible`], the one home of the rule): a group may enter a batch only if
//!   `v_τ ≥ v − S` (saturating at 0), i.e. its observed staleness `Δ = v − v_τ` is at most S.
//!   S = 0 is on-policy. The check is made again inside [`Trainer::train_step`] at the moment
//!   of the step, so a group that aged while waiting in hand is refused, never trained.
//!   A group from a *future* version (`v_τ > v`, e.g. after restoring an older checkpoint) is
//!   refused as well.
//! - **Publication period** ([`Window::default_kappa`]): a snapshot is published every κ steps,
//!   κ = max(S − 1, 1) by default. Publishing the snapshot of version v every κ ≤ S steps keeps
//!   the newest published version within the window for all of the next κ steps.
//! - **Batch** ([`TrainerConfig::batch_trajectories`]): a step runs on R = B × n trajectories
//!   (B groups of n samples each).
//! - **Zero-advantage groups** (all rewards equal) carry no signal: they are dropped and
//!   counted (as in the throughput-matching analysis of asynchronous RL, `docs/learner.md`); their trajectory ids still count as consumed.
//! - **Verified input only.** A step takes [`Verified`] groups: every byte of a group comes
//!   from an untrusted peer, and the one verification pipeline ([`crate::pipeline`]) has
//!   checked its structure against the model's limits (vocabulary, context, lengths, finite
//!   numbers) and every verification layer — the trainer does not check those again. It only
//!   refuses a group verified under limits larger than its own model's.
//! - **Bad numbers never fail a step.** A group whose loss or gradient turns out non-finite
//!   (e.g. a sampler log-prob far below any real one makes the importance ratio `exp(ℓ − q)`
//!   overflow) is excluded before the optimiser step, returned in [`StepStats::quarantined`]
//!   (with the producer, for the caller), never trained and not marked consumed; the step
//!   goes on with the remaining groups, or takes no step at all.
//! - **Exactly once.** The ids of every trajectory the learner consumed are remembered (and
//!   checkpointed); a group containing one of them is refused as a duplicate.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use candle_core::backprop::GradStore;
use policy::Policy;
use storage::TrajectoryGroup;

use crate::loss::{group_advantages, is_zero_advantage, variance};
use crate::mask::{MaskRule, ResponseTokens};
use crate::optim::AdamW;
use crate::pipeline::Verified;
use crate::{LearnerError, Result};
pub use microbatch::largest_pass;
use microbatch::{GroupTerms, Used};

// The micro-batched gradient is part of the trainer (it extends `Trainer`), so it is a child
// module: the file sits beside this one.
#[path = "trainer_config.rs"]
mod config;
#[path = "microbatch.rs"]
mod microbatch;
#[path = "step_stats.rs"]
mod stats;

pub use config::{Precision, TrainerConfig};
pub use stats::{Quarantined, StepStats, Verdict};

/// The trainable policy, its optimiser and the learner's bookkeeping.
pub struct Trainer {
    // Crate-visible for `checkpoint`, which saves and restores exactly these.
    pub(crate) cfg: TrainerConfig,
    pub(crate) policy: Policy,
    pub(crate) reference: Option<Policy>,
    pub(crate) opt: AdamW,
    pub(crate) version: u64,
    pub(crate) consumed: HashSet<[u8; 16]>,
    /// The rule the loss masks are derived by (the masks a group carries are never used).
    pub(crate) masks: Arc<dyn MaskRule>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("cfg", &self.cfg)
            .field("version", &self.version)
            .field("consumed", &self.consumed.len())
            .field("reference", &self.reference.is_some())
            .finish()
    }
}

/// The KL reference of a fresh trainer (`None` when `kl_beta` is 0): a LoRA policy's base
/// view, or a frozen copy of the full model's current weights.
pub(crate) fn reference_of(policy: &Policy, kl_beta: f64) -> Result<Option<Policy>> {
    if kl_beta <= 0.0 {
        return Ok(None);
    }
    if policy.lora().is_some() {
        return Ok(Some(policy.base_view()?));
    }
    Ok(Some(
        Policy::from_safetensors_bytes(
            policy.config(),
            &policy.to_safetensors_bytes()?,
            policy.device(),
        )?
        .with_compute_dtype(policy.compute_dtype())?,
    ))
}

fn bad(msg: impl Into<String>) -> Verdict {
    Verdict::Invalid(msg.into())
}

impl Trainer {
    /// A trainer at version 0 over `policy`. When `cfg.loss.kl_beta > 0` a frozen copy of
    /// the current weights becomes the KL reference — or, for a LoRA policy
    /// ([`Policy::with_lora`]), its base with the adapters off ([`Policy::base_view`]: the
    /// same storage, no second copy of the model). The optimiser steps
    /// [`Policy::trainable_named_vars`]: the adapters alone for a LoRA policy.
    pub fn new(policy: Policy, cfg: TrainerConfig) -> Result<Self> {
        cfg.validate()?;
        let dtype = policy.weights_dtype()?;
        if policy.lora().is_none() && dtype != policy::DType::F32 {
            return Err(LearnerError::Invalid(format!(
                "full fine-tuning trains f32 weights; these are {dtype:?} (a frozen base: add \
                 LoRA adapters to train on it)"
            )));
        }
        let compute = cfg.precision.dtype(policy.device());
        let policy = policy.with_compute_dtype(compute)?;
        let reference = reference_of(&policy, cfg.loss.kl_beta)?;
        let opt = AdamW::new(policy.trainable_named_vars()?, cfg.optim)?;
        Ok(Trainer {
            cfg,
            policy,
            reference,
            opt,
            version: 0,
            consumed: HashSet::new(),
            masks: Arc::new(ResponseTokens),
        })
    }

    /// Derives loss masks with `rule` instead of [`ResponseTokens`] (a multi-turn
    /// environment's turn-aware rule). Not checkpointed: set it again after [`Trainer::load`].
    pub fn set_mask_rule(&mut self, rule: Arc<dyn MaskRule>) {
        self.masks = rule;
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.cfg
    }

    /// The trainable policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Changes the micro-batch budget ([`TrainerConfig::micro_batch_tokens`]): how a step is
    /// cut into passes, which changes its memory, not what it computes.
    pub fn set_micro_batch_tokens(&mut self, tokens: usize) {
        self.cfg.micro_batch_tokens = tokens;
    }

    /// Changes how the passes compute — the precision and whether activations are recomputed
    /// (with the attention's query chunk; 0 = the default) — which depends on this run's
    /// device, not on a checkpoint's. The policy and its KL reference are rebuilt over the
    /// same variables; the optimiser's state is untouched.
    pub fn set_compute(
        &mut self,
        precision: Precision,
        recompute: bool,
        query_chunk: usize,
    ) -> Result<()> {
        let dtype = precision.dtype(self.policy.device());
        policy::model::check_compute_dtype(dtype, self.policy.device())?;
        self.policy.set_compute_dtype(dtype)?;
        if let Some(r) = &mut self.reference {
            r.set_compute_dtype(dtype)?;
        }
        self.cfg.precision = precision;
        self.cfg.recompute = recompute;
        self.cfg.query_chunk = query_chunk;
        Ok(())
    }

    /// The optimiser (e.g. to change the learning rate).
    pub fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.opt
    }

    /// Current version v (number of optimiser steps taken since version 0).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Continues from a snapshot this learner published after the checkpoint it was restored
    /// from (a crash between checkpoints): its weights become the policy's and `version` the
    /// trainer's, so a version number always names one set of weights — the one workers hold
    /// and sample under. The optimiser's moments stay the checkpoint's (a few steps older; they
    /// are running averages, which AdamW re-adapts within ~1/(1−β2) steps), as do the KL
    /// reference and the consumed ids (the caller adds the ids of the steps the snapshot
    /// covers, [`Trainer::mark_consumed`]). `payload` is a snapshot of this model
    /// ([`Policy::to_safetensors_bytes_as`], f32 or bf16: a bf16 snapshot rounds the learner's
    /// weights to what the workers hold). Refused, changing nothing, when `version` is not
    /// ahead of the current one or the payload does not fit the model.
    pub fn resume_from_snapshot(&mut self, payload: &[u8], version: u64) -> Result<()> {
        if version <= self.version {
            return Err(LearnerError::Checkpoint(format!(
                "resuming from snapshot {version}: the trainer is already at version {}",
                self.version
            )));
        }
        // Parses the whole payload into a model before it sets a variable.
        self.policy.load_safetensors_bytes(payload)?;
        self.version = version;
        Ok(())
    }

    /// [`Trainer::resume_from_snapshot`] for a LoRA trainer: continues from an adapter
    /// version this learner published after its checkpoint. The version's manifest names the
    /// base the adapters were trained on (`base_hash`, hex); it must be this trainer's base
    /// ([`Policy::base_hash_hex`]: the same base rebuilt at restart), else refused naming both.
    /// The adapters are set in place from `payload` (f32 or bf16, the snapshot dtype: a bf16
    /// payload rounds them to what the workers hold); the base is untouched. As on the full
    /// path the AdamW moments stay the checkpoint's: they are running averages that AdamW
    /// re-adapts within ~1/(1−β2) steps, whereas zeroed moments with the step count kept would
    /// make the next update ≈ (1−β1)/√(1−β2) ≈ 3× a normal one. The KL reference is the base,
    /// so it needs nothing. Refused, changing nothing, when `version` is not ahead, the trainer
    /// has no adapters, or the payload is not adapters of this model and configuration.
    pub fn resume_from_adapters(
        &mut self,
        payload: &[u8],
        version: u64,
        base_hash: &str,
    ) -> Result<()> {
        if version <= self.version {
            return Err(LearnerError::Checkpoint(format!(
                "resuming from adapter version {version}: the trainer is already at version {}",
                self.version
            )));
        }
        if self.policy.lora().is_none() {
            return Err(LearnerError::Checkpoint(format!(
                "version {version} holds adapters; this learner trains the full model"
            )));
        }
        let mine = self.policy.base_hash_hex()?;
        if mine != base_hash {
            return Err(LearnerError::Checkpoint(format!(
                "adapter version {version} was trained on base {base_hash}, this learner's \
                 base is {mine}"
            )));
        }
        self.policy.load_adapter_bytes(payload)?;
        self.version = version;
        Ok(())
    }

    /// Records `ids` as consumed (trajectories whose gradient steps are in the weights by
    /// another way than [`Trainer::train_step`]: a snapshot resumed from).
    pub fn mark_consumed(&mut self, ids: impl IntoIterator<Item = [u8; 16]>) {
        self.consumed.extend(ids);
    }

    /// Moves the version label forward to `v` (no-op when `v` is not ahead), keeping the
    /// weights. For a learner restored from a checkpoint older than snapshots it had already
    /// published but cannot read back ([`Trainer::resume_from_snapshot`] is the normal way):
    /// the lost steps' numbers are skipped, never reused for other weights.
    pub fn advance_version_to(&mut self, v: u64) {
        self.version = self.version.max(v);
    }

    /// `v − S` (saturating): the `v_min` for leases and the prune bound.
    pub fn lease_floor(&self) -> u64 {
        self.cfg.window().floor(self.version)
    }

    /// True when the current version should be published (every κ steps, and version 0).
    pub fn should_publish(&self) -> bool {
        {
            let k = self.cfg.kappa();
            self.version / k * k == self.version
        }
    }

    /// The snapshot payload of the current weights (`Policy::to_safetensors_bytes`).
    pub fn snapshot_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.policy.to_safetensors_bytes()?)
    }

    /// Whether trajectory `id` has been consumed.
    pub fn has_consumed(&self, id: &[u8; 16]) -> bool {
        self.consumed.contains(id)
    }

    /// Number of consumed trajectory ids.
    pub fn consumed_len(&self) -> usize {
        self.consumed.len()
    }

    /// Classifies a verified group against the current version (admission rule, duplicates)
    /// and this model (the limits it was verified under).
    pub fn classify(&self, g: &Verified<TrajectoryGroup>) -> Verdict {
        let model = self.policy.config();
        let l = g.limits();
        if l.vocab_size > model.vocab_size || l.max_context > model.max_position_embeddings {
            return bad(format!(
                "verified for vocabulary {} and context {}, the model has {} and {}",
                l.vocab_size, l.max_context, model.vocab_size, model.max_position_embeddings
            ));
        }
        if let Some(why) = (0..g.samples.len()).find_map(|i| self.masks.mask(g, i).err()) {
            return bad(format!("no loss mask can be derived: {why}"));
        }
        if g.samples
            .iter()
            .any(|s| self.consumed.contains(&s.trajectory_id))
        {
            return Verdict::Duplicate;
        }
        if g.version > self.version {
            return Verdict::Future;
        }
        if !self.cfg.window().admissible(g.version, self.version) {
            return Verdict::Stale;
        }
        Verdict::Admitted
    }

    /// One step of Algorithm 1 on `groups` (normally B groups = R trajectories, assembled by
    /// the caller from leased, admissible groups):
    /// 1. refuse inadmissible (stale / future), duplicate groups and groups verified for
    ///    another model (counted; the latter quarantined);
    /// 2. drop zero-advantage groups (counted; their ids count as consumed);
    /// 3. learner log-probs of the remaining samples in batched forwards of at most
    ///    `micro_batch_tokens` padded tokens ([`policy::batch_response_logprobs`] at the
    ///    configured temperature);
    /// 4. the objective per group ([`crate::group_loss`]), averaged over groups; backward per
    ///    pass, gradients summed; global-norm clipping; AdamW — groups whose loss or gradient
    ///    is non-finite are quarantined and left out first;
    /// 5. `v += 1`.
    ///
    /// With no usable group, nothing is trained and the version does not move
    /// (`stepped = false`). Bad data is never an `Err`: an error means a local fault (or a
    /// bug), and leaves the trainer unchanged.
    pub fn train_step(&mut self, groups: &[Verified<TrajectoryGroup>]) -> Result<StepStats> {
        let t0 = Instant::now();
        let mut st = StepStats::default();
        let mut admitted: Vec<&TrajectoryGroup> = Vec::new();
        let mut batch_ids: HashSet<[u8; 16]> = HashSet::new();
        for g in groups {
            let mut verdict = self.classify(g);
            if verdict == Verdict::Admitted
                && g.samples
                    .iter()
                    .any(|s| batch_ids.contains(&s.trajectory_id))
            {
                verdict = Verdict::Duplicate; // the same group twice in one batch
            }
            match verdict {
                Verdict::Admitted => {
                    batch_ids.extend(g.samples.iter().map(|s| s.trajectory_id));
                    admitted.push(g);
                }
                Verdict::Stale => st.groups_stale += 1,
                Verdict::Future => st.groups_future += 1,
                Verdict::Duplicate => st.groups_duplicate += 1,
                Verdict::Invalid(why) => {
                    st.groups_invalid += 1;
                    st.quarantined.push(Quarantined::of(g, why));
                }
            }
        }
        let rewards: Vec<f64> = admitted
            .iter()
            .flat_map(|g| g.samples.iter().map(|s| f64::from(s.reward)))
            .collect();
        if !rewards.is_empty() {
            st.reward_mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
            st.reward_std = variance(&rewards).sqrt();
        }
        let mut used: Vec<Used<'_>> = Vec::new();
        for g in &admitted {
            let delta = self.version - g.version;
            *st.staleness_histogram.entry(delta).or_default() += 1;
            st.staleness_max = st.staleness_max.max(delta);
            let r: Vec<f32> = g.samples.iter().map(|s| s.reward).collect();
            let adv = group_advantages(&r, self.cfg.loss.objective.scales_advantages_by_std());
            if is_zero_advantage(&adv) {
                st.groups_zero_advantage += 1;
            } else {
                used.push((g, adv));
            }
        }
        if !admitted.is_empty() {
            st.zero_advantage_fraction = st.groups_zero_advantage as f64 / admitted.len() as f64;
        }
        if !used.is_empty() && self.optimise(&used, &mut st)? {
            self.version += 1;
            st.stepped = true;
        }
        // Consumed only once the step has succeeded: an error leaves the trainer unchanged
        // (the optimiser refuses non-finite gradients before touching a weight). Quarantined
        // groups were never trained: not consumed.
        for q in &st.quarantined {
            if let Some(g) = groups.iter().find(|g| g.group_id == q.group_id) {
                for s in &g.samples {
                    batch_ids.remove(&s.trajectory_id);
                }
            }
        }
        self.consumed.extend(batch_ids);
        st.version = self.version;
        st.t_train_s = t0.elapsed().as_secs_f64();
        Ok(st)
    }

    /// Losses, backward and the optimiser step over `used`, in passes of at most
    /// `micro_batch_tokens` tokens (`microbatch`); groups with a non-finite loss or
    /// gradient are quarantined and the step runs on the rest. Returns whether a step was
    /// taken.
    fn optimise(&mut self, used: &[Used<'_>], st: &mut StepStats) -> Result<bool> {
        let mut keep: Vec<usize> = (0..used.len()).collect();
        let mut batch = self.batch_gradient(used, &keep, keep.len())?;
        // Groups whose own loss is not finite are not in the gradient: quarantine them and
        // rescale the sum to the mean over the rest.
        let finite: Vec<usize> = (0..keep.len())
            .filter(|&j| batch.terms[j].loss.is_finite())
            .collect();
        if finite.len() < keep.len() {
            for (j, &i) in keep.iter().enumerate() {
                let v = batch.terms[j].loss;
                if !v.is_finite() {
                    st.quarantined
                        .push(Quarantined::of(used[i].0, format!("non-finite loss {v}")));
                }
            }
            if finite.is_empty() {
                return Ok(false);
            }
            let scale = keep.len() as f64 / finite.len() as f64;
            batch.grads = batch
                .grads
                .map(|g| scale_grads(g, &self.policy.vars()?, scale))
                .transpose()?;
            batch.terms = finite.iter().map(|&j| batch.terms[j].clone()).collect();
            keep = finite.iter().map(|&j| keep[j]).collect();
        }
        // At most two gradients: the whole kept batch, then (after isolating the groups whose
        // own gradient is non-finite, one group at a time) the rest.
        for pass in 0..2 {
            let Some(grads) = &batch.grads else {
                return Ok(false);
            };
            if self.opt.grad_norm(grads)?.is_finite() {
                let step = self.opt.step(grads)?;
                st.grad_norm = step.grad_norm;
                self.record_terms(used, &keep, &batch.terms, st);
                return Ok(true);
            }
            let mut clean = Vec::with_capacity(keep.len());
            for &i in &keep {
                let one = self.batch_gradient(used, &[i], 1)?;
                let ok = match &one.grads {
                    Some(g) => self.opt.grad_norm(g)?.is_finite(),
                    None => false,
                };
                if ok && pass == 0 {
                    clean.push(i);
                } else {
                    st.quarantined
                        .push(Quarantined::of(used[i].0, "non-finite gradient"));
                }
            }
            keep = clean;
            if keep.is_empty() {
                return Ok(false);
            }
            batch = self.batch_gradient(used, &keep, keep.len())?;
        }
        Ok(false)
    }

    /// The step's loss and drift statistics from the trained groups' terms.
    fn record_terms(
        &self,
        used: &[Used<'_>],
        keep: &[usize],
        terms: &[GroupTerms],
        st: &mut StepStats,
    ) {
        let (mut coefs, mut clipped, mut kl, mut tokens) = (Vec::new(), 0.0, 0.0, 0.0);
        for (t, &i) in terms.iter().zip(keep) {
            clipped += t.clip_fraction * t.tokens;
            kl += t.kl * t.tokens;
            tokens += t.tokens;
            coefs.extend_from_slice(&t.coefficients);
            st.trajectories_used += used[i].0.samples.len();
        }
        st.loss = terms.iter().map(|t| t.loss).sum::<f64>() / terms.len().max(1) as f64;
        st.groups_used = keep.len();
        st.importance_weight_variance = variance(&coefs);
        if tokens > 0.0 {
            st.clip_fraction = clipped / tokens;
            st.kl_sampler_learner = kl / tokens;
        }
    }
}

/// `grads · scale`, variable by variable.
fn scale_grads(mut grads: GradStore, vars: &[candle_core::Var], scale: f64) -> Result<GradStore> {
    for v in vars {
        if let Some(g) = grads.remove(v.as_tensor()) {
            grads.insert(v.as_tensor(), g.affine(scale, 0.0)?);
        }
    }
    Ok(grads)
}

#[cfg(test)]
#[path = "trainer_tests.rs"]
mod tests;
