//! The producer's commit log (`control::commits`, `docs/storage.md`): every group number a
//! worker stored, with its version and content hash, committed in the transaction that stored
//! the group, and served to the learner atomically with a lease. A number whose episode the
//! environment program failed is committed as *abandoned* ([`TrajectoryStore::abandon`]), so
//! the next group takes the next number (and the next initial state).
//!
//! On disk (tree `commits`, key: the number, 8 bytes big-endian): a 40-byte value is a stored
//! group (its version, 8 bytes big-endian, then its BLAKE3 content hash); an 8-byte value is
//! an abandoned number (the version it was attempted under). Any other length is refused.

use std::time::Duration;

use sled::Transactional;

use super::{be_u64, tx_err, tx_opt, tx_set, Lease, TrajectoryStore, K_NEXT_COMMIT};
use crate::error::{Result, StorageError};

/// Most entries one [`CommitLogRead`] carries; the rest follow in the next pull's log.
pub const MAX_LOG_ENTRIES: usize = 65_536;

/// What one number of the log commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitRecord {
    /// A stored group: its version and content hash.
    Group { version: u64, hash: [u8; 32] },
    /// No group: its episode failed in the environment program (attempted under `version`).
    Abandoned { version: u64 },
}

impl CommitRecord {
    /// The version the number was made (or attempted) under.
    pub fn version(&self) -> u64 {
        match *self {
            CommitRecord::Group { version, .. } | CommitRecord::Abandoned { version } => version,
        }
    }

    fn decode(v: &[u8]) -> Result<Self> {
        match v.len() {
            40 => {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(&v[8..]);
                Ok(CommitRecord::Group {
                    version: be_u64(&v[..8]),
                    hash,
                })
            }
            8 => Ok(CommitRecord::Abandoned { version: be_u64(v) }),
            n => Err(StorageError::Corrupt(format!("commit entry of {n} bytes"))),
        }
    }
}

/// Consecutive commitments from `from`: entry `i` is number `from + i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitLogRead {
    pub from: u64,
    pub entries: Vec<CommitRecord>,
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

    /// Commits number `seq` as abandoned under `version` (its episode failed in the
    /// environment program; no group is stored), durably, so the next group takes `seq + 1`.
    /// A number already committed is refused: a commitment is never rewritten.
    pub fn abandon(&self, seq: u64, version: u64) -> Result<()> {
        let _g = self.lock();
        if self.commits.get(seq.to_be_bytes())?.is_some() {
            return Err(StorageError::Corrupt(format!(
                "group number {seq} is committed already; it cannot be abandoned"
            )));
        }
        (&self.commits, &self.meta)
            .transaction(|(ct, mt)| {
                ct.insert(&seq.to_be_bytes(), &version.to_be_bytes())?;
                let next = tx_opt(mt, K_NEXT_COMMIT)?.map_or(seq + 1, |n| n.max(seq + 1));
                tx_set(mt, K_NEXT_COMMIT, next)?;
                Ok(())
            })
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(())
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
            log.entries.push(CommitRecord::decode(&v)?);
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
