//! The trainer's configuration ([`TrainerConfig`], persisted in checkpoints): the loss and
//! optimiser settings, the staleness window and publication period, the batch shape and the
//! micro-batch budget, with the checks a configuration must pass before a trainer is built.

use control::Window;
use serde::{Deserialize, Serialize};

use crate::loss::LossConfig;
use crate::optim::AdamWConfig;
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
    /// Padded tokens (rows × longest prompt + response) per forward/backward pass: a step's
    /// groups are micro-batched into passes of at most this many tokens and their gradients
    /// summed, which bounds the activation memory (`policy::memory::learner_bytes`). A group
    /// larger than this is split by rows. 0 = the whole step in one pass.
    #[serde(default = "default_micro_batch_tokens")]
    pub micro_batch_tokens: usize,
    /// The dtype the forward and backward compute in ([`Precision`]; master weights,
    /// gradient sums, AdamW's moments, log-softmax, loss and ratios stay f32).
    #[serde(default)]
    pub precision: Precision,
    /// Recompute each layer's activations during the backward instead of storing them, with
    /// attention in chunks of [`TrainerConfig::query_chunk`] queries: a pass holds one layer's
    /// activations (`policy::model::recompute`). Costs one more forward per pass.
    #[serde(default)]
    pub recompute: bool,
    /// Queries per attention chunk when recomputing (0 = [`policy::model::DEFAULT_QUERY_CHUNK`]).
    #[serde(default)]
    pub query_chunk: usize,
}

fn default_micro_batch_tokens() -> usize {
    4096
}

/// The learner's compute dtype (`learner.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16 on a GPU, f32 on the CPU (whose candle has no bf16 matmul).
    #[default]
    Auto,
    /// bf16 compute (tensor cores); GPU only.
    Bf16,
    /// f16 compute (the CPU has an f16 matmul).
    F16,
    /// f32 everywhere.
    F32,
}

impl Precision {
    /// The compute dtype on `device`.
    pub fn dtype(self, device: &policy::Device) -> policy::DType {
        match self {
            Precision::Auto if device.is_cpu() => policy::DType::F32,
            Precision::Auto | Precision::Bf16 => policy::DType::BF16,
            Precision::F16 => policy::DType::F16,
            Precision::F32 => policy::DType::F32,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = LearnerError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => Precision::Auto,
            "bf16" => Precision::Bf16,
            "f16" => Precision::F16,
            "f32" => Precision::F32,
            other => {
                return Err(LearnerError::Invalid(format!(
                    "unknown precision {other:?} (auto, bf16, f16, f32)"
                )))
            }
        })
    }
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
            micro_batch_tokens: default_micro_batch_tokens(),
            precision: Precision::default(),
            recompute: false,
            query_chunk: 0,
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

    /// Padded tokens of the learner's largest forward/backward pass for `model`: the budget,
    /// or with none the whole step at full context. What the memory check counts.
    pub fn tokens_per_pass(&self, model: &policy::ModelConfig) -> usize {
        if self.micro_batch_tokens > 0 {
            self.micro_batch_tokens
        } else {
            self.batch_trajectories() * model.max_position_embeddings
        }
    }

    /// What the memory model counts this configuration's passes with on `device`.
    pub fn compute(&self, device: &policy::Device) -> policy::memory::Compute {
        policy::memory::Compute {
            dtype: self.precision.dtype(device),
            recompute: self.recompute.then(|| self.query_chunk()),
        }
    }

    /// Queries per attention chunk of a recomputed pass.
    pub fn query_chunk(&self) -> usize {
        if self.query_chunk > 0 {
            self.query_chunk
        } else {
            policy::model::DEFAULT_QUERY_CHUNK
        }
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
        if !(self.loss.clip_eps.is_finite() && self.loss.clip_eps >= 0.0) {
            return Err(LearnerError::Invalid(format!(
                "clip_eps must be finite and >= 0, got {}",
                self.loss.clip_eps
            )));
        }
        if !(self.loss.kl_beta.is_finite() && self.loss.kl_beta >= 0.0) {
            return Err(LearnerError::Invalid(format!(
                "kl_beta must be finite and >= 0, got {}",
                self.loss.kl_beta
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
