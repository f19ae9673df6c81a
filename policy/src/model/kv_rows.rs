//! Batch-row operations on a KV cache's per-layer keys and values, shared by the training
//! module's cache and the inference path's: prefill once at batch 1, then decode `n` rows, and
//! drop the rows that stopped.

use candle_core::Tensor;

use crate::error::{PolicyError, Result};

/// Repeats every layer's batch-1 keys and values `n` times along the batch dimension: the
/// shared step of both KV caches (this one and the inference path's).
pub(crate) fn repeat_kv_rows<'a>(
    layers: impl Iterator<Item = &'a mut (Tensor, Tensor)>,
    n: usize,
) -> Result<()> {
    for (k, v) in layers {
        if k.dim(0)? != 1 {
            return Err(PolicyError::Sampling(
                "repeat_batch needs a batch-1 cache".into(),
            ));
        }
        *k = k.repeat((n, 1, 1, 1))?;
        *v = v.repeat((n, 1, 1, 1))?;
    }
    Ok(())
}

/// Keeps only the given batch rows (in that order) of every layer's keys and values.
pub(crate) fn select_kv_rows<'a>(
    layers: impl Iterator<Item = &'a mut (Tensor, Tensor)>,
    rows: &[u32],
) -> Result<()> {
    if rows.is_empty() {
        return Err(PolicyError::Sampling("select_rows with no rows".into()));
    }
    for (k, v) in layers {
        let idx = Tensor::new(rows, k.device())?;
        *k = k.index_select(&idx, 0)?;
        *v = v.index_select(&idx, 0)?;
    }
    Ok(())
}
