//! How many bytes a learner or a rollout worker needs on its device, as pure functions of the
//! model shape, so a node can refuse a role it cannot hold before allocating anything.
//!
//! Owns: the byte formulas ([`learner_bytes`] with its [`pass_activation_bytes`] and
//! [`activation_bytes_per_token`], [`worker_bytes`]), the fit checks with actionable messages
//! ([`check_fit`], [`check_learner_fit`]) and the largest learner pass that fits
//! ([`max_tokens_per_pass`]).
//!
//! Must not touch: devices or I/O — the caller passes the free memory it measured
//! ([`crate::device::describe`]). The CUDA context itself (a few hundred MiB) and allocator
//! slack are not included: callers keep a reserve.

use candle_core::DType;

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};
use crate::lora::{adapter_params, targeted_projections, LoraConfig};

const GIB: f64 = (1u64 << 30) as f64;

/// What the learner trains, for its memory arithmetic. A `bool` converts to
/// [`Training::Full`] (`with_reference`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Training<'a> {
    /// Every weight, in f32; a frozen f32 reference copy when the loss has a KL penalty.
    Full { with_reference: bool },
    /// Low-rank adapters (f32) on a frozen base held in `base_dtype`; the KL reference is the
    /// base itself (no copy).
    Lora {
        lora: &'a LoraConfig,
        base_dtype: DType,
    },
}

impl From<bool> for Training<'_> {
    fn from(with_reference: bool) -> Self {
        Training::Full { with_reference }
    }
}

/// How the learner computes, for its memory arithmetic: the activations' dtype and whether
/// activations are recomputed ([`Compute::F32`]: f32, stored — what [`learner_bytes`] counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compute {
    /// The dtype of the activations and matmuls: F32, or F16/BF16 (mixed precision, with f32
    /// master weights, gradients, moments, norms, softmax and logits).
    pub dtype: DType,
    /// Recomputed activations with attention in chunks of this many queries
    /// (`policy::model::recompute`); `None`: every activation stored until the backward.
    pub recompute: Option<usize>,
}

impl Compute {
    /// f32 everywhere, activations stored.
    pub const F32: Compute = Compute {
        dtype: DType::F32,
        recompute: None,
    };
}

/// [`training_state_bytes`] plus, for full fine-tuning in half precision, the half-precision
/// copies of the weights the forward's matmuls run on (`2·P`: the stored path keeps every
/// layer's copy for its backward; counted the same, an upper bound, when recomputing). A
/// LoRA base is multiplied as held (no copy); its adapters' copies are negligible.
pub fn training_state_bytes_with(
    cfg: &ModelConfig,
    training: Training<'_>,
    compute: Compute,
) -> u64 {
    let base = training_state_bytes(cfg, training);
    match training {
        Training::Full { .. } if compute.dtype != DType::F32 => base.saturating_add(
            cfg.num_params()
                .saturating_mul(compute.dtype.size_in_bytes() as u64),
        ),
        _ => base,
    }
}

/// Bytes per token of one decoder layer's activations, in the forward of a mixed-precision
/// pass (`e` bytes a half value) with attention over `keys` keys; f32 where the model
/// computes in f32 (RMSNorm: a widened copy and three f32 values per input value; the scores
/// from the widened copy on: widened, scaled, masked, shifted, exp, normalised, and the
/// product and the narrowed probabilities at `e`). The same itemisation as
/// [`activation_bytes_per_token`], by dtype.
fn half_layer_bytes(cfg: &ModelConfig, e: f64, keys: f64) -> f64 {
    let [d, q, kv, i, h, k] = [
        cfg.hidden_size,
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    ]
    .map(|x| x as f64);
    let half = 6.0 * d + 9.5 * q + 9.5 * kv + 4.0 * i;
    let f32s = 8.0 * d + 4.0 * q + 4.0 * kv + 3.0 * (2.0 + h + k) + 2.0 * h;
    e * half + 4.0 * f32s + h * keys * (2.0 * e + 24.0)
}

/// [`pass_activation_bytes`] for any [`Compute`]. With [`Compute::F32`] it is that count. In
/// half precision (`e` bytes a value) the stored path counts per token `L ×` the layer's
/// bytes by dtype (`half_layer_bytes`) plus, outside the layers, the embedding row (f32 and
/// `e`), the final norm (f32, as the layers'), the logits at `e` and widened to f32, and the
/// constants; the backward's working set is the larger of 1.5 layers and three f32
/// vocabulary rows. Recomputing (`recompute = Some(c)`), a pass keeps `L + 1` hidden rows
/// per token at `e` (each layer's input and the last output) and on top the largest of: one
/// layer recomputed with attention over `min(c, s)` queries at a time (2.5 × the layer:
/// its forward and the backward's 1.5), the head (the logits at `e` and f32, three f32
/// vocabulary rows, the final norm), and the weight-gradient moment of
/// [`pass_activation_bytes`]. Plus 1 % unitemised, as there. An upper bound by construction
/// (each term as the stored path's); `docs/gpu.md` ("Recomputed activations") has figures.
pub fn pass_activation_bytes_with(
    cfg: &ModelConfig,
    training: Training<'_>,
    compute: Compute,
    seq_len: usize,
    tokens: usize,
) -> u64 {
    if compute == Compute::F32 {
        return pass_activation_bytes(cfg, training, seq_len, tokens);
    }
    let e = compute.dtype.size_in_bytes() as f64;
    let (d, v, s, t) = (
        cfg.hidden_size as f64,
        cfg.vocab_size as f64,
        seq_len as f64,
        tokens as f64,
    );
    let layers = cfg.num_hidden_layers as f64;
    let adapters: f64 = match training {
        Training::Full { .. } => 0.0,
        Training::Lora { lora, .. } => targeted_projections(cfg, lora)
            .iter()
            .map(|(_, out, _)| (lora.rank + 2 * out) as f64)
            .sum(),
    };
    let weight_phase = 4.0
        * (largest_trained_matrix(cfg, training) as f64 * WEIGHT_GRADIENT_COPIES as f64 + t * v);
    let head = t * (v * (e + 4.0) + 4.0 * (VOCAB_BACKWARD_ROWS as f64 * v + 4.0 * d + 3.0));
    let itemised = match compute.recompute {
        None => {
            let layer = half_layer_bytes(cfg, e, s);
            let forward = layers * layer
                + adapters * e
                + d * (4.0 + e)
                + 4.0 * (4.0 * d + 3.0)
                + d * e
                + v * (e + 4.0)
                + 2.0 * cfg.head_dim as f64 * e
                + 4.0 * s;
            let backward = (1.5 * layer).max(4.0 * VOCAB_BACKWARD_ROWS as f64 * v);
            t * forward + (t * backward).max(weight_phase)
        }
        Some(c) => {
            let kept = t * (layers + 1.0) * d * e;
            let layer = t
                * 2.5
                * (half_layer_bytes(cfg, e, (c.max(1) as f64).min(s))
                    + adapters * e / layers.max(1.0));
            kept + layer.max(head).max(weight_phase)
        }
    };
    let itemised = itemised.ceil() as u64;
    itemised.saturating_add(itemised / UNITEMISED_DIVISOR)
}

/// [`learner_bytes`] for any [`Compute`]: [`training_state_bytes_with`] plus
/// [`pass_activation_bytes_with`] for the worst case of one sequence filling the pass.
pub fn learner_bytes_with<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    compute: Compute,
    tokens_per_pass: usize,
) -> u64 {
    let training = training.into();
    let seq = tokens_per_pass.min(cfg.max_position_embeddings);
    let act = pass_activation_bytes_with(cfg, training, compute, seq, tokens_per_pass);
    training_state_bytes_with(cfg, training, compute).saturating_add(act)
}

/// Bytes of the training state ([`learner_state_bytes`] for full fine-tuning). With LoRA:
/// `P·s` for the frozen base in its dtype (s bytes a value; no gradient, no moments, and it
/// is the KL reference) plus `20·A` for the A adapter parameters — f32 weights, the pass's
/// gradients, their running sum and the two AdamW moments, as for full training
/// ([`crate::lora::adapter_params`]: `r·(in + out)` per targeted projection).
pub fn training_state_bytes(cfg: &ModelConfig, training: Training<'_>) -> u64 {
    match training {
        Training::Full { with_reference } => learner_state_bytes(cfg, with_reference),
        Training::Lora { lora, base_dtype } => cfg
            .num_params()
            .saturating_mul(base_dtype.size_in_bytes() as u64)
            .saturating_add(adapter_params(cfg, lora).saturating_mul(20)),
    }
}

/// [`activation_bytes_per_token`] plus, with LoRA, what the adapters' forward keeps per
/// token: for each targeted projection the rank-r product `A·x`, the adapter's output and
/// the sum with the base's output (`r + 2·out` values; the α/r scale is applied to `B`, not
/// to the activations). An upper bound like the rest: the frozen base's matmul inputs are
/// kept although only the adapters' gradients need them.
pub fn training_activation_bytes_per_token(
    cfg: &ModelConfig,
    training: Training<'_>,
    seq_len: usize,
) -> u64 {
    let (forward, backward) = training_values_per_token(cfg, training, seq_len);
    4 * (forward + backward)
}

/// (forward, backward) values per token of [`training_activation_bytes_per_token`].
fn training_values_per_token(
    cfg: &ModelConfig,
    training: Training<'_>,
    seq_len: usize,
) -> (u64, u64) {
    let (forward, backward) = activation_values_per_token(cfg, seq_len);
    let adapters: u64 = match training {
        Training::Full { .. } => 0,
        Training::Lora { lora, .. } => targeted_projections(cfg, lora)
            .iter()
            .map(|(_, out, _)| (lora.rank + 2 * out) as u64)
            .sum(),
    };
    (forward.saturating_add(adapters), backward)
}

/// Bytes the learner's training state holds, all in f32 (P = [`ModelConfig::num_params`]):
///
/// `4·P` weights + `4·P` gradients of the pass + `4·P` their running sum over the passes of
/// a micro-batched step + `8·P` AdamW first and second moments (Loshchilov & Hutter,
/// "Decoupled Weight Decay Regularization") = `20·P`, plus `4·P` for a frozen reference copy
/// when the loss has a KL penalty (`with_reference`).
pub fn learner_state_bytes(cfg: &ModelConfig, with_reference: bool) -> u64 {
    let p = cfg.num_params();
    let per_param = if with_reference { 24 } else { 20 };
    p.saturating_mul(per_param)
}

/// Bytes one training token costs between the forward and the end of the backward, in f32,
/// for sequences of `seq_len` tokens: what candle's autograd keeps alive. Counted from the
/// training forward's elementary-op path (`crate::model`), which is what a GPU runs (the
/// CPU's fused kernels keep less, so this is an upper bound there). Every op's output that a
/// later op consumes stays alive until the backward ends; views (reshape, narrow, transpose)
/// share storage and cost nothing. In values per token, with d = hidden, q = heads·head_dim,
/// kv = kv_heads·head_dim, i = intermediate, H = heads, s = `seq_len`, V = vocabulary:
///
/// - per layer `10·d + 11.5·q + 11.5·kv + 4·i + 6·H·s + 3·(2 + H + K) + 2·H`: the two RMSNorms
///   (x², x/rms, ·w: 3·d each), the two residual sums and the o/down projections (4·d); q:
///   its projection, q-norm (3), the head transpose, RoPE (neg of half, cat, two products,
///   sum: 4.5), the attention output and its transpose back (11.5·q, the same for the keys
///   and values less the output: 11.5·kv); SwiGLU's gate, up, silu and product (4·i); the
///   attention scores of every head against the s keys — product, scaled, masked, shifted,
///   exp, normalised (6·H·s, the quadratic term); and the per-row statistics: each RMSNorm
///   row's mean of squares, plus ε and square root (3 values for each of the two norms and
///   each of the H query and K key heads' norms), each attention row's maximum and sum (2·H);
/// - outside the layers `d` (embedding) `+ 3·d + 3` (final norm) `+ V` (the logits: the
///   target token's log-prob is one autograd node that keeps only them,
///   `crate::token_logprobs`) `+ 2·head_dim + s` (the graph's constants, RoPE's cos and sin
///   rows and the causal mask's row, for the worst case of one sequence filling the pass);
/// - the backward's working set on top: the larger of one and a half layers' activations and
///   **three** vocabulary-wide rows. candle builds each gradient as a zero-filled tensor plus
///   the incoming one, and a gradient computed from a forward tensor (a product's) keeps that
///   sum's pieces alive until its node is visited: the log-prob's backward holds three rows of
///   V at once (the logits' gradient, the zero fill and their sum), and a layer's backward
///   0.86–1.24 layers' worth (its gradients and its weights' being built), measured on the
///   CPU's elementary path (the learner's `tests/memory.rs` holds a whole step to the count).
///   Spelled out (divide by the temperature, log-softmax, gather) the vocabulary cost five
///   rows in the forward and seven in the backward.
///
/// The Qwen3-0.6B shape at s = 320: 10.6 MB per token of activations, plus 1.8 MB of
/// backward working set (13.0 MB + 4.3 MB with the spelled-out log-softmax). A pass adds a
/// term of its own ([`pass_activation_bytes`]).
pub fn activation_bytes_per_token(cfg: &ModelConfig, seq_len: usize) -> u64 {
    let (forward, backward) = activation_values_per_token(cfg, seq_len);
    4 * (forward + backward)
}

/// The f32 values per token that [`activation_bytes_per_token`] counts: those the forward
/// keeps for the backward, and the backward's working set.
pub(crate) fn activation_values_per_token(cfg: &ModelConfig, seq_len: usize) -> (u64, u64) {
    let [d, q, kv, i, h, v, s] = [
        cfg.hidden_size,
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.vocab_size,
        seq_len,
    ]
    .map(|x| x as u64);
    let kv_heads = cfg.num_key_value_heads as u64;
    // Twice the per-layer count, to keep the halves of 11.5 in integers.
    let layer2 = 20 * d + 23 * q + 23 * kv + 8 * i + 12 * h * s + 6 * (2 + h + kv_heads) + 4 * h;
    let layers = cfg.num_hidden_layers as u64 * layer2 / 2;
    let outside = 4 * d + 3 + v + 2 * cfg.head_dim as u64 + s;
    let backward = (3 * layer2 / 4).max(VOCAB_BACKWARD_ROWS * v);
    (layers + outside, backward)
}

/// Vocabulary-wide rows per token the backward holds at once (measured, see
/// [`activation_bytes_per_token`]).
const VOCAB_BACKWARD_ROWS: u64 = 3;

/// Copies of the largest trained weight matrix alive while candle builds its gradient
/// (measured): the product `xᵀ·dy`, a zero-filled sum, the sum, and the same zero-fill and sum
/// once more for the variable under the transposed view the forward multiplied by.
const WEIGHT_GRADIENT_COPIES: u64 = 5;

/// Bytes of the activations of one pass of `tokens` tokens in sequences of `seq_len`: the
/// forward's and the backward's per-token counts ([`training_activation_bytes_per_token`]),
/// except that the backward's working set is the larger of its per-token count and the moment
/// the largest trained weight's gradient is built — [`WEIGHT_GRADIENT_COPIES`] copies of that
/// matrix (for full fine-tuning the `V × d` embedding, which the output projection shares or
/// matches; for LoRA the largest adapter matrix) beside the output logits' gradient, one row
/// of V per token. That moment is the larger in short passes: for Qwen3-0.6B full fine-tuning
/// below 2,560 tokens (`5·d/2`, where `5·V·d + t·V` passes `3·V·t`). Plus 1 % for what is not
/// itemised ([`UNITEMISED_DIVISOR`]).
pub fn pass_activation_bytes(
    cfg: &ModelConfig,
    training: Training<'_>,
    seq_len: usize,
    tokens: usize,
) -> u64 {
    let (forward, backward) = training_values_per_token(cfg, training, seq_len);
    let t = tokens as u64;
    let weight_phase = largest_trained_matrix(cfg, training)
        .saturating_mul(WEIGHT_GRADIENT_COPIES)
        .saturating_add(t.saturating_mul(cfg.vocab_size as u64));
    let working = t.saturating_mul(backward).max(weight_phase);
    let itemised = 4 * t.saturating_mul(forward).saturating_add(working);
    itemised.saturating_add(itemised / UNITEMISED_DIVISOR)
}

/// What the count does not itemise, as a fraction of what it does (1 / 100): copies of the
/// graph's small constants a LoRA base makes (its norm weights), the loss's and the batch's
/// own tensors, per-row values of ops not listed above. Measured at 0.2–0.5 % of the itemised
/// activations on the learner's `tests/memory.rs` shapes, with the itemised count 0.4–1.2 %
/// above what the graph keeps (`model::memory_tests`).
const UNITEMISED_DIVISOR: u64 = 100;

/// Values of the largest matrix that gets a gradient.
fn largest_trained_matrix(cfg: &ModelConfig, training: Training<'_>) -> u64 {
    match training {
        Training::Full { .. } => {
            let d = cfg.hidden_size as u64;
            let widest = [
                cfg.vocab_size,
                cfg.intermediate_size,
                cfg.num_attention_heads * cfg.head_dim,
            ]
            .into_iter()
            .max()
            .unwrap_or(0) as u64;
            d * widest
        }
        Training::Lora { lora, .. } => targeted_projections(cfg, lora)
            .iter()
            .map(|(_, out, inp)| (lora.rank * out.max(inp)) as u64)
            .max()
            .unwrap_or(0),
    }
}

/// Bytes of the learner: its training state ([`learner_state_bytes`]) plus the activations
/// of one pass of `tokens_per_pass` padded tokens (the micro-batch budget), counted for the
/// worst case of a single sequence filling the pass (up to the model's context), since the
/// attention scores grow with the square of a sequence's length.
/// The activations are [`pass_activation_bytes`]; for LoRA ([`Training::Lora`]) the state is
/// [`training_state_bytes`].
pub fn learner_bytes<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    tokens_per_pass: usize,
) -> u64 {
    learner_bytes_with(cfg, training, Compute::F32, tokens_per_pass)
}

/// The largest `tokens_per_pass` whose [`learner_bytes`] fits in `free` bytes (0 when not
/// even the training state fits). The need grows with the pass, so a binary search finds it.
pub fn max_tokens_per_pass<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    free: u64,
) -> usize {
    max_tokens_per_pass_with(cfg, training, Compute::F32, free)
}

/// [`max_tokens_per_pass`] for any [`Compute`].
pub fn max_tokens_per_pass_with<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    compute: Compute,
    free: u64,
) -> usize {
    let training = training.into();
    let fits = |t: usize| learner_bytes_with(cfg, training, compute, t) <= free;
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1usize, 1usize << 32);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// `Ok` when the learner with passes of `tokens_per_pass` tokens fits on a device with
/// `free` bytes free and `resident` bytes of it already loaded (the weights, when the check
/// runs after loading them); otherwise an error with both figures (the need split into state
/// and activations) and the largest pass that would fit (the `micro_batch_tokens` to set).
pub fn check_learner_fit<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    tokens_per_pass: usize,
    free: u64,
    resident: u64,
) -> Result<()> {
    check_learner_fit_with(cfg, training, Compute::F32, tokens_per_pass, free, resident)
}

/// [`check_learner_fit`] for any [`Compute`] (mixed precision, recomputed activations).
pub fn check_learner_fit_with<'a>(
    cfg: &ModelConfig,
    training: impl Into<Training<'a>>,
    compute: Compute,
    tokens_per_pass: usize,
    free: u64,
    resident: u64,
) -> Result<()> {
    let training = training.into();
    let need = learner_bytes_with(cfg, training, compute, tokens_per_pass);
    let available = free.saturating_add(resident);
    if need <= available {
        return Ok(());
    }
    let state = training_state_bytes_with(cfg, training, compute);
    let gib = |b: u64| b as f64 / GIB;
    let hint = match max_tokens_per_pass_with(cfg, training, compute, available) {
        0 => "not even the weights, gradients and optimiser state fit: pick a device with more \
              memory or a smaller model"
            .to_string(),
        t if compute.recompute.is_none() => format!(
            "set the learner's micro_batch_tokens to at most {t}, or learner.recompute = true"
        ),
        t => format!("set the learner's micro_batch_tokens to at most {t}"),
    };
    Err(PolicyError::DoesNotFit(format!(
        "the learner needs {:.2} GiB ({:.2} GiB of weights, gradients and optimiser state + \
         {:.2} GiB of activations for passes of {tokens_per_pass} tokens) but the device has \
         {:.2} GiB free (+ {:.2} GiB already loaded); {hint}",
        gib(need),
        gib(state),
        gib(need - state),
        gib(free),
        gib(resident)
    )))
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
/// The rollout slot decodes a snapshot into f32 weights in host memory and copies only the
/// prepared weights to a GPU, so nothing else of the model is on the device.
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
    fn learner_state_bytes_by_hand() {
        assert_eq!(learner_state_bytes(&ModelConfig::tiny(), false), 12_483_840);
        assert_eq!(learner_state_bytes(&ModelConfig::tiny(), true), 14_980_608);
        // 11.10 GiB without, 13.32 GiB with the reference copy.
        assert_eq!(
            learner_state_bytes(&ModelConfig::qwen3_0_6b(), false),
            11_920_998_400
        );
        assert_eq!(
            learner_state_bytes(&ModelConfig::qwen3_0_6b(), true),
            14_305_198_080
        );
    }

    #[test]
    fn activations_by_hand() {
        // Qwen3-0.6B at s = 320, values per token:
        // layer 10·1024 + 11.5·2048 + 11.5·1024 + 4·3072 + 6·16·320 + 3·(2 + 16 + 8) + 2·16
        //       = 88,686; × 28 = 2,483,208
        // outside 4·1024 + 3 + 151,936 + 2·128 + 320 = 156,611
        // backward max(1.5·88,686, 3·151,936) = 455,808
        // (2,483,208 + 156,611 + 455,808) · 4 bytes = 12,382,508 (10.6 MB + 1.8 MB).
        let q = ModelConfig::qwen3_0_6b();
        assert_eq!(activation_bytes_per_token(&q, 320), 12_382_508);
        // What grows with the sequence: the attention scores, 28 · 6 · 16 values per token per
        // position, and the causal mask's row, one (the backward's working set is the
        // vocabulary's here).
        assert_eq!(
            activation_bytes_per_token(&q, 321) - activation_bytes_per_token(&q, 320),
            (28 * 6 * 16 + 1) * 4
        );
        // A pass of 1,024 tokens counts sequences of 1,024 (the worst case), capped at the
        // context for the whole-batch case.
        let full = Training::Full {
            with_reference: false,
        };
        assert_eq!(
            learner_bytes(&q, false, 1024),
            learner_state_bytes(&q, false) + pass_activation_bytes(&q, full, 1024, 1024)
        );
        // From 5·d/2 = 2,560 tokens on, the per-token count decides; plus 1 % unitemised.
        let plus = |b: u64| b + b / 100;
        assert_eq!(
            pass_activation_bytes(&q, full, 4096, 4096),
            plus(4096 * activation_bytes_per_token(&q, 4096))
        );
        let tiny = ModelConfig::tiny();
        assert_eq!(
            learner_bytes(&tiny, false, 10_000),
            learner_state_bytes(&tiny, false)
                + plus(10_000 * activation_bytes_per_token(&tiny, 256))
        );
        // Below 5·d/2 = 2,560 tokens the output projection's gradient decides the working set:
        // 5 copies of the 151,936 × 1,024 embedding beside one vocabulary row per token.
        let (fwd, _) = activation_values_per_token(&q, 100);
        assert_eq!(
            pass_activation_bytes(&q, full, 100, 100),
            plus(4 * (100 * fwd + 5 * 151_936 * 1024 + 100 * 151_936))
        );
        // LoRA trains no vocabulary-wide matrix: its short passes are the per-token count.
        let lora = LoraConfig::new(8, 16.0);
        let t = Training::Lora {
            lora: &lora,
            base_dtype: DType::BF16,
        };
        assert_eq!(
            pass_activation_bytes(&q, t, 100, 100),
            plus(100 * training_activation_bytes_per_token(&q, t, 100))
        );
    }

    #[test]
    fn largest_pass_that_fits() {
        let q = ModelConfig::qwen3_0_6b();
        let free = 78 << 30; // an H100's usable memory
        let t = max_tokens_per_pass(&q, true, free);
        assert!(learner_bytes(&q, true, t) <= free);
        assert!(learner_bytes(&q, true, t + 1) > free);
        assert!((1_000..3_000).contains(&t), "{t}");
        // Not even the state fits: 0.
        assert_eq!(max_tokens_per_pass(&q, false, 10 << 30), 0);
    }

    #[test]
    fn learner_fit_check_names_both_figures_and_the_fix() {
        let q = ModelConfig::qwen3_0_6b();
        let weights = 4 * q.num_params();
        assert!(check_learner_fit(&q, false, 1024, 60 << 30, weights).is_ok());
        // The documented 4 × 8 × 320-token step in one pass does not fit an 80 GB card.
        let e = check_learner_fit(&q, false, 4 * 8 * 320, 70 << 30, weights)
            .unwrap_err()
            .to_string();
        let need = learner_bytes(&q, false, 10_240) as f64 / (1u64 << 30) as f64;
        assert!(e.contains(&format!("needs {need:.2} GiB")), "{e}");
        assert!(e.contains("70.00 GiB free"), "{e}");
        // The figures docs/gpu.md quotes.
        assert!(e.contains("micro_batch_tokens to at most 2065"), "{e}");
        assert!(e.contains("1189.61 GiB of activations"), "{e}");
        let e = check_learner_fit(&q, false, 1024, 1 << 30, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not even the weights"), "{e}");
    }

    #[test]
    fn lora_footprint_by_hand() {
        // Qwen3-0.6B, rank 8 on all seven projections, r·(in + out) each: per layer
        // q 8·(1024 + 2048) + k, v 2·8·(1024 + 1024) + o 8·(2048 + 1024)
        // + gate, up 2·8·(1024 + 3072) + down 8·(3072 + 1024) = 180,224.
        let q = ModelConfig::qwen3_0_6b();
        let lora = LoraConfig::new(8, 16.0);
        let per_layer = 8 * (3072 + 2 * 2048 + 3072 + 3 * 4096);
        assert_eq!(per_layer, 180_224);
        assert_eq!(adapter_params(&q, &lora), 28 * 180_224);
        let t = Training::Lora {
            lora: &lora,
            base_dtype: DType::BF16,
        };
        // base 2·596,049,920 + adapters 20·5,046,272.
        assert_eq!(training_state_bytes(&q, t), 1_192_099_840 + 100_925_440);
        // Per token and layer: 7·8 + 2·(2048 + 1024 + 1024 + 1024 + 3072 + 3072 + 1024)
        // = 56 + 24,576 values, × 28 layers × 4 bytes.
        assert_eq!(
            training_activation_bytes_per_token(&q, t, 320) - activation_bytes_per_token(&q, 320),
            28 * 24_632 * 4
        );
        let act = 1024 * training_activation_bytes_per_token(&q, t, 1024);
        assert_eq!(
            learner_bytes(&q, t, 1024),
            training_state_bytes(&q, t) + act + act / 100
        );
        // The passes `docs/model.md` quotes for an 80 GB card.
        assert_eq!(max_tokens_per_pass(&q, t, 80_000_000_000), 2202);
        // An f32 base on the CPU: 4·P for the base, no reference copy.
        let cpu = Training::Lora {
            lora: &lora,
            base_dtype: DType::F32,
        };
        assert!(training_state_bytes(&q, cpu) < learner_state_bytes(&q, true) / 5);
        assert!(max_tokens_per_pass(&q, t, 78 << 30) > max_tokens_per_pass(&q, true, 78 << 30));
    }

    /// The 4B and 8B figures `docs/model.md` quotes ("LoRA memory").
    #[test]
    fn lora_footprint_of_larger_shapes() {
        let shape = |h, i, tied| ModelConfig {
            hidden_size: h,
            intermediate_size: i,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            tie_word_embeddings: tied,
            ..ModelConfig::qwen3_0_6b()
        };
        let (b4, b8) = (shape(2560, 9728, true), shape(4096, 12288, false));
        assert_eq!(b4.num_params(), 4_022_468_096);
        assert_eq!(b8.num_params(), 8_190_735_360);
        let lora = LoraConfig::new(8, 16.0);
        assert_eq!(adapter_params(&b4, &lora), 16_515_072);
        assert_eq!(adapter_params(&b8, &lora), 21_823_488);
        let bf16 = Training::Lora {
            lora: &lora,
            base_dtype: DType::BF16,
        };
        assert_eq!(training_state_bytes(&b4, bf16), 8_375_237_632); // 7.80 GiB
        assert_eq!(training_state_bytes(&b8, bf16), 16_817_940_480); // 15.66 GiB
        assert_eq!(learner_state_bytes(&b8, true), 196_577_648_640); // 183.08 GiB

        // Passes that fit an 80 GB card (the worst case: one sequence fills the pass).
        assert_eq!(max_tokens_per_pass(&b4, bf16, 80_000_000_000), 1156);
        assert_eq!(max_tokens_per_pass(&b8, bf16, 80_000_000_000), 994);
    }

    /// The paper's models on one H200 (139 GiB usable) at 8,192-token responses (a pass of
    /// one 8,448-token sequence: 256 prompt tokens), `docs/gpu.md` ("The paper's models on
    /// one card").
    #[test]
    fn the_papers_models_on_one_card() {
        let h200: u64 = 139 << 30;
        let pass = 8192 + 256;
        let bf16 = Compute {
            dtype: DType::BF16,
            recompute: None,
        };
        let recompute = Compute {
            recompute: Some(1024),
            ..bf16
        };
        let b4 = ModelConfig::qwen3_4b();
        let b8 = ModelConfig::qwen3_8b();
        assert_eq!(b4.num_params(), 4_022_468_096);
        assert_eq!(b8.num_params(), 8_190_735_360);
        let full = Training::Full {
            with_reference: false,
        };
        let kl = Training::Full {
            with_reference: true,
        };
        // 4B full fine-tuning: bf16 + recompute fits, with the KL reference too; stored
        // activations do not (the attention scores grow with the square of the sequence).
        for t in [full, kl] {
            assert!(check_learner_fit_with(&b4, t, recompute, pass, h200, 0).is_ok());
            let e = check_learner_fit_with(&b4, t, bf16, pass, h200, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("or learner.recompute = true"), "{e}");
            assert!(check_learner_fit(&b4, t, pass, h200, 0).is_err());
        }
        // The half-precision copies: 2·P on top of the 20·P of f32 state.
        assert_eq!(
            training_state_bytes_with(&b4, full, bf16) - learner_state_bytes(&b4, false),
            2 * b4.num_params()
        );
        // 8B LoRA r = 16 on a bf16 base fits with room to spare.
        let lora = LoraConfig::new(16, 32.0);
        let lora8 = Training::Lora {
            lora: &lora,
            base_dtype: DType::BF16,
        };
        let need = learner_bytes_with(&b8, lora8, recompute, pass);
        assert!(need < h200 / 2, "{need}");
        // 8B full fine-tuning and 32B do not fit one card: not even their state.
        for (cfg, name) in [(&b8, "8B"), (&ModelConfig::qwen3_32b(), "32B")] {
            let e = check_learner_fit_with(cfg, full, recompute, pass, h200, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not even the weights"), "{name}: {e}");
            assert!(
                training_state_bytes_with(cfg, full, recompute) > h200,
                "{name}"
            );
        }
        // Recomputing keeps the activations of a pass far below the stored path's.
        let stored = pass_activation_bytes_with(&b4, full, bf16, pass, pass);
        let kept = pass_activation_bytes_with(&b4, full, recompute, pass, pass);
        assert!(kept * 10 < stored, "{kept} vs {stored}");
        // A smaller chunk needs less; f32 with recompute more than bf16.
        let small = Compute {
            recompute: Some(256),
            ..bf16
        };
        assert!(
            pass_activation_bytes_with(&b4, full, small, pass, pass)
                <= pass_activation_bytes_with(&b4, full, recompute, pass, pass)
        );
        let f32_recompute = Compute {
            dtype: DType::F32,
            recompute: Some(1024),
        };
        assert!(
            pass_activation_bytes_with(&b4, full, f32_recompute, pass, pass)
                > pass_activation_bytes_with(&b4, full, recompute, pass, pass)
        );
        // F32 and stored is the existing count, to the byte.
        let q = ModelConfig::qwen3_0_6b();
        assert_eq!(
            learner_bytes_with(&q, full, Compute::F32, 4096),
            learner_bytes(&q, false, 4096)
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
