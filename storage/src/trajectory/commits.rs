//! The producer's commit log (`control::commits`, `docs/storage.md`): every group number a
//! worker stored, with its version and content hash, committed in the transaction that stored
//! the group, and served to the learner atomically with a lease.

use std::time::Duration;

use super::{be_u64, Lease, TrajectoryStore, K_NEXT_COMMIT};
use crate::error::{Result, StorageError};

/// Most entries one [`CommitLogRead`] carries; the rest follow in the next pull's log.
pub const MAX_LOG_ENTRIES: usize = 65_536;

/// Consecutive commitments from `from`: entry `i` is number `from + i` (its version and its
/// group's content hash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitLogRead {
    pub from: u64,
    pub entries: Vec<(u64, [u8; 32])>,
}

impl CommitLogRead {
    /// The number after the last entry.
    pub fn end(&self) -> u64 {
        self.from + self.entries.len() as u64
    }
}

/// A lease (if anything is admissible) and the commit log it was taken with.
#[derive(Debug, Clone)]
pub struct LeaseWithLog {
    pub lease: Option<Lease>,
    pub log: CommitLogRead,
}

impl TrajectoryStore {
    /// The number the next group must have to keep the log dense (`None` before the first).
    pub fn next_commit(&self) -> Result<Option<u64>> {
        Ok(self.meta.get(K_NEXT_COMMIT)?.map(|v| be_u64(&v)))
    }

    /// The worker's answer to one pull, under one lock (nothing is stored in between):
    /// 1. every earlier lease is given back — the learner pulls one lease at a time, so a
    ///    new pull supersedes them, and no group is ever held back on a lease it forgot;
    /// 2. commitments below `commits_from` (the learner has them) are deleted;
    /// 3. the log from `commits_from` (from the oldest kept entry when `None`), at most
    ///    [`MAX_LOG_ENTRIES`], up to the first number not committed;
    /// 4. up to `max` groups with `version ≥ v_min`, newest first (as
    ///    [`Self::lease_newest`]), of those the log covers.
    pub fn lease_with_log(
        &self,
        v_min: u64,
        max: usize,
        ttl: Duration,
        commits_from: Option<u64>,
    ) -> Result<LeaseWithLog> {
        let _g = self.lock();
        self.reclaim_expired(u64::MAX)?;
        if let Some(from) = commits_from {
            let old: Vec<sled::IVec> = self
                .commits
                .range(..from.to_be_bytes())
                .keys()
                .collect::<std::result::Result<_, _>>()?;
            let mut b = sled::Batch::default();
            for k in old {
                b.remove(k);
            }
            self.commits.apply_batch(b)?;
        }
        let start = match commits_from {
            Some(f) => f,
            None => match self.commits.first()? {
                Some((k, _)) => key_u64(&k)?,
                None => self.next_commit()?.unwrap_or(0),
            },
        };
        let mut log = CommitLogRead {
            from: start,
            entries: Vec::new(),
        };
        for kv in self.commits.range(start.to_be_bytes()..) {
            let (k, v) = kv?;
            if key_u64(&k)? != log.end() || log.entries.len() >= MAX_LOG_ENTRIES {
                break;
            }
            if v.len() != 40 {
                return Err(StorageError::Corrupt(format!(
                    "commit entry of {} bytes",
                    v.len()
                )));
            }
            let mut h = [0u8; 32];
            h.copy_from_slice(&v[8..]);
            log.entries.push((be_u64(&v[..8]), h));
        }
        let end = log.end();
        let candidates = self.newest_unleased(v_min, max, |g| g.seq < end)?;
        let lease = if candidates.is_empty() {
            None
        } else {
            Some(self.lease_locked(candidates, ttl, crate::unix_ms())?)
        };
        self.db.flush()?;
        Ok(LeaseWithLog { lease, log })
    }
}

fn key_u64(k: &[u8]) -> Result<u64> {
    if k.len() != 8 {
        return Err(StorageError::Corrupt(format!(
            "commit key of {} bytes",
            k.len()
        )));
    }
    Ok(be_u64(k))
}
