//! The installed-policy slot: the node installs each verified snapshot here
//! ([`PolicySlot::install_bytes`]) and the engine samples from whatever it holds
//! ([`PolicySlot::current`]); installs are announced to subscribers ([`PolicySlot::subscribe`]:
//! the heartbeat's install report).
//!
//! Owns: the slot and the installed policy's record. Must not touch: generation (the engine,
//! `crate::generate`) or how snapshots arrive (the node's dissemination engine).

use std::sync::Arc;

use policy::{Device, ModelConfig, Policy, PolicyError};
use tokio::sync::watch;

use crate::RolloutError;

/// A policy snapshot installed for sampling.
#[derive(Debug)]
pub struct InstalledPolicy {
    /// Snapshot version.
    pub version: u64,
    /// The model built from the snapshot's weights (f32; in host memory when the slot's
    /// device is a GPU, see [`PolicySlot::install_bytes`]).
    pub policy: Arc<Policy>,
}

/// The node-facing handle to the installed policy. Cloning shares the slot; installing
/// replaces the policy atomically, and the engine picks it up before its next group.
#[derive(Debug, Clone)]
pub struct PolicySlot {
    tx: Arc<watch::Sender<Option<Arc<InstalledPolicy>>>>,
    config: ModelConfig,
    device: Device,
}

impl PolicySlot {
    /// An empty slot for snapshots of `config` (their config hash must match).
    pub fn new(config: ModelConfig, device: Device) -> Self {
        PolicySlot {
            tx: Arc::new(watch::channel(None).0),
            config,
            device,
        }
    }

    /// The model config snapshots must have.
    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device the engine generates on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Decodes a snapshot payload (safetensors bytes, config hash checked) and installs it.
    /// Versions must increase. The f32 weights are decoded into host memory: on a GPU only
    /// the engine's prepared model (bf16 weights for the inference path) occupies the device,
    /// not a second, f32 copy next to it.
    pub fn install_bytes(&self, version: u64, bytes: &[u8]) -> Result<(), RolloutError> {
        if let Some(cur) = self.version() {
            if version <= cur {
                return Err(RolloutError::StaleVersion {
                    installed: cur,
                    offered: version,
                });
            }
        }
        let policy = Policy::from_safetensors_bytes(&self.config, bytes, &Device::Cpu)?;
        self.install(version, Arc::new(policy))
    }

    /// Installs an already-built policy as `version` (must be newer than the installed one).
    pub fn install(&self, version: u64, policy: Arc<Policy>) -> Result<(), RolloutError> {
        if policy.config().hash() != self.config.hash() {
            return Err(PolicyError::ConfigMismatch {
                expected: self.config.hash_hex(),
                found: policy.config().hash_hex(),
            }
            .into());
        }
        let mut result = Ok(());
        self.tx.send_if_modified(|slot| match slot {
            Some(cur) if cur.version >= version => {
                result = Err(RolloutError::StaleVersion {
                    installed: cur.version,
                    offered: version,
                });
                false
            }
            _ => {
                *slot = Some(Arc::new(InstalledPolicy { version, policy }));
                true
            }
        });
        result
    }

    /// The installed policy, if any.
    pub fn current(&self) -> Option<Arc<InstalledPolicy>> {
        self.tx.borrow().clone()
    }

    /// The installed version, if any.
    pub fn version(&self) -> Option<u64> {
        self.tx.borrow().as_ref().map(|p| p.version)
    }

    /// A receiver that is notified on every install (for async waiters).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<InstalledPolicy>>> {
        self.tx.subscribe()
    }
}
