//! Snapshot manifests (`docs/storage.md`): what a snapshot is made of, signed by the swarm's learner.
//!
//! A snapshot's payload (the policy weights as safetensors bytes) is split into fixed-size
//! chunks; the manifest lists every chunk's BLAKE3 hash in order. `root_hash` is the BLAKE3 of
//! the whole payload, so an installed snapshot can be checked end to end after reassembly, and
//! the signature covers the canonical encoding of every field below, chunk list included.
//!
//! Encoding v1: magic `b"ESM"`, format `1`, swarm id (string), version (varint), model config
//! hash (32 B), total length (varint), chunk size (varint), chunk count (varint) + hashes
//! (32 B each), root hash (32 B), created (varint ms), learner public key (32 B). A signed
//! manifest is that encoding followed by the 64-byte ed25519 signature over it.
//!
//! Encoding v2 (a delta payload, [`PayloadKind::Delta`]): the same fields with format `2`,
//! followed by the payload kind (u8, 1 = delta), the base version (varint) and the BLAKE3
//! root of the full payload the delta reconstructs (32 B). The chunk hashes and `root_hash`
//! then describe the delta bytes the chains carry. A full payload is still encoded as v1,
//! byte for byte as before, so its signature and older readers are unaffected.
//!
//! Encoding v3 (an adapter payload of a LoRA run, [`PayloadKind::Adapter`]): the v1 fields
//! with format `3`, followed by the payload kind (u8, 2 = adapter), a flag (u8: 1 = the base
//! is a published version, 0 = the base is the model every node is configured with), the
//! base version (varint, present only with flag 1; earlier than `version`) and the base's
//! identity (32 B: `policy::lora::base_hash` of the base's weights as the workers hold them).
//! The chunk hashes and `root_hash` describe the adapter bytes (a safetensors file whose
//! metadata carries rank, α and targets). Full and delta manifests are unchanged.

use std::ops::Range;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};

pub const MANIFEST_MAGIC: &[u8; 3] = b"ESM";
/// The format of a manifest of a full payload (unchanged since format 1).
pub const MANIFEST_FORMAT: u8 = 1;
/// The format of a manifest of a delta payload (adds [`PayloadKind::Delta`]'s fields).
pub const MANIFEST_FORMAT_DELTA: u8 = 2;
/// The format of a manifest of an adapter payload (adds [`PayloadKind::Adapter`]'s fields).
pub const MANIFEST_FORMAT_ADAPTER: u8 = 3;
const KIND_DELTA: u8 = 1;
const KIND_ADAPTER: u8 = 2;
/// Smallest and largest allowed chunk sizes.
pub const MIN_CHUNK_SIZE: u32 = 4 << 10;
pub const MAX_CHUNK_SIZE: u32 = 64 << 20;
/// Largest snapshot a manifest may describe (64 GiB).
pub const MAX_TOTAL_LEN: u64 = 64 << 30;
/// Most chunks a manifest may list.
pub const MAX_CHUNKS: usize = 1 << 20;
/// Largest encoded signed manifest: header, `MAX_CHUNKS` hashes and the signature.
pub const MAX_SIGNED_MANIFEST_BYTES: usize = 256 + 32 * MAX_CHUNKS + 64;

/// A BLAKE3 hash.
pub type Hash = [u8; 32];

pub fn hash_bytes(bytes: &[u8]) -> Hash {
    *blake3::hash(bytes).as_bytes()
}

pub fn hash_hex(h: &Hash) -> String {
    hex::encode(h)
}

/// What a manifest's payload is: the whole snapshot, or a delta that needs a base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PayloadKind {
    /// The whole snapshot payload (`root_hash` is the snapshot's).
    #[default]
    Full,
    /// A sparse delta against the payload of `base_version`; applying it gives a full payload
    /// whose BLAKE3 is `full_root` (`root_hash` is the delta bytes').
    Delta { base_version: u64, full_root: Hash },
    /// Low-rank adapters trained on a frozen base (a LoRA run): the base is the full payload
    /// of `base_version`, or, when `None`, the model every node builds from its own
    /// configuration; either way its identity (`policy::lora::base_hash`) is `base_hash`, and
    /// a worker holding another base refuses the version. `root_hash` is the adapter bytes'.
    Adapter {
        base_version: Option<u64>,
        base_hash: Hash,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotManifest {
    pub swarm_id: String,
    pub version: u64,
    pub model_config_hash: Hash,
    pub total_len: u64,
    pub chunk_size: u32,
    pub chunk_hashes: Vec<Hash>,
    pub root_hash: Hash,
    pub created_unix_ms: u64,
    /// The signer's public key; must equal the swarm's learner key to be accepted.
    pub learner_key: [u8; 32],
    /// Full payload or delta (format 2).
    pub payload: PayloadKind,
}

impl SnapshotManifest {
    /// Describes `payload` split into `chunk_size`-byte chunks (the last may be shorter).
    pub fn build(
        swarm_id: &str,
        version: u64,
        model_config_hash: Hash,
        payload: &[u8],
        chunk_size: u32,
        learner_key: &VerifyingKey,
    ) -> Result<Self> {
        check_chunk_size(chunk_size)?;
        let chunk_hashes = payload
            .chunks(chunk_size as usize)
            .map(hash_bytes)
            .collect();
        let m = SnapshotManifest {
            swarm_id: swarm_id.to_string(),
            version,
            model_config_hash,
            total_len: payload.len() as u64,
            chunk_size,
            chunk_hashes,
            root_hash: hash_bytes(payload),
            created_unix_ms: crate::unix_ms(),
            learner_key: learner_key.to_bytes(),
            payload: PayloadKind::Full,
        };
        m.check()?;
        Ok(m)
    }

    /// The BLAKE3 of the payload this version installs: `root_hash` for a full payload and
    /// for adapters (applied to their base at install), the named reconstructed root for a
    /// delta.
    pub fn full_root(&self) -> Hash {
        match self.payload {
            PayloadKind::Full | PayloadKind::Adapter { .. } => self.root_hash,
            PayloadKind::Delta { full_root, .. } => full_root,
        }
    }

    /// Internal consistency: chunk count matches total length and chunk size.
    pub fn check(&self) -> Result<()> {
        check_chunk_size(self.chunk_size)?;
        if self.total_len > MAX_TOTAL_LEN {
            return Err(StorageError::invalid(
                "manifest",
                "snapshot larger than 64 GiB",
            ));
        }
        let expected = self.total_len.div_ceil(u64::from(self.chunk_size));
        if self.chunk_hashes.len() as u64 != expected {
            return Err(StorageError::invalid(
                "manifest",
                format!(
                    "{} chunk hashes for {} bytes in {}-byte chunks (expected {expected})",
                    self.chunk_hashes.len(),
                    self.total_len,
                    self.chunk_size
                ),
            ));
        }
        if self.swarm_id.is_empty() || self.swarm_id.len() > 128 {
            return Err(StorageError::invalid(
                "manifest",
                "swarm id must be 1–128 bytes",
            ));
        }
        let (what, base) = match self.payload {
            PayloadKind::Full => ("", None),
            PayloadKind::Delta { base_version, .. } => ("delta", Some(base_version)),
            PayloadKind::Adapter { base_version, .. } => ("adapter", base_version),
        };
        if let Some(base_version) = base.filter(|&b| b >= self.version) {
            return Err(StorageError::invalid(
                "manifest",
                format!(
                    "{what} v{} names base v{base_version}, not an earlier version",
                    self.version
                ),
            ));
        }
        Ok(())
    }

    /// Byte range of chunk `index` in the payload ([`chunk_range`]); `None` past the last chunk.
    pub fn chunk_range(&self, index: usize) -> Option<Range<usize>> {
        chunk_range(self.total_len, self.chunk_size, index)
    }

    /// Length of chunk `index` (0 past the last chunk).
    pub fn chunk_len(&self, index: usize) -> u64 {
        self.chunk_range(index).map_or(0, |r| r.len() as u64)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(200 + 32 * self.chunk_hashes.len());
        w.raw(MANIFEST_MAGIC);
        w.u8(match self.payload {
            PayloadKind::Full => MANIFEST_FORMAT,
            PayloadKind::Delta { .. } => MANIFEST_FORMAT_DELTA,
            PayloadKind::Adapter { .. } => MANIFEST_FORMAT_ADAPTER,
        });
        w.str(&self.swarm_id);
        w.varint(self.version);
        w.raw(&self.model_config_hash);
        w.varint(self.total_len);
        w.varint(u64::from(self.chunk_size));
        w.varint(self.chunk_hashes.len() as u64);
        for h in &self.chunk_hashes {
            w.raw(h);
        }
        w.raw(&self.root_hash);
        w.varint(self.created_unix_ms);
        w.raw(&self.learner_key);
        match self.payload {
            PayloadKind::Full => {}
            PayloadKind::Delta {
                base_version,
                full_root,
            } => {
                w.u8(KIND_DELTA);
                w.varint(base_version);
                w.raw(&full_root);
            }
            PayloadKind::Adapter {
                base_version,
                base_hash,
            } => {
                w.u8(KIND_ADAPTER);
                match base_version {
                    Some(v) => {
                        w.u8(1);
                        w.varint(v);
                    }
                    None => w.u8(0),
                }
                w.raw(&base_hash);
            }
        }
        w.into_bytes()
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<Self> {
        if r.raw(3)? != MANIFEST_MAGIC {
            return Err(r.err("bad magic"));
        }
        let format = r.u8()?;
        if ![
            MANIFEST_FORMAT,
            MANIFEST_FORMAT_DELTA,
            MANIFEST_FORMAT_ADAPTER,
        ]
        .contains(&format)
        {
            return Err(r.err(format!("unsupported format {format}")));
        }
        let swarm_id = r.string(128, "swarm_id")?;
        let version = r.varint()?;
        let model_config_hash = r.array::<32>()?;
        let total_len = r.varint()?;
        let chunk_size = r.u32()?;
        let n = r.len(MAX_CHUNKS, 32, "chunk_hashes")?;
        let mut chunk_hashes = Vec::with_capacity(n);
        for _ in 0..n {
            chunk_hashes.push(r.array::<32>()?);
        }
        let root_hash = r.array::<32>()?;
        let created_unix_ms = r.varint()?;
        let learner_key = r.array::<32>()?;
        let payload = match format {
            MANIFEST_FORMAT => PayloadKind::Full,
            _ => {
                let kind = r.u8()?;
                match (format, kind) {
                    (MANIFEST_FORMAT_DELTA, KIND_DELTA) => PayloadKind::Delta {
                        base_version: r.varint()?,
                        full_root: r.array::<32>()?,
                    },
                    (MANIFEST_FORMAT_ADAPTER, KIND_ADAPTER) => PayloadKind::Adapter {
                        base_version: match r.u8()? {
                            0 => None,
                            1 => Some(r.varint()?),
                            f => return Err(r.err(format!("adapter base flag {f} is not 0 or 1"))),
                        },
                        base_hash: r.array::<32>()?,
                    },
                    _ => {
                        return Err(r.err(format!(
                            "payload kind {kind} does not belong to format {format}"
                        )))
                    }
                }
            }
        };
        let m = SnapshotManifest {
            swarm_id,
            version,
            model_config_hash,
            total_len,
            chunk_size,
            chunk_hashes,
            root_hash,
            created_unix_ms,
            learner_key,
            payload,
        };
        m.check()
            .map_err(|e| StorageError::decode("manifest", e.to_string()))?;
        Ok(m)
    }

    pub fn sign(self, key: &SigningKey) -> Result<SignedManifest> {
        if key.verifying_key().to_bytes() != self.learner_key {
            return Err(StorageError::BadSignature(
                "signing key does not match the manifest's learner key".into(),
            ));
        }
        let signature = key.sign(&self.encode()).to_bytes();
        Ok(SignedManifest {
            manifest: self,
            signature,
        })
    }
}

/// Byte range of chunk `index` of a `total_len`-byte payload split into `chunk_size`-byte
/// chunks: `index·c .. min((index+1)·c, total_len)` — every chunk is `chunk_size` bytes except
/// the last, which holds the rest. `None` for an index past the last chunk, a zero chunk size,
/// or a range that does not fit in memory addresses. The one home of this rule: payloads are
/// split, assembled and length-checked with it (`SnapshotManifest::chunk_range`).
pub fn chunk_range(total_len: u64, chunk_size: u32, index: usize) -> Option<Range<usize>> {
    let c = u64::from(chunk_size);
    if c == 0 {
        return None;
    }
    let start = (index as u64).checked_mul(c)?;
    if start >= total_len {
        return None;
    }
    let end = start.saturating_add(c).min(total_len);
    Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
}

fn check_chunk_size(chunk_size: u32) -> Result<()> {
    if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
        return Err(StorageError::invalid(
            "manifest",
            format!("chunk size {chunk_size} outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE} bytes"),
        ));
    }
    Ok(())
}

/// A manifest with the learner's signature over its canonical encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedManifest {
    pub manifest: SnapshotManifest,
    pub signature: [u8; 64],
}

impl SignedManifest {
    /// Accepts the manifest only if it names `authority` as its signer and the signature over
    /// its encoding verifies under `authority`.
    pub fn verify(&self, authority: &VerifyingKey) -> Result<&SnapshotManifest> {
        if self.manifest.learner_key != authority.to_bytes() {
            return Err(StorageError::BadSignature(format!(
                "manifest v{} is signed by {}, not by the swarm's learner {}",
                self.manifest.version,
                hex::encode(self.manifest.learner_key),
                hex::encode(authority.to_bytes())
            )));
        }
        authority
            .verify(
                &self.manifest.encode(),
                &Signature::from_bytes(&self.signature),
            )
            .map_err(|_| {
                StorageError::BadSignature(format!(
                    "manifest v{}: signature does not verify",
                    self.manifest.version
                ))
            })?;
        Ok(&self.manifest)
    }

    /// Verifies against the key the manifest itself names (for `inspect`; trust decisions
    /// must use [`SignedManifest::verify`] with the configured learner key).
    pub fn verify_self_consistent(&self) -> Result<&SnapshotManifest> {
        let key = VerifyingKey::from_bytes(&self.manifest.learner_key)
            .map_err(|e| StorageError::BadSignature(format!("learner key: {e}")))?;
        self.verify(&key)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.manifest.encode();
        b.extend_from_slice(&self.signature);
        b
    }

    /// Decodes (with limits) without verifying the signature.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let max = MAX_SIGNED_MANIFEST_BYTES;
        if bytes.len() > max {
            return Err(StorageError::decode(
                "manifest",
                format!("{} bytes > limit {max}", bytes.len()),
            ));
        }
        let mut r = Reader::new(bytes, "manifest");
        let manifest = SnapshotManifest::decode_from(&mut r)?;
        let signature = r.array::<64>()?;
        r.finish()?;
        Ok(SignedManifest {
            manifest,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn signed(payload: &[u8], k: &SigningKey) -> SignedManifest {
        SnapshotManifest::build("swarm", 3, [1; 32], payload, 4096, &k.verifying_key())
            .unwrap()
            .sign(k)
            .unwrap()
    }

    #[test]
    fn build_sign_verify_round_trip() {
        let k = key(1);
        let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let s = signed(&payload, &k);
        assert_eq!(s.manifest.chunk_hashes.len(), 3);
        assert_eq!(s.manifest.chunk_len(2), 10_000 - 8192);
        assert_eq!(s.manifest.root_hash, hash_bytes(&payload));
        let back = SignedManifest::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        back.verify(&k.verifying_key()).unwrap();
    }

    #[test]
    fn chunk_ranges_cover_the_payload_exactly_once() {
        let k = key(1);
        let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let m = signed(&payload, &k).manifest;
        assert_eq!(m.chunk_range(0), Some(0..4096));
        assert_eq!(m.chunk_range(1), Some(4096..8192));
        assert_eq!(m.chunk_range(2), Some(8192..10_000));
        assert_eq!(m.chunk_range(3), None);
        assert_eq!(m.chunk_range(usize::MAX), None);
        assert_eq!(m.chunk_len(3), 0);
        // The ranges are exactly how `build` split the payload.
        for (i, h) in m.chunk_hashes.iter().enumerate() {
            let r = m.chunk_range(i).unwrap();
            assert_eq!(m.chunk_len(i), r.len() as u64);
            assert_eq!(hash_bytes(&payload[r]), *h);
        }
        // An exact multiple of the chunk size has no short last chunk.
        let m = signed(&[0u8; 8192], &k).manifest;
        assert_eq!(m.chunk_range(1), Some(4096..8192));
        assert_eq!(m.chunk_range(2), None);
        let m = signed(&[], &k).manifest;
        assert_eq!(m.chunk_range(0), None);
        assert_eq!(chunk_range(10, 0, 0), None);
        assert_eq!(chunk_range(u64::MAX, 1 << 20, usize::MAX), None);
    }

    #[test]
    fn bad_signature_and_foreign_signer_are_refused() {
        let learner = key(1);
        let stranger = key(2);
        let mut s = signed(b"weights", &learner);
        s.signature[5] ^= 1;
        assert!(matches!(
            s.verify(&learner.verifying_key()),
            Err(StorageError::BadSignature(_))
        ));

        // Signed correctly, but by a key that is not the swarm's learner.
        let foreign = signed(b"weights", &stranger);
        foreign.verify_self_consistent().unwrap();
        assert!(matches!(
            foreign.verify(&learner.verifying_key()),
            Err(StorageError::BadSignature(_))
        ));

        // A field changed after signing (version bumped to replay as new).
        let mut tampered = signed(b"weights", &learner);
        tampered.manifest.version += 1;
        assert!(tampered.verify(&learner.verifying_key()).is_err());

        // A stranger claiming to be the learner cannot produce a valid signature.
        let mut forged =
            SnapshotManifest::build("swarm", 9, [0; 32], b"x", 4096, &learner.verifying_key())
                .unwrap();
        forged.version = 10;
        assert!(forged.clone().sign(&stranger).is_err());
        let sig = stranger.sign(&forged.encode()).to_bytes();
        let forged = SignedManifest {
            manifest: forged,
            signature: sig,
        };
        assert!(forged.verify(&learner.verifying_key()).is_err());
    }

    #[test]
    fn inconsistent_manifests_are_refused() {
        let k = key(1);
        assert!(SnapshotManifest::build("s", 1, [0; 32], b"abc", 100, &k.verifying_key()).is_err());
        let mut s = signed(&[7u8; 9000], &k);
        s.manifest.chunk_hashes.pop();
        assert!(SignedManifest::decode(&s.encode()).is_err());
    }

    #[test]
    fn delta_manifests_round_trip_and_full_ones_stay_format_1() {
        let k = key(1);
        let full = signed(b"weights", &k);
        let bytes = full.encode();
        assert_eq!(bytes[3], MANIFEST_FORMAT, "a full payload keeps format 1");
        assert_eq!(
            SignedManifest::decode(&bytes).unwrap().manifest.payload,
            PayloadKind::Full
        );
        assert_eq!(full.manifest.full_root(), full.manifest.root_hash);

        let mut m =
            SnapshotManifest::build("swarm", 3, [1; 32], b"delta", 4096, &k.verifying_key())
                .unwrap();
        m.payload = PayloadKind::Delta {
            base_version: 2,
            full_root: [9; 32],
        };
        let s = m.sign(&k).unwrap();
        let bytes = s.encode();
        assert_eq!(bytes[3], MANIFEST_FORMAT_DELTA);
        let back = SignedManifest::decode(&bytes).unwrap();
        assert_eq!(back, s);
        back.verify(&k.verifying_key()).unwrap();
        assert_eq!(back.manifest.full_root(), [9; 32]);

        // The delta fields are signed: changing the base after signing fails verification.
        let mut t = s.clone();
        t.manifest.payload = PayloadKind::Delta {
            base_version: 1,
            full_root: [9; 32],
        };
        assert!(t.verify(&k.verifying_key()).is_err());
        // A base that is not an earlier version, or an unknown kind byte, does not decode.
        let mut fwd = s.manifest.clone();
        fwd.payload = PayloadKind::Delta {
            base_version: 3,
            full_root: [0; 32],
        };
        assert!(fwd.check().is_err());
        let mut bad = s.manifest.encode();
        let kind_at = bad.len() - 1 - 32 - 1;
        bad[kind_at] = 7;
        bad.extend_from_slice(&s.signature);
        assert!(SignedManifest::decode(&bad).is_err());
    }

    fn adapter_manifest(base_version: Option<u64>, k: &SigningKey) -> SignedManifest {
        let mut m = SnapshotManifest::build("swarm", 3, [1; 32], b"lora", 4096, &k.verifying_key())
            .unwrap();
        m.payload = PayloadKind::Adapter {
            base_version,
            base_hash: [7; 32],
        };
        m.sign(k).unwrap()
    }

    #[test]
    fn adapter_manifests_round_trip_and_are_signed() {
        let k = key(1);
        for base in [Some(0), Some(2), None] {
            let s = adapter_manifest(base, &k);
            let bytes = s.encode();
            assert_eq!(bytes[3], MANIFEST_FORMAT_ADAPTER);
            let back = SignedManifest::decode(&bytes).unwrap();
            assert_eq!(back, s);
            back.verify(&k.verifying_key()).unwrap();
            assert_eq!(back.manifest.full_root(), back.manifest.root_hash);
            // The base's identity is signed.
            let mut t = s.clone();
            t.manifest.payload = PayloadKind::Adapter {
                base_version: base,
                base_hash: [8; 32],
            };
            assert!(t.verify(&k.verifying_key()).is_err());
        }
        // A base version is encoded only with flag 1: v3 with a local base is 1 byte shorter.
        assert_eq!(
            adapter_manifest(Some(0), &k).encode().len(),
            adapter_manifest(None, &k).encode().len() + 1
        );
    }

    #[test]
    fn hostile_adapter_manifests_are_refused_with_errors() {
        let k = key(1);
        let s = adapter_manifest(Some(2), &k);
        let body = s.manifest.encode();
        let sig = s.signature;
        let with = |mut b: Vec<u8>| {
            b.extend_from_slice(&sig);
            SignedManifest::decode(&b)
        };
        // Layout of the tail: kind, flag, base version (1 byte here), base hash.
        let kind_at = body.len() - 32 - 1 - 1 - 1;
        let flag_at = kind_at + 1;
        let mut bad = body.clone();
        bad[kind_at] = KIND_DELTA;
        assert!(matches!(with(bad), Err(StorageError::Decode { .. })));
        let mut bad = body.clone();
        bad[flag_at] = 2;
        assert!(matches!(with(bad), Err(StorageError::Decode { .. })));
        // Format 2 with the adapter kind, format 1 with trailing adapter fields.
        let mut bad = body.clone();
        bad[3] = MANIFEST_FORMAT_DELTA;
        assert!(with(bad).is_err());
        let mut bad = body.clone();
        bad[3] = MANIFEST_FORMAT;
        assert!(with(bad).is_err());
        // Truncated anywhere in the tail.
        for cut in kind_at..body.len() {
            assert!(SignedManifest::decode(&body[..cut]).is_err());
        }
        // A base that is not an earlier version.
        let mut m = s.manifest.clone();
        m.payload = PayloadKind::Adapter {
            base_version: Some(3),
            base_hash: [0; 32],
        };
        assert!(m.check().is_err());
        assert!(with(m.encode()).is_err());
    }

    proptest! {
        #[test]
        fn adapter_tails_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..80)) {
            let k = key(1);
            let s = signed(b"x", &k);
            let mut b = s.manifest.encode();
            b[3] = MANIFEST_FORMAT_ADAPTER;
            b.extend_from_slice(&tail);
            let _ = SignedManifest::decode(&b);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = SignedManifest::decode(&bytes);
            let mut prefixed = b"ESM\x01".to_vec();
            prefixed.extend_from_slice(&bytes);
            let _ = SignedManifest::decode(&prefixed);
        }

        #[test]
        fn corrupted_manifests_never_verify(idx in 0usize..10_000, bit in 0u8..8) {
            let k = key(4);
            let s = signed(&[3u8; 12_000], &k);
            let mut bytes = s.encode();
            let i = idx % bytes.len();
            bytes[i] ^= 1 << bit;
            if let Ok(m) = SignedManifest::decode(&bytes) {
                prop_assert!(m.verify(&k.verifying_key()).is_err());
            }
        }
    }
}
