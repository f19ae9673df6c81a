//! Durable local state of an echo-swarm node.
//!
//! Owns every on-disk format of a node's data directory: the trajectory store (groups of
//! rollouts with lease/ack pulls and staleness pruning), the content-addressed chunk store
//! with snapshot manifests, the signed-manifest format, the node key file, admission tickets
//! and credentials, and the persisted ban list. Formats are
//! versioned and specified in `docs/storage.md`. Also the closed enum of why a pulled group is
//! refused ([`rejection`]: every verification stage's reasons, as `pull` and `learner` both
//! answer with it).
//!
//! Must not touch: the network, the model, or policy decisions (which version is admissible,
//! whom to pull from). Callers pass those in (`v_min`, `ttl`, `keep`).

pub mod admission;
pub mod bans;
pub mod chunks;
pub mod codec;
#[cfg(test)]
mod decoder_props;
pub mod deps;
pub mod error;
pub mod fs;
mod hot;
pub mod keys;
pub mod manifest;
pub mod record;
pub mod rejection;
pub mod replay;
pub mod trajectory;
pub mod watermark;

pub use chunks::{ChunkStore, ChunkStoreStats, GcStats, PublishStats, DEFAULT_MEMORY_BYTES};
pub use error::{Result, StorageError};
pub use keys::NodeKey;
pub use manifest::{hash_bytes, Hash, PayloadKind, SignedManifest, SnapshotManifest};
pub use record::{Sample, TrajectoryGroup};
pub use rejection::{Rejection, StructureFault};
pub use trajectory::{Counters, GroupKey, InvariantReport, Lease, TrajectoryStore};

pub use fs::{unix_ms, write_atomic};

/// The layout of a node's data directory (see `docs/storage.md`).
#[derive(Debug, Clone)]
pub struct DataDir {
    root: std::path::PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<std::path::PathBuf>) -> Self {
        DataDir { root: root.into() }
    }
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }
    /// `node.key`: the node's ed25519 identity.
    pub fn key_file(&self) -> std::path::PathBuf {
        self.root.join(keys::KEY_FILE_NAME)
    }
    /// `trajectories/`: the [`TrajectoryStore`] (sled).
    pub fn trajectories(&self) -> std::path::PathBuf {
        self.root.join("trajectories")
    }
    /// `snapshots/`: the [`ChunkStore`] (chunk files + sled index).
    pub fn snapshots(&self) -> std::path::PathBuf {
        self.root.join("snapshots")
    }
}

/// Opens a sled database, waiting briefly for its file lock: sled's background flusher can
/// hold the lock for a moment after the previous handle in this process was dropped. A lock
/// held by another live process is still an error after the wait (sled's own).
pub(crate) fn open_db(config: sled::Config) -> Result<sled::Db> {
    let db_file = config.path.join("db");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while lock_held(&db_file) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    config.open().map_err(StorageError::from)
}

/// Whether an open handle (in this process or another) holds sled's exclusive lock on its
/// `db` file. sled takes an `flock` and reports a held one only in an error's text, so the
/// lock is probed here with the same call: a contended lock is `WouldBlock`, a typed answer.
/// A file that does not exist yet is not locked; the probe's own lock ends with its handle.
fn lock_held(db_file: &std::path::Path) -> bool {
    use fs2::FileExt;
    std::fs::File::open(db_file).is_ok_and(
        |f| matches!(f.try_lock_exclusive(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
    )
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn an_open_store_holds_its_lock_and_a_dropped_one_can_be_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let db_file = dir.path().join("db");
        assert!(!lock_held(&db_file), "no database yet: nothing is locked");
        let store = TrajectoryStore::open(dir.path()).unwrap();
        assert!(lock_held(&db_file), "an open store holds the lock");
        drop(store);
        // The flusher may still hold the lock for a moment: open_db waits for it.
        TrajectoryStore::open(dir.path()).expect("reopened after the drop");
    }
}
