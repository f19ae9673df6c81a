//! What the learner itself authored on the topics only it may publish (snapshot manifests,
//! plans, activation orders), remembered so that a copy published by another peer can be
//! told apart from a forgery: the same bytes are a *replay* ([`NetOffence::Replay`]), any
//! other bytes are a *forged message* ([`NetOffence::ForgedMessage`]). Both ban at once;
//! the reason says which happened.
//!
//! Owns the bounded set of message digests. Must not touch: the ban itself (the service
//! strikes), message formats (it hashes bytes as they arrived).
//!
//! [`NetOffence::Replay`]: crate::NetOffence::Replay
//! [`NetOffence::ForgedMessage`]: crate::NetOffence::ForgedMessage

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};

/// Digests remembered at most (the oldest forgotten first). The replay attack re-publishes
/// the first messages it saw; a run publishes one manifest per κ steps and a plan per
/// version, so this covers thousands of versions — past that, an old replay is reported as a
/// forged message, which bans all the same.
pub const MAX_AUTHORED: usize = 8192;

/// Digests of learner-authored messages (keyed by a per-process random key, so a peer cannot
/// craft bytes that collide with a learner message it has not seen).
#[derive(Debug)]
pub(crate) struct Authored {
    hasher: RandomState,
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl Default for Authored {
    fn default() -> Self {
        Authored {
            hasher: RandomState::new(),
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }
}

impl Authored {
    fn digest(&self, data: &[u8]) -> u64 {
        self.hasher.hash_one(data)
    }

    /// Remembers `data` as authored by the learner.
    pub(crate) fn record(&mut self, data: &[u8]) {
        let d = self.digest(data);
        if self.set.insert(d) {
            self.order.push_back(d);
            while self.order.len() > MAX_AUTHORED {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    /// Whether `data` is a message the learner authored (a copy of it is a replay).
    pub(crate) fn contains(&self, data: &[u8]) -> bool {
        self.set.contains(&self.digest(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_recognised_and_the_set_is_bounded() {
        let mut a = Authored::default();
        a.record(b"manifest v2");
        assert!(a.contains(b"manifest v2"));
        assert!(!a.contains(b"manifest v3"));
        assert!(!a.contains(b"garbage"));
        for i in 0..MAX_AUTHORED {
            a.record(format!("m{i}").as_bytes());
        }
        assert!(!a.contains(b"manifest v2"), "the oldest is forgotten");
        assert!(a.contains(format!("m{}", MAX_AUTHORED - 1).as_bytes()));
        assert_eq!(a.order.len(), MAX_AUTHORED);
        assert_eq!(a.set.len(), MAX_AUTHORED);
    }
}
