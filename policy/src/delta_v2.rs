//! The tensor body shared by delta formats 2 and 3 (`docs/storage.md`, "Snapshot delta
//! payload"), and format 2's record layout: per tensor, the changed positions (gap varints or
//! a bitmap, whichever is smaller) and the changed values as zigzag-coded differences of their
//! bf16 bits against the base, split into a low-byte and a high-byte plane; format 2 compresses
//! each tensor's body on its own, format 3 (`delta_v3.rs`) packs small ones into one body.
//!
//! Heads are parsed and bounds-checked (kind, count, sizes) before anything is decompressed;
//! a body decompresses into at most its declared size, which is bounded by its tensors' size;
//! a segment's tensors are written only after all their bodies were checked, and every write
//! is an addition of a difference, so [`Segment::undo`] restores them exactly.

use super::{count_changes, for_each_change, put_varint, DeltaError, Reader, Result};
use super::{KIND_BITMAP, KIND_DENSE, KIND_GAPS, KIND_UNCHANGED};

/// zstd level of a compressed body of `raw_len` bytes. A small body (a small model's tensors,
/// a few thousand changes) is dominated by zstd's per-frame tables, which level 19 codes 4–9 %
/// smaller in milliseconds; a large one at level 19 would cost seconds a version, and level 3
/// (zstd's default) measured within 1 % of level 9 there (`docs/broadcast.md`).
fn zstd_level(raw_len: usize) -> i32 {
    if raw_len <= SMALL_BODY {
        19
    } else {
        3
    }
}

/// The largest body compressed at level 19; format 3 packs consecutive tensors whose bodies
/// are at most this large into one body of at most this size.
pub(super) const SMALL_BODY: usize = 64 * 1024;

/// What a tensor's record says before its body: the record kind and the body's size, checked
/// against the tensor's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Head {
    Unchanged,
    /// `count` changed positions, as gap varints (`bitmap == false`) or a bitmap; a body of
    /// `raw_len` bytes.
    Sparse {
        bitmap: bool,
        count: usize,
        raw_len: usize,
    },
    /// A difference for every element (`raw_len` = 2·numel).
    Dense {
        raw_len: usize,
    },
}

impl Head {
    /// Bytes of the decompressed body.
    pub(super) fn raw_len(&self) -> usize {
        match *self {
            Head::Unchanged => 0,
            Head::Sparse { raw_len, .. } | Head::Dense { raw_len } => raw_len,
        }
    }

    fn kind(&self) -> u8 {
        match *self {
            Head::Unchanged => KIND_UNCHANGED,
            Head::Sparse { bitmap: false, .. } => KIND_GAPS,
            Head::Sparse { bitmap: true, .. } => KIND_BITMAP,
            Head::Dense { .. } => KIND_DENSE,
        }
    }

    /// Appends the head: kind u8, then count varint (sparse), then body length varint
    /// (unless unchanged).
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        out.push(self.kind());
        match *self {
            Head::Unchanged => {}
            Head::Sparse { count, raw_len, .. } => {
                put_varint(out, count as u64);
                put_varint(out, raw_len as u64);
            }
            Head::Dense { raw_len } => put_varint(out, raw_len as u64),
        }
    }
}

/// The head of the record that turns tensor bytes `b` into `n` (`numel` values each), from
/// the first pass: dense when `2·numel` is not larger than the smaller sparse body, else gaps
/// when they are not larger than the bitmap, else the bitmap.
pub(super) fn plan(b: &[u8], n: &[u8], numel: usize) -> Head {
    let super::Changes { count, gap_bytes } = count_changes(b, n, numel);
    if count == 0 {
        return Head::Unchanged;
    }
    let gaps = gap_bytes + 2 * count;
    let bitmap = numel.div_ceil(8) + 2 * count;
    let dense = 2 * numel;
    if dense <= gaps.min(bitmap) {
        Head::Dense { raw_len: dense }
    } else {
        Head::Sparse {
            bitmap: gaps > bitmap,
            count,
            raw_len: gaps.min(bitmap),
        }
    }
}

/// Appends the body `head` ([`plan`]) announces for `b` → `n`: the index, then the low and
/// the high bytes of the zigzag-coded differences.
pub(super) fn write_body(head: &Head, b: &[u8], n: &[u8], numel: usize, out: &mut Vec<u8>) {
    match *head {
        Head::Unchanged => {}
        Head::Dense { .. } => {
            let at = out.len();
            out.resize(at + 2 * numel, 0);
            let (lo, hi) = out[at..].split_at_mut(numel);
            for i in 0..numel {
                let z = zigzag(get(b, i), get(n, i));
                lo[i] = z as u8;
                hi[i] = (z >> 8) as u8;
            }
        }
        Head::Sparse { bitmap, count, .. } => {
            let at = out.len();
            if bitmap {
                out.resize(at + numel.div_ceil(8), 0);
            }
            let mut lo = Vec::with_capacity(count);
            let mut hi = Vec::with_capacity(count);
            let mut next = 0usize;
            for_each_change(b, n, numel, |i| {
                if bitmap {
                    out[at + i / 8] |= 1 << (i % 8);
                } else {
                    put_varint(out, (i - next) as u64);
                    next = i + 1;
                }
                let z = zigzag(get(b, i), get(n, i));
                lo.push(z as u8);
                hi.push((z >> 8) as u8);
            });
            out.extend_from_slice(&lo);
            out.extend_from_slice(&hi);
        }
    }
}

/// A body compressed at the level its size calls for.
pub(super) fn compress(raw: &[u8]) -> Result<Vec<u8>> {
    zstd::bulk::compress(raw, zstd_level(raw.len()))
        .map_err(|e| DeltaError::Incompatible(format!("zstd compression failed: {e}")))
}

/// The format-2 record that turns tensor bytes `b` into `n` (`numel` values each): the head,
/// then (unless unchanged) the compressed length and the compressed body.
pub(super) fn encode_tensor(b: &[u8], n: &[u8], numel: usize) -> Result<Vec<u8>> {
    let head = plan(b, n, numel);
    let mut out = Vec::new();
    head.write(&mut out);
    if head != Head::Unchanged {
        let mut raw = Vec::with_capacity(head.raw_len());
        write_body(&head, b, n, numel, &mut raw);
        let comp = compress(&raw)?;
        put_varint(&mut out, comp.len() as u64);
        out.extend_from_slice(&comp);
    }
    Ok(out)
}

/// Tensors `first..first + heads.len()` with one compressed body: the bodies their heads
/// announce, concatenated. Format 2 has one tensor per segment, format 3 packs small ones.
#[derive(Debug, Clone)]
pub(super) struct Segment<'a> {
    pub(super) first: usize,
    pub(super) heads: Vec<Head>,
    /// Σ of the heads' body lengths; `body` is empty when it is 0.
    pub(super) raw_len: usize,
    pub(super) body: &'a [u8],
}

impl Segment<'_> {
    /// Decompresses and checks every body, then writes this segment's tensors `dsts` (in
    /// order; `ranges` their offsets and sizes), each first copied from `base` when one is
    /// given. On an error nothing was written.
    pub(super) fn apply(
        &self,
        dsts: &mut [&mut [u8]],
        ranges: &[(usize, usize)],
        base: Option<&[u8]>,
    ) -> Result<()> {
        let raw = self.decompress()?;
        let mut at = 0;
        let mut parts = Vec::with_capacity(self.heads.len());
        for (head, &(_, numel)) in self.heads.iter().zip(ranges) {
            let part = &raw[at..at + head.raw_len()];
            check_body(head, part, numel)?;
            parts.push(part);
            at += head.raw_len();
        }
        for ((dst, head), (part, &(start, numel))) in dsts
            .iter_mut()
            .zip(&self.heads)
            .zip(parts.iter().zip(ranges))
        {
            if let Some(src) = base {
                dst.copy_from_slice(&src[start..start + 2 * numel]);
            }
            add(head, part, dst, true);
        }
        Ok(())
    }

    /// Reverses an [`apply`](Self::apply) that succeeded on `dsts`. The body decompressed
    /// once, so it does again (the codec is deterministic).
    pub(super) fn undo(&self, dsts: &mut [&mut [u8]]) {
        let raw = self
            .decompress()
            .expect("a body that decompressed once decompresses again");
        let mut at = 0;
        for (dst, head) in dsts.iter_mut().zip(&self.heads) {
            add(head, &raw[at..at + head.raw_len()], dst, false);
            at += head.raw_len();
        }
    }

    fn decompress(&self) -> Result<Vec<u8>> {
        if self.raw_len == 0 {
            return Ok(Vec::new());
        }
        decompress(self.body, self.raw_len)
    }
}

/// The zigzag code of the difference `new − base` of two bf16 bit patterns (wrapping).
#[inline]
fn zigzag(base: u16, new: u16) -> u16 {
    let d = new.wrapping_sub(base) as i16;
    ((d << 1) ^ (d >> 15)) as u16
}

/// The difference a zigzag code stands for.
#[inline]
fn unzigzag(z: u16) -> u16 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

#[inline]
fn get(buf: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([buf[2 * i], buf[2 * i + 1]])
}

#[inline]
fn set(buf: &mut [u8], i: usize, v: u16) {
    buf[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
}

/// A varint that must fit `usize`.
pub(super) fn size(r: &mut Reader<'_>, what: &'static str) -> Result<usize> {
    usize::try_from(r.varint(what)?).map_err(|_| DeltaError::Malformed(format!("{what} too large")))
}

/// Reads one tensor's head for a tensor of `numel` values and checks its size: a sparse body
/// is exactly ⌈numel/8⌉ + 2·count bytes with a bitmap and at least 3·count but no more than
/// that with gaps (the encoder takes gaps only when they are not larger), a dense one exactly
/// 2·numel.
pub(super) fn parse_head(r: &mut Reader<'_>, numel: usize) -> Result<Head> {
    let kind = r.u8("record kind")?;
    Ok(match kind {
        KIND_UNCHANGED => Head::Unchanged,
        KIND_GAPS | KIND_BITMAP => {
            let count = r.count(numel)?;
            let raw_len = size(r, "body length")?;
            let bitmap_len = numel.div_ceil(8) + 2 * count;
            let ok = if kind == KIND_BITMAP {
                raw_len == bitmap_len
            } else {
                raw_len >= 3 * count && raw_len <= bitmap_len
            };
            if !ok {
                return Err(DeltaError::Malformed(format!(
                    "record body of {raw_len} bytes for {count} changes in {numel} values"
                )));
            }
            Head::Sparse {
                bitmap: kind == KIND_BITMAP,
                count,
                raw_len,
            }
        }
        KIND_DENSE => {
            let raw_len = size(r, "body length")?;
            if raw_len != 2 * numel {
                return Err(DeltaError::Malformed(format!(
                    "dense body of {raw_len} bytes for {numel} values"
                )));
            }
            Head::Dense { raw_len }
        }
        other => {
            return Err(DeltaError::Malformed(format!(
                "unknown record kind {other}"
            )))
        }
    })
}

/// Reads a format-2 record (tensor `index`, of `numel` values) as a segment of one tensor:
/// its head, then unless unchanged the compressed length and bytes, which lie inside the
/// delta.
pub(super) fn parse_record<'a>(
    r: &mut Reader<'a>,
    index: usize,
    numel: usize,
) -> Result<Segment<'a>> {
    let head = parse_head(r, numel)?;
    let body = match head {
        Head::Unchanged => &[][..],
        _ => {
            let comp_len = size(r, "compressed length")?;
            r.take(comp_len, "compressed body")?
        }
    };
    Ok(Segment {
        first: index,
        heads: vec![head],
        raw_len: head.raw_len(),
        body,
    })
}

/// Decompresses a body into at most `raw_len` bytes (zstd stops with an error rather than
/// write past the buffer) and requires exactly that many.
fn decompress(body: &[u8], raw_len: usize) -> Result<Vec<u8>> {
    let raw = zstd::bulk::decompress(body, raw_len)
        .map_err(|e| DeltaError::Malformed(format!("record body does not decompress: {e}")))?;
    if raw.len() != raw_len {
        return Err(DeltaError::Malformed(format!(
            "record body decompresses to {} bytes, its header says {raw_len}",
            raw.len()
        )));
    }
    Ok(raw)
}

/// The changed positions of a checked sparse body, in order.
fn positions<'a>(
    raw: &'a [u8],
    bitmap: bool,
    count: usize,
) -> Box<dyn Iterator<Item = usize> + 'a> {
    let index = &raw[..raw.len() - 2 * count];
    if bitmap {
        Box::new(index.iter().enumerate().flat_map(|(k, &byte)| {
            let mut bits = byte;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let p = 8 * k + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    p
                })
            })
        }))
    } else {
        let mut r = Reader { buf: index, pos: 0 };
        let mut next = 0usize;
        Box::new(std::iter::from_fn(move || {
            let gap = r.varint("gap").ok()? as usize;
            let p = next + gap;
            next = p + 1;
            Some(p)
        }))
    }
}

/// Checks a decompressed sparse body: exactly `count` increasing positions inside the tensor
/// that fill the index section, and no zero difference.
fn check_sparse(raw: &[u8], bitmap: bool, count: usize, numel: usize) -> Result<()> {
    let index = &raw[..raw.len() - 2 * count];
    let (lo, hi) = raw[raw.len() - 2 * count..].split_at(count);
    if lo.iter().zip(hi).any(|(&l, &h)| l == 0 && h == 0) {
        return Err(DeltaError::Malformed(
            "a listed position does not change".into(),
        ));
    }
    if bitmap {
        super::check_bitmap(index, numel, count)?;
        return Ok(());
    }
    let mut r = Reader { buf: index, pos: 0 };
    let mut next = 0u64;
    for _ in 0..count {
        next = next
            .checked_add(r.varint("gap")?)
            .filter(|&p| p < numel as u64)
            .ok_or_else(|| DeltaError::Malformed("position out of range".into()))?
            + 1;
    }
    if r.pos != index.len() {
        return Err(DeltaError::Malformed(format!(
            "{} bytes after the last gap",
            index.len() - r.pos
        )));
    }
    Ok(())
}

/// Checks a decompressed body against its head: a sparse one lists exactly `count`
/// increasing positions inside the tensor, filling the index section, and no zero difference.
fn check_body(head: &Head, raw: &[u8], numel: usize) -> Result<()> {
    match *head {
        Head::Sparse { bitmap, count, .. } => check_sparse(raw, bitmap, count, numel),
        Head::Unchanged | Head::Dense { .. } => Ok(()),
    }
}

/// Adds (`forward`) or subtracts the differences of a checked body to tensor bytes `dst`.
fn add(head: &Head, raw: &[u8], dst: &mut [u8], forward: bool) {
    let step = |dst: &mut [u8], i: usize, z: u16| {
        let d = unzigzag(z);
        let old = get(dst, i);
        set(
            dst,
            i,
            if forward {
                old.wrapping_add(d)
            } else {
                old.wrapping_sub(d)
            },
        );
    };
    match *head {
        Head::Unchanged => {}
        Head::Dense { .. } => {
            let numel = raw.len() / 2;
            let (lo, hi) = raw.split_at(numel);
            for i in 0..numel {
                step(dst, i, u16::from(lo[i]) | (u16::from(hi[i]) << 8));
            }
        }
        Head::Sparse { bitmap, count, .. } => {
            let (lo, hi) = raw[raw.len() - 2 * count..].split_at(count);
            for (k, p) in positions(raw, bitmap, count).enumerate() {
                step(dst, p, u16::from(lo[k]) | (u16::from(hi[k]) << 8));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_roundtrips_every_pair_difference() {
        for (b, n) in [
            (0u16, 0u16),
            (1, 2),
            (2, 1),
            (0, 0xffff),
            (0xffff, 0),
            (0x3f80, 0x3f81),
        ] {
            assert_eq!(b.wrapping_add(unzigzag(zigzag(b, n))), n);
        }
        // One ulp up or down costs the smallest codes.
        assert_eq!(zigzag(0x3f80, 0x3f81), 2);
        assert_eq!(zigzag(0x3f80, 0x3f7f), 1);
        for z in 0..=u16::MAX {
            assert_eq!(zigzag(0, unzigzag(z)), z);
        }
    }
}
