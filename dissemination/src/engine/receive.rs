//! The child's end of the chunk stream ([`super::CHUNK_STREAM`], `docs/protocol.md`, "Chunk
//! stream"): a session of transfers from one parent, each hello's manifest verified before
//! anything large is read (inline, held, or asked of the learner — never the parent's word),
//! the bitmap of chunks held, then each chunk verified and held as it arrives.
//!
//! Owns: the receiving transfer records and counters. Must not touch: verification itself
//! (`install::take_chunk`), acceptance rules (`gossip`), the sending end (`push`).

use std::sync::Arc;
use std::time::Instant;

use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use p2p::framing::{read_frame, write_frame};
use p2p::{PeerId, Validation};
use storage::SignedManifest;
use tokio::task::JoinHandle;
use tracing::{debug, trace};

use super::push::chunk_frame_err;
use super::{frame_deadline, within, Disseminator};
use crate::delivery::{PushTally, Pushed};
use crate::error::{DisseminationError, Result};
use crate::plan_msg::SignedPlan;
use crate::transfer::Input;
use crate::wire::{
    self, Reply, StreamHello, MAX_HELLO_BYTES, MAX_INDEX_BYTES, STATUS_FAILED, STATUS_OK,
};

impl Disseminator {
    /// Child side of a chunk stream: one transfer after another — the parent keeps the stream
    /// open between versions (`session`) — until the parent closes it, no hello comes for
    /// `session_idle_timeout`, or a transfer ends it (refused, a corrupt chunk). The first
    /// hello is due within the frame deadline, except from this node's planned parent: it
    /// opens the stream as soon as the plan names this node, before the manifest exists
    /// (`session::warm_sessions`), and gets the idle wait, like a kept session. A session that
    /// ends while idle is no failure of the parent's; a stranger's stream that stays silent
    /// past the deadline is.
    pub(super) async fn receive_push<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        mut s: S,
    ) -> Result<()> {
        let limit = self.inner.cfg.read_timeout;
        let mut idle = self.is_planned_parent(&peer);
        // Filler bytes read so far, and whether a hello came (filler is allowed only before).
        let (mut filler, mut greeted) = (0u64, false);
        loop {
            let wait = if idle {
                self.inner.cfg.session_idle_timeout
            } else {
                limit
            };
            let hello = within(wait, "the stream hello", peer, async {
                read_frame(&mut s, MAX_HELLO_BYTES, "stream hello")
                    .await
                    .map_err(|e| chunk_frame_err(peer, e))
            })
            .await;
            let hello = match hello {
                Ok(h) => h,
                // A warm stream that came before this node accepted the plan naming its
                // sender: nothing was read yet, so waiting on is safe.
                Err(DisseminationError::Timeout(_)) if !idle && self.is_planned_parent(&peer) => {
                    idle = true;
                    continue;
                }
                Err(e @ (DisseminationError::Io { .. } | DisseminationError::Timeout(_)))
                    if idle =>
                {
                    debug!(%peer, "chunk stream session ended");
                    if matches!(e, DisseminationError::Timeout(_)) {
                        self.count(
                            |c| &c.sessions_ended_idle,
                            1,
                            "dissemination_push_sessions_ended_idle_total",
                        );
                    }
                    let _ = tokio::time::timeout(limit, s.close()).await;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            if wire::is_filler(&hello) {
                filler += hello.len() as u64;
                check_filler(peer, filler, greeted)?;
                continue;
            }
            if filler > 0 && !greeted {
                debug!(%peer, filler, "warm-up filler read before the first hello");
            }
            greeted = true;
            idle = true;
            let done = self.receive_transfer(peer, &mut s, &hello).await;
            if let Ok(h) = StreamHello::decode(&hello) {
                self.lock().deliveries.push_ended(h.version, peer);
            }
            let go_on = done?;
            self.inner.kick.send_modify(|k| *k += 1);
            if !go_on {
                return Ok(());
            }
        }
    }

    /// Whether the current plan names `peer` as this node's parent (the learner for a first
    /// hop).
    fn is_planned_parent(&self, peer: &PeerId) -> bool {
        let st = self.lock();
        let Some(plan) = &st.plan else {
            return false;
        };
        match plan.plan.to_plan().placement(&self.inner.local) {
            Some(control::plan::Placement::Chain { parent, .. }) => {
                parent.as_ref().unwrap_or(&self.inner.learner) == peer
            }
            _ => false,
        }
    }

    /// One transfer on a chunk stream, from its hello on: the hello's manifest verified
    /// (inline, held already, or asked of the learner) before any large frame is read, then
    /// the bitmap of chunks already held, then each chunk verified and held as it arrives (one
    /// is verified while the next is read) until the empty header frame, then the status.
    /// Returns whether the stream stays open for the next version's hello.
    async fn receive_transfer<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        s: &mut S,
        hello: &[u8],
    ) -> Result<bool> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let limit = self.inner.cfg.read_timeout;
        let Some((manifest, tally)) = self.answer_hello(peer, s, hello).await? else {
            return Ok(false);
        };
        let started = Instant::now();
        let (corrupt, bytes_in) = self.read_chunks(peer, s, Arc::new(manifest), tally).await?;
        // Tell the parent (best effort: it may be gone); after a corrupt chunk the stream is
        // dropped, otherwise it stays open for the next version.
        let status = if corrupt { STATUS_FAILED } else { STATUS_OK };
        let told = within(limit, "sending the status", peer, async {
            write_frame(s, &[status]).await.map_err(io)?;
            if corrupt {
                s.close().await.map_err(io)
            } else {
                s.flush().await.map_err(io)
            }
        })
        .await
        .is_ok();
        if !corrupt {
            self.credit(peer, bytes_in, started.elapsed()).await;
        }
        Ok(told && !corrupt)
    }

    /// The transfer's opening: the hello decoded and its manifest verified, the plan it
    /// carries offered to the planner, and the reply sent — the bitmap of chunks already held,
    /// or a refusal (then the stream is closed and `None` returned). Returns the manifest and
    /// the tally of what the reply asked for.
    async fn answer_hello<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        s: &mut S,
        hello: &[u8],
    ) -> Result<Option<(SignedManifest, PushTally)>> {
        let io = |e| DisseminationError::Io { peer, source: e };
        let limit = self.inner.cfg.read_timeout;
        let hello = StreamHello::decode(hello).map_err(|e| DisseminationError::Protocol {
            peer,
            reason: e.to_string(),
        })?;
        let Some(manifest) = self.manifest_of_hello(peer, &hello).await else {
            within(limit, "refusing the stream", peer, async {
                write_frame(s, &Reply::Refuse.encode()).await.map_err(io)
            })
            .await?;
            let _ = tokio::time::timeout(limit, s.close()).await;
            return Ok(None);
        };
        if !hello.plan.is_empty() {
            if let Ok(p) = SignedPlan::decode(&hello.plan) {
                let _ = self.accept_plan(&p);
            }
        }
        let m = &manifest.manifest;
        let n = m.chunk_hashes.len();
        let store = &self.inner.store;
        let mut held = Vec::with_capacity(n);
        for h in &m.chunk_hashes {
            held.push(store.has_chunk(h)?);
        }
        let reply = Reply::Accept {
            held: wire::bitmap(n, |i| held[i]),
        };
        within(limit, "sending the reply", peer, async {
            write_frame(s, &reply.encode()).await.map_err(io)?;
            s.flush().await.map_err(io)
        })
        .await?;
        // What this parent was asked for, for the delivery receipt (`crate::delivery`); the
        // acquirer, which waits only briefly for a hello, looks again.
        let wanted = (0..n).filter(|&i| !held[i]).map(|i| m.chunk_len(i)).sum();
        self.lock()
            .deliveries
            .hello(m.version, peer, wanted, Instant::now());
        debug!(%peer, version = m.version, wanted, "hello answered");
        self.inner.stored.send_modify(|_| {});
        let tally = PushTally::new(held.iter().map(|h| !h).collect());
        Ok(Some((manifest, tally)))
    }

    /// The chunks of one transfer until the parent's empty header frame: each verified (and
    /// stored, and copied into the assembly) while the next one is read off the stream.
    /// Returns whether a chunk was corrupt (the read stops there), and the bytes taken.
    async fn read_chunks<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        s: &mut S,
        manifest: Arc<SignedManifest>,
        mut tally: PushTally,
    ) -> Result<(bool, u64)> {
        let version = manifest.manifest.version;
        let mut bytes_in = 0u64;
        type Verifying = Option<((usize, u32), JoinHandle<Result<bool>>)>;
        let mut verifying: Verifying = None;
        let settle = |v: Verifying| async move {
            match v {
                None => Ok(None),
                Some((at, h)) => h
                    .await
                    .map_err(|e| DisseminationError::Task(e.to_string()))?
                    .map(|ok| Some((at, ok))),
            }
        };
        loop {
            let next = self
                .next_chunk(peer, s, &manifest.manifest, &mut tally)
                .await;
            let next = match next {
                Ok(n) => n,
                Err(e) => {
                    // A chunk pushed again or unasked: the one being verified still counts.
                    if let Ok(Some(((i, l), true))) = settle(verifying.take()).await {
                        self.received(peer, version, i, l);
                    }
                    return Err(e);
                }
            };
            let Some((index, buf)) = next else { break };
            let len = buf.len() as u32;
            self.inner.downlink.acquire(u64::from(len)).await;
            let (me, m) = (self.clone(), manifest.clone());
            let next =
                tokio::spawn(async move { me.take_chunk(peer, &m.manifest, index, buf).await });
            match settle(verifying.replace(((index, len), next))).await? {
                // Corrupt: drop the stream; the rest comes from elsewhere (repair).
                Some((_, false)) => return Ok((true, bytes_in)),
                Some(((i, l), true)) => bytes_in += self.received(peer, version, i, l),
                None => {}
            }
        }
        let corrupt = match settle(verifying).await? {
            Some((_, false)) => true,
            Some(((i, l), true)) => {
                bytes_in += self.received(peer, version, i, l);
                false
            }
            None => false,
        };
        Ok((corrupt, bytes_in))
    }

    /// The next chunk of `m` off the stream: its header (the empty one, the end of the
    /// transfer, gives `None`), then the chunk itself, refused before allocating when the
    /// index is out of range or the frame is longer than the manifest's chunk length — and
    /// before reading it when `tally` says the child did not ask for it or already has it
    /// from this transfer: the parent's protocol error, noted in the version's delivery
    /// record (its receipt's `duplicates`) and never counted as delivered.
    async fn next_chunk<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        peer: PeerId,
        s: &mut S,
        m: &storage::SnapshotManifest,
        tally: &mut PushTally,
    ) -> Result<Option<(usize, Vec<u8>)>> {
        let limit = self.inner.cfg.read_timeout;
        let n = m.chunk_hashes.len();
        // The parent may be waiting for its own parent's next chunk: it has up to
        // `push_idle_timeout` before it gives up, and this side as long plus the deadline.
        let header_wait = self.inner.cfg.push_idle_timeout + limit;
        let header = within(header_wait, "the next chunk header", peer, async {
            read_frame(s, MAX_INDEX_BYTES, "chunk header")
                .await
                .map_err(|e| chunk_frame_err(peer, e))
        })
        .await?;
        let protocol = |reason: String| DisseminationError::Protocol { peer, reason };
        let index = match wire::decode_index(&header) {
            Ok(Some(i)) => i,
            Ok(None) => return Ok(None),
            Err(e) => return Err(protocol(e.to_string())),
        };
        let Some(index) = usize::try_from(index).ok().filter(|&i| i < n) else {
            return Err(protocol(format!("chunk index {index} of {n}")));
        };
        let expected = m.chunk_len(index);
        let copy = tally.take(index);
        if copy != Pushed::First {
            self.lock().deliveries.duplicate(m.version, peer, expected);
            // Not asked again for this version's chunks (its push is dropped here).
            self.apply(m.version, Input::Rejected { peer });
            metrics::counter!("dissemination_push_duplicates_total").increment(1);
            let what = match copy {
                Pushed::Again => "pushed again",
                _ => "not asked for",
            };
            return Err(protocol(format!("chunk {index} of v{}: {what}", m.version)));
        }
        let buf = within(frame_deadline(limit, expected), "a chunk", peer, async {
            read_frame(s, expected as usize, "chunk")
                .await
                .map_err(|e| chunk_frame_err(peer, e))
        })
        .await?;
        if buf.len() as u64 != expected {
            return Err(protocol(format!(
                "chunk {index}: {} bytes, manifest says {expected}",
                buf.len()
            )));
        }
        trace!(%peer, version = m.version, index, "chunk read");
        Ok(Some((index, buf)))
    }

    /// The manifest a hello names, verified: the inline one (checked like gossip), the one
    /// already accepted with that digest, or — when it was too large to inline — the learner's
    /// answer to a catch-up request for that version (never read from the parent). `None`:
    /// refuse the stream (forged, another swarm's, older than accepted, unknown).
    async fn manifest_of_hello(&self, peer: PeerId, hello: &StreamHello) -> Option<SignedManifest> {
        if !hello.manifest.is_empty() {
            let Ok(m) = SignedManifest::decode(&hello.manifest) else {
                self.charge(peer).await;
                return None;
            };
            return match self.accept_manifest(&m) {
                Validation::Accept if m.manifest.version == hello.version => Some(m),
                Validation::Reject => {
                    self.charge(peer).await;
                    None
                }
                _ => None,
            };
        }
        let digest_of = |m: &SignedManifest| *blake3::hash(&m.encode()).as_bytes();
        {
            let st = self.lock();
            if let Some(m) = st.manifests.get(&hello.version) {
                return (digest_of(m) == hello.digest).then(|| m.clone());
            }
            if st.manifest_version.is_some_and(|v| hello.version < v) {
                return None;
            }
        }
        if self.is_learner() {
            return None;
        }
        let learner = self.inner.learner;
        let answer = match self.fetch_catch_up(learner, hello.version).await {
            Ok(a) => a,
            Err(e) => {
                let version = hello.version;
                debug!(%peer, version, error = %e, "no manifest for the hello from the learner");
                return None;
            }
        };
        let m = SignedManifest::decode(&answer.manifest).ok()?;
        if m.manifest.version != hello.version || digest_of(&m) != hello.digest {
            return None;
        }
        (self.accept_manifest(&m) == Validation::Accept).then_some(m)
    }

    /// Counts chunk `index` (`len` pushed bytes) of `version`, received from `peer` and
    /// verified (also in the version's delivery record); returns the bytes.
    pub(super) fn received(&self, peer: PeerId, version: u64, index: usize, len: u32) -> u64 {
        self.lock()
            .deliveries
            .chunk(version, peer, index, u64::from(len), Instant::now());
        self.count(
            |c| &c.push_received_bytes,
            u64::from(len),
            "dissemination_push_received_bytes_total",
        );
        u64::from(len)
    }
}
/// Filler (`wire::filler_frame`) is allowed on a stream only before its first hello, and at
/// most [`wire::MAX_FILLER_BYTES`] of it: anything else is a protocol violation, charged to
/// the parent like a malformed frame. `filler` is the total read so far, `greeted` whether a
/// hello came before it.
fn check_filler(peer: PeerId, filler: u64, greeted: bool) -> Result<()> {
    let reason = if greeted {
        "filler after a hello".to_string()
    } else if filler > wire::MAX_FILLER_BYTES {
        format!("{filler} filler bytes > {}", wire::MAX_FILLER_BYTES)
    } else {
        return Ok(());
    };
    Err(DisseminationError::Protocol { peer, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_allowed_only_before_the_first_hello_and_within_its_bound() {
        let peer = PeerId::random();
        assert!(check_filler(peer, 64 << 10, false).is_ok());
        assert!(check_filler(peer, wire::MAX_FILLER_BYTES, false).is_ok());
        let too_much = check_filler(peer, wire::MAX_FILLER_BYTES + 1, false).unwrap_err();
        assert!(
            matches!(too_much, DisseminationError::Protocol { .. }),
            "{too_much}"
        );
        let late = check_filler(peer, 64 << 10, true).unwrap_err();
        assert!(late.to_string().contains("after a hello"), "{late}");
    }
}
