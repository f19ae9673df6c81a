//! The learner's training core: bounded-staleness training (ECHO-2 Algorithm 1), lease–ack pulls of
//! admissible trajectory groups, checkpoints and publication of snapshots.
//!
//! Owns: the RL objectives ([`loss`]), the optimiser ([`optim`]), the training core with its
//! admission rules and checkpoints ([`trainer`]) and its micro-batched gradients (passes of a
//! bounded number of tokens, gradients summed), the one verification pipeline of pulled
//! groups whose [`Verified`] output is all a trainer takes ([`pipeline`]), the log-prob spot
//! checks of pulled groups ([`spot_check`]) with their check that each token is the canonical
//! sampling rule's draw ([`verdict`]), the learner-owned loss masks ([`mask`]) and the CPU
//! learner's process-wide heap setting ([`heap`]).
//! Must not touch: the network (it has no `p2p` dependency: the node's learner role pulls,
//! publishes and feeds this crate groups), or on-disk formats of the trajectory store (those
//! belong to `storage`). The staleness window is [`control::Window`], re-exported here.
//!
//! The node's learner role builds on [`Trainer`]; a one-process demonstration of Algorithm 1
//! is `examples/local_learning.rs` (see `docs/learner.md`).

pub mod checkpoint;
pub mod heap;
pub mod loss;
pub mod mask;
pub mod optim;
pub mod pipeline;
pub mod spot_check;
pub mod trainer;
pub mod verdict;
pub mod warm;

#[cfg(test)]
mod test_util;

pub use control::Window;
pub use loss::{group_advantages, group_loss, GroupInput, LossConfig, LossOutput, Objective};
pub use mask::{MaskRule, ResponseTokens};
pub use optim::{AdamW, AdamWConfig, OptimStep};
pub use pipeline::{Checks, Pipeline, Stage, StageInput, Verified};
pub use spot_check::{SpotReport, SpotRule, SpotSampler};
pub use trainer::{Precision, StepStats, Trainer, TrainerConfig, Verdict};
pub use verdict::{CheckReport, CheckSettings, SpotVerdict, WorkerDtype};
pub use warm::{warm_start_on_task, WarmReport};

/// Errors of the learner layer.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("policy error: {0}")]
    Policy(#[from] policy::PolicyError),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("checkpoint error: {0}")]
    Checkpoint(String),
    #[error("invalid input: {0}")]
    Invalid(String),
}

impl LearnerError {
    /// Whether the device ran out of memory (by variant: [`policy::PolicyError::is_out_of_memory`]).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            LearnerError::Tensor(e) => policy::error::candle_out_of_memory(e),
            LearnerError::Policy(e) => e.is_out_of_memory(),
            _ => false,
        }
    }
}

pub type Result<T, E = LearnerError> = std::result::Result<T, E>;
