//! The libp2p network service (membership, discovery, gossip, heartbeats, peer scores).
//!
//! Owns: the one task that drives the libp2p `Swarm` ([`service`]) and the behaviours it runs
//! (`behaviour`: transport, discovery, gossipsub and its scoring parameters); the typed
//! [`Client`] handle, its commands and the [`Event`]s roles receive ([`client`]); the typed peer
//! view roles decide on and the one rule for who is a worker ([`view`]); the gossip
//! topics ([`topics`]) and message formats ([`messages`]); the peer table (`peers`); the
//! ECHO-2 peer score ([`score`]); strikes and bans (`bans`, [`Client::strike`],
//! [`Client::is_banned`]) on generic peer reports ([`report`]: a severity and an opaque
//! label; the reasons are the roles'); the per-source heartbeat rate limit (`hbgate`); inbound connection
//! limits; stream rate limits ([`ratelimit`]); reachability and NAT traversal bookkeeping
//! ([`reachability`]); delivery receipts carried in heartbeats ([`receipt`]); listening through relays ([`circuit`]); the heartbeat interval scaled
//! to the swarm size, forgetting and the peer-table cap ([`membership`]); the `[network]`
//! config.
//!
//! Roles: p2p knows a node's [`Role`] only as a fact to gossip — each heartbeat carries the
//! sender's role, the status view shows every peer's, and the learner's score table lists the
//! non-learners. p2p does not run roles, and apart from the learner publishing score tables
//! it behaves the same whatever the role. Must not touch: what roles do (`node`), on-disk
//! stores (`storage`), the model or training, and the bulk-stream protocols (their names and
//! formats live in `dissemination` and `pull`; p2p only carries their streams).
//!
//! Wire formats, topics, limits and protocol names: `docs/protocol.md`.

mod authored;
mod backoff;
mod bans;
mod behaviour;
pub mod circuit;
pub mod client;
pub mod config;
pub mod congestion;
#[cfg(test)]
mod decoder_props;
pub mod error;
pub mod framing;
mod hbgate;
pub mod membership;
pub mod messages;
mod peers;
pub mod ratelimit;
pub mod reachability;
pub mod receipt;
pub mod report;
pub mod role;
pub mod score;
pub mod service;
pub mod stream_limits;
pub mod topics;
pub mod transport;
pub mod view;

pub use bans::MAX_BANS;
pub use behaviour::{IDENTIFY_PROTOCOL, MAX_GOSSIP_BYTES};
pub use client::{
    Client, Event, NetworkCounters, NetworkStatus, PeerStatus, ServiceConfig, Validation,
};
pub use config::NetworkConfig;
pub use error::{MessageError, P2pError, RoleError, TopicError};
pub use libp2p::gossipsub::MessageId;
pub use libp2p::metrics::Registry;
pub use libp2p::{multiaddr, Multiaddr, PeerId, Stream, StreamProtocol};
pub use messages::{
    Contribution, DeviceReport, EnvPin, Heartbeat, LocalStatus, SamplingReport, ScoreEntry,
    ScoreTable, MAX_PENDING_CLAIM,
};
pub use ratelimit::TokenBucket;
pub use reachability::{ConnectionKind, NatStatus, Reachability, RelayServerStatus};
pub use receipt::{DeliveryReceipt, MAX_HEARTBEAT_RECEIPTS, RECEIPT_VERSION};
pub use report::{NetOffence, PeerReport, ReportLabel, Severity};
pub use role::Role;
pub use score::{PeerStats, ScoreComponents, TransferEvent};
pub use service::{start, Started};
pub use topics::{parse_topic, TopicKind};
pub use transport::{load_psk, probe_listen_addrs, psk_file_contents};
pub use view::{active_install_times, active_installs, PeerView};

/// The peer id in a multiaddr's trailing `/p2p/<id>`, if any.
pub fn peer_id_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        libp2p::multiaddr::Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// The libp2p peer id of an ed25519 key seed (`storage::NodeKey::seed`).
pub fn peer_id_from_seed(seed: [u8; 32]) -> PeerId {
    let mut seed = seed;
    libp2p::identity::Keypair::ed25519_from_bytes(&mut seed)
        .expect("32 bytes are a valid ed25519 seed")
        .public()
        .to_peer_id()
}

/// The libp2p peer id of an ed25519 public key (32 bytes, e.g. the swarm's learner key).
pub fn peer_id_from_public(public: [u8; 32]) -> Result<PeerId, P2pError> {
    let pk = libp2p::identity::ed25519::PublicKey::try_from_bytes(&public).map_err(|e| {
        P2pError::Config {
            key: "learner_public_key".into(),
            reason: e.to_string(),
        }
    })?;
    Ok(libp2p::identity::PublicKey::from(pk).to_peer_id())
}
