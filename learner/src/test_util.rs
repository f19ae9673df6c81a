//! Fixtures shared by this crate's unit tests.

use candle_core::Device;
use policy::{ModelConfig, Policy};

/// A very small Qwen3 over the byte vocabulary: fast in debug builds.
pub(crate) fn small_policy(seed: u64) -> Policy {
    let cfg = ModelConfig {
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        max_position_embeddings: 64,
        ..ModelConfig::tiny()
    };
    Policy::new_random(&cfg, seed, &Device::Cpu).unwrap()
}
