//! The rollout role (`docs/architecture.md`, "Life of a trajectory group"): install the learner's snapshots as they arrive, generate
//! rewarded, version-tagged groups into the node's trajectory store, and serve the learner's
//! pulls.
//!
//! - **Install.** The dissemination engine's `Installed` event carries verified bytes; they are
//!   loaded into the [`PolicySlot`] (a snapshot for another model config is refused). At
//!   start the newest complete snapshot in the chunk store is installed, so a restarted worker
//!   resumes at once.
//! - **Generate.** One [`RolloutEngine`] on its own thread; it idles until a policy is
//!   installed, pauses while `storage.max_pending_groups` groups wait to be pulled, and stands
//!   by while the learner's signed activation order says so (it keeps installing snapshots).
//! - **Serve.** `pull::serve` answers only the swarm's learner. A pull names the oldest
//!   admissible version; groups older than that are pruned (counted as discarded-stale) first.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dissemination::DisseminationEvent;
use rollout::{PolicySlot, RolloutConfig, RolloutEngine, RunningEngine};
use tokio::sync::mpsc;

use super::{build_model, build_task, Probe, RoleView};
use crate::api::{RoleSection, RolloutStatus};
use crate::state::NodeState;

/// The running rollout role.
pub struct RolloutRole {
    engine: Option<RunningEngine>,
    slot: PolicySlot,
    stats: Arc<rollout::RolloutStats>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RolloutRole {
    /// Heartbeat probe: the installed version and μ_i.
    pub fn probe(&self) -> Probe {
        let slot = self.slot.clone();
        let stats = self.stats.clone();
        Arc::new(move || (slot.version(), stats.snapshot().mu))
    }

    /// True once the generation thread has exited (a storage error ends it): the node's
    /// watchdog then stops the node rather than let it heartbeat a rate it no longer produces.
    pub fn engine_stopped(&self) -> bool {
        self.engine.as_ref().is_none_or(RunningEngine::is_finished)
    }

    /// Stops the engine (after its current group) and the tasks.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        for t in &self.tasks {
            t.abort();
        }
        let engine = self.engine.take();
        tokio::task::spawn_blocking(move || engine.map(|e| e.stop()).transpose())
            .await
            .context("joining the rollout engine")?
            .context("the rollout engine failed")?;
        Ok(())
    }
}

/// Starts the worker: engine thread, install loop, pull server, status view.
pub async fn start(
    state: Arc<NodeState>,
    client: p2p::Client,
    learner: p2p::PeerId,
    installs: Option<mpsc::UnboundedReceiver<DisseminationEvent>>,
    view: RoleView,
) -> anyhow::Result<RolloutRole> {
    let config = &state.config;
    let (policy, tokenizer) = build_model(config, &state.device)?;
    let task = build_task(config)?;
    // Generation: weights in the inference path's dtype (bf16 on a GPU) plus the KV cache of
    // one group of n rows; prompts are budgeted at 1024 tokens. The f32 weights the slot also
    // keeps are resident already (just loaded), so the device's free memory counts them.
    let r = &config.rollout;
    let gen_dtype = if state.device.is_cuda() {
        policy::DType::BF16
    } else {
        policy::DType::F32
    };
    let context = (1024 + r.max_new_tokens).min(policy.config().max_position_embeddings);
    let need = policy::memory::worker_bytes(policy.config(), gen_dtype, r.group_size, context);
    super::check_memory("the rollout worker", need, &state.device)?;
    let slot = PolicySlot::new(policy.config().clone(), policy.device().clone());
    drop(policy);
    // Resume with the newest complete snapshot already on disk.
    let chunks = state.chunks.clone();
    let slot2 = slot.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        for v in chunks.versions()?.into_iter().rev() {
            if chunks.missing_chunks(v)?.is_empty() {
                let bytes = chunks.assemble(v)?;
                match slot2.install_bytes(v, &bytes) {
                    Ok(()) => tracing::info!(version = v, "installed the stored snapshot"),
                    Err(e) => {
                        tracing::warn!(version = v, error = %e, "stored snapshot not installed")
                    }
                }
                break;
            }
        }
        Ok(())
    })
    .await??;

    let mut sampling = policy::SamplingParams::new(r.max_new_tokens, tokenizer.eos_ids());
    sampling.temperature = r.temperature;
    sampling.top_p = r.top_p;
    let seed = r.seed.unwrap_or_else(|| {
        let h = blake3::hash(state.peer_id.as_bytes());
        u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or_default())
    });
    let engine = RolloutEngine::new(
        RolloutConfig {
            group_size: r.group_size,
            sampling,
            max_pending_groups: config.storage.max_pending_groups,
            seed,
            producer: state.peer_id.clone(),
            idle_poll: Duration::from_millis(20),
            max_groups_per_s: r.max_groups_per_s,
            ..RolloutConfig::default()
        },
        task,
        tokenizer,
        state.trajectories.clone(),
        slot.clone(),
    )
    .context("creating the rollout engine")?;
    let stats = engine.stats();
    let standby = engine.standby_flag();
    let engine = engine.spawn().context("starting the rollout engine")?;

    let mut tasks = Vec::new();
    if let Some(mut rx) = installs {
        let slot = slot.clone();
        let standby = standby.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                match ev {
                    DisseminationEvent::Installed {
                        version,
                        payload,
                        latency,
                    } => {
                        let slot = slot.clone();
                        let r = tokio::task::spawn_blocking(move || {
                            slot.install_bytes(version, &payload)
                        })
                        .await;
                        match r {
                            Ok(Ok(())) => {
                                metrics::gauge!("node_installed_snapshot_version")
                                    .set(version as f64);
                                tracing::info!(version, ?latency, "snapshot installed");
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(version, error = %e, "snapshot not installed")
                            }
                            Err(e) => tracing::error!(error = %e, "install task failed"),
                        }
                    }
                    DisseminationEvent::ChunkRejected {
                        peer,
                        version,
                        index,
                    } => tracing::warn!(%peer, version, index, "corrupt chunk rejected"),
                    DisseminationEvent::Activation { seq, active } => {
                        let was = !standby.swap(!active, Ordering::Relaxed);
                        if was != active {
                            tracing::info!(
                                seq,
                                active,
                                "the learner's scheduler changed this worker's state"
                            );
                        }
                    }
                    DisseminationEvent::Progress { .. } => {}
                }
            }
        }));
    }
    let store = state.trajectories.clone();
    let control = client.stream_control();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = pull::serve(control, store, learner).await {
            tracing::error!(error = %e, "the pull server stopped");
        }
    }));
    {
        let (slot, stats, store) = (slot.clone(), stats.clone(), state.trajectories.clone());
        let standby = standby.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let s = stats.snapshot();
                view.set(RoleSection::Rollout(RolloutStatus {
                    installed_version: slot.version(),
                    mu: s.mu,
                    groups: s.groups,
                    samples: s.samples,
                    tokens: s.tokens,
                    paused: s.paused,
                    errors: s.errors,
                    reward_ema: s.reward_ema,
                    standby: standby.load(Ordering::Relaxed),
                    last_group_version: s.version,
                    pending: store.pending().ok(),
                }));
                metrics::gauge!("rollout_mu_groups_per_s").set(s.mu);
                metrics::gauge!("rollout_groups_total").set(s.groups as f64);
            }
        }));
    }
    Ok(RolloutRole {
        engine: Some(engine),
        slot,
        stats,
        tasks,
    })
}
