//! The chunk-fetch protocol ([`CHUNK_FETCH`], `docs/protocol.md`, "Chunk fetch"): serving
//! held chunks by hash and the catch-up manifest request, fetching missing chunks from
//! holders, and the repair round that picks whom to ask.
//!
//! Owns: both ends of chunk fetch (their deadlines and transfer records), when a busy
//! forwarder declines to serve ([`declines_fetches`]) and the order in which holders are
//! asked ([`holders_in_order`]). Must not touch: verification (`install::take_chunk`), when to
//! repair (`crate::transfer`).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use p2p::framing::{read_frame, write_frame};
use p2p::{PeerId, TopicKind};
use storage::{Hash, SnapshotManifest};
use tracing::debug;

use control::forwarding::Probe;

use super::push::chunk_frame_err;
use super::{blocking, frame_deadline, open_err, within, Disseminator};
use crate::error::{DisseminationError, Result};
use crate::transfer::{repair_batch, Feed, Input};
use crate::wire::{
    CatchUp, FetchRequest, CHUNK_FETCH, MAX_CATCH_UP_BYTES, MAX_FETCH_BATCH,
    MAX_FETCH_REQUEST_BYTES,
};

/// Minimum time between two catch-ups with the learner ([`Disseminator::catch_up`]). A missed
/// catch-up costs nothing lasting: the learner's next heartbeat announcing a newer version
/// triggers another, and gossip carries the manifest anyway.
pub(super) const CATCH_UP_MIN_INTERVAL: Duration = Duration::from_secs(1);

impl Disseminator {
    /// Holder side: one request per stream — held chunks in request order (an empty frame for
    /// each not held), or, for `count = 0`, the catch-up manifest and plan. Every read and
    /// write has a deadline; the chunks served are recorded in the requester's score (bytes
    /// and time, or a failure when it stopped taking them).
    pub(super) async fn serve_fetch<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let limit = self.inner.cfg.read_timeout;
        let request = within(limit, "a fetch request", peer, async {
            read_frame(&mut s, MAX_FETCH_REQUEST_BYTES, "fetch request")
                .await
                .map_err(|e| io(e.into()))
        })
        .await?;
        let hashes = match FetchRequest::decode(&request) {
            Ok(FetchRequest::Manifest { version }) => {
                return self.serve_manifest(peer, s, version).await
            }
            Ok(FetchRequest::Chunks { hashes, .. }) => hashes,
            Err(e) => {
                return Err(DisseminationError::Protocol {
                    peer,
                    reason: e.to_string(),
                })
            }
        };
        let started = Instant::now();
        let mut served = 0u64;
        let mut declined = 0u64;
        let r: Result<()> = async {
            for h in hashes {
                // The learner's own asks (a probe of an accused parent) are never declined as
                // busy: a decline would read as a chunk withheld.
                let busy = (peer != self.inner.learner
                    && declines_fetches(
                        self.is_learner(),
                        self.inner.sending.load(Ordering::Relaxed),
                    ))
                    || self.silent();
                if busy {
                    declined += 1;
                }
                if busy || !self.inner.store.has_chunk(&h)? {
                    // Not held, or declined: an empty frame (a chunk is never empty).
                    within(limit, "sending a fetch answer", peer, async {
                        write_frame(&mut s, &[]).await.map_err(io)
                    })
                    .await?;
                    continue;
                }
                let bytes = self.read_chunk(h).await?;
                self.inner.uplink.acquire(bytes.len() as u64).await;
                let deadline = frame_deadline(limit, bytes.len() as u64);
                within(deadline, "sending a fetched chunk", peer, async {
                    write_frame(&mut s, &bytes).await.map_err(io)
                })
                .await?;
                served += bytes.len() as u64;
                self.count(
                    |c| &c.served_bytes,
                    bytes.len() as u64,
                    "dissemination_served_bytes_total",
                );
            }
            within(limit, "closing a fetch", peer, async {
                s.close().await.map_err(io)
            })
            .await
        }
        .await;
        if declined > 0 {
            debug!(%peer, declined, "busy forwarding: declined chunks of a fetch");
            self.count(
                |c| &c.fetches_declined,
                declined,
                "dissemination_fetches_declined_total",
            );
        }
        match &r {
            Ok(()) => self.credit(peer, served, started.elapsed()).await,
            Err(DisseminationError::Io { .. } | DisseminationError::Timeout(_)) => {
                self.charge(peer).await
            }
            Err(_) => {}
        }
        r
    }

    /// A fetch with no hashes asks for the signed manifest of `version` (`u64::MAX`: the newest
    /// held) and the current plan for it: how a late joiner or restarted worker catches up.
    pub(super) async fn serve_manifest<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
        version: u64,
    ) -> Result<()> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let (mut manifest, plan, newest) = {
            let st = self.lock();
            let v = if version == u64::MAX {
                st.manifest_version
            } else {
                Some(version)
            };
            let m = v.and_then(|v| st.manifests.get(&v).cloned());
            let p = st.plan.clone().filter(|p| {
                m.as_ref()
                    .is_some_and(|m| m.manifest.version == p.plan.version)
            });
            (m, p, st.manifest_version)
        };
        // An older version than the engine remembers (a catch-up of a delta's chain reaches
        // back to its keyframe): the store's signed copy, if still kept.
        if manifest.is_none() && version != u64::MAX {
            let store = self.inner.store.clone();
            manifest = blocking(move || store.manifest(version)).await?;
        }
        if manifest.is_some() && version != u64::MAX && newest.is_some_and(|n| version < n) {
            self.count(
                |c| &c.catch_ups_served,
                1,
                "dissemination_catch_ups_served_total",
            );
        }
        let answer = CatchUp {
            manifest: manifest.map(|m| m.encode()).unwrap_or_default(),
            plan: plan.map(|p| p.encode()).unwrap_or_default(),
        };
        let body = answer.encode();
        let deadline = frame_deadline(self.inner.cfg.read_timeout, body.len() as u64);
        within(deadline, "sending a catch-up answer", peer, async {
            write_frame(&mut s, &body).await.map_err(io)?;
            s.close().await.map_err(io)
        })
        .await
    }

    /// Worker: a connection to the learner (at start, after a restart) or a learner heartbeat
    /// announcing a newer installed version than any manifest accepted here → ask the learner
    /// for its newest signed manifest and plan (verified like gossip), then acquire it.
    ///
    /// At most one catch-up starts per [`CATCH_UP_MIN_INTERVAL`]: the request opens a stream,
    /// which dials the learner when the connection is gone, and a learner that closes every
    /// connection of this node at once (it banned it) would otherwise turn connect → catch-up
    /// → redial into a loop of hundreds of handshakes a second.
    pub fn catch_up(&self, peer: PeerId, announced: Option<u64>) {
        if self.is_learner() || peer != self.inner.learner {
            return;
        }
        {
            let mut st = self.lock();
            if let (Some(a), Some(have)) = (announced, st.manifest_version) {
                if a <= have {
                    return;
                }
            }
            let now = Instant::now();
            if st
                .last_catch_up
                .is_some_and(|t| now.saturating_duration_since(t) < CATCH_UP_MIN_INTERVAL)
            {
                debug!(%peer, "catch-up skipped: one started less than the minimum interval ago");
                return;
            }
            st.last_catch_up = Some(now);
        }
        let me = self.clone();
        self.spawn(async move {
            if let Err(e) = me.request_manifest(peer).await {
                debug!(%peer, error = %e, "catch-up request failed");
            }
        });
    }

    /// Opens a chunk-fetch stream to `peer`, giving up after `limit`.
    pub(super) async fn open_fetch(&self, peer: PeerId, limit: Duration) -> Result<p2p::Stream> {
        tokio::time::timeout(limit, self.inner.client.open_stream(peer, CHUNK_FETCH))
            .await
            .map_err(|_| DisseminationError::Timeout(format!("opening a fetch stream to {peer}")))?
            .map_err(|e| open_err(peer, "chunk-fetch", e))
    }

    /// Asks the learner for its signed manifest of `version` (`u64::MAX`: its newest) and the
    /// plan for it. Only the learner is asked: the answer may be as large as the largest
    /// manifest, read before any signature can be checked.
    pub(super) async fn fetch_catch_up(&self, peer: PeerId, version: u64) -> Result<CatchUp> {
        if peer != self.inner.learner {
            return Err(DisseminationError::Protocol {
                peer,
                reason: "catch-up answers are read from the learner only".into(),
            });
        }
        let io = |e| DisseminationError::Io { peer, source: e };
        let limit = self.inner.cfg.read_timeout;
        let mut s = self.open_fetch(peer, limit).await?;
        let req = FetchRequest::Manifest { version };
        within(limit, "sending a catch-up request", peer, async {
            write_frame(&mut s, &req.encode()).await.map_err(io)?;
            s.flush().await.map_err(io)
        })
        .await?;
        let deadline = frame_deadline(limit, MAX_CATCH_UP_BYTES as u64);
        let answer = within(deadline, "a catch-up answer", peer, async {
            read_frame(&mut s, MAX_CATCH_UP_BYTES, "catch-up answer")
                .await
                .map_err(|e| io(e.into()))
        })
        .await?;
        let _ = tokio::time::timeout(limit, s.close()).await;
        CatchUp::decode(&answer)
    }

    pub(super) async fn request_manifest(&self, peer: PeerId) -> Result<()> {
        let CatchUp {
            manifest: m,
            plan: p,
        } = self.fetch_catch_up(peer, u64::MAX).await?;
        // Plan first: the acquirer then knows at once that this node is not in a chain.
        if !p.is_empty() {
            self.on_gossip(TopicKind::Plans, &p);
        }
        if !m.is_empty() {
            self.on_gossip(TopicKind::Snapshots, &m);
        }
        Ok(())
    }

    /// Fetches up to [`MAX_FETCH_BATCH`] of `wanted` (index, hash) from `peer`; returns how
    /// many verified chunks were stored. A corrupt chunk ends the exchange; a holder that goes
    /// silent past the deadline or breaks the protocol ([`holder_at_fault`]) is charged a
    /// failed transfer and not asked again for this version.
    pub(super) async fn fetch_from(
        &self,
        peer: PeerId,
        m: &SnapshotManifest,
        wanted: &[(usize, Hash)],
    ) -> Result<usize> {
        let r = self.fetch_batch(peer, m, wanted).await;
        if let Err(e) = &r {
            if holder_at_fault(e) {
                self.apply(m.version, Input::Rejected { peer });
                self.charge(peer).await;
            }
        }
        r
    }

    async fn fetch_batch(
        &self,
        peer: PeerId,
        m: &SnapshotManifest,
        wanted: &[(usize, Hash)],
    ) -> Result<usize> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let limit = self.inner.cfg.read_timeout;
        let mut s = self
            .open_fetch(peer, limit.min(Duration::from_secs(5)))
            .await?;
        let batch = &wanted[..wanted.len().min(MAX_FETCH_BATCH)];
        let req = FetchRequest::Chunks {
            version: m.version,
            hashes: batch.iter().map(|(_, h)| *h).collect(),
        };
        within(limit, "sending a fetch request", peer, async {
            write_frame(&mut s, &req.encode()).await.map_err(io)?;
            s.flush().await.map_err(io)
        })
        .await?;
        let started = Instant::now();
        let mut got = 0usize;
        let mut bytes_in = 0u64;
        for &(index, _) in batch {
            let max = m.chunk_len(index);
            let bytes = within(frame_deadline(limit, max), "a fetched chunk", peer, async {
                read_frame(&mut s, max as usize, "chunk")
                    .await
                    .map_err(|e| chunk_frame_err(peer, e))
            })
            .await?;
            if bytes.is_empty() {
                continue;
            }
            let len = bytes.len() as u64;
            self.inner.downlink.acquire(len).await;
            if !self.take_chunk(peer, m, index, bytes).await? {
                return Ok(got);
            }
            got += 1;
            bytes_in += len;
            self.count(
                |c| &c.fetched_bytes,
                len,
                "dissemination_fetched_bytes_total",
            );
        }
        self.credit(peer, bytes_in, started.elapsed()).await;
        Ok(got)
    }

    /// Learner: asks `peer` over chunk fetch for one chunk of `version` — one it reported
    /// holding — chosen by a key only the learner has (`pick`), and verifies what comes
    /// (`control::forwarding::Probe`). Nothing is stored.
    pub(super) async fn probe_holder(&self, peer: PeerId, version: u64, pick: u64) -> Probe {
        let Some(m) = self
            .lock()
            .manifests
            .get(&version)
            .map(|m| m.manifest.clone())
        else {
            return Probe::Unanswered;
        };
        let n = m.chunk_hashes.len();
        if n == 0 {
            return Probe::Unanswered;
        }
        let index = (pick % n as u64) as usize;
        let hash = m.chunk_hashes[index];
        let limit = self.inner.cfg.read_timeout;
        let io = |e| DisseminationError::Io { peer, source: e };
        let asked: Result<Vec<u8>> = async {
            let mut s = self
                .open_fetch(peer, limit.min(Duration::from_secs(5)))
                .await?;
            let req = FetchRequest::Chunks {
                version,
                hashes: vec![hash],
            };
            within(limit, "sending a probe", peer, async {
                write_frame(&mut s, &req.encode()).await.map_err(io)?;
                s.flush().await.map_err(io)
            })
            .await?;
            let max = m.chunk_len(index);
            within(frame_deadline(limit, max), "a probed chunk", peer, async {
                read_frame(&mut s, max as usize, "chunk")
                    .await
                    .map_err(|e| chunk_frame_err(peer, e))
            })
            .await
        }
        .await;
        match asked {
            Ok(bytes) if !bytes.is_empty() && *blake3::hash(&bytes).as_bytes() == hash => {
                Probe::Served
            }
            // Not held (an empty answer), bytes that are not the chunk, or a frame that
            // breaks the protocol.
            Ok(_) | Err(DisseminationError::Protocol { .. }) => Probe::Withheld,
            Err(e) => {
                debug!(%peer, version, error = %e, "probe of an accused parent unanswered");
                Probe::Unanswered
            }
        }
    }

    /// One repair round: asks every candidate holder in turn for what is still missing (behind
    /// a parent's push — `feed` — from the back a batch at a time: [`repair_batch`]), looking
    /// at the store again before every request.
    /// Candidates: the plan's other workers and the learner, asked in the order of
    /// [`holders_in_order`] (connected complete holders first, the learner last).
    pub(super) async fn repair_round(
        &self,
        version: u64,
        m: &SnapshotManifest,
        feed: Feed,
    ) -> Result<usize> {
        let (plan, bad) = {
            let st = self.lock();
            (
                st.plan.clone().filter(|p| p.plan.version == version),
                st.transfers
                    .get(&version)
                    .map(|t| t.bad_peers())
                    .unwrap_or_default(),
            )
        };
        let mut candidates: Vec<PeerId> = Vec::new();
        if let Some(p) = &plan {
            for c in &p.plan.chains {
                if let Some(k) = c.iter().position(|x| *x == self.inner.local) {
                    candidates.extend(c[..k].iter().rev().copied());
                }
            }
            for c in &p.plan.chains {
                candidates.extend(c.iter().copied());
            }
            candidates.extend(p.plan.fetch_only.iter().copied());
        }
        candidates.push(self.inner.learner);
        let mut seen = HashSet::new();
        candidates.retain(|c| *c != self.inner.local && !bad.contains(c) && seen.insert(*c));
        let (mut connected, mut complete) = (HashSet::new(), HashSet::new());
        for p in self.inner.client.peers().await.unwrap_or_default() {
            if p.connected {
                connected.insert(p.peer);
            }
            if p.installed_version.is_some_and(|v| v >= version) {
                complete.insert(p.peer);
            }
        }
        let spread = spread_offset(&self.inner.local, version);
        // The planned parent, if it has not said hello for this version although its hellos
        // usually come within the (timed) wait.
        let silent = self.feed(version).1.filter(|p| {
            let st = self.lock();
            st.deliveries.hellos_timed() && !st.deliveries.heard(version, p)
        });
        let candidates = holders_in_order(
            candidates,
            &Holders {
                connected: &connected,
                complete: &complete,
                learner: self.inner.learner,
                spread,
                silent,
            },
        );
        let mut total = 0;
        for peer in candidates {
            loop {
                let missing = self.inner.store.missing_chunks(version)?;
                if missing.is_empty() {
                    return Ok(total);
                }
                // Behind a live push: from the back, a few at a time (`repair_batch`).
                let missing = repair_batch(missing, feed);
                if self
                    .lock()
                    .transfers
                    .get(&version)
                    .is_some_and(|t| t.is_bad(&peer))
                {
                    break;
                }
                match self.fetch_from(peer, m, &missing).await {
                    Ok(0) => break,
                    Ok(n) => total += n,
                    Err(e) => {
                        debug!(%peer, error = %e, "fetch failed");
                        break;
                    }
                }
            }
        }
        Ok(total)
    }
}

/// Whether this node answers chunk fetches as if it held none of the chunks: a worker does
/// while one of its pushes still has chunks to send (`sending`); the learner never does.
///
/// Why: a forwarder's uplink carries its chain — every node after it receives no faster than
/// it forwards — and the chunks a repair asks of it come out of the same token bucket as its
/// push. Serving them stalled whole chains at N = 32 (5 Mbit/s, 100 ms RTT): the nodes below
/// one slow hop repaired, their repairs drew on the first hops (the first complete holders),
/// those first hops' pushes slowed, and the nodes below them repaired in turn — one first hop
/// took 22 s longer to feed its child than to receive the snapshot (`docs/netlab.md`). A
/// declined chunk is an empty frame, as for a chunk not held (no wire change, no charge): the
/// requester asks the next holder — tails, fetch-only workers, forwarders done with their
/// push — and the learner last, whose B0 is spare once its first hops are fed. Declining only
/// while a push is sending bounds it: a push ends when its chunks are sent or its own input
/// stalls (`push_idle_timeout`). Measured with and without this rule at N = 32: 1.39–1.52 ×
/// against 1.91 × the bound.
fn declines_fetches(is_learner: bool, sending: usize) -> bool {
    !is_learner && sending > 0
}

/// Whether a failed fetch is the holder's fault: it missed a deadline (silent, or slower
/// than the frame deadline allows) or broke the protocol. Such a holder is charged a failed
/// transfer and not asked again for the version. Why the second: a holder that claims the
/// version in its heartbeats is asked first ([`holders_in_order`]), and each requester starts
/// at the same place every round — one that claims it and stays silent would cost that
/// requester a whole read deadline (10 s) in every repair round. A closed connection or a
/// refused stream is not counted: the holder may have just left, or restarted.
fn holder_at_fault(e: &DisseminationError) -> bool {
    matches!(
        e,
        DisseminationError::Timeout(_) | DisseminationError::Protocol { .. }
    )
}

/// What a repair knows about the candidate holders of a version ([`holders_in_order`]).
pub(super) struct Holders<'a> {
    /// Peers this node is connected to.
    pub(super) connected: &'a HashSet<PeerId>,
    /// Peers whose heartbeats say they installed the version (or a newer one): they hold
    /// every chunk.
    pub(super) complete: &'a HashSet<PeerId>,
    pub(super) learner: PeerId,
    /// Where this node starts in the list of complete holders ([`spread_offset`]).
    pub(super) spread: u64,
    /// This node's planned parent, when it has not said hello for the version although its
    /// hellos have been timed.
    pub(super) silent: Option<PeerId>,
}

/// The order in which a repair asks holders:
/// 1. connected holders that installed the version, starting at this node's own offset
///    (`spread`) and wrapping around — every one of them has all that is missing, and nodes
///    that repair at the same time start at different ones;
/// 2. the other connected candidates, in the plan's order (its own chain's upstream first,
///    other chain members, fetch-only peers): they may hold some of it;
/// 3. candidates this node is not connected to, in the same order;
/// 4. the learner — its upload is the swarm's scarcest bandwidth (B0);
/// 5. after the learner, this node's own planned parent if it has not said hello for the
///    version although its hellos have been timed ([`Holders::silent`]).
///
/// Why spread: when a chain breaks (a forwarder whose push never started or stopped without
/// a plan repair), every node below the break repairs at once. In the plan's order they all
/// asked the same nearest ancestor holding the version, whose one uplink then served them
/// all: at N = 32, 5 Mbit/s, six nodes fetching 8 MB each from one holder took 77 s, where
/// the swarm had 25 complete holders with idle uplinks (`docs/netlab.md`). Connected holders
/// go before the others because a holder never reached may sit behind a NAT or a relay,
/// and a dial to it can take a whole dial timeout, long enough for a node that fetches
/// everything to see its version superseded before it stored a chunk. (Every node dials
/// the peers whose heartbeats carry dial hints, so a reachable holder is usually connected
/// already.)
///
/// Why a silent parent goes last: an honest parent says hello the moment it accepts the
/// manifest, before it holds a byte, so a parent that has not said it either holds nothing of
/// the version yet or is not answering — stopped, swapping, cut off. It was asked first (it
/// heads the plan's order), and a fetch from a frozen parent waited until it thawed: a head
/// stopped for half of every second delayed its child's installs by 350–550 ms (20–65 ms
/// otherwise), longer than a version stayed admissible, and the learner starved
/// (`docs/experiments.md`, "Faults"). It stays a candidate, for when the learner cannot serve.
/// Only once the node has timed its parents' hellos (`delivery::Records::hellos_timed`): in
/// a node's first versions a late hello can be a push stream still opening on a cold link,
/// from a parent that holds chunks already, and asking the learner instead costs B0.
pub(super) fn holders_in_order(candidates: Vec<PeerId>, h: &Holders<'_>) -> Vec<PeerId> {
    let had_learner = candidates.contains(&h.learner);
    let silent = h
        .silent
        .filter(|p| *p != h.learner && candidates.contains(p));
    let (connected, rest): (Vec<PeerId>, Vec<PeerId>) = candidates
        .into_iter()
        .filter(|p| *p != h.learner && Some(*p) != silent)
        .partition(|p| h.connected.contains(p));
    let (mut first, partial): (Vec<PeerId>, Vec<PeerId>) =
        connected.into_iter().partition(|p| h.complete.contains(p));
    if !first.is_empty() {
        let k = (h.spread % first.len() as u64) as usize;
        first.rotate_left(k);
    }
    first.extend(partial);
    first.extend(rest);
    if had_learner {
        first.push(h.learner);
    }
    first.extend(silent);
    first
}

/// A stable per-node, per-version number that spreads concurrent repairs over the complete
/// holders ([`holders_in_order`]): the first 8 bytes of BLAKE3 over the node's peer id and
/// the version.
pub(super) fn spread_offset(local: &PeerId, version: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&local.to_bytes());
    h.update(&version.to_le_bytes());
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u8) -> PeerId {
        p2p::peer_id_from_seed([i; 32])
    }

    fn order(
        c: &[PeerId],
        connected: &[PeerId],
        complete: &[PeerId],
        l: PeerId,
        spread: u64,
    ) -> Vec<PeerId> {
        order_with_silent(c, connected, complete, l, spread, None)
    }

    fn order_with_silent(
        c: &[PeerId],
        connected: &[PeerId],
        complete: &[PeerId],
        l: PeerId,
        spread: u64,
        silent: Option<PeerId>,
    ) -> Vec<PeerId> {
        let connected: HashSet<PeerId> = connected.iter().copied().collect();
        let complete: HashSet<PeerId> = complete.iter().copied().collect();
        let h = Holders {
            connected: &connected,
            complete: &complete,
            learner: l,
            spread,
            silent,
        };
        holders_in_order(c.to_vec(), &h)
    }

    #[test]
    fn a_parent_that_has_not_said_hello_is_asked_after_the_learner() {
        let (l, parent, b, c) = (peer(0), peer(1), peer(2), peer(3));
        // The chain's upstream first in the plan's order, all connected, none complete.
        let cands = [parent, b, c, l];
        let all = [parent, b, c, l];
        assert_eq!(order(&cands, &all, &[], l, 0), [parent, b, c, l]);
        assert_eq!(
            order_with_silent(&cands, &all, &[], l, 0, Some(parent)),
            [b, c, l, parent]
        );
        // A silent parent that is not a candidate (bad for this version) is not added.
        assert_eq!(
            order_with_silent(&[b, l], &all, &[], l, 0, Some(parent)),
            [b, l]
        );
        // Nor is the learner ever moved (a first hop's feed is the learner, never `silent`).
        assert_eq!(order_with_silent(&[b, l], &all, &[], l, 0, Some(l)), [b, l]);
    }

    #[test]
    fn only_silence_and_protocol_breaks_are_the_holders_fault() {
        let p = peer(1);
        assert!(holder_at_fault(&DisseminationError::Timeout(
            "a fetched chunk".into()
        )));
        assert!(holder_at_fault(&DisseminationError::Protocol {
            peer: p,
            reason: "a chunk longer than the manifest's".into(),
        }));
        let gone = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "closed");
        assert!(!holder_at_fault(&DisseminationError::Io {
            peer: p,
            source: gone
        }));
    }

    #[test]
    fn only_a_worker_with_a_push_still_sending_declines_fetches() {
        assert!(declines_fetches(false, 1));
        assert!(declines_fetches(false, 3));
        assert!(!declines_fetches(false, 0), "an idle worker serves");
        assert!(
            !declines_fetches(true, 2),
            "the learner, the last resort, always serves"
        );
    }

    #[test]
    fn connected_holders_then_the_others_then_the_learner() {
        let (l, a, b, c, d) = (peer(0), peer(1), peer(2), peer(3), peer(4));
        assert_eq!(
            order(&[a, b, c, d, l], &[c, a, l], &[], l, 7),
            [a, c, b, d, l]
        );
        assert_eq!(order(&[l, b, d], &[], &[], l, 0), [b, d, l]);
        // A learner not among the candidates (a bad peer for this version) is not added.
        assert_eq!(order(&[b, d], &[c, a, l], &[], l, 0), [b, d]);
        // The learner stays last even when it is connected and complete.
        assert_eq!(order(&[l, a], &[l, a], &[l, a], l, 1), [a, l]);
    }

    #[test]
    fn complete_connected_holders_come_first_from_each_nodes_own_offset() {
        let (l, a, b, c, d, e) = (peer(0), peer(1), peer(2), peer(3), peer(4), peer(5));
        let cands = [a, b, c, d, e, l];
        // a (the nearest ancestor) holds part of it; c, d, e are complete; e is unreachable.
        let (conn, full) = ([a, b, c, d, l], [c, d, e, l]);
        assert_eq!(order(&cands, &conn, &full, l, 0), [c, d, a, b, e, l]);
        assert_eq!(order(&cands, &conn, &full, l, 1), [d, c, a, b, e, l]);
        assert_eq!(order(&cands, &conn, &full, l, 2), [c, d, a, b, e, l]);
        // Many nodes repairing at once start at different complete holders.
        let holders: Vec<PeerId> = (10..20).map(peer).collect();
        let mut starts = HashSet::new();
        for n in 30..60u8 {
            let o = order(&holders, &holders, &holders, l, spread_offset(&peer(n), 3));
            let mut sorted = o.clone();
            sorted.sort();
            let mut want = holders.clone();
            want.sort();
            assert_eq!(sorted, want, "every holder once");
            starts.insert(o[0]);
        }
        assert!(
            starts.len() >= 6,
            "30 repairing nodes started at {} holders",
            starts.len()
        );
        assert_eq!(spread_offset(&peer(1), 3), spread_offset(&peer(1), 3));
        assert_ne!(spread_offset(&peer(1), 3), spread_offset(&peer(1), 4));
    }
}
