//! A node's resolved configuration and opened local state, and the settings derived from them
//! for the network service and the dissemination engine. Commands and roles both read this
//! module; it depends on neither.

use anyhow::Context;
use std::sync::Arc;
use storage::{ChunkStore, NodeKey, TrajectoryStore};

use crate::cli::RunArgs;
use crate::config::{NodeConfig, Role};

/// A node's opened local state.
pub struct NodeState {
    pub config: NodeConfig,
    /// Where the roles build their models (`model.device`, resolved once at start).
    pub device: policy::Device,
    pub key: NodeKey,
    pub peer_id: String,
    /// Shared with the roles (the learner's buffer or the worker's outbox) and the pull server.
    pub trajectories: Arc<TrajectoryStore>,
    /// Shared with the snapshot-dissemination engine.
    pub chunks: Arc<ChunkStore>,
    /// Test-only attacks this process carries out ([`crate::misbehave`]); empty when honest.
    pub misbehave: crate::misbehave::Misbehaviour,
}

/// Loads the config, applies command-line overrides, validates everything.
pub fn load_config(args: &RunArgs) -> anyhow::Result<NodeConfig> {
    let mut config = NodeConfig::load(&args.config)?;
    if let Some(dir) = &args.data_dir {
        config.data_dir = dir.clone();
    }
    if !args.listen.is_empty() {
        config.network.listen = args.listen.clone();
    }
    if let Some(admin) = &args.admin {
        config.network.admin = admin.clone();
    }
    if let Some(device) = args.device {
        config.model.device = device;
    }
    config.validate_all(&args.config)?;
    Ok(config)
}

/// Opens the key and both stores of a validated config.
pub fn open_state(config: NodeConfig) -> anyhow::Result<NodeState> {
    let data = config.data();
    std::fs::create_dir_all(data.root())
        .with_context(|| format!("creating data dir {}", data.root().display()))?;
    let key_path = config.key_path();
    let (key, created) = NodeKey::load_or_create(&key_path)
        .with_context(|| format!("loading node key {}", key_path.display()))?;
    if created {
        tracing::info!(path = %key_path.display(), "created a new node key");
    }
    if config.role == Role::Learner {
        if let Some(expected) = &config.learner_public_key {
            anyhow::ensure!(
                expected.trim() == key.public_hex(),
                "learner_public_key {expected} in the config is not this node's key {} ({})",
                key.public_hex(),
                key_path.display()
            );
        }
    }
    let peer_id = peer_id(&key)?;
    let device = policy::device::select(config.model.device)
        .with_context(|| format!("model.device = \"{}\"", config.model.device))?;
    let info = policy::device::describe(&device);
    tracing::info!(
        kind = %info.kind,
        name = %info.name,
        memory_total_gib = info.memory_total_bytes as f64 / f64::from(1u32 << 30),
        memory_free_gib = info.memory_free_bytes as f64 / f64::from(1u32 << 30),
        "model device"
    );
    let trajectories = TrajectoryStore::open(&data.trajectories()).map_err(|e| {
        let what = format!("opening trajectory store {}", data.trajectories().display());
        match e {
            // The error names the damaged file and what to do.
            storage::StorageError::Damaged { .. } => anyhow::Error::new(e).context(what),
            e => anyhow::Error::new(e).context(format!(
                "{what} (is another node running on this data dir?)"
            )),
        }
    })?;
    // Garbage collection keeps the newest `keep_snapshots` versions and every version a kept
    // delta depends on, back to its keyframe (`storage::deps::retained`): a learner publishing
    // deltas keeps its staleness window and the keyframe and deltas a catch-up needs.
    let keep = config.storage.keep_snapshots;
    let chunks = ChunkStore::open_with_memory(
        &data.snapshots(),
        keep,
        config.storage.chunk_memory_mb << 20,
    )
    .with_context(|| format!("opening chunk store {}", data.snapshots().display()))?;
    // The replay marks are read again by the dissemination engine; a damaged file is refused
    // here, before the network starts.
    let replay = config.data_dir.join(storage::replay::REPLAY_FILE_NAME);
    storage::replay::ReplayState::open(&replay).context("reading the replay state")?;
    let misbehave = crate::misbehave::Misbehaviour::from_env()
        .map_err(|e| anyhow::anyhow!("{}: {e}", crate::misbehave::ENV_VAR))?;
    if !misbehave.is_honest() {
        let attacks: Vec<String> = misbehave.attacks().map(|a| a.to_string()).collect();
        tracing::warn!(attacks = %attacks.join(","), "TEST-ONLY MISBEHAVIOUR SWITCHED ON: this node attacks the swarm");
    }
    Ok(NodeState {
        config,
        device,
        key,
        peer_id,
        trajectories: Arc::new(trajectories),
        chunks: Arc::new(chunks),
        misbehave,
    })
}

/// The network service configuration of a node whose key has `seed` (a learner is its own
/// swarm's learner: its peer id comes from its key, never from a string).
pub fn service_config(config: &NodeConfig, seed: [u8; 32]) -> anyhow::Result<p2p::ServiceConfig> {
    let learner = match (config.role, &config.learner_public_key) {
        (Role::Learner, _) => Some(p2p::peer_id_from_seed(seed)),
        (_, Some(hex_key)) => {
            let bytes = storage::keys::parse_public_key(hex_key).context("learner_public_key")?;
            Some(p2p::peer_id_from_public(bytes.to_bytes())?)
        }
        (_, None) => None,
    };
    Ok(p2p::ServiceConfig {
        network: config.network.clone(),
        swarm_id: config.swarm_id.clone(),
        role: config.role,
        node_version: NODE_VERSION.to_string(),
        learner,
    })
}

/// The dissemination engine's settings, or `None` when the learner key is unknown.
pub fn dissemination_config(
    config: &NodeConfig,
    key: &NodeKey,
) -> anyhow::Result<Option<dissemination::DisseminationConfig>> {
    let learner_key = match (config.role, &config.learner_public_key) {
        (Role::Learner, _) => key.verifying_key(),
        (_, Some(hex_key)) => {
            storage::keys::parse_public_key(hex_key).context("learner_public_key")?
        }
        (_, None) => return Ok(None),
    };
    let net = &config.network;
    let mut d = dissemination::DisseminationConfig::new(&config.swarm_id, learner_key);
    d.chunk_size = control::units::kib_to_bytes(config.storage.chunk_size_kib.into()) as u32;
    d.downlink_mbps = net.downlink_mbps;
    d.uplink_mbps = net.uplink_mbps;
    // B̂w assumed per worker (a worker's own `uplink_mbps` caps what it really sends).
    d.plan.worker_mbps = config.broadcast.worker_mbps;
    d.plan.epoch_versions = config.broadcast.plan_epoch;
    d.mode = config.broadcast.mode;
    d.warm_up_bytes = config.broadcast.warm_up_mib << 20;
    // Acceptance marks that survive a restart (old learner-signed messages stay refused).
    d.replay_path = Some(config.data_dir.join(storage::replay::REPLAY_FILE_NAME));
    if config.role == Role::Learner {
        d.signing_key = Some(key.signing_key().clone());
        if net.learner_mbps > 0.0 {
            // B0 caps the learner's bulk uploads and sets N_ch.
            d.uplink_mbps = net.learner_mbps;
            d.plan.learner_mbps = net.learner_mbps;
        }
    }
    Ok(Some(d))
}

/// Software version gossiped in heartbeats.
pub const NODE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The libp2p peer id of a node key (the same ed25519 key signs manifests and identifies the
/// node on the network).
pub fn peer_id(key: &NodeKey) -> anyhow::Result<String> {
    Ok(p2p::peer_id_from_seed(key.seed()).to_string())
}

/// The device report a node's heartbeats carry (refreshed each heartbeat: free memory moves).
pub fn device_report(device: &policy::Device) -> p2p::DeviceReport {
    let d = policy::device::describe(device);
    p2p::DeviceReport {
        kind: d.kind,
        name: d.name,
        memory_total_bytes: d.memory_total_bytes,
        memory_free_bytes: d.memory_free_bytes.min(d.memory_total_bytes),
        compute_capability: d.compute_capability,
        dtype: None,
        sampling: None,
    }
}
