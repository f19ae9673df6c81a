//! The trajectory pull protocol (`docs/pull.md`): the learner pulls admissible groups from a
//! rollout worker in two phases so that nothing is lost if either side dies mid-transfer.
//!
//! 1. `Pull{v_min, max, ttl}` → the worker prunes what fell below `v_min` (the learner's
//!    window; counted as discarded-stale), *leases* up to `max` groups with `v ≥ v_min`
//!    (`TrajectoryStore::lease`) and streams them.
//! 2. The learner decodes every group and hands it to its [`GroupVerifier`] — the learner's
//!    one verification pipeline, or [`NoVerification`]: this crate's own admission
//!    ([`admit`]: admissible version, then [`storage::record::check_group`] against the
//!    [`GroupLimits`] of the request: schema, vocabulary, context, log-prob floor, group size,
//!    and that the producer is the peer pulled from) —, writes the accepted ones to its own
//!    sled buffer with `put_groups_dedup` (durable, deduplicated by trajectory id), and only
//!    then sends `Ack{lease}`; the worker deletes the leased groups (`TrajectoryStore::ack`).
//!
//! If the learner dies before acking, the lease expires and the groups are pulled again; the
//! learner's dedup keeps them from entering its buffer twice. If the worker dies, its groups
//! are still in its store when it restarts. Only the swarm's learner may pull.
//!
//! Every byte from the worker is bounded by the request: a lease may not announce more groups
//! than asked, each group frame is read only up to what is left of the pull's byte budget
//! ([`byte_budget`]: the groups asked × the largest group the request's limits allow, each
//! within the frame maximum), a group beyond the lease is refused ([`PullError::OversizedAnswer`]),
//! and every read and write on either side has a deadline ([`READ_TIMEOUT`] by default;
//! [`PullError::Timeout`]). [`PullError::offence`] tells the caller which failures are the
//! worker's fault ([`Offence`]: this protocol's own reasons for a strike).
//!
//! Owns: the protocol's name ([`TRAJECTORY_PULL`]), its messages ([`wire`]), the worker side
//! ([`serve`], module `serve`) and the learner side ([`pull`]). Must not touch: the swarm
//! itself (it opens streams through [`p2p::Client::open_stream`], which dials a worker the
//! learner is not connected to by the node's one dial rule) or the store formats (it calls
//! `storage`).

mod budget;
mod serve;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;
use p2p::framing::frame_deadline;
use p2p::{PeerId, PeerReport, ReportLabel};
use storage::record::{check_group, GroupLimits};
use storage::{Rejection, StructureFault};
use storage::{TrajectoryGroup, TrajectoryStore};

pub use budget::{byte_budget, max_group_bytes};
pub use serve::{serve, serve_with, ServeOptions};
use wire::{read_message_bounded, write_message, Message, MAX_GROUPS_PER_LEASE};
pub use wire::{CommitLog, Committed, LogEntry};

/// Learner → rollout worker two-phase trajectory pull (pull, then ack). Version 3: the pull
/// names where the worker's commit log is to start (`commits_from`) and supersedes every
/// earlier lease; the lease and empty answers carry the commit log (`wire::CommitLog`,
/// `control::commits`). Version 2 put every message in one `p2p::framing` frame (version 1
/// used a 4-byte big-endian length).
pub const TRAJECTORY_PULL: StreamProtocol =
    StreamProtocol::new("/echo-swarm/trajectory-pull/3.1.0");

/// Default deadline for one message (read or write) on a pull stream, and for opening it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Floor of the transfer rate a deadline allows for a large frame: a frame of `n` bytes may
/// take `READ_TIMEOUT + n / MIN_RATE_BYTES_PER_S` (`p2p::framing::frame_deadline`).
pub use p2p::framing::MIN_RATE_BYTES_PER_S;

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
    /// The worker sent more than the request allows: a frame past the pull's byte budget, or
    /// a group beyond the lease it announced.
    #[error("oversized answer: {0}")]
    OversizedAnswer(String),
    /// The peer sent nothing (or could not take our message) before the deadline.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: &'static str, after: Duration },
    #[error("background task failed: {0}")]
    Join(String),
}

impl PullError {
    /// The offence this failure is of the peer on the other end, or `None` when it is not
    /// evidence against the peer (a local store error, a connection that could not open or
    /// dropped, a refusal). Oversized leases and answers → [`Offence::OversizedAnswer`];
    /// broken protocol and missed deadlines → [`Offence::StreamViolation`].
    pub fn offence(&self) -> Option<Offence> {
        match self {
            PullError::OversizedLease { .. } | PullError::OversizedAnswer(_) => {
                Some(Offence::OversizedAnswer)
            }
            PullError::Protocol(_) | PullError::Timeout { .. } => Some(Offence::StreamViolation),
            PullError::Io(_)
            | PullError::Storage(_)
            | PullError::Open { .. }
            | PullError::Refused(_)
            | PullError::AlreadyServed
            | PullError::Join(_) => None,
        }
    }

    /// A stream that ended where a message belonged, with nothing in it for the worker to
    /// gain: an I/O error (`UnexpectedEof`), so no strike — the cases are at the call sites.
    fn lost_stream(what: &'static str) -> PullError {
        PullError::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what))
    }

    /// Whether the peer is to blame (see [`PullError::offence`]).
    pub fn is_peer_fault(&self) -> bool {
        self.offence().is_some()
    }
}

/// What a pull can show against the worker, for a strike ([`PullError::offence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offence {
    /// A lease larger than requested, a group beyond the lease it announced, or a frame over
    /// its bound. No honest worker sends one (the learner's request bounds what it may
    /// announce, and its own lease bounds what it sends): a ban at once.
    OversizedAnswer,
    /// A stream that missed its read deadline or broke protocol: a slow link can do it too.
    StreamViolation,
}

impl Offence {
    /// Every offence, in declaration order.
    pub const ALL: [Offence; 2] = [Offence::OversizedAnswer, Offence::StreamViolation];

    /// Its stable name (status, metrics, logs, the ban list).
    pub fn label(self) -> ReportLabel {
        match self {
            Offence::OversizedAnswer => ReportLabel::new("oversized_answer"),
            Offence::StreamViolation => ReportLabel::new("stream_violation"),
        }
    }

    /// The report for the network service: an oversized answer is proof, a stream
    /// violation a strike.
    pub fn report(self) -> PeerReport {
        match self {
            Offence::OversizedAnswer => PeerReport::fatal(self.label()),
            Offence::StreamViolation => PeerReport::strike(self.label()),
        }
    }
}

/// Reads one message of at most `max` bytes within `limit` (plus the rate allowance).
pub(crate) async fn read_within<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    limit: Duration,
    what: &'static str,
) -> Result<Option<Message>, PullError> {
    let after = frame_deadline(limit, max as u64);
    tokio::time::timeout(after, read_message_bounded(r, max))
        .await
        .map_err(|_| PullError::Timeout { what, after })?
}

/// Writes one message within `limit` (plus the rate allowance for its size).
pub(crate) async fn write_within<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Message,
    limit: Duration,
) -> Result<(), PullError> {
    let size = match msg {
        Message::Group { bytes } => bytes.len(),
        _ => 0,
    };
    let after = frame_deadline(limit, size as u64);
    tokio::time::timeout(after, write_message(w, msg))
        .await
        .map_err(|_| PullError::Timeout {
            what: "the peer to take a message",
            after,
        })?
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, storage::StorageError> + Send + 'static,
) -> Result<T, PullError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PullError::Join(e.to_string()))?
        .map_err(PullError::from)
}

/// The learner's verification of every decoded group, run on a blocking thread before the
/// group is stored (it may recompute rewards or log-probs): the whole chain, admission by the
/// request's `v_min` and limits included. A rejection is reported per reason in
/// [`PullOutcome::rejected`]; the group is neither stored nor trained, but it is acked like
/// every other (the worker must not offer it again).
pub trait GroupVerifier: Send + Sync {
    fn verify(
        &self,
        worker: &PeerId,
        req: &PullRequest,
        group: &TrajectoryGroup,
    ) -> Result<(), Rejection>;

    /// Sees every answer's commit log and the groups of its lease as decoded (before any is
    /// verified), once the whole lease is read (`control::commits` judges them). Default:
    /// nothing.
    fn account(&self, _worker: &PeerId, _req: &PullRequest, _answer: &AnswerLog<'_>) {}
}

/// A pull answer's commitments and what its lease delivered.
#[derive(Debug, Clone, Copy)]
pub struct AnswerLog<'a> {
    pub log: &'a CommitLog,
    /// `(seq, version, content hash)` of each decoded group of the lease.
    pub delivered: &'a [(u64, u64, [u8; 32])],
}

/// This crate's own admission only ([`admit`]; what [`pull`] uses): a caller without a
/// verification pipeline of its own.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoVerification;

impl GroupVerifier for NoVerification {
    fn verify(
        &self,
        worker: &PeerId,
        req: &PullRequest,
        group: &TrajectoryGroup,
    ) -> Result<(), Rejection> {
        admit(group, &worker.to_base58(), req)
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
    /// Where the worker's commit log is to start: the next number the learner expects of it
    /// (`None`: a worker not met yet).
    pub commits_from: Option<u64>,
}

/// What one pull achieved.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Why each refused group was refused, in the order read, so the caller can penalise
    /// the peer.
    pub rejected: Vec<Rejection>,
    /// Groups the worker deleted on our ack.
    pub consumed_on_worker: u64,
    pub bytes: u64,
}

impl PullOutcome {
    /// Valid groups the worker delivered (stored now or already held): what the learner's
    /// `control::pulls::PullLedger::record_delivery` counts. Refused groups do not count.
    pub fn delivered(&self) -> u64 {
        (self.stored + self.duplicates) as u64
    }
}

/// Learner side: one pull from `worker` into `buffer` (see the crate docs for the order of
/// operations that makes it crash-safe).
pub async fn pull(
    client: &p2p::Client,
    worker: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
) -> Result<PullOutcome, PullError> {
    pull_verified(client, worker, buffer, req, Arc::new(NoVerification)).await
}

/// [`pull`] with the learner's [`GroupVerifier`] run over every decoded group before it is
/// stored.
pub async fn pull_verified(
    client: &p2p::Client,
    worker: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
    verifier: Arc<dyn GroupVerifier>,
) -> Result<PullOutcome, PullError> {
    pull_verified_with(
        client,
        worker,
        buffer,
        req,
        verifier,
        PullOptions::default(),
    )
    .await
}

/// Settings of the learner side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullOptions {
    /// Deadline for opening the stream and for each message (plus the rate allowance of
    /// [`MIN_RATE_BYTES_PER_S`] for a large group frame).
    pub read_timeout: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            read_timeout: READ_TIMEOUT,
        }
    }
}

/// [`pull_verified`] with explicit [`PullOptions`].
pub async fn pull_verified_with(
    client: &p2p::Client,
    worker: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
    verifier: Arc<dyn GroupVerifier>,
    opts: PullOptions,
) -> Result<PullOutcome, PullError> {
    // Through the client, not `libp2p_stream` directly: a worker the learner is not connected
    // to (its connection dropped, it joined through another peer) is dialed from a fresh
    // port with every address the node holds for it, and the open is tried again when a dial
    // it waited for fails (`p2p::Client::open_stream`).
    let open = tokio::time::timeout(
        opts.read_timeout,
        client.open_stream(worker, TRAJECTORY_PULL),
    )
    .await
    .map_err(|_| PullError::Open {
        peer: worker,
        reason: format!("no stream within {:?}", opts.read_timeout),
    })?;
    let mut stream = open.map_err(|e| PullError::Open {
        peer: worker,
        reason: e.to_string(),
    })?;
    let result = pull_on(&mut stream, worker, buffer, req, verifier, opts).await;
    if let Err(e) = &result {
        if let Some(o) = e.offence() {
            metrics::counter!("pull_peer_faults_total", "reason" => o.label().as_str())
                .increment(1);
        }
    }
    // Bounded too: a peer that stops reading must not hold the learner here.
    let _ = tokio::time::timeout(opts.read_timeout, stream.close()).await;
    result
}

/// The learner side of one pull on an open stream (any transport: the tests drive it over
/// in-memory pipes as well).
pub async fn pull_on<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer: PeerId,
    buffer: Arc<TrajectoryStore>,
    req: PullRequest,
    verifier: Arc<dyn GroupVerifier>,
    opts: PullOptions,
) -> Result<PullOutcome, PullError> {
    let limit = opts.read_timeout;
    let worker = &peer.to_base58();
    let asked = req.max_groups.clamp(1, MAX_GROUPS_PER_LEASE);
    let ask = Message::Pull {
        v_min: req.v_min,
        max_groups: req.max_groups,
        ttl_ms: req.ttl.as_millis() as u64,
        commits_from: req.commits_from,
    };
    write_within(stream, &ask, limit).await?;
    // A lease, empty or error answer is small but for its commit log: no group-sized frame
    // before the lease.
    let small = wire::MAX_SMALL_MESSAGE;
    let answer = read_within(stream, wire::MAX_LOG_MESSAGE, limit, "the lease").await?;
    let (lease_id, count, log) = match answer {
        Some(Message::Empty { log }) => {
            let v = verifier.clone();
            blocking(move || {
                v.account(
                    &peer,
                    &req,
                    &AnswerLog {
                        log: &log,
                        delivered: &[],
                    },
                );
                Ok(())
            })
            .await?;
            return Ok(PullOutcome::default());
        }
        Some(Message::Lease {
            lease_id,
            count,
            log,
        }) if count <= asked => (lease_id, count, log),
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
        // The stream ended before any answer. An honest worker's node does this when it is
        // busy: libp2p-stream hands inbound streams to the accepting task through a one-slot
        // channel and drops the stream when the slot is still taken (the task has not been
        // polled since the last one), and the learner reads the end of the stream. It carries
        // nothing, so the worker gains nothing by it: a lost stream, not a strike (seen as an
        // intermittent honest strike under load in the adversary suite).
        None => {
            return Err(PullError::lost_stream(
                "the worker's node closed the stream before answering",
            ))
        }
        Some(other) => {
            return Err(PullError::Protocol(format!(
                "expected a lease, got {other:?}"
            )))
        }
    };
    let mut out = PullOutcome {
        lease_id: Some(lease_id),
        ..PullOutcome::default()
    };
    let mut valid = read_groups(stream, count, &req, limit, worker, &mut out).await?;
    // Verification (may recompute rewards or log-probs) off the async runtime, then durable
    // before the ack: a crash from here on loses nothing.
    let checked = out.invalid as u64;
    let (keys, unverified) = blocking(move || {
        // The commitments first: they judge what was delivered, whatever the checks find.
        let delivered: Vec<(u64, u64, [u8; 32])> = valid
            .iter()
            .map(|g| (g.seq, g.version, g.content_hash()))
            .collect();
        let answer = AnswerLog {
            log: &log,
            delivered: &delivered,
        };
        verifier.account(&peer, &req, &answer);
        let mut unverified = Vec::new();
        valid.retain(|g| match verifier.verify(&peer, &req, g) {
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
        tracing::warn!(%worker, reason = why.as_str(), detail = %why, "worker sent a group that fails verification");
        metrics::counter!("pull_groups_rejected_total", "reason" => why.as_str()).increment(1);
        out.rejected.push(why);
        out.invalid += 1;
    }
    out.stored = keys.iter().filter(|k| k.is_some()).count();
    out.duplicates = keys.len() - out.stored;
    write_within(stream, &Message::Ack { lease_id }, limit).await?;
    match read_within(stream, small, limit, "the ack's answer").await {
        Ok(Some(Message::Done { consumed })) => out.consumed_on_worker = consumed,
        Ok(Some(Message::Error { message })) => return Err(PullError::Refused(message)),
        // A group where the answer to the ack belongs: more groups than the lease announced.
        Ok(Some(Message::Group { .. })) | Err(PullError::OversizedAnswer(_)) => {
            metrics::counter!("pull_oversized_answers_total").increment(1);
            return Err(PullError::OversizedAnswer(format!(
                "a group beyond the {count} the lease announced"
            )));
        }
        // The stream ended where the worker's `Done` belonged. The groups are stored; the
        // worker gains nothing by it, and an honest worker does it when the learner took
        // longer than the worker's deadline to verify and ack (a busy learner is the
        // learner's fault): a lost stream, not a strike. Unacked groups come back after
        // their lease expires and are deduplicated.
        Ok(None) => {
            return Err(PullError::lost_stream(
                "the worker closed the stream before confirming the ack",
            ))
        }
        Ok(Some(other)) => {
            return Err(PullError::Protocol(format!("expected done, got {other:?}")))
        }
        Err(e) => return Err(e),
    }
    metrics::counter!("pull_groups_stored_total").increment(out.stored as u64);
    Ok(out)
}

/// Reads the `count` groups a lease announced, each bounded by the request's per-group bound
/// and what is left of the pull's byte budget (never the peer's announcement); decodes them,
/// counting what does not decode in `out` (a rejection of the worker's, not an error of the
/// pull). An oversized or missing group ends the pull.
async fn read_groups<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    count: u64,
    req: &PullRequest,
    limit: Duration,
    worker: &str,
    out: &mut PullOutcome,
) -> Result<Vec<TrajectoryGroup>, PullError> {
    let mut valid: Vec<TrajectoryGroup> = Vec::with_capacity(count as usize);
    // What the groups of this pull may take in all, and each one at most: the request's
    // bound, never the peer's announcement.
    let per_group = max_group_bytes(&req.limits);
    let mut budget = byte_budget(req);
    for _ in 0..count {
        // Frame = tag byte + the group behind its varint length.
        let max = per_group.min(budget as usize) + wire::GROUP_FRAME_OVERHEAD;
        let bytes = match read_within(stream, max, limit, "a group").await {
            Ok(Some(Message::Group { bytes })) => bytes,
            Ok(_) => {
                return Err(PullError::Protocol(
                    "lease ended before all its groups".into(),
                ))
            }
            Err(PullError::OversizedAnswer(why)) => {
                metrics::counter!("pull_oversized_answers_total").increment(1);
                return Err(PullError::OversizedAnswer(format!(
                    "{why} (per-group bound {per_group} B, {budget} B left of the pull's budget)"
                )));
            }
            Err(e) => return Err(e),
        };
        budget = budget.saturating_sub(bytes.len() as u64);
        out.received += 1;
        out.bytes += bytes.len() as u64;
        match TrajectoryGroup::decode(&bytes)
            .map_err(|e| Rejection::from(StructureFault::Malformed(e.to_string())))
        {
            Ok(g) => valid.push(g),
            Err(why) => {
                tracing::warn!(%worker, reason = why.as_str(), detail = %why, "worker sent a group the learner refuses");
                metrics::counter!("pull_groups_rejected_total", "reason" => why.as_str())
                    .increment(1);
                out.rejected.push(why);
                out.invalid += 1;
            }
        }
    }
    Ok(valid)
}

/// This crate's admission of one decoded group from `worker` (base58): admissible version,
/// then [`check_group`] against the request's limits. A learner with a verification pipeline
/// runs the same two checks as its pipeline's first stage instead.
pub fn admit(g: &TrajectoryGroup, worker: &str, req: &PullRequest) -> Result<(), Rejection> {
    if g.version < req.v_min {
        return Err(Rejection::Inadmissible {
            version: g.version,
            v_min: req.v_min,
        });
    }
    Ok(check_group(g, &req.limits, worker)?)
}
