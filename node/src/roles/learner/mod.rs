//! The learner role: ECHO-2 Algorithm 1 over the network (`docs/learner.md`).
//!
//! Three activities share one [`Shared`] state, each in its own module:
//! - the **training thread** ([`train`]) owns the [`Trainer`]: it leases B admissible groups
//!   from the node's own trajectory buffer, acks them, trains one step, hands every κ-th
//!   snapshot to the publisher, checkpoints every N steps and at shutdown, and appends one
//!   JSON line per step to `<data_dir>/metrics/steps.jsonl`;
//! - the **publisher** task ([`publisher`]) hands the newest snapshot to the dissemination
//!   engine and measures T_bcast from the workers' install reports (woken by each change of
//!   the peer view, `p2p::Client::peer_changes`); it never blocks training (a snapshot superseded before it
//!   was published is skipped);
//! - the **puller** task ([`puller`]) keeps the buffer topped up: it pulls from the admitted
//!   rollout workers ([`crate::admission`]) with the pull protocol, within each worker's
//!   credit and share ([`shares`]), runs every group through the one verification pipeline
//!   before it is stored ([`verify`]: structure, producer signature, assigned prompt,
//!   recomputed rewards, the log-prob spot check at the worker's check rate), penalises the
//!   workers whose groups fail (one table: strike, or ban at once on proof) and drops the
//!   buffered groups of a banned worker.
//!
//! [`status`] turns their figures into the `learner` section of `/status`.
//!
//! ## One staleness window
//! The trainer, the puller's buffer accounting, the `v_min` of every pull lease and `/status`
//! all read the one [`Window`] built from the `S` the trainer runs with. On a restart that is
//! the checkpoint's `S` (checkpointed settings win over the config file; a differing config
//! value is logged as a warning at start — see `docs/learner.md`, "Restarts").
//!
//! ## Exactly once across crashes
//! The buffer lease is **acked before** the step trains (the ack deletes the groups durably),
//! and the trainer refuses any trajectory id it has consumed (checkpointed). A learner killed
//! mid-step therefore loses at most that step's groups and never trains a group twice. On
//! restart the trainer resumes from its last checkpoint; its version is moved past every
//! snapshot it ever published (the manifests in its chunk store), so versions keep growing
//! and workers accept the next snapshot.

mod commits;
mod ctx;
pub mod envs;
pub mod penalty;
mod publisher;
mod puller;
mod restore;
pub mod rule_check;
mod shares;
pub mod spot;
mod status;
mod train;
pub mod verify;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use dissemination::Disseminator;
use learner::{Pipeline, Trainer, Window};
use tokio::sync::watch;

use super::{Probe, RoleView};
use crate::state::NodeState;
use restore::restore_or_init;
pub(crate) use restore::warm_start;

/// "None" in the atomics below.
const NONE: u64 = u64::MAX;

/// The trainer's version v and whether the step at v has taken its batch, in one atomic
/// (`2·v + taken`): read together, so the puller never sees v + 1 with the old flag.
struct TrainerVersion(AtomicU64);

impl TrainerVersion {
    fn new(v: u64) -> Self {
        TrainerVersion(AtomicU64::new(2 * v))
    }

    /// At version `v`, gathering its batch.
    fn gathering(&self, v: u64) {
        self.0.store(2 * v, Ordering::Relaxed);
    }

    /// At version `v`, its batch taken: the step trains.
    fn taken(&self, v: u64) {
        self.0.store(2 * v + 1, Ordering::Relaxed);
    }

    /// `(v, taken)`.
    fn get(&self) -> (u64, bool) {
        let x = self.0.load(Ordering::Relaxed);
        (x / 2, x % 2 == 1)
    }
}

/// What the training thread, the publisher, the puller and `/status` share.
struct Shared {
    /// Cancelled to stop the learner: the training thread checkpoints and ends.
    stop: tokio_util::sync::CancellationToken,
    /// The staleness window of the running trainer (see the module doc).
    window: Window,
    /// The trainer's version and whether its step has taken its batch: once it has, the
    /// puller fills for the next step (`control::Window::filling`).
    version: TrainerVersion,
    /// Buffered groups deleted because they fell out of the window.
    pruned: AtomicU64,
    publish: publisher::PublishStats,
    pulls: puller::PullStats,
    /// μ_target = γ·μ_min in milli-groups/s ([`NONE`] while unknown), for the scheduler.
    mu_target_milli: AtomicU64,
    /// The scheduler's state (when `scheduler.enabled`).
    scheduler: Option<Arc<Mutex<super::scheduler::State>>>,
    /// Wakes the puller between its ticks: the training thread took a batch out of the buffer,
    /// or found none to take. Waiting for the next tick instead left the learner idle for up
    /// to `pull_interval_ms` after each version bump had expired part of the buffer.
    pull_wake: tokio::sync::Notify,
    /// The one verification pipeline: it verifies what the puller stores, re-wraps what the
    /// training thread takes from the buffer, and keeps the workers' verified histories.
    pipeline: Arc<Pipeline>,
    /// Admitted, active workers past probation (the puller counts them; the batch quota
    /// reads them).
    established_active: AtomicUsize,
    /// Groups trained per producer (peer id) since start: the `trained` of each worker's
    /// contribution in the score tables (`puller::contributions`).
    trained: Mutex<std::collections::HashMap<String, u64>>,
    /// The workers' committed group numbers (`control::commits`): the puller asks each log
    /// from where the last ended and strikes what the book finds.
    commits: commits::Commitments,
    /// The margins each worker earned by its measured sampling (the spot check's; status).
    margins: spot::EarnedMargins,
}

/// Producers whose trained groups [`Shared::count_trained`] keeps at most (then it starts
/// over: a count is a report, not an input to any decision).
const MAX_TRAINED_PRODUCERS: usize = 4096;

impl Shared {
    /// Counts one trained group of each producer named.
    fn count_trained<'a>(&self, producers: impl Iterator<Item = &'a str>) {
        let mut t = self.trained.lock().unwrap_or_else(|p| p.into_inner());
        for p in producers {
            if !t.contains_key(p) && t.len() >= MAX_TRAINED_PRODUCERS {
                t.clear();
            }
            *t.entry(p.to_string()).or_default() += 1;
        }
    }

    fn trained_by_producer(&self) -> std::collections::HashMap<String, u64> {
        self.trained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A snapshot waiting to be published: version, payload and its manifest kind (full, or a
/// LoRA run's adapters; the publisher turns full payloads into deltas when configured).
type Snapshot = Option<(u64, bytes::Bytes, storage::PayloadKind)>;

/// The running learner role.
pub struct LearnerRole {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    tasks: super::Tasks,
    finished: tokio::sync::oneshot::Receiver<()>,
}

impl LearnerRole {
    /// Heartbeat probe: the newest published version; a learner generates nothing (μ = 0).
    pub fn probe(&self) -> Probe {
        let s = self.shared.clone();
        Arc::new(move || (s.publish.published(), 0.0))
    }

    /// Every publication (the probe's version).
    pub fn version_changes(&self) -> super::VersionChanges {
        super::VersionChanges::Version(self.shared.publish.subscribe())
    }

    /// Resolves when the training thread ends on its own (an error).
    pub async fn failed(&mut self) {
        let _ = (&mut self.finished).await;
    }

    /// Stops training (checkpointing first), the puller and the publisher.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shared.stop.cancel();
        let thread = self.thread.take();
        let r = tokio::task::spawn_blocking(move || match thread {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the training thread panicked"))?,
            None => Ok(()),
        })
        .await
        .context("joining the training thread")?;
        self.tasks.stop().await;
        r
    }
}

/// Builds (or restores) the trainer and starts the learner's activities.
pub async fn start(
    state: Arc<NodeState>,
    client: p2p::Client,
    dissem: Disseminator,
    view: RoleView,
) -> anyhow::Result<LearnerRole> {
    let st = state.clone();
    let (trainer, weights_version) = tokio::task::spawn_blocking(move || restore_or_init(&st))
        .await
        .context("joining trainer initialisation")??;
    let window = trainer.config().window();
    tracing::info!(
        staleness = window.staleness,
        kappa = trainer.config().kappa(),
        version = trainer.version(),
        "learner window"
    );
    let dtypes = spot::WorkerDtypes::default();
    let margins = spot::EarnedMargins::default();
    let pipeline = Arc::new(build_pipeline(&state, &trainer, &dtypes, &margins)?);
    tracing::info!(stages = ?pipeline.stage_names(), probation = ?pipeline.probation(), "verification of pulled groups");
    // A child's receipts convict its parent of silence only once the child is established
    // (past probation on verified work); a fresh one's wait for the learner's own probe
    // (`control::forwarding::sentence`).
    let p = pipeline.clone();
    dissem.set_established(move |peer| !p.on_probation(&peer.to_base58()));
    let shared = new_shared(&state, pipeline.clone(), window, trainer.version(), margins);
    let (snap_tx, snap_rx) = watch::channel::<Snapshot>(None);
    let config_hash = trainer.policy().config().hash();
    let tasks = super::Tasks::default();
    spawn_scheduler(&tasks, &shared, &client, &dissem);
    let b = &state.config.broadcast;
    // A LoRA run ships its adapters whole: deltas of adapters do not pay
    // (`docs/broadcast.md`, "Adapter snapshots").
    let adapters = shipping(&state.config, &trainer)?;
    if adapters.is_some() && b.delta_enabled() {
        tracing::info!(
            "a LoRA run publishes adapter versions whole: [broadcast] delta does not apply"
        );
    }
    let dissem_for_pulls = dissem.clone();
    tasks.spawn(publisher::run(
        dissem,
        client.clone(),
        config_hash,
        snap_rx,
        shared.clone(),
        (b.delta_enabled() && adapters.is_none()).then_some(b.keyframe_every),
    ));
    tasks.spawn(puller::run(
        client.clone(),
        dissem_for_pulls,
        state.trajectories.clone(),
        shared.clone(),
        puller::PullSettings::of(&state.config, &state.key.verifying_key().to_bytes())
            .with_dtypes(dtypes),
    ));
    let (done_tx, finished) = tokio::sync::oneshot::channel();
    let exact = envs::Evaluator::for_learner(&state.config, trainer.config().temperature)
        .context("building the exact evaluator")?;
    let ctx = ctx::TrainCtx {
        trainer,
        weights_version,
        buffer: state.trajectories.clone(),
        shared: shared.clone(),
        snap_tx,
        view,
        cfg: state.config.learner.clone(),
        snapshot_dtype: state.config.broadcast.dtype.dtype(),
        adapters,
        caps: state.config.admission.caps(),
        admission: state.config.admission.clone(),
        rewards_recomputed: state.config.verification.recompute_rewards,
        is_banned: {
            // The group names its producer as text: compared with the banned peers' ids
            // written out, never parsed back.
            Box::new(move |producer: &str| {
                client
                    .banned_peers()
                    .iter()
                    .any(|p| p.to_string() == producer)
            })
        },
        ckpt_dir: state.config.checkpoint_dir(),
        steps_log: state.config.data_dir.join("metrics").join("steps.jsonl"),
        exact,
    };
    let thread = std::thread::Builder::new()
        .name("learner".into())
        .spawn(move || {
            let r = train::run(ctx);
            if let Err(e) = &r {
                tracing::error!(error = %format!("{e:#}"), "the learner stopped");
            }
            let _ = done_tx.send(());
            r
        })
        .context("spawning the training thread")?;
    Ok(LearnerRole {
        shared,
        thread: Some(thread),
        tasks,
        finished,
    })
}

/// The state the learner's tasks share, at trained version `version`.
fn new_shared(
    state: &NodeState,
    pipeline: Arc<Pipeline>,
    window: Window,
    version: u64,
    margins: spot::EarnedMargins,
) -> Arc<Shared> {
    Arc::new(Shared {
        margins,
        pipeline,
        established_active: AtomicUsize::new(0),
        trained: Mutex::new(std::collections::HashMap::new()),
        // Only an external program can fail in the middle of an episode.
        commits: commits::Commitments::new(match state.config.task.kind {
            crate::config::TaskKind::External => control::commits::Abandoning::UpTo {
                fraction: control::commits::MAX_ABANDONED_FRACTION,
            },
            crate::config::TaskKind::Builtin => control::commits::Abandoning::Never,
        }),
        stop: tokio_util::sync::CancellationToken::new(),
        window,
        version: TrainerVersion::new(version),
        pruned: AtomicU64::new(0),
        publish: publisher::PublishStats::default(),
        pulls: puller::PullStats::default(),
        mu_target_milli: AtomicU64::new(NONE),
        pull_wake: tokio::sync::Notify::new(),
        scheduler: state.config.scheduler.enabled.then(|| {
            Arc::new(Mutex::new(super::scheduler::State::new(
                state.config.scheduler.clone(),
            )))
        }),
    })
}

/// The activation scheduler (`[scheduler] enabled`), fed the throughput target μ* the
/// training loop last computed.
fn spawn_scheduler(
    tasks: &super::Tasks,
    shared: &Arc<Shared>,
    client: &p2p::Client,
    dissem: &Disseminator,
) {
    if let Some(sched) = shared.scheduler.clone() {
        let s = shared.clone();
        tasks.spawn(super::scheduler::run(
            client.clone(),
            dissem.clone(),
            sched,
            {
                let s = s.clone();
                move || {
                    let m = s.mu_target_milli.load(Ordering::Relaxed);
                    (m != NONE).then(|| m as f64 / 1000.0)
                }
            },
            move || s.pulls.verified_mu(),
        ));
    }
}

/// How a LoRA learner ships its versions (`None` for full fine-tuning): its frozen base's
/// identity, and version 0 as the base's full payload when the base was warm-started here.
fn shipping(
    config: &crate::config::NodeConfig,
    trainer: &Trainer,
) -> anyhow::Result<Option<super::adapter::Shipping>> {
    if trainer.policy().lora().is_none() {
        return Ok(None);
    }
    let s = super::adapter::Shipping::of(trainer.policy(), config.learner.warm_start_steps > 0)?;
    tracing::info!(
        base = %hex::encode(s.base_hash),
        base_version = ?s.base_version,
        "publishing adapter versions on this base"
    );
    Ok(Some(s))
}

/// The one verification pipeline of this learner: the stages `[verification]` switches on,
/// structure checked against the model's limits, and the log-prob spot check last (the only
/// stage that runs the model, so it sees only groups every cheaper stage passed), judging each
/// worker by the sampling dtype `dtypes` reports for it.
fn build_pipeline(
    state: &NodeState,
    trainer: &Trainer,
    dtypes: &spot::WorkerDtypes,
    margins: &spot::EarnedMargins,
) -> anyhow::Result<Pipeline> {
    let limits = puller::group_limits(&state.config);
    let key = state.key.verifying_key().to_bytes();
    let mut pipeline = verify::pipeline_for_learner(&state.config, &key, limits)
        .context("building the learner's verification stages")?;
    let v = &state.config.verification;
    if v.spot_check_fraction > 0.0 || v.spot_check_first_groups > 0 {
        pipeline = pipeline.with_stage(
            spot::SpotChecker::new(
                spot::SpotSettings {
                    tolerance: learner::verdict::ByDtype {
                        f32: v.logprob_tolerance.f32 as f32,
                        f16: v.logprob_tolerance.f16 as f32,
                        bf16: v.logprob_tolerance.bf16 as f32,
                    },
                    margin: learner::verdict::ByDtype {
                        f32: v.sampling_margin.f32,
                        f16: v.sampling_margin.f16,
                        bf16: v.sampling_margin.bf16,
                    },
                    temperature: trainer.config().temperature,
                    top_p: state.config.learner.top_p,
                    // Episodes too: a worker draws sample k's j-th sampled token (across
                    // turns) from row k's uniform j, and the mask the learner derives by
                    // replay marks exactly those tokens (`verdict::check_group`).
                    check_sampling: v.check_sampling,
                    seed: tasks::assign::assignment_seed(&state.config.swarm_id, &key),
                    ..Default::default()
                },
                state.chunks.clone(),
                trainer.policy().config().clone(),
                state.device.clone(),
            )
            .context("building the log-prob spot checker")?
            .with_worker_dtypes(dtypes.clone())
            .with_earned_margins(margins.clone())
            .with_mask_rule(super::mask_rule(&state.config)?)
            .with_adapter_base(
                trainer
                    .policy()
                    .lora()
                    .map(|_| trainer.policy().base_view())
                    .transpose()?,
            ),
        );
    }
    Ok(pipeline)
}

/// Keeps the last `cap` values.
fn push_recent<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    q.push_back(v);
    while q.len() > cap {
        q.pop_front();
    }
}

/// The median of `xs` (upper median for even lengths), `None` when empty.
fn median(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = xs.into_iter().collect();
    quantile(&v, 0.5)
}

/// The `q`-quantile of `xs` (the value at index ⌊q·n⌋ of the sorted values, clamped to the
/// last), `None` when empty.
fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64) as usize).min(v.len().checked_sub(1)?);
    v.get(i).copied()
}

#[cfg(test)]
mod quantile_tests {
    use super::{median, quantile};

    #[test]
    fn quantiles_index_the_sorted_values() {
        let xs = [0.4, 0.1, 0.3, 0.2, 1.0];
        assert_eq!(median(xs), Some(0.3));
        assert_eq!(quantile(&xs, 0.9), Some(1.0));
        assert_eq!(quantile(&xs, 0.0), Some(0.1));
        assert_eq!(median([0.1, 0.2]), Some(0.2), "upper median");
        assert_eq!(quantile(&[], 0.9), None);
    }
}
