//! What a peer report is, as the network service sees it (`docs/security.md`, "Strikes and
//! bans"): a [`Severity`] — how much it weighs — and an opaque [`ReportLabel`] that names it
//! in logs, the status view, the `p2p_strikes_total{reason}` metric and the ban list. Like
//! Lighthouse's `PeerAction`, the network crate keeps only this generic part: *why* a role
//! reports a peer (a group that failed the learner's verification, a corrupt chunk, a pull
//! that broke protocol) is the role's closed enum, which hands its label and severity over
//! (the learner's `roles::learner::penalty::Strike`, `pull::Offence`,
//! `dissemination::Offence`). The service's own reports are [`NetOffence`].
//!
//! Owns: the two types, the service's own offences and their names. Must not touch: what a
//! role's offence means, the ban rules (`bans`).

use std::fmt;

/// How much a peer report weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Evidence an honest peer can produce too (a slow link, a numeric spread, a version
    /// skew): one strike, and a ban once the peer's strikes reach
    /// `network.ban_after_strikes`.
    Strike,
    /// Proof no honest node produces, whatever the network did: one strike and a ban at
    /// once, whatever the count.
    Fatal,
}

/// The stable snake_case name of an offence (for logs, status, metrics and the ban list),
/// chosen by the reporter. Opaque here: the service counts strikes per label and shows it,
/// it never reads meaning into it. Labels are compile-time constants, so a peer's tally is
/// bounded by the offences the program knows.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReportLabel(&'static str);

impl ReportLabel {
    /// The label `name` (snake_case, stable: it is a contract of the status view, the
    /// metrics and the ban file).
    pub const fn new(name: &'static str) -> Self {
        ReportLabel(name)
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for ReportLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for ReportLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// One report against a peer ([`crate::Client::strike`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerReport {
    pub label: ReportLabel,
    pub severity: Severity,
}

impl PeerReport {
    /// A report that counts toward the ban threshold.
    pub const fn strike(label: ReportLabel) -> Self {
        PeerReport {
            label,
            severity: Severity::Strike,
        }
    }

    /// A report that bans at once.
    pub const fn fatal(label: ReportLabel) -> Self {
        PeerReport {
            label,
            severity: Severity::Fatal,
        }
    }
}

/// The offences the network service reports itself (gossip validation, the heartbeat rate
/// limit, the learner-authored topics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum NetOffence {
    /// Heartbeats faster than the rate limit allows (`hbgate`).
    HeartbeatFlood,
    /// A manifest, plan or order (messages only the learner authors) published by another
    /// peer, byte for byte one the learner published: a replay. No honest node does this.
    Replay,
    /// A message only the learner may author, published by another peer, that is not one the
    /// learner published (a forgery, or garbage on the learner's topics).
    ForgedMessage,
    /// A gossip message that failed validation (by the service or by the role's `Reject`).
    BadMessage,
}

impl NetOffence {
    /// Every offence, in declaration order.
    pub const ALL: &[NetOffence] = <NetOffence as strum::VariantArray>::VARIANTS;

    pub fn label(self) -> ReportLabel {
        ReportLabel(self.into())
    }

    /// A replay or a forgery on the learner's topics is proof; a flood or a bad message may
    /// come from a buggy or out-of-date honest node.
    pub fn report(self) -> PeerReport {
        match self {
            NetOffence::Replay | NetOffence::ForgedMessage => PeerReport::fatal(self.label()),
            NetOffence::HeartbeatFlood | NetOffence::BadMessage => PeerReport::strike(self.label()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_offences_keep_their_names_and_weights() {
        let named: Vec<(&str, Severity)> = NetOffence::ALL
            .iter()
            .map(|o| (o.label().as_str(), o.report().severity))
            .collect();
        assert_eq!(
            named,
            [
                ("heartbeat_flood", Severity::Strike),
                ("replay", Severity::Fatal),
                ("forged_message", Severity::Fatal),
                ("bad_message", Severity::Strike),
            ]
        );
        let l = ReportLabel::new("corrupt_chunk");
        assert_eq!(
            (l.to_string(), format!("{l:?}")),
            ("corrupt_chunk".into(), "corrupt_chunk".into())
        );
    }
}
