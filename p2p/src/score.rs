//! ECHO-2 peer scores (ECHO-2 paper, App. C.3; `docs/protocol.md`), as pure functions plus the per-peer
//! statistics that feed them.
//!
//! ```text
//! Score     = Decay · (0.5·Speed + 0.35·Success + 0.15·Stability)
//! Speed     = 100 · (log10(avg bit/s) − 3) / 5, clamped to [0, 100]   (100 Mbit/s → 100)
//! Success   = 100 · success_rate
//! Stability = 0 if consecutive failures > 3, else 100 · min(successes / 10, 1)
//! Decay     = 1 − min(elapsed_s / 600, 0.3)
//! ```
//!
//! Inputs (documented in `docs/protocol.md`): transfer events (bytes, duration, success) from the
//! bulk protocols, and strikes (`Client::strike`: a malformed or invalid message, bad data
//! found by a role), each one failed event. Heartbeats are *not* successes: a heartbeat costs
//! its sender nothing, so counting it would let a peer erase its failures by heartbeating
//! faster. `elapsed` is the time since the last event.
//!
//! A peer with no event yet is *neutral*, not zero: Speed 0 and Stability 0 (no transfer has
//! shown either), but Success 50 ([`NEUTRAL_SUCCESS_RATE`], the mean of a uniform prior on the
//! success rate) and Decay 1, so Score = 0.35 · 50 = 17.5. The paper's formula leaves the
//! success rate of a peer without events undefined; reading it as 0 would rank a newcomer with
//! a peer whose every transfer failed, and as 1 would rank it above a peer with a proven
//! record of some failures. With the prior, one failed transfer drops a newcomer to 0 and one
//! successful transfer lifts it above 17.5.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Speed component from the average transfer rate in bit/s.
pub fn speed_component(avg_bits_per_s: f64) -> f64 {
    if avg_bits_per_s.is_nan() || avg_bits_per_s <= 0.0 || !avg_bits_per_s.is_finite() {
        return 0.0;
    }
    (100.0 * (avg_bits_per_s.log10() - 3.0) / 5.0).clamp(0.0, 100.0)
}

/// The success rate of a peer with no transfer and no strike yet (see the module doc).
pub const NEUTRAL_SUCCESS_RATE: f64 = 0.5;

/// Success component from the success rate in [0, 1].
pub fn success_component(success_rate: f64) -> f64 {
    100.0 * success_rate.clamp(0.0, 1.0)
}

/// Stability component from the success count and the current run of consecutive failures.
pub fn stability_component(successes: u64, consecutive_failures: u32) -> f64 {
    if consecutive_failures > 3 {
        0.0
    } else {
        100.0 * (successes as f64 / 10.0).min(1.0)
    }
}

/// Decay factor from the seconds elapsed since the last measurement.
pub fn decay_component(elapsed_s: f64) -> f64 {
    1.0 - (elapsed_s.max(0.0) / 600.0).min(0.3)
}

/// The combined score.
pub fn combined_score(speed: f64, success: f64, stability: f64, decay: f64) -> f64 {
    decay * (0.5 * speed + 0.35 * success + 0.15 * stability)
}

/// One finished (or failed) bulk transfer with a peer, reported by the transfer protocols.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferEvent {
    /// Payload bytes moved.
    pub bytes: u64,
    /// Wall time of the transfer.
    pub duration: Duration,
    /// Whether it completed and verified.
    pub success: bool,
}

/// A peer's score and its components at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoreComponents {
    pub score: f64,
    pub speed: f64,
    pub success: f64,
    pub stability: f64,
    pub decay: f64,
    /// Average transfer rate in bit/s over successful transfers (0 when none).
    pub avg_speed_bps: f64,
    pub successes: u64,
    pub failures: u64,
    pub consecutive_failures: u32,
}

/// Running statistics of one peer.
#[derive(Debug, Clone, Default)]
pub struct PeerStats {
    bytes: u64,
    transfer_secs: f64,
    successes: u64,
    failures: u64,
    consecutive_failures: u32,
    last_event: Option<Instant>,
}

impl PeerStats {
    /// A transfer finished (successfully or not).
    pub fn record_transfer(&mut self, ev: &TransferEvent, now: Instant) {
        if ev.success {
            self.bytes = self.bytes.saturating_add(ev.bytes);
            self.transfer_secs += ev.duration.as_secs_f64();
            self.record_success(now);
        } else {
            self.record_failure(now);
        }
    }

    /// A successful transfer whose bytes are not counted in the average rate (e.g. one
    /// without payload). Never a heartbeat: see the module doc.
    pub fn record_success(&mut self, now: Instant) {
        self.successes += 1;
        self.consecutive_failures = 0;
        self.last_event = Some(now);
    }

    /// A failed interaction (failed transfer, malformed or invalid message).
    pub fn record_failure(&mut self, now: Instant) {
        self.failures += 1;
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.last_event = Some(now);
    }

    /// Average rate of successful transfers in bit/s.
    pub fn avg_speed_bps(&self) -> f64 {
        if self.transfer_secs > 0.0 {
            self.bytes as f64 * 8.0 / self.transfer_secs
        } else {
            0.0
        }
    }

    /// successes / (successes + failures); [`NEUTRAL_SUCCESS_RATE`] before any event.
    pub fn success_rate(&self) -> f64 {
        let n = self.successes + self.failures;
        if n == 0 {
            NEUTRAL_SUCCESS_RATE
        } else {
            self.successes as f64 / n as f64
        }
    }

    /// The score at `now`.
    pub fn components(&self, now: Instant) -> ScoreComponents {
        let avg = self.avg_speed_bps();
        let speed = speed_component(avg);
        let success = success_component(self.success_rate());
        let stability = stability_component(self.successes, self.consecutive_failures);
        let elapsed = self
            .last_event
            .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
        let decay = decay_component(elapsed);
        ScoreComponents {
            score: combined_score(speed, success, stability, decay),
            speed,
            success,
            stability,
            decay,
            avg_speed_bps: avg,
            successes: self.successes,
            failures: self.failures,
            consecutive_failures: self.consecutive_failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn speed_matches_hand_computed_values() {
        assert!(close(speed_component(100e6), 100.0)); // log10(1e8) = 8 → (8-3)/5 = 1
        assert!(close(speed_component(1e6), 60.0)); // (6-3)/5 = 0.6
        assert!(close(speed_component(10e6), 80.0));
        assert!(close(speed_component(1e3), 0.0));
        assert!(close(speed_component(1e9), 100.0)); // clamped
        assert!(close(speed_component(10.0), 0.0)); // clamped below
        assert!(close(speed_component(0.0), 0.0));
        assert!(close(speed_component(f64::NAN), 0.0));
    }

    #[test]
    fn success_stability_decay() {
        assert!(close(success_component(0.8), 80.0));
        assert!(close(stability_component(20, 4), 0.0)); // 4 consecutive failures
        assert!(close(stability_component(20, 3), 100.0)); // 3 is still tolerated
        assert!(close(stability_component(5, 0), 50.0));
        assert!(close(decay_component(300.0), 0.7)); // min(0.5, 0.3)
        assert!(close(decay_component(60.0), 0.9));
        assert!(close(decay_component(0.0), 1.0));
        assert!(close(decay_component(1e9), 0.7));
    }

    #[test]
    fn combined_score_weights() {
        assert!(close(combined_score(100.0, 100.0, 100.0, 1.0), 100.0));
        // 0.7 · (0.5·60 + 0.35·80 + 0.15·50) = 0.7 · 65.5 = 45.85
        assert!(close(combined_score(60.0, 80.0, 50.0, 0.7), 45.85));
    }

    #[test]
    fn stats_feed_the_formula() {
        let t0 = Instant::now();
        let mut s = PeerStats::default();
        // Neutral before any event: Success 50 only.
        let c = s.components(t0);
        assert!(close(c.score, 17.5) && close(c.success, 50.0), "{c:?}");
        assert!(close(c.speed, 0.0) && close(c.stability, 0.0) && close(c.decay, 1.0));
        // 10 transfers of 1.25 MB in 1 s each = 10 Mbit/s → Speed 80.
        for _ in 0..10 {
            s.record_transfer(
                &TransferEvent {
                    bytes: 1_250_000,
                    duration: Duration::from_secs(1),
                    success: true,
                },
                t0,
            );
        }
        let c = s.components(t0);
        assert!(
            close(c.speed, 80.0)
                && close(c.success, 100.0)
                && close(c.stability, 100.0)
                && close(c.decay, 1.0)
        );
        assert!(close(c.score, 0.5 * 80.0 + 35.0 + 15.0));
        // Four failures in a row: Stability 0, Success 10/14.
        for _ in 0..4 {
            s.record_failure(t0);
        }
        let c = s.components(t0 + Duration::from_secs(300));
        assert!(close(c.stability, 0.0));
        assert!(close(c.success, 100.0 * 10.0 / 14.0));
        assert!(close(c.decay, 0.7));
        assert!(
            close(c.speed, 80.0),
            "failed transfers do not change the average rate"
        );
        assert!(close(c.score, 0.7 * (40.0 + 0.35 * 100.0 * 10.0 / 14.0)));
        // A success resets the run of failures.
        s.record_success(t0);
        assert!(close(s.components(t0).stability, 100.0));
    }

    #[test]
    fn a_newcomer_ranks_between_a_failing_peer_and_a_proven_one() {
        let t0 = Instant::now();
        let fresh = PeerStats::default().components(t0).score;
        let mut failed = PeerStats::default();
        failed.record_failure(t0);
        let mut proven = PeerStats::default();
        proven.record_transfer(
            &TransferEvent {
                bytes: 1,
                duration: Duration::from_secs(1),
                success: true,
            },
            t0,
        );
        let (failed, proven) = (failed.components(t0).score, proven.components(t0).score);
        assert!(
            failed < fresh && fresh < proven,
            "{failed} {fresh} {proven}"
        );
        assert_eq!(failed, 0.0);
    }
}
