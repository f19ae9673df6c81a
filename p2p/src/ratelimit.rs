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
//! Rule (a "debt" bucket): tokens refill at `rate` bytes/s; taking `n` bytes always succeeds
//! and may drive the balance negative, and the caller then waits until the balance would be
//! back at zero. This lets a frame larger than the burst (a 1 MiB chunk under a 64 KiB burst)
//! pass without deadlock, while the long-run rate still equals `rate`.
//!
//! How much credit the balance may hold depends on how long the bucket went unused:
//! - After an *idle* time (no take for more than [`IDLE_AFTER`]: between two snapshot
//!   versions) it holds at most `burst` (50 ms of traffic by default). So a transfer that
//!   starts from idle and takes `N` bytes in total ends `(N − burst) / rate` seconds after its
//!   start at the earliest: no transfer beats the cap by more than the burst, and a measured
//!   broadcast time stays comparable with its bound `M / B̂w + …` (ECHO-2 §4.2).
//! - After a shorter pause — a forwarder whose input stalled for a lost packet's retransmit
//!   (about one round trip) — the credit of the pause is kept, up to `burst` plus
//!   [`CATCH_UP`] of traffic. The forwarder then sends the backlog above the rate and is back
//!   on its schedule. With only the 50 ms burst every stall of its input delayed its output
//!   for good, and along a chain every hop added its own stalls: at 100 ms RTT and 0.5 %
//!   loss, 0.4–0.9 s per hop instead of the chunk time (0.1 s) at N = 8, 8 MB, 10 Mbit/s
//!   (`docs/netlab.md`, "Catch-up credit"). Either way the bytes taken since the end of an
//!   idle time never exceed `burst + rate · elapsed`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::units::mbps_to_bytes_per_s;

/// Credit a bucket may gather beyond its burst during pauses shorter than [`IDLE_AFTER`],
/// as time at the rate: a fast retransmit stalls a stream for about one round trip (50–200
/// ms on the WAN paths the testnet emulates), a tail loss's retransmit timeout for 200 ms
/// more.
pub const CATCH_UP: Duration = Duration::from_millis(250);

/// A bucket not taken from for longer than this is idle: its balance refills to the burst
/// only. Longer than any loss stall a transfer survives without its stall timeout firing, and
/// shorter than the time between two snapshot versions.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);

/// The pure token-bucket state; every method takes the current instant.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    /// Most credit held after a pause shorter than [`IDLE_AFTER`]: `burst + rate · CATCH_UP`.
    ceiling: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket refilling at `rate_bytes_per_s`, holding up to `burst_bytes` after an idle
    /// time and up to [`CATCH_UP`] more during a transfer (module docs).
    pub fn new(rate_bytes_per_s: f64, burst_bytes: f64, now: Instant) -> Self {
        let rate = rate_bytes_per_s.max(1.0);
        let burst = burst_bytes.max(1.0);
        Bucket {
            rate,
            burst,
            ceiling: burst + rate * CATCH_UP.as_secs_f64(),
            tokens: burst,
            last: now,
        }
    }

    /// The balance at `now` (no take since `self.last`). The pause that decides the cap is
    /// the time since the debt of the last take was repaid: a large frame's own wait is not
    /// idle time.
    fn balance(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let paused = dt - (-self.tokens).max(0.0) / self.rate;
        let cap = if paused > IDLE_AFTER.as_secs_f64() {
            self.burst
        } else {
            self.ceiling
        };
        (self.tokens + dt * self.rate).min(cap)
    }

    /// Takes `n` bytes; returns how long the caller must wait before sending them (zero while
    /// the balance stays non-negative).
    pub fn take(&mut self, n: u64, now: Instant) -> Duration {
        self.tokens = self.balance(now) - n as f64;
        self.last = self.last.max(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Current balance in bytes (negative while in debt); reading it changes nothing.
    pub fn tokens(&self, now: Instant) -> f64 {
        self.balance(now)
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

    /// A forwarder's output: frames of `frame` bytes, each passed on as soon as it has arrived
    /// (`arrivals`) and the bucket allows; returns when the last one was sent.
    fn forward(b: &mut Bucket, frame: u64, arrivals: &[Instant]) -> Instant {
        let mut free = arrivals[0];
        for &at in arrivals {
            let now = free.max(at);
            free = now + b.take(frame, now);
        }
        free
    }

    #[test]
    fn a_stall_shorter_than_the_catch_up_is_made_up() {
        // 1000 B/s, 100 B frames arriving at the rate (one per 100 ms), except that nothing
        // comes for 200 ms after frame 18: frames 19 and 20 then arrive at once, as after a
        // retransmit.
        let t0 = Instant::now();
        let on_time: Vec<Instant> = (0..40)
            .map(|i| t0 + Duration::from_millis(100 * i))
            .collect();
        let mut stalled = on_time.clone();
        stalled[19] = t0 + Duration::from_millis(2000);
        stalled[20] = t0 + Duration::from_millis(2000);
        let done =
            |arrivals: &[Instant]| forward(&mut Bucket::new(1000.0, 100.0, t0), 100, arrivals);
        // Not a moment later than without the stall: the pause's credit paid for the backlog.
        assert_eq!(done(&stalled), done(&on_time));
        // A stall longer than IDLE_AFTER is idle time: its credit is not kept, and the output
        // ends later by the part of the stall beyond the burst.
        let mut long = on_time.clone();
        for a in &mut long[19..] {
            *a += Duration::from_millis(1500);
        }
        assert!(done(&long) > done(&on_time) + Duration::from_millis(1300));
    }

    #[test]
    fn credit_after_an_idle_time_is_the_burst_and_during_a_transfer_the_ceiling() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, 100.0, t0);
        assert_eq!(b.take(100, t0), Duration::ZERO);
        // A 0.9 s pause keeps its credit up to burst + CATCH_UP (100 + 250 bytes).
        assert!((b.tokens(t0 + Duration::from_millis(900)) - 350.0).abs() < 1e-9);
        // Past IDLE_AFTER only the burst is left.
        assert!((b.tokens(t0 + Duration::from_millis(1100)) - 100.0).abs() < 1e-9);
        // A large frame's own wait is not idle time: 2000 bytes of debt take 2 s to repay,
        // and a pause of 0.5 s after that keeps its credit.
        let t1 = t0 + Duration::from_secs(10);
        let w = b.take(2100, t1);
        assert!((w.as_secs_f64() - 2.0).abs() < 1e-9, "{w:?}");
        assert!((b.tokens(t1 + Duration::from_millis(2500)) - 350.0).abs() < 1e-9);
    }

    #[test]
    fn from_an_idle_start_no_transfer_runs_ahead_of_the_rate_by_more_than_the_burst() {
        // Frames of varied sizes after varied pauses (a fixed pseudo-random sequence), some
        // pauses long enough to count as idle: whenever a frame may go, the bytes released
        // since the last idle time are at most burst + rate · elapsed.
        let (rate, burst) = (1000.0, 100.0);
        let t0 = Instant::now();
        let mut b = Bucket::new(rate, burst, t0);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut now, mut since, mut sent) = (t0, t0, 0.0);
        let mut transfers = 0;
        for _ in 0..2000 {
            // Each pause starts when the previous frame may go, i.e. with its debt repaid.
            let pause = Duration::from_millis(next() % 1400);
            let frame = 1 + next() % 600;
            now += pause;
            if pause > IDLE_AFTER {
                // Idle: a new transfer starts here.
                (since, sent, transfers) = (now, 0.0, transfers + 1);
            }
            let free = now + b.take(frame, now);
            sent += frame as f64;
            let allowed = burst + rate * free.duration_since(since).as_secs_f64();
            assert!(sent <= allowed + 1e-6, "{sent} > {allowed}");
            now = free;
        }
        assert!(transfers > 100, "the sequence has idle times: {transfers}");
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
