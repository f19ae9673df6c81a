//! Test-only misbehaviour switches: how the adversarial testnet scenario and the multi-process
//! tests turn a real `echo-node run` process into a malicious worker.
//!
//! Hidden on purpose: there is no config key or CLI flag. A process misbehaves only when it
//! was built with the `adversary` cargo feature (off by default; `testnet` and the attack
//! tests turn it on) **and** the environment variable [`ENV_VAR`] names one or more attacks
//! (comma-separated); it says so at start with a warning. A default build has no attack code:
//! given the variable, it checks the names, logs that it ignores them, and runs honestly
//! ([`Misbehaviour::from_setting`]). An operator never sets it; the `testnet adversary`
//! scenario and `node/tests` do.
//!
//! Owns: the attack names and their parsing. Must not touch: how each attack is carried out
//! (the role that produces or serves the data checks [`Misbehaviour::has`] at its one hook).

use std::collections::BTreeSet;
use std::str::FromStr;

/// The environment variable naming the attacks this process carries out.
pub const ENV_VAR: &str = "ECHO_NODE_MISBEHAVE";

/// One attack a malicious worker can carry out (names as in the scenario's JSON).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Attack {
    /// Report reward 1 for every sample.
    InflatedReward,
    /// Report log-probs other than the ones the sampled tokens had (within the allowed range).
    ForgedLogprobs,
    /// Report a sampled-token log-prob of −1e4 (below the learner's floor).
    InvalidLogprob,
    /// Put token ids outside the vocabulary in responses.
    OutOfVocab,
    /// Make prompt + response longer than the model's context.
    Overlong,
    /// Answer a pull with more groups (or bigger frames) than asked.
    OversizedAnswer,
    /// Claim `pending = u64::MAX` in heartbeats.
    PendingInflation,
    /// Publish heartbeats far faster than the interval.
    HeartbeatSpam,
    /// Forward chunks whose bytes do not match the manifest.
    CorruptChunks,
    /// Re-publish old learner-signed manifests and orders (to restarted workers).
    ReplayAfterRestart,
    /// Sign groups with another key (or not at all).
    BadSignature,
    /// Install every snapshot, pass none on: no push to its chain child, fetches declined.
    SilentForwarder,
    /// Forward honestly for the first [`SILENT_AFTER_INSTALLS`] installs, then as
    /// `silent_forwarder`.
    SilentAfterHonest,
    /// Push and serve snapshot chunks at a tenth of the planned per-worker bandwidth B̂w.
    SlowForwarder,
    /// Forge log-probs from its [`SYBIL_HONEST_GROUPS`]-th group on; once banned, come back
    /// under a fresh key (wipe key, counter and store, exit [`REKEY_EXIT_CODE`]; the harness
    /// restarts it).
    SybilRekey,
    /// Honest for its first [`LATE_LIAR_HONEST_GROUPS`] groups (past probation), then forge
    /// log-probs on every group.
    LateLiar,
    /// Hoard: keep up to [`BACKLOG_PENDING`] groups instead of `storage.max_pending_groups`,
    /// and claim [`BACKLOG_CLAIM_FACTOR`]× what it holds in heartbeats (below the claim
    /// limit, so not malformed).
    BacklogInflation,
    /// Write the responses it wants (not sampled) and report their true log-probs under the
    /// installed policy: every number is consistent, no token is drawn.
    ForcedTokens,
    /// Honest tokens, log-probs and rewards, but loss masks of its own choosing.
    MaskPoisoning,
    /// Sample with the first snapshot it installed, forever, and report log-probs recomputed
    /// under the version it claims (the installed one).
    StaleVersion,
    /// Report an episode's return one chip higher than the environment paid.
    ForgedReturn,
    /// Edit an observation inside an episode's trajectory (what the environment said).
    ForgedObservation,
    /// Claim μ = [`INFLATED_MU`] groups/s in heartbeats (within the heartbeat's bound), so that
    /// a scheduler trusting claims activates it first and sends honest workers to standby.
    MuInflation,
    /// Push every (valid) snapshot chunk to its chain child three times, so that an honest
    /// child's receipt would report more bytes than it wanted.
    OverfeedParent,
    /// Sign delivery receipts saying every planned parent delivered nothing (no hello, no
    /// byte), to get honest parents convicted as silent forwarders (the scenario runs two).
    FramingReceipts,
    /// Honest groups, but never send one containing an exact answer (a sample of reward 1):
    /// they stay stored and committed, and are left out of every lease.
    WithholdByReward,
    /// A CPU worker whose heartbeats claim `cuda`/`bf16`, sampling in f32 and choosing its
    /// token at the first [`FALSE_DTYPE_POSITIONS`] positions of each sample from a uniform
    /// moved by [`FALSE_DTYPE_NUDGE`] (inside bf16's margin δ 0.25): true log-probs, true
    /// rewards, tokens of its own choosing within the claimed margin.
    FalseDtype,
    /// An honest worker: the scenario starts three fresh identities of it once the honest
    /// workers are established (their data passes every check).
    YoungSybils,
}

/// Positions per sample where a `false_dtype` worker chooses its token.
pub const FALSE_DTYPE_POSITIONS: u64 = 14;
/// How far a `false_dtype` worker moves the prescribed uniform (within bf16's δ 0.25).
pub const FALSE_DTYPE_NUDGE: f64 = 0.15;

/// The generation rate (groups/s) a `mu_inflation` worker claims.
pub const INFLATED_MU: f64 = 1e6;
/// Installs after which a `silent_after_honest` worker stops forwarding.
pub const SILENT_AFTER_INSTALLS: u64 = 4;
/// Honest groups of each `sybil_rekey` identity before it forges.
pub const SYBIL_HONEST_GROUPS: u64 = 2;
/// Honest groups of a `late_liar` before it forges: past the default probation's 16 groups by
/// 4 (a run of the scenario pulls a few dozen groups per worker, so it must turn early to be
/// seen turning; with probation's 120 s and 8 versions it turns while still on probation).
pub const LATE_LIAR_HONEST_GROUPS: u64 = 20;
/// Groups a `backlog_inflation` worker keeps pending.
pub const BACKLOG_PENDING: u64 = 1024;
/// How much more than it holds a `backlog_inflation` worker claims.
pub const BACKLOG_CLAIM_FACTOR: u64 = 64;
/// Exit status of a `sybil_rekey` worker that noticed its ban and wiped its identity.
pub const REKEY_EXIT_CODE: i32 = 75;
/// File (in the data dir) where a misbehaving worker lists the ids (hex) of the groups it
/// forged, one per line, so the scenario can count how many were trained.
pub const FORGED_FILE: &str = "misbehave.forged";

impl Attack {
    /// Every attack, in declaration order.
    pub const ALL: &[Attack] = <Attack as strum::VariantArray>::VARIANTS;

    /// The attack's name (snake_case, as in the scenario's JSON and `ECHO_NODE_MISBEHAVE`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl FromStr for Attack {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Attack::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Attack::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "unknown attack `{s}` (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// The attacks this process carries out (empty for every honest node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Misbehaviour(BTreeSet<Attack>);

impl Misbehaviour {
    /// Parses a comma-separated list of attack names.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(Attack::from_str)
            .collect::<Result<BTreeSet<_>, _>>()
            .map(Misbehaviour)
    }

    /// The attacks named in [`ENV_VAR`] (none when unset). A bad name is an error: a test that
    /// misspells an attack must not silently run an honest node.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(ENV_VAR) {
            Ok(v) => Self::from_setting(&v),
            Err(_) => Ok(Self::default()),
        }
    }

    /// The attacks a value of [`ENV_VAR`] switches on: those it names in a build with the
    /// `adversary` feature; none in a default build, which says so (a warning) and runs
    /// honestly. Bad names are an error in both.
    pub fn from_setting(list: &str) -> Result<Self, String> {
        let m = Self::parse(list)?;
        if !cfg!(feature = "adversary") && !m.is_honest() {
            tracing::warn!(
                "{ENV_VAR} is set, but this build has no attack code (built without the \
                 `adversary` feature): ignored, the node runs honestly"
            );
            return Ok(Self::default());
        }
        Ok(m)
    }

    /// Whether this build can carry out attacks at all (the `adversary` feature).
    pub const fn can_attack() -> bool {
        cfg!(feature = "adversary")
    }

    pub fn has(&self, a: Attack) -> bool {
        self.0.contains(&a)
    }

    pub fn is_honest(&self) -> bool {
        self.0.is_empty()
    }

    pub fn attacks(&self) -> impl Iterator<Item = Attack> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the scenario's and the variable's contract: derived, they must still
    /// read exactly as written here.
    #[test]
    fn attack_names_are_pinned() {
        let names: Vec<String> = Attack::ALL.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            names,
            [
                "inflated_reward",
                "forged_logprobs",
                "invalid_logprob",
                "out_of_vocab",
                "overlong",
                "oversized_answer",
                "pending_inflation",
                "heartbeat_spam",
                "corrupt_chunks",
                "replay_after_restart",
                "bad_signature",
                "silent_forwarder",
                "silent_after_honest",
                "slow_forwarder",
                "sybil_rekey",
                "late_liar",
                "backlog_inflation",
                "forced_tokens",
                "mask_poisoning",
                "stale_version",
                "forged_return",
                "forged_observation",
                "mu_inflation",
                "overfeed_parent",
                "framing_receipts",
                "withhold_by_reward",
                "false_dtype",
                "young_sybils",
            ]
        );
    }

    #[test]
    fn names_round_trip_and_bad_names_are_errors() {
        for &a in Attack::ALL {
            assert_eq!(a.name().parse::<Attack>().unwrap(), a);
        }
        let m = Misbehaviour::parse("inflated_reward, heartbeat_spam").unwrap();
        assert!(m.has(Attack::InflatedReward) && m.has(Attack::HeartbeatSpam));
        assert!(!m.has(Attack::Overlong));
        assert!(Misbehaviour::parse("").unwrap().is_honest());
        let e = Misbehaviour::parse("inflated_rewards").unwrap_err();
        assert!(e.contains("unknown attack `inflated_rewards`"), "{e}");
    }

    /// Compiled only without the `adversary` feature (`cargo test -p echo-node --lib
    /// misbehave`, a step of `.ci/run`): the release build cannot be made malicious by the
    /// environment variable.
    #[cfg(not(feature = "adversary"))]
    #[test]
    fn a_default_build_ignores_the_switch() {
        assert!(!Misbehaviour::can_attack());
        let all: Vec<&str> = Attack::ALL.iter().map(|a| a.name()).collect();
        let m = Misbehaviour::from_setting(&all.join(",")).unwrap();
        assert!(m.is_honest(), "no attack is switched on: {m:?}");
        assert!(Misbehaviour::from_setting("inflated_rewards").is_err());
    }

    #[cfg(feature = "adversary")]
    #[test]
    fn an_adversary_build_switches_on_what_the_variable_names() {
        assert!(Misbehaviour::can_attack());
        let m = Misbehaviour::from_setting("corrupt_chunks").unwrap();
        assert!(m.has(Attack::CorruptChunks));
    }
}
