//! Delta format version 1 (`docs/storage.md`, "Snapshot delta payload"): raw gap varints or a
//! bitmap per tensor, then the new bf16 bits, uncompressed. Still read ([`super::apply`]);
//! written only by [`super::encode_v1`] (compatibility tests, size comparisons).

use super::{count_changes, for_each_change, put_varint, varint_len, DeltaError, Reader, Result};
use super::{KIND_BITMAP, KIND_DENSE, KIND_GAPS, KIND_UNCHANGED};

/// Appends one tensor record: first pass counts the changes and the exact size of the gap
/// encoding, then the smallest of gaps / bitmap / dense is written in a second pass.
pub(super) fn encode_tensor(b: &[u8], n: &[u8], numel: usize, out: &mut Vec<u8>) {
    let super::Changes { count, gap_bytes } = count_changes(b, n, numel);
    if count == 0 {
        out.push(KIND_UNCHANGED);
        return;
    }
    let head = varint_len(count as u64);
    let gaps = head + gap_bytes + 2 * count;
    let bitmap = head + numel.div_ceil(8) + 2 * count;
    let dense = 2 * numel;
    if dense <= gaps.min(bitmap) {
        out.push(KIND_DENSE);
        out.extend_from_slice(n);
        return;
    }
    let mut values = Vec::with_capacity(2 * count);
    if gaps <= bitmap {
        out.push(KIND_GAPS);
        put_varint(out, count as u64);
        let mut next = 0usize;
        for_each_change(b, n, numel, |i| {
            put_varint(out, (i - next) as u64);
            next = i + 1;
            values.extend_from_slice(&n[2 * i..2 * i + 2]);
        });
    } else {
        out.push(KIND_BITMAP);
        put_varint(out, count as u64);
        let at = out.len();
        out.resize(at + numel.div_ceil(8), 0);
        for_each_change(b, n, numel, |i| {
            out[at + i / 8] |= 1 << (i % 8);
            values.extend_from_slice(&n[2 * i..2 * i + 2]);
        });
    }
    out.extend_from_slice(&values);
}

/// Decodes one tensor record into `dst` (the tensor's bytes, pre-filled with the base).
pub(super) fn apply_tensor(r: &mut Reader<'_>, dst: &mut [u8], numel: usize) -> Result<()> {
    match r.u8("record kind")? {
        KIND_UNCHANGED => Ok(()),
        KIND_DENSE => {
            dst.copy_from_slice(r.take(2 * numel, "dense values")?);
            Ok(())
        }
        KIND_GAPS => {
            let count = r.count(numel)?;
            // Positions come first, then values: find where the positions end, then walk both.
            let idx_start = r.pos;
            for _ in 0..count {
                r.varint("gap")?;
            }
            let mut idx = Reader {
                buf: &r.buf[idx_start..r.pos],
                pos: 0,
            };
            let values = r.take(2 * count, "values")?;
            let mut next = 0u64;
            for k in 0..count {
                let pos = next
                    .checked_add(idx.varint("gap")?)
                    .filter(|&p| p < numel as u64)
                    .ok_or_else(|| DeltaError::Malformed("position out of range".into()))?
                    as usize;
                dst[2 * pos..2 * pos + 2].copy_from_slice(&values[2 * k..2 * k + 2]);
                next = pos as u64 + 1;
            }
            Ok(())
        }
        KIND_BITMAP => {
            let count = r.count(numel)?;
            let bitmap = r.take(numel.div_ceil(8), "bitmap")?;
            let values = r.take(2 * count, "values")?;
            super::check_bitmap(bitmap, numel, count)?;
            let mut k = 0;
            for (byte_i, &byte) in bitmap.iter().enumerate() {
                let mut bits = byte;
                while bits != 0 {
                    let pos = 8 * byte_i + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    dst[2 * pos..2 * pos + 2].copy_from_slice(&values[2 * k..2 * k + 2]);
                    k += 1;
                }
            }
            Ok(())
        }
        other => Err(DeltaError::Malformed(format!(
            "unknown record kind {other}"
        ))),
    }
}
