//! Fused CPU kernels for the training hot path, each with its exact backward pass.
//!
//! Owns: RMSNorm, rotary embedding (fused with the `[b, t, heads, d]` → `[b, heads, t, d]`
//! transpose), causal softmax and log-softmax as candle custom ops on contiguous f32 CPU
//! tensors, and the two kernels of the target log-prob node (`super::target_logprob`). Every
//! op implements `bwd`, so weights stay trainable (candle-nn's own fused `rms_norm`,
//! `softmax_last_dim` and `rope` have no backward). The linear map of a frozen
//! weight (LoRA's base) runs on every device and lives in `frozen_linear`. Must not touch:
//! anything outside these functions; the elementary-op formulation in the parent module stays the
//! reference and the path used on other devices and dtypes.
//!
//! Why: candle's autograd records one node per elementary op, and its backward allocates a
//! zero tensor plus an add for every node. Spelling RMSNorm or softmax out in 5–6 ops
//! therefore costs ~15 full passes over the activation per step; each fused op here is one
//! forward pass and one or two backward passes.

use std::sync::Arc;

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor,
};

/// Whether `x` can take the fused path (contiguous-able f32 on the CPU).
pub(super) fn applies(x: &Tensor) -> bool {
    if ELEMENTARY_ONLY.with(|c| c.get()) {
        return false;
    }
    x.device().is_cpu() && x.dtype() == DType::F32
}

thread_local! {
    /// Set (tests, `super::use_elementary_ops`) to run the elementary reference path on the
    /// CPU: the ops, and so the autograd graph, a GPU runs.
    pub(super) static ELEMENTARY_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn err(msg: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("cpu_ops: {msg}"))
}

/// The contiguous f32 slice of a CPU storage.
fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("non-contiguous input"))?;
    match s {
        CpuStorage::F32(v) => Ok(&v[a..b]),
        _ => Err(err("expected f32")),
    }
}

/// Runs `f` on the contiguous f32 data of a CPU tensor (backward passes read their inputs).
fn with_data<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (st, l) = t.storage_and_layout();
    match &*st {
        Storage::Cpu(s) => f(slice(s, l)?),
        _ => Err(err("expected a CPU tensor")),
    }
}

fn last_dim(l: &Layout) -> Result<usize> {
    l.dims().last().copied().ok_or_else(|| err("scalar input"))
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: y = x · r · w, r = (mean(x²) + eps)^(-1/2), over the last dimension.
// Backward (per row, g = dy): dw = Σ_rows g·x·r;  dx = r·(g·w) − x·r³·mean(g·w·x).

struct RmsNormOp {
    eps: f32,
}

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "echo-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (slice(xs, xl)?, slice(ws, wl)?);
        let d = last_dim(xl)?;
        if w.len() != d {
            return Err(err("rms_norm weight size"));
        }
        let mut y = vec![0f32; x.len()];
        for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
            let r = inv_rms(xr, self.eps);
            for ((yv, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
                *yv = xv * r * wv;
            }
        }
        Ok((CpuStorage::F32(y), xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = w.elem_count();
        let (dx, dw) = with_data(x, |x| {
            with_data(w, |w| {
                with_data(grad, |g| {
                    let mut dx = vec![0f32; x.len()];
                    let mut dw = vec![0f32; d];
                    for ((xr, gr), dxr) in x
                        .chunks_exact(d)
                        .zip(g.chunks_exact(d))
                        .zip(dx.chunks_exact_mut(d))
                    {
                        let r = inv_rms(xr, self.eps);
                        let mut dot = 0f32;
                        for i in 0..d {
                            dot += gr[i] * w[i] * xr[i];
                            dw[i] += gr[i] * xr[i] * r;
                        }
                        let c = r * r * r * dot / d as f32;
                        for i in 0..d {
                            dxr[i] = r * gr[i] * w[i] - xr[i] * c;
                        }
                    }
                    Ok((dx, dw))
                })
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dx, x.shape().clone(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape().clone(), w.device())?),
        ))
    }
}

/// RMSNorm of `x` over its last dimension with weight `w` (length = last dim).
pub(super) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNormOp { eps: eps as f32 })
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding, rotate-half form, fused with the head transpose.
// Forward: x [b, t, h, d] → y [b, h, t, d], y = s·(x·cos + rot(x)·sin), rot(x) = (−x₂, x₁).
// rot is orthogonal with rotᵀ = −rot, so the backward is the same kernel with −sin, run in the
// opposite layout direction ([b, h, t, d] → [b, t, h, d]).

/// Half-width cos/sin tables (`[t, d/2]`, row-major) for consecutive positions.
#[derive(Debug, Clone)]
pub(super) struct RopeTables {
    pub(super) cos: Arc<Vec<f32>>,
    pub(super) sin: Arc<Vec<f32>>,
    pub(super) t: usize,
    pub(super) half: usize,
}

#[derive(Clone)]
struct RopeOp {
    tab: RopeTables,
    sign: f32,
    scale: f32,
    /// true: `[b, t, h, d]` → `[b, h, t, d]` (forward); false: the reverse (backward).
    to_heads: bool,
}

impl CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "echo-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s, l)?;
        let (b, a1, a2, d) = l.shape().dims4()?;
        let (t, h) = if self.to_heads { (a1, a2) } else { (a2, a1) };
        let half = self.tab.half;
        if t != self.tab.t || d != 2 * half {
            return Err(err("rope table shape"));
        }
        let mut y = vec![0f32; x.len()];
        let (cos, sin, sc, sg) = (&self.tab.cos, &self.tab.sin, self.scale, self.sign);
        for bi in 0..b {
            for ti in 0..t {
                let (c, sn) = (&cos[ti * half..][..half], &sin[ti * half..][..half]);
                for hi in 0..h {
                    let bth = ((bi * t + ti) * h + hi) * d;
                    let bht = ((bi * h + hi) * t + ti) * d;
                    let (src, dst) = if self.to_heads {
                        (bth, bht)
                    } else {
                        (bht, bth)
                    };
                    let xr = &x[src..src + d];
                    let yr = &mut y[dst..dst + d];
                    for j in 0..half {
                        let (x1, x2) = (xr[j], xr[j + half]);
                        let (cj, sj) = (c[j], sg * sn[j]);
                        yr[j] = sc * (x1 * cj - x2 * sj);
                        yr[j + half] = sc * (x2 * cj + x1 * sj);
                    }
                }
            }
        }
        let shape = if self.to_heads {
            Shape::from((b, h, t, d))
        } else {
            Shape::from((b, t, h, d))
        };
        Ok((CpuStorage::F32(y), shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let back = RopeOp {
            sign: -self.sign,
            to_heads: !self.to_heads,
            ..self.clone()
        };
        Ok(Some(grad.contiguous()?.apply_op1(back)?))
    }
}

/// `x` `[b, t, heads, d]` → RoPE'd and transposed `[b, heads, t, d]`, times `scale`.
pub(super) fn rope_to_heads(x: &Tensor, tab: &RopeTables, scale: f64) -> Result<Tensor> {
    x.contiguous()?.apply_op1(RopeOp {
        tab: tab.clone(),
        sign: 1.0,
        scale: scale as f32,
        to_heads: true,
    })
}

// ---------------------------------------------------------------------------------------------
// Causal softmax over the last dim of `[.., t, s]`: row i (query position offset + i) sees
// keys 0..=offset+i; the rest are exactly 0 (as adding a −∞ mask would give).
// Backward: dx = y·(g − Σ g·y); masked entries have y = 0 and get 0.

struct CausalSoftmaxOp {
    offset: usize,
}

impl CustomOp1 for CausalSoftmaxOp {
    fn name(&self) -> &'static str {
        "echo-causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s, l)?;
        let dims = l.dims();
        if dims.len() < 2 {
            return Err(err("causal softmax needs [.., t, s]"));
        }
        let (t, n) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let mut y = vec![0f32; x.len()];
        for (r, (xr, yr)) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)).enumerate() {
            let valid = (self.offset + r % t + 1).min(n);
            let m = xr[..valid].iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let mut sum = 0f32;
            for (yv, xv) in yr[..valid].iter_mut().zip(&xr[..valid]) {
                *yv = (xv - m).exp();
                sum += *yv;
            }
            let inv = 1.0 / sum;
            yr[..valid].iter_mut().for_each(|v| *v *= inv);
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = with_data(res, |y| {
            with_data(grad, |g| {
                let n = res.dim(candle_core::D::Minus1)?;
                let mut dx = vec![0f32; y.len()];
                for ((yr, gr), dr) in y
                    .chunks_exact(n)
                    .zip(g.chunks_exact(n))
                    .zip(dx.chunks_exact_mut(n))
                {
                    let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
                    for i in 0..n {
                        dr[i] = yr[i] * (gr[i] - dot);
                    }
                }
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(
            dx,
            res.shape().clone(),
            res.device(),
        )?))
    }
}

/// Softmax of `x` `[.., t, s]` over its last dim under a causal mask with `offset` cached keys.
pub(super) fn causal_softmax(x: &Tensor, offset: usize) -> Result<Tensor> {
    x.contiguous()?.apply_op1(CausalSoftmaxOp { offset })
}

// ---------------------------------------------------------------------------------------------
// Log-softmax over the last dim: y = x − max − log Σ exp(x − max).
// Backward: dx = g − exp(y)·Σ g.

struct LogSoftmaxOp;

impl CustomOp1 for LogSoftmaxOp {
    fn name(&self) -> &'static str {
        "echo-log-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s, l)?;
        let n = last_dim(l)?;
        let mut y = vec![0f32; x.len()];
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            let m = xr.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let lse = xr.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
            for (yv, xv) in yr.iter_mut().zip(xr) {
                *yv = xv - m - lse;
            }
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let n = res.dim(candle_core::D::Minus1)?;
        let dx = with_data(res, |y| {
            with_data(grad, |g| {
                let mut dx = vec![0f32; y.len()];
                for ((yr, gr), dr) in y
                    .chunks_exact(n)
                    .zip(g.chunks_exact(n))
                    .zip(dx.chunks_exact_mut(n))
                {
                    let s: f32 = gr.iter().sum();
                    for i in 0..n {
                        dr[i] = gr[i] - yr[i].exp() * s;
                    }
                }
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(
            dx,
            res.shape().clone(),
            res.device(),
        )?))
    }
}

/// Log-softmax of `x` over its last dimension.
pub(super) fn log_softmax(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(LogSoftmaxOp)
}

// ---------------------------------------------------------------------------------------------
// The target's log-prob, per row: v = z[t] − m − lse with z = x·(1/T), m = max z and
// lse = ln Σ exp(z − m); each row's (m, lse) is kept for the backward,
// dx = (onehot(t) − exp(z − m − lse))·g/T.
//
// The forward is the log-softmax kernel above read at one entry — the same folds in the same
// order over the same z (`x·(1/T) + 0`, candle's affine), so the value is that kernel's
// gathered output to the bit — but it writes no vocabulary-wide row; the backward reads the
// logits once and writes the gradient once, one exp per entry, from the kept (m, lse). The
// tensor-op backward of `super::target_logprob`, which every other device runs, makes about
// six passes over each row and a second exp. Rows run in parallel (rayon); each row's
// arithmetic is sequential, so the results do not depend on the number of threads.

/// What [`target_logprob_rows`] leaves for [`target_logprob_grad`]: each row's target,
/// checked against the vocabulary, and its `(m, lse)`.
pub(super) struct RowStats {
    targets: Vec<u32>,
    m_lse: Vec<[f32; 2]>,
}

/// `z = x·(1/T) + 0` exactly as candle's `x / T` computes it (`affine(1/T, 0)` in f32); `x`
/// itself at T = 1, as `token_logprobs` never divided then.
fn scaled(inv_t: f32) -> impl Fn(f32) -> f32 + Sync {
    move |v| if inv_t == 1.0 { v } else { v * inv_t + 0.0 }
}

/// Whether `len` values are one row of `n` per target.
fn check_rows(len: usize, n: usize, targets: &[u32]) -> Result<()> {
    if n == 0 || len != n * targets.len() {
        return Err(err("one target per row of logits"));
    }
    Ok(())
}

/// The log-prob of each row's target under `softmax(x / T)`, and what the backward needs. A
/// target outside the vocabulary is an error, as `gather` makes it on the other path.
pub(super) fn target_logprob_rows(
    x: &Tensor,
    targets: Vec<u32>,
    inv_t: f32,
) -> Result<(Vec<f32>, RowStats)> {
    use rayon::prelude::*;
    let n = x.dim(candle_core::D::Minus1)?;
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= n) {
        return Err(err(&format!("target {t} outside a vocabulary of {n}")));
    }
    let z = scaled(inv_t);
    let rows: Vec<(f32, [f32; 2])> = with_data(x, |x| {
        check_rows(x.len(), n, &targets)?;
        Ok(x.par_chunks_exact(n)
            .zip(targets.par_iter())
            .map(|(row, &t)| {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(z(v)));
                let lse = row.iter().map(|&v| (z(v) - m).exp()).sum::<f32>().ln();
                (z(row[t as usize]) - m - lse, [m, lse])
            })
            .collect())
    })?;
    let (values, m_lse) = rows.into_iter().unzip();
    Ok((values, RowStats { targets, m_lse }))
}

/// `dx = (onehot(t) − exp(z − m − lse))·g/T` for the logits `x` of [`target_logprob_rows`]
/// and what it left (`rows`), and the upstream gradient `g` (one value per row).
pub(super) fn target_logprob_grad(
    x: &Tensor,
    rows: &RowStats,
    g: &Tensor,
    inv_t: f32,
) -> Result<Tensor> {
    use rayon::prelude::*;
    let n = x.dim(candle_core::D::Minus1)?;
    let z = scaled(inv_t);
    let g = g.to_dtype(DType::F32)?;
    let dx = with_data(x, |xs| {
        with_data(&g, |gs| {
            check_rows(xs.len(), n, &rows.targets)?;
            if gs.len() != rows.targets.len() {
                return Err(err("one gradient per row"));
            }
            let mut dx = vec![0f32; xs.len()];
            dx.par_chunks_exact_mut(n)
                .zip(xs.par_chunks_exact(n))
                .enumerate()
                .for_each(|(r, (dr, xr))| {
                    let [m, lse] = rows.m_lse[r];
                    let gt = gs[r] * inv_t;
                    for (d, &v) in dr.iter_mut().zip(xr) {
                        *d = -(z(v) - m - lse).exp() * gt;
                    }
                    dr[rows.targets[r] as usize] += gt;
                });
            Ok(dx)
        })
    })?;
    Tensor::from_vec(dx, x.shape().clone(), x.device())
}

// ---------------------------------------------------------------------------------------------
// SwiGLU gate: y = silu(g)·u, silu(g) = g·σ(g).
// Backward: du = dy·silu(g);  dg = dy·u·σ(g)·(1 + g·(1 − σ(g))).

struct SwiGluOp;

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

impl CustomOp2 for SwiGluOp {
    fn name(&self) -> &'static str {
        "echo-swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (slice(gs, gl)?, slice(us, ul)?);
        if gl.shape() != ul.shape() {
            return Err(err("swiglu shapes"));
        }
        let y = g.iter().zip(u).map(|(&g, &u)| g * sigmoid(g) * u).collect();
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dg, du) = with_data(g, |g| {
            with_data(u, |u| {
                with_data(grad, |dy| {
                    let mut dg = vec![0f32; g.len()];
                    let mut du = vec![0f32; g.len()];
                    for i in 0..g.len() {
                        let s = sigmoid(g[i]);
                        du[i] = dy[i] * g[i] * s;
                        dg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
                    }
                    Ok((dg, du))
                })
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dg, g.shape().clone(), g.device())?),
            Some(Tensor::from_vec(du, u.shape().clone(), u.device())?),
        ))
    }
}

/// `silu(gate) · up`, elementwise (the SwiGLU MLP's gate).
pub(super) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGluOp)
}
