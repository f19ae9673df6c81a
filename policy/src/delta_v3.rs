//! Delta format version 3 (`docs/storage.md`, "Snapshot delta payload"): the tensor bodies of
//! format 2, with consecutive small ones packed into one compressed body. A small model's
//! tensors (a few thousand changes each) then share one set of zstd tables instead of paying
//! for one per tensor, which is most of what a small body costs; a large tensor keeps a body
//! of its own, so encoding and applying stay parallel across tensors and bounded in memory.
//!
//! ```text
//! segment := n varint (1 ≤ n ≤ tensors left) · n heads · zstd_len varint · zstd frame
//! head    := kind u8 · [count varint, for gaps and bitmap] · [body_len varint, unless unchanged]
//! ```
//!
//! The frame decompresses to the n bodies concatenated (Σ body_len bytes, no frame and
//! zstd_len 0 when that is 0). A segment of more than one tensor has Σ body_len ≤
//! [`SMALL_BODY`]: a decoder refuses a larger one, so that a hostile delta cannot make it
//! allocate more than one tensor's bound at a time.

use super::v2::{self, Head, Segment, SMALL_BODY};
use super::{put_varint, DeltaError, Reader, Result};

/// The segments of `base` → `new` over `ranges` (the tensors' offsets and sizes), in order:
/// a tensor whose body exceeds [`SMALL_BODY`] alone, runs of smaller ones packed while their
/// bodies together fit it. Planned from the first pass, then built and compressed in parallel.
pub(super) fn encode(base: &[u8], new: &[u8], ranges: &[(usize, usize)]) -> Result<Vec<Vec<u8>>> {
    use rayon::prelude::*;
    let heads: Vec<Head> = ranges
        .par_iter()
        .map(|&(start, numel)| {
            let end = start + 2 * numel;
            v2::plan(&base[start..end], &new[start..end], numel)
        })
        .collect();
    let mut plan: Vec<(usize, usize)> = Vec::new(); // (first tensor, tensors)
    let mut packed = 0usize;
    for (i, h) in heads.iter().enumerate() {
        let len = h.raw_len();
        match plan.last_mut() {
            Some((first, n))
                if len <= SMALL_BODY
                    && packed + len <= SMALL_BODY
                    && heads[*first].raw_len() <= SMALL_BODY =>
            {
                *n += 1;
                packed += len;
            }
            _ => {
                plan.push((i, 1));
                packed = len;
            }
        }
    }
    plan.par_iter()
        .map(|&(first, n)| {
            let heads = &heads[first..first + n];
            let mut out = Vec::new();
            put_varint(&mut out, n as u64);
            let mut raw = Vec::with_capacity(heads.iter().map(Head::raw_len).sum());
            for (head, &(start, numel)) in heads.iter().zip(&ranges[first..first + n]) {
                head.write(&mut out);
                let end = start + 2 * numel;
                v2::write_body(head, &base[start..end], &new[start..end], numel, &mut raw);
            }
            if raw.is_empty() {
                put_varint(&mut out, 0);
            } else {
                let comp = v2::compress(&raw)?;
                put_varint(&mut out, comp.len() as u64);
                out.extend_from_slice(&comp);
            }
            Ok(out)
        })
        .collect()
}

/// Reads the segments that cover tensors of sizes `ranges`, checking every head and size
/// before anything is decompressed.
pub(super) fn parse<'a>(r: &mut Reader<'a>, ranges: &[(usize, usize)]) -> Result<Vec<Segment<'a>>> {
    let mut out = Vec::new();
    let mut first = 0usize;
    while first < ranges.len() {
        let n = v2::size(r, "segment tensor count")?;
        if n == 0 || n > ranges.len() - first {
            return Err(DeltaError::Malformed(format!(
                "a segment of {n} tensors with {} left",
                ranges.len() - first
            )));
        }
        let heads = ranges[first..first + n]
            .iter()
            .map(|&(_, numel)| v2::parse_head(r, numel))
            .collect::<Result<Vec<_>>>()?;
        let raw_len: usize = heads.iter().map(Head::raw_len).sum();
        if n > 1 && raw_len > SMALL_BODY {
            return Err(DeltaError::Malformed(format!(
                "a segment of {n} tensors with {raw_len} body bytes (at most {SMALL_BODY})"
            )));
        }
        let comp_len = v2::size(r, "compressed length")?;
        if (raw_len == 0) != (comp_len == 0) {
            return Err(DeltaError::Malformed(format!(
                "{comp_len} compressed bytes for {raw_len} body bytes"
            )));
        }
        out.push(Segment {
            first,
            heads,
            raw_len,
            body: r.take(comp_len, "compressed body")?,
        });
        first += n;
    }
    Ok(out)
}
