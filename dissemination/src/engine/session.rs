//! Push sessions (chunk stream version 4, `docs/protocol.md`, "Chunk stream"): after a
//! confirmed transfer a parent keeps the chunk stream to that child open and sends the next
//! version's hello on it instead of opening a new stream. Warm streams (version 5): a stream
//! to a child the plan names is opened before the version exists and carries filler first,
//! so that its window has grown by the first hello.
//!
//! Why: the receive window of a yamux stream starts at 256 KiB (the yamux specification's
//! initial credit) and grows only while the stream carries data — doubled when half of it was
//! used within two round trips. A stream per snapshot re-ramps on every broadcast, and on a
//! lossy long path it seldom gets far: every loss holds back TCP's in-order delivery for a
//! round trip, the window then is not used fast enough to double, and a window near the
//! bandwidth-delay product leaves the sender idle through each such stall. Measured in the WAN
//! lab (`docs/netlab.md`, "Push sessions": one hop, 16 MB, RTT 100 ms, 0.5 % loss, TCP with
//! BBR): 3.1–3.6 s per snapshot with a new stream each time, 1.6–2.0 s from the second
//! snapshot on with a kept stream — as fast as an experiment that made every stream start at
//! 8 MiB (a patched yamux, not shipped).
//!
//! Owns: where a push's stream comes from — the idle sessions of this node's parent side, at
//! most one per child and [`MAX_IDLE_SESSIONS`] in all, with the reuse rule, and otherwise a
//! new stream, tried again while the plan still wants the push ([`PUSH_OPEN_PATIENCE`]) —
//! and the warm-up that opens a new child's stream once the plan names it, before the
//! version's manifest ([`Disseminator::warm_sessions`]).
//! Must not touch: the transfer on a stream (`push`), the child's side
//! (`push::receive_push` waits for the next hello).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use futures::AsyncWriteExt;
use p2p::framing::write_frame;
use p2p::PeerId;
use tracing::debug;

use super::{frame_deadline, open_err, within, Disseminator};
use crate::error::{DisseminationError, Result};
use crate::wire::{self, CHUNK_STREAM};

/// Idle sessions a node keeps at most (a learner pushes to one child per chain, a worker to
/// its one child; more only after plans changed). The oldest is closed first.
pub(super) const MAX_IDLE_SESSIONS: usize = 64;

/// Default [`crate::DisseminationConfig::session_idle_timeout`]: how long a child waits for
/// the next hello on a kept session. Longer than the usual interval between snapshots, so
/// that sessions survive from one to the next; an idle session costs one stream and one task.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default [`crate::DisseminationConfig::warm_up_bytes`]: the filler a parent sends on a warm
/// stream before its first hello. A stream's yamux receive window starts at 256 KiB and
/// doubles only when half of it was used within two round trips, so it grows only while the
/// stream carries data — a first version on a new stream crawls where later versions, on the
/// window their predecessors grew, do not (`docs/netlab.md`, "Filler on warm streams": a
/// first version at 2.3–3.5 × the chain bound without filler, as fast as the later ones with
/// it). 8 MiB lets the window double five times (256 KiB → 8 MiB) while the links are idle,
/// before the first version exists; it goes through the uplink cap like any push.
pub const DEFAULT_WARM_UP_BYTES: u64 = 8 << 20;

/// How long a push keeps trying to open its chunk stream to a child it cannot reach yet
/// ([`Disseminator::open_push_stream`]). Far beyond the tens of milliseconds by which gossip
/// outruns a new child's addresses. By then a child still unreachable has long been
/// repairing from holders (after its own stall timeout), or it is gone and the learner's plan
/// repair replaces it.
const PUSH_OPEN_PATIENCE: Duration = Duration::from_secs(60);

/// The wait before try `attempt + 1` to open a push's stream: 250 ms, doubling up to 4 s.
/// Short at first because the usual cause (a child whose heartbeat has not arrived yet)
/// clears within a gossip round trip; capped so that a child that takes longer is still
/// reached soon after it is.
fn open_retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(250u64 << attempt.min(4))
}

/// Whether a session idle for `idle` is worth a hello when children close theirs after
/// `timeout`: a fifth of the timeout is left as margin, so that an honest child with the same
/// setting has not closed its end yet. A session closed anyway costs a failed hello and a
/// new stream, never a charge against the child (`push`).
pub(super) fn reusable(idle: Duration, timeout: Duration) -> bool {
    idle < timeout * 4 / 5
}

/// Whether a warm-up opens a chunk stream to a child the plan names: only to one this node
/// never pushed to (after a confirmed push the stream is kept anyway, and after a failed one
/// the push's own retries decide), with no kept session to it and no warm-up under way.
pub(super) fn wants_warm_up(kept: bool, warming: bool, pushed_before: bool) -> bool {
    !kept && !warming && !pushed_before
}

/// The idle sessions, by child (`S` is the stream; generic so that the rules are tested
/// without one).
pub(super) struct Sessions<K, S> {
    idle: HashMap<K, (S, Instant)>,
}

impl<K, S> Default for Sessions<K, S> {
    fn default() -> Self {
        Sessions {
            idle: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Copy, S> Sessions<K, S> {
    /// The idle session to `child`: `Ok` if still worth reusing at `now`, `Err` (to be
    /// closed) if too old; it leaves the table either way.
    pub(super) fn take(
        &mut self,
        child: K,
        timeout: Duration,
        now: Instant,
    ) -> Option<std::result::Result<S, S>> {
        let (s, since) = self.idle.remove(&child)?;
        Some(if reusable(now.saturating_duration_since(since), timeout) {
            Ok(s)
        } else {
            Err(s)
        })
    }

    /// Keeps `stream` as the idle session to `child` from `now`. Returns the sessions this
    /// displaces, to be closed: an older one to the same child (two pushes to it overlapped)
    /// and the oldest of all beyond [`MAX_IDLE_SESSIONS`].
    pub(super) fn put(&mut self, child: K, stream: S, now: Instant) -> Vec<S> {
        let mut out: Vec<S> = self
            .idle
            .insert(child, (stream, now))
            .map(|p| p.0)
            .into_iter()
            .collect();
        while self.idle.len() > MAX_IDLE_SESSIONS {
            let oldest = self
                .idle
                .iter()
                .min_by_key(|(_, (_, since))| *since)
                .map(|(k, _)| *k);
            match oldest.and_then(|k| self.idle.remove(&k)) {
                Some((s, _)) => out.push(s),
                None => break,
            }
        }
        out
    }

    /// Whether an idle session to `child` is kept.
    pub(super) fn has(&self, child: &K) -> bool {
        self.idle.contains_key(child)
    }

    /// Drops the idle session to `peer` (it disconnected); returns it to be closed.
    pub(super) fn forget(&mut self, peer: &K) -> Option<S> {
        self.idle.remove(peer).map(|p| p.0)
    }

    pub(super) fn len(&self) -> usize {
        self.idle.len()
    }
}

impl Disseminator {
    /// The kept chunk stream to `child`, if still worth a hello (one too old is closed).
    pub(super) fn take_session(&self, child: PeerId) -> Option<libp2p::Stream> {
        let timeout = self.inner.cfg.session_idle_timeout;
        let taken = self.lock().sessions.take(child, timeout, Instant::now())?;
        taken.map_err(|old| self.close_later(old)).ok()
    }

    /// Keeps the stream of a confirmed push to `child` for its next push.
    pub(super) fn keep_session(&self, child: PeerId, stream: libp2p::Stream) {
        let displaced = self.lock().sessions.put(child, stream, Instant::now());
        for s in displaced {
            self.close_later(s);
        }
    }

    /// How many chunk streams this node keeps open to children for their next version.
    pub fn kept_sessions(&self) -> usize {
        self.lock().sessions.len()
    }

    /// How many chunk streams this node is opening (and filling) ahead of a manifest
    /// ([`Self::warm_sessions`]).
    pub fn warming(&self) -> usize {
        self.lock().warming.len()
    }

    /// Closes the kept stream to a peer that disconnected.
    pub(super) fn forget_session(&self, peer: PeerId) {
        let gone = self.lock().sessions.forget(&peer);
        if let Some(s) = gone {
            self.close_later(s);
        }
    }

    /// Whether a push of `version` to `child` is still wanted: the current plan is for that
    /// version, names `child` as this node's child, and no newer manifest was accepted.
    fn still_pushing(&self, version: u64, child: PeerId) -> bool {
        let st = self.lock();
        st.manifest_version == Some(version)
            && st.plan.as_ref().is_some_and(|p| p.plan.version == version)
            && self.children(&st).contains(&child)
    }

    /// Whether `child` is still this node's child in a plan for `version` (the manifest may
    /// not be here yet: a warm-up).
    fn still_planned(&self, version: u64, child: PeerId) -> bool {
        let st = self.lock();
        st.plan.as_ref().is_some_and(|p| p.plan.version == version)
            && self.children(&st).contains(&child)
    }

    /// Opens the chunk stream to every child of the current plan that this node never pushed
    /// to and holds no kept session for, ahead of the version's first chunk: a dial to a
    /// worker this node never met (TCP, Noise, yamux: four round trips) and the stream's
    /// protocol negotiation then happen while the plan is known and the manifest is not, and
    /// the first push finds an open stream like any later one (`push::push` waits for a
    /// warm-up under way). Measured at N = 8, 100 ms RTT: a cold first push's hello reached
    /// its child 0.4–0.9 s after the manifest, past the child's hello wait, so the child
    /// repaired from the learner instead (`docs/netlab.md`, "Warm first round").
    pub(super) fn warm_sessions(&self) {
        if self.silent() {
            return;
        }
        let targets: Vec<(u64, PeerId)> = {
            let mut st = self.lock();
            let Some(v) = st.plan.as_ref().map(|p| p.plan.version) else {
                return;
            };
            let children = self.children(&st);
            let wanted: Vec<PeerId> = children
                .into_iter()
                .filter(|c| {
                    wants_warm_up(
                        st.sessions.has(c),
                        st.warming.contains(c),
                        st.newest_push.contains_key(c),
                    )
                })
                .collect();
            st.warming.extend(wanted.iter().copied());
            wanted.into_iter().map(|c| (v, c)).collect()
        };
        for (version, child) in targets {
            let me = self.clone();
            self.spawn(async move {
                let opened = me
                    .open_stream_while(child, || me.still_planned(version, child))
                    .await;
                let opened = match opened {
                    Ok(s) => me.send_filler(child, s, version).await,
                    Err(e) => Err(e),
                };
                match opened {
                    Ok(s) => {
                        debug!(%child, version, "chunk stream warmed ahead of the manifest");
                        me.keep_session(child, s);
                        me.count(
                            |c| &c.sessions_warmed,
                            1,
                            "dissemination_push_sessions_warmed_total",
                        );
                    }
                    Err(e) => debug!(%child, version, error = %e, "chunk stream not warmed"),
                }
                // Only now (the stream kept, or given up): a push that waited for this
                // warm-up looks again, and takes the stream its filler grew.
                me.lock().warming.remove(&child);
                me.inner.stored.send_modify(|_| {});
            });
        }
    }

    /// Sends [`crate::DisseminationConfig::warm_up_bytes`] of filler (`wire::filler_frame`,
    /// in whole frames of [`wire::MAX_HELLO_BYTES`]) on a new stream to `child`, through the
    /// uplink cap, before the stream's first hello: the child reads and drops it, and the
    /// stream's receive window grows meanwhile. Stops as soon as this node holds `version`'s
    /// manifest: the push is due then, and waits for the warm-up (a plan that came with its
    /// manifest gets no filler at all). Returns the stream, or the error that ended it (then
    /// it is not kept).
    async fn send_filler(
        &self,
        child: PeerId,
        mut s: libp2p::Stream,
        version: u64,
    ) -> Result<libp2p::Stream> {
        let io = |e| DisseminationError::Io {
            peer: child,
            source: e,
        };
        let frame = wire::filler_frame(wire::MAX_HELLO_BYTES);
        let n = frame.len() as u64;
        let frames = self.inner.cfg.warm_up_bytes.min(wire::MAX_FILLER_BYTES) / n;
        for _ in 0..frames {
            if self.lock().manifests.contains_key(&version) {
                break;
            }
            self.inner.uplink.acquire(n).await;
            let limit = frame_deadline(self.inner.cfg.read_timeout, n);
            within(limit, "sending filler", child, async {
                write_frame(&mut s, &frame).await.map_err(io)
            })
            .await?;
            self.count(|c| &c.warm_up_bytes, n, "dissemination_warm_up_bytes_total");
        }
        within(
            self.inner.cfg.read_timeout,
            "flushing filler",
            child,
            async { s.flush().await.map_err(io) },
        )
        .await?;
        Ok(s)
    }

    /// A push's kept session to `child`; when a warm-up to it is under way
    /// ([`Self::warm_sessions`]), it waits for that (at most the frame deadline) rather than
    /// dial a second stream beside it.
    pub(super) async fn session_or_warm_up(&self, child: PeerId) -> Option<libp2p::Stream> {
        let mut rx = self.inner.stored.subscribe();
        let deadline = tokio::time::Instant::now() + self.inner.cfg.read_timeout;
        loop {
            rx.borrow_and_update();
            if let Some(s) = self.take_session(child) {
                return Some(s);
            }
            if !self.lock().warming.contains(&child) {
                return None;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Opens the chunk stream of a push, trying again while the push is still wanted
    /// ([`Disseminator::still_pushing`]) after the delays of [`open_retry_delay`], for at most
    /// [`PUSH_OPEN_PATIENCE`]. A plan can name a child before this node has heard of it: plans
    /// and manifests travel by gossip, which can outrun the child's first heartbeat (its
    /// addresses) by tens of milliseconds, and a new worker's connections are still being
    /// made. A push given up on the first failure left its child — and every node after it
    /// in the chain — to repair the whole snapshot from holders: measured at N = 32, 100 ms
    /// RTT, the one chain cut this way installed 90 s after the others (`docs/netlab.md`).
    pub(super) async fn open_push_stream(
        &self,
        version: u64,
        child: PeerId,
    ) -> Result<libp2p::Stream> {
        self.open_stream_while(child, || self.still_pushing(version, child))
            .await
    }

    /// Opens a chunk stream to `child`, trying again while `wanted` holds (see
    /// [`Self::open_push_stream`]).
    async fn open_stream_while(
        &self,
        child: PeerId,
        wanted: impl Fn() -> bool,
    ) -> Result<libp2p::Stream> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            let err = match self.open_chunk_stream(child).await {
                Ok(s) => return Ok(s),
                Err(e) => e,
            };
            let wait = open_retry_delay(attempt);
            if started.elapsed() + wait > PUSH_OPEN_PATIENCE || !wanted() {
                return Err(err);
            }
            debug!(%child, error = %err, ?wait, "chunk stream not opened; trying again");
            self.count(
                |c| &c.push_open_retries,
                1,
                "dissemination_push_open_retries_total",
            );
            tokio::time::sleep(wait).await;
            if !wanted() {
                return Err(err);
            }
            attempt += 1;
        }
    }

    async fn open_chunk_stream(&self, child: PeerId) -> Result<libp2p::Stream> {
        tokio::time::timeout(
            self.inner.cfg.read_timeout,
            self.inner.client.open_stream(child, CHUNK_STREAM),
        )
        .await
        .map_err(|_| DisseminationError::Timeout(format!("opening a chunk stream to {child}")))?
        .map_err(|e| open_err(child, "chunk-stream", e))
    }
    /// Closes `s` in the background, within the frame deadline (the child then ends its wait).
    fn close_later(&self, mut s: libp2p::Stream) {
        let limit = self.inner.cfg.read_timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limit, s.close()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(300);

    #[test]
    fn push_opens_are_retried_after_growing_delays_capped_at_4_s() {
        let ms: Vec<u128> = (0..7).map(|a| open_retry_delay(a).as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(open_retry_delay(u32::MAX), Duration::from_secs(4));
        // The patience allows many tries at the cap, not one.
        let first: Duration = (0..5).map(open_retry_delay).sum();
        assert!(PUSH_OPEN_PATIENCE > first + Duration::from_secs(40));
    }

    #[test]
    fn only_a_child_never_pushed_to_without_a_session_or_warm_up_is_warmed() {
        assert!(wants_warm_up(false, false, false));
        for (kept, warming, pushed) in [
            (true, false, false),
            (false, true, false),
            (false, false, true),
            (true, true, true),
        ] {
            assert!(!wants_warm_up(kept, warming, pushed));
        }
    }

    #[test]
    fn a_session_is_reused_only_well_inside_the_childs_wait() {
        assert!(reusable(Duration::ZERO, T));
        assert!(reusable(Duration::from_secs(239), T));
        assert!(!reusable(Duration::from_secs(240), T));
        assert!(!reusable(Duration::from_secs(301), T));
    }

    #[test]
    fn take_returns_a_fresh_session_once_and_an_old_one_for_closing() {
        let t0 = Instant::now();
        let mut s: Sessions<u8, &str> = Sessions::default();
        assert!(s.put(1, "a", t0).is_empty());
        assert_eq!(s.take(1, T, t0 + Duration::from_secs(10)), Some(Ok("a")));
        assert_eq!(s.take(1, T, t0), None, "taken once");
        s.put(2, "b", t0);
        assert_eq!(s.take(2, T, t0 + T), Some(Err("b")), "too old: to close");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn put_displaces_the_same_childs_session_and_bounds_the_table() {
        let t0 = Instant::now();
        let mut s: Sessions<usize, usize> = Sessions::default();
        assert!(s.put(0, 100, t0).is_empty());
        assert_eq!(s.put(0, 101, t0), vec![100], "one per child");
        for k in 1..MAX_IDLE_SESSIONS {
            assert!(s.put(k, k, t0 + Duration::from_millis(k as u64)).is_empty());
        }
        assert_eq!(s.len(), MAX_IDLE_SESSIONS);
        let out = s.put(
            MAX_IDLE_SESSIONS,
            MAX_IDLE_SESSIONS,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(out, vec![101], "the oldest (child 0's) is closed");
        assert_eq!(s.len(), MAX_IDLE_SESSIONS);
        assert_eq!(s.forget(&1), Some(1));
        assert_eq!(s.forget(&1), None);
    }
}
