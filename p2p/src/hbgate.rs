//! The per-source heartbeat rate limit: how many heartbeats of one peer this node accepts.
//!
//! Rule (the receiving node's heartbeat interval `T`, clock passed in):
//! - **Gap.** A valid heartbeat is accepted only if at least `T/2` passed since the last one
//!   accepted from the same author; a faster one is *ignored* (gossipsub `Ignore`: neither
//!   forwarded nor recorded, no penalty). An honest node sends one per `T`, so `T/2` leaves
//!   room for jitter while capping what a spammer gets recorded at two per interval.
//! - **Install reports.** A heartbeat announcing a newer installed snapshot version than the
//!   last accepted one may come early (nodes report an install at once, and the learner times
//!   broadcasts from these reports), but only once between two on-time heartbeats, so it
//!   cannot be used to bypass the gap repeatedly.
//! - **Flood.** Every heartbeat that arrives (accepted or not) counts in a window of
//!   [`FLOOD_WINDOW_INTERVALS`] intervals; more than [`FLOOD_FACTOR`] × the expected count
//!   (one per interval) in one window is a flood and earns the author one
//!   `NetOffence::HeartbeatFlood` strike — at most one per window, so a flood costs the
//!   spammer a ban after `ban_after_strikes` windows while an honest node that merely
//!   restarted or jittered never gets near the bound.
//!
//! - **Sender pacing.** The sending side keeps to the same rule ([`HeartbeatPacer`]): an
//!   install report goes out at once only if half its own interval has passed since its last
//!   heartbeat; otherwise it is held until then (the latest version, once). On a fast learner
//!   (a version every 0.1 s on a GPU) reporting every install at once sent ten heartbeats a
//!   second, which every receiver's flood rule struck until honest workers were banned.
//!   Paced, a node sends at most two heartbeats per interval (its tick and one report between
//!   ticks), half the flood bound, and an install is reported at most `T/2` late.
//!
//! Owns: [`HeartbeatGate`] and [`HeartbeatPacer`]. Must not touch: decoding (done before), the
//! peer table or gossipsub (the service applies the verdict and publishes).

use std::time::{Duration, Instant};

/// Length of the flood window, in heartbeat intervals.
pub const FLOOD_WINDOW_INTERVALS: u32 = 5;
/// A window with more than this many times the expected heartbeats is a flood.
pub const FLOOD_FACTOR: u32 = 4;

/// What to do with one valid heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeartbeatVerdict {
    /// Record it and forward it.
    Accept,
    /// Too soon after the last one: drop without penalty.
    Ignore,
    /// Too soon, and the window just crossed the flood bound: drop and strike the author.
    Flood,
}

/// One author's rate-limit state.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatGate {
    last_accepted: Option<Instant>,
    /// An early install report was accepted since the last on-time heartbeat.
    early_used: bool,
    window_start: Option<Instant>,
    window_count: u32,
    window_struck: bool,
}

impl HeartbeatGate {
    /// The verdict on a heartbeat arriving at `now`; `new_version` says whether it announces a
    /// newer installed snapshot version than the last accepted heartbeat of this author.
    pub(crate) fn check(
        &mut self,
        now: Instant,
        interval: Duration,
        new_version: bool,
    ) -> HeartbeatVerdict {
        let flood = self.count(now, interval);
        let on_time = self
            .last_accepted
            .is_none_or(|t| now.saturating_duration_since(t) >= interval / 2);
        if on_time {
            self.last_accepted = Some(now);
            self.early_used = false;
            return HeartbeatVerdict::Accept;
        }
        if new_version && !self.early_used {
            self.last_accepted = Some(now);
            self.early_used = true;
            return HeartbeatVerdict::Accept;
        }
        if flood {
            HeartbeatVerdict::Flood
        } else {
            HeartbeatVerdict::Ignore
        }
    }

    /// Counts an arrival in the current window (a tumbling window started by the first
    /// arrival after the previous one ended); true the first time the window exceeds the
    /// flood bound.
    fn count(&mut self, now: Instant, interval: Duration) -> bool {
        let window = interval * FLOOD_WINDOW_INTERVALS;
        let expired = self
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= window);
        if expired {
            self.window_start = Some(now);
            self.window_count = 0;
            self.window_struck = false;
        }
        self.window_count = self.window_count.saturating_add(1);
        if !self.window_struck && self.window_count > FLOOD_FACTOR * FLOOD_WINDOW_INTERVALS {
            self.window_struck = true;
            return true;
        }
        false
    }
}

/// The sending side's half of the rule: when this node's install report may go out.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatPacer {
    last_sent: Option<Instant>,
    /// When the installed version last changed (heartbeats report its age).
    installed_at: Option<Instant>,
    /// An install is waiting to be reported.
    pending: bool,
}

impl HeartbeatPacer {
    /// A snapshot was installed at `now`: true to publish a heartbeat now, false when it is
    /// held until [`due`](Self::due) (`interval` is this node's own heartbeat interval).
    pub(crate) fn install(&mut self, now: Instant, interval: Duration) -> bool {
        self.installed_at = Some(now);
        let free = self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= interval / 2);
        self.pending = !free;
        free
    }

    /// When a held install report is due, if one is held.
    pub(crate) fn due(&self, interval: Duration) -> Option<Instant> {
        match (self.pending, self.last_sent) {
            (true, Some(t)) => Some(t + interval / 2),
            _ => None,
        }
    }

    /// How long ago the installed version changed, as of `now` (a heartbeat's
    /// `install_age_ms`).
    pub(crate) fn install_age(&self, now: Instant) -> Option<Duration> {
        self.installed_at.map(|t| now.saturating_duration_since(t))
    }

    /// A heartbeat (tick or report) was published at `now`: it carries the latest version.
    pub(crate) fn sent(&mut self, now: Instant) {
        self.last_sent = Some(now);
        self.pending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HeartbeatVerdict::*;

    const T: Duration = Duration::from_millis(1000);

    #[test]
    fn one_heartbeat_per_half_interval() {
        let t0 = Instant::now();
        let mut g = HeartbeatGate::default();
        assert_eq!(g.check(t0, T, false), Accept);
        assert_eq!(g.check(t0 + T / 4, T, false), Ignore);
        assert_eq!(
            g.check(t0 + T / 2 - Duration::from_millis(1), T, false),
            Ignore
        );
        assert_eq!(g.check(t0 + T / 2, T, false), Accept);
        // The gap counts from the last *accepted* heartbeat.
        assert_eq!(g.check(t0 + T / 2 + T / 4, T, false), Ignore);
        assert_eq!(g.check(t0 + T, T, false), Accept);
    }

    #[test]
    fn an_honest_node_is_never_dropped_or_struck() {
        let t0 = Instant::now();
        let mut g = HeartbeatGate::default();
        // One per interval with ±30 % jitter for a long time.
        for k in 0..1000u32 {
            let jitter = if k % 2 == 0 {
                T * 3 / 10
            } else {
                Duration::ZERO
            };
            let t = t0 + T * k + jitter;
            assert_eq!(g.check(t, T, false), Accept, "heartbeat {k}");
        }
    }

    #[test]
    fn an_install_report_may_come_early_once() {
        let t0 = Instant::now();
        let mut g = HeartbeatGate::default();
        assert_eq!(g.check(t0, T, false), Accept);
        assert_eq!(g.check(t0 + T / 10, T, true), Accept);
        // A second early "new version" before an on-time heartbeat is ignored.
        assert_eq!(g.check(t0 + T / 5, T, true), Ignore);
        // The next regular one is measured from the install report.
        assert_eq!(g.check(t0 + T / 2, T, false), Ignore);
        assert_eq!(g.check(t0 + T / 10 + T / 2, T, false), Accept);
        assert_eq!(g.check(t0 + T / 10 + T / 2 + T / 10, T, true), Accept);
    }

    #[test]
    fn a_flood_earns_one_strike_per_window() {
        let t0 = Instant::now();
        let mut g = HeartbeatGate::default();
        let bound = FLOOD_FACTOR * FLOOD_WINDOW_INTERVALS;
        let mut floods = 0;
        let mut accepted = 0;
        // 1000 heartbeats within the first interval.
        for k in 0..1000u32 {
            match g.check(t0 + Duration::from_micros(u64::from(k)), T, false) {
                Accept => accepted += 1,
                Ignore => {}
                Flood => {
                    floods += 1;
                    assert_eq!(k, bound, "the strike comes with arrival {}", bound + 1);
                }
            }
        }
        assert_eq!((accepted, floods), (1, 1));
        // Next window: another flood, another single strike.
        let t1 = t0 + T * FLOOD_WINDOW_INTERVALS;
        let floods: usize = (0..1000u32)
            .filter(|k| g.check(t1 + Duration::from_micros(u64::from(*k)), T, false) == Flood)
            .count();
        assert_eq!(floods, 1);
    }

    #[test]
    fn four_times_the_rate_is_not_yet_a_flood() {
        let t0 = Instant::now();
        let mut g = HeartbeatGate::default();
        let per_window = FLOOD_FACTOR * FLOOD_WINDOW_INTERVALS;
        let step = T * FLOOD_WINDOW_INTERVALS / per_window;
        for k in 0..per_window * 5 {
            assert_ne!(g.check(t0 + step * k, T, false), Flood, "arrival {k}");
        }
    }

    /// The sending node of `installs` (instants of installs) with ticks every `T`: the
    /// instants it publishes at, paced or (the old rule) every install at once.
    fn sends(installs: &[Instant], t0: Instant, end: Instant, paced: bool) -> Vec<(Instant, bool)> {
        let mut p = HeartbeatPacer::default();
        let mut out = Vec::new();
        let mut next_tick = t0;
        let mut i = 0;
        loop {
            // The earliest of: the next tick, a held report falling due, the next install.
            let due = p.due(T);
            let install = installs.get(i).copied();
            let now = [Some(next_tick), due, install]
                .into_iter()
                .flatten()
                .min()
                .unwrap();
            if now > end {
                return out;
            }
            if Some(now) == install {
                i += 1;
                if !paced || p.install(now, T) {
                    p.sent(now);
                    out.push((now, true));
                }
            } else if Some(now) == due {
                p.sent(now);
                out.push((now, true));
            } else {
                p.sent(now);
                out.push((now, false));
                next_tick = now + T;
            }
        }
    }

    #[test]
    fn a_paced_fast_installer_is_never_a_flood_and_reports_within_half_an_interval() {
        let t0 = Instant::now();
        let end = t0 + T * 200;
        // A version every 90 ms (the demo learner on one H200), then bursts and pauses.
        let mut installs: Vec<Instant> = (1..2000u32).map(|k| t0 + T * k / 11).collect();
        installs.extend((0..50u32).map(|k| t0 + T * 190 + Duration::from_millis(u64::from(k))));
        let out = sends(&installs, t0, end, true);
        let mut g = HeartbeatGate::default();
        for (k, &(at, report)) in out.iter().enumerate() {
            assert_ne!(
                g.check(at, T, report),
                Flood,
                "heartbeat {k} at {:?}",
                at - t0
            );
        }
        // Every install is covered by a heartbeat sent no later than T/2 after it.
        for &i in &installs {
            assert!(
                out.iter().any(|&(at, _)| at >= i && at <= i + T / 2),
                "install at {:?} reported late",
                i - t0
            );
        }
        // At most two heartbeats in any interval.
        for w in out.windows(3) {
            assert!(w[2].0 - w[0].0 >= T / 2, "three heartbeats within T/2");
        }
    }

    #[test]
    fn reporting_every_install_at_once_is_struck_as_a_flood() {
        // The rule the pacer replaced: the receivers' gate strikes it (what banned honest
        // GPU workers in the demo).
        let t0 = Instant::now();
        let installs: Vec<Instant> = (1..200u32).map(|k| t0 + T * k / 11).collect();
        let out = sends(&installs, t0, t0 + T * 18, false);
        let mut g = HeartbeatGate::default();
        let floods = out
            .iter()
            .filter(|&&(at, r)| g.check(at, T, r) == Flood)
            .count();
        assert!(floods >= 2, "{floods} flood windows");
    }
}
