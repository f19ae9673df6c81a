//! Trajectory records (`docs/storage.md`): τ = (x, y, r, v, Ω), stored and transferred as a *group* of n
//! samples for one prompt under one snapshot version.
//!
//! Encoding v2 (see `docs/storage.md`): magic `b"ETG"`, format byte `2`, then the group fields
//! in declaration order (the producer's sequence number `seq` after the version), then the
//! samples, then the producer's signature (a presence byte, then 64 bytes). Token ids are
//! varints (most are small), log-probs are `f32` LE, the loss mask is one byte per response
//! token.
//!
//! **Producer signature.** Everything before the signature is the group's *content*; its
//! BLAKE3 hash ([`TrajectoryGroup::content_hash`]) is signed by the producing node's ed25519
//! key (the key its libp2p peer id derives from), prefixed with [`GROUP_SIGNING_CONTEXT`] so
//! the signature cannot be replayed as any other signed object of the swarm. A receiver
//! checks it with [`TrajectoryGroup::verify_signature`] against the public key embedded in
//! the producer's peer id. Format 1 (unsigned, no sequence number) is refused with an error
//! that names the upgrade.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::rejection::StructureFault;

/// Magic prefix of an encoded [`TrajectoryGroup`].
pub const GROUP_MAGIC: &[u8; 3] = b"ETG";
/// Current encoding version of [`TrajectoryGroup`] (2: producer sequence number and
/// signature; 1 is no longer read).
pub const GROUP_FORMAT: u8 = 2;
/// Prefix of the message a producer signs: `GROUP_SIGNING_CONTEXT ‖ content_hash`.
pub const GROUP_SIGNING_CONTEXT: &[u8] = b"echo-swarm/trajectory-group/v2";

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
    /// The producer's group counter: the learner derives the prompt assigned to
    /// (producer, seq) and refuses a group whose prompt differs or whose `seq` was used
    /// before.
    pub seq: u64,
    /// Peer id (base58) of the producing node.
    pub producer: String,
    pub prompt_text: String,
    pub prompt_tokens: Vec<u32>,
    pub created_unix_ms: u64,
    pub samples: Vec<Sample>,
    /// The producer's ed25519 signature over [`GROUP_SIGNING_CONTEXT`] ‖
    /// [`TrajectoryGroup::content_hash`]; `None` for an unsigned group (refused by a learner
    /// that checks signatures).
    pub signature: Option<[u8; 64]>,
}

/// Why a group's producer signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the group is not signed")]
    Missing,
    #[error("the producer key is not a valid ed25519 public key")]
    BadKey,
    #[error("the signature does not verify under the producer's key (content altered or signed by another key)")]
    Invalid,
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

    /// The canonical encoding: the content ([`Self::content_hash`] covers it) followed by
    /// the signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = self.content_writer(65);
        match &self.signature {
            None => w.u8(0),
            Some(sig) => {
                w.u8(1);
                w.raw(sig);
            }
        }
        w.into_bytes()
    }

    /// BLAKE3 of the canonical encoding without the signature: what the producer signs.
    pub fn content_hash(&self) -> [u8; 32] {
        *blake3::hash(&self.content_writer(0).into_bytes()).as_bytes()
    }

    /// Signs the group's content with the producer's key (replacing any signature).
    pub fn sign(&mut self, key: &SigningKey) {
        let msg = signing_message(&self.content_hash());
        self.signature = Some(key.sign(&msg).to_bytes());
    }

    /// Checks the signature against the producer's ed25519 public key (32 bytes; the key its
    /// peer id embeds). Cost: one encoding pass, one hash, one ed25519 verification.
    pub fn verify_signature(&self, public: &[u8; 32]) -> std::result::Result<(), SignatureError> {
        let sig = self.signature.as_ref().ok_or(SignatureError::Missing)?;
        let key = VerifyingKey::from_bytes(public).map_err(|_| SignatureError::BadKey)?;
        key.verify_strict(
            &signing_message(&self.content_hash()),
            &Signature::from_bytes(sig),
        )
        .map_err(|_| SignatureError::Invalid)
    }

    fn content_writer(&self, extra: usize) -> Writer {
        let tokens: usize = self.samples.iter().map(|s| s.response_tokens.len()).sum();
        let mut w = Writer::with_capacity(128 + extra + tokens * 8 + self.prompt_text.len());
        w.raw(GROUP_MAGIC);
        w.u8(GROUP_FORMAT);
        w.raw(&self.group_id);
        w.str(&self.task_id);
        w.str(&self.prompt_id);
        w.varint(self.version);
        w.varint(self.seq);
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
        w
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
        if format == 1 {
            return Err(r.err(
                "format 1 (unsigned, written by an older echo-node) is no longer accepted: \
                 format 2 carries the producer's signature and sequence number; upgrade the \
                 worker (its stored groups of format 1 cannot be pulled)",
            ));
        }
        if format != GROUP_FORMAT {
            return Err(r.err(format!(
                "unsupported format {format} (this build reads {GROUP_FORMAT})"
            )));
        }
        let group_id = r.array::<16>()?;
        let task_id = r.string(limits::MAX_ID, "task_id")?;
        let prompt_id = r.string(limits::MAX_ID, "prompt_id")?;
        let version = r.varint()?;
        let seq = r.varint()?;
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
        let signature = match r.u8()? {
            0 => None,
            1 => Some(r.array::<64>()?),
            b => return Err(r.err(format!("signature presence byte {b} (expected 0 or 1)"))),
        };
        r.finish()?;
        let group = TrajectoryGroup {
            group_id,
            task_id,
            prompt_id,
            version,
            seq,
            producer,
            prompt_text,
            prompt_tokens,
            created_unix_ms,
            samples,
            signature,
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

/// The learner's full check of a group received from `peer` (its base58 id): the schema,
/// non-empty prompt and responses (what the training forward needs), then every limit of
/// `limits`, then that the group names `peer` as its producer (a worker
/// must not be able to pass its groups off as another's, or the penalty for bad data lands
/// on the wrong peer). Pure; cost linear in the group's tokens, no allocation on success.
pub fn check_group(
    g: &TrajectoryGroup,
    limits: &GroupLimits,
    peer: &str,
) -> std::result::Result<(), StructureFault> {
    g.validate()
        .map_err(|e| StructureFault::Malformed(e.to_string()))?;
    // A model cannot take an empty sequence; an honest worker's response holds at least its
    // stop token.
    if g.prompt_tokens.is_empty() {
        return Err(StructureFault::Malformed("empty prompt".into()));
    }
    if let Some(i) = g.samples.iter().position(|s| s.response_tokens.is_empty()) {
        return Err(StructureFault::Malformed(format!(
            "sample {i}: empty response"
        )));
    }
    if limits.group_size != 0 && g.samples.len() != limits.group_size {
        return Err(StructureFault::GroupSize {
            got: g.samples.len(),
            expected: limits.group_size,
        });
    }
    let vocab = limits.vocab_size;
    let out_of_vocab = |t: &&u32| **t as usize >= vocab;
    if let Some(&token) = g.prompt_tokens.iter().find(out_of_vocab) {
        return Err(StructureFault::TokenOutOfVocab {
            sample: 0,
            token,
            vocab,
        });
    }
    for (i, s) in g.samples.iter().enumerate() {
        if let Some(&token) = s.response_tokens.iter().find(out_of_vocab) {
            return Err(StructureFault::TokenOutOfVocab {
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
            return Err(StructureFault::TooLong {
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
            return Err(StructureFault::LogprobOutOfRange {
                sample: i,
                logprob,
                floor: limits.logprob_floor,
            });
        }
    }
    if g.producer != peer {
        return Err(StructureFault::ForgedProducer {
            claimed: g.producer.clone(),
            peer: peer.to_string(),
        });
    }
    Ok(())
}

/// The bytes a producer signs for a group with content hash `hash`.
fn signing_message(hash: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(GROUP_SIGNING_CONTEXT.len() + 32);
    m.extend_from_slice(GROUP_SIGNING_CONTEXT);
    m.extend_from_slice(hash);
    m
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
            seq: seed,
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
            signature: None,
        }
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
