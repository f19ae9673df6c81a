//! Many sequences decoded in one batch from static buffers, and many groups in flight
//! (continuous batching): the decode path of a rollout worker that keeps a GPU busy
//! (`docs/gpu.md`, "Many groups in flight"; `docs/model.md`, "Static-buffer decoding").
//!
//! Owns: [`StaticBatch`], the buffers of one *batch bucket* — `rows` slots (a power of two),
//! each a sequence of up to `capacity` positions: the KV cache of every layer allocated once
//! (`[rows, kv_heads, capacity, head_dim]`) and written in place at each slot's own position
//! (a scatter along the positions), the step's token ids and positions as device tensors, the
//! causal mask made on the device from the positions. No step allocates a buffer that
//! outlives it or synchronises with the host before its logits are read: on CUDA the step is
//! what a graph capture would record once per (bucket, attention window) and replay. The CPU
//! takes the same path without capture. And [`generate_groups`]: the samples of several
//! groups decoded together in one bucket, each prompt prefilled once and its KV copied into
//! the slots of its n samples, a finished sample's slot refilled by the next waiting one.
//!
//! Tokens: every token is the canonical rule's draw ([`crate::rule`]) from the uniform of its
//! (group, sample, position) ([`Draws`]), so what else is in the batch changes a sample's
//! tokens only through the numeric noise of its logits. On the CPU in f32 the logits of a
//! slot match [`super::generate_with`]'s to the rounding of an attention sum over a longer,
//! masked window (tested: the same tokens, log-probs within 1e-5).
//!
//! Must not touch: the per-group decode of [`super`] (multi-turn sessions and benchmarks use it).

use candle_core::{DType, Device, Tensor};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;

use super::{DecodePhases, Dims, InferCache, InferModel};
use crate::draw::Draws;
use crate::error::{PolicyError, Result};
use crate::sampling::{check_request, host_logits, Completion, SamplingParams};

/// Attention windows are multiples of this many positions (at most the bucket's capacity):
/// one captured graph per (bucket, window) instead of one per sequence length.
pub const WINDOW: usize = 128;

/// The rows of the bucket that holds `rows` sequences: the next power of two.
pub fn bucket_rows(rows: usize) -> usize {
    rows.max(1).next_power_of_two()
}

/// The static buffers of one batch bucket (see the module doc).
#[derive(Debug)]
pub struct StaticBatch {
    rows: usize,
    capacity: usize,
    /// Per layer, keys and values `[rows, kv_heads, capacity, head_dim]`.
    kv: Vec<(Tensor, Tensor)>,
    /// `[rows, 1]` u32: the token each slot feeds this step.
    ids: Tensor,
    /// `[rows]` u32: the position each slot's token takes (its cached length).
    positions: Tensor,
    /// `[1, capacity]` u32: column ids of the causal mask.
    cols: Tensor,
    /// Scalars of the mask (0 and −∞ in the model's dtype).
    zero: Tensor,
    ninf: Tensor,
    /// Host mirror of the positions: tokens cached per slot.
    lens: Vec<usize>,
}

impl StaticBatch {
    /// The buffers of a bucket of `rows` slots of up to `capacity` positions each (the model's
    /// context bounds it), allocated once.
    pub fn new(model: &InferModel, rows: usize, capacity: usize) -> Result<Self> {
        let cfg = &model.cfg;
        let capacity = capacity.clamp(1, cfg.max_position_embeddings);
        let rows = rows.max(1);
        let dev = &model.device;
        let shape = (rows, cfg.num_key_value_heads, capacity, cfg.head_dim);
        let kv = (0..cfg.num_hidden_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(shape, model.dtype, dev)?,
                    Tensor::zeros(shape, model.dtype, dev)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StaticBatch {
            rows,
            capacity,
            kv,
            ids: Tensor::zeros((rows, 1), DType::U32, dev)?,
            positions: Tensor::zeros(rows, DType::U32, dev)?,
            cols: Tensor::arange(0u32, capacity as u32, dev)?.unsqueeze(0)?,
            zero: Tensor::zeros((), model.dtype, dev)?,
            ninf: Tensor::new(f32::NEG_INFINITY, dev)?.to_dtype(model.dtype)?,
            lens: vec![0; rows],
        })
    }

    /// Slots of the bucket.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Positions per slot.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens cached in slot `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// True when no slot holds a token.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// Puts a prefilled prompt (a batch-1 cache) into slot `slot`: its keys and values are
    /// copied into the slot's positions `0..len` (the prompt's KV computed once, shared by
    /// every sample of its group through these copies).
    pub fn admit(&mut self, slot: usize, prefill: &InferCache) -> Result<()> {
        let p = prefill.len();
        if slot >= self.rows || p >= self.capacity || prefill.layers.len() != self.kv.len() {
            return Err(PolicyError::Sampling(format!(
                "cannot admit a prompt of {p} tokens into slot {slot} of a bucket of {} x {}",
                self.rows, self.capacity
            )));
        }
        for ((k, v), (pk, pv)) in self.kv.iter().zip(&prefill.layers) {
            let (pk, pv) = (
                pk.narrow(2, 0, p)?.contiguous()?,
                pv.narrow(2, 0, p)?.contiguous()?,
            );
            k.narrow(0, slot, 1)?.slice_set(&pk, 2, 0)?;
            v.narrow(0, slot, 1)?.slice_set(&pv, 2, 0)?;
        }
        self.lens[slot] = p;
        Ok(())
    }

    /// Frees slot `slot` (its stale keys and values stay; the mask hides them).
    pub fn release(&mut self, slot: usize) {
        self.lens[slot] = 0;
    }

    /// One decode step of every slot: `tokens[s]` is fed at position `len(s)` of slot `s`
    /// (free slots, `active[s] = false`, feed a token at position 0 and their logits are
    /// ignored); returns the logits of all slots on the host, `[rows × vocab]` row-major, and
    /// advances the active slots. Timed into `phases` when asked.
    pub fn step(
        &mut self,
        model: &InferModel,
        tokens: &[u32],
        active: &[bool],
        phases: Option<&mut DecodePhases>,
    ) -> Result<Vec<f32>> {
        if tokens.len() != self.rows || active.len() != self.rows {
            return Err(PolicyError::Sampling(format!(
                "{} tokens for a bucket of {} slots",
                tokens.len(),
                self.rows
            )));
        }
        let pos: Vec<u32> = (0..self.rows)
            .map(|s| if active[s] { self.lens[s] as u32 } else { 0 })
            .collect();
        let longest = pos.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        if longest > self.capacity {
            return Err(PolicyError::Sampling(format!(
                "KV cache capacity {} exceeded",
                self.capacity
            )));
        }
        let window = longest
            .div_ceil(WINDOW)
            .saturating_mul(WINDOW)
            .min(self.capacity);
        let dev = model.device.clone();
        // The step's inputs, copied into the static buffers (outside a captured graph).
        self.ids
            .slice_set(&Tensor::from_slice(tokens, (self.rows, 1), &dev)?, 0, 0)?;
        self.positions
            .slice_set(&Tensor::from_slice(&pos, self.rows, &dev)?, 0, 0)?;
        let t0 = std::time::Instant::now();
        let logits = self.forward(model, window)?;
        let t1 = std::time::Instant::now();
        if phases.is_some() {
            dev.synchronize()?;
        }
        let t2 = std::time::Instant::now();
        let host = host_logits(&logits)?;
        if let Some(p) = phases {
            let t3 = std::time::Instant::now();
            p.steps += 1;
            p.launch_s += (t1 - t0).as_secs_f64();
            p.device_s += (t2 - t1).as_secs_f64();
            p.copy_s += (t3 - t2).as_secs_f64();
        }
        for (l, &a) in self.lens.iter_mut().zip(active) {
            if a {
                *l += 1;
            }
        }
        Ok(host)
    }

    /// The forward of one step over the static buffers: reads `ids` and `positions`, writes
    /// each slot's keys and values at its position, attends over the first `window` positions
    /// under the mask `column ≤ position`. The arithmetic is [`InferModel::forward_native`]'s
    /// for one new token per row.
    fn forward(&self, model: &InferModel, window: usize) -> Result<Tensor> {
        let cfg = &model.cfg;
        let b = self.rows;
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
        let half = hd / 2;
        // Per-slot RoPE rows and the KV write index, from the positions on the device.
        let cos = model
            .cos
            .index_select(&self.positions, 0)?
            .reshape((b, 1, half))?;
        let sin = model
            .sin
            .index_select(&self.positions, 0)?
            .reshape((b, 1, half))?;
        let at = self
            .positions
            .reshape((b, 1, 1, 1))?
            .broadcast_as((b, nkv, 1, hd))?
            .contiguous()?;
        let allowed = self
            .cols
            .narrow(1, 0, window)?
            .broadcast_le(&self.positions.reshape((b, 1))?)?;
        let mask = allowed
            .where_cond(
                &self.zero.broadcast_as((b, window))?,
                &self.ninf.broadcast_as((b, window))?,
            )?
            .reshape((b, 1, 1, window))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = model
            .embed
            .index_select(&self.ids.flatten_all()?, 0)?
            .to_dtype(model.dtype)?;
        for (l, (kb, vb)) in model.layers.iter().zip(&self.kv) {
            let h = rms_norm(&x, &l.ln1, eps)?;
            let mut qkv = h.matmul(&l.qkv.t()?)?;
            if let Some(bias) = &l.qkv_bias {
                qkv = qkv.broadcast_add(bias)?;
            }
            let q = qkv.narrow(1, 0, qd)?.reshape((b, 1, nh, hd))?;
            let k = qkv.narrow(1, qd, kvd)?.reshape((b, 1, nkv, hd))?;
            let v = qkv.narrow(1, qd + kvd, kvd)?.reshape((b, 1, nkv, hd))?;
            let q = match &l.q_norm {
                Some(w) => rms_norm(&q, w, eps)?,
                None => q,
            };
            let k = match &l.k_norm {
                Some(w) => rms_norm(&k, w, eps)?,
                None => k,
            };
            let q = rope(&q.transpose(1, 2)?.contiguous()?, &cos, &sin)?; // [b, nh, 1, hd]
            let k = rope(&k.transpose(1, 2)?.contiguous()?, &cos, &sin)?; // [b, nkv, 1, hd]
            let v = v.transpose(1, 2)?.contiguous()?;
            kb.scatter_set(&at, &k, 2)?;
            vb.scatter_set(&at, &v, 2)?;
            let (kw, vw) = (kb.narrow(2, 0, window)?, vb.narrow(2, 0, window)?);
            let q = q.reshape((b, nkv, rep, hd))?;
            let scores = (q.matmul(&kw.t()?)? * scale)?.broadcast_add(&mask)?;
            let probs = softmax_last_dim(&scores)?;
            let y = probs
                .matmul(&vw)? // [b, nkv, rep, hd]
                .reshape((b, nh, 1, hd))?
                .transpose(1, 2)?
                .reshape((b, qd))?;
            x = (x + y.matmul(&l.o.t()?)?)?;
            let h = rms_norm(&x, &l.ln2, eps)?;
            let gu = h.matmul(&l.gate_up.t()?)?;
            let act = (gu.narrow(1, 0, inter)?.silu()? * gu.narrow(1, inter, inter)?)?;
            x = (x + act.matmul(&l.down.t()?)?)?;
        }
        let last = rms_norm(&x.to_dtype(model.norm.dtype())?, &model.norm, eps)?;
        Ok(last.matmul(&model.lm_head.t()?)?.to_dtype(DType::F32)?)
    }
}

/// One group of [`generate_groups`]: its prompt and the draws of its samples (row `k` is
/// sample `k`, whose `j`-th token takes that row's uniform `j`).
#[derive(Debug, Clone, Copy)]
pub struct GroupRequest<'a> {
    pub prompt: &'a [u32],
    pub draws: &'a Draws,
}

/// Decodes the samples of all `groups` in one bucket of at most `max_batch` slots, slots
/// refilled as samples finish (see the module doc); returns each group's completions in
/// sample order. Same rule, uniforms and log-prob convention as [`super::generate_with`].
pub fn generate_groups(
    model: &InferModel,
    groups: &[GroupRequest<'_>],
    params: &SamplingParams,
    max_batch: usize,
) -> Result<Vec<Vec<Completion>>> {
    decode_groups(model, groups, params, max_batch, None)
}

/// [`generate_groups`], timing every decode step's phases (benchmarks).
pub fn generate_groups_phased(
    model: &InferModel,
    groups: &[GroupRequest<'_>],
    params: &SamplingParams,
    max_batch: usize,
) -> Result<(Vec<Vec<Completion>>, DecodePhases)> {
    let t0 = std::time::Instant::now();
    let mut phases = DecodePhases::default();
    let out = decode_groups(model, groups, params, max_batch, Some(&mut phases))?;
    phases.total_s = t0.elapsed().as_secs_f64();
    Ok((out, phases))
}

/// A prompt prefilled once: its batch-1 cache and the logits of its last position.
struct Prefilled {
    group: usize,
    cache: InferCache,
    first: Vec<f32>,
}

/// A slot's sample: which group and sample, and its last drawn token (fed next step).
#[derive(Debug, Clone, Copy)]
struct Running {
    group: usize,
    sample: usize,
    last: u32,
}

fn prefill(model: &InferModel, group: usize, prompt: &[u32], dev: &Device) -> Result<Prefilled> {
    let mut cache = model.new_cache(1, prompt.len())?;
    let ids = Tensor::new(prompt, dev)?.unsqueeze(0)?;
    let first = host_logits(&model.forward_native(&ids, &mut cache)?)?;
    Ok(Prefilled {
        group,
        cache,
        first,
    })
}

fn decode_groups(
    model: &InferModel,
    groups: &[GroupRequest<'_>],
    params: &SamplingParams,
    max_batch: usize,
    mut phases: Option<&mut DecodePhases>,
) -> Result<Vec<Vec<Completion>>> {
    let max_new = groups
        .iter()
        .map(|g| check_request(params, g.prompt, g.draws, &model.cfg))
        .collect::<Result<Vec<_>>>()?;
    let mut out: Vec<Vec<Completion>> = groups
        .iter()
        .map(|g| {
            (0..g.draws.len())
                .map(|_| Completion {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    stopped: false,
                })
                .collect()
        })
        .collect();
    let queue: Vec<(usize, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, r)| (0..r.draws.len()).map(move |k| (g, k)))
        .collect();
    if queue.is_empty() {
        return Ok(out);
    }
    // The bucket: enough positions for the longest prompt + response of any group.
    let capacity = queue
        .iter()
        .map(|&(g, _)| groups[g].prompt.len() + max_new[g])
        .max()
        .unwrap_or(1);
    let rows = bucket_rows(max_batch.max(1).min(queue.len()));
    let mut batch = StaticBatch::new(model, rows, capacity)?;
    let vocab = model.cfg.vocab_size;
    let rule = params.rule();
    let dev = model.device.clone();
    let mut waiting = queue.into_iter();
    let mut current: Option<Prefilled> = None;
    let mut slots: Vec<Option<Running>> = vec![None; rows];
    loop {
        // Refill free slots, each admission after its first token is drawn from the prompt's
        // logits (a sample that stops at once never takes a slot). By index: the slot
        // number is also the row the sample decodes in.
        #[allow(clippy::needless_range_loop)]
        for s in 0..rows {
            while slots[s].is_none() {
                let Some((g, k)) = waiting.next() else {
                    break;
                };
                if current.as_ref().map(|p| p.group) != Some(g) {
                    // The previous prompt's KV is no longer needed.
                    drop(current.take());
                    current = Some(prefill(model, g, groups[g].prompt, &dev)?);
                }
                let p = current.as_ref().expect("prefilled above");
                let d = crate::rule::draw(&p.first, rule, groups[g].draws.uniform(k, 0))?;
                let c = &mut out[g][k];
                c.tokens.push(d.token);
                c.logprobs.push(d.logprob);
                if params.stop_tokens.contains(&d.token) {
                    c.stopped = true;
                    continue;
                }
                if max_new[g] == 1 {
                    continue;
                }
                batch.admit(s, &p.cache)?;
                slots[s] = Some(Running {
                    group: g,
                    sample: k,
                    last: d.token,
                });
            }
        }
        let active: Vec<bool> = slots.iter().map(Option::is_some).collect();
        if !active.iter().any(|&a| a) {
            break;
        }
        let tokens: Vec<u32> = slots.iter().map(|r| r.map_or(0, |r| r.last)).collect();
        let logits = batch.step(model, &tokens, &active, phases.as_deref_mut())?;
        let live: Vec<usize> = (0..rows).filter(|&s| active[s]).collect();
        let uniforms: Vec<f64> = live
            .iter()
            .map(|&s| {
                let r = slots[s].expect("active");
                groups[r.group]
                    .draws
                    .uniform(r.sample, out[r.group][r.sample].tokens.len())
            })
            .collect();
        let drawn = if live.len() == rows {
            crate::rule::draw_rows(&logits, vocab, rule, &uniforms)?
        } else {
            let mut rows_of = Vec::with_capacity(live.len() * vocab);
            for &s in &live {
                rows_of.extend_from_slice(&logits[s * vocab..(s + 1) * vocab]);
            }
            crate::rule::draw_rows(&rows_of, vocab, rule, &uniforms)?
        };
        for (&s, d) in live.iter().zip(drawn) {
            let r = slots[s].as_mut().expect("active");
            let c = &mut out[r.group][r.sample];
            c.tokens.push(d.token);
            c.logprobs.push(d.logprob);
            let stop = params.stop_tokens.contains(&d.token);
            c.stopped = stop;
            if stop || c.tokens.len() >= max_new[r.group] {
                batch.release(s);
                slots[s] = None;
            } else {
                r.last = d.token;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "infer_batch_tests.rs"]
mod tests;
