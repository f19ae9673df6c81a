use super::*;
use policy::{DType, Device, ModelConfig, Policy};

/// The embedded model's bf16 payload, and `n` versions after it, each changing every
/// `stride`-th bf16 value (after the header) of the one before.
fn versions(n: usize, stride: usize) -> Vec<bytes::Bytes> {
    let p = Policy::new_random(&ModelConfig::tiny(), 1, &Device::Cpu).unwrap();
    let mut cur = p.to_safetensors_bytes_as(DType::BF16).unwrap();
    let start = 8 + u64::from_le_bytes(cur[..8].try_into().unwrap()) as usize;
    let mut out = vec![bytes::Bytes::from(cur.clone())];
    for k in 1..n {
        for i in (start + 2 * k..cur.len()).step_by(2 * stride) {
            cur[i] ^= 1;
        }
        out.push(bytes::Bytes::from(cur.clone()));
    }
    out
}

/// Learner and worker through the same sequence: v1 a keyframe, then deltas until the
/// keyframe period; the worker reconstructs every version bit for bit.
#[test]
fn learner_deltas_reconstruct_bit_exactly_at_the_worker() {
    let vs = versions(6, 97);
    let mut learner = DeltaPublisher::new(4);
    let mut worker = DeltaBase::default();
    let mut kinds = Vec::new();
    for (i, full) in vs.iter().enumerate() {
        let v = i as u64 + 1;
        let (payload, kind, root) = learner.prepare(v, full);
        assert_eq!(root, hash_bytes(full));
        learner.published(v, full.clone(), kind);
        kinds.push(kind == PayloadKind::Full);
        if kind != PayloadKind::Full {
            assert!(payload.len() < full.len() / 10, "a sparse delta is small");
        }
        let got = worker
            .full_payload(v, Arc::new(payload.to_vec()), kind)
            .unwrap();
        assert_eq!(&got[..], &full[..], "v{v} is bit-exact");
        worker.installed(v, got);
    }
    // Keyframes at v1 and v5 (every 4 versions), deltas between.
    assert_eq!(kinds, [true, false, false, false, true, false]);
}

/// Every value changed by a random amount (incompressible): the delta would not save a tenth,
/// so the version goes out whole.
#[test]
fn a_dense_change_is_published_whole() {
    let vs = versions(1, 1);
    let mut dense = vs[0].to_vec();
    let start = 8 + u64::from_le_bytes(dense[..8].try_into().unwrap()) as usize;
    let mut noise = vec![0u8; dense.len() - start];
    blake3::Hasher::new()
        .update(b"dense")
        .finalize_xof()
        .fill(&mut noise);
    for (d, n) in dense[start..].iter_mut().zip(noise) {
        *d ^= n | 1;
    }
    let dense = bytes::Bytes::from(dense);
    let mut learner = DeltaPublisher::new(16);
    learner.published(1, vs[0].clone(), PayloadKind::Full);
    let (payload, kind, _) = learner.prepare(2, &dense);
    assert_eq!(kind, PayloadKind::Full);
    assert_eq!(payload, dense);
}

/// Every value one ulp away (what a tiny optimiser step does where it changes everything)
/// codes to a small delta: the differences compress where the new bits would not.
#[test]
fn a_dense_one_ulp_change_is_a_small_delta() {
    let vs = versions(2, 1);
    let mut learner = DeltaPublisher::new(16);
    learner.published(1, vs[0].clone(), PayloadKind::Full);
    let (payload, kind, _) = learner.prepare(2, &vs[1]);
    assert!(matches!(kind, PayloadKind::Delta { .. }), "{kind:?}");
    assert!(payload.len() < vs[1].len() / 8, "{} B", payload.len());
}

/// A worker without the named base, a delta that does not decode, and a delta whose result is
/// not the signed full root are all refused before anything is installed.
#[test]
fn wrong_base_bad_delta_and_root_mismatch_are_refused() {
    let vs = versions(3, 50);
    let mut learner = DeltaPublisher::new(16);
    learner.published(1, vs[0].clone(), PayloadKind::Full);
    let (d2, k2, _) = learner.prepare(2, &vs[1]);
    assert!(matches!(
        k2,
        PayloadKind::Delta {
            base_version: 1,
            ..
        }
    ));

    // Never installed v1 (joined late): no base.
    let fresh = DeltaBase::default();
    let e = fresh
        .full_payload(2, Arc::new(d2.to_vec()), k2)
        .unwrap_err();
    assert!(
        matches!(
            e,
            DeltaRefused::NoBase {
                needed: 1,
                held: None,
                ..
            }
        ),
        "{e}"
    );

    // Holds v1 under another payload (the manifest says v1, the bytes differ): wrong base.
    let mut other = DeltaBase::default();
    other.installed(1, Arc::new(vs[2].to_vec()));
    let e = other
        .full_payload(2, Arc::new(d2.to_vec()), k2)
        .unwrap_err();
    assert!(
        matches!(
            e,
            DeltaRefused::Delta {
                source: DeltaError::WrongBase { .. },
                ..
            }
        ),
        "{e}"
    );

    let mut worker = DeltaBase::default();
    worker.installed(1, Arc::new(vs[0].to_vec()));
    // Records of another version under v2's header hashes: decodes, but does not reconstruct
    // what the delta names.
    let mut bad = policy::delta::encode(&vs[0], &vs[2]).unwrap();
    bad[40..72].copy_from_slice(&d2[40..72]);
    let e = worker.full_payload(2, Arc::new(bad), k2).unwrap_err();
    assert!(
        matches!(
            e,
            DeltaRefused::Delta {
                source: DeltaError::NotReconstructed { .. },
                ..
            }
        ),
        "{e}"
    );
    // A correct delta under a manifest naming another full root.
    let lying = PayloadKind::Delta {
        base_version: 1,
        full_root: [7; 32],
    };
    let e = worker
        .full_payload(2, Arc::new(d2.to_vec()), lying)
        .unwrap_err();
    assert!(matches!(e, DeltaRefused::RootMismatch { .. }), "{e}");
    // And the honest one installs.
    let got = worker.full_payload(2, Arc::new(d2.to_vec()), k2).unwrap();
    assert_eq!(&got[..], &vs[1][..]);
}

/// A learner's chunk store holding a keyframe and the deltas after it rebuilds every
/// version; a version whose keyframe was collected is unavailable, not wrong.
#[test]
fn the_store_rebuilds_delta_versions_from_their_keyframe() {
    let vs = versions(5, 61);
    let dir = tempfile::tempdir().unwrap();
    let store = storage::ChunkStore::open(dir.path(), 4).unwrap();
    let node_key = storage::NodeKey::from_seed([5; 32]);
    let key = node_key.signing_key();
    let mut learner = DeltaPublisher::new(3);
    let mut kinds = Vec::new();
    for (i, full) in vs.iter().enumerate() {
        let v = i as u64 + 1;
        let (payload, kind, _) = learner.prepare(v, full);
        let mut m =
            storage::SnapshotManifest::build("s", v, [0; 32], &payload, 4096, &key.verifying_key())
                .unwrap();
        m.payload = kind;
        let signed = m.sign(key).unwrap();
        store.publish(&signed, &payload).unwrap();
        store.retain().unwrap();
        learner.published(v, full.clone(), kind);
        kinds.push(kind == PayloadKind::Full);
    }
    assert_eq!(kinds, [true, false, false, true, false]);
    // The newest four are v2..v5 (keep = 4); v2 and v3 are deltas on keyframe v1, so
    // garbage collection keeps v1 too, and every version rebuilds.
    assert_eq!(store.versions().unwrap(), [1, 2, 3, 4, 5]);
    for (i, full) in vs.iter().enumerate() {
        let got = assemble_full(&store, i as u64 + 1).unwrap().unwrap();
        assert_eq!(&got[..], &full[..], "v{}", i + 1);
    }
    // Two more versions (the same weights): once the newest four are v4..v7, all on keyframe
    // v4, the older chain is collected; v5 still rebuilds from keyframe v4.
    for v in 6..=7u64 {
        let (payload, kind, _) = learner.prepare(v, &vs[4]);
        let mut m =
            storage::SnapshotManifest::build("s", v, [0; 32], &payload, 4096, &key.verifying_key())
                .unwrap();
        m.payload = kind;
        store.publish(&m.sign(key).unwrap(), &payload).unwrap();
        store.retain().unwrap();
        learner.published(v, vs[4].clone(), kind);
    }
    assert_eq!(store.versions().unwrap(), [4, 5, 6, 7]);
    assert!(
        assemble_full(&store, 3).unwrap().is_none(),
        "v3's chain is gone"
    );
    assert_eq!(&assemble_full(&store, 5).unwrap().unwrap()[..], &vs[4][..]);
    // A chain applied from a held payload: v5 from the full payload of v4.
    let got = apply_chain(&store, Some(&vs[3][..]), &[5]).unwrap();
    assert_eq!(&got[..], &vs[4][..]);
    // A delta with no base is refused, not guessed.
    assert!(apply_chain(&store, None, &[5]).is_err());
}
