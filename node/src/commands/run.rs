//! `echo-node run --config FILE`: load and validate the config, open the stores, serve until
//! Ctrl-C / SIGTERM, then shut down cleanly.

use anyhow::Context;
use storage::{ChunkStore, NodeKey, TrajectoryStore};

use crate::cli::RunArgs;
use crate::config::{NodeConfig, Role};

/// A node's opened local state.
pub struct NodeState {
    pub config: NodeConfig,
    pub key: NodeKey,
    pub peer_id: String,
    pub trajectories: TrajectoryStore,
    pub chunks: ChunkStore,
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
    config.validate(&args.config)?;
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
    let peer_id = super::peer_id(&key)?;
    let trajectories = TrajectoryStore::open(&data.trajectories()).with_context(|| {
        format!(
            "opening trajectory store {} (is another node running on this data dir?)",
            data.trajectories().display()
        )
    })?;
    let chunks = ChunkStore::open(&data.snapshots(), config.storage.keep_snapshots)
        .with_context(|| format!("opening chunk store {}", data.snapshots().display()))?;
    Ok(NodeState {
        config,
        key,
        peer_id,
        trajectories,
        chunks,
    })
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = load_config(&args)?;
    let state = open_state(config)?;
    let counters = state.trajectories.counters()?;
    let inv = state.trajectories.check_invariant()?;
    if !inv.holds() {
        tracing::error!(?inv, "trajectory accounting invariant does not hold");
    }
    tracing::info!(
        role = %state.config.role,
        swarm = %state.config.swarm_id,
        peer_id = %state.peer_id,
        public_key = %state.key.public_hex(),
        data_dir = %state.config.data_dir.display(),
        pending = counters.pending(),
        produced = counters.produced,
        snapshots = state.chunks.versions()?.len(),
        "node started"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(shutdown_signal())?;
    tracing::info!("shutting down");
    drop(state);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    Ok(())
}
