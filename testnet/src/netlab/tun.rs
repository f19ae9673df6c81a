//! The link emulator's I/O: a forwarder thread that moves IP packets between pairs of TUN
//! devices, each pair one emulated link (a host-side device and a hub-side device in two
//! namespaces), through the [`super::emu::LinkQueue`] of each direction. It applies at the
//! packet level, so TCP and QUIC see the same delay, jitter and loss.
//!
//! One thread serves every link of a run: it polls all devices, queues what it reads with its
//! release time, and writes every packet whose time has come to the other device of its link.
//! A packet the kernel refuses on write (the device's queue is full) counts as overflow.
//!
//! Owns the forwarding loop and its statistics. The queue rules are [`super::emu`]'s; which
//! devices exist is [`super::topo`]'s.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::emu::{LinkParams, LinkQueue, LinkStats};

/// The largest packet a TUN device hands out (its MTU may be at most 65535).
const MAX_PACKET: usize = 65_536;

/// One emulated link: packets read from `host` go to `hub` through `up`, packets read from
/// `hub` go to `host` through `down`.
pub struct TunLink {
    pub host: File,
    pub hub: File,
    pub up: LinkQueue,
    pub down: LinkQueue,
}

impl TunLink {
    /// A link whose two directions behave as `params`, seeded from `seed`.
    pub fn new(host: File, hub: File, params: LinkParams, seed: u64) -> TunLink {
        TunLink {
            host,
            hub,
            up: LinkQueue::new(params, seed.wrapping_mul(2)),
            down: LinkQueue::new(params, seed.wrapping_mul(2).wrapping_add(1)),
        }
    }
}

/// The running forwarder; stops (and returns its statistics) on [`Emulator::stop`] or drop:
/// the one stop signal of the thread is a cancellation token it checks each poll round.
pub struct Emulator {
    stop: CancellationToken,
    handle: Option<JoinHandle<std::io::Result<LinkStats>>>,
}

impl Emulator {
    /// Starts the forwarder thread over `links`.
    pub fn start(links: Vec<TunLink>) -> std::io::Result<Emulator> {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let handle = std::thread::Builder::new()
            .name("netlab-emulator".into())
            .spawn(move || forward(links, &token))?;
        Ok(Emulator {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread; returns the totals over every link direction.
    pub fn stop(&mut self) -> std::io::Result<LinkStats> {
        self.stop.cancel();
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| std::io::Error::other("the emulator thread panicked"))?,
            None => Ok(LinkStats::default()),
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Reads what `from` has (at most a burst, so that one busy device cannot starve the others)
/// into `queue`.
fn drain(from: &mut File, queue: &mut LinkQueue, now: u64, buf: &mut [u8]) -> std::io::Result<()> {
    for _ in 0..256 {
        match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                queue.offer(now, buf[..n].to_vec());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes every packet of `queue` due at `now` to `to`.
fn release(to: &mut File, queue: &mut LinkQueue, now: u64) {
    while let Some(p) = queue.pop_due(now) {
        if to.write(&p).is_err() {
            // The device refused it (queue full or the link went down): a drop, as a full
            // interface queue would drop it.
            queue.stats.overflow += 1;
        }
    }
}

fn forward(mut links: Vec<TunLink>, stop: &CancellationToken) -> std::io::Result<LinkStats> {
    let t0 = Instant::now();
    let now_ns = || u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut buf = vec![0u8; MAX_PACKET];
    while !stop.is_cancelled() {
        let now = now_ns();
        let next = links
            .iter()
            .flat_map(|l| [l.up.next_release(), l.down.next_release()])
            .flatten()
            .min();
        // Wake for the next release, and at least every 50 ms to notice `stop`.
        let wait = next.map_or(Duration::from_millis(50), |t| {
            Duration::from_nanos(t.saturating_sub(now)).min(Duration::from_millis(50))
        });
        let ready = {
            let files: Vec<&File> = links.iter().flat_map(|l| [&l.host, &l.hub]).collect();
            super::sys::poll_readable(&files, wait)?
        };
        let now = now_ns();
        for (i, l) in links.iter_mut().enumerate() {
            if ready[2 * i] {
                drain(&mut l.host, &mut l.up, now, &mut buf)?;
            }
            if ready[2 * i + 1] {
                drain(&mut l.hub, &mut l.down, now, &mut buf)?;
            }
            release(&mut l.hub, &mut l.up, now);
            release(&mut l.host, &mut l.down, now);
        }
    }
    let mut total = LinkStats::default();
    for l in &links {
        total.add(&l.up.stats);
        total.add(&l.down.stats);
    }
    Ok(total)
}
