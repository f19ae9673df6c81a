//! The relay / bootstrap role (`role = "relay"`): a public node that peers behind NAT reserve
//! a slot on (libp2p circuit relay v2, limits from `[network]`), that answers Kademlia queries
//! (server mode) and AutoNAT probes, and that new nodes name as their bootstrap peer. It runs
//! no model and opens no trajectory or chunk store: its data dir holds only its key (and the
//! address file while it runs).
//!
//! Owns: starting and stopping that node. Must not touch: the relay server's configuration
//! (`p2p::behaviour`, built from `[network]`) or the other roles. Gossip on the snapshot and
//! plan topics is left unjudged here (`Ignore`: not forwarded, no penalty) — a relay holds no
//! chunk store to verify manifests against; heartbeats and score tables are validated by the
//! network service itself and flow through the relay's mesh.

use std::sync::Arc;

use anyhow::Context;

use crate::admin;
use crate::config::NodeConfig;
use crate::roles::RoleView;
use crate::state::{service_config, NODE_VERSION};

/// Runs a relay node until Ctrl-C / SIGTERM. `config` is validated and names `role = "relay"`.
pub fn run(config: NodeConfig) -> anyhow::Result<()> {
    let data = config.data();
    std::fs::create_dir_all(data.root())
        .with_context(|| format!("creating data dir {}", data.root().display()))?;
    let key_path = config.key_path();
    let (key, created) = storage::NodeKey::load_or_create(&key_path)
        .with_context(|| format!("loading node key {}", key_path.display()))?;
    if created {
        tracing::info!(path = %key_path.display(), "created a new node key");
    }
    let peer_id = crate::state::peer_id(&key)?;
    let net = &config.network;
    tracing::info!(
        role = "relay",
        swarm = %config.swarm_id,
        %peer_id,
        max_reservations = net.relay_max_reservations,
        max_circuits = net.relay_max_circuits,
        max_circuit_mb = net.relay_max_circuit_mb,
        max_circuit_duration_s = net.relay_max_circuit_duration_s,
        "relay node started"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(serve(&config, key.seed(), peer_id));
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    result?;
    tracing::info!("stopped cleanly");
    Ok(())
}

async fn serve(config: &NodeConfig, seed: [u8; 32], peer_id: String) -> anyhow::Result<()> {
    let prometheus = admin::install_metrics_recorder();
    let mut registry = p2p::Registry::default();
    let svc = service_config(config, seed)?;
    let (client, events, mut service) =
        p2p::start(seed, svc, &mut registry).context("starting the network service")?;
    // The relay's tasks (admin endpoint, address file, gossip drain): stopped and awaited.
    let tasks = super::Tasks::default();
    admin::serve_node(
        config,
        peer_id,
        admin::AdminState {
            client: client.clone(),
            registry: Arc::new(registry),
            prometheus,
            node_version: NODE_VERSION,
            role_view: RoleView::default(),
        },
        &tasks,
    )
    .await?;
    // No role here judges snapshot or plan gossip.
    tasks.spawn(super::ignore_role_gossip(client.clone(), events));
    let result = tokio::select! {
        r = super::shutdown_signal() => r,
        r = &mut service => r
            .context("network service task failed")
            .and_then(|_| anyhow::bail!("the network service stopped unexpectedly")),
    };
    tracing::info!("shutting down");
    client.shutdown().await;
    if !service.is_finished() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut service).await;
    }
    tasks.stop().await;
    crate::addr_file::remove(&config.data_dir);
    result
}
