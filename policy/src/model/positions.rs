//! Per-forward position data of the decoder: the rotary-embedding tables (half-width for the
//! fused CPU kernel, full-width rotate-half for the elementary path) and the causal mask.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};

use super::{cpu_ops, graph_constant};
use crate::config::ModelConfig;
use crate::error::Result;

/// Per-forward position data: RoPE tables and, on the elementary path, the causal mask.
pub(super) struct Positions {
    /// Half-width tables for the fused CPU kernel (`Some` on the fused path).
    pub(super) fused: Option<cpu_ops::RopeTables>,
    /// Full-width `[t, head_dim]` cos/sin (rotate-half layout) for the elementary path.
    pub(super) cos_sin: Option<(Tensor, Tensor)>,
    /// Additive `[t, offset + t]` causal mask for the elementary path (none when `t == 1`).
    pub(super) mask: Option<Tensor>,
    /// Number of cached positions before this call.
    pub(super) offset: usize,
}

/// RoPE angles for positions `offset..offset+t`: `[t, head_dim/2]` cos and sin, row-major.
fn rope_half_tables(cfg: &ModelConfig, offset: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / cfg.head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for p in offset..offset + t {
        for f in &inv_freq {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    (cos, sin)
}

impl Positions {
    pub(super) fn new(
        cfg: &ModelConfig,
        offset: usize,
        t: usize,
        fused: bool,
        recording: bool,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let (cos, sin) = rope_half_tables(cfg, offset, t);
        if fused {
            return Ok(Positions {
                fused: Some(cpu_ops::RopeTables {
                    cos: Arc::new(cos),
                    sin: Arc::new(sin),
                    t,
                    half,
                }),
                cos_sin: None,
                mask: None,
                offset,
            });
        }
        // Rotate-half layout: each row is the half table twice.
        let full = |v: &[f32]| -> Vec<f32> {
            v.chunks_exact(half)
                .flat_map(|r| r.iter().chain(r).copied())
                .collect()
        };
        // Constants of a recorded graph are variables (`graph_constant`): candle would keep an
        // activation-sized gradient of each, and the graph with it, until the step ends.
        // The tables are in the activations' dtype; the mask is added to f32 scores.
        let constant = |v: Vec<f32>, shape: (usize, usize), dtype: DType| {
            graph_constant(
                Tensor::from_vec(v, shape, device)?.to_dtype(dtype)?,
                recording,
            )
        };
        let cos = constant(full(&cos), (t, cfg.head_dim), dtype)?;
        let sin = constant(full(&sin), (t, cfg.head_dim), dtype)?;
        let mask = if t > 1 {
            Some(constant(
                causal_mask(t, offset),
                (t, offset + t),
                DType::F32,
            )?)
        } else {
            None
        };
        Ok(Positions {
            fused: None,
            cos_sin: Some((cos, sin)),
            mask,
            offset,
        })
    }
}

/// Rotary embedding on `[b, heads, t, head_dim]`: `x·cos + rotate_half(x)·sin`.
pub(super) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

/// The additive causal mask of `t` new positions after `offset` cached ones, row-major
/// `(t, offset + t)`: query `i` (at position `offset + i`) sees keys `0..=offset + i` (0),
/// not the ones after (−∞).
pub(crate) fn causal_mask(t: usize, offset: usize) -> Vec<f32> {
    let s = offset + t;
    (0..t)
        .flat_map(|i| {
            (0..s).map(move |j| {
                if j > i + offset {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect()
}
