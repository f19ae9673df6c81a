//! The engine's counters: bytes, chunks, installs and sessions since start, each also
//! exported as a metric when it moves ([`Disseminator::counters`] reads them all at once).
//!
//! Owns: the counter set and its snapshot type. Must not touch: what is counted (the
//! engine's modules call `count`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Disseminator;

/// Byte and chunk counters since start (read as [`BroadcastCounters`]).
#[derive(Debug, Default)]
pub(super) struct AtomicCounters {
    pub(super) pushed_bytes: AtomicU64,
    pub(super) push_received_bytes: AtomicU64,
    pub(super) fetched_bytes: AtomicU64,
    pub(super) served_bytes: AtomicU64,
    pub(super) chunks_stored: AtomicU64,
    pub(super) duplicate_bytes: AtomicU64,
    pub(super) chunks_rejected: AtomicU64,
    pub(super) installs: AtomicU64,
    pub(super) sessions_reused: AtomicU64,
    pub(super) sessions_warmed: AtomicU64,
    pub(super) plans_announced: AtomicU64,
    pub(super) warm_up_bytes: AtomicU64,
    pub(super) sessions_stale: AtomicU64,
    pub(super) sessions_ended_idle: AtomicU64,
    pub(super) push_open_retries: AtomicU64,
    pub(super) fetches_declined: AtomicU64,
    pub(super) catch_ups_served: AtomicU64,
}

/// The broadcast counters of one node since start (`Disseminator::counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BroadcastCounters {
    /// Chunk payload bytes this node sent on chunk streams (learner pushes and forwarding).
    pub pushed_bytes: u64,
    /// Chunk payload bytes received (and verified) on chunk streams.
    pub push_received_bytes: u64,
    /// Chunk payload bytes received (and verified) through fetches.
    pub fetched_bytes: u64,
    /// Chunk payload bytes served to fetches.
    pub served_bytes: u64,
    pub chunks_stored: u64,
    /// Verified chunk bytes (pushed or fetched) this node already held when they arrived: a
    /// push and a repair fetch that raced for the same chunk, or a push still streaming a
    /// version the node completed by fetching. Counted in `push_received_bytes` or
    /// `fetched_bytes` as well.
    pub duplicate_bytes: u64,
    pub chunks_rejected: u64,
    pub installs: u64,
    /// Pushes sent on a chunk stream kept open from an earlier version (`session`).
    pub sessions_reused: u64,
    /// Chunk streams opened to a child the plan names before the version's manifest was
    /// here (`session::warm_sessions`), kept for its first push.
    pub sessions_warmed: u64,
    /// Learner: standing plans announced ahead of their version (`announce_plan`).
    pub plans_announced: u64,
    /// Filler bytes sent on warm streams before their first hello (`session::send_filler`).
    pub warm_up_bytes: u64,
    /// Kept chunk streams found closed by the child at the next hello (the push then opened a
    /// fresh stream).
    pub sessions_stale: u64,
    /// Kept chunk streams this node, as a child, closed after `session_idle_timeout` without
    /// a hello.
    pub sessions_ended_idle: u64,
    /// Pushes whose chunk stream did not open at first and was tried again (the child was not
    /// reachable yet: `session::open_push_stream`).
    pub push_open_retries: u64,
    /// Chunks this node, busy forwarding, answered as not held (`fetch::declines_fetches`).
    pub fetches_declined: u64,
    /// Manifest requests answered for a version older than the newest (a worker's catch-up
    /// of a delta's chain, `catchup`).
    pub catch_ups_served: u64,
}

impl Disseminator {
    /// Adds to one of the counters and its Prometheus mirror.
    pub(super) fn count(
        &self,
        which: impl Fn(&AtomicCounters) -> &AtomicU64,
        n: u64,
        metric: &'static str,
    ) {
        which(&self.inner.counters).fetch_add(n, Ordering::Relaxed);
        metrics::counter!(metric).increment(n);
    }

    /// Every counter, read at once.
    pub fn counters(&self) -> BroadcastCounters {
        let c = &self.inner.counters;
        BroadcastCounters {
            pushed_bytes: c.pushed_bytes.load(Ordering::Relaxed),
            push_received_bytes: c.push_received_bytes.load(Ordering::Relaxed),
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            served_bytes: c.served_bytes.load(Ordering::Relaxed),
            chunks_stored: c.chunks_stored.load(Ordering::Relaxed),
            duplicate_bytes: c.duplicate_bytes.load(Ordering::Relaxed),
            chunks_rejected: c.chunks_rejected.load(Ordering::Relaxed),
            installs: c.installs.load(Ordering::Relaxed),
            sessions_reused: c.sessions_reused.load(Ordering::Relaxed),
            sessions_warmed: c.sessions_warmed.load(Ordering::Relaxed),
            plans_announced: c.plans_announced.load(Ordering::Relaxed),
            warm_up_bytes: c.warm_up_bytes.load(Ordering::Relaxed),
            sessions_stale: c.sessions_stale.load(Ordering::Relaxed),
            sessions_ended_idle: c.sessions_ended_idle.load(Ordering::Relaxed),
            push_open_retries: c.push_open_retries.load(Ordering::Relaxed),
            fetches_declined: c.fetches_declined.load(Ordering::Relaxed),
            catch_ups_served: c.catch_ups_served.load(Ordering::Relaxed),
        }
    }
}
