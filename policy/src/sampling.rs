//! Sampling with a KV cache: temperature, top-p, max new tokens, stop tokens, `n` samples per
//! prompt (batched), and per-token log-probs of the sampled tokens. Every token is drawn by the
//! canonical rule ([`crate::rule`]) from a uniform of a [`Draws`] row: prescribed by the
//! learner ([`Draws::prescribed`]) for rollouts it checks, or from a caller's RNG
//! ([`generate`]) for local use.
//!
//! **Log-prob convention.** The recorded log-prob of a token is `log softmax(logits / T)` over
//! the *full* vocabulary (T = temperature, or 1 when T = 0, i.e. greedy), before top-p
//! truncation — the same quantity [`response_logprobs`] / [`token_logprobs`] compute from a
//! full-sequence forward, so the learner's on-policy importance ratio is 1.

use candle_core::{DType, Tensor};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::draw::Draws;
use crate::error::{PolicyError, Result};
use crate::model::target_logprobs;
use crate::weights::Policy;

/// Sampling parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables truncation.
    pub top_p: f32,
    /// Upper bound on generated tokens (also bounded by the model's context).
    pub max_new_tokens: usize,
    /// Token ids that end a response (included in the response, with their log-prob).
    pub stop_tokens: Vec<u32>,
}

impl SamplingParams {
    /// Temperature 1, top-p 1, `max_new_tokens`, the given stop tokens.
    pub fn new(max_new_tokens: usize, stop_tokens: Vec<u32>) -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens,
            stop_tokens,
        }
    }

    /// Temperature used for log-probs: `temperature`, or 1 for greedy decoding.
    pub fn logprob_temperature(&self) -> f32 {
        if self.temperature > 0.0 {
            self.temperature
        } else {
            1.0
        }
    }

    /// The canonical rule's parameters ([`crate::rule`]).
    pub fn rule(&self) -> crate::rule::RuleParams {
        crate::rule::RuleParams {
            temperature: self.temperature,
            top_p: self.top_p,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(PolicyError::Sampling(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(PolicyError::Sampling(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if self.max_new_tokens == 0 {
            return Err(PolicyError::Sampling("max_new_tokens must be > 0".into()));
        }
        Ok(())
    }
}

/// One generated response.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Sampled token ids (a final stop token included).
    pub tokens: Vec<u32>,
    /// `log p(token)` of each sampled token (see the module docs for the convention).
    pub logprobs: Vec<f32>,
    /// True when the response ended with a stop token (false: length cut-off).
    pub stopped: bool,
}

/// Which decoding loop to use. All give log-probs equal to a full-sequence forward in f32
/// (the inference path in half precision: up to its rounding, see [`crate::infer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GenerationPath {
    /// The gradient-free inference path ([`crate::infer`]): fused kernels, in-place KV cache,
    /// bf16 weights on CUDA. Batched like `Batched`.
    #[default]
    Infer,
    /// The training forward: prefill the prompt once, decode all `n` samples in one batch
    /// (rows that stop drop out).
    Batched,
    /// Decode the `n` samples one after another with a batch-1 KV cache (shared prefill).
    Sequential,
}

/// Generates `n` completions of `prompt` on the training forward ([`GenerationPath::Batched`]
/// or [`GenerationPath::Sequential`]; `Infer` is taken as `Batched` here), the uniforms drawn
/// from `rng` ([`Draws::from_rng`]: the same rng state gives the same uniforms on every path).
/// [`crate::generate`] dispatches every path, the inference one included.
pub fn generate(
    policy: &Policy,
    prompt: &[u32],
    n: usize,
    params: &SamplingParams,
    path: GenerationPath,
    rng: &mut impl Rng,
) -> Result<Vec<Completion>> {
    generate_with(policy, prompt, params, path, &Draws::from_rng(rng, n))
}

/// Generates one completion of `prompt` per row of `draws` on the training forward (`Infer` is
/// taken as `Batched`; [`crate::generate_with`] dispatches every path): row `r`'s tokens are
/// decided by its uniforms through the canonical rule ([`crate::rule`]). With prescribed draws
/// ([`Draws::prescribed`]) the learner can check every token.
pub fn generate_with(
    policy: &Policy,
    prompt: &[u32],
    params: &SamplingParams,
    path: GenerationPath,
    draws: &Draws,
) -> Result<Vec<Completion>> {
    let max_new = check_request(params, prompt, draws, policy.config())?;
    if draws.is_empty() {
        return Ok(Vec::new());
    }
    // Prefill once (batch 1).
    let mut prefill = policy.new_cache();
    let ids = Tensor::new(prompt, policy.device())?.unsqueeze(0)?;
    let first = host_logits(&policy.model().forward_cached_last(&ids, &mut prefill)?)?;
    match path {
        GenerationPath::Batched | GenerationPath::Infer => {
            decode_batch(policy, prefill, first, max_new, params, draws)
        }
        GenerationPath::Sequential => {
            let mut out = Vec::with_capacity(draws.len());
            for r in 0..draws.len() {
                let mut one = decode_batch(
                    policy,
                    prefill.clone(),
                    first.clone(),
                    max_new,
                    params,
                    &draws.row(r),
                )?;
                out.append(&mut one);
            }
            Ok(out)
        }
    }
}

/// Checks a generation request on the host (no device round trip): sampling parameters, a
/// non-empty prompt of in-vocabulary ids that leaves room in the context. Returns the number
/// of tokens that can be generated.
pub(crate) fn check_request(
    params: &SamplingParams,
    prompt: &[u32],
    draws: &Draws,
    cfg: &crate::config::ModelConfig,
) -> Result<usize> {
    params.validate()?;
    if draws.is_empty() {
        return Ok(0);
    }
    if prompt.is_empty() {
        return Err(PolicyError::Sampling("empty prompt".into()));
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(PolicyError::Sampling(format!(
            "token id {t} is outside the vocabulary ({})",
            cfg.vocab_size
        )));
    }
    let ctx = cfg.max_position_embeddings;
    if prompt.len() >= ctx {
        return Err(PolicyError::Sampling(format!(
            "prompt of {} tokens leaves no room in a context of {ctx}",
            prompt.len()
        )));
    }
    Ok(params.max_new_tokens.min(ctx - prompt.len()))
}

/// Decodes `draws.len()` rows in lockstep from a batch-1 cache holding the prompt.
fn decode_batch(
    policy: &Policy,
    mut cache: crate::model::KvCache,
    first: Vec<f32>,
    max_new: usize,
    params: &SamplingParams,
    draws: &Draws,
) -> Result<Vec<Completion>> {
    decode_rows(
        &mut cache,
        first,
        max_new,
        params,
        draws,
        RowCache {
            repeat: |c: &mut crate::model::KvCache, n| c.repeat_batch(n),
            select: |c: &mut crate::model::KvCache, rows: &[u32]| c.select_rows(rows),
            step: |c: &mut crate::model::KvCache, last: &[u32]| {
                let ids = Tensor::new(last, policy.device())?.unsqueeze(1)?;
                host_logits(&policy.model().forward_cached_last(&ids, c)?)
            },
        },
    )
}

/// How [`decode_rows`] drives a KV cache: copy the batch-1 prefill to `n` rows, keep only some
/// rows, and feed one token per row to get the next logits (row-major on the host).
pub(crate) struct RowCache<R, S, F> {
    pub repeat: R,
    pub select: S,
    pub step: F,
}

/// The lockstep decode loop every generation path shares: from a batch-1 cache holding the
/// prompt and its last logits (`first`, one row shared by all rows), draw one token per active
/// row per step with the canonical rule and that row's next uniform (rows in parallel), drop
/// rows that emit a stop token from the batch, and feed the rest their last token.
pub(crate) fn decode_rows<C, R, S, F>(
    cache: &mut C,
    first: Vec<f32>,
    max_new: usize,
    params: &SamplingParams,
    draws: &Draws,
    ops: RowCache<R, S, F>,
) -> Result<Vec<Completion>>
where
    R: FnOnce(&mut C, usize) -> Result<()>,
    S: Fn(&mut C, &[u32]) -> Result<()>,
    F: FnMut(&mut C, &[u32]) -> Result<Vec<f32>>,
{
    let RowCache {
        repeat,
        select,
        mut step,
    } = ops;
    let n = draws.len();
    let vocab = first.len();
    let rule = params.rule();
    repeat(cache, n)?;
    let mut rows: Vec<Completion> = (0..n)
        .map(|_| Completion {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stopped: false,
        })
        .collect();
    let mut active: Vec<usize> = (0..n).collect();
    let mut logits = first;
    for i in 0..max_new {
        let uniforms: Vec<f64> = active.iter().map(|&r| draws.uniform(r, i)).collect();
        let drawn = if i == 0 {
            crate::rule::draw_shared(&logits, rule, &uniforms)?
        } else {
            crate::rule::draw_rows(&logits, vocab, rule, &uniforms)?
        };
        for (&r, d) in active.iter().zip(drawn) {
            rows[r].tokens.push(d.token);
            rows[r].logprobs.push(d.logprob);
            if params.stop_tokens.contains(&d.token) {
                rows[r].stopped = true;
            }
        }
        if i + 1 == max_new {
            break;
        }
        let keep: Vec<u32> = (0..active.len())
            .filter(|&j| !rows[active[j]].stopped)
            .map(|j| j as u32)
            .collect();
        if keep.is_empty() {
            break;
        }
        if keep.len() < active.len() {
            select(cache, &keep)?;
            active = keep.iter().map(|&j| active[j as usize]).collect();
        }
        let last: Vec<u32> = active
            .iter()
            .map(|&r| rows[r].tokens.last().copied().unwrap_or(0))
            .collect();
        logits = step(cache, &last)?;
    }
    Ok(rows)
}

/// The logits of the last position of each row of `logits` (`[b, t, V]` or `[b, V]`) on the
/// host, row-major. Copied in their own dtype and widened on the host: half-precision logits
/// (a bf16/f16 `lm_head`) cross the bus at half the bytes of an f32 copy, losslessly.
pub(crate) fn host_logits(logits: &Tensor) -> Result<Vec<f32>> {
    let last = if logits.rank() == 3 {
        let t = logits.dim(1)?;
        logits.narrow(1, t - 1, 1)?.squeeze(1)?
    } else {
        logits.clone()
    };
    let flat = last.flatten_all()?;
    Ok(match flat.dtype() {
        DType::F32 => flat.to_vec1::<f32>()?,
        DType::BF16 => flat
            .to_vec1::<half::bf16>()?
            .into_iter()
            .map(f32::from)
            .collect(),
        DType::F16 => flat
            .to_vec1::<half::f16>()?
            .into_iter()
            .map(f32::from)
            .collect(),
        _ => flat.to_dtype(DType::F32)?.to_vec1::<f32>()?,
    })
}

/// Differentiable per-token log-probs: `logits` `[b, t, V]`, `targets` `[b, t]` (u32) →
/// `[b, t]` with `log softmax(logits / temperature)[target]`. One autograd node that keeps
/// only the logits for the backward (`crate::model::target_logprobs`), not the
/// vocabulary-wide rows of a spelled-out log-softmax.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor, temperature: f32) -> Result<Tensor> {
    target_logprobs(logits, targets, temperature)
}

/// Log-probs of `response` given `prompt` from one full-sequence forward (no cache): what the
/// learner computes. Returns one value per response token.
pub fn response_logprobs(
    policy: &Policy,
    prompt: &[u32],
    response: &[u32],
    temperature: f32,
) -> Result<Vec<f32>> {
    if prompt.is_empty() || response.is_empty() {
        return Err(PolicyError::Sampling("empty prompt or response".into()));
    }
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&response[..response.len() - 1]);
    let ids = Tensor::new(seq.as_slice(), policy.device())?.unsqueeze(0)?;
    let logits = policy.forward(&ids)?;
    let logits = logits.narrow(1, prompt.len() - 1, response.len())?;
    let targets = Tensor::new(response, policy.device())?.unsqueeze(0)?;
    Ok(token_logprobs(&logits, &targets, temperature)?
        .squeeze(0)?
        .to_vec1::<f32>()?)
}

/// The right-padded input of a batch of (prompt, response) pairs: inputs and targets `[b, t]`
/// (`t` the longest prompt + response − 1), and `L`, the longest response.
struct Padded {
    inp: Tensor,
    tgt: Tensor,
    mask: Vec<f32>,
    longest: usize,
}

fn padded(pairs: &[(&[u32], &[u32])], dev: &candle_core::Device) -> Result<Padded> {
    if pairs.is_empty() {
        return Err(PolicyError::Sampling("empty batch".into()));
    }
    if pairs.iter().any(|(p, r)| p.is_empty() || r.is_empty()) {
        return Err(PolicyError::Sampling(
            "empty prompt or response in batch".into(),
        ));
    }
    let t = pairs
        .iter()
        .map(|(p, r)| p.len() + r.len() - 1)
        .max()
        .unwrap_or(1);
    let l = pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(1);
    let (mut inp, mut tgt, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for (p, r) in pairs {
        let seq: Vec<u32> = p.iter().chain(r.iter()).copied().collect();
        for i in 0..t {
            inp.push(
                seq.get(i)
                    .copied()
                    .filter(|_| i + 1 < seq.len())
                    .unwrap_or(0),
            );
            tgt.push(seq.get(i + 1).copied().unwrap_or(0));
        }
        mask.extend((0..l).map(|j| if j < r.len() { 1f32 } else { 0.0 }));
    }
    let b = pairs.len();
    Ok(Padded {
        inp: Tensor::from_vec(inp, (b, t), dev)?,
        tgt: Tensor::from_vec(tgt, (b, t), dev)?,
        mask,
        longest: l,
    })
}

/// Differentiable log-probs of a batch of (prompt, response) pairs from one right-padded
/// full-sequence forward — the learner's view of rollout samples.
///
/// Returns `(logprobs [b, L], mask [b, L])` with `L` the longest response: entry `[i, j]` is
/// the log-prob of response token `j` of pair `i` (aligned with `Sample::sampler_logprobs`),
/// and the f32 mask is 1 for real tokens, 0 for padding (whose log-prob is 0).
pub fn batch_response_logprobs(
    policy: &Policy,
    pairs: &[(&[u32], &[u32])],
    temperature: f32,
) -> Result<(Tensor, Tensor)> {
    let dev = policy.device();
    let Padded {
        inp,
        tgt,
        mask,
        longest: l,
    } = padded(pairs, dev)?;
    let lp = token_logprobs(&policy.forward(&inp)?, &tgt, temperature)?; // [b, t]
    Ok((
        response_rows(&lp, pairs, l)?,
        Tensor::from_vec(mask, (pairs.len(), l), dev)?,
    ))
}

/// Each pair's response span of the `[b, t]` per-position log-probs `lp`, right-padded with
/// zeros to `[b, l]`.
fn response_rows(lp: &Tensor, pairs: &[(&[u32], &[u32])], l: usize) -> Result<Tensor> {
    let mut rows = Vec::with_capacity(pairs.len());
    for (i, (p, r)) in pairs.iter().enumerate() {
        let row = lp.get(i)?.narrow(0, p.len() - 1, r.len())?;
        rows.push(row.pad_with_zeros(0, 0, l - r.len())?);
    }
    Ok(Tensor::stack(&rows, 0)?)
}

/// The forward of [`batch_response_logprobs`] with recomputed activations
/// (`crate::model::recompute`): returns the log-probs `[b, l]` (no graph) and the pass, whose
/// [`RecomputedPass::backward`] then computes the gradient of `Σ log-probs ⊙ weight` for a
/// weight `[b, l]` (the objective's `∂L/∂ℓ`) layer by layer. Attention runs in chunks of
/// `query_chunk` queries. The values are those of the stored path up to the attention's
/// reduction order (`docs/gpu.md`, "Recomputed activations").
pub fn recomputed_response_logprobs<'a>(
    policy: &'a Policy,
    pairs: &[(&[u32], &[u32])],
    temperature: f32,
    query_chunk: usize,
) -> Result<(Tensor, RecomputedPass<'a>)> {
    let Padded {
        inp,
        tgt,
        longest: l,
        ..
    } = padded(pairs, policy.device())?;
    let model = policy.model();
    let inputs = model.recompute_forward(&inp, query_chunk)?;
    let logits = model.head_logits(&inputs.last().detach())?.detach();
    let lp = token_logprobs(&logits, &tgt, temperature)?.detach();
    drop(logits);
    let spans = pairs.iter().map(|(p, r)| (p.len() - 1, r.len())).collect();
    Ok((
        response_rows(&lp, pairs, l)?,
        RecomputedPass {
            policy,
            inputs,
            tgt,
            spans,
            longest: l,
            temperature,
        },
    ))
}

/// A pass of [`recomputed_response_logprobs`] waiting for its backward.
pub struct RecomputedPass<'a> {
    policy: &'a Policy,
    inputs: crate::model::LayerInputs,
    tgt: Tensor,
    /// (start, length) of each row's response in the per-position log-probs.
    spans: Vec<(usize, usize)>,
    longest: usize,
    temperature: f32,
}

impl RecomputedPass<'_> {
    /// Bytes the forward kept (each layer's input).
    pub fn kept_bytes(&self) -> usize {
        self.inputs.bytes()
    }

    /// Sends the gradient of `Σ log-probs ⊙ weight` (`weight` `[b, l]` f32, treated as a
    /// constant) to `sink` in parts, one [`GradStore`](candle_core::backprop::GradStore) per
    /// backward: the head's first, then each layer's from the last, then the embedding's.
    /// Their sum over the trainable variables is the gradient; each store also holds
    /// gradients of graph constants, which the sink should drop.
    pub fn backward(
        self,
        weight: &Tensor,
        sink: &mut dyn FnMut(candle_core::backprop::GradStore) -> Result<()>,
    ) -> Result<()> {
        let model = self.policy.model();
        let h = candle_core::Var::from_tensor(&self.inputs.last().detach())?;
        let logits = model.head_logits(h.as_tensor())?;
        let lp = token_logprobs(&logits, &self.tgt, self.temperature)?;
        let mut rows = Vec::with_capacity(self.spans.len());
        for (i, &(start, len)) in self.spans.iter().enumerate() {
            let row = lp.get(i)?.narrow(0, start, len)?;
            rows.push(row.pad_with_zeros(0, 0, self.longest - len)?);
        }
        let surrogate = (Tensor::stack(&rows, 0)? * weight.detach())?.sum_all()?;
        drop((rows, lp, logits));
        let mut store = surrogate.backward()?;
        let g = store
            .remove(h.as_tensor())
            .ok_or_else(|| PolicyError::Sampling("recomputed backward: no head gradient".into()))?;
        sink(store)?;
        model.recompute_backward(&self.inputs, &g, sink)
    }
}

/// The logits that predicted each response token of each (prompt, response) pair, from one
/// right-padded full-sequence forward (the forward of [`batch_response_logprobs`]), detached:
/// entry `i` is `[len(response_i), V]`, row `j` the logits of response token `j`. What the
/// learner's spot check needs to check both log-probs and draws (`crate::rule`).
pub fn batch_response_logits(policy: &Policy, pairs: &[(&[u32], &[u32])]) -> Result<Vec<Tensor>> {
    let Padded { inp, .. } = padded(pairs, policy.device())?;
    let logits = policy.forward(&inp)?.detach(); // [b, t, V]
    pairs
        .iter()
        .enumerate()
        .map(|(i, (p, r))| Ok(logits.get(i)?.narrow(0, p.len() - 1, r.len())?))
        .collect()
}
