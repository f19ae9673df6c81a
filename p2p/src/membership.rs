//! The cost of membership at scale: how often a node heartbeats given the size of the swarm,
//! how long a silent peer stays in the peer table, and how large that table may grow.
//!
//! Every node gossips a heartbeat; every node receives every other node's heartbeat, and
//! gossipsub verifies the ed25519 signature of *each copy* it receives (a message reaches a
//! node once per mesh peer that forwards it). At a fixed interval `T` the receive cost of a
//! node therefore grows linearly with the swarm size `N` (`N / T` heartbeats per second,
//! times the mesh's duplicate factor); at `N = 1000` and `T = 2 s` that is several percent of
//! a core spent on nothing but "I am alive" (figures in `docs/membership.md`).
//!
//! Rules (pure; the swarm size and the clock are passed in):
//! - **Interval.** [`heartbeat_interval`]: the configured interval `T0`, doubled until each
//!   node receives at most [`TARGET_HEARTBEATS_PER_S`] heartbeats per second
//!   (`N / T ≤ R`), capped at [`MAX_HEARTBEAT_INTERVAL`]. Powers of two keep the set of
//!   possible intervals small, so nodes that count slightly different swarm sizes almost
//!   always pick the same one; every node computes it from the same input (the peers it
//!   hears), so no coordination message is needed.
//! - **Tolerance.** Two nodes may count different sizes (one heard a join the other did not
//!   yet). The receive side therefore uses the intervals of a swarm 20 % smaller
//!   ([`Intervals::gate`], the heartbeat rate limit's `T`) and 25 % larger
//!   ([`Intervals::alive`], the "active" window's `T`) than it counts: a sender whose count
//!   is within those bounds of the receiver's is neither rate-limited nor shown inactive
//!   (`tolerates_senders_that_count_within_twenty_percent`).
//! - **Forget.** A peer with no connection and no heartbeat for [`FORGET_AFTER_INTERVALS`]
//!   alive-intervals (at least [`FORGET_AFTER_MIN`]) is forgotten: ten minutes at the default
//!   2 s, proportionally longer in a large swarm whose heartbeats are slower, shorter in a
//!   test swarm heartbeating every 100 ms.
//! - **Cap.** The peer table holds at most [`MAX_KNOWN_PEERS`] entries; past it
//!   [`evict`] forgets the peers heard from least recently, never a connected or banned
//!   one, so a stream of fresh identities cannot grow the table without bound.
//!
//! Owns: those rules and their constants. Must not touch: the swarm, the timers or the peer
//! table itself (the service in [`crate::service`] applies them), the rate-limit rule
//! (`hbgate`), the peer-table rules (`peers`).

use std::time::{Duration, Instant};

/// Each node should receive at most this many heartbeats per second. The measured receive
/// cost of one heartbeat (six copies' signature checks, one decode, the peer-table update)
/// is about 0.52 ms on a loaded 2-core VM (`docs/membership.md`); 32 per second is then at
/// most 1.7 % of a core, under the 2 % budget of membership.
pub const TARGET_HEARTBEATS_PER_S: u32 = 32;
/// The interval never grows past this (the largest `heartbeat_interval_ms` config accepts).
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(600);
/// A silent, disconnected peer is forgotten after this many alive-intervals: 600 s at the
/// default 2 s interval.
pub const FORGET_AFTER_INTERVALS: u32 = 300;
/// ... but never sooner than this.
pub const FORGET_AFTER_MIN: Duration = Duration::from_secs(20);
/// At most this many peers in the peer table (a few KiB each: under 64 MiB in the worst
/// case). Connected and banned peers are never evicted, so the table may exceed it by at
/// most `network.max_peers` + `MAX_BANS` entries.
pub const MAX_KNOWN_PEERS: usize = 8192;

/// The heartbeat interval for a swarm of `swarm_size` nodes (this one included): `configured`
/// × the smallest power of two that keeps `swarm_size / interval` at or under
/// [`TARGET_HEARTBEATS_PER_S`], at most [`MAX_HEARTBEAT_INTERVAL`] (and never below
/// `configured`).
pub fn heartbeat_interval(configured: Duration, swarm_size: usize) -> Duration {
    let configured = configured.max(Duration::from_millis(1));
    let cap = MAX_HEARTBEAT_INTERVAL.max(configured);
    // Minimal interval, in seconds, for the target rate.
    let needed = swarm_size as f64 / f64::from(TARGET_HEARTBEATS_PER_S);
    let mut t = configured;
    while t.as_secs_f64() < needed && t < cap {
        t = (t * 2).min(cap);
    }
    t
}

/// The intervals a node uses, all derived from the swarm size it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intervals {
    /// How often this node heartbeats.
    pub send: Duration,
    /// The `T` of the per-source heartbeat rate limit: the interval of a swarm 20 % smaller,
    /// so a sender that counts fewer nodes (and so heartbeats faster) is not rate-limited.
    pub gate: Duration,
    /// The `T` of the "active" window and of forgetting: the interval of a swarm 25 %
    /// larger, so a sender that counts more nodes (and so heartbeats slower) stays active.
    pub alive: Duration,
}

impl Intervals {
    /// The intervals for a swarm of `swarm_size` nodes, `configured` being
    /// `network.heartbeat_interval_ms`.
    pub fn for_swarm(configured: Duration, swarm_size: usize) -> Intervals {
        Intervals {
            send: heartbeat_interval(configured, swarm_size),
            gate: heartbeat_interval(configured, swarm_size * 4 / 5),
            alive: heartbeat_interval(configured, swarm_size.saturating_mul(5).div_ceil(4)),
        }
    }

    /// How long a silent, disconnected peer stays in the peer table.
    pub fn forget_after(&self) -> Duration {
        (self.alive * FORGET_AFTER_INTERVALS).max(FORGET_AFTER_MIN)
    }
}

/// Which peers to forget so that at most `cap` remain: `peers` lists each known peer with
/// when it was last heard (`None`: never heartbeated) and whether it is protected (connected
/// or banned). Unprotected peers go first, never-heard ones before the least recently heard;
/// protected ones are never returned, so the result may leave more than `cap`.
pub fn evict<K: Clone>(peers: &[(K, Option<Instant>, bool)], cap: usize) -> Vec<K> {
    let excess = peers.len().saturating_sub(cap);
    if excess == 0 {
        return Vec::new();
    }
    let mut candidates: Vec<&(K, Option<Instant>, bool)> = peers
        .iter()
        .filter(|(_, _, protected)| !protected)
        .collect();
    // `None` sorts before any `Some`: never-heard peers are evicted first.
    candidates.sort_by_key(|(_, heard, _)| *heard);
    candidates
        .into_iter()
        .take(excess)
        .map(|(k, _, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::from_secs(2);

    #[test]
    fn small_swarms_keep_the_configured_interval() {
        for n in [1, 2, 8, 32, 64] {
            assert_eq!(heartbeat_interval(T0, n), T0, "n = {n}");
        }
        assert_eq!(heartbeat_interval(T0, 65), T0 * 2);
        assert_eq!(Intervals::for_swarm(T0, 40).alive, T0);
        assert_eq!(Intervals::for_swarm(T0, 40).gate, T0);
    }

    #[test]
    fn each_node_receives_at_most_the_target_rate() {
        let r = f64::from(TARGET_HEARTBEATS_PER_S);
        for n in [1usize, 65, 101, 200, 333, 1000, 5000, 10_000, 19_200] {
            let t = heartbeat_interval(T0, n);
            assert!(n as f64 / t.as_secs_f64() <= r, "n = {n}: {t:?}");
            // The smallest such power of two: half of it would exceed the target.
            if t > T0 {
                assert!(n as f64 / (t / 2).as_secs_f64() > r, "n = {n}: {t:?}");
            }
        }
        assert_eq!(heartbeat_interval(T0, 1000), Duration::from_secs(32));
    }

    #[test]
    fn the_interval_is_monotone_and_capped() {
        let mut last = Duration::ZERO;
        for n in 0..100_000 {
            let t = heartbeat_interval(T0, n);
            assert!(t >= last && t <= MAX_HEARTBEAT_INTERVAL);
            last = t;
        }
        assert_eq!(heartbeat_interval(T0, usize::MAX), MAX_HEARTBEAT_INTERVAL);
        // A configured interval above the cap is kept as is.
        let big = Duration::from_secs(900);
        assert_eq!(heartbeat_interval(big, 1_000_000), big);
    }

    #[test]
    fn tolerates_senders_that_count_within_twenty_percent() {
        // A sender counting `n1`, a receiver counting `n2` with 0.8 n2 <= n1 <= 1.25 n2:
        // the sender heartbeats no faster than the receiver's gate allows and no slower than
        // its alive window assumes.
        for configured in [Duration::from_millis(100), T0] {
            for n2 in (1..3000).step_by(7) {
                let recv = Intervals::for_swarm(configured, n2);
                assert!(recv.gate <= recv.send && recv.send <= recv.alive);
                let lo = (n2 * 4).div_ceil(5);
                let hi = n2 * 5 / 4;
                for n1 in [lo, n2, hi] {
                    let send = heartbeat_interval(configured, n1);
                    assert!(recv.gate <= send, "n1 {n1} n2 {n2}");
                    assert!(send <= recv.alive, "n1 {n1} n2 {n2}");
                }
            }
        }
    }

    #[test]
    fn forgetting_scales_with_the_interval() {
        let i = Intervals::for_swarm(T0, 10);
        assert_eq!(i.forget_after(), Duration::from_secs(600));
        let i = Intervals::for_swarm(Duration::from_millis(100), 2);
        assert_eq!(i.forget_after(), Duration::from_secs(30));
        let i = Intervals::for_swarm(Duration::from_millis(100), 0);
        assert!(i.forget_after() >= FORGET_AFTER_MIN);
        let i = Intervals::for_swarm(T0, 1000);
        assert!(i.forget_after() > Duration::from_secs(600));
    }

    #[test]
    fn eviction_spares_connected_and_banned_and_drops_the_stalest() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let peers = vec![
            ("connected-old", Some(t0), true),
            ("recent", Some(t0 + s * 10), false),
            ("never", None, false),
            ("old", Some(t0 + s), false),
            ("banned-never", None, true),
        ];
        assert!(evict(&peers, 5).is_empty());
        assert_eq!(evict(&peers, 4), vec!["never"]);
        assert_eq!(evict(&peers, 3), vec!["never", "old"]);
        assert_eq!(evict(&peers, 0), vec!["never", "old", "recent"]);
    }
}

#[cfg(test)]
#[path = "membership_cost.rs"]
mod cost;
