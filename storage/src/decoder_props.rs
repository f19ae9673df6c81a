//! Property tests of the two decoders of this crate that a peer's bytes reach: the signed
//! snapshot manifest ([`SignedManifest::decode`], carried in stream hellos and catch-up
//! answers) and the trajectory group ([`TrajectoryGroup::decode`], carried by the pull
//! protocol). Test-only.
//!
//! Owns: the strategies for valid manifests and groups and the four decoder properties —
//! no panic on hostile bytes, round trip, a length or count above its limit refused before
//! allocating, and no mutation of a signed manifest ever verifying. Must not touch: the
//! encodings themselves.

use ed25519_dalek::SigningKey;
use proptest::prelude::*;

use crate::codec::Writer;
use crate::manifest::{
    SignedManifest, SnapshotManifest, MANIFEST_FORMAT, MANIFEST_MAGIC, MAX_CHUNKS, MIN_CHUNK_SIZE,
};
use crate::record::{limits, Sample, TrajectoryGroup, GROUP_MAGIC};

/// A short string of arbitrary characters (`max_chars` of up to 4 bytes each).
fn text(max_chars: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..=max_chars).prop_map(String::from_iter)
}

fn learner() -> SigningKey {
    SigningKey::from_bytes(&[0x4c; 32])
}

/// A valid manifest signed by [`learner`]: 0–5 chunks whose count matches the total length.
fn signed_manifest() -> impl Strategy<Value = SignedManifest> {
    (
        text(16).prop_filter("swarm id is 1–128 bytes", |s| !s.is_empty()),
        any::<u64>(),
        any::<[u8; 32]>(),
        MIN_CHUNK_SIZE..=4 * MIN_CHUNK_SIZE,
        0usize..=5,
        any::<u32>(),
        any::<[u8; 32]>(),
        any::<u64>(),
    )
        .prop_flat_map(
            |(swarm_id, version, config, chunk_size, n, tail, root, created)| {
                // The last chunk holds 1..=chunk_size bytes.
                let total_len = if n == 0 {
                    0
                } else {
                    (n as u64 - 1) * u64::from(chunk_size) + 1 + u64::from(tail % chunk_size)
                };
                proptest::collection::vec(any::<[u8; 32]>(), n).prop_map(move |chunk_hashes| {
                    let key = learner();
                    SnapshotManifest {
                        swarm_id: swarm_id.clone(),
                        version,
                        model_config_hash: config,
                        total_len,
                        chunk_size,
                        chunk_hashes,
                        root_hash: root,
                        created_unix_ms: created,
                        learner_key: key.verifying_key().to_bytes(),
                        payload: match version % 3 {
                            0 => crate::manifest::PayloadKind::Full,
                            1 => crate::manifest::PayloadKind::Delta {
                                base_version: version - 1,
                                full_root: root,
                            },
                            _ => crate::manifest::PayloadKind::Adapter {
                                base_version: (version % 2 == 0).then_some(version - 1),
                                base_hash: root,
                            },
                        },
                    }
                    .sign(&key)
                    .expect("the learner signs its own manifest")
                })
            },
        )
}

/// A valid trajectory group: 1–3 samples of 0–8 tokens, arbitrary text and ids.
fn group() -> impl Strategy<Value = TrajectoryGroup> {
    let sample = (0usize..=8).prop_flat_map(|n| {
        (
            any::<[u8; 16]>(),
            proptest::collection::vec(any::<u32>(), n),
            text(8),
            -1e6f32..1e6,
            proptest::collection::vec(-50f32..=0.0, n),
            proptest::collection::vec(0u8..=1, n),
            any::<u64>(),
        )
            .prop_map(
                |(
                    trajectory_id,
                    response_tokens,
                    response_text,
                    reward,
                    sampler_logprobs,
                    loss_mask,
                    finished_unix_ms,
                )| Sample {
                    trajectory_id,
                    response_tokens,
                    response_text,
                    reward,
                    sampler_logprobs,
                    loss_mask,
                    finished_unix_ms,
                },
            )
    });
    (
        any::<[u8; 16]>(),
        (text(8), text(8), text(8)),
        any::<u64>(),
        text(16),
        proptest::collection::vec(any::<u32>(), 0..8),
        any::<u64>(),
        proptest::collection::vec(sample, 1..=3),
    )
        .prop_map(
            |(
                group_id,
                (task_id, prompt_id, producer),
                version,
                prompt_text,
                prompt_tokens,
                created_unix_ms,
                samples,
            )| TrajectoryGroup {
                group_id,
                task_id,
                prompt_id,
                version,
                seq: version ^ 1,
                producer,
                prompt_text,
                prompt_tokens,
                created_unix_ms,
                samples,
                signature: None,
            },
        )
}

/// The ways a peer may alter a valid encoding: flip bits of a byte, insert a byte, delete a
/// byte, truncate, or append.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Xor(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Append(u8),
}

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Xor(i, x)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
        any::<u8>().prop_map(Mutation::Append),
    ]
}

impl Mutation {
    /// `bytes` altered (never equal to the input for a non-empty input).
    pub(crate) fn apply(&self, bytes: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        let n = b.len().max(1);
        match *self {
            Mutation::Xor(i, x) if !b.is_empty() => b[i % n] ^= x,
            Mutation::Insert(i, x) => b.insert(i % (b.len() + 1), x),
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i % n);
            }
            Mutation::Truncate(i) => b.truncate(i % n),
            Mutation::Append(x) => b.push(x),
            _ => {}
        }
        b
    }
}

/// `bytes` with the varint at `start` re-encoded with one redundant continuation byte (`v` as
/// `v | 0x80, 0x00` for a one-byte `v`): the same number, other bytes.
pub(crate) fn stretch_varint(bytes: &[u8], start: usize) -> Vec<u8> {
    let mut end = start;
    while bytes[end] & 0x80 != 0 {
        end += 1;
    }
    let mut out = bytes[..end].to_vec();
    out.push(bytes[end] | 0x80);
    out.push(0);
    out.extend_from_slice(&bytes[end + 1..]);
    out
}

/// Length of the varint encoding of `v`.
pub(crate) fn varint_len(v: u64) -> usize {
    let mut w = Writer::default();
    w.varint(v);
    w.into_bytes().len()
}

/// Offsets of the manifest's varints: swarm-id length, version, total length, chunk size,
/// chunk count, created.
fn manifest_varint_offsets(m: &SnapshotManifest) -> [usize; 6] {
    let swarm_len = MANIFEST_MAGIC.len() + 1;
    let version = swarm_len + varint_len(m.swarm_id.len() as u64) + m.swarm_id.len();
    let total = version + varint_len(m.version) + 32;
    let chunk_size = total + varint_len(m.total_len);
    let count = chunk_size + varint_len(u64::from(m.chunk_size));
    let created = count + varint_len(m.chunk_hashes.len() as u64) + 32 * m.chunk_hashes.len() + 32;
    [swarm_len, version, total, chunk_size, count, created]
}

/// `bytes` with the varint at `start` replaced by the varint of `value`.
pub(crate) fn patch_varint(bytes: &[u8], start: usize, value: u64) -> Vec<u8> {
    let mut end = start;
    while bytes[end] & 0x80 != 0 {
        end += 1;
    }
    let mut w = Writer::default();
    w.raw(&bytes[..start]);
    w.varint(value);
    w.raw(&bytes[end + 1..]);
    w.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn signed_manifests_round_trip_and_verify(s in signed_manifest()) {
        let back = SignedManifest::decode(&s.encode()).unwrap();
        prop_assert!(back.verify(&learner().verifying_key()).is_ok());
        prop_assert_eq!(back, s);
    }

    #[test]
    fn no_mutation_of_a_signed_manifest_verifies(s in signed_manifest(), m in mutation()) {
        let key = learner().verifying_key();
        let bytes = m.apply(&s.encode());
        if let Ok(d) = SignedManifest::decode(&bytes) {
            prop_assert!(d.verify(&key).is_err(), "{:?} verified", m);
        }
    }

    #[test]
    fn a_re_encoded_varint_is_refused(s in signed_manifest(), which in 0usize..6) {
        // Same numbers, other bytes: a decoder that accepts them lets one signed manifest
        // travel under many byte strings (each verifying), defeating byte-level dedup.
        let start = manifest_varint_offsets(&s.manifest)[which];
        let bytes = stretch_varint(&s.encode(), start);
        prop_assert!(SignedManifest::decode(&bytes).is_err());
    }

    #[test]
    fn a_huge_chunk_count_or_swarm_id_length_is_refused_promptly(
        s in signed_manifest(),
        huge in (MAX_CHUNKS as u64 + 1)..=u64::MAX,
        field in prop_oneof![Just(0usize), Just(4usize)],
    ) {
        let start = manifest_varint_offsets(&s.manifest)[field];
        let bytes = patch_varint(&s.encode(), start, huge);
        let err = SignedManifest::decode(&bytes).unwrap_err().to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
    }

    #[test]
    fn a_chunk_count_beyond_the_bytes_left_is_refused(s in signed_manifest(), extra in 1u64..=64) {
        // Within the limit but more hashes than the message carries: refused from the length
        // alone (no `Vec::with_capacity` of a peer-chosen size).
        let start = manifest_varint_offsets(&s.manifest)[4];
        let claimed = (s.encode().len() as u64 / 32) + extra;
        let bytes = patch_varint(&s.encode(), start, claimed);
        let err = SignedManifest::decode(&bytes).unwrap_err().to_string();
        prop_assert!(err.contains("bytes left"), "{}", err);
    }

    #[test]
    fn arbitrary_bytes_after_the_manifest_magic_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut b = MANIFEST_MAGIC.to_vec();
        b.push(MANIFEST_FORMAT);
        b.push(bytes.len() as u8 % 8);
        b.extend_from_slice(&bytes);
        if let Ok(d) = SignedManifest::decode(&b) {
            prop_assert!(d.verify(&learner().verifying_key()).is_err());
        }
    }

    #[test]
    fn groups_round_trip(g in group()) {
        prop_assert!(g.validate().is_ok());
        prop_assert_eq!(TrajectoryGroup::decode(&g.encode()).unwrap(), g);
    }

    #[test]
    fn mutated_groups_never_panic_and_truncations_always_fail(g in group(), m in mutation()) {
        let bytes = g.encode();
        let mutated = m.apply(&bytes);
        let r = TrajectoryGroup::decode(&mutated);
        if let Mutation::Truncate(_) = m {
            prop_assert!(r.is_err());
        }
        if let Ok(d) = r {
            // Whatever decodes is a valid group.
            prop_assert!(d.validate().is_ok());
        }
    }

    #[test]
    fn huge_group_lengths_are_refused_promptly(
        g in group(),
        huge in (limits::MAX_TEXT as u64 + 1)..=u64::MAX,
        field in 0usize..3,
    ) {
        // Offsets of the task-id length, the prompt-text length and the sample count.
        let str_len = |s: &str| varint_len(s.len() as u64) + s.len();
        let task = GROUP_MAGIC.len() + 1 + 16;
        let prompt = task
            + str_len(&g.task_id)
            + str_len(&g.prompt_id)
            + varint_len(g.version)
            + varint_len(g.seq)
            + str_len(&g.producer);
        let samples = prompt
            + str_len(&g.prompt_text)
            + varint_len(g.prompt_tokens.len() as u64)
            + g.prompt_tokens.iter().map(|t| varint_len(u64::from(*t))).sum::<usize>()
            + varint_len(g.created_unix_ms);
        let bytes = g.encode();
        prop_assert_eq!(bytes[samples], g.samples.len() as u8);
        let start = [task, prompt, samples][field];
        let err = TrajectoryGroup::decode(&patch_varint(&bytes, start, huge))
            .unwrap_err()
            .to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
    }
}
