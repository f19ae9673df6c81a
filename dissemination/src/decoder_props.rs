//! Property tests of this crate's decoders that a peer's bytes reach: the signed chain plan
//! ([`SignedPlan::decode`]) and activation order ([`SignedOrder::decode`]), gossiped and
//! carried in stream hellos, and the chunk-stream / chunk-fetch message bodies
//! ([`crate::wire`]). Test-only.
//!
//! Owns: strategies for valid plans, orders and wire messages, and the properties — no panic
//! on hostile bytes, round trip, a length or count above its limit refused before allocating,
//! and no mutation of a signed plan or order ever verifying. Must not touch: the encodings.

use ed25519_dalek::SigningKey;
use p2p::PeerId;
use proptest::prelude::*;
use storage::codec::Writer;

use crate::order_msg::{ActivationOrder, SignedOrder, MAX_ORDER_PEERS};
use crate::plan_msg::{PlanMessage, SignedPlan, MAX_PLAN_PEERS};
use crate::wire::{
    decode_index, encode_index, CatchUp, FetchRequest, Reply, StreamHello, MAX_FETCH_BATCH,
    MAX_HELLO_BYTES, MAX_MANIFEST_BYTES,
};

fn learner() -> SigningKey {
    SigningKey::from_bytes(&[0x4c; 32])
}

/// `n` distinct peer ids; `salt` varies them between cases.
fn peers(n: usize, salt: u8) -> Vec<PeerId> {
    (0..n)
        .map(|i| {
            let mut seed = [salt; 32];
            seed[0] = i as u8;
            p2p::peer_id_from_seed(seed)
        })
        .collect()
}

fn swarm_id() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..8).prop_map(String::from_iter)
}

/// A plan signed by [`learner`]: 0–3 chains of 1–3 peers, 0–3 fetch-only peers, no peer twice.
fn signed_plan() -> impl Strategy<Value = SignedPlan> {
    (
        swarm_id(),
        any::<(u64, u64, u64)>(),
        proptest::collection::vec(1usize..=3, 0..=3),
        0usize..=3,
        any::<u8>(),
    )
        .prop_map(|(swarm_id, (version, seq, created), lens, n_fetch, salt)| {
            let mut all = peers(lens.iter().sum::<usize>() + n_fetch, salt).into_iter();
            let chains = lens
                .iter()
                .map(|&n| all.by_ref().take(n).collect())
                .collect();
            let key = learner();
            PlanMessage {
                swarm_id,
                version,
                seq,
                created_unix_ms: created,
                learner_key: key.verifying_key().to_bytes(),
                chains,
                fetch_only: all.collect(),
            }
            .sign(&key)
            .expect("the learner signs its own plan")
        })
}

/// An order signed by [`learner`]: 0–4 active and 0–4 standby peers, no peer twice.
fn signed_order() -> impl Strategy<Value = SignedOrder> {
    (
        swarm_id(),
        any::<(u64, u64)>(),
        0usize..=4,
        0usize..=4,
        any::<u8>(),
    )
        .prop_map(|(swarm_id, (seq, created), n_active, n_standby, salt)| {
            let mut all = peers(n_active + n_standby, salt);
            let standby = all.split_off(n_active);
            let key = learner();
            ActivationOrder {
                swarm_id,
                seq,
                created_unix_ms: created,
                learner_key: key.verifying_key().to_bytes(),
                active: all,
                standby,
            }
            .sign(&key)
            .expect("the learner signs its own order")
        })
}

/// An alteration of a valid encoding: flip bits of a byte, insert, delete, truncate, append.
fn mutate(bytes: &[u8], kind: u8, at: usize, x: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let n = b.len().max(1);
    match kind % 5 {
        0 if !b.is_empty() => b[at % n] ^= x.max(1),
        1 => b.insert(at % (b.len() + 1), x),
        2 if !b.is_empty() => {
            b.remove(at % n);
        }
        3 => b.truncate(at % n),
        _ => b.push(x),
    }
    b
}

fn varint_len(v: u64) -> usize {
    let mut w = Writer::default();
    w.varint(v);
    w.into_bytes().len()
}

fn str_len(s: &str) -> usize {
    varint_len(s.len() as u64) + s.len()
}

fn peers_len(ps: &[PeerId]) -> usize {
    varint_len(ps.len() as u64)
        + ps.iter()
            .map(|p| {
                let b = p.to_bytes();
                varint_len(b.len() as u64) + b.len()
            })
            .sum::<usize>()
}

/// Offsets of the plan's varints: swarm-id length, version, seq, created, chain count, the
/// fetch-only count.
fn plan_varint_offsets(p: &PlanMessage) -> [usize; 6] {
    let swarm = 4;
    let version = swarm + str_len(&p.swarm_id);
    let seq = version + varint_len(p.version);
    let created = seq + varint_len(p.seq);
    let chains = created + varint_len(p.created_unix_ms) + 32;
    let fetch = chains
        + varint_len(p.chains.len() as u64)
        + p.chains.iter().map(|c| peers_len(c)).sum::<usize>();
    [swarm, version, seq, created, chains, fetch]
}

/// Offsets of the order's varints: swarm-id length, seq, created, active count, standby count.
fn order_varint_offsets(o: &ActivationOrder) -> [usize; 5] {
    let swarm = 4;
    let seq = swarm + str_len(&o.swarm_id);
    let created = seq + varint_len(o.seq);
    let active = created + varint_len(o.created_unix_ms) + 32;
    let standby = active + peers_len(&o.active);
    [swarm, seq, created, active, standby]
}

/// `bytes` with the varint at `start` replaced by the varint of `value`.
fn patch_varint(bytes: &[u8], start: usize, value: u64) -> Vec<u8> {
    let end = start + bytes[start..].iter().position(|b| b & 0x80 == 0).unwrap();
    let mut w = Writer::default();
    w.raw(&bytes[..start]);
    w.varint(value);
    w.raw(&bytes[end + 1..]);
    w.into_bytes()
}

/// `bytes` with the varint at `start` re-encoded with a redundant continuation byte.
fn stretch_varint(bytes: &[u8], start: usize) -> Vec<u8> {
    let end = start + bytes[start..].iter().position(|b| b & 0x80 == 0).unwrap();
    let mut out = bytes[..end].to_vec();
    out.extend_from_slice(&[bytes[end] | 0x80, 0]);
    out.extend_from_slice(&bytes[end + 1..]);
    out
}

fn reply() -> impl Strategy<Value = (Reply, usize)> {
    prop_oneof![
        (proptest::collection::vec(any::<u8>(), 0..16), 0usize..64).prop_map(|(held, extra)| (
            Reply::Accept { held: held.clone() },
            held.len() * 8 + extra
        )),
        (0usize..1000).prop_map(|n| (Reply::Refuse, n)),
    ]
}

fn fetch_request() -> impl Strategy<Value = FetchRequest> {
    prop_oneof![
        (
            any::<u64>(),
            proptest::collection::vec(any::<[u8; 32]>(), 1..=MAX_FETCH_BATCH)
        )
            .prop_map(|(version, hashes)| FetchRequest::Chunks { version, hashes }),
        any::<u64>().prop_map(|version| FetchRequest::Manifest { version }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn signed_plans_and_orders_round_trip_and_verify(p in signed_plan(), o in signed_order()) {
        let key = learner().verifying_key();
        let back = SignedPlan::decode(&p.encode()).unwrap();
        prop_assert!(back.verify(&key).is_ok());
        prop_assert_eq!(back, p);
        let back = SignedOrder::decode(&o.encode()).unwrap();
        prop_assert!(back.verify(&key).is_ok());
        prop_assert_eq!(back, o);
    }

    #[test]
    fn no_mutation_of_a_signed_plan_or_order_verifies(
        p in signed_plan(),
        o in signed_order(),
        kind: u8,
        at: usize,
        x: u8,
    ) {
        let key = learner().verifying_key();
        let bytes = mutate(&p.encode(), kind, at, x);
        if let Ok(d) = SignedPlan::decode(&bytes) {
            prop_assert!(d.verify(&key).is_err());
        }
        let bytes = mutate(&o.encode(), kind, at, x);
        if let Ok(d) = SignedOrder::decode(&bytes) {
            prop_assert!(d.verify(&key).is_err());
        }
    }

    #[test]
    fn a_re_encoded_varint_in_a_plan_or_order_is_refused(
        p in signed_plan(),
        o in signed_order(),
        which in 0usize..6,
    ) {
        // Same numbers, other bytes: accepted, one signed message would travel under many
        // byte strings, each verifying, and defeat byte-level deduplication of gossip.
        let start = plan_varint_offsets(&p.plan)[which];
        prop_assert!(SignedPlan::decode(&stretch_varint(&p.encode(), start)).is_err());
        let start = order_varint_offsets(&o.order)[which % 5];
        prop_assert!(SignedOrder::decode(&stretch_varint(&o.encode(), start)).is_err());
    }

    #[test]
    fn huge_counts_in_plans_and_orders_are_refused_promptly(
        p in signed_plan(),
        o in signed_order(),
        huge in (MAX_PLAN_PEERS.max(MAX_ORDER_PEERS) as u64 + 1)..=u64::MAX,
        field in 0usize..2,
    ) {
        let start = plan_varint_offsets(&p.plan)[[4, 5][field]];
        prop_assert!(SignedPlan::decode(&patch_varint(&p.encode(), start, huge)).is_err());
        let start = order_varint_offsets(&o.order)[[3, 4][field]];
        prop_assert!(SignedOrder::decode(&patch_varint(&o.encode(), start, huge)).is_err());
        // A swarm id longer than the limit.
        let bytes = patch_varint(&p.encode(), 4, huge);
        let err = SignedPlan::decode(&bytes).unwrap_err().to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
        let bytes = patch_varint(&o.encode(), 4, huge);
        let err = SignedOrder::decode(&bytes).unwrap_err().to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
    }

    #[test]
    fn a_chain_count_beyond_the_bytes_left_is_refused_before_allocating(
        p in signed_plan(),
        claimed in 1u64..=MAX_PLAN_PEERS as u64,
    ) {
        // Every chain takes at least 3 bytes (a length and a peer id of at least one byte):
        // a count the remaining bytes cannot hold is refused before reserving room for it.
        let start = plan_varint_offsets(&p.plan)[4];
        let bytes = p.encode();
        let left = (bytes.len() - start) as u64;
        prop_assume!(claimed * 3 > left);
        let err = SignedPlan::decode(&patch_varint(&bytes, start, claimed))
            .unwrap_err()
            .to_string();
        prop_assert!(err.contains("bytes left"), "{}", err);
    }

    #[test]
    fn wire_messages_round_trip(
        hello_parts in (
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::collection::vec(any::<u8>(), 0..200),
        ),
        (reply, chunks) in reply(),
        index: u64,
        req in fetch_request(),
    ) {
        let hello = CatchUp { manifest: hello_parts.0, plan: hello_parts.1 };
        prop_assert_eq!(CatchUp::decode(&hello.encode()).unwrap(), hello);
        prop_assert!(reply.encode().len() <= Reply::max_len(chunks));
        prop_assert_eq!(Reply::decode(&reply.encode(), chunks).unwrap(), reply);
        prop_assert_eq!(decode_index(&encode_index(index as usize)).unwrap(), Some(index));
        prop_assert_eq!(FetchRequest::decode(&req.encode()).unwrap(), req);
    }

    #[test]
    fn hostile_wire_bytes_never_panic(
        random in proptest::collection::vec(any::<u8>(), 0..128),
        req in fetch_request(),
        chunks in 0usize..100,
        kind: u8,
        at: usize,
        x: u8,
    ) {
        let mutated = mutate(&req.encode(), kind, at, x);
        for bytes in [&random, &mutated] {
            let _ = CatchUp::decode(bytes);
            if let Ok(h) = StreamHello::decode(bytes) {
                prop_assert!(h.manifest.len() + h.plan.len() <= MAX_HELLO_BYTES);
            }
            if let Ok(Reply::Accept { held }) = Reply::decode(bytes, chunks) {
                prop_assert!(held.len() <= chunks.div_ceil(8));
            }
            let _ = decode_index(bytes);
            if let Ok(FetchRequest::Chunks { hashes, .. }) = FetchRequest::decode(bytes) {
                prop_assert!(!hashes.is_empty() && hashes.len() <= MAX_FETCH_BATCH);
            }
            let _ = SignedPlan::decode(bytes);
            let _ = SignedOrder::decode(bytes);
        }
        let mut magic = b"ECP\x02".to_vec();
        magic.extend_from_slice(&random);
        let _ = SignedPlan::decode(&magic);
        magic[..3].copy_from_slice(b"ECA");
        let _ = SignedOrder::decode(&magic);
    }

    #[test]
    fn huge_wire_lengths_are_refused_promptly(
        hello_parts in (
            proptest::collection::vec(any::<u8>(), 0..50),
            proptest::collection::vec(any::<u8>(), 0..50),
        ),
        huge_manifest in (MAX_MANIFEST_BYTES as u64 + 1)..=u64::MAX,
        count in (MAX_FETCH_BATCH as u64 + 1)..=u64::MAX,
        version: u64,
        chunks in 0usize..64,
    ) {
        let hello = CatchUp { manifest: hello_parts.0, plan: hello_parts.1 };
        let err = CatchUp::decode(&patch_varint(&hello.encode(), 0, huge_manifest))
            .unwrap_err()
            .to_string();
        prop_assert!(err.contains("exceeds"), "{}", err);
        let req = FetchRequest::Chunks { version, hashes: vec![[7; 32]] }.encode();
        let err = FetchRequest::decode(&patch_varint(&req, varint_len(version), count))
            .unwrap_err()
            .to_string();
        prop_assert!(err.contains(&format!("> {MAX_FETCH_BATCH}")), "{}", err);
        let bitmap = Reply::Accept { held: vec![0xff; chunks.div_ceil(8) + 1] };
        prop_assert!(Reply::decode(&bitmap.encode(), chunks).is_err());
    }
}
