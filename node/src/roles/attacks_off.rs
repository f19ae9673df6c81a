//! The network-layer attack hooks of a build without the `adversary` feature: they do
//! nothing. The heartbeat feeder and `run` call the same functions in every build; only a
//! build with the feature has the attacks behind them (`roles/attacks.rs`), so a default
//! binary cannot be made malicious by an environment variable (`crate::misbehave`).

use std::sync::Arc;

use super::{Probe, Tasks};
use crate::misbehave::Misbehaviour;
use crate::state::NodeState;
use tokio::sync::mpsc;

/// Nothing is recorded in a default build.
#[derive(Clone, Default)]
pub struct Recorder;

/// The true pending count.
pub fn pending_claim(_: &Misbehaviour, real: u64) -> u64 {
    real
}

/// The true delivery receipts.
pub fn receipts_claim(
    _: &Misbehaviour,
    real: Vec<p2p::DeliveryReceipt>,
) -> Vec<p2p::DeliveryReceipt> {
    real
}

/// The measured μ.
pub fn mu_claim(_: &Misbehaviour, real: f64) -> f64 {
    real
}

/// The true device.
pub fn device_claim(_: &Misbehaviour, real: p2p::DeviceReport) -> p2p::DeviceReport {
    real
}

/// The configured limit of pending groups.
pub fn pending_limit(_: &Misbehaviour, configured: u64) -> u64 {
    configured
}

/// `events`, untouched.
pub fn tap(
    _: &Misbehaviour,
    events: mpsc::Receiver<p2p::Event>,
) -> (mpsc::Receiver<p2p::Event>, Option<Recorder>) {
    (events, None)
}

/// No tasks.
pub fn spawn(_: &Tasks, _: &Arc<NodeState>, _: &p2p::Client, _: Probe, _: Option<Recorder>) {}
