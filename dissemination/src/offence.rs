//! What snapshot dissemination can show against a peer, for a strike (`docs/security.md`,
//! "Strikes and bans"): this crate's own reasons, handed to the network service as a generic
//! [`p2p::PeerReport`] (a severity and the reason's name as its label).
//!
//! Owns: the offences, their names and their weights. Must not touch: when one is found (the
//! engine's install and forwarding accounts), what a ban does (`p2p`).

use p2p::{PeerReport, ReportLabel};

/// A reason for a strike found by dissemination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offence {
    /// A chunk whose BLAKE3 hash does not match the signed manifest. A node sends only chunks
    /// it verified on arrival and verifies again on every disk read, and the transport
    /// authenticates every byte in flight, so only a node that alters chunks — or whose memory
    /// is failing, which makes it as harmful — sends one: a ban at once.
    CorruptChunk,
    /// A chain parent that held a snapshot version and sent its child nothing — not even a
    /// hello — as the signed receipts of two different children showed (the learner's
    /// attribution, `control::forwarding`): one strike per silent version in the evidence.
    SilentForwarding,
}

impl Offence {
    /// Every offence, in declaration order.
    pub const ALL: [Offence; 2] = [Offence::CorruptChunk, Offence::SilentForwarding];

    /// Its stable name (status, metrics, logs, the ban list).
    pub fn label(self) -> ReportLabel {
        match self {
            Offence::CorruptChunk => ReportLabel::new("corrupt_chunk"),
            Offence::SilentForwarding => ReportLabel::new("silent_forwarding"),
        }
    }

    /// The report for the network service.
    pub fn report(self) -> PeerReport {
        match self {
            Offence::CorruptChunk => PeerReport::fatal(self.label()),
            Offence::SilentForwarding => PeerReport::strike(self.label()),
        }
    }
}
