//! The libp2p network service (membership, discovery, gossip, heartbeats, peer scores).
//!
//! Owns: the one task that drives the libp2p `Swarm`, and the typed client handle plus bounded
//! command/event channels through which roles talk to it.
//! Must not touch: on-disk stores (`storage`), the model or training.
//!
//! The service itself arrives with issue 3; today this crate owns the `[network]` config section.

pub mod config;

pub use config::NetworkConfig;
