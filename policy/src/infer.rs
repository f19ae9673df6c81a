//! The gradient-free generation path: the policy's weights run with candle's fused kernels
//! (`rms_norm`, `softmax_last_dim`, `rope`), fused q/k/v and gate/up projections, grouped-query
//! attention without materialising repeated keys, a preallocated KV cache written in place,
//! and half-precision weights on CUDA.
//!
//! Owns: [`InferModel`] (a read-only copy/view of a [`Policy`]'s weights in one dtype), its
//! cache, and [`generate`] (prefill once, decode `n` rows in lockstep, rows that stop drop out);
//! [`batch`]: static per-bucket buffers and many groups decoded in one batch.
//!
//! Must not touch: the training forward (`crate::model`), which stays the reference the
//! learner differentiates. Sampled log-probs follow the convention of [`crate::sampling`]; in
//! f32 they equal the training forward's to ~1e-6 (tested to 1e-4); in bf16/f16 they differ by
//! the rounding of the weights and activations (`examples/gen_bench.rs` measures the spread).
//!
//! Build an [`InferModel`] once per installed snapshot: on the CPU in f32 it shares the
//! policy's storage except for the fused projections (copied once); in half precision it is
//! a converted copy.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;
use rand::Rng;

use crate::config::ModelConfig;
use crate::draw::Draws;
use crate::error::{PolicyError, Result};
use crate::sampling::{host_logits, Completion, SamplingParams};
use crate::weights::Policy;

/// The layer dimensions a forward pass uses, from the config once: heads, KV heads, head
/// dimension, query heads per KV head, query and KV widths, MLP width.
#[derive(Debug, Clone, Copy)]
struct Dims {
    nh: usize,
    nkv: usize,
    hd: usize,
    rep: usize,
    qd: usize,
    kvd: usize,
    inter: usize,
}

impl Dims {
    fn of(cfg: &ModelConfig) -> Self {
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        Dims {
            nh,
            nkv,
            hd,
            rep: nh / nkv,
            qd: nh * hd,
            kvd: nkv * hd,
            inter: cfg.intermediate_size,
        }
    }
}

/// The dtype the inference path uses by default on `device`: bf16 on CUDA (tensor cores, half
/// the memory traffic of decoding), f32 on the CPU (no fast half-precision matmul there, and
/// exact agreement with the learner).
pub fn default_dtype(device: &Device) -> DType {
    if device.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    }
}

#[derive(Debug, Clone)]
struct Layer {
    ln1: Tensor,
    /// `[q + 2·kv, hidden]`: q_proj, k_proj and v_proj stacked (one matmul per step).
    qkv: Tensor,
    qkv_bias: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    o: Tensor,
    ln2: Tensor,
    /// `[2·intermediate, hidden]`: gate_proj and up_proj stacked.
    gate_up: Tensor,
    down: Tensor,
}

/// How to prepare an [`InferModel`]: the dtype of the weights and activations, whether the
/// final norm and the output projection run in f32, and the device.
#[derive(Debug, Clone)]
pub struct InferSpec {
    /// Weights and activations of the decoder layers: F32, BF16 (CUDA only) or F16.
    pub dtype: DType,
    /// Run the final RMSNorm and the output projection (`lm_head`) in f32 even when `dtype`
    /// is half precision: the logits then carry no half-precision rounding of their own, at
    /// the price of an f32 copy of the output projection (`vocab · hidden · 4` bytes) and an
    /// f32 matmul. Off by default: measured in f16 on the CPU it lowered the mean log-prob
    /// spread of a briefly trained model but not its maximum, which the decoder layers'
    /// rounding sets (`docs/gpu.md`, "Half precision and the f32 head").
    pub f32_head: bool,
    /// Where the prepared weights live. The policy may live elsewhere (e.g. a snapshot decoded
    /// into host memory): tensors are converted where the policy is, then copied over, so the
    /// f32 weights never occupy this device.
    pub device: Device,
}

impl InferSpec {
    /// The default for `device`: [`default_dtype`], no f32 head.
    pub fn for_device(device: &Device) -> Self {
        InferSpec {
            dtype: default_dtype(device),
            f32_head: false,
            device: device.clone(),
        }
    }
}

/// A policy's weights prepared for generation (no gradients) in one dtype on one device.
#[derive(Debug, Clone)]
pub struct InferModel {
    cfg: ModelConfig,
    dtype: DType,
    device: Device,
    /// Embedding table used for lookups (in `dtype`, or the f32 `lm_head` itself when tied
    /// and `f32_head`).
    embed: Tensor,
    layers: Vec<Layer>,
    /// Final norm and output projection, in f32 when the spec asks for an f32 head.
    norm: Tensor,
    lm_head: Tensor,
    /// `[max_position_embeddings, head_dim / 2]` RoPE tables (rotate-half layout).
    cos: Tensor,
    sin: Tensor,
}

/// Preallocated keys/values per layer, `[b, kv_heads, capacity, head_dim]`, filled up to `len`.
#[derive(Debug, Clone)]
pub struct InferCache {
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
    capacity: usize,
}

impl InferCache {
    /// Positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows (sequences) in the cache.
    pub fn batch(&self) -> Result<usize> {
        match self.layers.first() {
            Some((k, _)) => Ok(k.dim(0)?),
            None => Ok(0),
        }
    }

    /// An independent copy with its own buffers (the cache is written in place, so a plain
    /// clone would share them): prefill once, then continue several episodes from it.
    pub fn deep_copy(&self) -> Result<Self> {
        Ok(InferCache {
            layers: self
                .layers
                .iter()
                .map(|(k, v)| Ok((k.copy()?, v.copy()?)))
                .collect::<Result<Vec<_>>>()?,
            len: self.len,
            capacity: self.capacity,
        })
    }

    /// Repeats a batch-1 cache `n` times (prefill the prompt once, decode `n` samples).
    pub fn repeat_batch(&mut self, n: usize) -> Result<()> {
        crate::model::repeat_kv_rows(self.layers.iter_mut(), n)
    }

    /// Keeps only the given rows, in that order.
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        crate::model::select_kv_rows(self.layers.iter_mut(), rows)
    }

    /// Writes `k`, `v` (`[b, kv, t, d]`) of layer `i` at `len` and returns the filled prefix.
    fn append(&mut self, i: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        if self.len + t > self.capacity {
            return Err(PolicyError::Sampling(format!(
                "KV cache capacity {} exceeded",
                self.capacity
            )));
        }
        let (kb, vb) = &self.layers[i];
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        Ok((
            kb.narrow(2, 0, self.len + t)?,
            vb.narrow(2, 0, self.len + t)?,
        ))
    }
}

impl InferModel {
    /// Prepares `policy`'s current weights with [`InferSpec::for_device`] of its device.
    pub fn from_policy(policy: &Policy) -> Result<Self> {
        Self::build(policy, &InferSpec::for_device(policy.device()))
    }

    /// Prepares `policy`'s current weights in `dtype` (F32, BF16 or F16; BF16 on CUDA only) on
    /// the policy's device, every tensor in `dtype` (no f32 head).
    pub fn new(policy: &Policy, dtype: DType) -> Result<Self> {
        let spec = InferSpec {
            dtype,
            f32_head: false,
            device: policy.device().clone(),
        };
        Self::build(policy, &spec)
    }

    /// Prepares `policy`'s current weights as `spec` says.
    /// Later changes to the policy's variables are not guaranteed to be seen: build a new one
    /// per snapshot.
    pub fn build(policy: &Policy, spec: &InferSpec) -> Result<Self> {
        let dtype = spec.dtype;
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(PolicyError::Weights(format!(
                "the inference path runs in f32, bf16 or f16, not {dtype:?}"
            )));
        }
        let cfg = policy.config().clone();
        let device = spec.device.clone();
        if dtype == DType::BF16 && device.is_cpu() {
            // candle 0.9's CPU backend has no bf16 matmul.
            return Err(PolicyError::Weights(
                "bf16 inference needs a CUDA device (the CPU backend has no bf16 matmul); use \
                 f32 or f16 on the CPU"
                    .into(),
            ));
        }
        // The weights the policy computes with: a LoRA policy's adapters are merged here
        // (one `W + (α/r)·B·A` per targeted projection at build time), so decoding costs
        // what the base's does.
        let vars: HashMap<String, Tensor> = policy.effective_tensors()?;
        // Converted (and stacked) where the policy lives, then copied: the device receives
        // only the prepared tensors.
        let get_as = |name: &str, dtype: DType| -> Result<Tensor> {
            let t = vars
                .get(name)
                .ok_or_else(|| PolicyError::Weights(format!("missing tensor {name}")))?;
            Ok(t.detach().to_dtype(dtype)?)
        };
        let get = |name: &str| get_as(name, dtype);
        let to_dev = |t: Tensor| -> Result<Tensor> { Ok(t.to_device(&device)?) };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qkv = Tensor::cat(
                &[
                    get(&format!("{a}.q_proj.weight"))?,
                    get(&format!("{a}.k_proj.weight"))?,
                    get(&format!("{a}.v_proj.weight"))?,
                ],
                0,
            )?;
            let qkv_bias = if cfg.attention_bias {
                Some(Tensor::cat(
                    &[
                        get(&format!("{a}.q_proj.bias"))?,
                        get(&format!("{a}.k_proj.bias"))?,
                        get(&format!("{a}.v_proj.bias"))?,
                    ],
                    0,
                )?)
            } else {
                None
            };
            let (q_norm, k_norm) = if cfg.qk_norm() {
                (
                    Some(get(&format!("{a}.q_norm.weight"))?),
                    Some(get(&format!("{a}.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                ln1: to_dev(get(&format!("{p}.input_layernorm.weight"))?)?,
                qkv: to_dev(qkv)?,
                qkv_bias: qkv_bias.map(to_dev).transpose()?,
                q_norm: q_norm.map(to_dev).transpose()?,
                k_norm: k_norm.map(to_dev).transpose()?,
                o: to_dev(get(&format!("{a}.o_proj.weight"))?)?,
                ln2: to_dev(get(&format!("{p}.post_attention_layernorm.weight"))?)?,
                gate_up: to_dev(Tensor::cat(
                    &[
                        get(&format!("{p}.mlp.gate_proj.weight"))?,
                        get(&format!("{p}.mlp.up_proj.weight"))?,
                    ],
                    0,
                )?)?,
                down: to_dev(get(&format!("{p}.mlp.down_proj.weight"))?)?,
            });
        }
        let head_dtype = if spec.f32_head { DType::F32 } else { dtype };
        let lm_head = to_dev(if cfg.tie_word_embeddings {
            get_as("model.embed_tokens.weight", head_dtype)?
        } else {
            get_as("lm_head.weight", head_dtype)?
        })?;
        // Tied: one table serves both; lookups are cast to `dtype` row by row.
        let embed = if cfg.tie_word_embeddings {
            lm_head.clone()
        } else {
            to_dev(get("model.embed_tokens.weight")?)?
        };
        let (cos, sin) = rope_tables(&cfg, &device, dtype)?;
        Ok(InferModel {
            norm: to_dev(get_as("model.norm.weight", head_dtype)?)?,
            cfg,
            dtype,
            device,
            embed,
            layers,
            lm_head,
            cos,
            sin,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty cache for `batch` rows of up to `capacity` positions.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<InferCache> {
        let capacity = capacity.min(self.cfg.max_position_embeddings);
        let shape = (
            batch,
            self.cfg.num_key_value_heads,
            capacity,
            self.cfg.head_dim,
        );
        let layers = (0..self.cfg.num_hidden_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(shape, self.dtype, &self.device)?,
                    Tensor::zeros(shape, self.dtype, &self.device)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(InferCache {
            layers,
            len: 0,
            capacity,
        })
    }

    /// Appends `ids` (`[b, t]`, u32) after the cached positions and returns the f32 logits of
    /// the last new position of every row, `[b, vocab]`.
    pub fn forward_last(&self, ids: &Tensor, cache: &mut InferCache) -> Result<Tensor> {
        let max_id = ids.max_all()?.to_dtype(DType::U32)?.to_scalar::<u32>()?;
        if max_id as usize >= self.cfg.vocab_size {
            return Err(PolicyError::Sampling(format!(
                "token id {max_id} is outside the vocabulary ({})",
                self.cfg.vocab_size
            )));
        }
        Ok(self.forward_native(ids, cache)?.to_dtype(DType::F32)?)
    }

    /// [`Self::forward_last`] for ids the caller checked on the host (no device round trip for
    /// the check), with the logits in the model's dtype (half precision crosses the bus at
    /// half the bytes; [`crate::sampling::host_logits`] widens them on the host).
    pub(crate) fn forward_native(&self, ids: &Tensor, cache: &mut InferCache) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let pos = cache.len;
        if t == 0 {
            return Err(PolicyError::Sampling("empty input".into()));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(PolicyError::Sampling(format!(
                "cache has {} layers, model has {}",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        if pos + t > self.cfg.max_position_embeddings {
            return Err(PolicyError::Sampling(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                pos + t,
                self.cfg.max_position_embeddings
            )));
        }
        let cfg = &self.cfg;
        let eps = cfg.rms_norm_eps as f32;
        let Dims {
            nh,
            nkv,
            hd,
            rep,
            qd,
            kvd,
            inter,
        } = Dims::of(cfg);
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        let s = pos + t;
        // Causal mask for the new rows against all cached + new columns (prefill only).
        let mask = if t > 1 {
            let m: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..s).map(move |j| if j > i + pos { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            Some(Tensor::from_vec(m, (t, s), &self.device)?.to_dtype(self.dtype)?)
        } else {
            None
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)? // [b·t, h]
            .to_dtype(self.dtype)?;
        for (i, l) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &l.ln1, eps)?;
            let mut qkv = h.matmul(&l.qkv.t()?)?;
            if let Some(bias) = &l.qkv_bias {
                qkv = qkv.broadcast_add(bias)?;
            }
            let q = qkv.narrow(1, 0, qd)?.reshape((b, t, nh, hd))?;
            let k = qkv.narrow(1, qd, kvd)?.reshape((b, t, nkv, hd))?;
            let v = qkv.narrow(1, qd + kvd, kvd)?.reshape((b, t, nkv, hd))?;
            let q = match &l.q_norm {
                Some(w) => rms_norm(&q, w, eps)?,
                None => q,
            };
            let k = match &l.k_norm {
                Some(w) => rms_norm(&k, w, eps)?,
                None => k,
            };
            let q = rope(&q.transpose(1, 2)?.contiguous()?, &cos, &sin)?; // [b, nh, t, hd]
            let k = rope(&k.transpose(1, 2)?.contiguous()?, &cos, &sin)?; // [b, nkv, t, hd]
            let v = v.transpose(1, 2)?.contiguous()?;
            let (k, v) = cache.append(i, &k, &v)?; // [b, nkv, s, hd]
                                                   // Grouped-query attention without repeating keys: query head `g·rep + r` reads
                                                   // kv head `g` (the Hugging Face order), so [b, nh, t, hd] regroups as
                                                   // [b, nkv, rep·t, hd] against [b, nkv, s, hd].
            let q = q.reshape((b, nkv, rep * t, hd))?;
            let scores = (q.matmul(&k.t()?)? * scale)?; // [b, nkv, rep·t, s]
            let scores = match &mask {
                Some(m) => scores
                    .reshape((b, nkv, rep, t, s))?
                    .broadcast_add(m)?
                    .reshape((b, nkv, rep * t, s))?,
                None => scores,
            };
            let probs = softmax_last_dim(&scores)?;
            let y = probs
                .matmul(&v)? // [b, nkv, rep·t, hd]
                .reshape((b, nh, t, hd))?
                .transpose(1, 2)?
                .reshape((b * t, qd))?;
            x = (x + y.matmul(&l.o.t()?)?)?;
            let h = rms_norm(&x, &l.ln2, eps)?;
            let gu = h.matmul(&l.gate_up.t()?)?;
            let act = (gu.narrow(1, 0, inter)?.silu()? * gu.narrow(1, inter, inter)?)?;
            x = (x + act.matmul(&l.down.t()?)?)?;
        }
        cache.len += t;
        let last = if t > 1 {
            x.reshape((b, t, cfg.hidden_size))?
                .narrow(1, t - 1, 1)?
                .reshape((b, cfg.hidden_size))?
        } else {
            x
        };
        // The head runs in its own dtype (f32 with an f32 head), the logits always come out f32.
        let last = rms_norm(&last.to_dtype(self.norm.dtype())?, &self.norm, eps)?;
        Ok(last.matmul(&self.lm_head.t()?)?.to_dtype(DType::F32)?)
    }
}

/// RoPE cos/sin tables `[max_positions, head_dim / 2]`, computed in f32 exactly as the
/// training forward computes them, then cast to `dtype`.
fn rope_tables(cfg: &ModelConfig, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let n = cfg.max_position_embeddings;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / cfg.head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for f in &inv_freq {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    Ok((
        Tensor::from_vec(cos, (n, half), device)?.to_dtype(dtype)?,
        Tensor::from_vec(sin, (n, half), device)?.to_dtype(dtype)?,
    ))
}

/// Generates `n` completions of `prompt` with uniforms drawn from `rng` (see
/// [`generate_with`]; the same rng state gives the same uniforms as
/// [`crate::sampling::generate`]).
pub fn generate(
    model: &InferModel,
    prompt: &[u32],
    n: usize,
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Result<Vec<Completion>> {
    generate_with(model, prompt, params, &Draws::from_rng(rng, n))
}

/// Generates one completion of `prompt` per row of `draws`: one batch-1 prefill, then the rows
/// decoded in lockstep; rows that emit a stop token leave the batch. Same canonical rule,
/// uniforms and log-prob convention as [`crate::sampling::generate_with`].
pub fn generate_with(
    model: &InferModel,
    prompt: &[u32],
    params: &SamplingParams,
    draws: &Draws,
) -> Result<Vec<Completion>> {
    decode(model, prompt, params, draws, None)
}

/// Where a decode's wall time went ([`generate_phased`]): seconds summed over the decode
/// steps after the prefill. What is left of `total_s` is the prefill, the canonical sampling
/// rule on the host and the bookkeeping between steps.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct DecodePhases {
    /// Decode steps timed (one forward of the active rows each).
    pub steps: usize,
    /// Host time issuing one step's kernels (`forward_native` returns before the device is
    /// done on CUDA): large when decode is bound by launches, not by the device. A
    /// synchronisation inside the forward, if any, would count here too.
    pub launch_s: f64,
    /// Waiting for the device to finish the step (`Device::synchronize`; ~0 on the CPU, where
    /// the forward computes in `launch_s`).
    pub device_s: f64,
    /// Copying the step's last-position logits to the host and widening them to f32.
    pub copy_s: f64,
    /// The whole call, prefill and sampling included.
    pub total_s: f64,
}

/// [`generate_with`], timing each decode step's phases ([`DecodePhases`]) for benchmarks
/// (`examples/gen_bench.rs`, its `step_ms`). The completions are the same as [`generate_with`]'s; the only
/// difference is one device synchronisation per step, between the forward and the copy that
/// would have waited for it anyway.
pub fn generate_phased(
    model: &InferModel,
    prompt: &[u32],
    params: &SamplingParams,
    draws: &Draws,
) -> Result<(Vec<Completion>, DecodePhases)> {
    let t0 = std::time::Instant::now();
    let mut phases = DecodePhases::default();
    let out = decode(model, prompt, params, draws, Some(&mut phases))?;
    phases.total_s = t0.elapsed().as_secs_f64();
    Ok((out, phases))
}

/// One decode step: the active rows' next-token logits on the host, timed into `phases` when
/// asked.
fn decode_step(
    model: &InferModel,
    cache: &mut InferCache,
    last: &[u32],
    phases: Option<&mut DecodePhases>,
) -> Result<Vec<f32>> {
    // Sampled ids are below the vocabulary by construction: no device-side check.
    let ids = Tensor::new(last, &model.device)?.unsqueeze(1)?;
    let Some(p) = phases else {
        return host_logits(&model.forward_native(&ids, cache)?);
    };
    let t0 = std::time::Instant::now();
    let logits = model.forward_native(&ids, cache)?;
    let t1 = std::time::Instant::now();
    model.device.synchronize()?;
    let t2 = std::time::Instant::now();
    let host = host_logits(&logits)?;
    let t3 = std::time::Instant::now();
    p.steps += 1;
    p.launch_s += (t1 - t0).as_secs_f64();
    p.device_s += (t2 - t1).as_secs_f64();
    p.copy_s += (t3 - t2).as_secs_f64();
    Ok(host)
}

/// Prefill once, then decode the rows of `draws` in lockstep, timing the steps into `phases`
/// when asked ([`generate_with`], [`generate_phased`]).
fn decode(
    model: &InferModel,
    prompt: &[u32],
    params: &SamplingParams,
    draws: &Draws,
    mut phases: Option<&mut DecodePhases>,
) -> Result<Vec<Completion>> {
    let max_new = crate::sampling::check_request(params, prompt, draws, &model.cfg)?;
    if draws.is_empty() {
        return Ok(Vec::new());
    }
    // The last sampled token is never fed back, so the cache needs prompt + max_new - 1.
    let mut cache = model.new_cache(1, prompt.len() + max_new)?;
    let ids = Tensor::new(prompt, &model.device)?.unsqueeze(0)?;
    let first = host_logits(&model.forward_native(&ids, &mut cache)?)?;
    crate::sampling::decode_rows(
        &mut cache,
        first,
        max_new,
        params,
        draws,
        crate::sampling::RowCache {
            repeat: |c: &mut InferCache, n| c.repeat_batch(n),
            select: |c: &mut InferCache, rows: &[u32]| c.select_rows(rows),
            step: |c: &mut InferCache, last: &[u32]| {
                decode_step(model, c, last, phases.as_deref_mut())
            },
        },
    )
}

/// Log-probs of `response` given `prompt` on the inference path (one prefill over the whole
/// sequence, logits of every response position): for comparing dtypes against the learner's
/// [`crate::sampling::response_logprobs`].
pub fn response_logprobs(
    model: &InferModel,
    prompt: &[u32],
    response: &[u32],
    temperature: f32,
) -> Result<Vec<f32>> {
    if prompt.is_empty() || response.is_empty() {
        return Err(PolicyError::Sampling("empty prompt or response".into()));
    }
    let mut cache = model.new_cache(1, prompt.len() + response.len())?;
    let ids = Tensor::new(prompt, &model.device)?.unsqueeze(0)?;
    let mut logits = model.forward_last(&ids, &mut cache)?;
    let mut out = Vec::with_capacity(response.len());
    for (j, &tok) in response.iter().enumerate() {
        let scaled = (logits.squeeze(0)? / f64::from(temperature))?;
        let lsm = candle_nn::ops::log_softmax(&scaled, D::Minus1)?;
        out.push(lsm.get(tok as usize)?.to_scalar::<f32>()?);
        if j + 1 < response.len() {
            let ids = Tensor::new(&[tok], &model.device)?.unsqueeze(0)?;
            logits = model.forward_last(&ids, &mut cache)?;
        }
    }
    Ok(out)
}

#[path = "infer_batch.rs"]
pub mod batch;

#[cfg(test)]
#[path = "infer_tests.rs"]
mod tests;
