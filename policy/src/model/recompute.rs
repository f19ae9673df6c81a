//! Recomputed activations: a training pass that keeps only each decoder layer's input through
//! the forward and recomputes the layer during the backward, with attention computed in
//! chunks of queries, so a pass holds one layer's activations and attention memory grows with
//! the chunk, not with the square of the sequence (`docs/gpu.md`, "Recomputed activations").
//!
//! ## Rules
//! - **Forward** ([`Qwen3::recompute_forward`]): layer by layer, each layer's output detached
//!   (its graph freed at once); kept: the embedding and every layer's output
//!   ([`LayerInputs`]), `[b, t, hidden]` each in the compute dtype.
//! - **Backward** ([`Qwen3::recompute_backward`]), the chain rule across layer boundaries as
//!   the learner's micro-batches use it at the log-prob boundary: given `g = ∂L/∂out` of a
//!   layer, the layer is run again from a variable holding its input and the surrogate
//!   `Σ out ⊙ g` differentiated; its gradient is the layer's weights' share of `∂L/∂θ` and,
//!   at the input variable, the `g` of the layer below. Inside a layer the same split runs
//!   at the attention core: (1) queries, keys and values from the input (a graph kept for
//!   step 4), (2) the core without a graph, chunk by chunk, (3) output projection and MLP
//!   from a variable holding the core's output, differentiated first, (4) the core again per
//!   chunk of queries from variables holding q, k and v, (5) step 1's graph with the
//!   gradients of q, k, v from step 4. Each backward's store goes to the caller's `sink`,
//!   which sums the trainable variables' gradients.
//! - **Chunked attention**: chunk `c` of queries (rows `r0..r0 + c`) attends to the
//!   `r0 + c` keys its causal mask lets it see; the scores of one chunk are alive at a time.
//!   The same function computes the forward's and the backward's values, so the two agree
//!   bit for bit; against the whole attention they differ by the reduction order only.
//!
//! Must not touch: the optimiser, the loss (the caller's `sink` and surrogate weights).

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::{Attention, DecoderLayer, Positions, Qkv, Qwen3};
use crate::error::{PolicyError, Result};

/// The query chunk of recomputed attention when none is given: 1,024 queries, so the f32
/// scores of one chunk of an 8,192-token sequence are `heads × 1,024 × 8,192` values
/// (1 GiB at Qwen3-4B's 32 heads) instead of `heads × 8,192²` for the whole.
pub const DEFAULT_QUERY_CHUNK: usize = 1024;

/// What a recomputed pass keeps from its forward.
#[derive(Debug, Clone)]
pub struct LayerInputs {
    ids: Tensor,
    /// `hidden[i]`: layer i's input (detached, compute dtype); `hidden[L]`: the last layer's
    /// output.
    hidden: Vec<Tensor>,
    chunk: usize,
}

impl LayerInputs {
    /// The last decoder layer's output `[b, t, hidden]` (before the final norm), detached.
    pub fn last(&self) -> &Tensor {
        // `recompute_forward` always pushes the embedding.
        &self.hidden[self.hidden.len() - 1]
    }

    /// Bytes of the kept tensors.
    pub fn bytes(&self) -> usize {
        self.hidden
            .iter()
            .map(|h| h.elem_count() * h.dtype().size_in_bytes())
            .sum()
    }
}

/// The attention of all of `a`'s queries, in chunks of `chunk` queries.
fn attend_chunked(attn: &Attention, a: &Qkv, pos: &Positions, chunk: usize) -> Result<Tensor> {
    let t = a.q.dim(2)?;
    let mut parts = Vec::with_capacity(t.div_ceil(chunk));
    for r0 in (0..t).step_by(chunk) {
        let q = a.q.narrow(2, r0, chunk.min(t - r0))?.contiguous()?;
        parts.push(attn.core(&q, &a.k, &a.v, a.scale, pos, Some(r0))?);
    }
    Ok(Tensor::cat(&parts, 2)?)
}

fn detached_qkv(a: &Qkv) -> Qkv {
    Qkv {
        q: a.q.detach(),
        k: a.k.detach(),
        v: a.v.detach(),
        scale: a.scale,
    }
}

fn missing(what: &str) -> PolicyError {
    PolicyError::Sampling(format!("recomputed backward: no gradient for {what}"))
}

fn add(a: Option<Tensor>, b: Option<Tensor>) -> Result<Option<Tensor>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some((a + b)?),
        (a, b) => a.or(b),
    })
}

impl DecoderLayer {
    /// The layer with chunked attention (the recomputed pass's forward). The core runs on
    /// detached q, k, v, so no graph keeps a chunk's scores past the chunk (the weights are
    /// variables: the projections' graph lives until the caller detaches the output).
    fn forward_chunked(&self, x: &Tensor, pos: &Positions, chunk: usize) -> Result<Tensor> {
        let a = detached_qkv(&self.qkv(x, pos)?);
        let y = attend_chunked(&self.self_attn, &a, pos, chunk)?;
        self.post(x, self.self_attn.out(&y)?)
    }

    /// Steps 1–5 of the module docs for this layer: sends the weights' gradients of
    /// `Σ layer(x_in) ⊙ g_out` to `sink` and returns the gradient at `x_in`.
    fn backward_recomputed(
        &self,
        x_in: &Tensor,
        g_out: &Tensor,
        pos: &Positions,
        chunk: usize,
        sink: &mut dyn FnMut(GradStore) -> Result<()>,
    ) -> Result<Tensor> {
        let x = Var::from_tensor(&x_in.detach())?;
        let attn = &self.self_attn;
        // (1) q, k, v with a graph; (2) the core without one.
        let a = self.qkv(x.as_tensor(), pos)?;
        let free = detached_qkv(&a);
        let y = Var::from_tensor(&attend_chunked(attn, &free, pos, chunk)?.detach())?;
        // (3) output projection, residuals and MLP.
        let out = self.post(x.as_tensor(), attn.out(y.as_tensor())?)?;
        let mut store = (out * g_out.detach())?.sum_all()?.backward()?;
        let g_y = store
            .remove(y.as_tensor())
            .ok_or_else(|| missing("the attention output"))?
            .detach();
        let g_x_post = store.remove(x.as_tensor());
        sink(store)?;
        // (4) the core per chunk of queries, from variables.
        let (k, v) = (Var::from_tensor(&free.k)?, Var::from_tensor(&free.v)?);
        let t = free.q.dim(2)?;
        let (mut g_q, mut g_k, mut g_v) = (Vec::new(), None, None);
        for r0 in (0..t).step_by(chunk) {
            let c = chunk.min(t - r0);
            let q = Var::from_tensor(&free.q.narrow(2, r0, c)?.contiguous()?)?;
            let yc = attn.core(
                q.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                a.scale,
                pos,
                Some(r0),
            )?;
            let mut store = (yc * g_y.narrow(2, r0, c)?)?.sum_all()?.backward()?;
            g_q.push(
                store
                    .remove(q.as_tensor())
                    .ok_or_else(|| missing("the queries"))?
                    .detach(),
            );
            g_k = add(g_k, store.remove(k.as_tensor()).map(|g| g.detach()))?;
            g_v = add(g_v, store.remove(v.as_tensor()).map(|g| g.detach()))?;
        }
        let g_q = Tensor::cat(&g_q, 2)?;
        let g_k = g_k.ok_or_else(|| missing("the keys"))?;
        let g_v = g_v.ok_or_else(|| missing("the values"))?;
        // (5) the projections, norms and RoPE.
        let surrogate = (((&a.q * &g_q)?.sum_all()? + (&a.k * &g_k)?.sum_all()?)?
            + (&a.v * &g_v)?.sum_all()?)?;
        let mut store = surrogate.backward()?;
        let g_x_pre = store.remove(x.as_tensor());
        sink(store)?;
        add(g_x_pre, g_x_post)?
            .map(|g| g.detach())
            .ok_or_else(|| missing("the layer input"))
    }
}

impl Qwen3 {
    /// The forward of a recomputed pass over `ids` `[b, t]` (no cache): keeps each layer's
    /// input and the last layer's output, nothing else (see the module docs). Attention runs
    /// in chunks of `chunk` queries (at least 1).
    pub fn recompute_forward(&self, ids: &Tensor, chunk: usize) -> Result<LayerInputs> {
        let chunk = chunk.max(1);
        let t = self.check_ids(ids, 0)?;
        let mut x = self.embed(ids)?.detach();
        let pos = self.positions(&x, 0, t)?;
        let mut hidden = Vec::with_capacity(self.layers.len() + 1);
        hidden.push(x.clone());
        for layer in &self.layers {
            x = layer.forward_chunked(&x, &pos, chunk)?.detach();
            hidden.push(x.clone());
        }
        Ok(LayerInputs {
            ids: ids.clone(),
            hidden,
            chunk,
        })
    }

    /// f32 logits `[b, t, vocab]` of the last layer's output `x` (final norm and output
    /// projection), with a graph when `x` or the head's weights record one.
    pub fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        self.head(x)
    }

    /// The backward of a recomputed pass: given `grad_last` = `∂L/∂` [`LayerInputs::last`],
    /// sends each layer's (then the embedding's) share of `∂L/∂θ` to `sink`, last layer
    /// first; the head's share is the caller's (it differentiated the head to get
    /// `grad_last`).
    pub fn recompute_backward(
        &self,
        inputs: &LayerInputs,
        grad_last: &Tensor,
        sink: &mut dyn FnMut(GradStore) -> Result<()>,
    ) -> Result<()> {
        if inputs.hidden.len() != self.layers.len() + 1 {
            return Err(PolicyError::Sampling(format!(
                "recomputed backward: {} kept inputs for {} layers",
                inputs.hidden.len(),
                self.layers.len()
            )));
        }
        let t = inputs.ids.dim(1)?;
        let pos = self.positions(&inputs.hidden[0], 0, t)?;
        let mut g = grad_last.detach();
        for (i, layer) in self.layers.iter().enumerate().rev() {
            g = layer.backward_recomputed(&inputs.hidden[i], &g, &pos, inputs.chunk, sink)?;
        }
        let e = self.embed(&inputs.ids)?;
        if e.track_op() {
            sink((e * g)?.sum_all()?.backward()?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "recompute_tests.rs"]
mod tests;
