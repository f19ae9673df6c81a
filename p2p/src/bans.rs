//! Strikes and bans: the pure rules behind [`crate::Client::strike`].
//!
//! A *strike* is evidence, checked by this node, that a peer sent bad data (a group that
//! failed validation, a corrupt chunk, a gossip message rejected by validation, a heartbeat
//! flood, …), reported as a [`crate::PeerReport`]: a severity and an opaque label the
//! reporter chose (the reasons are the roles'; the service's own are
//! [`crate::NetOffence`]). Each strike also counts as one failed transfer in the
//! peer's ECHO score. Once a peer's strikes reach `network.ban_after_strikes` it is *banned
//! for the run*: disconnected, blacklisted in gossipsub, refused on every later connection in
//! either direction, never listed in the learner's score table, and shown with its reason in
//! `/status`. A ban is never lifted while the process runs, except that the set of bans is
//! bounded ([`MAX_BANS`]): past it the oldest ban is forgotten, so that a stream of fresh
//! identities cannot make the node's memory grow without bound.
//!
//! Owns: the per-peer strike tally ([`Strikes`]), the threshold rule ([`reaches_ban`]) and the
//! bounded, insertion-ordered ban list ([`BanList`]). No I/O, no clock. Must not touch: the
//! swarm (the service in `service/bans.rs` carries a ban out) or the ECHO score formulas.

use std::collections::{BTreeMap, HashMap, VecDeque};

use libp2p::PeerId;

use crate::report::ReportLabel;

/// At most this many peers are banned at once; the oldest ban is forgotten to admit a new one.
/// 4096 identities × a few hundred bytes of state is well under a megabyte, while an attacker
/// who wants to cycle a banned identity back in has to earn 4096 other bans first.
pub const MAX_BANS: usize = 4096;

/// One peer's strikes, counted per label (at most one counter per [`ReportLabel`] — labels
/// are compile-time constants — so the tally is bounded whatever the peer does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Strikes {
    by_reason: BTreeMap<ReportLabel, u64>,
    total: u64,
}

impl Strikes {
    /// Counts one strike and returns the peer's new total.
    pub(crate) fn add(&mut self, reason: ReportLabel) -> u64 {
        let n = self.by_reason.entry(reason).or_default();
        *n = n.saturating_add(1);
        self.total = self.total.saturating_add(1);
        self.total
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The counts per reason, by reason name (the status view's `strikes_by_reason`).
    pub(crate) fn by_reason(&self) -> BTreeMap<String, u64> {
        self.by_reason
            .iter()
            .map(|(r, n)| (r.as_str().to_string(), *n))
            .collect()
    }
}

/// Whether a peer with `total` strikes is to be banned under `ban_after_strikes`: the strike
/// that brings the total to the threshold bans (threshold 3: the third strike bans). A
/// threshold of 0 is refused by config validation; here it is treated as 1.
pub(crate) fn reaches_ban(total: u64, ban_after_strikes: u32) -> bool {
    total >= u64::from(ban_after_strikes.max(1))
}

/// The peers banned for the run, oldest first, at most `cap` of them.
#[derive(Debug, Clone)]
pub(crate) struct BanList {
    cap: usize,
    order: VecDeque<PeerId>,
    reasons: HashMap<PeerId, ReportLabel>,
}

impl BanList {
    pub(crate) fn new(cap: usize) -> Self {
        BanList {
            cap: cap.max(1),
            order: VecDeque::new(),
            reasons: HashMap::new(),
        }
    }

    pub(crate) fn contains(&self, peer: &PeerId) -> bool {
        self.reasons.contains_key(peer)
    }

    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Bans `peer` for `reason` (a peer already banned keeps its first reason). Returns the
    /// oldest ban forgotten to stay within the cap, if any: the caller lifts that one.
    pub(crate) fn ban(&mut self, peer: PeerId, reason: ReportLabel) -> Option<PeerId> {
        if self.contains(&peer) {
            return None;
        }
        let forgotten = if self.order.len() >= self.cap {
            let old = self.order.pop_front();
            if let Some(old) = &old {
                self.reasons.remove(old);
            }
            old
        } else {
            None
        };
        self.order.push_back(peer);
        self.reasons.insert(peer, reason);
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INVALID_GROUP: ReportLabel = ReportLabel::new("invalid_group");
    const BAD_MESSAGE: ReportLabel = ReportLabel::new("bad_message");
    const CORRUPT_CHUNK: ReportLabel = ReportLabel::new("corrupt_chunk");

    /// The names of the small enums are a contract (status JSON, metrics labels): derived,
    /// they must still read exactly as written here, in this order, and serde must agree.
    /// (The strike labels are pinned where their offences are defined: `report`, and the
    /// node's list of every offence.)
    #[test]
    fn the_wire_names_of_the_small_enums_are_pinned() {
        use crate::{Reachability, Role, TopicKind};
        let names: Vec<String> = Role::ALL.iter().map(|r| r.to_string()).collect();
        assert_eq!(names, ["learner", "rollout", "relay"]);
        let names: Vec<&str> = Reachability::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["public", "holepunch", "relayed", "unknown"]);
        let names: Vec<&str> = TopicKind::ALL.iter().map(|k| k.kind_name()).collect();
        assert_eq!(names, ["heartbeat", "scores", "snapshots", "plans"]);
        for &k in TopicKind::ALL {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.kind_name())
            );
        }
    }

    #[test]
    fn strikes_are_counted_per_reason() {
        let mut s = Strikes::default();
        assert_eq!(s.add(INVALID_GROUP), 1);
        assert_eq!(s.add(BAD_MESSAGE), 2);
        assert_eq!(s.add(INVALID_GROUP), 3);
        assert_eq!(s.total(), 3);
        let by = s.by_reason();
        assert_eq!(by["invalid_group"], 2);
        assert_eq!(by["bad_message"], 1);
        assert_eq!(by.len(), 2);
    }

    #[test]
    fn the_strike_that_reaches_the_threshold_bans() {
        assert!(!reaches_ban(2, 3));
        assert!(reaches_ban(3, 3));
        assert!(reaches_ban(4, 3));
        assert!(reaches_ban(1, 1));
        assert!(!reaches_ban(0, 1));
        // 0 is invalid config; never "ban before any strike".
        assert!(!reaches_ban(0, 0));
        assert!(reaches_ban(1, 0));
    }

    #[test]
    fn bans_are_kept_in_order_and_the_oldest_is_forgotten_past_the_cap() {
        let mut b = BanList::new(2);
        let (p1, p2, p3) = (PeerId::random(), PeerId::random(), PeerId::random());
        assert_eq!(b.ban(p1, CORRUPT_CHUNK), None);
        assert_eq!(b.ban(p2, BAD_MESSAGE), None);
        // Banning again changes nothing (the first reason stays, no eviction).
        assert_eq!(b.ban(p1, ReportLabel::new("heartbeat_flood")), None);
        assert_eq!(b.len(), 2);
        assert_eq!(b.ban(p3, ReportLabel::new("bad_signature")), Some(p1));
        assert!(!b.contains(&p1) && b.contains(&p2) && b.contains(&p3));
        assert_eq!(b.len(), 2);
        // p2 is now the oldest.
        assert_eq!(b.ban(p1, BAD_MESSAGE), Some(p2));
    }

    #[test]
    fn the_default_cap_holds() {
        let mut b = BanList::new(MAX_BANS);
        let first = PeerId::random();
        b.ban(first, BAD_MESSAGE);
        for _ in 1..MAX_BANS {
            assert_eq!(b.ban(PeerId::random(), BAD_MESSAGE), None);
        }
        assert_eq!(b.len(), MAX_BANS);
        assert_eq!(b.ban(PeerId::random(), BAD_MESSAGE), Some(first));
        assert_eq!(b.len(), MAX_BANS);
    }
}
