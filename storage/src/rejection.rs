//! Why the learner refused a pulled group (`docs/security.md`, "One verification pipeline"):
//! a closed enum, one variant per reason of every stage of the chain, so a penalty can be an
//! exhaustive `match` (the node's learner role: `roles/learner/penalty.rs`) and a stage added
//! later cannot compile without one.
//!
//! [`StructureFault`] holds the reasons of [`crate::record::check_group`] (the structure
//! stage); [`Rejection`] adds the version window and the reasons of the learner's other
//! stages (signature, assigned prompt, rewards, replay, response ends, masks, the spot
//! check). Both live here, in the lowest crate that needs them: `pull` (its verifier's
//! answer) and `learner` (its pipeline's stages) both depend on `storage`, not on each other.
//!
//! Each kind has a stable snake_case name ([`Rejection::as_str`], also its `Display` prefix):
//! the key of the per-reason counts, the `reason` label of `pull_groups_rejected_total` and
//! of the log lines. Names go out; nothing parses them back.
//!
//! Owns: the kinds, their names and their messages. Must not touch: what a kind costs the
//! worker (the learner side decides), the checks themselves.

/// Why a group fails the structure stage ([`crate::record::check_group`]): the schema, the
/// learner's model limits, or the producer it names.
#[derive(Debug, Clone, PartialEq, thiserror::Error, strum::EnumCount, strum::EnumIter)]
pub enum StructureFault {
    /// Not decodable, or fails [`crate::TrajectoryGroup::validate`] (lengths, finiteness,
    /// bounds), or an empty prompt or response.
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
}

impl Default for StructureFault {
    /// Only so that [`Rejection::kinds`] can list one of each kind.
    fn default() -> Self {
        StructureFault::Malformed(String::new())
    }
}

impl StructureFault {
    /// The kind's stable name.
    pub fn as_str(&self) -> &'static str {
        match self {
            StructureFault::Malformed(_) => "malformed",
            StructureFault::TokenOutOfVocab { .. } => "token_out_of_vocab",
            StructureFault::TooLong { .. } => "too_long",
            StructureFault::LogprobOutOfRange { .. } => "logprob_out_of_range",
            StructureFault::GroupSize { .. } => "group_size",
            StructureFault::ForgedProducer { .. } => "forged_producer",
        }
    }
}

/// Why a pulled group was refused, by the stage that refused it: the first refusal of the
/// learner's chain (or of the pull protocol's own admission, `pull::admit`). The `String` of
/// a variant is the detail for the log; [`Rejection::as_str`] names the kind.
#[derive(Debug, Clone, PartialEq, thiserror::Error, strum::EnumCount, strum::EnumIter)]
pub enum Rejection {
    /// The structure stage (`storage::record::check_group`).
    #[error(transparent)]
    Structure(#[from] StructureFault),
    /// `inadmissible`: older than the pull's `v_min` (aged out of the window in transit).
    #[error("version {version} below the requested v_min {v_min}")]
    Inadmissible { version: u64, v_min: u64 },
    /// `bad_signature`: not signed by the key of the peer it was pulled from.
    #[error("bad_signature: {0}")]
    BadSignature(String),
    /// `wrong_prompt`: not the prompt assigned to (producer, seq), or a seq used before for
    /// another group.
    #[error("wrong_prompt: {0}")]
    WrongPrompt(String),
    /// `stale_seq`: a seq below the ones the learner still remembers for its worker.
    #[error("stale_seq: {0}")]
    StaleSeq(String),
    /// `env_failed`: the environment failed while checking (not a verdict on the record).
    #[error("env_failed: {0}")]
    EnvFailed(String),
    /// `reward_mismatch`: a recomputed reward differs from the reported one, or a response
    /// text is not the decoding of its tokens.
    #[error("reward_mismatch: {0}")]
    RewardMismatch(String),
    /// `replay_mismatch`: a multi-turn episode that does not replay from its actions.
    #[error("replay_mismatch: {0}")]
    ReplayMismatch(String),
    /// `response_end`: a single-turn response that does not end where a sampler stops.
    #[error("response_end: {0}")]
    ResponseEnd(String),
    /// `mask_mismatch`: a loss mask other than the one the learner derives.
    #[error("mask_mismatch: {0}")]
    MaskMismatch(String),
    /// `logprob_mismatch`: a spot-checked log-prob beyond the tolerance (or not recomputable).
    #[error("logprob_mismatch: {0}")]
    LogprobMismatch(String),
    /// `logprob_forged`: a log-prob at least a hundred tolerances off: proof.
    #[error("logprob_forged: {0}")]
    LogprobForged(String),
    /// `unpublished_version`: a version the learner never published.
    #[error("unpublished_version: {0}")]
    UnpublishedVersion(String),
    /// `token_not_drawn`: a sampled token the canonical rule does not draw: proof.
    #[error("token_not_drawn: {0}")]
    TokenNotDrawn(String),
    /// `margin_unearned`: tokens inside the claimed dtype's margin but outside the margins
    /// the worker has earned.
    #[error("margin_unearned: {0}")]
    MarginUnearned(String),
    /// `unchecked`: a group that had to be checked and could not be, through no fault of the
    /// worker.
    #[error("unchecked: {0}")]
    Unchecked(String),
}

impl Rejection {
    /// The kind's stable name: the key of the per-reason counts, the metrics label, the
    /// `reason` field of the log lines.
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::Structure(f) => f.as_str(),
            Rejection::Inadmissible { .. } => "inadmissible",
            Rejection::BadSignature(_) => "bad_signature",
            Rejection::WrongPrompt(_) => "wrong_prompt",
            Rejection::StaleSeq(_) => "stale_seq",
            Rejection::EnvFailed(_) => "env_failed",
            Rejection::RewardMismatch(_) => "reward_mismatch",
            Rejection::ReplayMismatch(_) => "replay_mismatch",
            Rejection::ResponseEnd(_) => "response_end",
            Rejection::MaskMismatch(_) => "mask_mismatch",
            Rejection::LogprobMismatch(_) => "logprob_mismatch",
            Rejection::LogprobForged(_) => "logprob_forged",
            Rejection::UnpublishedVersion(_) => "unpublished_version",
            Rejection::TokenNotDrawn(_) => "token_not_drawn",
            Rejection::MarginUnearned(_) => "margin_unearned",
            Rejection::Unchecked(_) => "unchecked",
        }
    }

    /// One rejection of every kind (structure faults included, each once), with empty
    /// details: for the tests that every kind has a penalty and a distinct name.
    pub fn kinds() -> impl Iterator<Item = Rejection> {
        use strum::IntoEnumIterator;
        StructureFault::iter()
            .map(Rejection::Structure)
            .chain(Rejection::iter().filter(|r| !matches!(r, Rejection::Structure(_))))
    }

    /// How many kinds there are ([`Rejection::kinds`]' length), counted by the compiler.
    pub const KINDS: usize =
        <Rejection as strum::EnumCount>::COUNT - 1 + <StructureFault as strum::EnumCount>::COUNT;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_under_a_distinct_name() {
        let names: Vec<&str> = Rejection::kinds().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Rejection::KINDS);
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        for r in Rejection::kinds() {
            let name = r.as_str();
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}"
            );
        }
    }

    /// The log text is what it was when reasons were strings: `name: detail` for a stage's,
    /// the structure fault's own text for the structure stage's.
    #[test]
    fn messages_are_unchanged() {
        let r = Rejection::RewardMismatch("sample 0: reported reward 1, recomputed 0".into());
        assert_eq!(
            r.to_string(),
            "reward_mismatch: sample 0: reported reward 1, recomputed 0"
        );
        let r = Rejection::from(StructureFault::GroupSize {
            got: 3,
            expected: 4,
        });
        assert_eq!(r.to_string(), "3 samples, expected group size 4");
        assert_eq!(r.as_str(), "group_size");
        let r = Rejection::Structure(StructureFault::Malformed("empty prompt".into()));
        assert_eq!(r.to_string(), "malformed: empty prompt");
    }
}
