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

/// Like [`pair`], but a change moves the value by one ulp up or down (what a small optimiser
/// step does to a bf16 weight).
fn pair_ulp(sizes: &[usize], p: f64, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut base, mut new) = (Vec::new(), Vec::new());
    for (k, &n) in sizes.iter().enumerate() {
        // Weights of magnitude around 0.02 (exponent 121), either sign.
        let b: Vec<u16> = (0..n)
            .map(|_| (u16::from(rng.gen::<bool>()) << 15) | (121 << 7) | rng.gen_range(0..128))
            .collect();
        let c = b
            .iter()
            .map(|&x| match rng.gen_bool(p) {
                false => x,
                true if rng.gen::<bool>() => x + 1,
                true => x - 1,
            })
            .collect();
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
        prop_assert_eq!(u16::from_le_bytes([d[4], d[5]]), DELTA_VERSION);
        prop_assert_eq!(apply(&base, &d).unwrap(), new.clone());
        let mut in_place = base.clone();
        apply_in_place(&mut in_place, &d).unwrap();
        prop_assert_eq!(&in_place, &new);
        // zstd adds a frame header and block headers to incompressible bodies, no more.
        let dense: usize = sizes.iter().map(|n| 2 * n + 40).sum();
        prop_assert!(d.len() <= HEADER_LEN + dense);
        prop_assert_eq!(base_hash(&d).unwrap(), blake3::hash(&base).to_hex().to_string());
        // The older formats still read, and say the same.
        let d2 = encode_v2(&base, &new).unwrap();
        prop_assert_eq!(u16::from_le_bytes([d2[4], d2[5]]), DELTA_VERSION_V2);
        prop_assert_eq!(apply(&base, &d2).unwrap(), new.clone());
        let mut in_place = base.clone();
        apply_in_place(&mut in_place, &d2).unwrap();
        prop_assert_eq!(&in_place, &new);
        prop_assert_eq!(result_hash(&d2).unwrap(), result_hash(&d).unwrap());
        let d1 = encode_v1(&base, &new).unwrap();
        prop_assert_eq!(u16::from_le_bytes([d1[4], d1[5]]), DELTA_VERSION_V1);
        prop_assert_eq!(apply(&base, &d1).unwrap(), new);
        prop_assert_eq!(result_hash(&d1).unwrap(), result_hash(&d).unwrap());
    }

    /// One-ulp updates at any density round-trip, and versions 2 and 3 are smaller than 1.
    #[test]
    fn ulp_updates_roundtrip_and_compress(
        sizes in prop::collection::vec(64usize..5000, 1..5),
        p in prop::sample::select(vec![0.0005, 0.01, 0.05, 0.3, 0.9]),
        seed in any::<u64>(),
    ) {
        let (base, new) = pair_ulp(&sizes, p, seed);
        let d = encode(&base, &new).unwrap();
        prop_assert_eq!(apply(&base, &d).unwrap(), new.clone());
        let d1 = encode_v1(&base, &new).unwrap();
        let d2 = encode_v2(&base, &new).unwrap();
        prop_assert_eq!(apply(&base, &d2).unwrap(), new.clone());
        let changed = sizes.iter().sum::<usize>() as f64 * p;
        if changed > 200.0 {
            prop_assert!(d.len() < d1.len(), "v3 {} >= v1 {}", d.len(), d1.len());
            prop_assert!(d2.len() < d1.len(), "v2 {} >= v1 {}", d2.len(), d1.len());
        }
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
        for d in [
            encode(&base, &new).unwrap(),
            encode_v2(&base, &new).unwrap(),
            encode_v1(&base, &new).unwrap(),
        ] {
            let mut bad = d.clone();
            let i = at.index(bad.len());
            bad[i] ^= flip;
            prop_assert!(apply(&base, &bad).is_err());
            // Refused in place: the payload is left exactly as it was.
            let mut held = base.clone();
            prop_assert!(apply_in_place(&mut held, &bad).is_err());
            prop_assert!(held == base);
            let short = &d[..cut.index(d.len())];
            prop_assert!(apply(&base, short).is_err());
        }
    }

    /// Arbitrary bytes after a valid header never panic and never change the payload unless
    /// they reconstruct exactly the payload the header names.
    #[test]
    fn arbitrary_records_never_panic(
        sizes in prop::collection::vec(1usize..600, 1..4),
        tail in prop::collection::vec(any::<u8>(), 0..400),
        seed in any::<u64>(),
        v2_header in any::<bool>(),
    ) {
        let (base, new) = pair_ulp(&sizes, 0.05, seed);
        let d = if v2_header { encode_v2(&base, &new) } else { encode(&base, &new) }.unwrap();
        let mut bad = d[..HEADER_LEN].to_vec();
        bad.extend_from_slice(&tail);
        let mut held = base.clone();
        let copied = apply(&base, &bad);
        match apply_in_place(&mut held, &bad) {
            Ok(()) => prop_assert!(held == new),
            Err(_) => prop_assert!(held == base),
        }
        // The copying path decides alike.
        match copied {
            Ok(out) => prop_assert!(out == new && held == new),
            Err(_) => prop_assert!(held == base),
        }
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
    // One segment: its count, two unchanged heads, no body.
    assert_eq!(d.len(), HEADER_LEN + 4);
    assert_eq!(apply(&base, &d).unwrap(), base);
    assert_eq!(encode_v2(&base, &base).unwrap().len(), HEADER_LEN + 2);
    assert_eq!(encode_v1(&base, &base).unwrap().len(), HEADER_LEN + 2);
}

/// The encoder picks the smallest index encoding: gaps when sparse, a bitmap when dense,
/// raw values when (nearly) everything changed.
#[test]
fn index_encoding_follows_density() {
    let kind = |p: f64| {
        let (b, n) = pair(&[20_000], &[p], 4);
        let d3 = encode(&b, &n).unwrap();
        let d2 = encode_v2(&b, &n).unwrap();
        // Format 3: after the segment's tensor count (1); format 2: first.
        assert_eq!(d3[HEADER_LEN], 1);
        assert_eq!(d3[HEADER_LEN + 1], d2[HEADER_LEN]);
        d2[HEADER_LEN]
    };
    assert_eq!(kind(0.01), KIND_GAPS);
    assert_eq!(kind(0.3), KIND_BITMAP);
    assert_eq!(kind(1.0), KIND_DENSE);
}

/// A sparse record is refused from its header alone when its declared body size cannot be
/// the one its count implies; a body that decompresses past its declared size is refused
/// (nothing is decompressed beyond it); a body that decompresses short is refused.
#[test]
fn record_sizes_are_bounded_before_decompression() {
    let (base, new) = pair_ulp(&[4000], 0.01, 9);
    let d = encode_v2(&base, &new).unwrap();
    assert_eq!(d[HEADER_LEN], KIND_GAPS);
    let record = |kind: u8, count: u64, raw_len: u64, body: &[u8]| {
        let mut v = d[..HEADER_LEN].to_vec();
        v.push(kind);
        if kind != KIND_DENSE {
            put_varint(&mut v, count);
        }
        put_varint(&mut v, raw_len);
        put_varint(&mut v, body.len() as u64);
        v.extend_from_slice(body);
        v
    };
    let malformed = |v: &[u8]| {
        let mut held = base.clone();
        let r = apply_in_place(&mut held, v);
        assert!(held == base);
        matches!(r, Err(DeltaError::Malformed(_)))
    };
    // Gaps larger than the bitmap of the same count, or smaller than three bytes a change.
    assert!(malformed(&record(KIND_GAPS, 40, 500 + 80 + 1, &[])));
    assert!(malformed(&record(KIND_GAPS, 40, 119, &[])));
    // A bitmap body of another size, a dense body of another size, a huge declared size.
    assert!(malformed(&record(KIND_BITMAP, 40, 500 + 80 + 1, &[])));
    assert!(malformed(&record(KIND_DENSE, 0, 7999, &[])));
    assert!(malformed(&record(KIND_DENSE, 0, u64::MAX, &[])));
    // A zstd frame of 1 MiB of zeros declared as a 8000-byte dense body: refused, the
    // decompressor stops at the declared size.
    let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
    assert!(malformed(&record(KIND_DENSE, 0, 8000, &bomb)));
    // A frame of 7998 bytes declared as 8000.
    let short = zstd::bulk::compress(&vec![0u8; 7998], 3).unwrap();
    assert!(malformed(&record(KIND_DENSE, 0, 8000, &short)));
    // Not zstd at all.
    assert!(malformed(&record(KIND_DENSE, 0, 8000, b"not a zstd frame")));
    // A dense body of all zeros is a valid no-op record (the result hash then decides).
    let zeros = zstd::bulk::compress(&vec![0u8; 8000], 3).unwrap();
    let mut held = base.clone();
    assert!(matches!(
        apply_in_place(&mut held, &record(KIND_DENSE, 0, 8000, &zeros)),
        Err(DeltaError::NotReconstructed { .. })
    ));
    assert!(held == base);
}

/// A sparse body that lists a position whose value does not change, or a gap past the tensor,
/// is refused; so is a bitmap whose population is not its count.
#[test]
fn sparse_bodies_are_checked() {
    let (base, _) = pair_ulp(&[100], 0.0, 10);
    let header = encode_v2(&base, &base).unwrap()[..HEADER_LEN].to_vec();
    let sparse = |kind: u8, count: u64, raw: &[u8]| {
        let mut v = header.clone();
        v.push(kind);
        put_varint(&mut v, count);
        put_varint(&mut v, raw.len() as u64);
        let z = zstd::bulk::compress(raw, 3).unwrap();
        put_varint(&mut v, z.len() as u64);
        v.extend_from_slice(&z);
        v
    };
    let refused = |v: &[u8], what: &str| refused_in_place(&base, v, what);
    // Positions 5 and 5 + 1 + 120: past a tensor of 100.
    refused(&sparse(KIND_GAPS, 2, &[5, 120, 1, 1, 0, 0]), "out of range");
    // A zero difference.
    refused(&sparse(KIND_GAPS, 1, &[5, 0, 0]), "does not change");
    // Bitmap of 13 bytes with two bits for a count of one (3 + 13 = 15 ≤ 13 + 2: bitmap).
    let mut bm = vec![0u8; 13];
    bm[0] = 0b11;
    bm.extend_from_slice(&[2, 0]);
    refused(&sparse(KIND_BITMAP, 1, &bm), "positions");
}

/// Format 3 packs consecutive small tensors into one body, and gives a large one its own:
/// for many small tensors it is smaller than format 2, which pays zstd's tables per tensor.
#[test]
fn small_tensors_share_a_body() {
    let sizes = [2000usize; 30];
    let (base, new) = pair_ulp(&sizes, 0.03, 12);
    let d3 = encode(&base, &new).unwrap();
    let d2 = encode_v2(&base, &new).unwrap();
    assert_eq!(d3[HEADER_LEN], 30, "one segment of every tensor");
    assert!(d3.len() < d2.len(), "v3 {} >= v2 {}", d3.len(), d2.len());
    assert_eq!(apply(&base, &d3).unwrap(), new);
    // A dense tensor's body (2·numel > 64 KiB) stands alone; the small ones after it share.
    let (base, new) = pair(&[40_000, 100, 100], &[1.0, 0.1, 0.1], 13);
    let d3 = encode(&base, &new).unwrap();
    assert_eq!(d3[HEADER_LEN], 1);
    assert_eq!(d3[HEADER_LEN + 1], KIND_DENSE);
    assert_eq!(apply(&base, &d3).unwrap(), new);
}

/// Format 3's segment heads are checked before anything is decompressed: a tensor count of
/// zero or past the tensors left, packed bodies over the bound, a body without a frame and a
/// frame without a body are refused, and the payload is left as it was.
#[test]
fn segment_heads_are_checked() {
    let (base, new) = pair_ulp(&[100, 100], 0.1, 14);
    let d = encode(&base, &new).unwrap();
    let segment = |n: u64, heads: &[u8], comp: &[u8]| {
        let mut v = d[..HEADER_LEN].to_vec();
        put_varint(&mut v, n);
        v.extend_from_slice(heads);
        put_varint(&mut v, comp.len() as u64);
        v.extend_from_slice(comp);
        v
    };
    let refused = |v: &[u8], what: &str| {
        refused_in_place(&base, v, what);
        assert!(matches!(apply(&base, v), Err(DeltaError::Malformed(_))));
    };
    refused(&segment(0, &[], &[]), "segment of 0 tensors");
    refused(&segment(3, &[0, 0, 0], &[]), "segment of 3 tensors");
    // Two dense heads of 200 bytes each, no frame.
    let dense = [KIND_DENSE, 200, 1, KIND_DENSE, 200, 1];
    refused(&segment(2, &dense, &[]), "0 compressed bytes for 400");
    // Two unchanged heads and a frame.
    let z = zstd::bulk::compress(&[1u8; 10], 3).unwrap();
    refused(&segment(2, &[0, 0], &z), "compressed bytes for 0");
    // Two dense heads of 80,000 bytes in one segment: past the 64 KiB bound on packed
    // bodies, refused from the heads before anything is decompressed.
    let (big_b, big_n) = pair(&[40_000, 40_000], &[1.0, 1.0], 15);
    let big = encode(&big_b, &big_n).unwrap();
    let mut v = big[..HEADER_LEN].to_vec();
    put_varint(&mut v, 2);
    for _ in 0..2 {
        v.push(KIND_DENSE);
        put_varint(&mut v, 80_000);
    }
    put_varint(&mut v, 1);
    v.push(0);
    refused_in_place(&big_b, &v, "at most 65536");
}

/// `delta` applied in place to `base` is refused as malformed, naming `what`, and leaves the
/// payload exactly as it was.
fn refused_in_place(base: &[u8], delta: &[u8], what: &str) {
    let mut held = base.to_vec();
    match apply_in_place(&mut held, delta) {
        Err(DeltaError::Malformed(m)) => assert!(m.contains(what), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(held == base);
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
    v[4] = 0;
    assert_eq!(apply(&base, &v), Err(DeltaError::UnsupportedVersion(0)));
    let mut m = d.clone();
    m[0] = b'X';
    assert_eq!(apply(&base, &m), Err(DeltaError::BadMagic));
    // A count larger than the tensor: refused before any per-position work.
    let mut c = d[..HEADER_LEN].to_vec();
    c.push(1);
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
