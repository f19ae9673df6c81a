//! Application-level bandwidth caps for the bulk streams (`network.uplink_mbps`,
//! `network.downlink_mbps`, the learner's budget `B0`; see `docs/protocol.md` and the ECHO-2
//! paper).
//!
//! Owns: the token-bucket arithmetic ([`Bucket`], pure, clock injected) and its async wrapper
//! ([`TokenBucket`]) that the chunk-stream and chunk-fetch copy loops await before writing (or
//! after reading) each frame; Mbit/s are converted with `control::units`, the one home of that
//! rule. Must not touch: yamux or any transport option — yamux keeps its auto-tuned window
//! (see `docs/protocol.md`, "Transports"); throttling lives here, in the application, so a
//! slow reader simply stops draining the stream and yamux back-pressure does the rest.
//!
//! Rule (a "debt" bucket): tokens refill at `rate` bytes/s up to `burst`; taking `n` bytes
//! always succeeds and may drive the balance negative, and the caller then waits until the
//! balance would be back at zero. This lets a frame larger than the burst (a 1 MiB chunk under
//! a 64 KiB burst) pass without deadlock, while the long-run rate still equals `rate`:
//! after taking `N` bytes in total starting from a full bucket, the last wait ends at
//! `(N − burst) / rate` seconds at the earliest.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::units::mbps_to_bytes_per_s;

/// The pure token-bucket state; every method takes the current instant.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket refilling at `rate_bytes_per_s` up to `burst_bytes`.
    pub fn new(rate_bytes_per_s: f64, burst_bytes: f64, now: Instant) -> Self {
        let burst = burst_bytes.max(1.0);
        Bucket {
            rate: rate_bytes_per_s.max(1.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes `n` bytes; returns how long the caller must wait before sending them (zero while
    /// the balance stays non-negative).
    pub fn take(&mut self, n: u64, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= n as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Current balance in bytes (negative while in debt).
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }
}

/// A shared async token bucket; `None` rate means unlimited. Cheap to clone (one bucket shared
/// by every stream of a direction, so the cap is per node, not per stream).
#[derive(Debug, Clone, Default)]
pub struct TokenBucket {
    inner: Option<Arc<Mutex<Bucket>>>,
}

impl TokenBucket {
    /// Burst used by [`TokenBucket::from_mbps`]: 50 ms of traffic, at least 64 KiB.
    pub fn default_burst(rate_bytes_per_s: f64) -> f64 {
        (rate_bytes_per_s * 0.05).max(64.0 * 1024.0)
    }

    /// Unlimited.
    pub fn unlimited() -> Self {
        TokenBucket { inner: None }
    }

    /// A cap of `mbps` Mbit/s; `0` (or not finite / negative) means unlimited.
    pub fn from_mbps(mbps: f64) -> Self {
        if !(mbps.is_finite() && mbps > 0.0) {
            return Self::unlimited();
        }
        let rate = mbps_to_bytes_per_s(mbps);
        Self::new(rate, Self::default_burst(rate))
    }

    pub fn new(rate_bytes_per_s: f64, burst_bytes: f64) -> Self {
        TokenBucket {
            inner: Some(Arc::new(Mutex::new(Bucket::new(
                rate_bytes_per_s,
                burst_bytes,
                Instant::now(),
            )))),
        }
    }

    pub fn is_limited(&self) -> bool {
        self.inner.is_some()
    }

    /// Waits until `n` more bytes may pass.
    pub async fn acquire(&self, n: u64) {
        let Some(b) = &self.inner else { return };
        let wait = b
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_the_burst_nothing_waits() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, 500.0, t0);
        assert_eq!(b.take(200, t0), Duration::ZERO);
        assert_eq!(b.take(300, t0), Duration::ZERO);
        assert!(b.tokens(t0).abs() < 1e-9);
    }

    #[test]
    fn debt_is_repaid_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, 500.0, t0);
        // 1500 bytes at once: 1000 bytes of debt → 1 s wait.
        let w = b.take(1500, t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-9, "{w:?}");
        // Half a second later the debt is 500 bytes; another 500 → 1 s.
        let w = b.take(500, t0 + Duration::from_millis(500));
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn refill_stops_at_the_burst_and_long_run_rate_holds() {
        let t0 = Instant::now();
        let mut b = Bucket::new(100.0, 50.0, t0);
        // A long idle time refills only up to the burst.
        assert!((b.tokens(t0 + Duration::from_secs(100)) - 50.0).abs() < 1e-9);
        // Sending N = 100 frames × 100 bytes, each after the previous wait: the last wait
        // ends at (N − burst)/rate = (10 000 − 50)/100 = 99.5 s.
        let mut now = t0 + Duration::from_secs(100);
        let start = now;
        for _ in 0..100 {
            now += b.take(100, now);
        }
        let elapsed = now.duration_since(start).as_secs_f64();
        assert!((elapsed - 99.5).abs() < 1e-6, "{elapsed}");
    }

    #[test]
    fn a_clock_going_backwards_does_not_mint_tokens() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = Bucket::new(100.0, 100.0, t0);
        b.take(100, t0);
        assert!(b.tokens(t0 - Duration::from_secs(5)).abs() < 1e-9);
    }

    #[test]
    fn from_mbps_limits_only_positive_finite_rates() {
        assert!(!TokenBucket::from_mbps(0.0).is_limited());
        assert!(!TokenBucket::from_mbps(f64::NAN).is_limited());
        assert!(TokenBucket::from_mbps(300.0).is_limited());
    }
}
