//! How many bytes a learner or a rollout worker needs on its device, as pure functions of the
//! model shape, so a node can refuse a role it cannot hold before allocating anything.
//!
//! Owns: the byte formulas ([`learner_bytes`], [`worker_bytes`]) and the fit check with an
//! actionable message ([`check_fit`]).
//!
//! Must not touch: devices or I/O — the caller passes the free memory it measured
//! ([`crate::device::describe`]). The CUDA context itself (a few hundred MiB) and allocator
//! slack are not included: callers keep a reserve.

use candle_core::DType;

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes the learner holds for training, all in f32 (P = [`ModelConfig::num_params`]):
///
/// `4·P` weights + `4·P` gradients + `8·P` AdamW first and second moments (Loshchilov &
/// Hutter, "Decoupled Weight Decay Regularization") = `16·P`, plus `4·P` for a frozen
/// reference copy when the loss has a KL penalty (`with_reference`).
///
/// Activations of the training forward/backward are not included: they scale with the
/// micro-batch (tokens per step) and are bounded by the learner's batch settings.
pub fn learner_bytes(cfg: &ModelConfig, with_reference: bool) -> u64 {
    let p = cfg.num_params();
    let per_param = if with_reference { 20 } else { 16 };
    p.saturating_mul(per_param)
}

/// Bytes a rollout worker needs to generate `batch` sequences of up to `context` tokens with
/// the inference path's weights in `dtype` (s = `dtype.size_in_bytes()`):
///
/// - weights: `P·s`;
/// - KV cache: `2 · layers · kv_heads · head_dim · context · batch · s` (keys and values of
///   every layer for every position of every row, preallocated for the whole context);
/// - activation allowance, the larger transient buffers of one step, added together:
///   - decode: `batch · vocab · (s + 8)` — the last-position logits in `dtype`, their f32
///     copy and the f32 log-softmax used for sampling (the vocabulary dominates a decode
///     step: 151,936 entries per row for Qwen3 versus 1,024-wide hidden states);
///   - prefill of a `context`-token prompt at batch 1:
///     `context · (2 · heads · context + 3 · intermediate + 6 · hidden) · s` — attention
///     scores and their softmax for every head, the SwiGLU gate/up/product, and the residual,
///     normalised, query/key/value and attention-output rows.
///
/// The rollout slot also keeps the f32 `Policy` a snapshot decodes into (`4·P`) on the same
/// device; callers that hold it there add `learner`-style `4·P` themselves.
pub fn worker_bytes(cfg: &ModelConfig, dtype: DType, batch: usize, context: usize) -> u64 {
    let s = dtype.size_in_bytes() as u64;
    let (b, t) = (batch as u64, context as u64);
    let weights = cfg.num_params().saturating_mul(s);
    let kv = 2
        * cfg.num_hidden_layers as u64
        * cfg.num_key_value_heads as u64
        * cfg.head_dim as u64
        * t
        * b
        * s;
    let decode = b * cfg.vocab_size as u64 * (s + 8);
    let prefill = t
        * (2 * cfg.num_attention_heads as u64 * t
            + 3 * cfg.intermediate_size as u64
            + 6 * cfg.hidden_size as u64)
        * s;
    weights
        .saturating_add(kv)
        .saturating_add(decode)
        .saturating_add(prefill)
}

/// `Ok` when `need <= free`; otherwise an error naming `what`, both sizes in GiB and the knobs
/// that reduce the need.
pub fn check_fit(what: &str, need: u64, free: u64) -> Result<()> {
    if need <= free {
        return Ok(());
    }
    Err(PolicyError::DoesNotFit(format!(
        "{what} needs {:.2} GiB but the device has {:.2} GiB free; reduce the batch \
         (group size) or the context (max new tokens / max_position_embeddings), use bf16 \
         weights for generation, free the device, or pick a device with more memory",
        need as f64 / GIB,
        free as f64 / GIB
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-computed parameter counts.
    // tiny: per layer 3·128·128 (q, o and k+v) + 3·128·384 + 2·128 + 2·32 = 196,928;
    //       3 layers + 260·128 embedding + 128 final norm = 624,192.
    // Qwen3-0.6B: per layer 1024·2048·2 + 2·1024·1024 + 3·1024·3072 + 2·1024 + 2·128
    //       = 15,730,944; 28 layers + 151,936·1024 + 1024 = 596,049,920.
    const TINY_P: u64 = 624_192;
    const QWEN_P: u64 = 596_049_920;

    #[test]
    fn parameter_counts() {
        assert_eq!(ModelConfig::tiny().num_params(), TINY_P);
        assert_eq!(ModelConfig::qwen3_0_6b().num_params(), QWEN_P);
    }

    #[test]
    fn learner_bytes_by_hand() {
        assert_eq!(learner_bytes(&ModelConfig::tiny(), false), 9_987_072);
        assert_eq!(learner_bytes(&ModelConfig::tiny(), true), 12_483_840);
        // 8.88 GiB without, 11.10 GiB with the reference copy.
        assert_eq!(
            learner_bytes(&ModelConfig::qwen3_0_6b(), false),
            9_536_798_720
        );
        assert_eq!(
            learner_bytes(&ModelConfig::qwen3_0_6b(), true),
            11_920_998_400
        );
    }

    #[test]
    fn worker_bytes_by_hand() {
        // Qwen3-0.6B, bf16, 64 rows × 1024 tokens:
        // weights 2·596,049,920 = 1,192,099,840
        // KV 2·28·8·128·1024·64·2 = 7,516,192,768
        // decode 64·151,936·10 = 97,239,040
        // prefill 1024·(2·16·1024 + 3·3072 + 6·1024)·2 = 98,566,144
        assert_eq!(
            worker_bytes(&ModelConfig::qwen3_0_6b(), DType::BF16, 64, 1024),
            8_904_097_792
        );
        // tiny, f32, 8 rows × 256 tokens:
        // weights 4·624,192 = 2,496,768; KV 2·3·2·32·256·8·4 = 3,145,728;
        // decode 8·260·12 = 24,960; prefill 256·(2·4·256 + 3·384 + 6·128)·4 = 4,063,232.
        assert_eq!(
            worker_bytes(&ModelConfig::tiny(), DType::F32, 8, 256),
            9_730_688
        );
        // Halving the dtype halves weights and KV cache.
        let f32b = worker_bytes(&ModelConfig::qwen3_0_6b(), DType::F32, 16, 512);
        let bf16 = worker_bytes(&ModelConfig::qwen3_0_6b(), DType::BF16, 16, 512);
        assert!(bf16 < f32b * 6 / 10);
    }

    #[test]
    fn fit_check_explains_itself() {
        assert!(check_fit("learner", 10, 10).is_ok());
        let e = check_fit("rollout worker", 3 << 30, 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout worker"), "{e}");
        assert!(e.contains("3.00 GiB"), "{e}");
        assert!(e.contains("1.00 GiB"), "{e}");
        assert!(e.contains("reduce the batch"), "{e}");
    }
}
