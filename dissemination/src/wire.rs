//! The two bulk protocols of snapshot dissemination over `libp2p-stream`: their names and the
//! bodies of their messages. The byte layouts are specified in `docs/protocol.md` ("Chunk
//! stream", "Chunk fetch"); in short, every message is one `p2p::framing` frame (varint length,
//! then body) and every body field is in the `storage::codec` encoding (varints,
//! varint-length-prefixed bytes, raw fixed-size hashes).
//!
//! Owns: the protocol names ([`CHUNK_STREAM`], [`CHUNK_FETCH`]), the per-message limits, and
//! pure encode/decode functions for every message body. Must not touch: framing itself
//! (`p2p::framing`), verification policy, the store, scores.
//!
//! Chunk stream, parent → child, version 4 — a session of transfers, one per snapshot version:
//! ```text
//! parent: frame(StreamHello) ≤ 64 KiB      varint version | digest[32] | bytes(signed manifest;
//!                                          empty = too large to inline) | bytes(signed plan;
//!                                          empty = none or too large)
//! child:  frame(Reply)                     u8 0 | bytes(bitmap)  — accept, bit i = holds chunk i
//!                                          u8 1                  — refuse
//! parent: { frame(varint index) frame(chunk bytes) }*  then  frame()  — an empty frame ends it
//! child:  frame(u8 status)                 0 = every chunk verified; 1 = not
//! ```
//! After status 0 the next transfer may follow on the same stream (a new hello); the child
//! closes the stream after a refusal or status 1, or when no hello comes for its session
//! idle timeout, and the parent closes it when it keeps it no longer.
//! `digest` is the BLAKE3 of the signed manifest's encoding. The hello is small so that the
//! child verifies the learner's signature before it reads anything large: a manifest that does
//! not fit is not sent by the parent at all — the child uses the one it already accepted with
//! that digest, or asks the learner for it (a catch-up request) and checks the digest.
//!
//! Chunk fetch, requester → holder (one request per stream), version 2:
//! ```text
//! request:  frame(varint version | varint count (≤ MAX_FETCH_BATCH) | count × 32-byte BLAKE3)
//! response: per hash, in order: frame(chunk bytes), or an empty frame when not held
//! ```
//! A request with `count = 0` asks for the holder's signed manifest of `version` (`u64::MAX` =
//! its newest) and its plan for it; the response is one frame [`CatchUp`]: `bytes(manifest) |
//! bytes(plan)` (each empty = none) — the catch-up of late joiners. A catch-up answer can be
//! as large as the largest manifest, so a node reads one only from the learner.

use libp2p::StreamProtocol;
use storage::codec::{Reader, Writer};
use storage::Hash;

use crate::error::{DisseminationError, Result};
use crate::plan_msg::MAX_PLAN_BYTES;

/// Parent → child push of snapshot chunks as they arrive. Version 5: before its first hello a
/// stream may carry filler frames ([`filler_frame`]) that grow its flow-control window ahead
/// of the first version. Version 4: after a confirmed transfer the stream stays open for the
/// next version's hello, so that its flow-control window carries over (version 3 had one
/// transfer per stream and the same messages; version 2 sent the whole manifest, up to
/// 32 MiB, in the hello; version 1 had a magic, big-endian u32 lengths and indices).
pub const CHUNK_STREAM: StreamProtocol = StreamProtocol::new("/echo-swarm/chunk-stream/5.0.0");
/// Fetch chunks by BLAKE3 hash from any holder (and the catch-up manifest request). Version 2:
/// `p2p::framing` frames and `storage::codec` bodies.
pub const CHUNK_FETCH: StreamProtocol = StreamProtocol::new("/echo-swarm/chunk-fetch/2.0.0");

/// Largest signed manifest carried in a hello or a catch-up response: a manifest with the
/// most chunks a manifest may list (`storage::manifest::MAX_CHUNKS`, 32 B each), its header
/// (≤ 256 B) and its signature — the bound `SignedManifest::decode` applies.
pub const MAX_MANIFEST_BYTES: usize = storage::manifest::MAX_SIGNED_MANIFEST_BYTES;
/// Largest body of a catch-up response: a manifest and a plan, each behind a varint length
/// (≤ 10 bytes). Read only from the learner.
pub const MAX_CATCH_UP_BYTES: usize = MAX_MANIFEST_BYTES + MAX_PLAN_BYTES + 2 * 10;
/// Largest chunk-stream hello: what a child reads from any parent before a signature check.
pub const MAX_HELLO_BYTES: usize = 64 * 1024;
/// Room in a hello for the version, the digest and two lengths.
const HELLO_OVERHEAD: usize = 10 + 32 + 2 * 10;
/// Largest manifest or plan a hello carries inline (both together fit [`MAX_HELLO_BYTES`]).
pub const MAX_INLINE_BYTES: usize = MAX_HELLO_BYTES - HELLO_OVERHEAD;
/// The child's final status frame: one byte.
pub const MAX_STATUS_BYTES: usize = 1;
/// Most hashes in one fetch request.
pub const MAX_FETCH_BATCH: usize = 64;
/// Largest fetch request body: two varints and the hashes.
pub const MAX_FETCH_REQUEST_BYTES: usize = 2 * 10 + 32 * MAX_FETCH_BATCH;
/// Largest chunk header frame: one varint.
pub const MAX_INDEX_BYTES: usize = 10;

/// The answer to a catch-up request: the encoded signed manifest and the encoded signed plan,
/// each possibly empty (= none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatchUp {
    pub manifest: Vec<u8>,
    pub plan: Vec<u8>,
}

impl CatchUp {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.manifest.len() + self.plan.len() + 20);
        w.bytes(&self.manifest);
        w.bytes(&self.plan);
        w.into_bytes()
    }

    pub fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body, "catch-up answer");
        let manifest = r
            .bytes(MAX_MANIFEST_BYTES, "manifest")
            .map_err(DisseminationError::codec)?
            .to_vec();
        let plan = r
            .bytes(MAX_PLAN_BYTES, "plan")
            .map_err(DisseminationError::codec)?
            .to_vec();
        r.finish().map_err(DisseminationError::codec)?;
        Ok(CatchUp { manifest, plan })
    }
}

/// The hello of a chunk stream: which manifest (version and digest), the manifest itself when
/// it fits, and the plan when it fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHello {
    pub version: u64,
    /// BLAKE3 of the signed manifest's encoding.
    pub digest: Hash,
    /// The encoded signed manifest, or empty when larger than [`MAX_INLINE_BYTES`].
    pub manifest: Vec<u8>,
    /// The encoded signed plan, or empty (none, or no room).
    pub plan: Vec<u8>,
}

impl StreamHello {
    /// The hello for a manifest's encoding and an optional plan's: each inlined when it fits
    /// (the manifest first).
    pub fn new(version: u64, manifest: &[u8], plan: Option<&[u8]>) -> Self {
        let inline_manifest = manifest.len() <= MAX_INLINE_BYTES;
        let room = MAX_INLINE_BYTES - if inline_manifest { manifest.len() } else { 0 };
        StreamHello {
            version,
            digest: *blake3::hash(manifest).as_bytes(),
            manifest: if inline_manifest {
                manifest.to_vec()
            } else {
                Vec::new()
            },
            plan: plan
                .filter(|p| p.len() <= room)
                .map(<[u8]>::to_vec)
                .unwrap_or_default(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.manifest.len() + self.plan.len() + HELLO_OVERHEAD);
        w.varint(self.version);
        w.raw(&self.digest);
        w.bytes(&self.manifest);
        w.bytes(&self.plan);
        w.into_bytes()
    }

    /// Decodes a hello of at most [`MAX_HELLO_BYTES`]; an inline manifest must match the
    /// digest.
    pub fn decode(body: &[u8]) -> Result<Self> {
        if body.len() > MAX_HELLO_BYTES {
            return Err(DisseminationError::decode(
                "stream hello",
                format!("{} bytes > {MAX_HELLO_BYTES}", body.len()),
            ));
        }
        let mut r = Reader::new(body, "stream hello");
        let version = r.varint().map_err(DisseminationError::codec)?;
        let digest = r.array::<32>().map_err(DisseminationError::codec)?;
        let manifest = r
            .bytes(MAX_INLINE_BYTES, "manifest")
            .map_err(DisseminationError::codec)?
            .to_vec();
        let plan = r
            .bytes(MAX_INLINE_BYTES, "plan")
            .map_err(DisseminationError::codec)?
            .to_vec();
        r.finish().map_err(DisseminationError::codec)?;
        if !manifest.is_empty() && *blake3::hash(&manifest).as_bytes() != digest {
            return Err(DisseminationError::decode(
                "stream hello",
                "the inline manifest does not match its digest",
            ));
        }
        Ok(StreamHello {
            version,
            digest,
            manifest,
            plan,
        })
    }
}

/// The version field that marks a filler frame: no snapshot is ever numbered `2^64 − 1`.
pub const FILLER_VERSION: u64 = u64::MAX;
/// Most filler bytes a child reads on one stream (all before its first hello): more is a
/// protocol violation, charged to the parent.
pub const MAX_FILLER_BYTES: u64 = 32 << 20;

/// A filler frame's body of `len` bytes (at least the marker's 10, at most
/// [`MAX_HELLO_BYTES`]): the varint of [`FILLER_VERSION`], then zeros. A parent sends filler
/// on a warm stream before the stream's first hello so that the stream's receive window
/// grows while the links are idle (`docs/protocol.md`, "Warm-up filler"); the child reads
/// and drops it.
pub fn filler_frame(len: usize) -> Vec<u8> {
    let mut w = Writer::with_capacity(len);
    w.varint(FILLER_VERSION);
    let mut body = w.into_bytes();
    body.resize(len.clamp(body.len(), MAX_HELLO_BYTES), 0);
    body
}

/// Whether a frame read where a hello is due is filler ([`filler_frame`]).
pub fn is_filler(body: &[u8]) -> bool {
    Reader::new(body, "stream hello")
        .varint()
        .is_ok_and(|v| v == FILLER_VERSION)
}

/// The child's last word on a chunk stream.
pub const STATUS_OK: u8 = 0;
pub const STATUS_FAILED: u8 = 1;

/// The child's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Send me what I lack: bit `i` of `held` set = I already hold chunk `i`.
    Accept { held: Vec<u8> },
    /// Forged, another swarm's, or older than what I accepted.
    Refuse,
}

const REPLY_ACCEPT: u8 = 0;
const REPLY_REFUSE: u8 = 1;

impl Reply {
    /// Largest reply body for a snapshot of `chunks` chunks.
    pub fn max_len(chunks: usize) -> usize {
        1 + 10 + chunks.div_ceil(8)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Reply::Accept { held } => {
                w.u8(REPLY_ACCEPT);
                w.bytes(held);
            }
            Reply::Refuse => w.u8(REPLY_REFUSE),
        }
        w.into_bytes()
    }

    /// Decodes a reply for a snapshot of `chunks` chunks (the bitmap is at most ⌈chunks/8⌉
    /// bytes; missing trailing bytes read as "not held").
    pub fn decode(body: &[u8], chunks: usize) -> Result<Self> {
        let mut r = Reader::new(body, "stream reply");
        let reply = match r.u8().map_err(DisseminationError::codec)? {
            REPLY_ACCEPT => Reply::Accept {
                held: r
                    .bytes(chunks.div_ceil(8), "bitmap")
                    .map_err(DisseminationError::codec)?
                    .to_vec(),
            },
            REPLY_REFUSE => Reply::Refuse,
            s => {
                return Err(DisseminationError::decode(
                    "stream reply",
                    format!("status {s}"),
                ))
            }
        };
        r.finish().map_err(DisseminationError::codec)?;
        Ok(reply)
    }
}

/// The header frame before each chunk of a stream: the chunk's index.
pub fn encode_index(index: usize) -> Vec<u8> {
    let mut w = Writer::default();
    w.varint(index as u64);
    w.into_bytes()
}

/// `None` for the empty frame that ends a chunk stream.
pub fn decode_index(body: &[u8]) -> Result<Option<u64>> {
    if body.is_empty() {
        return Ok(None);
    }
    let mut r = Reader::new(body, "chunk header");
    let index = r.varint().map_err(DisseminationError::codec)?;
    r.finish().map_err(DisseminationError::codec)?;
    Ok(Some(index))
}

/// A chunk-fetch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchRequest {
    /// The chunks with these hashes (1..=[`MAX_FETCH_BATCH`]) of snapshot `version`.
    Chunks { version: u64, hashes: Vec<Hash> },
    /// The signed manifest of `version` (`u64::MAX`: the newest held) and its plan.
    Manifest { version: u64 },
}

impl FetchRequest {
    pub fn encode(&self) -> Vec<u8> {
        let (version, hashes): (u64, &[Hash]) = match self {
            FetchRequest::Chunks { version, hashes } => (*version, hashes),
            FetchRequest::Manifest { version } => (*version, &[]),
        };
        let mut w = Writer::with_capacity(20 + 32 * hashes.len());
        w.varint(version);
        w.varint(hashes.len() as u64);
        for h in hashes {
            w.raw(h);
        }
        w.into_bytes()
    }

    pub fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body, "fetch request");
        let version = r.varint().map_err(DisseminationError::codec)?;
        let count = r.varint().map_err(DisseminationError::codec)?;
        if count > MAX_FETCH_BATCH as u64 {
            return Err(DisseminationError::decode(
                "fetch request",
                format!("fetch of {count} chunks > {MAX_FETCH_BATCH}"),
            ));
        }
        let hashes = (0..count)
            .map(|_| r.array::<32>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(DisseminationError::codec)?;
        r.finish().map_err(DisseminationError::codec)?;
        Ok(if hashes.is_empty() {
            FetchRequest::Manifest { version }
        } else {
            FetchRequest::Chunks { version, hashes }
        })
    }
}

/// Bitmap of `n` bits, bit `i` (bit `i % 8` of byte `i / 8`, least significant first) =
/// `has(i)`.
pub fn bitmap(n: usize, has: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut out = vec![0u8; n.div_ceil(8)];
    for i in 0..n {
        if has(i) {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

/// Bit `i` of `map`; `false` past its end.
pub fn bit(map: &[u8], i: usize) -> bool {
    map.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps() {
        let m = bitmap(11, |i| i % 3 == 0);
        assert_eq!(m.len(), 2);
        assert_eq!(m, [0b0100_1001, 0b0000_0010]);
        assert!((0..11).all(|i| bit(&m, i) == (i % 3 == 0)));
        assert!(!bit(&m, 100));
    }

    #[test]
    fn hellos_and_replies_round_trip_within_limits() {
        let h = CatchUp {
            manifest: vec![1; 300],
            plan: vec![],
        };
        assert_eq!(CatchUp::decode(&h.encode()).unwrap(), h);
        let mut long = h.encode();
        long.push(0);
        assert!(CatchUp::decode(&long).is_err());
        assert!(CatchUp::decode(&h.encode()[..100]).is_err());

        // A small manifest and plan travel inline; the hello stays within its bound.
        let small = StreamHello::new(7, &[1; 300], Some(&[2; 100]));
        assert_eq!((small.manifest.len(), small.plan.len()), (300, 100));
        assert_eq!(StreamHello::decode(&small.encode()).unwrap(), small);
        // A manifest too large to inline: only its digest; the plan still fits.
        let big = vec![3u8; MAX_INLINE_BYTES + 1];
        let h = StreamHello::new(8, &big, Some(&[2; 100]));
        assert!(h.manifest.is_empty());
        assert_eq!(h.digest, *blake3::hash(&big).as_bytes());
        assert_eq!(h.plan.len(), 100);
        assert!(h.encode().len() <= MAX_HELLO_BYTES);
        // Manifest and plan that do not both fit: the plan is left out.
        let h = StreamHello::new(9, &vec![4u8; MAX_INLINE_BYTES - 10], Some(&[2; 100]));
        assert!(h.plan.is_empty() && !h.manifest.is_empty());
        assert!(h.encode().len() <= MAX_HELLO_BYTES);
        // An inline manifest that does not match the digest is refused.
        let mut forged = small.clone();
        forged.manifest[0] ^= 1;
        let err = StreamHello::decode(&forged.encode()).unwrap_err();
        assert!(err.to_string().contains("digest"), "{err}");
        for cut in 0..small.encode().len() {
            assert!(StreamHello::decode(&small.encode()[..cut]).is_err());
        }

        let a = Reply::Accept {
            held: bitmap(20, |i| i < 3),
        };
        assert_eq!(a.encode(), [0, 3, 0b111, 0, 0]);
        assert_eq!(Reply::decode(&a.encode(), 20).unwrap(), a);
        assert!(a.encode().len() <= Reply::max_len(20));
        // A bitmap longer than the snapshot needs is refused.
        assert!(Reply::decode(&a.encode(), 16).is_err());
        assert_eq!(Reply::Refuse.encode(), [1]);
        assert_eq!(Reply::decode(&[1], 20).unwrap(), Reply::Refuse);
        assert!(Reply::decode(&[2], 20).is_err());
        assert!(Reply::decode(&[], 20).is_err());
    }

    #[test]
    fn chunk_headers_and_the_end_marker() {
        assert_eq!(encode_index(300), [0xac, 0x02]);
        assert_eq!(decode_index(&encode_index(300)).unwrap(), Some(300));
        assert_eq!(decode_index(&[]).unwrap(), None);
        assert!(decode_index(&[0x80]).is_err());
        assert!(decode_index(&[1, 2]).is_err());
    }

    #[test]
    fn fetch_requests_round_trip_and_respect_the_batch_limit() {
        let c = FetchRequest::Chunks {
            version: 7,
            hashes: vec![[1; 32], [2; 32]],
        };
        let bytes = c.encode();
        assert_eq!(&bytes[..2], &[7, 2]);
        assert_eq!(bytes.len(), 2 + 64);
        assert_eq!(FetchRequest::decode(&bytes).unwrap(), c);
        assert!(bytes.len() <= MAX_FETCH_REQUEST_BYTES);
        let m = FetchRequest::Manifest { version: u64::MAX };
        assert_eq!(m.encode().len(), 11);
        assert_eq!(FetchRequest::decode(&m.encode()).unwrap(), m);
        for cut in 0..bytes.len() {
            assert!(FetchRequest::decode(&bytes[..cut]).is_err());
        }
        let too_many = FetchRequest::Chunks {
            version: 1,
            hashes: vec![[0; 32]; MAX_FETCH_BATCH + 1],
        };
        let err = FetchRequest::decode(&too_many.encode()).unwrap_err();
        assert!(err.to_string().contains("> 64"), "{err}");
    }

    #[test]
    fn filler_frames_are_told_from_hellos() {
        for len in [0, 10, 1000, MAX_HELLO_BYTES, MAX_HELLO_BYTES + 1] {
            let f = filler_frame(len);
            assert_eq!(f.len(), len.clamp(10, MAX_HELLO_BYTES));
            assert!(is_filler(&f), "{len}");
        }
        let hello = StreamHello::new(7, b"manifest", None).encode();
        assert!(!is_filler(&hello));
        assert!(!is_filler(&[]));
        assert!(!is_filler(&encode_index(3)));
    }
}
