use super::*;
use crate::safetensors_io::write_safetensors;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// A bf16 payload with the given tensors (raw u16 bits) in the snapshot layout.
fn payload(tensors: &[(String, Vec<u16>)]) -> Vec<u8> {
    let named: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, v)| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.clone(), vec![v.len()], bytes)
        })
        .collect();
    write_safetensors(&named, "BF16", "cafe").unwrap()
}

/// Random NaN-free bf16 bits.
fn bits(rng: &mut impl Rng) -> u16 {
    let b: u16 = rng.gen();
    if b & 0x7f80 == 0x7f80 {
        b & !0x4000
    } else {
        b
    }
}

/// Random tensors of the given sizes, and a copy where each value changes with probability
/// `p[i]` of its tensor (a change always changes the bits).
fn pair(sizes: &[usize], p: &[f64], seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut base = Vec::new();
    let mut new = Vec::new();
    for (k, (&n, &pk)) in sizes.iter().zip(p).enumerate() {
        let b: Vec<u16> = (0..n).map(|_| bits(&mut rng)).collect();
        let mut c = b.clone();
        for x in c.iter_mut() {
            if rng.gen_bool(pk) {
                *x ^= rng.gen_range(1u16..0x4000);
            }
        }
        base.push((format!("t{k:02}"), b));
        new.push((format!("t{k:02}"), c));
    }
    (payload(&base), payload(&new))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random tensors and update patterns (empty, sparse, dense, per tensor) round-trip bit
    /// for bit, and the delta is never larger than a dense record of every tensor.
    #[test]
    fn roundtrip_bit_exact(
        sizes in prop::collection::vec(1usize..3000, 1..6),
        pick in prop::collection::vec(0usize..6, 6),
        seed in any::<u64>(),
    ) {
        const P: [f64; 6] = [0.0, 0.001, 0.01, 0.1, 0.6, 1.0];
        let p: Vec<f64> = (0..sizes.len()).map(|i| P[pick[i]]).collect();
        let (base, new) = pair(&sizes, &p, seed);
        let d = encode(&base, &new).unwrap();
        prop_assert!(is_delta(&d));
        prop_assert_eq!(apply(&base, &d).unwrap(), new.clone());
        let dense: usize = sizes.iter().map(|n| 2 * n + 1).sum();
        prop_assert!(d.len() <= HEADER_LEN + dense);
        prop_assert_eq!(base_hash(&d).unwrap(), blake3::hash(&base).to_hex().to_string());
    }

    /// Any single flipped byte or truncation of a delta is refused with a typed error, never
    /// a panic and never a wrong payload.
    #[test]
    fn corrupted_delta_refused(
        sizes in prop::collection::vec(1usize..800, 1..4),
        seed in any::<u64>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        let p = vec![0.05; sizes.len()];
        let (base, new) = pair(&sizes, &p, seed);
        let d = encode(&base, &new).unwrap();
        let mut bad = d.clone();
        let i = at.index(bad.len());
        bad[i] ^= flip;
        prop_assert!(apply(&base, &bad).is_err());
        let short = &d[..cut.index(d.len())];
        prop_assert!(apply(&base, short).is_err());
    }
}

#[test]
fn wrong_base_is_refused() {
    let (base, new) = pair(&[500, 70], &[0.02, 0.5], 1);
    let (other, _) = pair(&[500, 70], &[0.0, 0.0], 2);
    let d = encode(&base, &new).unwrap();
    assert!(matches!(
        apply(&other, &d),
        Err(DeltaError::WrongBase { .. })
    ));
    // Applying twice (to the new payload) is a wrong base too.
    assert!(matches!(apply(&new, &d), Err(DeltaError::WrongBase { .. })));
}

#[test]
fn the_header_names_the_result_hash_and_base_hash() {
    let (base, new) = pair(&[1000, 37], &[0.05, 0.5], 11);
    let d = encode(&base, &new).unwrap();
    assert_eq!(result_hash(&d).unwrap(), *blake3::hash(&new).as_bytes());
    assert_eq!(
        base_hash(&d).unwrap(),
        blake3::hash(&base).to_hex().to_string()
    );
    assert_eq!(
        result_hash(&d[..40]),
        Err(DeltaError::Truncated("new hash"))
    );
}

#[test]
fn empty_update_is_tiny_and_roundtrips() {
    let (base, _) = pair(&[4096, 4096], &[0.0, 0.0], 3);
    let d = encode(&base, &base).unwrap();
    assert_eq!(d.len(), HEADER_LEN + 2);
    assert_eq!(apply(&base, &d).unwrap(), base);
}

/// The encoder picks the smallest index encoding: gaps when sparse, a bitmap when dense,
/// raw values when (nearly) everything changed.
#[test]
fn index_encoding_follows_density() {
    let kind = |p: f64| {
        let (b, n) = pair(&[20_000], &[p], 4);
        encode(&b, &n).unwrap()[HEADER_LEN]
    };
    assert_eq!(kind(0.01), KIND_GAPS);
    assert_eq!(kind(0.3), KIND_BITMAP);
    assert_eq!(kind(1.0), KIND_DENSE);
}

#[test]
fn incompatible_payloads_are_typed_errors() {
    let (a, _) = pair(&[100], &[0.0], 5);
    let (b, _) = pair(&[101], &[0.0], 5);
    assert!(matches!(encode(&a, &b), Err(DeltaError::Incompatible(_))));
    let f32_payload =
        write_safetensors(&[("t".into(), vec![2], vec![0u8; 8])], "F32", "x").unwrap();
    assert!(matches!(
        encode(&f32_payload, &f32_payload),
        Err(DeltaError::Incompatible(_))
    ));
}

#[test]
fn hostile_headers_are_typed_errors() {
    let (base, new) = pair(&[300], &[0.1], 6);
    let d = encode(&base, &new).unwrap();
    let mut v = d.clone();
    v[4] = 9;
    assert_eq!(apply(&base, &v), Err(DeltaError::UnsupportedVersion(9)));
    let mut m = d.clone();
    m[0] = b'X';
    assert_eq!(apply(&base, &m), Err(DeltaError::BadMagic));
    // A count larger than the tensor: refused before any per-position work.
    let mut c = d[..HEADER_LEN].to_vec();
    c.push(KIND_GAPS);
    put_varint(&mut c, 1 << 40);
    assert!(matches!(apply(&base, &c), Err(DeltaError::Malformed(_))));
    // Trailing bytes after the last record.
    let mut t = d.clone();
    t.push(0);
    assert!(matches!(apply(&base, &t), Err(DeltaError::Malformed(_))));
}

#[test]
fn keyframe_rule() {
    // No base: keyframe.
    assert!(is_keyframe(1, None, 16, 10, 100));
    // Inside the period and smaller: delta.
    assert!(!is_keyframe(2, Some(1), 16, 10, 100));
    assert!(!is_keyframe(16, Some(1), 16, 10, 100));
    // K versions after the last keyframe.
    assert!(is_keyframe(17, Some(1), 16, 10, 100));
    // Not smaller than the full payload, or saving less than a tenth of it.
    assert!(is_keyframe(3, Some(1), 16, 100, 100));
    assert!(is_keyframe(3, Some(1), 16, 91, 100));
    assert!(!is_keyframe(3, Some(1), 16, 90, 100));
    // K of 0 or 1: always keyframes.
    assert!(is_keyframe(3, Some(2), 1, 1, 100));
    assert!(is_keyframe(3, Some(2), 0, 1, 100));
}

#[test]
fn varint_lengths() {
    for (v, n) in [
        (0u64, 1usize),
        (127, 1),
        (128, 2),
        (16383, 2),
        (16384, 3),
        (u64::MAX, 10),
    ] {
        let mut b = Vec::new();
        put_varint(&mut b, v);
        assert_eq!(b.len(), n);
        assert_eq!(varint_len(v), n);
        let mut r = Reader { buf: &b, pos: 0 };
        assert_eq!(r.varint("v").unwrap(), v);
    }
}
