//! The CPU's AdamW (`super`'s module doc): in-place candle ops over f32 storage, the same
//! arithmetic as the tensor ops of `AdamW::step_on` value for value (`affine(a, 0)` is `x·a + 0`, which is not a
//! no-op: it turns −0 into +0, so it is kept), elements split across rayon's threads (each
//! value depends only on its own position, so the thread count changes no bit).

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Tensor};
use rayon::prelude::*;

use super::AdamWConfig;

/// Elements per rayon task: large enough to amortise scheduling, small enough to balance.
pub(super) const CHUNK: usize = 1 << 16;

/// candle's `affine(mul, 0)` on f32.
#[inline(always)]
fn scale(x: f32, mul: f32) -> f32 {
    x * mul + 0.0
}

/// The contiguous f32 values of a CPU tensor's storage, or `None`.
fn values<'a>(s: &'a CpuStorage, l: &Layout) -> Option<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => l.contiguous_offsets().map(|(a, b)| &v[a..b]),
        _ => None,
    }
}

/// Whether the fused step applies: all four tensors f32, contiguous, on the CPU, and no
/// two of them on one storage (one storage as both moments would be updated twice, and an
/// in-place op that write-locks its target and read-locks the same storage deadlocks).
fn applies(ts: [&Tensor; 4]) -> bool {
    let fits = ts
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32 && t.is_contiguous());
    let storages = ts.map(|t| {
        let (storage, _) = t.storage_and_layout();
        std::ptr::from_ref(&*storage) as usize
    });
    fits && (1..4).all(|i| !storages[..i].contains(&storages[i]))
}

/// Σ g² in f64, summed in order (as the tensor ops' `to_dtype(F64).sqr().sum_all()` do,
/// so the global norm is the same bits); `None` off the fused path.
pub(super) fn sum_of_squares(g: &Tensor) -> Option<f64> {
    if !(g.device().is_cpu() && g.dtype() == candle_core::DType::F32) {
        return None;
    }
    let (storage, layout) = g.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let xs = values(cpu, layout)?;
    Some(xs.iter().fold(0.0f64, |acc, &x| {
        let x = f64::from(x);
        acc + x * x
    }))
}

/// One optimiser step's three in-place ops, their scalars cast to f32 where the tensor ops
/// cast them; built once per step and applied to every variable.
pub(super) struct Step {
    m: Moment,
    v: Moment,
    update: Update,
}

impl Step {
    /// The step with clipping factor `clip_scale` and bias corrections `bc1 = 1 − β1^t`,
    /// `bc2 = 1 − β2^t`.
    pub(super) fn new(cfg: &AdamWConfig, clip_scale: f64, bc1: f64, bc2: f64) -> Self {
        let clip = (clip_scale != 1.0).then_some(clip_scale as f32);
        Step {
            m: Moment::new(clip, cfg.beta1, false),
            v: Moment::new(clip, cfg.beta2, true),
            update: Update {
                keep: (cfg.weight_decay > 0.0).then_some((1.0 - cfg.lr * cfg.weight_decay) as f32),
                inv_bc1: (1.0 / bc1) as f32,
                inv_bc2: (1.0 / bc2) as f32,
                eps: cfg.eps as f32,
                lr: cfg.lr as f32,
            },
        }
    }

    /// One variable's step in place; `Ok(false)` (nothing touched) off the fused path.
    pub(super) fn apply(
        &self,
        theta: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<bool> {
        if !applies([theta, g, m, v]) {
            return Ok(false);
        }
        m.inplace_op2(g, &self.m)?;
        v.inplace_op2(g, &self.v)?;
        theta.inplace_op3(m, v, &self.update)?;
        Ok(true)
    }
}

fn not_contiguous(op: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{op}: expects contiguous f32 storage"))
}

/// An in-place op's input as an f32 slice.
fn input<'a>(op: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    values(s, l).ok_or_else(|| not_contiguous(op))
}

/// An in-place op's target as a mutable f32 slice, checked to be as long as each of its
/// `inputs`.
fn target<'a>(
    op: &str,
    s: &'a mut CpuStorage,
    l: &Layout,
    inputs: &[&[f32]],
) -> candle_core::Result<&'a mut [f32]> {
    let (CpuStorage::F32(store), Some((a, b))) = (s, l.contiguous_offsets()) else {
        return Err(not_contiguous(op));
    };
    let target = &mut store[a..b];
    if let Some(other) = inputs.iter().find(|x| x.len() != target.len()) {
        return Err(candle_core::Error::Msg(format!(
            "{op}: {} values updated from {}",
            target.len(),
            other.len()
        )));
    }
    Ok(target)
}

/// `m ← β·m + (1 − β)·g` (or `g²` for the second moment), `g` clipped first.
struct Moment {
    clip: Option<f32>,
    decay: f32,
    weight: f32,
    squared: bool,
}

impl Moment {
    /// The moment of decay `beta` (of `g²` when `squared`).
    fn new(clip: Option<f32>, beta: f64, squared: bool) -> Self {
        Moment {
            clip,
            decay: beta as f32,
            weight: (1.0 - beta) as f32,
            squared,
        }
    }
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let g = input(self.name(), s2, l2)?;
        let m = target(self.name(), s1, l1, &[g])?;
        m.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(m, g)| {
                for (m, &g) in m.iter_mut().zip(g) {
                    let g = self.clip.map_or(g, |c| scale(g, c));
                    let g = if self.squared { g * g } else { g };
                    *m = scale(*m, self.decay) + scale(g, self.weight);
                }
            });
        Ok(())
    }
}

/// `θ ← θ·(1 − lr·λ) − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + ε)`.
struct Update {
    /// `1 − lr·λ`, when there is weight decay.
    keep: Option<f32>,
    inv_bc1: f32,
    inv_bc2: f32,
    eps: f32,
    lr: f32,
}

impl InplaceOp3 for Update {
    fn name(&self) -> &'static str {
        "adamw-update"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<()> {
        let m = input(self.name(), s2, l2)?;
        let v = input(self.name(), s3, l3)?;
        let theta = target(self.name(), s1, l1, &[m, v])?;
        theta
            .par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .for_each(|(theta, (m, v))| {
                for ((t, &m), &v) in theta.iter_mut().zip(m).zip(v) {
                    let kept = self.keep.map_or(*t, |k| scale(*t, k));
                    let m_hat = scale(m, self.inv_bc1);
                    // `+ ε` is candle's `affine(1, ε)`: `x·1 + ε`, and `x·1` is `x`.
                    let denom = scale(v, self.inv_bc2).sqrt() + self.eps;
                    *t = kept - scale(m_hat / denom, self.lr);
                }
            });
        Ok(())
    }
}
