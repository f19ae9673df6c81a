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
//! Every device runs the same tensor ops: the forward's value is computed with the model's own
//! log-softmax (the fused CPU kernel or the elementary ops, exactly as before, so the values are
//! bit-identical to the spelled-out form) and the op's storage-level forward only copies it
//! (`BackendStorage::try_clone`, on the CPU and on CUDA); the backward is ordinary tensor ops.
//! No device kernel is written here.
//!
//! Must not touch: anything but this op.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor, D,
};

use super::log_softmax_last;

fn err(msg: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("target_logprob: {msg}"))
}

struct TargetLogProb {
    /// `[.., 1]` u32, the target of each position.
    targets: Tensor,
    /// `[..]` f32, the forward's value (computed detached), contiguous from offset 0.
    value: Tensor,
    /// `1 / T`.
    inv_temperature: f64,
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

    /// `dx = (onehot(t) − p) · g / T` with `p = softmax(x / T)`: `−p·g/T` built in one
    /// row from `exp(x/T − max)` and the row sums, then `g/T` added at each target in place.
    /// Rows are dropped as soon as the next one exists, so at most two vocabulary-wide rows
    /// are alive here beside the logits.
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
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
        dx.scatter_add_set(&self.targets, &g, D::Minus1)?;
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
    let targets = targets.unsqueeze(D::Minus1)?.contiguous()?;
    let x = logits.detach();
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
    drop(scaled);
    if !logits.track_op() {
        return Ok(value);
    }
    Ok(logits.apply_op1(TargetLogProb {
        targets,
        value,
        inv_temperature: 1.0 / f64::from(temperature),
    })?)
}

#[cfg(test)]
#[path = "target_logprob_tests.rs"]
mod tests;
