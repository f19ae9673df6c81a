//! Tests of trajectory records: encoding, signatures, the learner's group checks.

use super::*;
use proptest::prelude::*;

#[test]
fn round_trip() {
    let g = testing::group(7, 3, 4, 32);
    assert_eq!(TrajectoryGroup::decode(&g.encode()).unwrap(), g);
}

#[test]
fn signatures_round_trip_and_detect_tampering() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let public = key.verifying_key().to_bytes();
    let mut g = testing::group(7, 3, 4, 8);
    assert_eq!(g.verify_signature(&public), Err(SignatureError::Missing));
    let hash = g.content_hash();
    g.sign(&key);
    assert_eq!(
        g.content_hash(),
        hash,
        "the signature is not part of the content"
    );
    assert_eq!(g.verify_signature(&public), Ok(()));
    let back = TrajectoryGroup::decode(&g.encode()).unwrap();
    assert_eq!(back, g);
    assert_eq!(back.verify_signature(&public), Ok(()), "survives the wire");
    // Any change of content breaks it: reward, a log-prob, the sequence number, producer.
    let edits: [fn(&mut TrajectoryGroup); 5] = [
        |g| g.samples[1].reward = 1.0,
        |g| g.samples[0].sampler_logprobs[2] += 0.5,
        |g| g.seq += 1,
        |g| g.producer.push('x'),
        |g| g.prompt_tokens[0] += 1,
    ];
    for (i, edit) in edits.iter().enumerate() {
        let mut t = g.clone();
        edit(&mut t);
        assert_eq!(
            t.verify_signature(&public),
            Err(SignatureError::Invalid),
            "edit {i}"
        );
    }
    // Another key's signature does not verify under the producer's key.
    let mut other = g.clone();
    other.sign(&SigningKey::from_bytes(&[8; 32]));
    assert_eq!(
        other.verify_signature(&public),
        Err(SignatureError::Invalid)
    );
    // A flipped signature byte on the wire decodes but does not verify.
    let mut bytes = g.encode();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let flipped = TrajectoryGroup::decode(&bytes).unwrap();
    assert_eq!(
        flipped.verify_signature(&public),
        Err(SignatureError::Invalid)
    );
}

#[test]
fn format_1_is_refused_with_a_clear_error() {
    let mut bytes = testing::group(1, 1, 2, 4).encode();
    bytes[3] = 1;
    let e = TrajectoryGroup::decode(&bytes).unwrap_err().to_string();
    assert!(e.contains("format 1") && e.contains("upgrade"), "{e}");
    bytes[3] = 9;
    let e = TrajectoryGroup::decode(&bytes).unwrap_err().to_string();
    assert!(e.contains("unsupported format 9"), "{e}");
    let mut bytes = testing::group(1, 1, 2, 4).encode();
    *bytes.last_mut().unwrap() = 2; // signature presence byte
    assert!(TrajectoryGroup::decode(&bytes).is_err());
}

#[test]
fn inconsistent_groups_are_invalid() {
    let mut g = testing::group(1, 1, 2, 4);
    g.samples[1].sampler_logprobs.pop();
    assert!(g.validate().is_err());
    assert!(
        TrajectoryGroup::decode(&g.encode()).is_err(),
        "decode validates"
    );
    let mut g = testing::group(1, 1, 2, 4);
    g.samples[0].reward = f32::NAN;
    assert!(g.validate().is_err());
    let mut g = testing::group(1, 1, 2, 4);
    g.samples.clear();
    assert!(g.validate().is_err());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = testing::group(3, 9, 2, 5).encode();
    for cut in 0..bytes.len() {
        assert!(
            TrajectoryGroup::decode(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(TrajectoryGroup::decode(&longer).is_err(), "trailing byte");
}

fn limits() -> GroupLimits {
    GroupLimits {
        vocab_size: 300,
        max_context: 64,
        logprob_floor: DEFAULT_LOGPROB_FLOOR,
        group_size: 4,
    }
}

fn reason(g: &TrajectoryGroup) -> Option<&'static str> {
    check_group(g, &limits(), "12D3KooWtest")
        .err()
        .map(|e| e.as_str())
}

#[test]
fn a_valid_group_passes_every_check() {
    assert_eq!(reason(&testing::group(1, 1, 4, 8)), None);
    let lax = check_group(
        &testing::group(1, 1, 3, 8),
        &GroupLimits::PERMISSIVE,
        "12D3KooWtest",
    );
    assert_eq!(lax, Ok(()), "permissive limits accept any group size");
}

#[test]
fn each_limit_has_its_own_rejection() {
    let base = || testing::group(1, 1, 4, 8);
    let mut g = base();
    g.samples[2].sampler_logprobs[3] = -1e4;
    assert_eq!(reason(&g), Some("logprob_out_of_range"));
    let mut g = base();
    g.samples[0].sampler_logprobs[0] = DEFAULT_LOGPROB_FLOOR;
    assert_eq!(reason(&g), None, "the floor itself is allowed");
    let mut g = base();
    g.samples[1].sampler_logprobs[0] = f32::NAN;
    assert_eq!(
        reason(&g),
        Some("malformed"),
        "non-finite is a schema error"
    );
    let mut g = base();
    g.samples[1].response_tokens[0] = 300;
    assert_eq!(reason(&g), Some("token_out_of_vocab"));
    let mut g = base();
    g.prompt_tokens[0] = u32::MAX;
    assert_eq!(reason(&g), Some("token_out_of_vocab"));
    let mut g = testing::group(1, 1, 4, 57); // 8 prompt + 57 response = 65 > 64
    assert_eq!(reason(&g), Some("too_long"));
    g.samples.iter_mut().for_each(|s| {
        s.response_tokens.pop();
        s.sampler_logprobs.pop();
        s.loss_mask.pop();
    });
    assert_eq!(reason(&g), None, "exactly the context is allowed");
    assert_eq!(reason(&testing::group(1, 1, 5, 8)), Some("group_size"));
    let mut g = base();
    g.samples[0].loss_mask.pop();
    assert_eq!(reason(&g), Some("malformed"));
    let mut g = base();
    g.samples[0].reward = f32::INFINITY;
    assert_eq!(reason(&g), Some("malformed"));
    let mut g = base();
    g.prompt_tokens.clear();
    assert_eq!(reason(&g), Some("malformed"), "empty prompt");
    let mut g = base();
    g.samples[3].response_tokens.clear();
    g.samples[3].sampler_logprobs.clear();
    g.samples[3].loss_mask.clear();
    assert_eq!(reason(&g), Some("malformed"), "empty response");
    let g = base();
    let e = check_group(&g, &limits(), "12D3KooWother").unwrap_err();
    assert_eq!(e.as_str(), "forged_producer");
    assert!(e.to_string().contains("12D3KooWother"), "{e}");
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = TrajectoryGroup::decode(&bytes);
        let mut prefixed = b"ETG\x02".to_vec();
        prefixed.extend_from_slice(&bytes);
        let _ = TrajectoryGroup::decode(&prefixed);
    }

    #[test]
    fn single_byte_corruption_never_panics(idx in 0usize..4096, val: u8) {
        let mut bytes = testing::group(5, 2, 3, 6).encode();
        let i = idx % bytes.len();
        bytes[i] = val;
        let _ = TrajectoryGroup::decode(&bytes);
    }

    #[test]
    fn arbitrary_valid_groups_round_trip(
        version: u64,
        seed: u64,
        n in 1usize..6,
        tokens in 0usize..40,
    ) {
        let g = testing::group(version, seed, n, tokens);
        prop_assert_eq!(TrajectoryGroup::decode(&g.encode()).unwrap(), g);
    }
}

proptest! {
    /// A signed group survives no mutation of its bytes: what still decodes no longer
    /// verifies (the encoding is canonical: minimal varints, one signature slot).
    #[test]
    fn no_mutation_of_a_signed_group_decodes_and_verifies(idx in 0usize..4096, val in 1u8..=255) {
        let key = SigningKey::from_bytes(&[3; 32]);
        let public = key.verifying_key().to_bytes();
        let mut g = testing::group(5, 2, 3, 6);
        g.sign(&key);
        let mut bytes = g.encode();
        let i = idx % bytes.len();
        bytes[i] ^= val;
        if let Ok(d) = TrajectoryGroup::decode(&bytes) {
            prop_assert!(d.verify_signature(&public).is_err(), "byte {} ^ {}", i, val);
        }
    }
}
