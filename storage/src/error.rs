//! The storage layer's one error type.

use std::path::PathBuf;

/// Everything the stores and codecs can fail with. Decoding errors never panic: garbage input
/// always maps to [`StorageError::Decode`].
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("sled database error: {0}")]
    Db(#[from] sled::Error),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("chunk bytes do not match hash: expected {expected}, got {actual}")]
    HashMismatch { expected: String, actual: String },
    #[error("signature check failed: {0}")]
    BadSignature(String),
    #[error("snapshot version {version} is incomplete: {missing} of {total} chunks missing")]
    Incomplete {
        version: u64,
        missing: usize,
        total: usize,
    },
    #[error("{what} not found: {key}")]
    NotFound { what: &'static str, key: String },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    /// A store's file that cannot be read back as it was written (truncated, overwritten):
    /// refused at open, never reset. `recovery` says what the operator can do.
    #[error("{path} is damaged: {reason}. Nothing was changed: {recovery}")]
    Damaged {
        path: PathBuf,
        reason: String,
        recovery: String,
    },
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn decode(what: &'static str, reason: impl Into<String>) -> Self {
        StorageError::Decode {
            what,
            reason: reason.into(),
        }
    }
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        StorageError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}
