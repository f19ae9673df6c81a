//! The policy model shared by the learner and rollout workers.
//!
//! Owns: one trainable implementation of the Qwen3 architecture (Qwen2 as a variant) on
//! candle-nn variables with Hugging Face weight names ([`model`]), its configuration and config
//! hash ([`config`]), weights ⇄ safetensors snapshot payload ([`Policy`]), tokenizers
//! ([`tokenizer`]), sparse bf16 deltas between two snapshot payloads ([`delta`]), KV-cache sampling with log-probs ([`sampling`]) by the canonical, checkable
//! sampling rule ([`rule`]) from prescribed uniforms ([`draw`]), loading a local Hugging
//! Face folder ([`hf`]) and the supervised warm-start helper ([`sft`]); chat templates and the
//! turn-aware masks of multi-turn episodes ([`chat`]), generation that carries its KV cache
//! from turn to turn ([`session`]); device selection
//! ([`device`]), memory-fit arithmetic ([`memory`]) and the gradient-free generation path with
//! fused kernels and half-precision weights ([`infer`]); low-rank adapters on a frozen base,
//! their merge into the base and the base's identity ([`lora`]).
//!
//! Must not touch: networking, storage, rewards, or the RL loss — those live in `p2p`,
//! `storage`, `tasks` and `learner`. Nothing here downloads anything.
//!
//! The CPU build is the default; `--features cuda` only forwards to candle's CUDA backend.

pub mod chat;
pub mod config;
pub mod delta;
pub mod device;
pub mod draw;
pub mod error;
pub mod hf;
pub mod infer;
pub mod lora;
pub mod memory;
pub mod model;
pub mod rule;
pub mod rule_device;
mod safetensors_io;
pub mod sampling;
pub mod session;
pub mod sft;
pub mod tokenizer;
pub mod weights;

/// The candle crates this policy is built on, re-exported so that dependents (the learner's
/// optimiser, benches) use exactly the same versions.
pub use candle_core;
pub use candle_core::{DType, Device, Tensor, Var};
pub use candle_nn;
pub use config::{Arch, ModelConfig};
pub use device::{DeviceChoice, DeviceInfo};
pub use draw::{Draws, SampleStream};
pub use error::{PolicyError, Result};
pub use infer::{InferModel, InferSpec};
pub use lora::{Adapters, LoraConfig};
pub use model::{KvCache, Qwen3};
pub use safetensors_io::{snapshot_config_hash, META_CONFIG_HASH};
pub use sampling::{
    batch_response_logits, batch_response_logprobs, recomputed_response_logprobs,
    response_logprobs, token_logprobs, Completion, GenerationPath, RecomputedPass, SamplingParams,
};
pub use tokenizer::{ByteTokenizer, Tokenizer};
pub use weights::Policy;

/// Generates `n` completions of `prompt` with the chosen path, the uniforms drawn from `rng`
/// ([`Draws::from_rng`]: the same rng state gives the same tokens on every path).
pub fn generate(
    policy: &Policy,
    prompt: &[u32],
    n: usize,
    params: &SamplingParams,
    path: GenerationPath,
    rng: &mut impl rand::Rng,
) -> Result<Vec<Completion>> {
    generate_with(policy, prompt, params, path, &Draws::from_rng(rng, n))
}

/// Generates one completion of `prompt` per row of `draws` with the chosen path: the inference
/// path ([`GenerationPath::Infer`], `infer`) or the training forward (`sampling`). Row `r`'s
/// tokens are decided by its uniforms through the canonical rule ([`rule`]); with prescribed
/// draws ([`Draws::prescribed`]) the learner can check every token. Callers that generate
/// repeatedly under one snapshot should build the [`InferModel`] once and call
/// `infer::generate_with` (the rollout engine does).
pub fn generate_with(
    policy: &Policy,
    prompt: &[u32],
    params: &SamplingParams,
    path: GenerationPath,
    draws: &Draws,
) -> Result<Vec<Completion>> {
    if path == GenerationPath::Infer {
        let model = InferModel::from_policy(policy)?;
        return infer::generate_with(&model, prompt, params, draws);
    }
    sampling::generate_with(policy, prompt, params, path, draws)
}

/// The embedded default: [`ModelConfig::tiny`] with randomly initialised weights (`seed`) and
/// the byte tokenizer, on the CPU.
pub fn embedded_default(seed: u64) -> Result<(Policy, Tokenizer)> {
    let policy = Policy::new_random(&ModelConfig::tiny(), seed, &Device::Cpu)?;
    Ok((policy, Tokenizer::byte()))
}

#[cfg(test)]
mod tests;
