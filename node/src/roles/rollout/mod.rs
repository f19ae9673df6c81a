//! The rollout role (`docs/architecture.md`, "Life of a trajectory group"): install the learner's snapshots as they arrive, generate
//! rewarded, version-tagged groups into the node's trajectory store, and serve the learner's
//! pulls.
//!
//! - **Install.** The dissemination engine's `Installed` event carries verified bytes; they are
//!   loaded into the [`PolicySlot`] (a snapshot for another model config is refused). At
//!   start the newest snapshot the chunk store rebuilds (a delta version from its keyframe and
//!   the deltas since, every root checked) is installed, so a restarted worker resumes at once
//!   and applies the next delta; a delta whose base it lacks is caught up (`super::catchup`).
//! - **Generate.** One [`RolloutEngine`] on its own thread; it idles until a policy is
//!   installed, pauses while `storage.max_pending_groups` groups wait to be pulled, and stands
//!   by while the learner's signed activation order says so (it keeps installing snapshots).
//! - **Serve.** `pull::serve` answers only the swarm's learner. A pull names the oldest
//!   admissible version; groups older than that are pruned (counted as discarded-stale) first.
//! - **Verifiable groups.** Every group is signed with the node key, numbered by the durable
//!   counter `<data_dir>/rollout.seq`, and answers the prompt assigned to (this peer, its
//!   number) by the seed of the swarm id and the learner's key (`tasks::assign`): what the
//!   learner checks (`docs/security.md`, "Verified rollouts").
//! - **Test-only attacks** (only in a build with the `adversary` feature). With
//!   `ECHO_NODE_MISBEHAVE` naming group attacks (`GROUP_ATTACKS`) the finished group is
//!   corrupted just before it is stored (`tamper`), so what the learner pulls is really bad;
//!   with several, group `seq` gets attack `seq mod k`. The `late_liar` and `sybil_rekey`
//!   workers forge log-probs only from a number of honest groups on (`forges`); every forged
//!   group's id is listed in `<data_dir>/misbehave.forged`. A `backlog_inflation` worker
//!   keeps far more groups pending than configured (`roles::attacks::pending_limit`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dissemination::DisseminationEvent;
use rollout::{PolicySlot, RolloutConfig, RolloutEngine, RunningEngine};
use tokio::sync::mpsc;

use super::{build_chat, build_env, build_model, Probe, RoleView};
use crate::api::{RoleSection, RolloutStatus};
use crate::state::NodeState;

#[cfg(feature = "adversary")]
mod attack;
mod install;

#[cfg(feature = "adversary")]
pub use attack::{forges, tamper, GROUP_ATTACKS};

/// The running rollout role.
pub struct RolloutRole {
    engine: Option<RunningEngine>,
    slot: PolicySlot,
    stats: Arc<rollout::RolloutStats>,
    tasks: super::Tasks,
}

impl RolloutRole {
    /// Heartbeat probe: the installed version and μ_i.
    pub fn probe(&self) -> Probe {
        let slot = self.slot.clone();
        let stats = self.stats.clone();
        Arc::new(move || (slot.version(), stats.snapshot().mu))
    }

    /// Every install into the policy slot.
    pub fn version_changes(&self) -> super::VersionChanges {
        super::VersionChanges::Slot(self.slot.subscribe())
    }

    /// True once the generation thread has exited (a storage error ends it): the node's
    /// watchdog then stops the node rather than let it heartbeat a rate it no longer produces.
    pub fn engine_stopped(&self) -> bool {
        self.engine.as_ref().is_none_or(RunningEngine::is_finished)
    }

    /// Stops the engine (after its current group) and the tasks.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.tasks.stop().await;
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
    dissem: Option<dissemination::Disseminator>,
    view: RoleView,
) -> anyhow::Result<RolloutRole> {
    let config = &state.config;
    // The f32 weights stay in host memory (snapshots decode there too): the device holds only
    // the inference path's prepared copy.
    let (policy, tokenizer) = build_model(config, &policy::Device::Cpu)?;
    let model = policy.config().clone();
    drop(policy);
    let env = build_env(config)?;
    let budget = config.task.budget(env.as_ref())?;
    check_worker_memory(&state, &model, env.as_ref(), &budget)?;
    let slot = PolicySlot::new(model.clone(), state.device.clone());
    // The bases adapter versions are installed onto (a LoRA run).
    let bases = Arc::new(std::sync::Mutex::new(super::adapter::Bases::new(
        config.clone(),
        model.clone(),
        state.chunks.clone(),
    )));
    let payloads = Arc::new(super::catchup::PayloadStats::default());
    let base = install::restore(&state, &slot, &bases, &payloads).await;

    let r = &config.rollout;
    let mut sampling = policy::SamplingParams::new(r.max_new_tokens, tokenizer.eos_ids());
    sampling.temperature = r.temperature;
    sampling.top_p = r.top_p;
    let assignment_seed = assignment_seed(config)?;
    #[cfg(feature = "adversary")]
    let hook = attack::seal_hook(
        &state,
        &model,
        &slot,
        env.as_ref(),
        &sampling,
        &tokenizer,
        assignment_seed,
    );
    let chat = build_chat(config, tokenizer, env.as_ref())?;
    let engine = RolloutEngine::for_env(
        engine_config(&state, sampling, assignment_seed),
        env,
        chat,
        budget,
        state.trajectories.clone(),
        slot.clone(),
    )
    .context("creating the rollout engine")?
    .with_signer(state.key.clone())
    .with_seq_file(&config.data_dir.join("rollout.seq"))
    .context("opening the group counter")?;
    #[cfg(feature = "adversary")]
    let engine = match hook {
        Some(hook) => engine.with_seal_hook(hook),
        None => engine,
    };
    let stats = engine.stats();
    let standby = engine.standby_flag();
    let engine = engine.spawn().context("starting the rollout engine")?;

    let tasks = super::Tasks::default();
    if let Some(rx) = installs {
        let installer = install::Installer {
            slot: slot.clone(),
            bases,
            base,
            chunks: state.chunks.clone(),
            payloads: payloads.clone(),
            dissem,
            standby: standby.clone(),
            bar: crate::roles::progress::Bar::default(),
        };
        tasks.spawn(installer.run(rx));
    }
    tasks.spawn(serve_pulls(&state, &client, learner));
    tasks.spawn(report_status(
        view,
        slot.clone(),
        stats.clone(),
        state.trajectories.clone(),
        payloads,
        standby,
    ));
    Ok(RolloutRole {
        engine: Some(engine),
        slot,
        stats,
        tasks,
    })
}

/// Refuses to start a worker whose device cannot hold generation: the weights in the
/// inference path's dtype (bf16 on a GPU) plus the KV cache of one batch (one group of n rows,
/// or `rollout.max_batch` rows), with prompts budgeted at 1024 tokens.
fn check_worker_memory(
    state: &NodeState,
    model: &policy::ModelConfig,
    env: &dyn tasks::env::Environment,
    budget: &tasks::env::Budget,
) -> anyhow::Result<()> {
    let r = &state.config.rollout;
    let gen_dtype = r.dtype.resolve(&state.device);
    let new_tokens = if env.metadata().is_multi_turn() {
        budget.max_episode_tokens
    } else {
        r.max_new_tokens
    };
    let context = (1024 + new_tokens).min(model.max_position_embeddings);
    // A batch of several groups holds `max_batch` sequences' KV at once.
    let rows = r.group_size.max(r.max_batch);
    let need = policy::memory::worker_bytes(model, gen_dtype, rows, context);
    super::check_memory("the rollout worker", need, &state.device)
}

/// The seed of the prompt assignment (`tasks::assign`): the swarm id and the learner's key,
/// so the learner can recompute which prompt a worker's group must answer.
fn assignment_seed(config: &crate::config::NodeConfig) -> anyhow::Result<[u8; 32]> {
    let learner_key = storage::keys::parse_public_key(
        config
            .learner_public_key
            .as_deref()
            .context("a rollout worker needs learner_public_key")?,
    )?;
    Ok(tasks::assign::assignment_seed(
        &config.swarm_id,
        &learner_key.to_bytes(),
    ))
}

/// The generation engine's configuration from the node's `[rollout]` section. The sampling
/// seed defaults to one derived from the peer id, so workers never share a stream.
fn engine_config(
    state: &NodeState,
    sampling: policy::SamplingParams,
    assignment_seed: [u8; 32],
) -> RolloutConfig {
    let r = &state.config.rollout;
    let seed = r.seed.unwrap_or_else(|| {
        let h = blake3::hash(state.peer_id.as_bytes());
        u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or_default())
    });
    RolloutConfig {
        group_size: r.group_size,
        sampling,
        max_pending_groups: super::attacks::pending_limit(
            &state.misbehave,
            state.config.storage.max_pending_groups,
        ),
        seed,
        producer: state.peer_id.clone(),
        idle_poll: Duration::from_millis(20),
        max_groups_per_s: r.max_groups_per_s,
        assignment_seed: Some(assignment_seed),
        infer_dtype: Some(r.dtype.resolve(&state.device)),
        max_batch: r.max_batch,
        ..RolloutConfig::default()
    }
}

/// The pull server: answers only the swarm's learner (`pull::serve_with`).
fn serve_pulls(
    state: &NodeState,
    client: &p2p::Client,
    learner: p2p::PeerId,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let store = state.trajectories.clone();
    let control = client.stream_control();
    let serve_opts = pull::ServeOptions {
        #[cfg(feature = "adversary")]
        testing_oversized_answer: state
            .misbehave
            .has(crate::misbehave::Attack::OversizedAnswer),
        #[cfg(feature = "adversary")]
        testing_withhold: state
            .misbehave
            .has(crate::misbehave::Attack::WithholdByReward)
            .then_some(attack::has_exact_answer as fn(&storage::TrajectoryGroup) -> bool),
        ..pull::ServeOptions::default()
    };
    async move {
        if let Err(e) = pull::serve_with(control, store, learner, serve_opts).await {
            tracing::error!(error = %e, "the pull server stopped");
        }
    }
}

/// Once a second: the worker's status section and its gauges.
async fn report_status(
    view: RoleView,
    slot: PolicySlot,
    stats: Arc<rollout::RolloutStats>,
    store: Arc<storage::TrajectoryStore>,
    payloads: Arc<super::catchup::PayloadStats>,
    standby: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let s = stats.snapshot();
        let (installed_payload, catch_ups, catch_up_bytes, restored_version) = payloads.view();
        view.set(RoleSection::Rollout(RolloutStatus {
            installed_version: slot.version(),
            mu: s.mu,
            groups: s.groups,
            samples: s.samples,
            tokens: s.tokens,
            paused: s.paused,
            behind_window: s.behind,
            errors: s.errors,
            reward_ema: s.reward_ema,
            standby: standby.load(Ordering::Relaxed),
            last_group_version: s.version,
            pending: store.pending().ok(),
            installed_payload,
            catch_ups,
            catch_up_bytes,
            restored_version,
        }));
        metrics::gauge!("rollout_mu_groups_per_s").set(s.mu);
        metrics::counter!("rollout_groups_total").absolute(s.groups);
    }
}
