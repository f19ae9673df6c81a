//! The libp2p network service (membership, discovery, gossip, heartbeats, peer scores).
//!
//! Owns: the one task that drives the libp2p `Swarm` ([`service`]), and the typed [`Client`]
//! handle plus bounded command/event channels through which roles talk to it; the gossip
//! message formats ([`messages`]); the ECHO-2 peer score ([`score`]); the `[network]` config.
//! Must not touch: on-disk stores (`storage`), the model or training.
//!
//! Wire formats, topics, limits and protocol names: `docs/protocol.md`.

pub mod config;
pub mod error;
pub mod framing;
pub mod messages;
pub mod ratelimit;
pub mod score;
pub mod service;
pub mod transport;

pub use config::NetworkConfig;
pub use error::{MessageError, P2pError};
pub use libp2p::gossipsub::MessageId;
pub use libp2p::metrics::Registry;
pub use libp2p::{Multiaddr, PeerId, Stream};
pub use messages::{Heartbeat, LocalStatus, ScoreEntry, ScoreTable};
pub use ratelimit::TokenBucket;
pub use score::{PeerStats, ScoreComponents, TransferEvent};
pub use service::{
    protocols, start, Client, Counters, Event, NetworkStatus, PeerStatus, ServiceConfig, TopicKind,
    Validation,
};
pub use transport::{load_psk, psk_file_contents};

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
