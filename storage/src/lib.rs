//! Durable local state of an echo-swarm node.
//!
//! Owns every on-disk format of a node's data directory: the trajectory store (groups of
//! rollouts with lease/ack pulls and staleness pruning), the content-addressed chunk store
//! with snapshot manifests, the signed-manifest format, the node key file, admission tickets
//! and credentials, and the persisted ban list. Formats are
//! versioned and specified in `docs/storage.md`.
//!
//! Must not touch: the network, the model, or policy decisions (which version is admissible,
//! whom to pull from). Callers pass those in (`v_min`, `ttl`, `keep`).

pub mod admission;
pub mod bans;
pub mod chunks;
pub mod codec;
#[cfg(test)]
mod decoder_props;
pub mod error;
pub mod fs;
mod hot;
pub mod keys;
pub mod manifest;
pub mod record;
pub mod replay;
pub mod trajectory;

pub use chunks::{ChunkStore, ChunkStoreStats, GcStats, PublishStats, DEFAULT_MEMORY_BYTES};
pub use error::{Result, StorageError};
pub use keys::NodeKey;
pub use manifest::{hash_bytes, Hash, PayloadKind, SignedManifest, SnapshotManifest};
pub use record::{Sample, TrajectoryGroup};
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
/// held by another live process is still an error after the wait.
pub(crate) fn open_db(config: sled::Config) -> Result<sled::Db> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match config.open() {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other.map_err(StorageError::from),
        }
    }
}
