//! `TrajectoryStore`: the durable, lease/ack trajectory buffer of a node (`docs/storage.md`).
//!
//! Layout (one sled database, see `docs/storage.md`):
//! - `groups`: key `version (u64 BE) ‖ seq (u64 BE)` → encoded [`TrajectoryGroup`]. Big-endian
//!   keys make "every group with v ≥ v_min, oldest first" a single range scan.
//! - `leased`: group key → `lease id (u64 BE) ‖ expiry ms (u64 BE)` for groups out on a lease.
//! - `leases`: `lease id (u64 BE)` → `expiry ms (u64 BE) ‖ group keys (16 B each)`.
//! - `seen`: trajectory id (16 B) → version (u64 BE) of every sample stored through
//!   [`TrajectoryStore::put_groups_dedup`] (the learner's buffer), so a group pulled twice is
//!   stored once.
//! - `commits`: `seq (u64 BE)` → `version (u64 BE) ‖ content hash (32 B)`: the producer's
//!   commitment to each group number it stored, written in the same transaction as the group
//!   (a worker's store; the learner's dedup buffer commits nothing). Kept until the learner
//!   says it has them ([`TrajectoryStore::lease_with_log`]), and served as the commit log
//!   (`control::commits`, `docs/pull.md`).
//! - `meta`: layout version and the persisted counters.
//!
//! Every mutation is one sled transaction over the trees it touches, so counters and records
//! never disagree, and mutating calls return only after `flush` — a record whose `put_group`
//! returned `Ok` survives a `kill -9`. The accounting invariant
//! `produced = consumed + discarded_stale + rejected_stored + pending` therefore holds across
//! any crash (`rejected_stored`: groups removed after they were stored because their producer
//! was caught, [`TrajectoryStore::reject_producer`]; 0 on a worker).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};
use sled::Transactional;

use crate::error::{Result, StorageError};
use crate::record::TrajectoryGroup;

mod commits;
mod lease;

pub use commits::{CommitLogRead, CommitRecord, LeaseWithLog, MAX_LOG_ENTRIES};

/// On-disk layout version of the trajectory store (2: the `commits` tree and
/// `next_commit`; 3: a `commits` value may be an abandoned number's 8 bytes). A layout-1 or -2
/// store is upgraded in place when opened — everything it holds is valid layout 3 — and a
/// build of layout 2 refuses a layout-3 store by its version, not as corrupt.
pub const LAYOUT_VERSION: u64 = 3;

const K_LAYOUT: &[u8] = b"layout";
const K_PRODUCED: &[u8] = b"produced";
const K_LEASED: &[u8] = b"leased";
const K_CONSUMED: &[u8] = b"consumed";
const K_DISCARDED: &[u8] = b"discarded_stale";
const K_REJECTED: &[u8] = b"rejected_invalid";
const K_NEXT_SEQ: &[u8] = b"next_seq";
const K_NEXT_LEASE: &[u8] = b"next_lease";
const K_DUPLICATES: &[u8] = b"duplicates";
const K_REJECTED_STORED: &[u8] = b"rejected_stored";
/// The group number the next committed group must have (absent before the first).
const K_NEXT_COMMIT: &[u8] = b"next_commit";

/// Key of a stored group: where it sits in the version-ordered scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub version: u64,
    pub seq: u64,
}

impl GroupKey {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.version.to_be_bytes());
        b[8..].copy_from_slice(&self.seq.to_be_bytes());
        b
    }
    fn from_slice(b: &[u8]) -> Result<Self> {
        if b.len() != 16 {
            return Err(StorageError::Corrupt(format!(
                "group key of {} bytes",
                b.len()
            )));
        }
        Ok(GroupKey {
            version: be_u64(&b[..8]),
            seq: be_u64(&b[8..]),
        })
    }
}

/// Persisted counters. `pending()` is derived; [`TrajectoryStore::check_invariant`] compares it
/// with the records actually stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Groups ever stored.
    pub produced: u64,
    /// Groups handed out on leases (a group leased twice counts twice).
    pub leased: u64,
    /// Groups deleted by an ack.
    pub consumed: u64,
    /// Groups deleted because they fell out of the staleness window.
    pub discarded_stale: u64,
    /// Groups refused because they failed validation (never stored).
    pub rejected_invalid: u64,
    /// Groups refused by [`TrajectoryStore::put_groups_dedup`] as already seen (never stored).
    pub duplicates: u64,
    /// Groups deleted after they were stored, untrained, because their producer was caught
    /// ([`TrajectoryStore::reject_producer`]).
    pub rejected_stored: u64,
}

impl Counters {
    /// The counters by name, as the watermark records them (all only ever grow).
    fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("produced", self.produced),
            ("leased", self.leased),
            ("consumed", self.consumed),
            ("discarded_stale", self.discarded_stale),
            ("rejected_invalid", self.rejected_invalid),
            ("duplicates", self.duplicates),
            ("rejected_stored", self.rejected_stored),
        ]
    }

    pub fn pending(&self) -> u64 {
        self.produced
            .saturating_sub(self.consumed)
            .saturating_sub(self.discarded_stale)
            .saturating_sub(self.rejected_stored)
    }
}

/// Groups handed out under one lease. Ack the lease id to delete them; if the lease expires
/// first, they become pullable again.
#[derive(Debug, Clone)]
pub struct Lease {
    pub id: u64,
    pub expires_unix_ms: u64,
    pub groups: Vec<(GroupKey, TrajectoryGroup)>,
}

/// Result of [`TrajectoryStore::check_invariant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvariantReport {
    pub counters: Counters,
    /// Groups actually present in the `groups` tree.
    pub stored: u64,
}

impl InvariantReport {
    pub fn holds(&self) -> bool {
        self.counters.produced
            == self.counters.consumed
                + self.counters.discarded_stale
                + self.counters.rejected_stored
                + self.stored
    }
}

/// Summary of a live lease, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub id: u64,
    pub expires_unix_ms: u64,
    pub groups: usize,
}

pub struct TrajectoryStore {
    db: sled::Db,
    groups: sled::Tree,
    leased: sled::Tree,
    leases: sled::Tree,
    seen: sled::Tree,
    commits: sled::Tree,
    meta: sled::Tree,
    /// Serialises mutations: scans that precede a transaction stay valid until it commits.
    write: Mutex<()>,
    /// The `v` of the last [`Self::prune_below`] since the store was opened: on a worker, the
    /// floor of the learner's window as its last pull stated it (see [`Self::window_floor`]).
    /// In memory only: a restarted worker learns it from the next pull.
    floor: std::sync::atomic::AtomicU64,
    /// The store's [`crate::watermark`] and when it was last written (`None` until the store
    /// passed its checks at open: a store refused as damaged never rewrites its mark).
    mark_path: std::path::PathBuf,
    mark_written: Mutex<Option<Option<std::time::Instant>>>,
}

/// How often a busy store refreshes its watermark (and always at open and when dropped).
const MARK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for TrajectoryStore {
    fn drop(&mut self) {
        if let Err(e) = self.write_mark(true) {
            tracing::warn!(path = %self.mark_path.display(), error = %e, "cannot write the trajectory store's watermark");
        }
    }
}

type TxError = ConflictableTransactionError<StorageError>;

impl TrajectoryStore {
    /// Opens (or creates) the store in directory `path`. A store that cannot be read back as
    /// it was last written is refused with [`StorageError::Damaged`] naming its file, never
    /// reset: sled's own corruption errors, a database that lost its layout record or counters
    /// since its [`crate::watermark`] was written, and counters that disagree with the records
    /// stored.
    pub fn open(path: &Path) -> Result<Self> {
        let mark_path = path.join(crate::watermark::WATERMARK_FILE);
        let marks = crate::watermark::read(&mark_path)?;
        let damaged = |reason: String| {
            StorageError::Damaged {
            path: path.join("db"),
            reason,
            recovery: format!(
                "keep it for inspection and restore {} from a backup, or move that directory away \
                 (e.g. `mv {0} {0}.damaged`) to start with an empty store: its pending groups are then lost",
                path.display()
            ),
        }
        };
        let db = crate::open_db(
            sled::Config::new()
                .path(path)
                .mode(sled::Mode::HighThroughput),
        )
        .map_err(|e| match e {
            StorageError::Db(sled::Error::Corruption { at, .. }) => damaged(match at {
                Some(at) => format!("sled reports corruption at {at}"),
                None => "sled reports corruption (its log cannot be read)".into(),
            }),
            e => e,
        })?;
        let store = TrajectoryStore {
            groups: db.open_tree("groups")?,
            leased: db.open_tree("leased")?,
            leases: db.open_tree("leases")?,
            seen: db.open_tree("seen")?,
            commits: db.open_tree("commits")?,
            meta: db.open_tree("meta")?,
            db,
            write: Mutex::new(()),
            floor: std::sync::atomic::AtomicU64::new(0),
            mark_path,
            mark_written: Mutex::new(None),
        };
        // Until the checks below pass, the mark is not written (not even when `store` drops).
        match (store.meta.get(K_LAYOUT)?, &marks) {
            (None, Some(m)) => {
                let produced = m.get("produced").copied().unwrap_or(0);
                return Err(damaged(format!(
                    "the database opens empty, but its watermark ({}) records {produced} groups \
                     produced: the file was truncated or overwritten",
                    store.mark_path.display()
                )));
            }
            (None, None) => {
                store.meta.insert(K_LAYOUT, &LAYOUT_VERSION.to_be_bytes())?;
                store.db.flush()?;
            }
            (Some(v), _) if v.len() == 8 && be_u64(&v) == LAYOUT_VERSION => {}
            // Layout 1 had no commitments (the new tree is empty), layout 2 no abandoned ones:
            // nothing stored changes.
            (Some(v), _) if v.len() == 8 && matches!(be_u64(&v), 1 | 2) => {
                tracing::info!(
                    from = be_u64(&v),
                    "upgrading the trajectory store to layout {LAYOUT_VERSION}"
                );
                store.meta.insert(K_LAYOUT, &LAYOUT_VERSION.to_be_bytes())?;
                store.db.flush()?;
            }
            (Some(v), _) => {
                return Err(StorageError::Corrupt(format!(
                    "trajectory store layout {:?} is not {LAYOUT_VERSION}",
                    v.as_ref()
                )))
            }
        }
        let counters = store.counters()?;
        if let Some((name, have, mark)) = marks
            .as_ref()
            .and_then(|m| crate::watermark::below(m, &counters.named()))
        {
            return Err(damaged(format!(
                "counter `{name}` reads {have}, but its watermark ({}) recorded {mark}: the \
                 file lost writes",
                store.mark_path.display()
            )));
        }
        let inv = store.check_invariant()?;
        if !inv.holds() {
            return Err(damaged(format!(
                "the counters (produced {}, consumed {}, discarded {}, rejected {}) do not \
                 account for the {} groups stored",
                counters.produced,
                counters.consumed,
                counters.discarded_stale,
                counters.rejected_stored,
                inv.stored
            )));
        }
        *store.mark_written.lock().unwrap_or_else(|p| p.into_inner()) = Some(None);
        store.write_mark(true)?;
        Ok(store)
    }

    /// Flushes sled and writes the watermark: always when `now`, else at most every
    /// [`MARK_EVERY`]. The counters are read before the flush, so the mark never records
    /// more than is on disk (they only grow): a crash can never leave a mark above the store.
    fn write_mark(&self, now: bool) -> Result<()> {
        let mut last = self.mark_written.lock().unwrap_or_else(|p| p.into_inner());
        let Some(written) = last.as_mut() else {
            // Not (yet) known to be intact: its mark stays as it was.
            self.db.flush()?;
            return Ok(());
        };
        if !now && written.is_some_and(|t| t.elapsed() < MARK_EVERY) {
            self.db.flush()?;
            return Ok(());
        }
        let counters = self.counters()?;
        self.db.flush()?;
        crate::watermark::write(&self.mark_path, counters.named())?;
        *written = Some(std::time::Instant::now());
        Ok(())
    }

    /// Flushes sled (mutating calls return only after it) and refreshes the watermark.
    fn flushed(&self) -> Result<()> {
        self.write_mark(false)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic while holding the lock cannot leave sled half-written (transactions), so a
        // poisoned lock is safe to reuse.
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores one group durably: returns only after the write is flushed to disk.
    pub fn put_group(&self, group: &TrajectoryGroup) -> Result<GroupKey> {
        Ok(self.put_groups(std::slice::from_ref(group))?[0])
    }

    /// Stores a batch in one transaction and one flush. If any group fails validation, nothing
    /// is stored, `rejected_invalid` grows by the number of invalid groups, and the first
    /// problem is returned.
    pub fn put_groups(&self, groups: &[TrajectoryGroup]) -> Result<Vec<GroupKey>> {
        let keys = self.put_checked(groups, false)?;
        Ok(keys.into_iter().flatten().collect())
    }

    /// The learner's ingestion of pulled groups: like [`Self::put_groups`], but a group any of
    /// whose trajectory ids was stored before (or earlier in the same batch) is skipped and
    /// counted in `duplicates`, so a repeated pull never enters the buffer twice. Returns the
    /// key of each stored group and `None` for each duplicate, in input order.
    pub fn put_groups_dedup(&self, groups: &[TrajectoryGroup]) -> Result<Vec<Option<GroupKey>>> {
        self.put_checked(groups, true)
    }

    fn put_checked(
        &self,
        groups: &[TrajectoryGroup],
        dedupe: bool,
    ) -> Result<Vec<Option<GroupKey>>> {
        let _g = self.lock();
        let mut first_err = None;
        let mut invalid = 0u64;
        for g in groups {
            if let Err(e) = g.validate() {
                invalid += 1;
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            tracing::warn!(invalid, error = %e, "refusing invalid trajectory groups");
            self.record_rejected_locked(invalid)?;
            return Err(e);
        }
        let encoded: Vec<Vec<u8>> = groups.iter().map(TrajectoryGroup::encode).collect();
        // A worker's store commits each group number with its content (the learner's dedup
        // buffer holds other producers' groups: nothing to commit).
        let commits: Vec<[u8; 40]> = if dedupe {
            Vec::new()
        } else {
            groups.iter().map(commit_value).collect()
        };
        let keys = (&self.groups, &self.seen, &self.commits, &self.meta)
            .transaction(|(gt, st, ct, mt)| {
                let mut next_commit = tx_opt(mt, K_NEXT_COMMIT)?;
                for (g, c) in groups.iter().zip(&commits) {
                    // The honest engine takes `next_commit` itself (no gap, no reuse); the
                    // store records what it is given: the learner judges the log.
                    ct.insert(&g.seq.to_be_bytes(), c.as_slice())?;
                    next_commit = Some(next_commit.map_or(g.seq + 1, |n| n.max(g.seq + 1)));
                }
                if let Some(n) = next_commit.filter(|_| !commits.is_empty()) {
                    tx_set(mt, K_NEXT_COMMIT, n)?;
                }
                let mut seq = tx_get(mt, K_NEXT_SEQ)?;
                let mut keys = Vec::with_capacity(groups.len());
                let (mut stored, mut duplicates) = (0u64, 0u64);
                for (g, bytes) in groups.iter().zip(&encoded) {
                    if dedupe {
                        let mut dup = false;
                        for s in &g.samples {
                            dup |= st.get(s.trajectory_id)?.is_some();
                        }
                        if dup {
                            duplicates += 1;
                            keys.push(None);
                            continue;
                        }
                        for s in &g.samples {
                            st.insert(&s.trajectory_id, &g.version.to_be_bytes())?;
                        }
                    }
                    let key = GroupKey {
                        version: g.version,
                        seq,
                    };
                    seq += 1;
                    gt.insert(&key.to_bytes(), bytes.as_slice())?;
                    keys.push(Some(key));
                    stored += 1;
                }
                tx_set(mt, K_NEXT_SEQ, seq)?;
                tx_add(mt, K_PRODUCED, stored)?;
                tx_add(mt, K_DUPLICATES, duplicates)?;
                Ok(keys)
            })
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(keys)
    }

    /// Counts groups that were refused before reaching the store (e.g. a pulled group that
    /// failed validation on the learner).
    pub fn record_rejected(&self, n: u64) -> Result<()> {
        let _g = self.lock();
        self.record_rejected_locked(n)
    }

    fn record_rejected_locked(&self, n: u64) -> Result<()> {
        self.meta
            .transaction(|mt| tx_add(mt, K_REJECTED, n))
            .map_err(tx_err)?;
        self.flushed()?;
        Ok(())
    }

    /// Up to `limit` groups with `version ≥ v_min`, oldest version first (then in arrival
    /// order), whether leased or not.
    pub fn scan(&self, v_min: u64, limit: usize) -> Result<Vec<(GroupKey, TrajectoryGroup)>> {
        let start = GroupKey {
            version: v_min,
            seq: 0,
        }
        .to_bytes();
        self.groups
            .range(start..)
            .take(limit)
            .map(|kv| {
                let (k, v) = kv?;
                Ok((GroupKey::from_slice(&k)?, decode_stored(&v)?))
            })
            .collect()
    }

    /// The floor of the learner's window: the version the last `prune_below` was asked for
    /// since the store was opened (0 before). A group made under an older version now would
    /// be deleted by the next pull, so a worker generates nothing below it. The last, not the
    /// highest: a learner whose step did not happen (a batch of zero advantages) asks for its
    /// version again, and its workers must make groups of it again. (One pull at a time per
    /// worker: requests arrive in the order they were sent.)
    pub fn window_floor(&self) -> u64 {
        self.floor.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deletes every group with `version < v` (it fell out of the staleness window), counting
    /// them in `discarded_stale`, and sets [`Self::window_floor`] to `v`. Returns how many
    /// were deleted.
    pub fn prune_below(&self, v: u64) -> Result<u64> {
        self.floor.store(v, std::sync::atomic::Ordering::Relaxed);
        let _g = self.lock();
        let end = GroupKey { version: v, seq: 0 }.to_bytes();
        let keys: Vec<sled::IVec> = self
            .groups
            .range(..end)
            .keys()
            .collect::<std::result::Result<_, _>>()?;
        let mut total = 0;
        for batch in keys.chunks(1024) {
            total += (&self.groups, &self.leased, &self.meta)
                .transaction(|(gt, lt, mt)| {
                    let mut n = 0;
                    for k in batch {
                        if gt.remove(k)?.is_some() {
                            n += 1;
                        }
                        lt.remove(k)?;
                    }
                    tx_add(mt, K_DISCARDED, n)?;
                    Ok(n)
                })
                .map_err(tx_err)?;
        }
        // Forget the ids of versions below the window: a replay of such a group is stale anyway
        // and the learner's admission rule refuses it.
        let old_ids: Vec<sled::IVec> = self
            .seen
            .iter()
            .filter_map(|kv| match kv {
                Ok((k, ver)) if ver.len() == 8 && be_u64(&ver) < v => Some(Ok(k)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<std::result::Result<_, _>>()?;
        for batch in old_ids.chunks(1024) {
            let mut b = sled::Batch::default();
            for k in batch {
                b.remove(k);
            }
            self.seen.apply_batch(b)?;
        }
        self.flushed()?;
        if total > 0 {
            tracing::info!(
                below = v,
                discarded = total,
                "pruned stale trajectory groups"
            );
        }
        Ok(total)
    }

    pub fn counters(&self) -> Result<Counters> {
        let get = |k: &[u8]| -> Result<u64> { Ok(self.meta.get(k)?.map_or(0, |v| be_u64(&v))) };
        Ok(Counters {
            produced: get(K_PRODUCED)?,
            leased: get(K_LEASED)?,
            consumed: get(K_CONSUMED)?,
            discarded_stale: get(K_DISCARDED)?,
            rejected_invalid: get(K_REJECTED)?,
            duplicates: get(K_DUPLICATES)?,
            rejected_stored: get(K_REJECTED_STORED)?,
        })
    }

    /// Groups currently stored (leased or not), from the persisted counters (O(1); sled's
    /// `Tree::len` walks the whole tree). [`Self::check_invariant`] counts the records.
    pub fn pending(&self) -> Result<u64> {
        Ok(self.counters()?.pending())
    }

    /// Compares the counters with the records actually stored.
    pub fn check_invariant(&self) -> Result<InvariantReport> {
        let _g = self.lock();
        Ok(InvariantReport {
            counters: self.counters()?,
            stored: self.groups.len() as u64,
        })
    }

    /// Groups stored (leased or not) at version `v` or newer: what survives a
    /// [`Self::prune_below`]`(v)`. Walks only that part of the tree, so it is cheap on a
    /// learner's buffer (a few batches), not on a worker's backlog.
    pub fn pending_from(&self, v: u64) -> Result<u64> {
        let start = GroupKey { version: v, seq: 0 }.to_bytes();
        let mut n = 0;
        for k in self.groups.range(start..).keys() {
            k?;
            n += 1;
        }
        Ok(n)
    }

    /// Stored groups per version.
    pub fn versions(&self) -> Result<BTreeMap<u64, u64>> {
        let mut out = BTreeMap::new();
        for k in self.groups.iter().keys() {
            *out.entry(GroupKey::from_slice(&k?)?.version).or_default() += 1;
        }
        Ok(out)
    }

    /// Live (not yet reclaimed) leases.
    pub fn leases(&self) -> Result<Vec<LeaseInfo>> {
        self.leases
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                if v.len() < 8 || k.len() != 8 {
                    return Err(StorageError::Corrupt("lease record".into()));
                }
                Ok(LeaseInfo {
                    id: be_u64(&k),
                    expires_unix_ms: be_u64(&v[..8]),
                    groups: (v.len() - 8) / 16,
                })
            })
            .collect()
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn decode_stored(v: &[u8]) -> Result<TrajectoryGroup> {
    TrajectoryGroup::decode(v).map_err(|e| StorageError::Corrupt(format!("stored group: {e}")))
}

fn lease_keys(record: &[u8]) -> Result<impl Iterator<Item = &[u8]>> {
    if record.len() < 8 || !(record.len() - 8).is_multiple_of(16) {
        return Err(StorageError::Corrupt("lease record length".into()));
    }
    Ok(record[8..].chunks_exact(16))
}

fn tx_get(t: &TransactionalTree, k: &[u8]) -> std::result::Result<u64, TxError> {
    Ok(t.get(k)?.map_or(0, |v| be_u64(&v)))
}

fn tx_opt(t: &TransactionalTree, k: &[u8]) -> std::result::Result<Option<u64>, TxError> {
    Ok(t.get(k)?.map(|v| be_u64(&v)))
}

/// The `commits` value of a group: its version and content hash.
fn commit_value(g: &TrajectoryGroup) -> [u8; 40] {
    let mut v = [0u8; 40];
    v[..8].copy_from_slice(&g.version.to_be_bytes());
    v[8..].copy_from_slice(&g.content_hash());
    v
}

fn tx_set(t: &TransactionalTree, k: &[u8], v: u64) -> std::result::Result<(), TxError> {
    t.insert(k, &v.to_be_bytes())?;
    Ok(())
}

fn tx_add(t: &TransactionalTree, k: &[u8], n: u64) -> std::result::Result<(), TxError> {
    let v = tx_get(t, k)? + n;
    tx_set(t, k, v)
}

fn tx_err(e: TransactionError<StorageError>) -> StorageError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => StorageError::Db(e),
    }
}

#[cfg(test)]
#[path = "trajectory_tests.rs"]
mod tests;
