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
//! - **Exactly once.** The ids of every trajectory the learner consumed are remembered (and
//!   checkpointed); a group containing one of them is refused as a duplicate.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use candle_core::{DType, Tensor};
use control::Window;
use policy::Policy;
use serde::{Deserialize, Serialize};
use storage::TrajectoryGroup;

use crate::loss::{
    group_advantages, group_loss, is_zero_advantage, variance, GroupInput, LossConfig,
};
use crate::optim::{AdamW, AdamWConfig};
use crate::{LearnerError, Result};

/// The learner's configuration (persisted in checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerConfig {
    /// Objective, clip range, KL weight.
    pub loss: LossConfig,
    /// Optimiser hyperparameters.
    pub optim: AdamWConfig,
    /// Temperature T of the learner's log-probs. Must equal the rollout's log-prob
    /// temperature (`SamplingParams::logprob_temperature`), or the on-policy ratio is not 1.
    pub temperature: f32,
    /// Staleness budget S.
    pub staleness: u64,
    /// Publication period κ (`None` = [`Window::default_kappa`]).
    pub kappa: Option<u64>,
    /// Groups per step (B).
    pub groups_per_step: usize,
    /// Samples per group (n); groups of another size are still accepted.
    pub group_size: usize,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            loss: LossConfig::default(),
            optim: AdamWConfig::default(),
            temperature: 1.0,
            staleness: 3,
            kappa: None,
            groups_per_step: 16,
            group_size: 8,
        }
    }
}

impl TrainerConfig {
    /// κ in effect.
    pub fn kappa(&self) -> u64 {
        self.kappa
            .unwrap_or_else(|| self.window().default_kappa())
            .max(1)
    }

    /// The staleness window of this configuration: the one rule the trainer, the node's
    /// puller and the pull leases all read.
    pub fn window(&self) -> Window {
        Window::new(self.staleness)
    }

    /// R = B × n: trajectories per step.
    pub fn batch_trajectories(&self) -> usize {
        self.groups_per_step * self.group_size
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(LearnerError::Invalid(format!(
                "temperature must be > 0 (use 1 for greedy samplers), got {}",
                self.temperature
            )));
        }
        if self.groups_per_step == 0 || self.group_size == 0 {
            return Err(LearnerError::Invalid(
                "groups_per_step and group_size must be > 0".into(),
            ));
        }
        if self.kappa == Some(0) {
            return Err(LearnerError::Invalid("kappa must be >= 1".into()));
        }
        if !(self.loss.clip_eps.is_finite() && self.loss.clip_eps >= 0.0) || self.loss.kl_beta < 0.0
        {
            return Err(LearnerError::Invalid(format!(
                "invalid loss config {:?}",
                self.loss
            )));
        }
        if let Some(cap) = self.loss.is_cap {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(LearnerError::Invalid(format!(
                    "is_cap (truncated importance ratio cap C) must be finite and > 0, got {cap}"
                )));
            }
        }
        Ok(())
    }
}

/// Why a group was or was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admissible, new and well-formed (it may still turn out to have zero advantage).
    Admitted,
    /// `v_τ < v − S`: outside the staleness window.
    Stale,
    /// `v_τ > v`: generated by a version the learner has not reached.
    Future,
    /// Contains a trajectory id the learner has already consumed.
    Duplicate,
    /// Malformed for training (empty, mismatched log-prob/mask lengths, non-finite values).
    Invalid(String),
}

/// What one [`Trainer::train_step`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// Learner version after the step.
    pub version: u64,
    /// Whether an optimiser step happened (false when no group was usable).
    pub stepped: bool,
    /// T_train: wall-clock seconds of the step (log-probs, loss, backward, optimiser).
    pub t_train_s: f64,
    /// Mean reward over the samples of admitted groups (zero-advantage ones included).
    pub reward_mean: f64,
    /// Population standard deviation of those rewards.
    pub reward_std: f64,
    /// Loss (mean of the per-group losses).
    pub loss: f64,
    /// KL(sampler ‖ learner) estimate: token-weighted mean of `log q − log p`.
    pub kl_sampler_learner: f64,
    /// Variance of the per-sequence importance coefficients of the trained groups.
    pub importance_weight_variance: f64,
    /// Fraction of trained tokens whose coefficient left `[1−ε, 1+ε]`.
    pub clip_fraction: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Zero-advantage groups / admitted groups.
    pub zero_advantage_fraction: f64,
    /// Observed staleness Δ = v − v_τ of admitted groups: Δ → number of groups.
    pub staleness_histogram: BTreeMap<u64, u64>,
    /// Largest Δ among admitted groups.
    pub staleness_max: u64,
    /// Groups trained on.
    pub groups_used: usize,
    /// Trajectories trained on.
    pub trajectories_used: usize,
    /// Admitted groups dropped for zero advantage.
    pub groups_zero_advantage: usize,
    /// Groups refused as stale (`v_τ < v − S`).
    pub groups_stale: usize,
    /// Groups refused as from a future version.
    pub groups_future: usize,
    /// Groups refused as already consumed.
    pub groups_duplicate: usize,
    /// Groups refused as malformed.
    pub groups_invalid: usize,
}

impl StepStats {
    /// Groups refused or dropped for any reason.
    pub fn groups_dropped(&self) -> usize {
        self.groups_zero_advantage
            + self.groups_stale
            + self.groups_future
            + self.groups_duplicate
            + self.groups_invalid
    }
}

/// The trainable policy, its optimiser and the learner's bookkeeping.
pub struct Trainer {
    // Crate-visible for `checkpoint`, which saves and restores exactly these.
    pub(crate) cfg: TrainerConfig,
    pub(crate) policy: Policy,
    pub(crate) reference: Option<Policy>,
    pub(crate) opt: AdamW,
    pub(crate) version: u64,
    pub(crate) consumed: HashSet<[u8; 16]>,
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

fn bad(msg: impl Into<String>) -> Verdict {
    Verdict::Invalid(msg.into())
}

impl Trainer {
    /// A trainer at version 0 over `policy`. When `cfg.loss.kl_beta > 0` a frozen copy of
    /// the current weights becomes the KL reference.
    pub fn new(policy: Policy, cfg: TrainerConfig) -> Result<Self> {
        cfg.validate()?;
        let reference = if cfg.loss.kl_beta > 0.0 {
            Some(Policy::from_safetensors_bytes(
                policy.config(),
                &policy.to_safetensors_bytes()?,
                policy.device(),
            )?)
        } else {
            None
        };
        let opt = AdamW::new(policy.named_vars()?, cfg.optim)?;
        Ok(Trainer {
            cfg,
            policy,
            reference,
            opt,
            version: 0,
            consumed: HashSet::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.cfg
    }

    /// The trainable policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The optimiser (e.g. to change the learning rate).
    pub fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.opt
    }

    /// Current version v (number of optimiser steps taken since version 0).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Moves the version label forward to `v` (no-op when `v` is not ahead). Used by a learner
    /// restored from a checkpoint older than snapshots it had already published: versions
    /// must only grow, so the lost steps' numbers are skipped, not reused for other weights.
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

    /// Classifies a group against the current version (admission rule, duplicates, shape).
    pub fn classify(&self, g: &TrajectoryGroup) -> Verdict {
        if let Some(why) = malformed(g) {
            return why;
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
    /// 1. refuse inadmissible (stale / future), duplicate and malformed groups (counted);
    /// 2. drop zero-advantage groups (counted; their ids count as consumed);
    /// 3. learner log-probs of all remaining samples in one batched forward
    ///    ([`policy::batch_response_logprobs`] at the configured temperature);
    /// 4. the objective per group ([`group_loss`]), averaged over groups; backward; global-norm
    ///    clipping; AdamW;
    /// 5. `v += 1`.
    ///
    /// With no usable group, nothing is trained and the version does not move
    /// (`stepped = false`).
    pub fn train_step(&mut self, groups: &[TrajectoryGroup]) -> Result<StepStats> {
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
                Verdict::Invalid(_) => st.groups_invalid += 1,
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
        let mut used: Vec<(&TrajectoryGroup, Vec<f32>)> = Vec::new();
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
        if !used.is_empty() {
            self.optimise(&used, &mut st)?;
            self.version += 1;
            st.stepped = true;
        }
        // Consumed only once the step has succeeded: an error leaves the trainer unchanged
        // (weights may have moved only if the optimiser itself failed mid-way, which it does not
        // for finite gradients).
        self.consumed.extend(batch_ids);
        st.version = self.version;
        st.t_train_s = t0.elapsed().as_secs_f64();
        Ok(st)
    }

    fn optimise(
        &mut self,
        used: &[(&TrajectoryGroup, Vec<f32>)],
        st: &mut StepStats,
    ) -> Result<()> {
        let dev = self.policy.device().clone();
        let pairs: Vec<(&[u32], &[u32])> = used
            .iter()
            .flat_map(|(g, _)| {
                g.samples
                    .iter()
                    .map(|s| (g.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
            })
            .collect();
        let t = self.cfg.temperature;
        let (lp, _) = policy::batch_response_logprobs(&self.policy, &pairs, t)?;
        let ref_lp = match &self.reference {
            Some(r) => Some(policy::batch_response_logprobs(r, &pairs, t)?.0.detach()),
            None => None,
        };
        let mut losses = Vec::with_capacity(used.len());
        let (mut coefs, mut clipped, mut kl, mut tokens) = (Vec::new(), 0.0, 0.0, 0.0);
        let mut row = 0;
        for (g, adv) in used {
            let n = g.samples.len();
            let len = g
                .samples
                .iter()
                .map(|s| s.response_tokens.len())
                .max()
                .unwrap_or(1);
            let (mut q, mut m) = (Vec::with_capacity(n * len), Vec::with_capacity(n * len));
            for s in &g.samples {
                for j in 0..len {
                    q.push(s.sampler_logprobs.get(j).copied().unwrap_or(0.0));
                    m.push(
                        s.loss_mask
                            .get(j)
                            .map_or(0.0, |&b| f32::from(u8::from(b != 0))),
                    );
                }
            }
            let q = Tensor::from_vec(q, (n, len), &dev)?;
            let m = Tensor::from_vec(m, (n, len), &dev)?;
            let a = Tensor::from_vec(adv.clone(), n, &dev)?;
            let p = lp.narrow(0, row, n)?.narrow(1, 0, len)?;
            let r = match &ref_lp {
                Some(r) => Some(r.narrow(0, row, n)?.narrow(1, 0, len)?),
                None => None,
            };
            row += n;
            let out = group_loss(
                &self.cfg.loss,
                &GroupInput {
                    learner_logp: &p,
                    sampler_logp: &q,
                    mask: &m,
                    advantages: &a,
                    ref_logp: r.as_ref(),
                },
            )?;
            let toks = f64::from(m.sum_all()?.to_scalar::<f32>()?);
            clipped += out.clip_fraction * toks;
            kl += out.kl_sampler_learner * toks;
            tokens += toks;
            coefs.extend(out.coefficients);
            losses.push(out.loss);
            st.trajectories_used += n;
        }
        let loss = Tensor::stack(&losses, 0)?.mean_all()?;
        st.loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if !st.loss.is_finite() {
            return Err(LearnerError::Invalid(format!(
                "non-finite loss {}",
                st.loss
            )));
        }
        let step = self.opt.backward_step(&loss)?;
        st.grad_norm = step.grad_norm;
        st.groups_used = used.len();
        st.importance_weight_variance = variance(&coefs);
        if tokens > 0.0 {
            st.clip_fraction = clipped / tokens;
            st.kl_sampler_learner = kl / tokens;
        }
        Ok(())
    }
}

fn malformed(g: &TrajectoryGroup) -> Option<Verdict> {
    if g.samples.is_empty() {
        return Some(bad("group without samples"));
    }
    if g.prompt_tokens.is_empty() {
        return Some(bad("empty prompt"));
    }
    for s in &g.samples {
        let n = s.response_tokens.len();
        if n == 0 {
            return Some(bad("empty response"));
        }
        if s.sampler_logprobs.len() != n || s.loss_mask.len() != n {
            return Some(bad(
                "sampler log-probs / loss mask do not match the response length",
            ));
        }
        if !s.reward.is_finite() || s.sampler_logprobs.iter().any(|x| !x.is_finite()) {
            return Some(bad("non-finite reward or log-prob"));
        }
    }
    None
}

#[cfg(test)]
#[path = "trainer_tests.rs"]
mod tests;
