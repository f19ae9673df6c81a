//! Delta format version 2 (`docs/storage.md`, "Snapshot delta payload"): per tensor, the
//! changed positions (gap varints or a bitmap, whichever is smaller) and the changed values as
//! zigzag-coded differences of their bf16 bits against the base, split into a low-byte and a
//! high-byte plane, the whole record body compressed with zstd.
//!
//! A record is parsed and bounds-checked (kind, count, sizes) before anything is decompressed;
//! a body decompresses into at most its declared size, which is bounded by the tensor's size;
//! a tensor is written only after its whole body was checked, and every write is an addition of
//! a difference, so [`undo`] restores it exactly.

use super::{count_changes, for_each_change, put_varint, DeltaError, Reader, Result};
use super::{KIND_BITMAP, KIND_DENSE, KIND_GAPS, KIND_UNCHANGED};

/// zstd level of record bodies. Level 3 (zstd's default) measured no larger than 1 % above
/// level 9 on the 0.6B shape's deltas at a fraction of the time (`docs/broadcast.md`).
const ZSTD_LEVEL: i32 = 3;

/// A tensor record, parsed and bounds-checked, its body still compressed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Record<'a> {
    Unchanged,
    /// `count` changed positions, as gap varints (`bitmap == false`) or a bitmap.
    Sparse {
        bitmap: bool,
        count: usize,
        raw_len: usize,
        body: &'a [u8],
    },
    /// A difference for every element.
    Dense {
        raw_len: usize,
        body: &'a [u8],
    },
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

/// The record that turns tensor bytes `b` into `n` (`numel` bf16 values each).
pub(super) fn encode_tensor(b: &[u8], n: &[u8], numel: usize) -> Result<Vec<u8>> {
    let super::Changes { count, gap_bytes } = count_changes(b, n, numel);
    if count == 0 {
        return Ok(vec![KIND_UNCHANGED]);
    }
    let gaps = gap_bytes + 2 * count;
    let bitmap = numel.div_ceil(8) + 2 * count;
    let dense = 2 * numel;
    let (kind, raw) = if dense <= gaps.min(bitmap) {
        let mut raw = vec![0u8; dense];
        let (lo, hi) = raw.split_at_mut(numel);
        for i in 0..numel {
            let z = zigzag(get(b, i), get(n, i));
            lo[i] = z as u8;
            hi[i] = (z >> 8) as u8;
        }
        (KIND_DENSE, raw)
    } else {
        let use_gaps = gaps <= bitmap;
        let index_len = if use_gaps {
            gap_bytes
        } else {
            numel.div_ceil(8)
        };
        let mut raw = Vec::with_capacity(index_len + 2 * count);
        let mut lo = Vec::with_capacity(count);
        let mut hi = Vec::with_capacity(count);
        if !use_gaps {
            raw.resize(index_len, 0);
        }
        let mut next = 0usize;
        for_each_change(b, n, numel, |i| {
            if use_gaps {
                put_varint(&mut raw, (i - next) as u64);
                next = i + 1;
            } else {
                raw[i / 8] |= 1 << (i % 8);
            }
            let z = zigzag(get(b, i), get(n, i));
            lo.push(z as u8);
            hi.push((z >> 8) as u8);
        });
        raw.extend_from_slice(&lo);
        raw.extend_from_slice(&hi);
        (if use_gaps { KIND_GAPS } else { KIND_BITMAP }, raw)
    };
    let comp = zstd::bulk::compress(&raw, ZSTD_LEVEL)
        .map_err(|e| DeltaError::Incompatible(format!("zstd compression failed: {e}")))?;
    let mut out = Vec::with_capacity(comp.len() + 31);
    out.push(kind);
    if kind != KIND_DENSE {
        put_varint(&mut out, count as u64);
    }
    put_varint(&mut out, raw.len() as u64);
    put_varint(&mut out, comp.len() as u64);
    out.extend_from_slice(&comp);
    Ok(out)
}

/// A varint that must fit `usize`.
fn size(r: &mut Reader<'_>, what: &'static str) -> Result<usize> {
    usize::try_from(r.varint(what)?).map_err(|_| DeltaError::Malformed(format!("{what} too large")))
}

/// Reads one record header for a tensor of `numel` values and checks its sizes: a sparse
/// record's body is exactly ⌈numel/8⌉ + 2·count bytes with a bitmap and at least 3·count but
/// no more than that with gaps (the encoder takes gaps only when they are not larger), a dense
/// one's exactly 2·numel; the compressed bytes lie inside the delta.
pub(super) fn parse_record<'a>(r: &mut Reader<'a>, numel: usize) -> Result<Record<'a>> {
    let kind = r.u8("record kind")?;
    let rec = match kind {
        KIND_UNCHANGED => return Ok(Record::Unchanged),
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
            let comp_len = size(r, "compressed length")?;
            Record::Sparse {
                bitmap: kind == KIND_BITMAP,
                count,
                raw_len,
                body: r.take(comp_len, "compressed body")?,
            }
        }
        KIND_DENSE => {
            let raw_len = size(r, "body length")?;
            if raw_len != 2 * numel {
                return Err(DeltaError::Malformed(format!(
                    "dense body of {raw_len} bytes for {numel} values"
                )));
            }
            let comp_len = size(r, "compressed length")?;
            Record::Dense {
                raw_len,
                body: r.take(comp_len, "compressed body")?,
            }
        }
        other => {
            return Err(DeltaError::Malformed(format!(
                "unknown record kind {other}"
            )))
        }
    };
    Ok(rec)
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

/// Adds (`forward`) or subtracts the differences of a checked body to tensor bytes `dst`.
fn add(rec: &Record<'_>, raw: &[u8], dst: &mut [u8], forward: bool) {
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
    match *rec {
        Record::Unchanged => {}
        Record::Dense { .. } => {
            let numel = raw.len() / 2;
            let (lo, hi) = raw.split_at(numel);
            for i in 0..numel {
                step(dst, i, u16::from(lo[i]) | (u16::from(hi[i]) << 8));
            }
        }
        Record::Sparse { bitmap, count, .. } => {
            let (lo, hi) = raw[raw.len() - 2 * count..].split_at(count);
            for (k, p) in positions(raw, bitmap, count).enumerate() {
                step(dst, p, u16::from(lo[k]) | (u16::from(hi[k]) << 8));
            }
        }
    }
}

/// Applies a parsed record to tensor bytes `dst` (`numel` values). On an error nothing of
/// `dst` was written.
pub(super) fn apply(rec: &Record<'_>, dst: &mut [u8], numel: usize) -> Result<()> {
    let raw = match *rec {
        Record::Unchanged => return Ok(()),
        Record::Dense { raw_len, body } => decompress(body, raw_len)?,
        Record::Sparse {
            bitmap,
            count,
            raw_len,
            body,
        } => {
            let raw = decompress(body, raw_len)?;
            check_sparse(&raw, bitmap, count, numel)?;
            raw
        }
    };
    add(rec, &raw, dst, true);
    Ok(())
}

/// Reverses a record [`apply`] applied to `dst`. It decompressed and checked once, so it does
/// again (the codec is deterministic).
pub(super) fn undo(rec: &Record<'_>, dst: &mut [u8]) {
    let raw = match *rec {
        Record::Unchanged => return,
        Record::Dense { raw_len, body } | Record::Sparse { raw_len, body, .. } => {
            decompress(body, raw_len).expect("a body that decompressed once decompresses again")
        }
    };
    add(rec, &raw, dst, false);
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
