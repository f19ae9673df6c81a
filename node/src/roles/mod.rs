//! What a node does once its network service runs: the learner loop ([`learner`]: pull,
//! train, publish, checkpoint — ECHO-2 Algorithm 1), the rollout worker ([`rollout`]: install
//! snapshots, generate groups, serve pulls), the learner's provisioning [`scheduler`], and the
//! broadcast benchmark roles ([`bench`]) the testnet harness starts, and the relay /
//! bootstrap node ([`relay`]: no model, no stores).
//!
//! A role reports what `echo-node status` shows through [`RoleView`] and what its heartbeat
//! carries through [`Probe`]; it never touches the swarm directly (only through the
//! `p2p::Client` handle and the dissemination engine).

pub mod attacks;
pub mod bench;
pub mod forge;
pub mod learner;
pub mod relay;
pub mod rollout;
pub mod scheduler;

use std::sync::{Arc, RwLock};

use anyhow::Context;
use policy::{Policy, Tokenizer};

use crate::api::RoleSection;
use crate::config::NodeConfig;

/// The chains of the newest accepted forwarding plan, as peer ids (`chains[j][k]`: chain
/// `j`, position `k`, 0 = receives from the learner).
pub type PlanSource = Arc<dyn Fn() -> Option<Vec<Vec<String>>> + Send + Sync>;

/// The role's section of the `/status` object, replaced as the role makes progress, and where
/// the status view reads the current plan from.
#[derive(Clone, Default)]
pub struct RoleView(
    Arc<RwLock<Option<RoleSection>>>,
    Arc<RwLock<Option<PlanSource>>>,
);

/// The plan source of a dissemination engine: the chains of its newest accepted plan (the
/// learner's own, or the one a worker accepted from the learner).
pub fn plan_source(d: dissemination::Disseminator) -> PlanSource {
    Arc::new(move || {
        d.current_plan().map(|p| {
            p.plan
                .chains
                .iter()
                .map(|c| c.iter().map(ToString::to_string).collect())
                .collect()
        })
    })
}

impl RoleView {
    pub fn set_plan_source(&self, source: PlanSource) {
        if let Ok(mut g) = self.1.write() {
            *g = Some(source);
        }
    }

    /// The chains of the current plan, if a plan source is set and a plan is known.
    pub fn chains(&self) -> Option<Vec<Vec<String>>> {
        let source = self.1.read().ok()?.clone()?;
        source()
    }

    pub fn set(&self, section: RoleSection) {
        if let Ok(mut g) = self.0.write() {
            *g = Some(section);
        }
    }

    pub fn get(&self) -> Option<RoleSection> {
        self.0.read().ok().and_then(|g| g.clone())
    }
}

/// What a role contributes to its node's heartbeat: the version it works with and μ.
pub type Probe = Arc<dyn Fn() -> (Option<u64>, f64) + Send + Sync>;

/// The connected rollout workers of a network status: whom the learner pulls from, schedules
/// and plans chains over.
pub fn rollout_workers(net: &p2p::NetworkStatus) -> impl Iterator<Item = &p2p::PeerStatus> {
    net.peers
        .iter()
        .filter(|p| p.connected && !p.banned && p.role == Some(p2p::Role::Rollout))
}

/// The installed versions of the connected, active rollout workers: the population whose
/// install reports end a broadcast's T_bcast.
pub fn active_installs(net: &p2p::NetworkStatus) -> Vec<Option<u64>> {
    rollout_workers(net)
        .filter(|p| p.active)
        .map(|p| p.installed_version)
        .collect()
}

/// Builds the configured policy and tokenizer on `device` (the learner's initial weights; a
/// worker only needs the model config and tokenizer from it).
pub fn build_model(
    config: &NodeConfig,
    device: &policy::Device,
) -> anyhow::Result<(Policy, Tokenizer)> {
    if config.model.source == "embedded" {
        let policy = Policy::new_random(&policy::ModelConfig::tiny(), config.model.seed, device)
            .context("building the embedded model")?;
        Ok((policy, Tokenizer::byte()))
    } else {
        let dir = std::path::Path::new(&config.model.source);
        policy::hf::load_hf_dir(dir, device)
            .with_context(|| format!("loading model.source {}", dir.display()))
    }
}

/// Refuses to start a role whose model does not fit its device: `need` more bytes than the
/// device has free now (the weights already loaded are counted by the device, not in `need`).
/// An unreadable free-memory figure (0) skips the check.
pub fn check_memory(what: &str, need: u64, device: &policy::Device) -> anyhow::Result<()> {
    let free = policy::device::describe(device).memory_free_bytes;
    if free == 0 {
        tracing::warn!(
            what,
            "free device memory unknown: the memory check is skipped"
        );
        return Ok(());
    }
    policy::memory::check_fit(what, need, free)?;
    tracing::info!(
        what,
        need_gib = need as f64 / f64::from(1u32 << 30),
        free_gib = free as f64 / f64::from(1u32 << 30),
        "fits the device"
    );
    Ok(())
}

/// The configured task.
pub fn build_task(config: &NodeConfig) -> anyhow::Result<Arc<dyn tasks::Task>> {
    tasks::build_task(&config.task.name, &config.task.params)
        .with_context(|| format!("building task `{}`", config.task.name))
}

/// The rule the learner derives loss masks (and sampled positions) by for the configured
/// task: every response token for single-turn tasks. A multi-turn environment plugs its
/// turn-aware rule in here.
pub fn mask_rule(_config: &NodeConfig) -> Arc<dyn ::learner::MaskRule> {
    Arc::new(::learner::ResponseTokens)
}
