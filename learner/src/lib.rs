//! The learner role: bounded-staleness training (ECHO-2 Algorithm 1), lease–ack pulls of
//! admissible trajectory groups, checkpoints and publication of snapshots.
//!
//! Owns: the RL objectives ([`loss`]), the training loop, the learner's trajectory buffer
//! policy.
//! Must not touch: the libp2p swarm (it talks to `p2p` through its client handle) or on-disk
//! formats (those belong to `storage`).
//!
//! Today this crate holds the objectives; the training loop, pulls and checkpoints arrive with
//! the rest of issue 6.

pub mod loss;

pub use loss::{group_advantages, group_loss, GroupInput, LossConfig, LossOutput, Objective};

/// Errors of the learner layer.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("invalid input: {0}")]
    Invalid(String),
}

pub type Result<T, E = LearnerError> = std::result::Result<T, E>;
