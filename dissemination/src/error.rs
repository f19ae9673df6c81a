//! The dissemination layer's one error type.

use p2p::PeerId;

#[derive(Debug, thiserror::Error)]
pub enum DisseminationError {
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    #[error(transparent)]
    P2p(#[from] p2p::P2pError),
    #[error("stream I/O with {peer}: {source}")]
    Io {
        peer: PeerId,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("signature check failed: {0}")]
    BadSignature(String),
    #[error("protocol violation by {peer}: {reason}")]
    Protocol { peer: PeerId, reason: String },
    #[error("opening a {protocol} stream to {peer}: {reason}")]
    Open {
        peer: PeerId,
        protocol: &'static str,
        reason: String,
    },
    #[error("only the learner (with its signing key) can publish")]
    NotLearner,
    #[error("blocking task failed: {0}")]
    Task(String),
    #[error("timed out: {0}")]
    Timeout(String),
    /// A catch-up version whose chunks no holder had (`Disseminator::complete_version`).
    #[error("v{version}: {missing} chunks held by no peer asked")]
    Incomplete { version: u64, missing: usize },
}

impl DisseminationError {
    pub(crate) fn decode(what: &'static str, reason: impl Into<String>) -> Self {
        DisseminationError::Decode {
            what,
            reason: reason.into(),
        }
    }

    /// A `storage::codec` decoding error (a malformed message body) as this crate's
    /// [`DisseminationError::Decode`]; any other storage error stays a storage error.
    pub(crate) fn codec(e: storage::StorageError) -> Self {
        match e {
            storage::StorageError::Decode { what, reason } => {
                DisseminationError::Decode { what, reason }
            }
            other => other.into(),
        }
    }
}

pub type Result<T, E = DisseminationError> = std::result::Result<T, E>;
