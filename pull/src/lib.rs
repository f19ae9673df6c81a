//! The trajectory pull protocol (`docs/pull.md`): the learner pulls admissible groups from a
//! rollout worker in two phases so that nothing is lost if either side dies mid-transfer.
//!
//! 1. `Pull{v_min, max, ttl}` → the worker prunes what fell below `v_min` (the learner's
//!    window; counted as discarded-stale), *leases* up to `max` groups with `v ≥ v_min`
//!    (`TrajectoryStore::lease`) and streams them.
//! 2. The learner decodes and checks every group completely ([`storage::record::check_group`]
//!    against the [`GroupLimits`] of its request: schema, vocabulary, context, log-prob floor,
//!    group size, and that the producer is the peer pulled from), writes the valid ones to its own sled
//!    buffer with `put_groups_dedup` (durable, deduplicated by trajectory id), and only then
//!    sends `Ack{lease}`; the worker deletes the leased groups (`TrajectoryStore::ack`).
//!
//! If the learner dies before acking, the lease expires and the groups are pulled again; the
//! learner's dedup keeps them from entering its buffer twice. If the worker dies, its groups
//! are still in its store when it restarts. Only the swarm's learner may pull.
//!
//! Owns: the protocol's name ([`TRAJECTORY_PULL`]), its messages ([`wire`]), the worker side
//! ([`serve`]) and the learner side ([`pull`]). Must not touch: the swarm itself (it uses `p2p`'s stream control) or the store
//! formats (it calls `storage`).

pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use libp2p::StreamProtocol;
use p2p::PeerId;
use storage::record::{check_group, GroupLimits, GroupRejection};
use storage::{TrajectoryGroup, TrajectoryStore};

use wire::{read_message, write_message, Message, MAX_GROUPS_PER_LEASE, MAX_TTL_MS, MIN_TTL_MS};

/// Learner → rollout worker two-phase trajectory pull (pull, then ack). Version 2: every
/// message in one `p2p::framing` frame (version 1 used a 4-byte big-endian length).
pub const TRAJECTORY_PULL: StreamProtocol =
    StreamProtocol::new("/echo-swarm/trajectory-pull/2.0.0");

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("storage: {0}")]
    Storage(#[from] storage::StorageError),
    #[error("cannot open a pull stream to {peer}: {reason}")]
    Open { peer: PeerId, reason: String },
    #[error("the worker refused: {0}")]
    Refused(String),
    #[error("the pull protocol is already served on this node")]
    AlreadyServed,
    /// The worker announced more groups than the learner asked for: nothing is read or stored.
    #[error("the worker announced a lease of {count} groups, more than the {max} asked for")]
    OversizedLease { count: u64, max: u64 },
    #[error("background task failed: {0}")]
    Join(String),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, storage::StorageError> + Send + 'static,
) -> Result<T, PullError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PullError::Join(e.to_string()))?
        .map_err(PullError::from)
}

/// Worker side: answers pulls from `learner` (and refuses every other peer) until the
/// service shuts down. Run it as a task.
pub async fn serve(
    mut control: libp2p_stream::Control,
    store: Arc<TrajectoryStore>,
    learner: PeerId,
) -> Result<(), PullError> {
    let mut incoming = control
        .accept(TRAJECTORY_PULL)
        .map_err(|_| PullError::AlreadyServed)?;
    while let Some((peer, mut stream)) = incoming.next().await {
        if peer != learner {
            tracing::warn!(%peer, "refusing a trajectory pull from a peer that is not the learner");
            let msg = Message::Error {
                message: "only the swarm's learner may pull trajectories".into(),
            };
            let _ = write_message(&mut stream, &msg).await;
            let _ = stream.close().await;
            continue;
        }
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(&mut stream, store).await {
                tracing::warn!(%peer, error = %e, "trajectory pull failed");
                let _ = write_message(
                    &mut stream,
                    &Message::Error {
                        message: e.to_string(),
                    },
                )
                .await;
            }
            let _ = stream.close().await;
        });
    }
    Ok(())
}

async fn handle(stream: &mut libp2p::Stream, store: Arc<TrajectoryStore>) -> Result<(), PullError> {
    while let Some(msg) = read_message(stream).await? {
        match msg {
            Message::Pull {
                v_min,
                max_groups,
                ttl_ms,
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
                // Freshest first (see `TrajectoryStore::lease_newest`).
                match blocking(move || s.lease_newest(v_min, max, ttl)).await? {
                    None => write_message(stream, &Message::Empty).await?,
                    Some(lease) => {
                        let count = lease.groups.len() as u64;
                        write_message(
                            stream,
                            &Message::Lease {
                                lease_id: lease.id,
                                count,
                            },
                        )
                        .await?;
                        for (_, g) in &lease.groups {
                            write_message(stream, &Message::Group { bytes: g.encode() }).await?;
                        }
                        metrics::counter!("pull_groups_served_total").increment(count);
                    }
                }
            }
            Message::Ack { lease_id } => {
                let s = store.clone();
                let consumed = blocking(move || s.ack(lease_id)).await?;
                write_message(stream, &Message::Done { consumed }).await?;
            }
            Message::Release { lease_id } => {
                let s = store.clone();
                blocking(move || s.release(lease_id)).await?;
                write_message(stream, &Message::Done { consumed: 0 }).await?;
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

/// The learner's verification of a group that passed [`check_group`], run on a blocking
/// thread before the group is stored (it may recompute rewards or log-probs). A rejection is
/// reported per reason in [`PullOutcome::rejected`]; the group is neither stored nor trained,
/// but it is acked like an invalid one (the worker must not offer it again).
pub trait GroupVerifier: Send + Sync {
    fn verify(&self, worker: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection>;
}

/// Accepts every group that passed [`check_group`] (what [`pull`] uses).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoVerification;

impl GroupVerifier for NoVerification {
    fn verify(&self, _: &PeerId, _: &TrajectoryGroup) -> Result<(), GroupRejection> {
        Ok(())
    }
}

/// What the learner asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PullRequest {
    /// Oldest admissible version, `v_learner − S` (saturating).
    pub v_min: u64,
    /// At most this many groups; a lease announcing more is refused whole.
    pub max_groups: u64,
    pub ttl: Duration,
    /// What a received group must satisfy to be stored ([`check_group`]).
    pub limits: GroupLimits,
}

/// What one pull achieved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullOutcome {
    pub lease_id: Option<u64>,
    /// Groups received.
    pub received: usize,
    /// Groups newly stored in the learner's buffer.
    pub stored: usize,
    /// Groups already in the buffer (a repeated pull).
    pub duplicates: usize,
    /// Groups refused: undecodable, invalid, or older than `v_min` (the sum of `rejected`).
    pub invalid: usize,
    /// Refused groups by [`GroupRejection::reason`], so the caller can penalise the peer.
    pub rejected: BTreeMap<&'static str, usize>,
    /// Groups the worker deleted on our ack.
    pub consumed_on_worker: u64,
    pub bytes: u64,
}

/// Learner side: one pull from `worker` into `buffer` (see the crate docs for the order of
/// operations that makes it crash-safe).
pub async fn pull(
    control: &mut libp2p_stream::Control,
    worker: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
) -> Result<PullOutcome, PullError> {
    pull_verified(control, worker, buffer, req, Arc::new(NoVerification)).await
}

/// [`pull`] with the learner's [`GroupVerifier`] run over the groups that pass
/// [`check_group`], before they are stored.
pub async fn pull_verified(
    control: &mut libp2p_stream::Control,
    worker: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
    verifier: Arc<dyn GroupVerifier>,
) -> Result<PullOutcome, PullError> {
    let mut stream = control
        .open_stream(worker, TRAJECTORY_PULL)
        .await
        .map_err(|e| PullError::Open {
            peer: worker,
            reason: e.to_string(),
        })?;
    let result = pull_on(&mut stream, worker, buffer, req, verifier).await;
    let _ = stream.close().await;
    result
}

async fn pull_on(
    stream: &mut libp2p::Stream,
    peer: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
    verifier: Arc<dyn GroupVerifier>,
) -> Result<PullOutcome, PullError> {
    let worker = &peer.to_base58();
    let ask = Message::Pull {
        v_min: req.v_min,
        max_groups: req.max_groups,
        ttl_ms: req.ttl.as_millis() as u64,
    };
    write_message(stream, &ask).await?;
    let (lease_id, count) = match read_message(stream).await? {
        Some(Message::Empty) => return Ok(PullOutcome::default()),
        Some(Message::Lease { lease_id, count })
            if count <= req.max_groups.clamp(1, MAX_GROUPS_PER_LEASE) =>
        {
            (lease_id, count)
        }
        Some(Message::Lease { count, .. }) => {
            // More than asked for: the worker wants the learner to allocate and store what it
            // did not ask for. Refused whole, before reading a group (the lease expires).
            metrics::counter!("pull_oversized_leases_total").increment(1);
            return Err(PullError::OversizedLease {
                count,
                max: req.max_groups,
            });
        }
        Some(Message::Error { message }) => return Err(PullError::Refused(message)),
        other => {
            return Err(PullError::Protocol(format!(
                "expected a lease, got {other:?}"
            )))
        }
    };
    let mut out = PullOutcome {
        lease_id: Some(lease_id),
        ..PullOutcome::default()
    };
    let mut valid: Vec<TrajectoryGroup> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let Some(Message::Group { bytes }) = read_message(stream).await? else {
            return Err(PullError::Protocol(
                "lease ended before all its groups".into(),
            ));
        };
        out.received += 1;
        out.bytes += bytes.len() as u64;
        let checked = TrajectoryGroup::decode(&bytes)
            .map_err(|e| GroupRejection::Malformed(e.to_string()))
            .and_then(|g| admit(g, worker, &req));
        match checked {
            Ok(g) => valid.push(g),
            Err(why) => {
                tracing::warn!(%worker, reason = why.reason(), detail = %why, "worker sent a group the learner refuses");
                metrics::counter!("pull_groups_rejected_total", "reason" => why.reason())
                    .increment(1);
                *out.rejected.entry(why.reason()).or_default() += 1;
                out.invalid += 1;
            }
        }
    }
    // Verification (may recompute rewards or log-probs) off the async runtime, then durable
    // before the ack: a crash from here on loses nothing.
    let checked = out.invalid as u64;
    let (keys, unverified) = blocking(move || {
        let mut unverified = Vec::new();
        valid.retain(|g| match verifier.verify(&peer, g) {
            Ok(()) => true,
            Err(why) => {
                unverified.push(why);
                false
            }
        });
        let invalid = checked + unverified.len() as u64;
        if invalid > 0 {
            buffer.record_rejected(invalid)?;
        }
        Ok((buffer.put_groups_dedup(&valid)?, unverified))
    })
    .await?;
    for why in unverified {
        tracing::warn!(%worker, reason = why.reason(), detail = %why, "worker sent a group that fails verification");
        metrics::counter!("pull_groups_rejected_total", "reason" => why.reason()).increment(1);
        *out.rejected.entry(why.reason()).or_default() += 1;
        out.invalid += 1;
    }
    out.stored = keys.iter().filter(|k| k.is_some()).count();
    out.duplicates = keys.len() - out.stored;
    write_message(stream, &Message::Ack { lease_id }).await?;
    match read_message(stream).await? {
        Some(Message::Done { consumed }) => out.consumed_on_worker = consumed,
        Some(Message::Error { message }) => return Err(PullError::Refused(message)),
        other => return Err(PullError::Protocol(format!("expected done, got {other:?}"))),
    }
    metrics::counter!("pull_groups_stored_total").increment(out.stored as u64);
    Ok(out)
}

/// Admission of one decoded group from `worker`: admissible version, then [`check_group`].
fn admit(
    g: TrajectoryGroup,
    worker: &str,
    req: &PullRequest,
) -> Result<TrajectoryGroup, GroupRejection> {
    if g.version < req.v_min {
        return Err(GroupRejection::Inadmissible {
            version: g.version,
            v_min: req.v_min,
        });
    }
    check_group(&g, &req.limits, worker)?;
    Ok(g)
}
