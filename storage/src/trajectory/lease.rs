//! Leases of the trajectory store: the learner takes groups on a lease with an expiry
//! (oldest first, newest first, or a chosen selection), acks them once they are durable on
//! its side, or releases them; an expired lease's groups become pullable again; a producer
//! caught forging has its untrained groups removed. Layout and invariant: the parent module.

use std::time::Duration;

use sled::transaction::ConflictableTransactionError;
use sled::Transactional;

use super::{
    be_u64, decode_stored, lease_keys, tx_add, tx_err, tx_get, tx_set, GroupKey, Lease,
    TrajectoryStore, K_CONSUMED, K_LEASED, K_NEXT_LEASE, K_REJECTED_STORED,
};
use crate::error::{Result, StorageError};
use crate::record::TrajectoryGroup;

impl TrajectoryStore {
    /// Leases up to `max` unleased groups with `version ≥ v_min`, oldest first, for `ttl`.
    /// Expired leases are reclaimed first. Returns `None` when nothing is available.
    pub fn lease(&self, v_min: u64, max: usize, ttl: Duration) -> Result<Option<Lease>> {
        self.lease_at(v_min, max, ttl, crate::unix_ms())
    }

    /// [`Self::lease`], newest version first: what a consumer with more admissible groups than
    /// it can use takes, so that it trains on the freshest ones and the oldest age out (rather
    /// than training on groups about to expire while fresher ones wait and expire in turn).
    pub fn lease_newest(&self, v_min: u64, max: usize, ttl: Duration) -> Result<Option<Lease>> {
        self.lease_ordered_at(v_min, max, ttl, crate::unix_ms(), true)
    }

    /// [`Self::lease`] with an explicit clock (tests).
    pub fn lease_at(
        &self,
        v_min: u64,
        max: usize,
        ttl: Duration,
        now_ms: u64,
    ) -> Result<Option<Lease>> {
        self.lease_ordered_at(v_min, max, ttl, now_ms, false)
    }

    fn lease_ordered_at(
        &self,
        v_min: u64,
        max: usize,
        ttl: Duration,
        now_ms: u64,
        newest_first: bool,
    ) -> Result<Option<Lease>> {
        let _g = self.lock();
        self.reclaim_expired(now_ms)?;
        let start = GroupKey {
            version: v_min,
            seq: 0,
        }
        .to_bytes();
        let picked = if newest_first {
            self.newest_unleased(v_min, max, |_| true)?
        } else {
            let mut picked = Vec::new();
            for kv in self.groups.range(start..) {
                if picked.len() >= max {
                    break;
                }
                let (k, v) = kv?;
                if self.leased.contains_key(&k)? {
                    continue;
                }
                picked.push((GroupKey::from_slice(&k)?, decode_stored(&v)?));
            }
            picked
        };
        if picked.is_empty() {
            return Ok(None);
        }
        self.lease_locked(picked, ttl, now_ms).map(Some)
    }

    /// Up to `max` unleased groups with `version ≥ v_min` that `keep` accepts, newest first
    /// (the caller holds the write lock).
    pub(super) fn newest_unleased(
        &self,
        v_min: u64,
        max: usize,
        keep: impl Fn(&TrajectoryGroup) -> bool,
    ) -> Result<Vec<(GroupKey, TrajectoryGroup)>> {
        let start = GroupKey {
            version: v_min,
            seq: 0,
        }
        .to_bytes();
        let mut picked = Vec::new();
        for kv in self.groups.range(start..).rev() {
            if picked.len() >= max {
                break;
            }
            let (k, v) = kv?;
            if self.leased.contains_key(&k)? {
                continue;
            }
            let g = decode_stored(&v)?;
            if keep(&g) {
                picked.push((GroupKey::from_slice(&k)?, g));
            }
        }
        Ok(picked)
    }

    /// Records a lease of `picked` (unleased groups; the caller holds the write lock).
    pub(super) fn lease_locked(
        &self,
        picked: Vec<(GroupKey, TrajectoryGroup)>,
        ttl: Duration,
        now_ms: u64,
    ) -> Result<Lease> {
        let expires = now_ms.saturating_add(ttl.as_millis() as u64);
        let mut record = Vec::with_capacity(8 + 16 * picked.len());
        record.extend_from_slice(&expires.to_be_bytes());
        for (k, _) in &picked {
            record.extend_from_slice(&k.to_bytes());
        }
        let id = (&self.leased, &self.leases, &self.meta)
            .transaction(|(lt, lst, mt)| {
                let id = tx_get(mt, K_NEXT_LEASE)? + 1;
                tx_set(mt, K_NEXT_LEASE, id)?;
                let mut entry = [0u8; 16];
                entry[..8].copy_from_slice(&id.to_be_bytes());
                entry[8..].copy_from_slice(&expires.to_be_bytes());
                for (k, _) in &picked {
                    lt.insert(&k.to_bytes(), &entry)?;
                }
                lst.insert(&id.to_be_bytes(), record.as_slice())?;
                tx_add(mt, K_LEASED, picked.len() as u64)?;
                Ok(id)
            })
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(Lease {
            id,
            expires_unix_ms: expires,
            groups: picked,
        })
    }

    /// Leases the unleased groups with `version ≥ v_min` that `select` picks, for `ttl`:
    /// `select` sees them newest first (at most `limit`) and returns the indices it wants, in
    /// any order. Candidates and lease are taken under one lock, so nothing changes in
    /// between. Returns `None` when nothing is picked. What a consumer uses that composes its
    /// batch by a rule over the groups' contents (the learner's shares per producer).
    pub fn lease_selected(
        &self,
        v_min: u64,
        limit: usize,
        ttl: Duration,
        select: impl FnOnce(&[(GroupKey, TrajectoryGroup)]) -> Vec<usize>,
    ) -> Result<Option<Lease>> {
        let _g = self.lock();
        let now_ms = crate::unix_ms();
        self.reclaim_expired(now_ms)?;
        let start = GroupKey {
            version: v_min,
            seq: 0,
        }
        .to_bytes();
        let mut candidates = Vec::new();
        for kv in self.groups.range(start..).rev() {
            if candidates.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            if !self.leased.contains_key(&k)? {
                candidates.push((GroupKey::from_slice(&k)?, decode_stored(&v)?));
            }
        }
        let mut picked: Vec<usize> = select(&candidates);
        picked.sort_unstable();
        picked.dedup();
        picked.retain(|&i| i < candidates.len());
        if picked.is_empty() {
            return Ok(None);
        }
        let mut taken: Vec<Option<(GroupKey, TrajectoryGroup)>> =
            candidates.into_iter().map(Some).collect();
        let picked: Vec<(GroupKey, TrajectoryGroup)> =
            picked.iter().filter_map(|&i| taken[i].take()).collect();
        self.lease_locked(picked, ttl, now_ms).map(Some)
    }

    /// Deletes every stored group `producer` made (leased or not), untrained, and counts them
    /// in `rejected_stored`: the learner's answer to a producer caught forging (its groups
    /// not yet trained are not trusted any more). Returns how many. Decodes every stored
    /// group: meant for a learner's buffer (a few batches), not a worker's backlog.
    pub fn reject_producer(&self, producer: &str) -> Result<u64> {
        let _g = self.lock();
        let mut keys = Vec::new();
        for kv in self.groups.iter() {
            let (k, v) = kv?;
            if decode_stored(&v)?.producer == producer {
                keys.push(k);
            }
        }
        let n = (&self.groups, &self.leased, &self.meta)
            .transaction(|(gt, lt, mt)| {
                let mut n = 0;
                for k in &keys {
                    if gt.remove(k)?.is_some() {
                        n += 1;
                    }
                    lt.remove(k)?;
                }
                tx_add(mt, K_REJECTED_STORED, n)?;
                Ok(n)
            })
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(n)
    }

    /// Deletes the groups of a lease (they reached the learner). Returns how many were deleted;
    /// groups already pruned as stale are not counted twice. An unknown or reclaimed lease is
    /// [`StorageError::NotFound`].
    pub fn ack(&self, lease_id: u64) -> Result<u64> {
        let _g = self.lock();
        let n = (&self.groups, &self.leased, &self.leases, &self.meta)
            .transaction(|(gt, lt, lst, mt)| {
                let Some(record) = lst.remove(&lease_id.to_be_bytes())? else {
                    return Err(ConflictableTransactionError::Abort(
                        StorageError::NotFound {
                            what: "lease",
                            key: lease_id.to_string(),
                        },
                    ));
                };
                let mut n = 0;
                for key in lease_keys(&record).map_err(ConflictableTransactionError::Abort)? {
                    if gt.remove(key)?.is_some() {
                        n += 1;
                    }
                    if lt.get(key)?.is_some_and(|e| be_u64(&e[..8]) == lease_id) {
                        lt.remove(key)?;
                    }
                }
                tx_add(mt, K_CONSUMED, n)?;
                Ok(n)
            })
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(n)
    }

    /// Gives a lease back unused: its groups become pullable at once.
    pub fn release(&self, lease_id: u64) -> Result<()> {
        let _g = self.lock();
        self.drop_lease(lease_id)?;
        self.flushed()?;
        Ok(())
    }

    fn drop_lease(&self, lease_id: u64) -> Result<()> {
        (&self.leased, &self.leases)
            .transaction(|(lt, lst)| {
                if let Some(record) = lst.remove(&lease_id.to_be_bytes())? {
                    for key in lease_keys(&record).map_err(ConflictableTransactionError::Abort)? {
                        if lt.get(key)?.is_some_and(|e| be_u64(&e[..8]) == lease_id) {
                            lt.remove(key)?;
                        }
                    }
                }
                Ok(())
            })
            .map_err(tx_err)
    }

    pub(super) fn reclaim_expired(&self, now_ms: u64) -> Result<()> {
        let mut expired = Vec::new();
        for kv in self.leases.iter() {
            let (k, v) = kv?;
            if v.len() < 8 || k.len() != 8 {
                return Err(StorageError::Corrupt("lease record".into()));
            }
            if be_u64(&v[..8]) <= now_ms {
                expired.push(be_u64(&k));
            }
        }
        for id in expired {
            tracing::debug!(lease = id, "lease expired; its groups are pullable again");
            self.drop_lease(id)?;
        }
        Ok(())
    }
}
