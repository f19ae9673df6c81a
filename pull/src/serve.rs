//! The worker side of the pull protocol: answers the swarm's learner (and refuses every other
//! peer), leases admissible groups and streams them, applies acks and releases.
//!
//! Owns: [`serve`], [`serve_with`] and their [`ServeOptions`]. Must not touch: the learner
//! side (`crate::pull`), the store's lease rules (`storage::TrajectoryStore`).
//!
//! Every read has a deadline: the first message of a stream must arrive within
//! [`ServeOptions::read_timeout`]; after a lease, the learner may take up to the lease's time
//! to live (it verifies the groups before acking) — after that the lease has expired anyway.
//! A stream past its deadline is dropped ([`PullError::Timeout`]); the lease, if any, expires.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use p2p::PeerId;
use storage::TrajectoryStore;

use crate::wire::{
    CommitLog, Message, MAX_GROUPS_PER_LEASE, MAX_SMALL_MESSAGE, MAX_TTL_MS, MIN_TTL_MS,
};
use crate::{blocking, read_within, write_within, PullError, READ_TIMEOUT, TRAJECTORY_PULL};

/// Settings of the worker side.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Deadline for each message from the learner (longer after a lease: its time to live).
    pub read_timeout: Duration,
    /// Test-only attack (`oversized_answer`): after a lease's groups, send one group more than
    /// the lease announced. Only in a build with the `adversary` feature.
    #[cfg(feature = "adversary")]
    #[doc(hidden)]
    pub testing_oversized_answer: bool,
    /// Test-only attack (`withhold_by_reward`, its naive form): leave out of every lease the
    /// groups this predicate picks (they stay stored and committed). Only in a build with the
    /// `adversary` feature.
    #[cfg(feature = "adversary")]
    #[doc(hidden)]
    pub testing_withhold: Option<fn(&storage::TrajectoryGroup) -> bool>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            read_timeout: READ_TIMEOUT,
            #[cfg(feature = "adversary")]
            testing_oversized_answer: false,
            #[cfg(feature = "adversary")]
            testing_withhold: None,
        }
    }
}

/// Worker side: answers pulls from `learner` (and refuses every other peer) until the
/// service shuts down. Run it as a task.
pub async fn serve(
    control: libp2p_stream::Control,
    store: Arc<TrajectoryStore>,
    learner: PeerId,
) -> Result<(), PullError> {
    serve_with(control, store, learner, ServeOptions::default()).await
}

/// [`serve`] with explicit [`ServeOptions`].
pub async fn serve_with(
    mut control: libp2p_stream::Control,
    store: Arc<TrajectoryStore>,
    learner: PeerId,
    opts: ServeOptions,
) -> Result<(), PullError> {
    let mut incoming = control
        .accept(TRAJECTORY_PULL)
        .map_err(|_| PullError::AlreadyServed)?;
    #[cfg(feature = "adversary")]
    if opts.testing_oversized_answer {
        tracing::warn!("TEST ATTACK: this worker answers pulls with more groups than leased");
    }
    while let Some((peer, mut stream)) = incoming.next().await {
        if peer != learner {
            tracing::warn!(%peer, "refusing a trajectory pull from a peer that is not the learner");
            let msg = Message::Error {
                message: "only the swarm's learner may pull trajectories".into(),
            };
            let limit = opts.read_timeout;
            tokio::spawn(async move {
                let _ = write_within(&mut stream, &msg, limit).await;
                let _ = stream.close().await;
            });
            continue;
        }
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(&mut stream, store, opts).await {
                tracing::warn!(%peer, error = %e, "trajectory pull failed");
                let msg = Message::Error {
                    message: e.to_string(),
                };
                let _ = write_within(&mut stream, &msg, opts.read_timeout).await;
            }
            let _ = stream.close().await;
        });
    }
    Ok(())
}

/// The `testing_withhold` attack: the lease without the groups it picks (they stay leased
/// until the next pull supersedes the lease).
#[cfg(feature = "adversary")]
fn withhold(
    mut answer: storage::trajectory::LeaseWithLog,
    opts: ServeOptions,
) -> storage::trajectory::LeaseWithLog {
    if let (Some(pick), Some(lease)) = (opts.testing_withhold, answer.lease.as_mut()) {
        lease.groups.retain(|(_, g)| !pick(g));
        if lease.groups.is_empty() {
            answer.lease = None;
        }
    }
    answer
}

async fn handle(
    stream: &mut libp2p::Stream,
    store: Arc<TrajectoryStore>,
    opts: ServeOptions,
) -> Result<(), PullError> {
    let limit = opts.read_timeout;
    // How long the next message may take: longer while a lease is out (the learner verifies).
    let mut wait = limit;
    while let Some(msg) = read_within(stream, MAX_SMALL_MESSAGE, wait, "a pull request").await? {
        wait = limit;
        match msg {
            Message::Pull {
                v_min,
                max_groups,
                ttl_ms,
                commits_from,
            } => {
                let max = max_groups.clamp(1, MAX_GROUPS_PER_LEASE) as usize;
                let ttl = Duration::from_millis(ttl_ms.clamp(MIN_TTL_MS, MAX_TTL_MS));
                // The learner's window moved: what fell out of it is discarded (counted).
                let s = store.clone();
                let pruned = blocking(move || s.prune_below(v_min)).await?;
                if pruned > 0 {
                    tracing::debug!(pruned, v_min, "pruned groups outside the learner's window");
                }
                let s = store.clone();
                // Freshest first (see `TrajectoryStore::lease_newest`), with the commit log
                // taken under the same lock; earlier leases are superseded.
                let answer =
                    blocking(move || s.lease_with_log(v_min, max, ttl, commits_from)).await?;
                let log = CommitLog::of(&answer.log, v_min);
                #[cfg(feature = "adversary")]
                let answer = withhold(answer, opts);
                match answer.lease {
                    None => write_within(stream, &Message::Empty { log }, limit).await?,
                    Some(lease) => {
                        let count = lease.groups.len() as u64;
                        let msg = Message::Lease {
                            lease_id: lease.id,
                            count,
                            log,
                        };
                        write_within(stream, &msg, limit).await?;
                        for (_, g) in &lease.groups {
                            let msg = Message::Group { bytes: g.encode() };
                            write_within(stream, &msg, limit).await?;
                        }
                        #[cfg(feature = "adversary")]
                        if opts.testing_oversized_answer {
                            if let Some((_, g)) = lease.groups.first() {
                                let msg = Message::Group { bytes: g.encode() };
                                write_within(stream, &msg, limit).await?;
                            }
                        }
                        metrics::counter!("pull_groups_served_total").increment(count);
                        wait = limit.max(ttl);
                    }
                }
            }
            Message::Ack { lease_id } => {
                let s = store.clone();
                let consumed = blocking(move || s.ack(lease_id)).await?;
                write_within(stream, &Message::Done { consumed }, limit).await?;
            }
            Message::Release { lease_id } => {
                let s = store.clone();
                blocking(move || s.release(lease_id)).await?;
                write_within(stream, &Message::Done { consumed: 0 }, limit).await?;
            }
            other => {
                return Err(PullError::Protocol(format!(
                    "unexpected message from the learner: {other:?}"
                )));
            }
        }
    }
    Ok(())
}
