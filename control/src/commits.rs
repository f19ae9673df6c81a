//! Committed group numbers: a worker cannot choose which of its groups the learner sees after
//! seeing their rewards (`docs/security.md`, "Withholding").
//!
//! A worker numbers its groups densely, 0, 1, 2, … (the number fixes the prompt the learner
//! assigns and every uniform of its tokens), and *commits* each number — its version and the
//! BLAKE3 hash of its content — in the same durable write that stores the group. Every pull
//! answer carries the commitments made since the last one the learner received (the
//! *commit log*, from the number the learner asks for), atomically with the lease. The learner
//! keeps, per worker, the next number it expects and the numbers committed but not yet
//! resolved, and judges every answer ([`CommitBook::account`]):
//!
//! - **No gaps.** A log that starts past the number asked for skipped numbers: each is a
//!   withheld group (a worker that does not like a group cannot just not commit it).
//! - **Stale is checkable.** A committed number whose version is below the pull's `v_min` —
//!   the learner's own window — is resolved as stale, never struck: this is how an honest
//!   worker's unpulled backlog ages out.
//! - **Delivery in the order the worker's store serves.** An honest worker leases the newest
//!   admissible groups first (by version, then number) and never holds a group back (every
//!   pull supersedes every earlier lease). So after a lease of `count` groups out of `asked`,
//!   every committed admissible number not delivered is withheld when `count < asked`, and
//!   those above the lowest delivered one otherwise.
//! - **Delivered means committed.** A delivered group whose number the log does not name is
//!   `uncommitted`; one whose content hash differs from its commitment is `mismatched`.
//! - **Abandoned only where an episode can fail.** A number committed as abandoned (its
//!   episode failed in an external environment program: no group, no reward) is resolved
//!   without a strike when the run's environment can fail ([`Abandoning::UpTo`]), as long as
//!   the worker's abandoned numbers stay within [`ABANDON_SLACK`] plus a fraction of its
//!   admissible commitments; past that, and always under an environment that cannot fail
//!   (a built-in task), an abandoned admissible number is withheld.
//!
//! Each verdict is about what the worker alone controls (its log, its store, its answer); no
//! count depends on another peer. Pure: no I/O, no clock.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// What a committed number commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commitment {
    /// A group's content hash (an admissible entry).
    Hash([u8; 32]),
    /// Nothing: a stale entry travels without its hash (an admissible one commits to nothing).
    Omitted,
    /// No group: its episode failed in the environment program.
    Abandoned,
}

/// One committed number: the version its group was made (or attempted) under and what it
/// commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitEntry {
    pub version: u64,
    pub commitment: Commitment,
}

/// Whether the run's environment lets an episode fail, and how many abandoned numbers a
/// worker may commit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Abandoning {
    /// The environment cannot fail (a built-in task): every abandoned admissible number is
    /// withheld.
    Never,
    /// An external program: at most [`ABANDON_SLACK`] + `fraction` × the worker's admissible
    /// commitments so far are resolved as abandoned; the rest are withheld.
    UpTo { fraction: f64 },
}

/// Abandoned numbers a worker may commit beyond its fraction (a crash early in a run).
pub const ABANDON_SLACK: u64 = 4;
/// The default fraction of [`Abandoning::UpTo`]: an environment program that fails more than
/// every other episode is not one to train on.
pub const MAX_ABANDONED_FRACTION: f64 = 0.5;

/// A delivered group, as the learner decoded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveredGroup {
    pub seq: u64,
    pub version: u64,
    pub hash: [u8; 32],
}

/// One pull answer, as far as the commitments are concerned.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// Groups the learner asked for.
    pub asked: u64,
    /// The pull's window floor.
    pub v_min: u64,
    /// The number the log's first entry commits.
    pub log_from: u64,
    /// Entry `i` commits number `log_from + i`.
    pub log: &'a [CommitEntry],
    /// The groups of the lease (every one decoded, whatever the later checks say of it).
    pub delivered: &'a [DeliveredGroup],
    /// Whether abandoned numbers are legitimate in this run.
    pub abandoning: Abandoning,
}

/// What one answer showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    /// Committed admissible numbers not delivered when asked, and numbers skipped by the log.
    pub withheld: Vec<u64>,
    /// Delivered groups whose number was never committed.
    pub uncommitted: u64,
    /// Delivered groups whose content differs from their commitment.
    pub mismatched: u64,
    /// Committed numbers resolved as stale (below the learner's window): honest.
    pub stale: u64,
    /// Committed numbers resolved by delivery.
    pub delivered: u64,
    /// Admissible numbers resolved as abandoned (their episode failed): honest, within the
    /// bound of [`Abandoning`].
    pub abandoned: u64,
}

impl Account {
    /// Strikes this answer earns: one per withheld number, uncommitted or mismatched group.
    pub fn strikes(&self) -> u64 {
        self.withheld.len() as u64 + self.uncommitted + self.mismatched
    }
}

/// Committed, unresolved numbers the learner keeps per worker at most; past it the oldest are
/// forgotten (a worker cannot have more admissible groups than its store's cap anyway).
pub const MAX_OUTSTANDING: usize = 65_536;
/// Workers a [`CommitBook`] keeps at most (cleared when full, as `Standings`).
pub const MAX_WORKERS: usize = 65_536;

#[derive(Debug, Clone, Default)]
struct Commits {
    /// The next number expected in the log.
    next: u64,
    /// Committed numbers not yet resolved: number → (version, content hash).
    outstanding: BTreeMap<u64, (u64, [u8; 32])>,
    /// Admissible entries judged, and those of them resolved as abandoned.
    admissible: u64,
    abandoned: u64,
}

/// The learner's view of every worker's commitments.
#[derive(Debug, Clone)]
pub struct CommitBook<K> {
    peers: HashMap<K, Commits>,
}

impl<K> Default for CommitBook<K> {
    fn default() -> Self {
        CommitBook {
            peers: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> CommitBook<K> {
    pub fn new() -> Self {
        CommitBook {
            peers: HashMap::new(),
        }
    }

    /// The number the next pull asks the log from; `None` for a worker not met yet (it then
    /// sends its log from its oldest kept entry).
    pub fn next(&self, peer: &K) -> Option<u64> {
        self.peers.get(peer).map(|c| c.next)
    }

    /// Committed numbers of `peer` not resolved yet.
    pub fn outstanding(&self, peer: &K) -> usize {
        self.peers.get(peer).map_or(0, |c| c.outstanding.len())
    }

    /// Forgets `peer` (banned, or left).
    pub fn forget(&mut self, peer: &K) {
        self.peers.remove(peer);
    }

    /// Judges one answer of `peer` (see the module doc) and records what it resolved.
    pub fn account(&mut self, peer: &K, a: &Answer<'_>) -> Account {
        if !self.peers.contains_key(peer) && self.peers.len() >= MAX_WORKERS {
            self.peers.clear();
        }
        let known = self.peers.contains_key(peer);
        let c = self.peers.entry(peer.clone()).or_default();
        let mut out = Account::default();
        let log_end = a.log_from.saturating_add(a.log.len() as u64);
        if !known {
            // First contact (a new worker, or this learner restarted): the log holds entries
            // of groups an earlier learner may have taken already, so nothing in it is judged;
            // it only sets where the next log starts. What the worker commits from here on is.
            c.next = log_end;
            return out;
        }
        if a.log_from > c.next {
            // Numbers the log skips: never committed, so never deliverable.
            let gap = a.log_from - c.next;
            let shown = gap.min(MAX_OUTSTANDING as u64);
            out.withheld.extend((a.log_from - shown)..a.log_from);
            c.next = a.log_from;
        }
        for (i, e) in a.log.iter().enumerate() {
            let seq = a.log_from + i as u64;
            if seq < c.next {
                continue; // already known
            }
            if e.version < a.v_min {
                out.stale += 1;
                continue;
            }
            c.admissible += 1;
            match e.commitment {
                Commitment::Hash(h) => {
                    c.outstanding.insert(seq, (e.version, h));
                }
                // An admissible entry without its hash commits to nothing.
                Commitment::Omitted => out.withheld.push(seq),
                Commitment::Abandoned => match a.abandoning {
                    Abandoning::UpTo { fraction }
                        if ((c.abandoned + 1) as f64)
                            <= ABANDON_SLACK as f64 + fraction * c.admissible as f64 =>
                    {
                        c.abandoned += 1;
                        out.abandoned += 1;
                    }
                    Abandoning::UpTo { .. } | Abandoning::Never => out.withheld.push(seq),
                },
            }
        }
        c.next = c.next.max(log_end);
        // The learner's window moved past them: aged out, the worker's store pruned them.
        let stale: Vec<u64> = c
            .outstanding
            .iter()
            .filter(|(_, (v, _))| *v < a.v_min)
            .map(|(s, _)| *s)
            .collect();
        for s in stale {
            c.outstanding.remove(&s);
            out.stale += 1;
        }
        let mut lowest: Option<(u64, u64)> = None;
        for d in a.delivered {
            lowest = Some(lowest.map_or((d.version, d.seq), |l| l.min((d.version, d.seq))));
            match c.outstanding.remove(&d.seq) {
                Some((v, h)) if v == d.version && h == d.hash => out.delivered += 1,
                Some(_) => out.mismatched += 1,
                // Below `next`: resolved before (a lease served again after a lost ack).
                None if d.seq < c.next => {}
                None => out.uncommitted += 1,
            }
        }
        let short = (a.delivered.len() as u64) < a.asked;
        let withheld: Vec<u64> = c
            .outstanding
            .iter()
            .filter(|(s, (v, _))| v >= &a.v_min && (short || lowest.is_some_and(|l| (*v, **s) > l)))
            .map(|(s, _)| *s)
            .collect();
        for s in &withheld {
            c.outstanding.remove(s);
        }
        out.withheld.extend(withheld);
        while c.outstanding.len() > MAX_OUTSTANDING {
            c.outstanding.pop_first();
        }
        out
    }
}

#[cfg(test)]
#[path = "commits_tests.rs"]
mod tests;
