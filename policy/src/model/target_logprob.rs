//! The log-probability of each target token under `softmax(logits / T)`, as one autograd node
//! whose backward is the closed form
//!
//! `∂ log softmax(x / T)[t] / ∂x = (onehot(t) − softmax(x / T)) / T`.
//!
//! Why: the learner needs one number per token, but the spelled-out form (divide by the
//! temperature, log-softmax, gather) keeps five vocabulary-wide rows per token alive from the
//! forward to the end of the backward (the logits, their scaled copy and log-softmax's shifted,
//! exp and result rows), and candle 0.9's backward of those ops holds seven more at once. With
//! Qwen3's 151,936-token vocabulary that is 7.3 of the 17.2 MB a training token costs. This
//! node keeps only the logits: its forward value is computed detached and copied out, and its
//! backward recomputes the softmax from the logits, a row at a time per op, and frees it.
//!
//! The op's storage-level forward only copies a value computed beforehand
//! (`BackendStorage::try_clone`, on the CPU and on CUDA); no device kernel is written here.
//! - On the fused CPU path (f32 on the CPU, `cpu_ops::applies`) the value and each row's max
//!   and log-sum-exp come from `cpu_ops::target_logprob_rows`, which writes no
//!   vocabulary-wide row, and the backward is `cpu_ops::target_logprob_grad`: one read of the
//!   logits and one write of their gradient, rows in parallel.
//! - On every other device and dtype the value is the model's own elementary log-softmax,
//!   gathered, and the backward is ordinary tensor ops.
//!
//! Either way the value is bit-identical to the spelled-out form on the same path.
//!
//! Must not touch: anything but this op.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor, D,
};

use super::{cpu_ops, log_softmax_last};

fn err(msg: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("target_logprob: {msg}"))
}

struct TargetLogProb {
    /// `[..]` f32, the forward's value (computed detached), contiguous from offset 0.
    value: Tensor,
    /// `1 / T`.
    inv_temperature: f64,
    backward: Backward,
}

/// What the backward needs besides the logits.
enum Backward {
    /// The fused CPU path: the targets and each row's `(m, lse)` from the forward.
    Fused(cpu_ops::RowStats),
    /// Tensor ops: the targets, `[.., 1]` u32.
    Ops { targets: Tensor },
}

/// A copy of the whole storage behind a contiguous, offset-0 layout.
fn copy_of<S: BackendStorage>(s: &S, l: &Layout) -> Result<(S, Shape)> {
    if !l.is_contiguous() || l.start_offset() != 0 {
        return Err(err("the value must be contiguous from offset 0"));
    }
    Ok((s.try_clone(l)?, l.shape().clone()))
}

impl CustomOp1 for TargetLogProb {
    fn name(&self) -> &'static str {
        "echo-target-logprob"
    }

    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (vs, vl) = self.value.storage_and_layout();
        let Storage::Cpu(v) = &*vs else {
            return Err(err("the value is not on the CPU"));
        };
        copy_of(v, vl)
    }

    fn cuda_fwd(&self, _s: &CudaStorage, _l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (vs, vl) = self.value.storage_and_layout();
        let Storage::Cuda(v) = &*vs else {
            return Err(err("the value is not on the CUDA device"));
        };
        copy_of(v, vl)
    }

    /// `dx = (onehot(t) − p) · g / T` with `p = softmax(x / T)`. On the fused CPU path one
    /// kernel writes it from the forward's row statistics. Otherwise `−p·g/T` is built in one
    /// row from `exp(x/T − max)` and the row sums, then `g/T` added at each target in place;
    /// rows are dropped as soon as the next one exists, so at most two vocabulary-wide rows
    /// are alive here beside the logits.
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let targets = match &self.backward {
            Backward::Fused(rows) => {
                let inv_t = self.inv_temperature as f32;
                return Ok(Some(cpu_ops::target_logprob_grad(arg, rows, grad, inv_t)?));
            }
            Backward::Ops { targets } => targets,
        };
        let g = (grad.to_dtype(DType::F32)? * self.inv_temperature)?.unsqueeze(D::Minus1)?;
        let e = {
            let x = arg.detach().to_dtype(DType::F32)?;
            let z = if self.inv_temperature == 1.0 {
                x
            } else {
                x.affine(self.inv_temperature, 0.0)?
            };
            let max = z.max_keepdim(D::Minus1)?;
            z.broadcast_sub(&max)?.exp()?
        };
        let coeff = g.neg()?.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let dx = e.broadcast_mul(&coeff)?;
        drop(e);
        dx.scatter_add_set(targets, &g, D::Minus1)?;
        Ok(Some(dx.to_dtype(arg.dtype())?))
    }
}

/// `log softmax(logits / temperature)[target]` for `logits` `[.., V]` and u32 `targets`
/// `[..]`, differentiable in `logits` through one node that keeps only the logits (see the
/// module's doc). Without a recorded graph it is the plain value.
pub(crate) fn target_logprobs(
    logits: &Tensor,
    targets: &Tensor,
    temperature: f32,
) -> crate::error::Result<Tensor> {
    let inv_temperature = 1.0 / f64::from(temperature);
    let x = logits.detach();
    let (value, backward) = if cpu_ops::applies(&x) && targets.dtype() == DType::U32 {
        let ids = targets.flatten_all()?.to_vec1::<u32>()?;
        // As candle's `x / T` rounds 1/T: to f32 from the f64 quotient.
        let (value, rows) = cpu_ops::target_logprob_rows(&x, ids, inv_temperature as f32)?;
        let value = Tensor::from_vec(value, targets.shape(), x.device())?;
        (value, Backward::Fused(rows))
    } else {
        let targets = targets.unsqueeze(D::Minus1)?.contiguous()?;
        let scaled = if temperature != 1.0 {
            (x / f64::from(temperature))?
        } else {
            x
        };
        // The gather's output is a fresh contiguous storage of exactly the targets' shape.
        let value = log_softmax_last(&scaled)?
            .gather(&targets, D::Minus1)?
            .squeeze(D::Minus1)?
            .contiguous()?;
        (value, Backward::Ops { targets })
    };
    if !logits.track_op() {
        return Ok(value);
    }
    Ok(logits.apply_op1(TargetLogProb {
        value,
        inv_temperature,
        backward,
    })?)
}

#[cfg(test)]
#[path = "target_logprob_tests.rs"]
mod tests;
