//! What a node does once its network service runs: the learner loop ([`learner`]: pull,
//! train, publish, checkpoint — ECHO-2 Algorithm 1), the rollout worker ([`rollout`]: install
//! snapshots, generate groups, serve pulls), the learner's provisioning [`scheduler`], and the
//! broadcast benchmark roles ([`bench`]) the testnet harness starts, and the relay /
//! bootstrap node ([`relay`]: no model, no stores).
//!
//! A role reports what `echo-node status` shows through [`RoleView`] and what its heartbeat
//! carries through [`Probe`]; it never touches the swarm directly (only through the
//! `p2p::Client` handle and the dissemination engine).

pub mod adapter;
#[cfg(feature = "adversary")]
pub mod attacks;
/// Without the `adversary` feature the attack hooks do nothing (`attacks_off.rs`).
#[cfg(not(feature = "adversary"))]
#[path = "attacks_off.rs"]
pub mod attacks;
pub mod bench;
pub mod catchup;
pub mod delta;
#[cfg(feature = "adversary")]
pub mod forge;
pub mod learner;
pub mod progress;
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

/// The learner's forwarding accounts (`dissemination::ForwardingView`) for `/status`.
pub type ForwardingSource = Arc<dyn Fn() -> dissemination::ForwardingView + Send + Sync>;

/// The role's section of the `/status` object, replaced as the role makes progress, and where
/// the status view reads the current plan (and, on the learner, its forwarding accounts)
/// from.
#[derive(Clone, Default)]
pub struct RoleView(
    Arc<RwLock<Option<RoleSection>>>,
    Arc<RwLock<Option<PlanSource>>>,
    Arc<RwLock<Option<ForwardingSource>>>,
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

    pub fn set_forwarding_source(&self, source: ForwardingSource) {
        if let Ok(mut g) = self.2.write() {
            *g = Some(source);
        }
    }

    /// The learner's forwarding accounts, if a source is set.
    pub fn forwarding(&self) -> Option<dissemination::ForwardingView> {
        let source = self.2.read().ok()?.clone()?;
        Some(source())
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

/// The tasks of a role or of `run`: spawned under one cancellation token, stopped together,
/// and awaited — a clean stop ends every task, none is left running or merely aborted.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: tokio_util::task::TaskTracker,
    cancel: tokio_util::sync::CancellationToken,
}

impl Tasks {
    /// Runs `fut` until it ends or [`Tasks::stop`] cancels it (at its next await).
    pub fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            cancel.run_until_cancelled(fut).await;
        });
    }

    /// Cancels every task and waits until all have ended.
    pub async fn stop(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// What a role contributes to its node's heartbeat: the version it works with and μ.
pub type Probe = Arc<dyn Fn() -> (Option<u64>, f64) + Send + Sync>;

/// Where a role's version changes come from (an install, a publication), so the heartbeat
/// feeder reports a new version at once — the install report that ends T_bcast — instead of
/// polling the [`Probe`].
#[derive(Clone)]
pub enum VersionChanges {
    /// A worker's policy slot: every install.
    Slot(tokio::sync::watch::Receiver<Option<Arc<::rollout::InstalledPolicy>>>),
    /// A version watch (the learner's publications, a benchmark sink's installs).
    Version(tokio::sync::watch::Receiver<Option<u64>>),
    /// A role whose version never changes.
    Never,
}

impl VersionChanges {
    /// Resolves at the next change; never, once its source is gone.
    pub async fn changed(&mut self) {
        let gone = match self {
            VersionChanges::Slot(r) => r.changed().await.is_err(),
            VersionChanges::Version(r) => r.changed().await.is_err(),
            VersionChanges::Never => true,
        };
        if gone {
            *self = VersionChanges::Never;
            std::future::pending::<()>().await;
        }
    }
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
/// task: every response token for single-turn tasks; for a multi-turn environment, the
/// assistant's tokens of the replayed episode.
pub fn mask_rule(config: &NodeConfig) -> anyhow::Result<Arc<dyn ::learner::MaskRule>> {
    let env = build_env(config)?;
    if env.as_task().is_some() {
        return Ok(Arc::new(::learner::ResponseTokens));
    }
    let tokenizer = learner::verify::learner_tokenizer(config)?;
    let chat = Arc::new(build_chat(config, tokenizer, env.as_ref())?);
    Ok(Arc::new(learner::verify::EpisodeMask {
        budget: config.task.budget(env.as_ref())?,
        context: learner::verify::model_context(config)?,
        env,
        chat,
        derived: Default::default(),
    }))
}

/// The configured task or environment, as an environment (a task is a one-step one).
pub fn build_env(config: &NodeConfig) -> anyhow::Result<Arc<dyn tasks::env::Environment>> {
    config
        .task
        .build_env()
        .with_context(|| format!("building task `{}`", config.task.name))
}

/// How the configured model renders `env`'s conversations: the single-turn prompt template
/// for a one-step environment without a system message; for a multi-turn one (or one with a
/// system message), the `chat_template` of the model's
/// Hugging Face folder, or the embedded model's built-in template.
pub fn build_chat(
    config: &NodeConfig,
    tokenizer: Tokenizer,
    env: &dyn tasks::env::Environment,
) -> anyhow::Result<policy::chat::Chat> {
    // A one-step environment with a system message (an external one) needs the chat
    // template too: the single-turn prompt template has no system message.
    let multi = env.metadata().is_multi_turn() || env.system_prompt().is_some();
    let hf = if multi && config.model.source != "embedded" {
        policy::chat::hf_chat_template(std::path::Path::new(&config.model.source))?
    } else {
        None
    };
    Ok(policy::chat::Chat::for_model(tokenizer, hf, multi)?)
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
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}

/// Drains a node's domain events when no role judges Snapshots / Plans gossip (a worker without
/// a learner key, a relay): every such message gets `Ignore` — not forwarded, no penalty — so
/// gossipsub does not wait for a verdict.
pub async fn ignore_role_gossip(
    client: p2p::Client,
    mut events: tokio::sync::mpsc::Receiver<p2p::Event>,
) {
    while let Some(ev) = events.recv().await {
        if let p2p::Event::Gossip {
            message_id,
            propagation_source,
            source,
            ..
        } = ev
        {
            let _ = client
                .report_validation(
                    message_id,
                    propagation_source,
                    source,
                    p2p::Validation::Ignore,
                )
                .await;
        }
    }
}
