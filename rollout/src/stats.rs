//! Throughput and production statistics of a rollout engine: μ_i (groups per second while
//! producing) and counters, shared lock-light with the node's heartbeats and metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use storage::TrajectoryGroup;

/// Shared, lock-light statistics of an engine (read by heartbeats and metrics).
#[derive(Debug, Default)]
pub struct RolloutStats {
    pub(crate) groups: AtomicU64,
    pub(crate) samples: AtomicU64,
    pub(crate) tokens: AtomicU64,
    pub(crate) version: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) paused: AtomicBool,
    pub(crate) behind: AtomicBool,
    /// (EMA of seconds per group, EMA of mean reward)
    pub(crate) ema: Mutex<Option<(f64, f64)>>,
}

/// A point-in-time copy of [`RolloutStats`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// μ_i: groups per second while producing — 1 / EMA of the wall time of a producing step
    /// (generation + reward + durable `put_group`); 0 before the first group. Paused time
    /// does not lower it: it measures capacity.
    pub mu: f64,
    /// Groups written so far.
    pub groups: u64,
    /// Samples written so far.
    pub samples: u64,
    /// Response tokens generated so far.
    pub tokens: u64,
    /// Version of the last group written.
    pub version: u64,
    /// True while paused by the pending-groups cap.
    pub paused: bool,
    /// True while the installed version is below the learner's window (nothing is made until
    /// a newer one installs).
    #[serde(default)]
    pub behind: bool,
    /// Groups that failed and were skipped (bad prompt, generation error).
    pub errors: u64,
    /// Moving average of group mean rewards.
    pub reward_ema: f64,
}

impl RolloutStats {
    /// Current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        let ema = self.ema.lock().map(|g| *g).unwrap_or(None);
        StatsSnapshot {
            mu: ema.map_or(0.0, |(s, _)| if s > 0.0 { 1.0 / s } else { 0.0 }),
            groups: self.groups.load(Ordering::Relaxed),
            samples: self.samples.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            version: self.version.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            behind: self.behind.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            reward_ema: ema.map_or(0.0, |(_, r)| r),
        }
    }

    pub(crate) fn record(&self, group: &TrajectoryGroup, secs: f64, alpha: f64) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.samples
            .fetch_add(group.samples.len() as u64, Ordering::Relaxed);
        let toks: usize = group.samples.iter().map(|s| s.response_tokens.len()).sum();
        self.tokens.fetch_add(toks as u64, Ordering::Relaxed);
        self.version.store(group.version, Ordering::Relaxed);
        let r = f64::from(group.mean_reward());
        if let Ok(mut g) = self.ema.lock() {
            *g = Some(match *g {
                None => (secs, r),
                Some((s, m)) => (s + alpha * (secs - s), m + alpha * (r - m)),
            });
        }
    }
}
