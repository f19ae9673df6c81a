//! What a rejected group costs its worker (`docs/security.md`, "One verification pipeline"):
//! the learner's reasons for a strike ([`Strike`]) and the one exhaustive `match` from a
//! [`Rejection`] — the closed enum of every stage's reasons, `storage::rejection` — to its
//! [`Penalty`] ([`penalty`]). It has no catch-all arm: a stage reason added later does not
//! compile until it is given a penalty here.
//!
//! The network service sees none of these reasons: a penalty goes to it as a generic
//! [`p2p::PeerReport`] ([`Penalty::report`]; [`Strike::report`]) — the strike's stable name
//! as the label its status view, metrics and ban list show, and a severity (a strike toward
//! `network.ban_after_strikes`, or a ban at once).
//!
//! Owns: the learner's strike reasons, their names and the rejection → penalty rule. Must not
//! touch: the checks (the stages, `super::verify`, `super::spot`), who carries a penalty out
//! (the puller strikes and bans), the ban rules (`p2p`).

use p2p::{PeerReport, ReportLabel};
use storage::{Rejection, StructureFault};

/// Why the learner strikes a worker: evidence, checked by the learner, that the worker sent
/// bad data or kept data back. Each strike is one failed transfer in the worker's ECHO score;
/// past the threshold the worker is banned for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Strike {
    /// A pulled group failed the structure checks (vocabulary, context, log-prob floor,
    /// size, schema, producer), names a version never published, or its responses do not
    /// end where a sampler stops.
    InvalidGroup,
    /// The learner's recomputed reward differs from the reported one (or an episode does not
    /// replay).
    RewardMismatch,
    /// A spot-checked log-prob differs from the recomputed one beyond tolerance.
    LogprobMismatch,
    /// A group's producer signature is missing, wrong, or from another peer.
    BadSignature,
    /// A group answers a prompt the learner did not assign to this peer, or reuses a
    /// sequence number.
    WrongPrompt,
    /// A group the trainer could not use. Nothing strikes it now (the numeric guard
    /// quarantines without a strike); kept so that ban files of the versions that did read
    /// back with their reason.
    Untrainable,
    /// A group whose loss mask is not the one the learner derives from its tokens.
    MaskMismatch,
    /// A spot-checked token that the canonical sampling rule does not draw from the uniform
    /// the learner prescribed, beyond the numeric margin: a written response, or samples of
    /// another version than claimed. No honest sampler produces one, so it bans at once.
    TokenNotDrawn,
    /// A worker kept back a group it had committed (`control::commits`): a committed,
    /// admissible group not delivered when asked, a number its commit log skipped, or a
    /// delivered group it never committed (or committed with other content).
    Withheld,
}

impl Strike {
    /// Every strike reason, in declaration order.
    pub const ALL: &[Strike] = <Strike as strum::VariantArray>::VARIANTS;

    /// Its stable name (snake_case: status JSON, metrics labels, log lines, the ban list).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Its name as the network service's label.
    pub fn label(self) -> ReportLabel {
        ReportLabel::new(self.as_str())
    }

    /// The report of one strike: proof bans at once (`token_not_drawn`), the rest counts
    /// toward the threshold.
    pub fn report(self) -> PeerReport {
        match self {
            Strike::TokenNotDrawn => PeerReport::fatal(self.label()),
            Strike::InvalidGroup
            | Strike::RewardMismatch
            | Strike::LogprobMismatch
            | Strike::BadSignature
            | Strike::WrongPrompt
            | Strike::Untrainable
            | Strike::MaskMismatch
            | Strike::Withheld => PeerReport::strike(self.label()),
        }
    }
}

impl std::fmt::Display for Strike {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a rejection costs the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Penalty {
    /// The strike it earns (`None`: not the worker's fault).
    pub strike: Option<Strike>,
    /// Proof no honest worker can produce, whatever the network or numerics did: the worker
    /// is banned at once, and its buffered groups not yet trained are dropped.
    pub ban_at_once: bool,
}

impl Penalty {
    /// No strike.
    pub const NONE: Penalty = Penalty {
        strike: None,
        ban_at_once: false,
    };

    const fn strike(s: Strike) -> Self {
        Penalty {
            strike: Some(s),
            ban_at_once: false,
        }
    }

    const fn ban(s: Strike) -> Self {
        Penalty {
            strike: Some(s),
            ban_at_once: true,
        }
    }

    /// The report for the network service, if any: the strike's label, and a ban at once for
    /// proof.
    pub fn report(self) -> Option<PeerReport> {
        let s = self.strike?;
        Some(match self.ban_at_once {
            true => PeerReport::fatal(s.label()),
            false => s.report(),
        })
    }
}

/// The penalty of a rejection, with the reason for each arm:
/// - `inadmissible`, `stale_seq`: no strike (aged out in transit; an old number pulled late);
/// - `unchecked` (a group of a worker whose every group is checked, which the learner could not
///   check: its snapshot collected or unloadable) and `env_failed` (the environment failed
///   while checking): no strike — the learner's side failed;
/// - `unpublished_version` and the structure reasons (`malformed`, `token_out_of_vocab`,
///   `too_long`, `logprob_out_of_range`, `group_size`, `forged_producer`): `invalid_group`;
/// - `bad_signature`, `wrong_prompt`, `reward_mismatch`, `logprob_mismatch`: their own
///   strike (`replay_mismatch`, an episode that does not replay, is a `reward_mismatch`),
///   three to a ban (`network.ban_after_strikes`): a mis-configured or out-of-date honest
///   worker can produce them;
/// - `logprob_forged` (a log-prob at least a hundred tolerances off, `super::spot`):
///   `logprob_mismatch`, banned at once;
/// - `mask_mismatch` (a loss mask other than the learner's own): its strike, three to a ban;
/// - `response_end` (a single-turn response cut before its stop token, or going on after
///   it): `invalid_group` — a worker whose `max_new_tokens` differs from the learner's
///   produces it too, but its heartbeats say so first and the learner does not pull from it
///   (`super::puller`);
/// - `token_not_drawn` (a spot-checked token the canonical sampling rule does not draw from
///   the prescribed uniform beyond the dtype's margin, `super::spot`): banned at once — the
///   margin covers every honest numeric spread, so only a written response or another
///   version's samples produce it;
/// - `margin_unearned` (tokens inside the claimed dtype's sampling margin but outside the
///   margins the worker's measured spread earned, `super::spot`): no strike — an honest
///   sampler's spread may not be measured yet — and not trained.
///
/// (The trainer's numeric guard, which quarantines a group every stage passed, is no
/// rejection: nothing shows that the worker lied, and it strikes nobody.)
pub fn penalty(rejection: &Rejection) -> Penalty {
    match rejection {
        Rejection::Structure(fault) => match fault {
            StructureFault::Malformed(_)
            | StructureFault::TokenOutOfVocab { .. }
            | StructureFault::TooLong { .. }
            | StructureFault::LogprobOutOfRange { .. }
            | StructureFault::GroupSize { .. }
            | StructureFault::ForgedProducer { .. } => Penalty::strike(Strike::InvalidGroup),
        },
        Rejection::Inadmissible { .. }
        | Rejection::StaleSeq(_)
        | Rejection::Unchecked(_)
        | Rejection::MarginUnearned(_)
        | Rejection::EnvFailed(_) => Penalty::NONE,
        Rejection::UnpublishedVersion(_) | Rejection::ResponseEnd(_) => {
            Penalty::strike(Strike::InvalidGroup)
        }
        Rejection::BadSignature(_) => Penalty::strike(Strike::BadSignature),
        Rejection::WrongPrompt(_) => Penalty::strike(Strike::WrongPrompt),
        Rejection::RewardMismatch(_) | Rejection::ReplayMismatch(_) => {
            Penalty::strike(Strike::RewardMismatch)
        }
        Rejection::LogprobMismatch(_) => Penalty::strike(Strike::LogprobMismatch),
        Rejection::LogprobForged(_) => Penalty::ban(Strike::LogprobMismatch),
        Rejection::MaskMismatch(_) => Penalty::strike(Strike::MaskMismatch),
        Rejection::TokenNotDrawn(_) => Penalty::ban(Strike::TokenNotDrawn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p::Severity;

    /// Every kind of rejection has a penalty (the `match` above is exhaustive, so this is
    /// the compiler's word) and a distinct stable name; the penalties are the ones
    /// `docs/security.md` tabulates.
    #[test]
    fn every_rejection_has_a_penalty_and_a_distinct_name() {
        let table: Vec<(&str, Option<&str>, bool)> = Rejection::kinds()
            .map(|r| {
                let p = penalty(&r);
                (r.as_str(), p.strike.map(Strike::as_str), p.ban_at_once)
            })
            .collect();
        assert_eq!(table.len(), Rejection::KINDS);
        let mut names: Vec<&str> = table.iter().map(|r| r.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), table.len(), "{table:?}");
        let ig = Some("invalid_group");
        assert_eq!(
            table,
            [
                ("malformed", ig, false),
                ("token_out_of_vocab", ig, false),
                ("too_long", ig, false),
                ("logprob_out_of_range", ig, false),
                ("group_size", ig, false),
                ("forged_producer", ig, false),
                ("inadmissible", None, false),
                ("bad_signature", Some("bad_signature"), false),
                ("wrong_prompt", Some("wrong_prompt"), false),
                ("stale_seq", None, false),
                ("env_failed", None, false),
                ("reward_mismatch", Some("reward_mismatch"), false),
                ("replay_mismatch", Some("reward_mismatch"), false),
                ("response_end", ig, false),
                ("mask_mismatch", Some("mask_mismatch"), false),
                ("logprob_mismatch", Some("logprob_mismatch"), false),
                ("logprob_forged", Some("logprob_mismatch"), true),
                ("unpublished_version", ig, false),
                ("token_not_drawn", Some("token_not_drawn"), true),
                ("margin_unearned", None, false),
                ("unchecked", None, false),
            ]
        );
        // A penalty with no strike is never a ban.
        for r in Rejection::kinds() {
            let p = penalty(&r);
            assert!(p.strike.is_some() || !p.ban_at_once, "{}", r.as_str());
            assert_eq!(p.report().is_some(), p.strike.is_some());
        }
    }

    #[test]
    fn proof_reaches_the_network_service_as_a_ban_at_once() {
        let forged = penalty(&Rejection::LogprobForged(String::new()));
        let report = forged.report().unwrap();
        assert_eq!(report.label.as_str(), "logprob_mismatch");
        assert_eq!(report.severity, Severity::Fatal);
        let drift = penalty(&Rejection::LogprobMismatch(String::new()))
            .report()
            .unwrap();
        assert_eq!(
            (drift.label.as_str(), drift.severity),
            ("logprob_mismatch", Severity::Strike)
        );
        let at_once: Vec<&str> = Strike::ALL
            .iter()
            .filter(|s| s.report().severity == Severity::Fatal)
            .map(|s| s.as_str())
            .collect();
        assert_eq!(at_once, ["token_not_drawn"]);
    }
}
