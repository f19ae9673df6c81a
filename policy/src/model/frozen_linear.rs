//! The linear map of a frozen weight (a LoRA run's base), one custom op on the CPU and on
//! CUDA: `y = x·Wᵀ` with a backward that computes `dx = dy·W` and nothing else.
//!
//! Why an op: candle 0.9's matmul backward (`backprop.rs`, `Op::Matmul`) computes the right
//! operand's gradient even when that operand is a detached tensor that tracks no op — a
//! tensor that does not track ops only keeps the walk from *recording* nodes below it, the
//! matmul node above it is still differentiated in full. For a frozen base that is a third
//! of the backward's FLOPs and one weight-sized gradient per projection in the gradient
//! store. Here `W` is held by the op, not recorded as an input, so no gradient is ever
//! computed for it.
//!
//! Dtypes: `W` is stored in the frozen base's dtype (`crate::lora::frozen_base_dtype`: bf16 on
//! CUDA, f32 on the CPU), `x` and `y` are in the activation dtype (f32). With a bf16 `W`, `x`
//! is rounded to bf16, the product is accumulated in f32 and rounded to bf16 — what a bf16
//! GEMM computes — and widened back to `x`'s dtype. cuBLAS has bf16 GEMMs; candle 0.9's CPU
//! backend does not (its matmul takes f16, f32 and f64 only), so on the CPU a bf16 `W` is
//! widened to f32 for each call (a transient copy of that one weight) and the f32 product of
//! the bf16-rounded `x` is rounded to bf16 the same way. Both backends run the same function
//! ([`linear`]) over candle's storage-level ops; only the widening differs. With an f32 `W`
//! it is exactly one f32 matmul, as before.
//!
//! Must not touch: anything but this op.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor,
};

fn err(msg: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("frozen_linear: {msg}"))
}

struct FrozenMatmul {
    /// `[out, in]`, detached, contiguous, in the base's dtype.
    w: Tensor,
    /// `x·Wᵀ` (the forward) or `x·W` (the backward's `dy·W`).
    transposed: bool,
}

/// An owned storage or a borrowed one (a conversion that was not needed).
enum Held<'a, S> {
    Own(S),
    Ref(&'a S),
}

impl<S> std::ops::Deref for Held<'_, S> {
    type Target = S;
    fn deref(&self) -> &S {
        match self {
            Held::Own(s) => s,
            Held::Ref(s) => s,
        }
    }
}

/// `x` `[.., k]` (contiguous layout `xl`) times `W` (`[out, in]`, layout `wl`) or its
/// transpose, on any backend: `x` is converted to `W`'s dtype, multiplied in `gemm_dtype`
/// (`W`'s dtype, or f32 where the backend has no GEMM for it: `W` is widened for the call),
/// the product is rounded to `W`'s dtype and returned in `x`'s dtype, shaped `[.., n]`.
fn linear<S: BackendStorage>(
    x: &S,
    xl: &Layout,
    w: &S,
    wl: &Layout,
    transposed: bool,
    gemm_dtype: DType,
) -> Result<(S, Shape)> {
    let (rows, cols) = wl.shape().dims2()?;
    let (k, n) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let dims = xl.dims();
    if dims.last() != Some(&k) || !xl.is_contiguous() || !wl.is_contiguous() {
        return Err(err("x must be contiguous [.., k] and W contiguous"));
    }
    let m = xl.shape().elem_count() / k;
    let (x_dtype, w_dtype) = (x.dtype(), w.dtype());
    // x in the weight's dtype (rounded), then in the GEMM's.
    let mut xl2 = Layout::contiguous_with_offset((m, k), xl.start_offset());
    let mut xs = Held::Ref(x);
    for d in [w_dtype, gemm_dtype] {
        if xs.dtype() != d {
            xs = Held::Own(xs.to_dtype(&xl2, d)?);
            xl2 = Layout::contiguous((m, k));
        }
    }
    let (ws, start) = if w_dtype == gemm_dtype {
        (Held::Ref(w), wl.start_offset())
    } else {
        (Held::Own(w.to_dtype(wl, gemm_dtype)?), 0)
    };
    // W is [rows, cols] row-major: as the right operand [k, n] it is itself (x·W) or its
    // transposed view with strides [1, cols] (x·Wᵀ).
    let w_as_rhs = if transposed {
        Layout::new(Shape::from((k, n)), vec![1, cols], start)
    } else {
        Layout::contiguous_with_offset((k, n), start)
    };
    let mut y = xs.matmul(&ws, (1, m, n, k), &xl2, &w_as_rhs)?;
    let yl = Layout::contiguous((m, n));
    // Rounded as a GEMM in W's dtype rounds its output, then in the activation dtype.
    for d in [w_dtype, x_dtype] {
        if y.dtype() != d {
            y = y.to_dtype(&yl, d)?;
        }
    }
    let mut out = dims.to_vec();
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    Ok((y, Shape::from(out)))
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "echo-frozen-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (ws, wl) = self.w.storage_and_layout();
        let Storage::Cpu(w) = &*ws else {
            return Err(err("the weight is not on the CPU"));
        };
        // candle's CPU matmul has no bf16 kernel: a bf16 base is widened for the call.
        let gemm = match w.dtype() {
            DType::F16 | DType::F32 | DType::F64 => w.dtype(),
            _ => DType::F32,
        };
        linear(s, l, w, wl, self.transposed, gemm)
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (ws, wl) = self.w.storage_and_layout();
        let Storage::Cuda(w) = &*ws else {
            return Err(err("the weight is not on the CUDA device"));
        };
        // cuBLAS multiplies bf16 (f32 accumulation) and f32 alike.
        linear(s, l, w, wl, self.transposed, w.dtype())
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let back = FrozenMatmul {
            w: self.w.clone(),
            transposed: !self.transposed,
        };
        let dx = grad.contiguous()?.apply_op1(back)?;
        Ok(Some(dx.reshape(arg.shape())?))
    }
}

/// `x·Wᵀ` for a frozen `w` `[out, in]` (any float dtype; detached here): gradients flow to
/// `x` only, and the result is in `x`'s dtype.
pub(super) fn frozen_linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenMatmul {
        w: w.detach().contiguous()?,
        transposed: true,
    })
}

#[cfg(test)]
#[path = "frozen_linear_tests.rs"]
mod tests;
