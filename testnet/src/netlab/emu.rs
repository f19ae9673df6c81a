//! The link emulator's pure part: one direction of one emulated link as a FIFO of packets,
//! each with the time it may leave. It decides, per packet, whether the packet is lost (a
//! Bernoulli draw with probability `loss`), when it leaves (one-way `delay` plus a uniform
//! jitter draw in `[-jitter, +jitter]`, after the link has serialised it at `rate_bps` when a
//! rate is set) and whether the queue is full (tail drop past `queue_limit_bytes`).
//!
//! Packets never overtake each other on one link direction: a packet's release time is at
//! least its predecessor's. `netem` reorders under jitter; TCP treats reordering as loss, which
//! would turn a jitter setting into an unstated loss setting, so this emulator does not.
//!
//! Owns no I/O, no clock and no threads: time comes in as nanoseconds since an arbitrary
//! origin and randomness from a seeded RNG, so a run is reproducible and tested without
//! sockets. The forwarder that moves packets between TUN devices is [`super::tun`].

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What one link direction does to the packets that cross it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// One-way delay added to every packet.
    pub delay: Duration,
    /// Half-width of the uniform jitter added to the delay (clamped so that no delay is < 0).
    pub jitter: Duration,
    /// Probability in `[0, 1]` that a packet is dropped.
    pub loss: f64,
    /// Serialisation rate in bit/s (`None`: unlimited; rate caps are usually `tbf`'s or the
    /// nodes' own).
    pub rate_bps: Option<f64>,
    /// Bytes the direction may hold in flight before it drops new packets (tail drop).
    pub queue_limit_bytes: usize,
}

/// The bytes a link direction holds by default: 16 MiB, several times the bandwidth-delay
/// product of a 100 Mbit/s link at 300 ms (3.75 MB), so that the limit is never what a
/// scenario measures unless it asks for a small queue.
pub const DEFAULT_QUEUE_BYTES: usize = 16 << 20;

impl LinkParams {
    /// A link that forwards everything at once.
    pub fn transparent() -> LinkParams {
        LinkParams {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.0,
            rate_bps: None,
            queue_limit_bytes: DEFAULT_QUEUE_BYTES,
        }
    }

    /// The parameters of each link direction of a star in which every packet between two
    /// hosts crosses two emulated link directions (the sender's uplink and the receiver's
    /// downlink), so that host-to-host paths see `rtt_ms` round trip, a per-direction path
    /// loss of `loss_pct` % and a one-way jitter of up to ±`jitter_ms`:
    ///
    /// - delay per link direction = RTT / 4 (four crossings per round trip);
    /// - loss per link direction p with (1 − p)² = 1 − P, i.e. p = 1 − √(1 − P), so a packet
    ///   survives the path with probability 1 − P as it would on one `netem loss P` link;
    /// - jitter per link direction ±J/2 (two draws add up to at most ±J).
    pub fn per_star_link(rtt_ms: f64, loss_pct: f64, jitter_ms: f64) -> LinkParams {
        let p = (loss_pct / 100.0).clamp(0.0, 1.0);
        LinkParams {
            delay: Duration::from_secs_f64((rtt_ms / 4.0).max(0.0) / 1e3),
            jitter: Duration::from_secs_f64((jitter_ms / 2.0).max(0.0) / 1e3),
            loss: 1.0 - (1.0 - p).sqrt(),
            ..LinkParams::transparent()
        }
    }
}

/// What happened to an offered packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued; it leaves at this time (ns).
    Queued(u64),
    /// Dropped by the loss draw.
    Lost,
    /// Dropped because the queue was full.
    Overflow,
}

/// Counters of one link direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub forwarded: u64,
    pub lost: u64,
    pub overflow: u64,
    pub bytes: u64,
    /// Packets the kernel dropped at a TUN device's queue because the forwarder had not read
    /// them yet (the devices' `tx_dropped`): loss the emulator did not draw, caused by the
    /// host (a forwarder starved of CPU). Filled in by the topology, which owns the devices;
    /// a scenario whose figure is not small against `lost` measured the host, not the path.
    pub host_dropped: u64,
}

impl LinkStats {
    /// The scenarios' `emulator_packets` object.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({"forwarded": self.forwarded, "lost": self.lost,
            "overflow": self.overflow, "bytes": self.bytes, "host_dropped": self.host_dropped})
    }

    pub fn add(&mut self, o: &LinkStats) {
        self.forwarded += o.forwarded;
        self.lost += o.lost;
        self.overflow += o.overflow;
        self.bytes += o.bytes;
        self.host_dropped += o.host_dropped;
    }
}

/// One direction of an emulated link.
pub struct LinkQueue {
    params: LinkParams,
    rng: StdRng,
    queue: VecDeque<(u64, Vec<u8>)>,
    queued_bytes: usize,
    /// Release time of the last queued packet (FIFO: no later packet leaves earlier).
    last_release: u64,
    /// When the serialiser is free again (rate-limited links).
    busy_until: u64,
    pub stats: LinkStats,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LinkQueue {
    /// A link direction whose random draws come from `seed`.
    pub fn new(params: LinkParams, seed: u64) -> LinkQueue {
        LinkQueue {
            params,
            rng: StdRng::seed_from_u64(seed),
            queue: VecDeque::new(),
            queued_bytes: 0,
            last_release: 0,
            busy_until: 0,
            stats: LinkStats::default(),
        }
    }

    /// Offers a packet that arrived at `now` (ns).
    pub fn offer(&mut self, now: u64, packet: Vec<u8>) -> Offer {
        // The loss draw comes first and always happens, so that the sequence of verdicts
        // depends on the seed and the packet order only.
        if self.params.loss > 0.0 && self.rng.gen_bool(self.params.loss.min(1.0)) {
            self.stats.lost += 1;
            return Offer::Lost;
        }
        if self.queued_bytes + packet.len() > self.params.queue_limit_bytes {
            self.stats.overflow += 1;
            return Offer::Overflow;
        }
        let mut sent = now;
        if let Some(rate) = self.params.rate_bps.filter(|r| *r > 0.0) {
            let tx = (packet.len() as f64 * 8.0 / rate * 1e9) as u64;
            self.busy_until = self.busy_until.max(now) + tx;
            sent = self.busy_until;
        }
        let delay = ns(self.params.delay) as i128;
        let j = ns(self.params.jitter) as i128;
        let jitter = if j > 0 { self.rng.gen_range(-j..=j) } else { 0 };
        let release = (sent as i128 + (delay + jitter).max(0)) as u64;
        let release = release.max(self.last_release);
        self.last_release = release;
        self.queued_bytes += packet.len();
        self.queue.push_back((release, packet));
        Offer::Queued(release)
    }

    /// When the next packet may leave (ns), if any is queued.
    pub fn next_release(&self) -> Option<u64> {
        self.queue.front().map(|(t, _)| *t)
    }

    /// The next packet whose release time is ≤ `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Vec<u8>> {
        if self.next_release()? > now {
            return None;
        }
        let (_, p) = self.queue.pop_front()?;
        self.queued_bytes -= p.len();
        self.stats.forwarded += 1;
        self.stats.bytes += p.len() as u64;
        Some(p)
    }

    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn params(delay_ms: u64, jitter_ms: u64, loss: f64) -> LinkParams {
        LinkParams {
            delay: Duration::from_millis(delay_ms),
            jitter: Duration::from_millis(jitter_ms),
            loss,
            ..LinkParams::transparent()
        }
    }

    #[test]
    fn packets_leave_after_the_delay_in_order() {
        let mut q = LinkQueue::new(params(25, 0, 0.0), 1);
        assert_eq!(q.offer(0, vec![1]), Offer::Queued(25 * MS));
        assert_eq!(q.offer(MS, vec![2]), Offer::Queued(26 * MS));
        assert_eq!(q.pop_due(25 * MS - 1), None);
        assert_eq!(q.pop_due(25 * MS), Some(vec![1]));
        assert_eq!(q.pop_due(25 * MS), None);
        assert_eq!(q.next_release(), Some(26 * MS));
        assert_eq!(q.pop_due(100 * MS), Some(vec![2]));
        assert_eq!(q.stats.forwarded, 2);
        assert_eq!(q.stats.bytes, 2);
    }

    #[test]
    fn loss_matches_its_probability_and_is_reproducible_from_the_seed() {
        let run = |seed| {
            let mut q = LinkQueue::new(params(0, 0, 0.05), seed);
            (0..100_000u64)
                .map(|i| q.offer(i, vec![0]) == Offer::Lost)
                .collect::<Vec<bool>>()
        };
        let a = run(7);
        let lost = a.iter().filter(|l| **l).count();
        // 5 % of 100 000 = 5000, σ ≈ 69: ±500 is over 7σ.
        assert!((4500..=5500).contains(&lost), "{lost}");
        assert_eq!(a, run(7), "same seed, same drops");
        assert_ne!(a, run(8), "another seed, other drops");
        let mut none = LinkQueue::new(params(0, 0, 0.0), 7);
        assert!((0..10_000).all(|i| none.offer(i, vec![0]) != Offer::Lost));
    }

    #[test]
    fn jitter_stays_in_its_range_and_never_reorders() {
        // Sparse packets (one per 20 ms, wider than the ±4 ms jitter): each delay is its own
        // draw, within 10 ± 4 ms, reaching both edges.
        let mut q = LinkQueue::new(params(10, 4, 0.0), 3);
        let mut spread = (u64::MAX, 0u64);
        for i in 0..2_000u64 {
            let now = i * 20 * MS;
            let Offer::Queued(t) = q.offer(now, vec![0]) else {
                panic!("no loss configured")
            };
            let d = t - now;
            assert!((6 * MS..=14 * MS).contains(&d), "{d}");
            spread = (spread.0.min(d), spread.1.max(d));
        }
        assert!(spread.0 < 7 * MS && spread.1 > 13 * MS, "{spread:?}");
        // Dense packets (one per 0.1 ms): a late draw holds the packets behind it back
        // instead of letting them overtake it.
        let mut q = LinkQueue::new(params(10, 4, 0.0), 4);
        let mut last = 0;
        for i in 0..10_000u64 {
            let now = i * 100_000;
            let Offer::Queued(t) = q.offer(now, vec![0]) else {
                panic!("no loss configured")
            };
            assert!(t >= last, "packet {i} overtook its predecessor");
            assert!(t >= now + 6 * MS);
            last = t;
        }
    }

    #[test]
    fn a_rate_serialises_packets_and_a_full_queue_drops() {
        // 8 Mbit/s: a 1000-byte packet takes 1 ms on the wire.
        let mut q = LinkQueue::new(
            LinkParams {
                rate_bps: Some(8e6),
                queue_limit_bytes: 2500,
                ..params(5, 0, 0.0)
            },
            1,
        );
        assert_eq!(q.offer(0, vec![0; 1000]), Offer::Queued(6 * MS));
        assert_eq!(q.offer(0, vec![0; 1000]), Offer::Queued(7 * MS));
        assert_eq!(q.offer(0, vec![0; 1000]), Offer::Overflow);
        assert_eq!(q.stats.overflow, 1);
        assert_eq!(q.queued(), 2);
        assert!(q.pop_due(6 * MS).is_some());
        // Room again once one has left.
        assert_eq!(q.offer(6 * MS, vec![0; 1000]), Offer::Queued(12 * MS));
    }

    #[test]
    fn star_links_split_the_path_budget_in_two_crossings_each_way() {
        let p = LinkParams::per_star_link(100.0, 0.5, 10.0);
        assert_eq!(p.delay, Duration::from_millis(25));
        assert_eq!(p.jitter, Duration::from_millis(5));
        // Two crossings lose 0.5 % together.
        let survive = (1.0 - p.loss) * (1.0 - p.loss);
        assert!((survive - 0.995).abs() < 1e-12, "{survive}");
        assert_eq!(LinkParams::per_star_link(0.0, 0.0, 0.0).loss, 0.0);
    }
}
