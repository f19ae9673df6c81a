//! Per-peer limits on concurrent inbound bulk streams (chunk push, chunk fetch): one peer
//! cannot open streams faster than this node finishes them and pile up tasks and buffers.
//! Connections are bounded by `connection_limits` (see `behaviour.rs`); yamux bounds the
//! streams of one connection, but a node serving each stream in its own task needs its own
//! bound on how many it serves at once.
//!
//! Rule: at most `per_peer` streams of one kind served at once for one peer and `total` for
//! all peers together; a stream over either bound is dropped at once (the opener sees it
//! closed and may retry later — an honest parent or fetcher never needs more than a couple).
//!
//! Owns: [`StreamSlots`] and its [`Slot`] guard. Must not touch: the streams themselves (the
//! accept loops in `dissemination` hold a slot for as long as they serve a stream).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use libp2p::PeerId;

/// Concurrent inbound streams of one kind a node serves for one peer, by default.
pub const DEFAULT_STREAMS_PER_PEER: usize = 4;
/// Concurrent inbound streams of one kind a node serves in all, by default.
pub const DEFAULT_STREAMS_TOTAL: usize = 256;

/// Counts of streams being served, per peer and in all.
#[derive(Debug, Clone)]
pub struct StreamSlots {
    inner: Arc<Mutex<Counts>>,
    per_peer: usize,
    total: usize,
}

#[derive(Debug, Default)]
struct Counts {
    by_peer: HashMap<PeerId, usize>,
    total: usize,
}

/// One stream being served; frees its slot when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: StreamSlots,
    peer: PeerId,
}

impl StreamSlots {
    pub fn new(per_peer: usize, total: usize) -> Self {
        StreamSlots {
            inner: Arc::default(),
            per_peer: per_peer.max(1),
            total: total.max(1),
        }
    }

    /// A slot for one more stream of `peer`, or `None` when the peer or the node is at its
    /// bound (drop the stream).
    pub fn try_acquire(&self, peer: PeerId) -> Option<Slot> {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.by_peer.get(&peer).copied().unwrap_or(0);
        if mine >= self.per_peer || c.total >= self.total {
            return None;
        }
        *c.by_peer.entry(peer).or_default() += 1;
        c.total += 1;
        Some(Slot {
            slots: self.clone(),
            peer,
        })
    }

    /// Streams of `peer` being served now.
    pub fn in_use(&self, peer: &PeerId) -> usize {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.by_peer.get(peer).copied().unwrap_or(0)
    }

    /// Peers with a stream being served (the map holds no idle peer).
    pub fn peers(&self) -> usize {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.by_peer.len()
    }
}

impl Default for StreamSlots {
    fn default() -> Self {
        StreamSlots::new(DEFAULT_STREAMS_PER_PEER, DEFAULT_STREAMS_TOTAL)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
        c.total = c.total.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_at_most_its_share_and_slots_come_back() {
        let s = StreamSlots::new(2, 3);
        let (a, b) = (PeerId::random(), PeerId::random());
        let a1 = s.try_acquire(a).unwrap();
        let a2 = s.try_acquire(a).unwrap();
        assert!(s.try_acquire(a).is_none(), "a third stream of one peer");
        let b1 = s.try_acquire(b).unwrap();
        assert!(s.try_acquire(b).is_none(), "over the total");
        drop(a1);
        assert_eq!(s.in_use(&a), 1);
        let b2 = s.try_acquire(b).unwrap();
        drop((a2, b1, b2));
        assert_eq!((s.in_use(&a), s.in_use(&b), s.peers()), (0, 0, 0));
        assert!(s.try_acquire(a).is_some());
    }
}
