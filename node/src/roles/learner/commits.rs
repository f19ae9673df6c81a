//! The learner's side of committed group numbers (`control::commits`, `docs/security.md`,
//! "Withholding"): every pull answer's commit log and the groups of its lease go through the
//! book, and what it finds is queued for the puller, which strikes the worker
//! (`Strike::Withheld`, one per withheld number, uncommitted or mismatched group).
//!
//! Owns: the book, the queue of verdicts and the per-worker counts shown as evidence. Must
//! not touch: the pull protocol (it only implements `pull::GroupVerifier::account`), the
//! swarm (the puller strikes).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use control::commits::{
    Abandoning, Account, Answer, CommitBook, CommitEntry, Commitment, DeliveredGroup,
};
use p2p::PeerId;
use storage::Rejection;
use storage::TrajectoryGroup;

/// Per-worker counts of what the book resolved (for status' evidence).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Numbers withheld (struck).
    pub withheld: u64,
    /// Delivered groups that were never committed, or differ from their commitment (struck).
    pub broken: u64,
    /// Committed numbers that aged out of the learner's window (honest).
    pub stale: u64,
    /// Committed numbers delivered.
    pub delivered: u64,
    /// Admissible numbers whose episode failed in the environment program (honest, bounded).
    pub abandoned: u64,
}

struct Inner {
    book: CommitBook<PeerId>,
    abandoning: Abandoning,
    queued: Vec<(PeerId, Account)>,
    counts: HashMap<PeerId, CommitCounts>,
}

/// The book, shared by the pulls in flight and the puller.
#[derive(Clone)]
pub struct Commitments(Arc<Mutex<Inner>>);

impl Commitments {
    /// An empty book judging abandoned numbers by `abandoning`.
    pub fn new(abandoning: Abandoning) -> Self {
        Commitments(Arc::new(Mutex::new(Inner {
            book: CommitBook::new(),
            abandoning,
            queued: Vec::new(),
            counts: HashMap::new(),
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is a whole answer's: a poisoned lock still holds a consistent book.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the next pull of `peer` asks the log from.
    pub fn next(&self, peer: &PeerId) -> Option<u64> {
        self.lock().book.next(peer)
    }

    /// Judges one answer of `peer` to a pull with window floor `v_min`.
    pub fn account(&self, peer: &PeerId, req: &pull::PullRequest, answer: &pull::AnswerLog<'_>) {
        let log: Vec<CommitEntry> = answer
            .log
            .entries
            .iter()
            .map(|e| CommitEntry {
                version: e.version,
                commitment: match e.committed {
                    pull::Committed::Hash(h) => Commitment::Hash(h),
                    pull::Committed::Omitted => Commitment::Omitted,
                    pull::Committed::Abandoned => Commitment::Abandoned,
                },
            })
            .collect();
        let delivered: Vec<DeliveredGroup> = answer
            .delivered
            .iter()
            .map(|&(seq, version, hash)| DeliveredGroup { seq, version, hash })
            .collect();
        let mut inner = self.lock();
        let a = Answer {
            asked: req.max_groups.clamp(1, pull::wire::MAX_GROUPS_PER_LEASE),
            v_min: req.v_min,
            log_from: answer.log.from,
            log: &log,
            delivered: &delivered,
            abandoning: inner.abandoning,
        };
        let account = inner.book.account(peer, &a);
        let c = inner.counts.entry(*peer).or_default();
        c.withheld += account.withheld.len() as u64;
        c.broken += account.uncommitted + account.mismatched;
        c.stale += account.stale;
        c.delivered += account.delivered;
        c.abandoned += account.abandoned;
        if account.abandoned > 0 {
            metrics::counter!("learner_groups_abandoned_total").increment(account.abandoned);
        }
        if account.strikes() > 0 {
            tracing::warn!(%peer, withheld = ?account.withheld, uncommitted = account.uncommitted,
                mismatched = account.mismatched, "a worker kept committed groups back or delivered groups it had not committed");
            inner.queued.push((*peer, account));
        }
    }

    /// The verdicts queued since the last call.
    pub fn take_verdicts(&self) -> Vec<(PeerId, Account)> {
        std::mem::take(&mut self.lock().queued)
    }

    /// Forgets `peer` (banned): its book and counts.
    pub fn forget(&self, peer: &PeerId) {
        let mut inner = self.lock();
        inner.book.forget(peer);
        inner.counts.remove(peer);
    }

    /// Every worker's counts, by base58 id.
    pub fn counts(&self) -> BTreeMap<String, CommitCounts> {
        self.lock()
            .counts
            .iter()
            .map(|(p, c)| (p.to_base58(), *c))
            .collect()
    }
}

/// The learner's pull verifier with the commitments kept: groups go through the pipeline
/// ([`super::verify::PullVerifier`]), answers through the book.
pub struct CommittedVerifier {
    pub inner: super::verify::PullVerifier,
    pub commits: Commitments,
}

impl pull::GroupVerifier for CommittedVerifier {
    fn verify(
        &self,
        worker: &PeerId,
        req: &pull::PullRequest,
        group: &TrajectoryGroup,
    ) -> Result<(), Rejection> {
        pull::GroupVerifier::verify(&self.inner, worker, req, group)
    }

    fn account(&self, worker: &PeerId, req: &pull::PullRequest, answer: &pull::AnswerLog<'_>) {
        self.commits.account(worker, req, answer);
    }
}
