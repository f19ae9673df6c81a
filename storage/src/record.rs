//! Trajectory records (`docs/storage.md`): τ = (x, y, r, v, Ω), stored and transferred as a *group* of n
//! samples for one prompt under one snapshot version.
//!
//! Encoding v1 (see `docs/storage.md`): magic `b"ETG"`, format byte `1`, then the group fields in
//! declaration order, then the samples. Token ids are varints (most are small), log-probs are
//! `f32` LE, the loss mask is one byte per response token.

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};

/// Magic prefix of an encoded [`TrajectoryGroup`].
pub const GROUP_MAGIC: &[u8; 3] = b"ETG";
/// Current encoding version of [`TrajectoryGroup`].
pub const GROUP_FORMAT: u8 = 1;

/// Decoding limits. They bound what one peer can make another allocate.
pub mod limits {
    /// Samples per group (n).
    pub const MAX_SAMPLES: usize = 1024;
    /// Tokens in one prompt or one response.
    pub const MAX_TOKENS: usize = 1 << 18;
    /// Bytes of prompt or response text.
    pub const MAX_TEXT: usize = 4 << 20;
    /// Bytes of an id-like string (task id, prompt id, producer).
    pub const MAX_ID: usize = 256;
    /// Bytes of one encoded group.
    pub const MAX_GROUP_BYTES: usize = 64 << 20;
}

/// One sampled response y for the group's prompt, with its reward and sampler metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Unique id of this trajectory; the learner deduplicates on it.
    pub trajectory_id: [u8; 16],
    pub response_tokens: Vec<u32>,
    pub response_text: String,
    pub reward: f32,
    /// log π_sampler(y_t | x, y_<t) of each response token, as computed while sampling.
    pub sampler_logprobs: Vec<f32>,
    /// 1 where the token counts in the loss, 0 where it does not (e.g. after a stop token).
    pub loss_mask: Vec<u8>,
    pub finished_unix_ms: u64,
}

/// A group of n samples for one prompt under one snapshot version: the unit of storage and
/// transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryGroup {
    pub group_id: [u8; 16],
    pub task_id: String,
    /// Stable id of the prompt inside its task.
    pub prompt_id: String,
    /// The snapshot version that generated every sample of the group.
    pub version: u64,
    /// Peer id (base58) of the producing node.
    pub producer: String,
    pub prompt_text: String,
    pub prompt_tokens: Vec<u32>,
    pub created_unix_ms: u64,
    pub samples: Vec<Sample>,
}

impl TrajectoryGroup {
    /// Schema checks beyond what decoding enforces: consistent lengths, finite numbers, limits.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(StorageError::invalid("trajectory group", reason));
        if self.samples.is_empty() {
            return bad("a group needs at least one sample".into());
        }
        if self.samples.len() > limits::MAX_SAMPLES {
            return bad(format!(
                "{} samples > {}",
                self.samples.len(),
                limits::MAX_SAMPLES
            ));
        }
        for (name, s) in [
            ("task_id", &self.task_id),
            ("prompt_id", &self.prompt_id),
            ("producer", &self.producer),
        ] {
            if s.len() > limits::MAX_ID {
                return bad(format!("{name} longer than {} bytes", limits::MAX_ID));
            }
        }
        if self.prompt_tokens.len() > limits::MAX_TOKENS
            || self.prompt_text.len() > limits::MAX_TEXT
        {
            return bad("prompt exceeds limits".into());
        }
        for (i, s) in self.samples.iter().enumerate() {
            let n = s.response_tokens.len();
            if n > limits::MAX_TOKENS || s.response_text.len() > limits::MAX_TEXT {
                return bad(format!("sample {i}: response exceeds limits"));
            }
            if s.sampler_logprobs.len() != n || s.loss_mask.len() != n {
                return bad(format!(
                    "sample {i}: {n} tokens but {} log-probs and {} mask entries",
                    s.sampler_logprobs.len(),
                    s.loss_mask.len()
                ));
            }
            if !s.reward.is_finite() {
                return bad(format!("sample {i}: reward is not finite"));
            }
            if let Some(lp) = s
                .sampler_logprobs
                .iter()
                .find(|lp| !(lp.is_finite() && **lp <= 1e-4))
            {
                return bad(format!(
                    "sample {i}: log-prob {lp} is not a finite value ≤ 0"
                ));
            }
            if s.loss_mask.iter().any(|m| *m > 1) {
                return bad(format!("sample {i}: loss mask entries must be 0 or 1"));
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let tokens: usize = self.samples.iter().map(|s| s.response_tokens.len()).sum();
        let mut w = Writer::with_capacity(128 + tokens * 8 + self.prompt_text.len());
        w.raw(GROUP_MAGIC);
        w.u8(GROUP_FORMAT);
        w.raw(&self.group_id);
        w.str(&self.task_id);
        w.str(&self.prompt_id);
        w.varint(self.version);
        w.str(&self.producer);
        w.str(&self.prompt_text);
        put_tokens(&mut w, &self.prompt_tokens);
        w.varint(self.created_unix_ms);
        w.varint(self.samples.len() as u64);
        for s in &self.samples {
            w.raw(&s.trajectory_id);
            put_tokens(&mut w, &s.response_tokens);
            w.str(&s.response_text);
            w.f32(s.reward);
            // Lengths of log-probs and mask equal the token count (validated before encoding).
            w.varint(s.sampler_logprobs.len() as u64);
            for lp in &s.sampler_logprobs {
                w.f32(*lp);
            }
            w.bytes(&s.loss_mask);
            w.varint(s.finished_unix_ms);
        }
        w.into_bytes()
    }

    /// Decodes and validates; any malformed input is a typed error.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > limits::MAX_GROUP_BYTES {
            return Err(StorageError::decode(
                "trajectory group",
                format!("{} bytes > limit {}", bytes.len(), limits::MAX_GROUP_BYTES),
            ));
        }
        let mut r = Reader::new(bytes, "trajectory group");
        if r.raw(3)? != GROUP_MAGIC {
            return Err(r.err("bad magic"));
        }
        let format = r.u8()?;
        if format != GROUP_FORMAT {
            return Err(r.err(format!(
                "unsupported format {format} (this build reads {GROUP_FORMAT})"
            )));
        }
        let group_id = r.array::<16>()?;
        let task_id = r.string(limits::MAX_ID, "task_id")?;
        let prompt_id = r.string(limits::MAX_ID, "prompt_id")?;
        let version = r.varint()?;
        let producer = r.string(limits::MAX_ID, "producer")?;
        let prompt_text = r.string(limits::MAX_TEXT, "prompt_text")?;
        let prompt_tokens = get_tokens(&mut r, "prompt_tokens")?;
        let created_unix_ms = r.varint()?;
        let n = r.len(limits::MAX_SAMPLES, 16 + 8, "samples")?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let trajectory_id = r.array::<16>()?;
            let response_tokens = get_tokens(&mut r, "response_tokens")?;
            let response_text = r.string(limits::MAX_TEXT, "response_text")?;
            let reward = r.f32()?;
            let nlp = r.len(limits::MAX_TOKENS, 4, "sampler_logprobs")?;
            let mut sampler_logprobs = Vec::with_capacity(nlp);
            for _ in 0..nlp {
                sampler_logprobs.push(r.f32()?);
            }
            let loss_mask = r.bytes(limits::MAX_TOKENS, "loss_mask")?.to_vec();
            let finished_unix_ms = r.varint()?;
            samples.push(Sample {
                trajectory_id,
                response_tokens,
                response_text,
                reward,
                sampler_logprobs,
                loss_mask,
                finished_unix_ms,
            });
        }
        r.finish()?;
        let group = TrajectoryGroup {
            group_id,
            task_id,
            prompt_id,
            version,
            producer,
            prompt_text,
            prompt_tokens,
            created_unix_ms,
            samples,
        };
        group.validate()?;
        Ok(group)
    }

    /// Mean reward over the group's samples.
    pub fn mean_reward(&self) -> f32 {
        if self.samples.is_empty() {
            return 0.0;
        }
        self.samples.iter().map(|s| s.reward).sum::<f32>() / self.samples.len() as f32
    }
}

/// Default lowest sampler log-prob a pulled group may carry (see [`GroupLimits`]).
pub const DEFAULT_LOGPROB_FLOOR: f32 = -50.0;

/// What the learner accepts from a worker, beyond the schema ([`TrajectoryGroup::validate`]):
/// the limits of its own model and configuration. The caller (the learner's pull path)
/// passes them in; [`check_group`] applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupLimits {
    /// Token ids must be `< vocab_size` (an id past the embedding table fails the forward).
    pub vocab_size: usize,
    /// `prompt + response ≤ max_context` tokens (the model's position limit).
    pub max_context: usize,
    /// Every sampler log-prob must lie in `[logprob_floor, 1e-4]`: the importance ratio
    /// `exp(ℓ − q)` of a token with `q` far below any real sampling probability overflows.
    pub logprob_floor: f32,
    /// Samples per group (n) the learner expects.
    pub group_size: usize,
}

impl GroupLimits {
    /// Limits that accept any schema-valid group (tests, tools): only the decoding limits
    /// apply, and any group size.
    pub const PERMISSIVE: GroupLimits = GroupLimits {
        vocab_size: u32::MAX as usize + 1,
        max_context: usize::MAX,
        logprob_floor: f32::MIN,
        group_size: 0,
    };
}

/// Why a pulled group was refused. [`GroupRejection::reason`] names the kind (the key of the
/// per-reason counts); the `Display` text carries the detail for the log.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GroupRejection {
    /// Not decodable, or fails [`TrajectoryGroup::validate`] (lengths, finiteness, bounds).
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("sample {sample}: token id {token} ≥ vocabulary size {vocab}")]
    TokenOutOfVocab {
        sample: usize,
        token: u32,
        vocab: usize,
    },
    #[error("sample {sample}: {len} prompt + response tokens > context {max}")]
    TooLong {
        sample: usize,
        len: usize,
        max: usize,
    },
    #[error("sample {sample}: sampler log-prob {logprob} outside [{floor}, 1e-4]")]
    LogprobOutOfRange {
        sample: usize,
        logprob: f32,
        floor: f32,
    },
    #[error("{got} samples, expected group size {expected}")]
    GroupSize { got: usize, expected: usize },
    #[error("producer {claimed:?} is not the peer it came from ({peer})")]
    ForgedProducer { claimed: String, peer: String },
    #[error("version {version} below the requested v_min {v_min}")]
    Inadmissible { version: u64, v_min: u64 },
    /// Failed one of the learner's verification layers (signature, assigned prompt, reward
    /// recomputation, log-prob spot check); `reason` is the layer's stable name.
    #[error("{reason}: {detail}")]
    Unverified {
        reason: &'static str,
        detail: String,
    },
}

impl GroupRejection {
    /// Short stable name of the kind, for counters and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            GroupRejection::Malformed(_) => "malformed",
            GroupRejection::TokenOutOfVocab { .. } => "token_out_of_vocab",
            GroupRejection::TooLong { .. } => "too_long",
            GroupRejection::LogprobOutOfRange { .. } => "logprob_out_of_range",
            GroupRejection::GroupSize { .. } => "group_size",
            GroupRejection::ForgedProducer { .. } => "forged_producer",
            GroupRejection::Inadmissible { .. } => "inadmissible",
            GroupRejection::Unverified { reason, .. } => reason,
        }
    }
}

/// The learner's full check of a group received from `peer` (its base58 id): the schema,
/// then every limit of `limits`, then that the group names `peer` as its producer (a worker
/// must not be able to pass its groups off as another's, or the penalty for bad data lands
/// on the wrong peer). Pure; cost linear in the group's tokens, no allocation on success.
pub fn check_group(
    g: &TrajectoryGroup,
    limits: &GroupLimits,
    peer: &str,
) -> std::result::Result<(), GroupRejection> {
    g.validate()
        .map_err(|e| GroupRejection::Malformed(e.to_string()))?;
    if limits.group_size != 0 && g.samples.len() != limits.group_size {
        return Err(GroupRejection::GroupSize {
            got: g.samples.len(),
            expected: limits.group_size,
        });
    }
    let vocab = limits.vocab_size;
    let out_of_vocab = |t: &&u32| **t as usize >= vocab;
    if let Some(&token) = g.prompt_tokens.iter().find(out_of_vocab) {
        return Err(GroupRejection::TokenOutOfVocab {
            sample: 0,
            token,
            vocab,
        });
    }
    for (i, s) in g.samples.iter().enumerate() {
        if let Some(&token) = s.response_tokens.iter().find(out_of_vocab) {
            return Err(GroupRejection::TokenOutOfVocab {
                sample: i,
                token,
                vocab,
            });
        }
        let len = g
            .prompt_tokens
            .len()
            .saturating_add(s.response_tokens.len());
        if len > limits.max_context {
            return Err(GroupRejection::TooLong {
                sample: i,
                len,
                max: limits.max_context,
            });
        }
        // validate() has established finite and ≤ 1e-4; the floor is the remaining bound.
        if let Some(&logprob) = s
            .sampler_logprobs
            .iter()
            .find(|lp| **lp < limits.logprob_floor)
        {
            return Err(GroupRejection::LogprobOutOfRange {
                sample: i,
                logprob,
                floor: limits.logprob_floor,
            });
        }
    }
    if g.producer != peer {
        return Err(GroupRejection::ForgedProducer {
            claimed: g.producer.clone(),
            peer: peer.to_string(),
        });
    }
    Ok(())
}

fn put_tokens(w: &mut Writer, tokens: &[u32]) {
    w.varint(tokens.len() as u64);
    for t in tokens {
        w.varint(u64::from(*t));
    }
}

fn get_tokens(r: &mut Reader<'_>, field: &str) -> Result<Vec<u32>> {
    let n = r.len(limits::MAX_TOKENS, 1, field)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.u32()?);
    }
    Ok(out)
}

/// Test and benchmark helpers: deterministic, valid groups.
pub mod testing {
    use super::*;

    /// A valid group of `n` samples with `tokens` response tokens each.
    pub fn group(version: u64, seed: u64, n: usize, tokens: usize) -> TrajectoryGroup {
        let id = |k: u64| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&seed.to_le_bytes());
            b[8..].copy_from_slice(&k.to_le_bytes());
            b
        };
        TrajectoryGroup {
            group_id: id(u64::MAX),
            task_id: "arith".into(),
            prompt_id: format!("p{seed}"),
            version,
            producer: "12D3KooWtest".into(),
            prompt_text: format!("{seed}+1="),
            prompt_tokens: (0..8).map(|t| t as u32 + 40).collect(),
            created_unix_ms: 1_700_000_000_000 + seed,
            samples: (0..n as u64)
                .map(|k| Sample {
                    trajectory_id: id(k),
                    response_tokens: (0..tokens)
                        .map(|t| (t as u32 * 7 + k as u32) % 300)
                        .collect(),
                    response_text: format!("{}", seed + 1),
                    reward: (k % 3) as f32 / 2.0,
                    sampler_logprobs: (0..tokens).map(|t| -0.01 * (t as f32 + 1.0)).collect(),
                    loss_mask: vec![1; tokens],
                    finished_unix_ms: 1_700_000_000_100 + seed,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let g = testing::group(7, 3, 4, 32);
        assert_eq!(TrajectoryGroup::decode(&g.encode()).unwrap(), g);
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
            .map(|e| e.reason())
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
        let g = base();
        let e = check_group(&g, &limits(), "12D3KooWother").unwrap_err();
        assert_eq!(e.reason(), "forged_producer");
        assert!(e.to_string().contains("12D3KooWother"), "{e}");
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = TrajectoryGroup::decode(&bytes);
            let mut prefixed = b"ETG\x01".to_vec();
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
}
