//! The Qwen3 / Qwen2 decoder, written with gradient-carrying candle ops only.
//!
//! A pitfall checked against candle 0.9 (`docs/model.md`): candle-nn's fused `rms_norm`, `softmax_last_dim` and `rope` kernels have no
//! backward pass. This module therefore spells RMSNorm, RoPE (rotate-half form) and softmax out
//! in elementary tensor ops, and attention is a plain `matmul`. The `every_variable_gets_a_gradient`
//! test guards this.
//!
//! On contiguous f32 CPU tensors, RMSNorm, RoPE (fused with the head transpose), the causal
//! softmax and log-softmax run as fused custom ops with hand-written backward passes
//! ([`cpu_ops`]); the elementary formulation below stays the reference and the path on other
//! devices. Grouped-query attention never materialises repeated K/V: the query heads that
//! share a KV head are stacked along the sequence axis, a free reshape.
//!
//! Weight names follow Hugging Face (`model.layers.{i}.self_attn.q_proj.weight`, ...).
//!
//! Must not touch: sampling, tokenizers, the optimiser or I/O.

mod cpu_ops;
mod frozen_linear;
mod kv_rows;
mod positions;
mod recompute;
mod target_logprob;
pub(crate) use kv_rows::{repeat_kv_rows, select_kv_rows};
pub use recompute::{LayerInputs, DEFAULT_QUERY_CHUNK};
pub(crate) use target_logprob::target_logprobs;
#[cfg(test)]
pub(crate) mod fused_tests;
#[cfg(test)]
mod memory_tests;
#[cfg(test)]
pub(crate) mod precision_tests;

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Tensor, Var, D};
use candle_nn::{Embedding, Linear};

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};
use crate::lora::LoraConfig;
use positions::{apply_rope, Positions};

/// Makes this thread's model forwards take the elementary-op path even on the CPU (`true`),
/// or the fused CPU kernels again (`false`, the default). The elementary path is what a GPU
/// runs, so a CPU measurement of its memory (`train_step --elementary`) is the GPU's graph.
/// Per thread, so that one caller's measurement changes no other thread's forwards.
pub fn use_elementary_ops(on: bool) {
    cpu_ops::ELEMENTARY_ONLY.with(|c| c.set(on));
}

/// The dtype the decoder's activations are computed in by default (f32 compute,
/// [`Qwen3::compute_dtype`]; mixed precision computes in f16 or bf16, see [`check_compute_dtype`]).
/// Weights are f32 too, except a frozen base held in bf16 on a GPU
/// ([`crate::lora::frozen_base_dtype`]): its projections return this dtype
/// (`frozen_linear`), its norm weights are widened once when the module is built (`[hidden]`
/// vectors) and its embedding rows are widened as they are looked up.
pub(crate) const ACTIVATION_DTYPE: DType = DType::F32;

/// The name and shape of every trainable tensor of a config, in a fixed order.
pub fn param_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        if cfg.attention_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        if cfg.qk_norm() {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim]));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((
            format!("{p}.mlp.gate_proj.weight"),
            vec![cfg.intermediate_size, h],
        ));
        out.push((
            format!("{p}.mlp.up_proj.weight"),
            vec![cfg.intermediate_size, h],
        ));
        out.push((
            format!("{p}.mlp.down_proj.weight"),
            vec![h, cfg.intermediate_size],
        ));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
}

/// The low-rank adapters a module is built with: their variables and configuration.
pub(crate) struct LoraVars<'a> {
    pub(crate) vars: &'a HashMap<String, Var>,
    pub(crate) cfg: &'a LoraConfig,
}

/// Looks weights up by name in a map of variables; never creates one silently.
struct Weights<'a> {
    vars: &'a HashMap<String, Var>,
    /// Hand out detached views (same storage, no gradient tracking): see [`Qwen3::build_frozen`].
    frozen: bool,
    /// Adapters on the targeted projections. With adapters the base weights are always
    /// detached (frozen base); the adapters follow `frozen`.
    lora: Option<LoraVars<'a>>,
}

fn lookup(
    vars: &HashMap<String, Var>,
    name: &str,
    shape: &[usize],
    detach: bool,
) -> Result<Tensor> {
    let var = vars
        .get(name)
        .ok_or_else(|| PolicyError::Weights(format!("missing tensor {name}")))?;
    if var.dims() != shape {
        return Err(PolicyError::Weights(format!(
            "tensor {name} has shape {:?}, expected {shape:?}",
            var.dims()
        )));
    }
    Ok(if detach {
        var.as_tensor().detach()
    } else {
        var.as_tensor().clone()
    })
}

impl Weights<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        lookup(self.vars, name, shape, self.frozen || self.lora.is_some())
    }

    fn linear(&self, prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Proj> {
        let w = self.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let b = if bias {
            Some(self.get(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        let target = prefix.rsplit('.').next().unwrap_or_default();
        let lora = match &self.lora {
            Some(l) if l.cfg.targets(target) => {
                let r = l.cfg.rank;
                let a = lookup(
                    l.vars,
                    &format!("{prefix}.lora_A.weight"),
                    &[r, in_dim],
                    self.frozen,
                )?;
                let b = lookup(
                    l.vars,
                    &format!("{prefix}.lora_B.weight"),
                    &[out_dim, r],
                    self.frozen,
                )?;
                Some((Linear::new(a, None), Linear::new(b, None), l.cfg.scale()))
            }
            _ => None,
        };
        Ok(Proj {
            base: Linear::new(w, b),
            lora,
            frozen: self.lora.is_some(),
        })
    }
}

/// A linear projection, with a low-rank adapter when targeted: `W·x + (α/r)·B·(A·x)`.
#[derive(Debug, Clone)]
struct Proj {
    base: Linear,
    /// `A` `[r, in]`, `B` `[out, r]` (as bias-free linears) and the scale α/r.
    lora: Option<(Linear, Linear, f64)>,
    /// The base weight is frozen (a LoRA model): it runs as [`frozen_linear::frozen_linear`]
    /// (CPU and CUDA), whose backward computes no weight gradient.
    frozen: bool,
}

impl Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.base.weight();
        let dt = x.dtype();
        // A weight in another dtype than the activations that is not an f32 master weight is
        // a frozen bf16 base (never trained): the frozen linear converts. candle's matmul
        // would compute (and keep) the frozen weight's gradient.
        let y = if self.frozen || (w.dtype() != dt && w.dtype() != DType::F32) {
            let y = frozen_linear::frozen_linear(x, w)?;
            match self.base.bias() {
                Some(b) => y.broadcast_add(&b.to_dtype(y.dtype())?)?,
                None => y,
            }
        } else if w.dtype() != dt {
            // Mixed precision: the matmul runs on a low-precision copy of the f32 master
            // weight. The cast is a recorded op, so the weight's gradient arrives in f32.
            let b = self.base.bias().map(|b| b.to_dtype(dt)).transpose()?;
            Linear::new(w.to_dtype(dt)?, b).forward(x)?
        } else {
            self.base.forward(x)?
        };
        match &self.lora {
            None => Ok(y),
            Some((a, b, scale)) => {
                // The scale goes on B (`[out, r]`, a small tensor) rather than on the
                // `[tokens, out]` product: one activation fewer kept for the backward.
                let a = Linear::new(a.weight().to_dtype(dt)?, None);
                let b = Linear::new(b.weight().affine(*scale, 0.0)?.to_dtype(dt)?, None);
                Ok((y + b.forward(&a.forward(x)?)?)?)
            }
        }
    }
}

/// `t` as an operand of recorded ops (`recording`: the forward builds a gradient graph) that
/// no gradient should reach: a constant — the RoPE tables, the causal mask, a detached
/// softmax maximum.
///
/// candle 0.9's backward (`backprop.rs`) computes a gradient for *every* operand of a recorded
/// op, and only visits — and so frees — those of tracked nodes. An untracked operand's
/// gradient, as large as the op's output after a broadcast (`[b, heads, t, s]` for the mask,
/// `[b, t, vocab]` for log-softmax's maximum), stays in the returned `GradStore`, and it still
/// holds the ops that computed it, so the whole forward graph with it. Made a variable, the
/// constant is a tracked leaf: its broadcast's gradient is reduced to its own small shape and
/// freed during the backward (`docs/gpu.md`, "Learner memory"). Without a graph it is `t`.
pub(crate) fn graph_constant(t: Tensor, recording: bool) -> Result<Tensor> {
    Ok(if recording {
        Var::from_tensor(&t)?.into_inner()
    } else {
        t
    })
}

/// RMSNorm, `x / sqrt(mean(x²) + eps) * w`, in differentiable elementary ops.
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// In f32 whatever `x`'s dtype (a half-precision input is widened and the result
    /// narrowed back: the mean of squares of a row loses too much in f16/bf16).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let x = x.to_dtype(DType::F32)?;
        if cpu_ops::applies(&x) {
            return Ok(cpu_ops::rms_norm(&x, &self.weight, self.eps)?.to_dtype(dt)?);
        }
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let x = x.broadcast_div(&(ms + self.eps)?.sqrt()?)?;
        Ok(x.broadcast_mul(&self.weight)?.to_dtype(dt)?)
    }
}

/// Numerically stable softmax over the last dimension; the max is detached (it cancels
/// mathematically), everything else carries gradients.
pub(crate) fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = graph_constant(x.max_keepdim(D::Minus1)?.detach(), x.track_op())?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Differentiable log-softmax over the last dimension.
pub fn log_softmax_last(x: &Tensor) -> Result<Tensor> {
    if cpu_ops::applies(x) {
        return Ok(cpu_ops::log_softmax(x)?);
    }
    let max = graph_constant(x.max_keepdim(D::Minus1)?.detach(), x.track_op())?;
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// Key/value cache for incremental decoding: per layer `[b, kv_heads, len, head_dim]`.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model with `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        KvCache {
            layers: vec![None; n_layers],
            len: 0,
        }
    }

    /// Number of positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Repeats a batch-1 cache `n` times along the batch dimension (prefill once, decode `n`).
    pub fn repeat_batch(&mut self, n: usize) -> Result<()> {
        repeat_kv_rows(self.layers.iter_mut().flatten(), n)
    }

    /// Keeps only the given batch rows (in that order).
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        select_kv_rows(self.layers.iter_mut().flatten(), rows)
    }

    /// Whether any cached key or value records an op graph (it must not: see
    /// [`Qwen3::forward_cached`]).
    #[cfg(test)]
    pub(crate) fn carries_graph(&self) -> bool {
        self.layers
            .iter()
            .flatten()
            .any(|(k, v)| k.track_op() || v.track_op())
    }
}

#[derive(Debug, Clone)]
struct Attention {
    q_proj: Proj,
    k_proj: Proj,
    v_proj: Proj,
    o_proj: Proj,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
}

/// The attention block's queries, keys and values after their norms and RoPE:
/// `[b, heads, t, head_dim]` (queries, contiguous) and `[b, kv_heads, s, head_dim]`, with the
/// score scale still to apply (1 where the fused RoPE folded it into the queries).
struct Qkv {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: f64,
}

impl Attention {
    fn forward(
        &self,
        x: &Tensor,
        pos: &Positions,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let a = self.qkv(x, pos, cache)?;
        let y = self.core(&a.q, &a.k, &a.v, a.scale, pos, None)?;
        self.out(&y)
    }

    /// Projections, q/k norms, RoPE and the KV cache.
    fn qkv(
        &self,
        x: &Tensor,
        pos: &Positions,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Qkv> {
        let (b, t, _) = x.dims3()?;
        let q = self
            .q_proj
            .forward(x)?
            .reshape((b, t, self.n_heads, self.head_dim))?;
        let k = self
            .k_proj
            .forward(x)?
            .reshape((b, t, self.n_kv, self.head_dim))?;
        let v = self
            .v_proj
            .forward(x)?
            .reshape((b, t, self.n_kv, self.head_dim))?;
        // Qwen3: per-head RMSNorm of queries and keys, before RoPE.
        let q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => n.forward(&k)?,
            None => k,
        };
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        // Fused path: the 1/sqrt(d) score scale is folded into the queries' RoPE kernel.
        let (q, k, scale) = match (&pos.fused, &pos.cos_sin) {
            (Some(tab), _) => (
                cpu_ops::rope_to_heads(&q, tab, scale)?,
                cpu_ops::rope_to_heads(&k, tab, 1.0)?,
                1.0,
            ),
            (None, Some((cos, sin))) => (
                apply_rope(&q.transpose(1, 2)?.contiguous()?, cos, sin)?,
                apply_rope(&k.transpose(1, 2)?.contiguous()?, cos, sin)?,
                scale,
            ),
            (None, None) => return Err(PolicyError::Sampling("no RoPE tables".into())),
        };
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match cache {
            Some(slot) => {
                let (k, v) = match slot.take() {
                    Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                    None => (k, v),
                };
                // The cache keeps detached tensors. Generation differentiates nothing, and a
                // cached K/V that kept its op graph would keep every earlier copy of the cache
                // and every step's activations alive: memory quadratic in the length.
                *slot = Some((k.detach(), v.detach()));
                (k, v)
            }
            None => (k, v),
        };
        Ok(Qkv { q, k, v, scale })
    }

    /// Attention of the queries `q` `[b, heads, c, d]` against `k`, `v`: `[b, heads, c, d]`.
    /// `rows`: `None` for all of the forward's queries (the mask of `pos`), or `Some(r0)` for
    /// a chunk of queries starting at row `r0` of the forward, which attends only to the
    /// `offset + r0 + c` keys its causal mask lets it see.
    ///
    /// Grouped-query attention: query heads h·rep..(h+1)·rep share KV head h (Hugging Face
    /// order), so stacking them along the sequence axis — a free reshape of the contiguous
    /// `[b, heads, c, d]` queries — lets one batched matmul per KV head serve all of them,
    /// instead of materialising `rep` copies of K and V (and summing their gradients back).
    /// Half-precision scores are widened to f32 for the softmax, whose probabilities are
    /// narrowed back for the product with the values.
    fn core(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f64,
        pos: &Positions,
        rows: Option<usize>,
    ) -> Result<Tensor> {
        let (b, _, c, _) = q.dims4()?;
        let dt = q.dtype();
        let (k, v) = match rows {
            Some(r0) => {
                let keys = (pos.offset + r0 + c).min(k.dim(2)?);
                (
                    k.narrow(2, 0, keys)?.contiguous()?,
                    v.narrow(2, 0, keys)?.contiguous()?,
                )
            }
            None => (k.clone(), v.clone()),
        };
        let rep = self.n_heads / self.n_kv;
        let s = k.dim(2)?;
        let qg = q.reshape((b, self.n_kv, rep * c, self.head_dim))?;
        let scores = qg.matmul(&k.t()?)?.reshape((b, self.n_heads, c, s))?;
        let offset = pos.offset + rows.unwrap_or(0);
        let probs = if pos.fused.is_some() {
            cpu_ops::causal_softmax(&scores, offset)?
        } else {
            let scores = (scores.to_dtype(DType::F32)? * scale)?;
            let mask = match rows {
                None => pos.mask.clone(),
                Some(_) if c > 1 || offset + 1 < s => Some(graph_constant(
                    Tensor::from_vec(positions::causal_mask(c, offset), (c, s), q.device())?,
                    q.track_op(),
                )?),
                Some(_) => None,
            };
            let scores = match &mask {
                Some(m) => scores.broadcast_add(m)?,
                None => scores,
            };
            softmax_last(&scores)?.to_dtype(dt)?
        };
        Ok(probs
            .reshape((b, self.n_kv, rep * c, s))?
            .matmul(&v)?
            .reshape((b, self.n_heads, c, self.head_dim))?)
    }

    /// The output projection of the heads' outputs `y` `[b, heads, t, d]`.
    fn out(&self, y: &Tensor) -> Result<Tensor> {
        let (b, _, t, _) = y.dims4()?;
        let y = y
            .transpose(1, 2)?
            .reshape((b, t, self.n_heads * self.head_dim))?;
        self.o_proj.forward(&y)
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: Proj,
    up_proj: Proj,
    down_proj: Proj,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = self.gate_proj.forward(x)?;
        let u = self.up_proj.forward(x)?;
        let h = if cpu_ops::applies(&g) {
            cpu_ops::swiglu(&g, &u)?
        } else {
            (g.silu()? * u)?
        };
        self.down_proj.forward(&h)
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Tensor,
        pos: &Positions,
        slot: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let h = self.input_layernorm.forward(x)?;
        let h = self.self_attn.forward(&h, pos, slot)?;
        self.post(x, h)
    }

    /// The queries, keys and values of the layer's input `x`.
    fn qkv(&self, x: &Tensor, pos: &Positions) -> Result<Qkv> {
        let h = self.input_layernorm.forward(x)?;
        self.self_attn.qkv(&h, pos, None)
    }

    /// The layer's output from its input `x` and the attention block's output `attn`
    /// (after the output projection): the residual sum, then the MLP and its residual.
    fn post(&self, x: &Tensor, attn: Tensor) -> Result<Tensor> {
        let x = (x + attn)?;
        let h = self.post_attention_layernorm.forward(&x)?;
        Ok((&x + self.mlp.forward(&h)?)?)
    }
}

/// The decoder-only transformer (Qwen3, or Qwen2 when the config says so).
#[derive(Debug, Clone)]
pub struct Qwen3 {
    cfg: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Proj,
    device: Device,
    /// Its forwards record a gradient graph: built over variables, not detached views (a LoRA
    /// model records from the first adapter on, although its embedding is frozen).
    records: bool,
    /// The dtype of the activations and matmuls ([`Qwen3::with_compute_dtype`]).
    compute: DType,
}

/// `Ok` when the decoder can compute in `dtype` on `device`: f32 anywhere; f16 anywhere
/// (candle's CPU has an f16 matmul); bf16 on CUDA only (the CPU has no bf16 matmul).
pub fn check_compute_dtype(dtype: DType, device: &Device) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 => Ok(()),
        DType::BF16 if !device.is_cpu() => Ok(()),
        DType::BF16 => Err(PolicyError::Weights(
            "bf16 compute needs a GPU: candle's CPU has no bf16 matmul (use f16 or f32)".into(),
        )),
        other => Err(PolicyError::Weights(format!(
            "the decoder computes in f32, f16 or bf16, not {other:?}"
        ))),
    }
}

impl Qwen3 {
    /// Builds the module over existing variables (names as in [`param_shapes`]). The module
    /// shares storage with the variables, so optimiser updates are seen immediately.
    /// With `lora`, the targeted projections carry its adapters and the base weights are
    /// detached views: gradients reach the adapters only.
    pub(crate) fn build(
        cfg: &ModelConfig,
        vars: &HashMap<String, Var>,
        lora: Option<LoraVars<'_>>,
        device: &Device,
    ) -> Result<Self> {
        Self::build_with(
            cfg,
            Weights {
                vars,
                frozen: false,
                lora,
            },
            device,
        )
    }

    /// The same module over detached views of the variables: it shares their storage (so it
    /// sees every optimiser update) but no op it runs records a gradient graph. For forwards
    /// whose result is never differentiated — generation with the training forward, the KL
    /// reference, spot checks — whose graph would otherwise keep every activation alive until
    /// the result is dropped.
    pub(crate) fn build_frozen(
        cfg: &ModelConfig,
        vars: &HashMap<String, Var>,
        lora: Option<LoraVars<'_>>,
        device: &Device,
    ) -> Result<Self> {
        Self::build_with(
            cfg,
            Weights {
                vars,
                frozen: true,
                lora,
            },
            device,
        )
    }

    fn build_with(cfg: &ModelConfig, w: Weights<'_>, device: &Device) -> Result<Self> {
        cfg.validate()?;
        let h = cfg.hidden_size;
        let norm = |name: &str, size: usize| -> Result<RmsNorm> {
            // A no-op (shared storage) for f32 weights; a bf16 base's `[size]` vector is
            // widened once.
            let weight = w.get(name, &[size])?.to_dtype(ACTIVATION_DTYPE)?;
            // A frozen weight in a recording model (LoRA's base) is a constant of the graph.
            let constant = !w.frozen && !weight.is_variable();
            Ok(RmsNorm {
                weight: graph_constant(weight, constant)?,
                eps: cfg.rms_norm_eps,
            })
        };
        let embed = w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let q = cfg.num_attention_heads * cfg.head_dim;
        let kv = cfg.num_key_value_heads * cfg.head_dim;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let (q_norm, k_norm) = if cfg.qk_norm() {
                (
                    Some(norm(&format!("{a}.q_norm.weight"), cfg.head_dim)?),
                    Some(norm(&format!("{a}.k_norm.weight"), cfg.head_dim)?),
                )
            } else {
                (None, None)
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                self_attn: Attention {
                    q_proj: w.linear(&format!("{a}.q_proj"), q, h, cfg.attention_bias)?,
                    k_proj: w.linear(&format!("{a}.k_proj"), kv, h, cfg.attention_bias)?,
                    v_proj: w.linear(&format!("{a}.v_proj"), kv, h, cfg.attention_bias)?,
                    o_proj: w.linear(&format!("{a}.o_proj"), h, q, false)?,
                    q_norm,
                    k_norm,
                    n_heads: cfg.num_attention_heads,
                    n_kv: cfg.num_key_value_heads,
                    head_dim: cfg.head_dim,
                },
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                mlp: Mlp {
                    gate_proj: w.linear(
                        &format!("{p}.mlp.gate_proj"),
                        cfg.intermediate_size,
                        h,
                        false,
                    )?,
                    up_proj: w.linear(
                        &format!("{p}.mlp.up_proj"),
                        cfg.intermediate_size,
                        h,
                        false,
                    )?,
                    down_proj: w.linear(
                        &format!("{p}.mlp.down_proj"),
                        h,
                        cfg.intermediate_size,
                        false,
                    )?,
                },
            });
        }
        let lm_head = Proj {
            base: if cfg.tie_word_embeddings {
                Linear::new(embed.clone(), None)
            } else {
                Linear::new(w.get("lm_head.weight", &[cfg.vocab_size, h])?, None)
            },
            lora: None,
            frozen: w.lora.is_some(),
        };
        Ok(Qwen3 {
            cfg: cfg.clone(),
            embed_tokens: Embedding::new(embed, h),
            layers,
            norm: norm("model.norm.weight", h)?,
            lm_head,
            device: device.clone(),
            records: !w.frozen,
            compute: ACTIVATION_DTYPE,
        })
    }

    /// The same module computing in `dtype` ([`check_compute_dtype`]): mixed precision for
    /// f16/bf16. The weights stay what they are (f32 master weights, or a frozen bf16 base);
    /// each matmul runs on a copy of its weight cast to `dtype` (a recorded op: the weight's
    /// gradient arrives in f32), the residual stream, projections, RoPE and SwiGLU are in
    /// `dtype`, while RMSNorm, the attention softmax and the logits are f32 (the forward
    /// returns f32 logits, so the log-softmax, the loss and the importance ratios are f32).
    pub fn with_compute_dtype(mut self, dtype: DType) -> Result<Self> {
        check_compute_dtype(dtype, &self.device)?;
        self.compute = dtype;
        Ok(self)
    }

    /// The dtype the forward computes in (f32 unless [`Qwen3::with_compute_dtype`]).
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// Full-sequence forward: `ids` `[b, t]` (u32) → logits `[b, t, vocab]` at every position.
    /// Causal; rows may be right-padded (padding never influences earlier positions).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_inner(ids, None, false)
    }

    /// Incremental forward: appends `ids` `[b, t]` after the `cache.len()` cached positions
    /// and returns logits `[b, t, vocab]` for the new positions. For generation: the cache
    /// keeps detached keys and values (no gradient flows into earlier positions).
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        if cache.layers.len() != self.layers.len() {
            return Err(PolicyError::Sampling(format!(
                "cache has {} layers, model has {}",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        self.forward_inner(ids, Some(cache), false)
    }

    /// Like [`Self::forward_cached`] but returns logits `[b, 1, vocab]` of the last new
    /// position only (generation: avoids a `[t, vocab]` projection of the whole prompt).
    pub fn forward_cached_last(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        if cache.layers.len() != self.layers.len() {
            return Err(PolicyError::Sampling(format!(
                "cache has {} layers, model has {}",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        self.forward_inner(ids, Some(cache), true)
    }

    fn forward_inner(
        &self,
        ids: &Tensor,
        mut cache: Option<&mut KvCache>,
        last_only: bool,
    ) -> Result<Tensor> {
        let offset = cache.as_ref().map_or(0, |c| c.len);
        let t = self.check_ids(ids, offset)?;
        let mut x = self.embed(ids)?;
        let pos = self.positions(&x, offset, t)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let slot = cache.as_mut().map(|c| &mut c.layers[i]);
            x = layer.forward(&x, &pos, slot)?;
        }
        if let Some(c) = cache {
            c.len += t;
        }
        let x = if last_only && t > 1 {
            x.narrow(1, t - 1, 1)?
        } else {
            x
        };
        self.head(&x)
    }

    /// Validates `ids` `[b, t]` for a forward after `offset` cached positions; returns `t`.
    fn check_ids(&self, ids: &Tensor, offset: usize) -> Result<usize> {
        let (_b, t) = ids.dims2()?;
        if t == 0 {
            return Err(PolicyError::Sampling("empty input".into()));
        }
        if offset + t > self.cfg.max_position_embeddings {
            return Err(PolicyError::Sampling(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                offset + t,
                self.cfg.max_position_embeddings
            )));
        }
        let max_id = ids.max_all()?.to_dtype(DType::U32)?.to_scalar::<u32>()?;
        if max_id as usize >= self.cfg.vocab_size {
            return Err(PolicyError::Sampling(format!(
                "token id {max_id} is outside the vocabulary ({})",
                self.cfg.vocab_size
            )));
        }
        Ok(t)
    }

    /// The checked ids' embeddings in the compute dtype.
    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.embed_tokens.forward(ids)?.to_dtype(self.compute)?)
    }

    /// The position data of a forward of `t` positions after `offset` whose first hidden
    /// state is `x`.
    fn positions(&self, x: &Tensor, offset: usize, t: usize) -> Result<Positions> {
        Positions::new(
            &self.cfg,
            offset,
            t,
            cpu_ops::applies(x),
            self.records,
            x.dtype(),
            &self.device,
        )
    }

    /// Final norm and output projection: f32 logits.
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.norm.forward(x)?;
        Ok(self.lm_head.forward(&x)?.to_dtype(DType::F32)?)
    }
}
