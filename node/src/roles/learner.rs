//! The learner role (ECHO-2 Algorithm 1 over the network, SPEC §8).
//!
//! Three activities share one [`Shared`] state:
//! - the **training thread** owns the [`Trainer`]: it leases B admissible groups
//!   (`v_τ ≥ v − S`) from the node's own trajectory buffer, acks them, trains one step,
//!   hands every κ-th snapshot to the publisher, checkpoints every N steps and at shutdown,
//!   and appends one JSON line per step to `<data_dir>/metrics/steps.jsonl`;
//! - the **publisher** task hands the newest snapshot to the dissemination engine; it never
//!   blocks training (a snapshot superseded before it was published is skipped);
//! - the **puller** task keeps the buffer topped up: it leases groups from the rollout workers
//!   with the pull protocol, in proportion to what their heartbeats say they hold.
//!
//! ## Exactly once across crashes
//! The buffer lease is **acked before** the step trains (the ack deletes the groups durably),
//! and the trainer refuses any trajectory id it has consumed (checkpointed). A learner killed
//! mid-step therefore loses at most that step's groups and never trains a group twice. On
//! restart the trainer resumes from its last checkpoint; its version is moved past every
//! snapshot it ever published (the manifests in its chunk store), so versions keep growing
//! and workers accept the next snapshot.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use dissemination::Disseminator;
use learner::{StepStats, Trainer, Verdict};
use serde_json::json;
use storage::TrajectoryStore;
use tokio::sync::watch;

use super::{build_model, build_task, Probe, RoleView};
use crate::commands::run::NodeState;
use crate::config::{LearnerConfig, Mode};

const NONE: u64 = u64::MAX;
/// One pull from one worker gives up after this long (its lease on the worker expires).
const PULL_TIMEOUT: Duration = Duration::from_secs(10);
/// A buffer lease the training thread does not ack within this time returns to the buffer.
const BUFFER_LEASE_TTL: Duration = Duration::from_secs(120);

/// Counters shared by the training thread, the publisher, the puller and `/status`.
struct Shared {
    stop: AtomicBool,
    version: AtomicU64,
    published: AtomicU64,
    snapshots: AtomicU64,
    groups_pulled: AtomicU64,
    pull_errors: AtomicU64,
    /// Buffered groups deleted because they fell out of the window.
    pruned: AtomicU64,
    /// Sum of the μ the workers reported in their last heartbeats (μ_pool).
    mu_pool_milli: AtomicU64,
    /// Published versions whose T_bcast is still being measured, with their publish time.
    in_flight: Mutex<Vec<(u64, Instant)>>,
    /// The last [`RECENT_BCAST`] T_bcast measurements (seconds).
    t_bcast: Mutex<VecDeque<f64>>,
    /// μ_target = γ·μ_min in milli-groups/s ([`NONE`] while unknown), for the scheduler.
    mu_target_milli: AtomicU64,
    /// The scheduler's state (when `scheduler.enabled`).
    scheduler: Option<Arc<Mutex<super::scheduler::State>>>,
    /// Wakes the puller between its ticks: the training thread took a batch out of the buffer,
    /// or found none to take. Waiting for the next tick instead left the learner idle for up
    /// to `pull_interval_ms` after each version bump had expired part of the buffer.
    pull_wake: tokio::sync::Notify,
}

/// T_bcast samples kept for the median.
const RECENT_BCAST: usize = 16;
/// γ of SPEC §10: μ_target = γ·μ_min, and T_bcast ends when a fraction q = 1/γ of the active
/// workers has installed the snapshot (SPEC §6).
const GAMMA: f64 = 1.1;

impl Shared {
    fn t_bcast_median(&self) -> Option<f64> {
        let v: Vec<f64> = self.t_bcast.lock().ok()?.iter().copied().collect();
        median(&v)
    }
}

/// T_bcast of a snapshot is over once `⌈q·n⌉` of the `n` active workers report (heartbeat
/// install reports) a version at least as new, q = 1/γ. With no worker it is not defined.
pub fn broadcast_done(installed: &[Option<u64>], version: u64) -> bool {
    let n = installed.len();
    if n == 0 {
        return false;
    }
    let need = ((n as f64) / GAMMA).ceil() as usize;
    installed
        .iter()
        .filter(|v| v.is_some_and(|v| v >= version))
        .count()
        >= need.max(1)
}

/// A snapshot waiting to be published.
type Snapshot = Option<(u64, bytes::Bytes)>;

/// The running learner role.
pub struct LearnerRole {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    finished: tokio::sync::oneshot::Receiver<()>,
}

impl LearnerRole {
    /// Heartbeat probe: the newest published version; a learner generates nothing (μ = 0).
    pub fn probe(&self) -> Probe {
        let s = self.shared.clone();
        Arc::new(move || {
            let p = s.published.load(Ordering::Relaxed);
            ((p != NONE).then_some(p), 0.0)
        })
    }

    /// Resolves when the training thread ends on its own (an error).
    pub async fn failed(&mut self) {
        let _ = (&mut self.finished).await;
    }

    /// Stops training (checkpointing first), the puller and the publisher.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shared.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take();
        let r = tokio::task::spawn_blocking(move || match thread {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the training thread panicked"))?,
            None => Ok(()),
        })
        .await
        .context("joining the training thread")?;
        for t in &self.tasks {
            t.abort();
        }
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
    let cfg = state.config.learner.clone();
    let st = state.clone();
    let trainer = tokio::task::spawn_blocking(move || restore_or_init(&st))
        .await
        .context("joining trainer initialisation")??;
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        version: AtomicU64::new(trainer.version()),
        published: AtomicU64::new(NONE),
        snapshots: AtomicU64::new(0),
        groups_pulled: AtomicU64::new(0),
        pull_errors: AtomicU64::new(0),
        pruned: AtomicU64::new(0),
        mu_pool_milli: AtomicU64::new(0),
        in_flight: Mutex::new(Vec::new()),
        t_bcast: Mutex::new(VecDeque::new()),
        mu_target_milli: AtomicU64::new(NONE),
        pull_wake: tokio::sync::Notify::new(),
        scheduler: state.config.scheduler.enabled.then(|| {
            Arc::new(Mutex::new(super::scheduler::State::new(
                state.config.scheduler.clone(),
            )))
        }),
    });
    let (snap_tx, snap_rx) = watch::channel::<Snapshot>(None);
    let config_hash = trainer.policy().config().hash();
    let mut tasks = Vec::new();
    if let Some(sched) = shared.scheduler.clone() {
        let s = shared.clone();
        tasks.push(tokio::spawn(super::scheduler::run(
            client.clone(),
            dissem.clone(),
            sched,
            move || {
                let m = s.mu_target_milli.load(Ordering::Relaxed);
                (m != NONE).then(|| m as f64 / 1000.0)
            },
        )));
    }
    tasks.extend([
        tokio::spawn(publisher(dissem, config_hash, snap_rx, shared.clone())),
        tokio::spawn(puller(
            client,
            state.trajectories.clone(),
            shared.clone(),
            cfg.clone(),
            state.config.storage.lease_ttl_s,
        )),
    ]);
    let (done_tx, finished) = tokio::sync::oneshot::channel();
    let ctx = TrainCtx {
        trainer,
        buffer: state.trajectories.clone(),
        shared: shared.clone(),
        snap_tx,
        view: view.clone(),
        cfg,
        ckpt_dir: state.config.checkpoint_dir(),
        steps_log: state.config.data_dir.join("metrics").join("steps.jsonl"),
    };
    let thread = std::thread::Builder::new()
        .name("learner".into())
        .spawn(move || {
            let r = train_loop(ctx);
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

/// The last checkpoint, or a fresh model (warm-started on the task when configured).
fn restore_or_init(state: &NodeState) -> anyhow::Result<Trainer> {
    let config = &state.config;
    let ckpt = config.checkpoint_dir();
    let mut trainer = if ckpt.join("LATEST").exists() {
        let t = Trainer::load(&ckpt, &policy::Device::Cpu)
            .with_context(|| format!("restoring the checkpoint in {}", ckpt.display()))?;
        tracing::info!(version = t.version(), dir = %ckpt.display(), "resumed from checkpoint");
        t
    } else {
        let (policy, tokenizer) = build_model(config)?;
        if config.learner.warm_start_steps > 0 {
            let task = build_task(config)?;
            let t0 = Instant::now();
            let w = learner::warm_start_on_task(
                &policy,
                &tokenizer,
                task.as_ref(),
                config.learner.warm_start_steps,
                config.model.seed,
            )
            .context("supervised warm start")?;
            tracing::info!(
                steps = w.steps,
                examples = w.examples,
                loss_first = w.loss_first,
                loss_last = w.loss_last,
                secs = t0.elapsed().as_secs_f64(),
                "warm start done"
            );
        }
        Trainer::new(policy, config.learner.trainer_config()?).context("creating the trainer")?
    };
    // Versions only move forward: skip past every snapshot this learner already published
    // (a crash after a publish but before the next checkpoint).
    let published = state.chunks.versions()?.into_iter().max();
    if let Some(p) = published {
        if p > trainer.version() {
            tracing::warn!(
                checkpoint = trainer.version(),
                published = p,
                "the checkpoint is older than the last published snapshot: continuing at its version"
            );
            trainer.advance_version_to(p);
        }
    }
    // Buffer leases of a previous run are void (only this thread leases the buffer).
    for l in state.trajectories.leases()? {
        state.trajectories.release(l.id)?;
    }
    Ok(trainer)
}

struct TrainCtx {
    trainer: Trainer,
    buffer: Arc<TrajectoryStore>,
    shared: Arc<Shared>,
    snap_tx: watch::Sender<Snapshot>,
    view: RoleView,
    cfg: LearnerConfig,
    ckpt_dir: PathBuf,
    steps_log: PathBuf,
}

/// Running totals behind the `/status` learner section.
#[derive(Default)]
struct Totals {
    steps: u64,
    idle_s: f64,
    train_s: f64,
    recent_train_s: Vec<f64>,
    staleness: BTreeMap<u64, u64>,
    staleness_max: u64,
    dropped_stale: u64,
    dropped_zero: u64,
    dropped_other: u64,
    reward_first: Option<f64>,
    /// Rewards of the last [`RECENT`] steps.
    recent_rewards: std::collections::VecDeque<f64>,
}

/// Steps averaged in the status' `reward_recent`.
const RECENT: usize = 20;

fn train_loop(mut c: TrainCtx) -> anyhow::Result<()> {
    let t_start = Instant::now();
    let b = c.cfg.groups_per_step;
    let kappa = c.trainer.config().kappa();
    let mut log = open_log(&c.steps_log)?;
    let mut totals = Totals::default();
    let mut last: Option<(StepStats, f64)> = None;
    publish(&c.trainer, &c.snap_tx)?;
    let stop = || c.shared.stop.load(Ordering::Relaxed);
    'outer: while !stop() {
        if c.cfg.max_steps > 0 && c.trainer.version() >= c.cfg.max_steps {
            update_view(&c, &totals, last.as_ref(), true);
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        // Gather B admissible groups; the wait is the learner's idle time (the bubble).
        let t_wait = Instant::now();
        let floor = c.trainer.lease_floor();
        let pruned = c.buffer.prune_below(floor)?;
        c.shared.pruned.fetch_add(pruned, Ordering::Relaxed);
        let (mut hand, mut leases) = (Vec::with_capacity(b), Vec::new());
        let mut held_since = Instant::now();
        let mut viewed = Instant::now();
        let mut starved = false;
        while hand.len() < b {
            // Never let a partial batch's leases expire while waiting for the rest: give them
            // back and start over (the groups stay in the buffer).
            if stop() || held_since.elapsed() > BUFFER_LEASE_TTL / 2 {
                for id in leases.drain(..) {
                    c.buffer.release(id)?;
                }
                hand.clear();
                held_since = Instant::now();
                if stop() {
                    break 'outer;
                }
            }
            // Freshest first: with more admissible groups than a step uses, the oldest age out
            // instead of every group aging towards the staleness limit (docs/learner.md).
            match c
                .buffer
                .lease_newest(floor, b - hand.len(), BUFFER_LEASE_TTL)?
            {
                Some(l) => {
                    leases.push(l.id);
                    hand.extend(l.groups.into_iter().map(|(_, g)| g));
                }
                None => {
                    // Starved: ask the puller for more now, and keep `/status` live while
                    // waiting.
                    if !starved {
                        c.shared.pull_wake.notify_one();
                        starved = true;
                    }
                    if viewed.elapsed() > Duration::from_secs(1) {
                        update_view(&c, &totals, last.as_ref(), false);
                        viewed = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(5))
                }
            }
        }
        let idle = t_wait.elapsed().as_secs_f64();
        // Ack first: the groups leave the buffer durably before they are trained, so a crash
        // during the step can lose them but never train them twice.
        for id in leases {
            c.buffer.ack(id).context("acking a buffer lease")?;
        }
        c.shared.pull_wake.notify_one();
        let trained: Vec<String> = hand
            .iter()
            .filter(|g| c.trainer.classify(g) == Verdict::Admitted)
            .map(|g| hex::encode(g.group_id))
            .collect();
        let st = c.trainer.train_step(&hand)?;
        totals.idle_s += idle;
        totals.dropped_stale += st.groups_stale as u64;
        totals.dropped_zero += st.groups_zero_advantage as u64;
        totals.dropped_other += (st.groups_future + st.groups_duplicate + st.groups_invalid) as u64;
        if !st.stepped {
            continue;
        }
        c.shared.version.store(st.version, Ordering::Relaxed);
        totals.steps += 1;
        totals.train_s += st.t_train_s;
        totals.recent_train_s.push(st.t_train_s);
        if totals.recent_train_s.len() > 32 {
            totals.recent_train_s.remove(0);
        }
        for (d, n) in &st.staleness_histogram {
            *totals.staleness.entry(*d).or_default() += n;
        }
        totals.staleness_max = totals.staleness_max.max(st.staleness_max);
        totals.reward_first.get_or_insert(st.reward_mean);
        totals.recent_rewards.push_back(st.reward_mean);
        if totals.recent_rewards.len() > RECENT {
            totals.recent_rewards.pop_front();
        }
        let published = if c.trainer.should_publish() {
            publish(&c.trainer, &c.snap_tx)?;
            true
        } else {
            false
        };
        if st.version % c.cfg.checkpoint_every == 0 {
            c.trainer.save(&c.ckpt_dir).context("checkpoint")?;
        }
        let line = json!({
            "step": st.version, "t": t_start.elapsed().as_secs_f64(), "idle_s": idle,
            "bubble": idle / (idle + st.t_train_s), "kappa": kappa, "published": published,
            "trained_groups": trained, "stats": st,
        });
        writeln!(log, "{line}").context("writing steps.jsonl")?;
        log.flush()?;
        last = Some((st, idle));
        update_view(&c, &totals, last.as_ref(), false);
    }
    let dir = c.trainer.save(&c.ckpt_dir).context("final checkpoint")?;
    tracing::info!(version = c.trainer.version(), dir = %dir.display(), "checkpoint written");
    Ok(())
}

fn open_log(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

fn publish(trainer: &Trainer, tx: &watch::Sender<Snapshot>) -> anyhow::Result<()> {
    let bytes = trainer
        .snapshot_bytes()
        .context("serialising the snapshot")?;
    tx.send_replace(Some((trainer.version(), bytes::Bytes::from(bytes))));
    Ok(())
}

fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn update_view(c: &TrainCtx, t: &Totals, last: Option<&(StepStats, f64)>, finished: bool) {
    let cfg = c.trainer.config();
    let busy = t.idle_s + t.train_s;
    let s = &c.shared;
    let published = s.published.load(Ordering::Relaxed);
    // SPEC §10 / ECHO-2 eq. 2, 7, 12 with the online medians (groups as the unit: R = B).
    let t_bcast = s.t_bcast_median();
    let t_train = median(&t.recent_train_s);
    let mu_pool = s.mu_pool_milli.load(Ordering::Relaxed) as f64 / 1000.0;
    let kappa = cfg.kappa() as u32;
    let b = cfg.groups_per_step as f64;
    let (mut mu_min, mut infeasible, mut delta_bound, mut delta_bound_overlap) =
        (None, false, None, None);
    if let (Some(tt), Some(tb)) = (t_train, t_bcast) {
        match control::capacity::mu_min(kappa, b, tt, tb) {
            control::capacity::Requirement::Feasible { mu_min: m } => mu_min = Some(m),
            control::capacity::Requirement::Infeasible { .. } => infeasible = true,
        }
        delta_bound = control::capacity::delta_max_conservative(kappa, tb, b, mu_pool, tt);
        delta_bound_overlap = control::capacity::delta_max_under_overlap(kappa, tb, tt);
    }
    let mu_target = mu_min.map(|m| GAMMA * m);
    s.mu_target_milli.store(
        mu_target.map_or(NONE, |m| (m * 1000.0) as u64),
        Ordering::Relaxed,
    );
    let scheduler = s
        .scheduler
        .as_ref()
        .and_then(|st| {
            st.lock()
                .ok()
                .and_then(|st| st.view.lock().ok().map(|v| v.clone()))
        })
        .unwrap_or_else(|| json!({"enabled": false}));
    let last_step = last.map(|(st, idle)| json!({
                "reward_mean": st.reward_mean, "reward_std": st.reward_std, "loss": st.loss,
                "kl_sampler_learner": st.kl_sampler_learner,
                "importance_weight_variance": st.importance_weight_variance,
                "grad_norm": st.grad_norm, "zero_advantage_fraction": st.zero_advantage_fraction,
                "t_train_s": st.t_train_s, "idle_s": idle, "staleness_max": st.staleness_max,
    }));
    c.view.set(
        "learner",
        json!({
            "version": c.trainer.version(),
            "mode": match c.cfg.mode { Mode::Async => "async", Mode::Sequential => "sequential" },
            "objective": c.cfg.objective,
            "staleness": cfg.staleness,
            "kappa": cfg.kappa(),
            "groups_per_step": cfg.groups_per_step,
            "steps": t.steps,
            "finished": finished,
            "bubble_ratio": if busy > 0.0 { t.idle_s / busy } else { 0.0 },
            "idle_s": t.idle_s,
            "train_s": t.train_s,
            "t_train_s": t_train,
            "t_bcast_s": t_bcast,
            "t_bcast_samples": s.t_bcast.lock().map(|t| t.len()).unwrap_or(0),
            "mu_pool": mu_pool,
            "mu_min": mu_min,
            "mu_target": mu_target,
            "scheduler": scheduler,
            "mu_units": "groups/s",
            "capacity_infeasible": infeasible,
            "delta_max_bound": delta_bound,
            "delta_max_bound_under_overlap": delta_bound_overlap,
            "published_version": (published != NONE).then_some(published),
            "snapshots_published": s.snapshots.load(Ordering::Relaxed),
            "groups_pulled": s.groups_pulled.load(Ordering::Relaxed),
            "pull_errors": s.pull_errors.load(Ordering::Relaxed),
            "buffer_pending": c.buffer.pending().ok(),
            "groups_dropped_stale": t.dropped_stale,
            "groups_dropped_zero_advantage": t.dropped_zero,
            "groups_dropped_other": t.dropped_other,
            "groups_pruned": s.pruned.load(Ordering::Relaxed),
            "staleness_histogram": t.staleness,
            "staleness_max": t.staleness_max,
            "reward_first": t.reward_first,
            "reward_recent": (!t.recent_rewards.is_empty())
                .then(|| t.recent_rewards.iter().sum::<f64>() / t.recent_rewards.len() as f64),
            "last_step": last_step,
        }),
    );
}

/// Publishes the newest snapshot handed over by the training thread.
async fn publisher(
    dissem: Disseminator,
    config_hash: [u8; 32],
    mut rx: watch::Receiver<Snapshot>,
    shared: Arc<Shared>,
) {
    let mut published = None::<u64>;
    while rx.changed().await.is_ok() {
        let Some((version, bytes)) = rx.borrow_and_update().clone() else {
            continue;
        };
        if published.is_some_and(|p| p >= version) {
            continue;
        }
        let t0 = Instant::now();
        match dissem
            .publish(version, config_hash, bytes.clone(), None)
            .await
        {
            Ok(report) => {
                published = Some(version);
                if let Ok(mut f) = shared.in_flight.lock() {
                    f.push((version, t0));
                    // Versions nobody installs (no workers yet) are not measured forever.
                    let excess = f.len().saturating_sub(RECENT_BCAST);
                    f.drain(..excess);
                }
                shared.published.store(version, Ordering::Relaxed);
                shared.snapshots.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("learner_snapshots_published_total").increment(1);
                metrics::gauge!("learner_published_version").set(version as f64);
                tracing::info!(
                    version,
                    bytes = bytes.len(),
                    chains = report.plan.plan.chains.len(),
                    secs = t0.elapsed().as_secs_f64(),
                    "snapshot published"
                );
            }
            Err(e) => tracing::warn!(version, error = %e, "publishing the snapshot failed"),
        }
    }
}

/// How many groups to ask each worker for: exactly `need` in total, split in proportion to
/// what each holds (its heartbeat's `pending`, plus one so that a worker whose heartbeat lags
/// still gets a share), by largest remainder. When `need` is smaller than the number of
/// workers, the ones holding most are asked and ties go round-robin from `round`, so that
/// over successive rounds every worker is asked.
///
/// Asking for more than `need` (an earlier version asked every worker for at least one group)
/// over-fills the buffer as the pool grows: with 8 workers and a shortfall of 1, 8 groups came
/// in, the surplus aged past `S` in the buffer (46 % of all pulled groups expired), and the
/// workers never reached `storage.max_pending_groups`, so they kept generating groups nobody
/// would train on — on a shared host, CPU taken from the learner.
pub fn allocate_pulls(need: u64, holdings: &[u64], round: usize) -> Vec<u64> {
    let n = holdings.len();
    if need == 0 || n == 0 {
        return vec![0; n];
    }
    let weights: Vec<u128> = holdings.iter().map(|&h| u128::from(h) + 1).collect();
    let total: u128 = weights.iter().sum();
    let need128 = u128::from(need);
    // Whole shares first; each is at most `need` because w ≤ total.
    let mut out: Vec<u64> = weights
        .iter()
        .map(|w| (need128 * w / total) as u64)
        .collect();
    let left = need - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| {
        let remainder = need128 * weights[i] % total;
        (std::cmp::Reverse(remainder), (i + n - round % n) % n)
    });
    // `left` < n: the whole shares' remainders sum to less than n · total.
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

/// The oldest version the puller counts as buffered at learner version `v`: what is still
/// admissible after the next step. Groups at the current floor are trainable in this step at
/// most, and a buffer full of them empties at once when it ends — the learner then idled
/// until the next pull round. With S = 0 nothing survives a step, so the floor itself.
pub fn buffered_from(v: u64, staleness: u64) -> u64 {
    if staleness == 0 {
        v
    } else {
        learner::lease_floor(v + 1, staleness)
    }
}

/// Ends the T_bcast measurement of every in-flight version the workers have installed.
fn measure_broadcasts(shared: &Shared, installed: &[Option<u64>]) {
    let Ok(mut in_flight) = shared.in_flight.lock() else {
        return;
    };
    in_flight.retain(|(v, at)| {
        if !broadcast_done(installed, *v) {
            return true;
        }
        let secs = at.elapsed().as_secs_f64();
        metrics::histogram!("learner_t_bcast_seconds").record(secs);
        tracing::debug!(version = v, secs, "snapshot broadcast complete");
        if let Ok(mut t) = shared.t_bcast.lock() {
            t.push_back(secs);
            if t.len() > RECENT_BCAST {
                t.pop_front();
            }
        }
        false
    });
}

/// Keeps the buffer topped up from the rollout workers. Every `pull_interval_ms`, and whenever
/// the training thread takes a batch or finds none, it tops the buffer up to its target: the
/// shortfall (counting only groups still admissible after the next step), less what pulls
/// still in flight asked for, split over the workers with no pull in flight. Pulls run
/// concurrently and independently — a worker that is slow to answer (installing a snapshot,
/// overloaded) holds back only its own share, not the next round of pulls from the others.
async fn puller(
    client: p2p::Client,
    buffer: Arc<TrajectoryStore>,
    shared: Arc<Shared>,
    cfg: LearnerConfig,
    lease_ttl_s: u64,
) {
    use futures::stream::{FuturesUnordered, StreamExt};
    let target = cfg.buffer_target();
    let staleness = cfg.trainer_config().map(|c| c.staleness).unwrap_or(0);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.pull_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    // Peers with a pull in flight, and how many groups those pulls asked for in total.
    let mut busy = std::collections::HashSet::new();
    let mut asked = 0u64;
    let mut round = 0usize;
    loop {
        type Done = (p2p::PeerId, u64, Result<pull::PullOutcome, pull::PullError>);
        let done: Option<Done> = tokio::select! {
            _ = tick.tick() => None,
            _ = shared.pull_wake.notified() => None,
            Some(d) = in_flight.next(), if !in_flight.is_empty() => Some(d),
        };
        if let Some((peer, max_groups, r)) = done {
            busy.remove(&peer);
            asked -= max_groups;
            match r {
                Ok(out) => {
                    shared
                        .groups_pulled
                        .fetch_add(out.stored as u64, Ordering::Relaxed);
                    if out.invalid > 0 {
                        tracing::warn!(%peer, invalid = out.invalid, "worker sent invalid groups");
                    }
                }
                Err(e) => {
                    shared.pull_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, error = %e, "pull failed");
                }
            }
            continue;
        }
        let Ok(net) = client.status().await else {
            return;
        };
        let workers: Vec<(p2p::PeerId, u64, f64)> = net
            .peers
            .iter()
            .filter(|p| p.connected && p.role.as_deref() == Some("rollout"))
            .filter_map(|p| {
                Some((
                    p.peer_id.parse().ok()?,
                    p.pending.unwrap_or(0),
                    p.mu.unwrap_or(0.0),
                ))
            })
            .collect();
        let mu_pool: f64 = workers.iter().map(|w| w.2).sum();
        let installed: Vec<Option<u64>> = net
            .peers
            .iter()
            .filter(|p| p.connected && p.active && p.role.as_deref() == Some("rollout"))
            .map(|p| p.installed_version)
            .collect();
        measure_broadcasts(&shared, &installed);
        shared
            .mu_pool_milli
            .store((mu_pool * 1000.0) as u64, Ordering::Relaxed);
        // Only groups still admissible after the next step count as buffered; those that fell
        // out of the window are deleted by the training thread before each batch.
        let version = shared.version.load(Ordering::Relaxed);
        let v_min = learner::lease_floor(version, staleness);
        let pending = buffer
            .pending_from(buffered_from(version, staleness))
            .unwrap_or(target);
        let need = target.saturating_sub(pending).saturating_sub(asked);
        let idle: Vec<&(p2p::PeerId, u64, f64)> =
            workers.iter().filter(|w| !busy.contains(&w.0)).collect();
        if need == 0 || idle.is_empty() {
            continue;
        }
        let holdings: Vec<u64> = idle.iter().map(|w| w.1).collect();
        round = round.wrapping_add(1);
        let shares = allocate_pulls(need, &holdings, round);
        for (&&(peer, _, _), max_groups) in idle.iter().zip(shares) {
            if max_groups == 0 {
                continue;
            }
            let mut control = client.stream_control();
            let buffer = buffer.clone();
            let req = pull::PullRequest {
                v_min,
                max_groups,
                ttl: Duration::from_secs(lease_ttl_s),
            };
            busy.insert(peer);
            asked += max_groups;
            in_flight.push(async move {
                // A worker that stops answering (stopped, overloaded) is given up on after
                // PULL_TIMEOUT; its share is asked of others meanwhile.
                let r =
                    tokio::time::timeout(PULL_TIMEOUT, pull::pull(&mut control, peer, buffer, req))
                        .await;
                (
                    peer,
                    max_groups,
                    r.unwrap_or_else(|_| Err(pull::PullError::Refused("timed out".into()))),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{allocate_pulls, broadcast_done, buffered_from};

    #[test]
    fn the_buffer_counts_only_groups_that_outlive_the_step() {
        // S = 3 at version 10: the floor is 7, the next step's 8.
        assert_eq!(buffered_from(10, 3), 8);
        // Early on the floor does not move yet.
        assert_eq!(buffered_from(1, 3), 0);
        assert_eq!(buffered_from(2, 3), 0);
        assert_eq!(buffered_from(3, 3), 1);
        // Sequential (S = 0): only the current version is ever admissible.
        assert_eq!(buffered_from(10, 0), 10);
    }

    #[test]
    fn broadcast_ends_when_a_fraction_one_over_gamma_installed() {
        // q = 1/1.1: 10 workers need ⌈9.09⌉ = 10, 11 need 10, 2 need 2, 1 needs 1.
        let mut v = vec![Some(5); 10];
        assert!(broadcast_done(&v, 5));
        v[0] = Some(4);
        assert!(!broadcast_done(&v, 5));
        v.push(Some(6));
        assert!(broadcast_done(&v, 5), "10 of 11 suffice");
        assert!(!broadcast_done(&[Some(5), None], 5));
        assert!(broadcast_done(&[Some(7)], 5), "a newer install counts");
        assert!(!broadcast_done(&[], 0), "undefined without workers");
    }

    #[test]
    fn pulls_follow_holdings_and_never_exceed_the_need() {
        // Weights 11, 5, 1 of 17: whole shares 5, 2, 0; the largest remainder (8/17) gets the
        // last one.
        assert_eq!(allocate_pulls(8, &[10, 4, 0], 0), vec![5, 2, 1]);
        assert_eq!(allocate_pulls(0, &[10, 4], 0), vec![0, 0]);
        assert!(allocate_pulls(5, &[], 0).is_empty());
        assert_eq!(allocate_pulls(2, &[1000], 0), vec![2]);
        // Exactly `need` in total, however many workers and whatever they hold.
        for need in 0..20u64 {
            for holdings in [vec![0; 8], vec![3, 0, 9, 1, 1, 0, 7, 2], vec![u64::MAX, 0]] {
                for round in 0..10 {
                    let shares = allocate_pulls(need, &holdings, round);
                    assert_eq!(shares.iter().sum::<u64>(), need, "{need} {holdings:?}");
                }
            }
        }
        // A shortfall smaller than the pool goes to the workers holding most.
        assert_eq!(allocate_pulls(2, &[0, 9, 0, 5], 0), vec![0, 1, 0, 1]);
    }

    #[test]
    fn equal_workers_take_turns_when_the_need_is_small() {
        // One group a round from 8 idle workers holding the same: 8 rounds ask 8 different
        // workers.
        let mut asked = std::collections::HashSet::new();
        for round in 0..8 {
            let shares = allocate_pulls(1, &[2; 8], round);
            assert_eq!(shares.iter().sum::<u64>(), 1);
            asked.insert(shares.iter().position(|&s| s == 1).unwrap());
        }
        assert_eq!(asked.len(), 8);
    }
}
