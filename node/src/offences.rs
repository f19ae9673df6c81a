//! Every offence this node reports to its network service, from every crate that finds one
//! (`docs/security.md`, "Strikes and bans"): the learner's strikes
//! ([`crate::roles::learner::penalty::Strike`]), the pull protocol's ([`pull::Offence`]),
//! dissemination's ([`dissemination::Offence`]) and the service's own ([`p2p::NetOffence`]).
//! The network crate knows a report only as a severity and an opaque label; this is the one
//! place that lists them all, so that their names can be pinned (they are a contract: status
//! JSON, the `p2p_strikes_total{reason}` label, the ban list) and a persisted ban's reason
//! read back ([`label_named`]).
//!
//! Owns: the list. Must not touch: what any offence means or weighs (each crate's own enum).

use p2p::PeerReport;

use crate::roles::learner::penalty::Strike;

/// Every offence's report (its label and its severity when reported on its own), grouped by
/// the crate that finds it.
pub fn all() -> Vec<PeerReport> {
    let learner = Strike::ALL.iter().map(|s| s.report());
    let pull = pull::Offence::ALL.into_iter().map(pull::Offence::report);
    let dissemination = dissemination::Offence::ALL
        .into_iter()
        .map(dissemination::Offence::report);
    let network = p2p::NetOffence::ALL.iter().map(|o| o.report());
    learner
        .chain(pull)
        .chain(dissemination)
        .chain(network)
        .collect()
}

/// The label named `name` — a reason read from the persisted ban list (`storage::bans`),
/// written by this or an earlier version — if this node knows it.
pub fn label_named(name: &str) -> Option<p2p::ReportLabel> {
    all()
        .into_iter()
        .map(|r| r.label)
        .find(|l| l.as_str() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p::Severity;

    /// The names are a contract (ban files, status JSON, metrics labels): they must read
    /// exactly as the strike reasons always did, each once; exactly the evidence no honest
    /// node produces bans at the first strike.
    #[test]
    fn every_offence_keeps_its_name_and_weight() {
        let names: Vec<&str> = all().iter().map(|r| r.label.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        let mut expected = [
            "invalid_group",
            "reward_mismatch",
            "logprob_mismatch",
            "bad_signature",
            "wrong_prompt",
            "oversized_answer",
            "corrupt_chunk",
            "stream_violation",
            "untrainable",
            "heartbeat_flood",
            "replay",
            "forged_message",
            "bad_message",
            "silent_forwarding",
            "mask_mismatch",
            "token_not_drawn",
            "withheld",
        ];
        expected.sort_unstable();
        assert_eq!(sorted, expected);
        let mut at_once: Vec<&str> = all()
            .iter()
            .filter(|r| r.severity == Severity::Fatal)
            .map(|r| r.label.as_str())
            .collect();
        at_once.sort_unstable();
        assert_eq!(
            at_once,
            [
                "corrupt_chunk",
                "forged_message",
                "oversized_answer",
                "replay",
                "token_not_drawn"
            ]
        );
    }

    /// A ban file's reasons read back to the same labels (the file is unchanged: format 1,
    /// reasons by name); a name no version wrote is not made up.
    #[test]
    fn persisted_reasons_read_back() {
        for r in all() {
            assert_eq!(label_named(r.label.as_str()), Some(r.label));
        }
        assert_eq!(label_named("nonsense"), None);
        assert_eq!(label_named(""), None);
    }
}
