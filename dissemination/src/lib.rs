//! Snapshot dissemination (ECHO-2's chain broadcast; `docs/broadcast.md`): the learner
//! publishes any bytes as a signed, chunked snapshot; workers relay it chunk by chunk along
//! scored forwarding chains, verifying every chunk's BLAKE3 against the signed manifest before
//! storing or forwarding it; stalled or late workers fetch missing chunks by hash from any
//! holder; bulk streams obey in-node token-bucket caps.
//!
//! Owns: the signed chain-plan message ([`plan_msg`]), the signed activation order
//! ([`order_msg`], the scheduler's decisions travel on the same authenticated path), the
//! chunk-stream and chunk-fetch protocols — names and message bodies ([`wire`]) — the
//! per-version transfer state machine (`transfer`), what a child records of its parent's
//! deliveries (`delivery`, the source of its receipts), the learner's accounting of its
//! forwarders (`engine::account`), this crate's reasons for a strike ([`Offence`]: handed to
//! the network service as a generic `p2p::PeerReport`) and the per-node engine ([`engine`]). Must
//! not touch: the swarm (only through `p2p::Client`), framing (`p2p::framing`), on-disk formats
//! (`storage`), the planning rules (`control::plan`), the model (payloads are opaque bytes;
//! installation hands them to the role).
//!
//! Wire formats: `docs/protocol.md`, "Snapshot dissemination".

mod assembly;
#[cfg(test)]
mod decoder_props;
mod delivery;
pub mod engine;
pub mod error;
mod offence;
pub mod order_msg;
pub mod plan_msg;
mod transfer;
pub mod wire;

#[cfg(feature = "adversary")]
pub use engine::Fault;
pub use engine::{
    BroadcastCounters, BroadcastMode, DisseminationConfig, DisseminationEvent, Disseminator,
    ForwardingView, PublishReport, DEFAULT_READ_TIMEOUT, DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_WARM_UP_BYTES, MIN_RATE_BYTES_PER_S,
};
pub use error::{DisseminationError, Result};
pub use offence::Offence;
pub use order_msg::{ActivationOrder, SignedOrder};
pub use plan_msg::{PlanMessage, SignedPlan};
pub use wire::{CHUNK_FETCH, CHUNK_STREAM};

/// Feeds a node's p2p events into its engine: Snapshots / Plans gossip gets a real verdict
/// (reported to gossipsub), a departed peer is excised from the learner's plan, a worker
/// catches up with the learner's newest snapshot on connecting to it or on hearing it
/// announce a newer installed version. Runs until the
/// event channel closes. Roles with their own event loop call
/// [`Disseminator::on_gossip`] / [`Disseminator::on_peer_disconnected`] instead.
pub async fn drive(
    d: Disseminator,
    client: p2p::Client,
    mut events: tokio::sync::mpsc::Receiver<p2p::Event>,
) {
    while let Some(ev) = events.recv().await {
        match ev {
            p2p::Event::Gossip {
                topic,
                message_id,
                propagation_source,
                source,
                data,
            } => {
                let verdict = d.on_gossip(topic, &data);
                tracing::debug!(?topic, %propagation_source, ?verdict, "gossip validated");
                let _ = client
                    .report_validation(message_id, propagation_source, source, verdict)
                    .await;
            }
            p2p::Event::PeerDisconnected(peer) => d.on_peer_disconnected(peer).await,
            p2p::Event::PeerConnected(peer) => d.catch_up(peer, None),
            p2p::Event::Heartbeat { peer, heartbeat } => {
                if let Some(v) = heartbeat.installed_version {
                    d.catch_up(peer, Some(v));
                }
                d.observe_heartbeat(peer, &heartbeat).await;
            }
            p2p::Event::Rejected { peer, topic, error } => {
                tracing::debug!(%peer, ?topic, %error, "rejected message");
            }
            other => tracing::trace!(?other, "network event"),
        }
    }
}
