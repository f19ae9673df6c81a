//! Sparse bf16 deltas between two snapshot payloads (format version [`DELTA_VERSION`]).
//!
//! After one RL step at a realistic learning rate most bf16 weights round to the same 16 bits
//! as before (an Adam step moves a weight by about the learning rate, a bf16 ulp is 2⁻⁸ of
//! the weight's magnitude), so version v is shipped as the positions whose bf16 bits changed
//! against the payload published for v − 1, plus their new values. The delta is taken
//! against the previously *published* bf16 bytes, never against re-rounded f32 weights, so
//! [`apply`] reproduces the new payload bit for bit by construction; it is additionally
//! checked against the BLAKE3 hashes of both payloads that the delta carries.
//!
//! Both payloads must be bf16 safetensors files with byte-identical headers (same tensor
//! names, shapes, order and metadata: what [`crate::Policy::to_safetensors_bytes_as`] writes
//! for two versions of one model). The layout, specified in `docs/storage.md`:
//!
//! ```text
//! magic "ESDL" · version u16 LE · reserved u16 (0) · base BLAKE3 [32] · new BLAKE3 [32]
//! · payload_len u64 LE · n_tensors u32 LE · segments covering the tensors in data-offset order:
//!   n varint · n heads · zstd_len varint · zstd frame of the n bodies, concatenated
//!   head = kind u8: 0 unchanged | 1 gaps: count varint · body_len varint
//!                 | 2 bitmap: count varint · body_len varint | 3 dense: body_len varint
//!   body = index (count gap varints | ⌈numel/8⌉ bitmap bytes | nothing)
//!          · low bytes · high bytes of zigzag(new bits − base bits)
//! ```
//!
//! Version 3 (written by [`encode`]) codes the changed values as differences against the
//! base, which after a small step are mostly ±1 ulp, and compresses them with zstd, packing
//! consecutive small tensors into one frame; version 2 (still read; [`encode_v2`]) compressed
//! every tensor on its own; version 1 (still read; [`encode_v1`]) stored the index raw and the
//! new bits verbatim. Decoding is hostile-input safe: every count is bounded by the tensor's
//! element count, every body's size by its tensor's, every read by the delta's length, and
//! nothing is decompressed beyond the size a head declares. Encoding and applying run across
//! segments in parallel; [`apply_in_place`] rewrites the base payload itself and restores it
//! on any error.
//!
//! Must not touch: manifests, chunks or the network; which versions are keyframes is the
//! pure rule [`is_keyframe`], applied by the publisher.

use rayon::prelude::*;
use safetensors::tensor::Dtype;

#[path = "delta_v1.rs"]
mod v1;
#[path = "delta_v2.rs"]
mod v2;
#[path = "delta_v3.rs"]
mod v3;

/// The delta format version written by [`encode`].
pub const DELTA_VERSION: u16 = 3;
/// The older format versions [`apply`] still reads ([`encode_v2`] and [`encode_v1`] write
/// them).
pub const DELTA_VERSION_V2: u16 = 2;
pub const DELTA_VERSION_V1: u16 = 1;
/// The first four bytes of every delta payload.
pub const DELTA_MAGIC: [u8; 4] = *b"ESDL";
/// Bytes before the first tensor record.
const HEADER_LEN: usize = 4 + 2 + 2 + 32 + 32 + 8 + 4;

const KIND_UNCHANGED: u8 = 0;
const KIND_GAPS: u8 = 1;
const KIND_BITMAP: u8 = 2;
const KIND_DENSE: u8 = 3;

/// Why a delta could not be made or applied.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DeltaError {
    /// The two payloads cannot be delta-coded (not bf16 safetensors, or different headers):
    /// the publisher ships a keyframe instead.
    #[error("payloads cannot be delta-coded: {0}")]
    Incompatible(String),
    /// The bytes do not start with [`DELTA_MAGIC`].
    #[error("not a delta payload (bad magic)")]
    BadMagic,
    /// A delta of a format version this build does not read.
    #[error(
        "unsupported delta version {0} (this build reads {DELTA_VERSION_V1} to {DELTA_VERSION})"
    )]
    UnsupportedVersion(u16),
    /// The delta was made against another base payload than the one it is applied to.
    #[error(
        "delta base mismatch: the delta needs base {expected}, the installed payload is {found}"
    )]
    WrongBase {
        /// BLAKE3 (hex) of the base named by the delta.
        expected: String,
        /// BLAKE3 (hex) of the payload it was applied to.
        found: String,
    },
    /// The delta ended before a record it announced.
    #[error("delta truncated: {0}")]
    Truncated(&'static str),
    /// A field of the delta is out of range or inconsistent.
    #[error("malformed delta: {0}")]
    Malformed(String),
    /// The delta decoded but the result is not the payload whose hash it names.
    #[error("delta does not reconstruct its payload: expected {expected}, got {found}")]
    NotReconstructed {
        /// BLAKE3 (hex) the delta names.
        expected: String,
        /// BLAKE3 (hex) of what applying it produced.
        found: String,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, DeltaError>;

/// Whether `bytes` look like a delta payload (start with [`DELTA_MAGIC`]).
pub fn is_delta(bytes: &[u8]) -> bool {
    bytes.starts_with(&DELTA_MAGIC)
}

/// The keyframe rule: version `version` is published as a full payload when there is no base
/// to delta against (`last_keyframe` is `None`: the first version, or after a restart), when
/// `keyframe_every` versions have passed since the last keyframe (so a late joiner or a worker
/// that fell behind never needs more than `keyframe_every − 1` deltas on top of a keyframe),
/// or when the delta saves less than a tenth of the full payload: a dense update (every
/// value changed, as at learning rate 1e-3) gives a delta a few hundred bytes smaller than
/// the payload, which would save nothing and only lengthen the chain of dependencies.
/// `keyframe_every` of 0 or 1 means every version is a keyframe.
pub fn is_keyframe(
    version: u64,
    last_keyframe: Option<u64>,
    keyframe_every: u64,
    delta_len: usize,
    full_len: usize,
) -> bool {
    match last_keyframe {
        None => true,
        Some(k) => {
            keyframe_every <= 1
                || version.saturating_sub(k) >= keyframe_every
                || delta_len.saturating_mul(10) > full_len.saturating_mul(9)
        }
    }
}

/// Per-tensor (data start offset in the payload, element count), in data-offset order, of a
/// bf16 safetensors payload; also the total payload length it implies.
fn tensor_ranges(payload: &[u8]) -> Result<(usize, Vec<(usize, usize)>)> {
    let (n, meta) = safetensors::SafeTensors::read_metadata(payload)
        .map_err(|e| DeltaError::Incompatible(format!("not a safetensors payload: {e}")))?;
    let data_start = 8 + n;
    let mut ranges = Vec::new();
    for (name, info) in meta.tensors() {
        if info.dtype != Dtype::BF16 {
            return Err(DeltaError::Incompatible(format!(
                "tensor {name} is {:?}, deltas need bf16",
                info.dtype
            )));
        }
        let (s, e) = info.data_offsets;
        ranges.push((data_start + s, (e - s) / 2));
    }
    ranges.sort_unstable();
    let end = ranges
        .last()
        .map_or(data_start, |&(s, numel)| s + 2 * numel);
    if end != payload.len() {
        return Err(DeltaError::Incompatible(format!(
            "payload is {} bytes, its header describes {end}",
            payload.len()
        )));
    }
    Ok((data_start, ranges))
}

/// The delta that turns `base` into `new` (both bf16 safetensors payloads with identical
/// headers), in format version [`DELTA_VERSION`]. Deterministic; tensors are encoded in
/// parallel, each record on its own (memory: the records, plus one record body per thread).
/// Errors with [`DeltaError::Incompatible`] when the payloads cannot be delta-coded; the
/// caller then publishes `new` whole.
pub fn encode(base: &[u8], new: &[u8]) -> Result<Vec<u8>> {
    let (hb, hn) = rayon::join(|| hash(base), || hash(new));
    encode_hashed(base, *hb.as_bytes(), new, *hn.as_bytes())
}

/// [`encode`] for a caller that already knows both payloads' BLAKE3 (a publisher hashed them
/// for their manifests): two passes over the payloads fewer. The hashes are written as given;
/// a wrong one gives a delta that every [`apply`] refuses.
pub fn encode_hashed(
    base: &[u8],
    base_hash: [u8; 32],
    new: &[u8],
    new_hash: [u8; 32],
) -> Result<Vec<u8>> {
    let ranges = compatible(base, new)?;
    let segments = v3::encode(base, new, &ranges)?;
    let mut out = Vec::with_capacity(HEADER_LEN + segments.iter().map(Vec::len).sum::<usize>());
    write_header(
        &mut out,
        DELTA_VERSION,
        base_hash,
        new_hash,
        new.len(),
        ranges.len(),
    )?;
    for seg in &segments {
        out.extend_from_slice(seg);
    }
    Ok(out)
}

/// The same delta in format version 2 (every tensor's body compressed on its own; what builds
/// before version 3 wrote): kept so that the reader of version 2 stays tested and the two can
/// be compared.
pub fn encode_v2(base: &[u8], new: &[u8]) -> Result<Vec<u8>> {
    let ranges = compatible(base, new)?;
    let (hb, hn) = rayon::join(|| hash(base), || hash(new));
    let records = ranges
        .par_iter()
        .map(|&(start, numel)| {
            let end = start + 2 * numel;
            v2::encode_tensor(&base[start..end], &new[start..end], numel)
        })
        .collect::<Result<Vec<Vec<u8>>>>()?;
    let mut out = Vec::with_capacity(HEADER_LEN + records.iter().map(Vec::len).sum::<usize>());
    write_header(
        &mut out,
        DELTA_VERSION_V2,
        *hb.as_bytes(),
        *hn.as_bytes(),
        new.len(),
        ranges.len(),
    )?;
    for r in &records {
        out.extend_from_slice(r);
    }
    Ok(out)
}

/// The same delta in format version 1 (uncompressed; what builds before version 2 wrote):
/// kept so that the reader of version 1 stays tested and the two can be compared.
pub fn encode_v1(base: &[u8], new: &[u8]) -> Result<Vec<u8>> {
    let ranges = compatible(base, new)?;
    let mut out = Vec::with_capacity(HEADER_LEN + 1024);
    let (hb, hn) = rayon::join(|| hash(base), || hash(new));
    write_header(
        &mut out,
        DELTA_VERSION_V1,
        *hb.as_bytes(),
        *hn.as_bytes(),
        new.len(),
        ranges.len(),
    )?;
    for &(start, numel) in &ranges {
        let end = start + 2 * numel;
        v1::encode_tensor(&base[start..end], &new[start..end], numel, &mut out);
    }
    Ok(out)
}

/// The tensors of `base`, if `new` has the same header (and so the same tensors).
fn compatible(base: &[u8], new: &[u8]) -> Result<Vec<(usize, usize)>> {
    let (data_start, ranges) = tensor_ranges(base)?;
    if new.len() != base.len() || new[..data_start] != base[..data_start] {
        return Err(DeltaError::Incompatible(
            "the payload headers differ (other tensors, shapes or config)".into(),
        ));
    }
    Ok(ranges)
}

/// BLAKE3 of a payload, hashed across threads (payloads are hundreds of MB).
fn hash(bytes: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update_rayon(bytes);
    h.finalize()
}

fn write_header(
    out: &mut Vec<u8>,
    version: u16,
    base_hash: [u8; 32],
    new_hash: [u8; 32],
    len: usize,
    n_tensors: usize,
) -> Result<()> {
    let n_tensors = u32::try_from(n_tensors)
        .map_err(|_| DeltaError::Incompatible("too many tensors".into()))?;
    out.extend_from_slice(&DELTA_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&base_hash);
    out.extend_from_slice(&new_hash);
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out.extend_from_slice(&n_tensors.to_le_bytes());
    Ok(())
}

/// Whether element `i` differs between two little-endian u16 arrays.
#[inline]
/// A bitmap record's positions: exactly `count` bits set, none past the tensor's `numel`.
fn check_bitmap(bitmap: &[u8], numel: usize, count: usize) -> Result<()> {
    let set: usize = bitmap.iter().map(|b| b.count_ones() as usize).sum();
    if set != count {
        return Err(DeltaError::Malformed(format!(
            "bitmap has {set} positions, the record announces {count}"
        )));
    }
    if !numel.is_multiple_of(8) && bitmap[numel / 8] >> (numel % 8) != 0 {
        return Err(DeltaError::Malformed("bitmap bit past the tensor".into()));
    }
    Ok(())
}

fn differs(b: &[u8], n: &[u8], i: usize) -> bool {
    b[2 * i] != n[2 * i] || b[2 * i + 1] != n[2 * i + 1]
}

/// How many positions of a tensor changed, and the bytes their gap varints take (the first
/// pass of both formats' encoders, which pick the record kind from it).
#[derive(Debug, Clone, Copy)]
struct Changes {
    count: usize,
    gap_bytes: usize,
}

fn count_changes(b: &[u8], n: &[u8], numel: usize) -> Changes {
    let (mut count, mut gap_bytes, mut next) = (0usize, 0usize, 0usize);
    for_each_change(b, n, numel, |i| {
        gap_bytes += varint_len((i - next) as u64);
        next = i + 1;
        count += 1;
    });
    Changes { count, gap_bytes }
}

/// Visits the positions where `b` and `n` differ, in order. Compares eight bytes at a time
/// and only looks at single elements inside words that differ.
fn for_each_change(b: &[u8], n: &[u8], numel: usize, mut f: impl FnMut(usize)) {
    let words = numel / 4;
    for w in 0..words {
        let o = 8 * w;
        if b[o..o + 8] != n[o..o + 8] {
            for i in 4 * w..4 * w + 4 {
                if differs(b, n, i) {
                    f(i);
                }
            }
        }
    }
    for i in 4 * words..numel {
        if differs(b, n, i) {
            f(i);
        }
    }
}

/// Applies `delta` to `base`, returning the new payload. Refuses a delta made against another
/// base ([`DeltaError::WrongBase`]), a truncated, oversized or out-of-range one, and one whose
/// result does not hash to the payload it names ([`DeltaError::NotReconstructed`]). Writes
/// the result into a new buffer, each tensor copied from `base` and patched in one pass;
/// [`apply_in_place`] rewrites the payload it is given.
pub fn apply(base: &[u8], delta: &[u8]) -> Result<Vec<u8>> {
    let checked = check_header(base, delta)?;
    if checked.version == DELTA_VERSION_V1 {
        let mut out = base.to_vec();
        apply_v1(&mut out, checked)?;
        return Ok(out);
    }
    // Fresh (untouched) pages, each tensor copied and patched by the thread that applies it:
    // one pass over memory instead of a serial copy and then a parallel one.
    let mut out = vec![0u8; base.len()];
    let mut at = 0;
    for &(start, numel) in &checked.ranges {
        out[at..start].copy_from_slice(&base[at..start]);
        at = start + 2 * numel;
    }
    out[at..].copy_from_slice(&base[at..]);
    let Parsed {
        segments,
        ranges,
        new_hash,
    } = checked.segments()?;
    let mut groups = segment_slices(&mut out, &ranges, &segments)?;
    groups
        .par_iter_mut()
        .zip(segments.par_iter())
        .try_for_each(|(dsts, seg)| seg.apply(dsts, seg_ranges(&ranges, seg), Some(base)))?;
    drop(groups);
    check_result(&out, &new_hash)?;
    Ok(out)
}

/// A version-1 delta applied to `payload` (through a copy: version 1 is applied serially).
fn apply_v1(payload: &mut [u8], checked: Checked<'_>) -> Result<()> {
    let Checked {
        new_hash,
        ranges,
        mut records,
        ..
    } = checked;
    let mut out = payload.to_vec();
    for &(start, numel) in &ranges {
        v1::apply_tensor(&mut records, &mut out[start..start + 2 * numel], numel)?;
    }
    trailing(&records)?;
    check_result(&out, &new_hash)?;
    payload.copy_from_slice(&out);
    Ok(())
}

/// The offsets and sizes of a segment's tensors.
fn seg_ranges<'r>(ranges: &'r [(usize, usize)], seg: &v2::Segment<'_>) -> &'r [(usize, usize)] {
    &ranges[seg.first..seg.first + seg.heads.len()]
}

/// The tensors' bytes of `payload` as disjoint mutable slices, grouped by segment.
fn segment_slices<'a>(
    payload: &'a mut [u8],
    ranges: &[(usize, usize)],
    segments: &[v2::Segment<'_>],
) -> Result<Vec<Vec<&'a mut [u8]>>> {
    let mut slices = tensor_slices(payload, ranges)?.into_iter();
    Ok(segments
        .iter()
        .map(|seg| slices.by_ref().take(seg.heads.len()).collect())
        .collect())
}

/// The checked header fields of a delta against the payload it is applied to.
struct Checked<'a> {
    version: u16,
    new_hash: [u8; 32],
    ranges: Vec<(usize, usize)>,
    records: Reader<'a>,
}

impl<'a> Checked<'a> {
    /// The segments of a version-2 or -3 delta, every head and size checked and nothing after
    /// the last; with the tensors' ranges and the result's hash.
    fn segments(self) -> Result<Parsed<'a>> {
        let Checked {
            version,
            new_hash,
            ranges,
            mut records,
        } = self;
        let segments = if version == DELTA_VERSION_V2 {
            ranges
                .iter()
                .enumerate()
                .map(|(i, &(_, numel))| v2::parse_record(&mut records, i, numel))
                .collect::<Result<Vec<_>>>()?
        } else {
            v3::parse(&mut records, &ranges)?
        };
        trailing(&records)?;
        Ok(Parsed {
            segments,
            ranges,
            new_hash,
        })
    }
}

/// A version-2 or -3 delta's segments, checked against its base.
struct Parsed<'a> {
    segments: Vec<v2::Segment<'a>>,
    ranges: Vec<(usize, usize)>,
    new_hash: [u8; 32],
}

fn check_header<'a>(base: &[u8], delta: &'a [u8]) -> Result<Checked<'a>> {
    let (mut r, version) = header(delta)?;
    let base_hash: [u8; 32] = r.take(32, "base hash")?.try_into().expect("32 bytes");
    let new_hash: [u8; 32] = r.take(32, "new hash")?.try_into().expect("32 bytes");
    let payload_len = r.u64("payload length")?;
    let n_tensors = r.u32("tensor count")?;
    let found = hash(base);
    if found.as_bytes() != &base_hash {
        return Err(DeltaError::WrongBase {
            expected: hex32(&base_hash),
            found: found.to_hex().to_string(),
        });
    }
    if payload_len != base.len() as u64 {
        return Err(DeltaError::Malformed(format!(
            "payload length {payload_len} differs from the base's {}",
            base.len()
        )));
    }
    let (_, ranges) = tensor_ranges(base).map_err(|e| DeltaError::Malformed(e.to_string()))?;
    if n_tensors as usize != ranges.len() {
        return Err(DeltaError::Malformed(format!(
            "{n_tensors} tensor records for a base with {} tensors",
            ranges.len()
        )));
    }
    Ok(Checked {
        version,
        new_hash,
        ranges,
        records: r,
    })
}

/// Applies `delta` to `payload` in place: afterwards `payload` is the new payload. On any
/// error `payload` is exactly as it was (checked before it is written, and restored if the
/// result does not hash to the payload the delta names). Segments are decompressed and applied
/// across threads, one at a time each: besides the payload, memory holds one segment's bodies
/// per thread.
pub fn apply_in_place(payload: &mut [u8], delta: &[u8]) -> Result<()> {
    let checked = check_header(payload, delta)?;
    if checked.version == DELTA_VERSION_V1 {
        return apply_v1(payload, checked);
    }
    let Parsed {
        segments,
        ranges,
        new_hash,
    } = checked.segments()?;
    let mut groups = segment_slices(payload, &ranges, &segments)?;
    let applied: Vec<Result<()>> = groups
        .par_iter_mut()
        .zip(segments.par_iter())
        .map(|(dsts, seg)| seg.apply(dsts, seg_ranges(&ranges, seg), None))
        .collect();
    let undo_applied = |groups: &mut Vec<Vec<&mut [u8]>>| {
        groups
            .par_iter_mut()
            .zip(segments.par_iter().zip(applied.par_iter()))
            .filter(|(_, (_, ok))| ok.is_ok())
            .for_each(|(dsts, (seg, _))| seg.undo(dsts));
    };
    if let Some(e) = applied.iter().find_map(|r| r.as_ref().err()) {
        let e = e.clone();
        undo_applied(&mut groups);
        return Err(e);
    }
    drop(groups);
    if let Err(e) = check_result(payload, &new_hash) {
        let mut groups = segment_slices(payload, &ranges, &segments)?;
        undo_applied(&mut groups);
        return Err(e);
    }
    Ok(())
}

/// The tensors' bytes of `payload` as disjoint mutable slices, in `ranges` order.
fn tensor_slices<'a>(
    payload: &'a mut [u8],
    ranges: &[(usize, usize)],
) -> Result<Vec<&'a mut [u8]>> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut rest = payload;
    let mut at = 0usize;
    for &(start, numel) in ranges {
        let skip = start
            .checked_sub(at)
            .ok_or_else(|| DeltaError::Malformed("overlapping tensors in the base".into()))?;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (t, tail) = tail.split_at_mut(2 * numel);
        out.push(t);
        rest = tail;
        at = start + 2 * numel;
    }
    Ok(out)
}

fn trailing(r: &Reader<'_>) -> Result<()> {
    if r.pos != r.buf.len() {
        return Err(DeltaError::Malformed(format!(
            "{} trailing bytes",
            r.buf.len() - r.pos
        )));
    }
    Ok(())
}

fn check_result(out: &[u8], new_hash: &[u8; 32]) -> Result<()> {
    let got = hash(out);
    if got.as_bytes() != new_hash {
        return Err(DeltaError::NotReconstructed {
            expected: hex32(new_hash),
            found: got.to_hex().to_string(),
        });
    }
    Ok(())
}

/// The BLAKE3 (hex) of the base payload a delta names, read from its header without
/// applying it (so a worker can tell whether it holds the right base before fetching more).
pub fn base_hash(delta: &[u8]) -> Result<String> {
    Ok(hex32(header(delta)?.0.take(32, "base hash")?))
}

/// The BLAKE3 of the payload a delta reconstructs, read from its header. [`apply`] checks
/// its result against this hash, so a caller that applied the delta compares this with the
/// hash it expects instead of hashing the result again.
pub fn result_hash(delta: &[u8]) -> Result<[u8; 32]> {
    let (mut r, _) = header(delta)?;
    r.take(32, "base hash")?;
    Ok(r.take(32, "new hash")?.try_into().expect("32 bytes"))
}

/// Reads a delta's magic, format version and reserved field; returns the reader positioned
/// at the base hash, and the version.
fn header(delta: &[u8]) -> Result<(Reader<'_>, u16)> {
    let mut r = Reader { buf: delta, pos: 0 };
    if r.take(4, "magic")? != DELTA_MAGIC {
        return Err(DeltaError::BadMagic);
    }
    let version = r.u16("version")?;
    if !(DELTA_VERSION_V1..=DELTA_VERSION).contains(&version) {
        return Err(DeltaError::UnsupportedVersion(version));
    }
    if r.u16("reserved")? != 0 {
        return Err(DeltaError::Malformed("reserved field is not zero".into()));
    }
    Ok((r, version))
}

fn hex32(h: &[u8]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// LEB128 length of `v`.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Appends `v` as unsigned LEB128.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A bounds-checked cursor over the delta bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(DeltaError::Truncated(what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }
    /// Unsigned LEB128, at most ten bytes and no overflow past 64 bits.
    fn varint(&mut self, what: &'static str) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8(what)?;
            if shift == 63 && b > 1 {
                return Err(DeltaError::Malformed(format!("{what}: varint overflows")));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DeltaError::Malformed(format!("{what}: varint too long")))
    }
    /// A change count, which can be neither zero (that record kind is `unchanged`) nor more
    /// than the tensor's element count.
    fn count(&mut self, numel: usize) -> Result<usize> {
        let c = self.varint("count")?;
        if c == 0 || c > numel as u64 {
            return Err(DeltaError::Malformed(format!(
                "change count {c} for a tensor of {numel} values"
            )));
        }
        Ok(c as usize)
    }
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
