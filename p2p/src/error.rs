//! Typed errors of the network layer: one enum per kind of failure (a rejected message, a
//! service or client failure, a bad topic name, a bad role name).

use libp2p::PeerId;

/// Why an inbound gossip message was rejected.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum MessageError {
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("schema: {0}")]
    Schema(String),
    #[error("protocol version {got} is not supported (this node speaks {supported})")]
    Version { got: u32, supported: u32 },
    #[error("invalid value: {0}")]
    Invalid(String),
    #[error("sender {0} is not allowed to publish on this topic")]
    Unauthorised(PeerId),
}

/// Errors of the network service and its client handle.
#[derive(Debug, thiserror::Error)]
pub enum P2pError {
    #[error("reading the pre-shared key {path}: {reason}")]
    Psk { path: String, reason: String },
    #[error("invalid config value {key}: {reason}")]
    Config { key: String, reason: String },
    #[error("building the transport: {0}")]
    Transport(String),
    #[error("building the behaviours: {0}")]
    Behaviour(String),
    #[error("listening on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("dialing {addr}: {reason}")]
    Dial { addr: String, reason: String },
    #[error("publishing on {topic}: {reason}")]
    Publish { topic: String, reason: String },
    #[error("the network service has stopped")]
    ServiceStopped,
}

/// A gossip topic name that is not one of this protocol's (`echo/<swarm_id>/<kind>/<version>`).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TopicError {
    #[error("topic `{0}` is not of the form echo/<swarm_id>/<kind>/<version>")]
    Malformed(String),
    #[error("topic kind `{0}` is unknown (expected heartbeat, scores, snapshots or plans)")]
    UnknownKind(String),
    #[error("topic {kind} version `{got}` is not supported (this node speaks {supported})")]
    Version {
        kind: String,
        got: String,
        supported: u32,
    },
}

/// A role name that is not one of [`crate::Role`]'s.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RoleError {
    #[error("unknown role `{0}` (expected learner, rollout or relay)")]
    Unknown(String),
}

impl RoleError {
    /// The error of parsing `name` as a role.
    pub(crate) fn unknown(name: &str) -> Self {
        RoleError::Unknown(name.to_string())
    }
}
