//! The training thread: Algorithm 1's loop — gather B admissible groups from the buffer (the
//! wait is the learner's idle time), journal and ack them, train one step, publish every κ
//! steps, checkpoint every N steps and at shutdown, log one JSON line per step.
//!
//! Crash safety: a batch is written to the [`journal`] before it is acked, and the journal is
//! cleared once a checkpoint holding its effect is durable; a restarted learner puts what
//! the journal still holds back into its buffer, so a `kill -9` between checkpoints loses no
//! acknowledged group (it is trained again from the checkpoint's state).
//!
//! Batches are composed under the share quota (`control::admission::compose_batch`): no
//! worker fills more than its share, the workers on probation together no more than theirs.
//! The groups come out of the learner's own buffer, which holds only groups the verification
//! pipeline accepted; they are handed to the trainer as `Verified` (re-wrapped by the
//! pipeline, not checked again).
//!
//! Bad data never ends this thread: groups the trainer could not train (see
//! `learner::Trainer::train_step`) are *quarantined* — kept under `<data_dir>/quarantine/`
//! for inspection, counted, never trained, and their producers handed to
//! [`on_quarantined`] (the hook for the peer penalty). Only a local fault (I/O, memory) or
//! [`MAX_FAILED_STEPS`] failed steps in a row end it, with a message saying which.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use learner::{LearnerError, StepStats, Verdict, Verified};
use serde_json::json;
use storage::TrajectoryGroup;

use super::ctx::{Totals, TrainCtx};
use super::push_recent;
use journal::Journal;

mod journal;

/// A buffer lease the training thread does not ack within this time returns to the buffer.
const BUFFER_LEASE_TTL: Duration = Duration::from_secs(120);
/// Steps averaged in the status' `reward_recent`.
const RECENT_REWARDS: usize = 20;
/// Fully verified groups averaged in the status' `reward_recent_checked`.
pub(super) const RECENT_CHECKED: usize = 64;
/// Steps whose T_train the median is taken over.
const RECENT_STEPS: usize = 32;
/// Consecutive training steps failing with an error (not bad data, which the trainer
/// quarantines without failing) after which the fault is taken to be local and the thread ends.
/// One failure quarantines its batch and training goes on: a batch that broke the step in a
/// way the trainer did not foresee must not stop the node; a fault that breaks every batch
/// must not quarantine the whole swarm's output.
pub(super) const MAX_FAILED_STEPS: u32 = 3;
/// Quarantined groups kept on disk at most; past it they are counted and logged only, so a
/// hostile peer cannot fill the learner's disk.
const MAX_QUARANTINE_FILES: u64 = 1000;

impl Totals {
    fn add(&mut self, st: &StepStats, idle: f64) {
        self.idle_s += idle;
        self.dropped_stale += st.groups_stale as u64;
        self.dropped_zero += st.groups_zero_advantage as u64;
        self.dropped_other += (st.groups_future + st.groups_duplicate + st.groups_invalid) as u64;
        if !st.stepped {
            return;
        }
        self.steps += 1;
        self.train_s += st.t_train_s;
        push_recent(&mut self.recent_train_s, st.t_train_s, RECENT_STEPS);
        for (d, n) in &st.staleness_histogram {
            *self.staleness.entry(*d).or_default() += n;
        }
        self.staleness_max = self.staleness_max.max(st.staleness_max);
        self.reward_first.get_or_insert(st.reward_mean);
        push_recent(&mut self.recent_rewards, st.reward_mean, RECENT_REWARDS);
        crate::api::Curve::push(&mut self.curve.reward, (st.version, st.reward_mean));
    }

    /// The step's point of the run's timeline (`Curve::timeline`).
    fn record_time_point(
        &mut self,
        st: &StepStats,
        idle: f64,
        trained: usize,
        t_bcast_s: Option<f64>,
    ) {
        let busy = self.idle_s + self.train_s;
        let wall = idle + st.t_train_s;
        let point = crate::api::TimePoint {
            unix_ms: storage::unix_ms(),
            step: st.version,
            reward: st.reward_mean,
            bubble: if busy > 0.0 { self.idle_s / busy } else { 0.0 },
            t_bcast_s,
            groups_per_s: if wall > 0.0 {
                trained as f64 / wall
            } else {
                0.0
            },
        };
        crate::api::Curve::push(&mut self.curve.timeline, point);
    }

    /// Evaluates the version just published, if the environment has an exact evaluator.
    fn evaluate(&mut self, c: &TrainCtx) {
        if let Some(e) = &c.exact {
            if let Some(p) = e.evaluate(c.trainer.policy(), c.trainer.version()) {
                self.curve.opponent.get_or_insert_with(|| e.opponent());
                crate::api::Curve::push(&mut self.curve.eval, p);
            }
        }
    }
}

pub(super) fn run(mut c: TrainCtx) -> anyhow::Result<()> {
    let t_start = Instant::now();
    let kappa = c.trainer.config().kappa();
    let mut log = open_log(&c.steps_log)?;
    let mut totals = Totals::default();
    let mut last: Option<(StepStats, f64)> = None;
    let mut failed_steps = 0u32;
    let mut journal = restore_journal(&mut c)?;
    publish(&c)?;
    wait_for_base(&c);
    totals.evaluate(&c);
    while !c.shared.stop.is_cancelled() {
        // Gathering the batch of the trainer's version (a failed step leaves it).
        c.shared.version.gathering(c.trainer.version());
        if c.cfg.max_steps > 0 && c.trainer.version() >= c.cfg.max_steps {
            super::status::update(&c, &totals, last.as_ref(), true);
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        // Gather B admissible groups; the wait is the learner's idle time (the bubble).
        let t_wait = Instant::now();
        let Some((hand, leases)) = gather(&c, &totals, last.as_ref())? else {
            break;
        };
        // A peer banned after its groups were pulled gets none of them trained: they leave
        // the buffer with the batch's leases, untrained and unjournaled.
        let hand = drop_banned(hand, &c, &mut totals);
        // Journal, then ack: the groups leave the buffer durably before they are trained (a
        // crash never trains them twice), and stay in the journal until a checkpoint holds
        // their effect (a crash never loses them).
        if !hand.is_empty() {
            journal
                .record(&hand, c.trainer.version() + 1)
                .context("journaling a batch")?;
        }
        for id in leases {
            c.buffer.ack(id).context("acking a buffer lease")?;
        }
        if hand.is_empty() {
            continue;
        }
        let idle = t_wait.elapsed().as_secs_f64();
        // The batch of this step is taken: from now on the buffer fills for the next one, and
        // a group only this step could use is of no use (sequential mode: every group of the
        // current version). The puller's requests now say so, and workers stop making them.
        c.shared.version.taken(c.trainer.version());
        c.shared.pull_wake.notify_one();
        let batch: Vec<Verified<TrajectoryGroup>> = hand
            .iter()
            .map(|g| c.shared.pipeline.from_own_buffer(g.clone()))
            .collect();
        let admitted: Vec<[u8; 16]> = batch
            .iter()
            .filter(|g| c.trainer.classify(g) == Verdict::Admitted)
            .map(|g| g.group_id)
            .collect();
        let st = match c.trainer.train_step(&batch) {
            Ok(st) => {
                failed_steps = 0;
                st
            }
            Err(e) => {
                failed_steps += 1;
                if let Some(fault) = local_fault(&e, failed_steps) {
                    return Err(anyhow::Error::new(e).context(fault));
                }
                tracing::error!(error = %e, failed_steps, "a training step failed; its batch is quarantined");
                let bad: Vec<_> = hand
                    .iter()
                    .map(|g| (g, format!("training step failed: {e}")))
                    .collect();
                totals.quarantined += quarantine_all(&c, &bad);
                journal.forget_last().context("journal")?;
                continue;
            }
        };
        totals.quarantined += quarantine_refused(&c, &hand, &st);
        let trained: Vec<String> = admitted
            .iter()
            .filter(|id| !st.quarantined.iter().any(|q| q.group_id == **id))
            .map(hex::encode)
            .collect();
        if st.stepped {
            count_trained_producers(&mut totals, &hand, &admitted, &st);
            c.shared.count_trained(
                hand.iter()
                    .filter(|g| {
                        admitted.contains(&g.group_id)
                            && !st.quarantined.iter().any(|q| q.group_id == g.group_id)
                    })
                    .map(|g| g.producer.as_str()),
            );
            record_checked_rewards(&mut totals, &batch, &trained);
        }
        totals.add(&st, idle);
        if st.stepped {
            let t_bcast_s = c.shared.publish.t_bcast().0.map(|e| e.secs);
            totals.record_time_point(&st, idle, trained.len(), t_bcast_s);
        }
        if !st.stepped {
            journal.forget_last().context("journal")?;
            continue;
        }
        c.shared.version.gathering(st.version);
        export_step_metrics(&st, &totals, c.rewards_recomputed);
        let published = c.trainer.should_publish();
        if published {
            publish(&c)?;
            totals.evaluate(&c);
        }
        if st.version % c.cfg.checkpoint_every == 0 {
            c.trainer
                .save_keeping(&c.ckpt_dir, c.cfg.keep_checkpoints)
                .context("checkpoint")?;
            journal.covered().context("clearing the journal")?;
        }
        let line = json!({
            "step": st.version, "t": t_start.elapsed().as_secs_f64(), "idle_s": idle,
            "bubble": idle / (idle + st.t_train_s), "kappa": kappa, "published": published,
            "trained_groups": trained, "stats": st,
        });
        writeln!(log, "{line}").context("writing steps.jsonl")?;
        log.flush()?;
        last = Some((st, idle));
        super::status::update(&c, &totals, last.as_ref(), false);
    }
    let dir = c
        .trainer
        .save_keeping(&c.ckpt_dir, c.cfg.keep_checkpoints)
        .context("final checkpoint")?;
    journal.covered().context("clearing the journal")?;
    tracing::info!(version = c.trainer.version(), dir = %dir.display(), "checkpoint written");
    Ok(())
}

/// The journal of groups acked but not yet in a checkpoint: those a crashed run trained after
/// its last checkpoint go back into the buffer (those of steps the resumed weights hold are
/// marked consumed, never trained twice).
fn restore_journal(c: &mut TrainCtx) -> anyhow::Result<Journal> {
    let mut journal = Journal::open(&journal_dir(&c.ckpt_dir)).context("opening the journal")?;
    let restored = journal
        .restore(&c.buffer, c.weights_version)
        .context("restoring journaled groups")?;
    if restored.returned + restored.in_weights > 0 {
        tracing::warn!(
            restored = restored.returned,
            in_weights = restored.in_weights,
            version = c.trainer.version(),
            "groups trained after the last checkpoint before a crash are back in the buffer \
             (those of steps the resumed weights hold are consumed)"
        );
    }
    c.trainer.mark_consumed(restored.consumed);
    Ok(journal)
}

/// `hand` without the groups of producers banned since they were pulled (counted and logged).
fn drop_banned(
    hand: Vec<TrajectoryGroup>,
    c: &TrainCtx,
    totals: &mut Totals,
) -> Vec<TrajectoryGroup> {
    let (hand, banned) = without_banned(hand, &*c.is_banned);
    if !banned.is_empty() {
        tracing::warn!(
            groups = banned.len(),
            producers = ?banned.iter().map(|g| g.producer.as_str()).collect::<std::collections::BTreeSet<_>>(),
            "groups of banned producers dropped untrained"
        );
        totals.dropped_banned += banned.len() as u64;
        metrics::counter!("learner_groups_dropped_banned_total").increment(banned.len() as u64);
    }
    hand
}

/// Distinct producers given their own metric series: a producer id is a peer's claim, so the
/// label set is bounded.
const MAX_PRODUCER_SERIES: usize = 256;

/// Trained groups remembered by producer for the composition's tie-break: a few dozen
/// batches, so that the extra seats of a batch rotate among the workers offering groups
/// without an old imbalance weighing for long.
pub(super) const RECENT_PRODUCERS: usize = 256;

/// Counts the groups this step trained per producer (`learner_groups_trained_total
/// {producer}`): what the adversarial scenario reads to see whether a banned peer's groups
/// were still trained. Admitted and not quarantined is trained (a zero-advantage group counts
/// too: it was admitted and its ids consumed).
fn count_trained_producers(
    t: &mut Totals,
    hand: &[TrajectoryGroup],
    admitted: &[[u8; 16]],
    st: &StepStats,
) {
    for g in hand.iter().filter(|g| {
        admitted.contains(&g.group_id) && !st.quarantined.iter().any(|q| q.group_id == g.group_id)
    }) {
        let label = if t.producer_series.contains(&g.producer)
            || t.producer_series.len() < MAX_PRODUCER_SERIES
        {
            t.producer_series.insert(g.producer.clone());
            g.producer.clone()
        } else {
            "other".to_string()
        };
        metrics::counter!("learner_groups_trained_total", "producer" => label).increment(1);
        push_recent(
            &mut t.recent_producers,
            g.producer.clone(),
            RECENT_PRODUCERS,
        );
    }
}

/// Keeps the mean rewards of the trained groups that were fully verified (tokens and
/// log-probs checked, rewards recomputed): what `reward_recent_checked` averages.
fn record_checked_rewards(t: &mut Totals, batch: &[Verified<TrajectoryGroup>], trained: &[String]) {
    for g in batch {
        let c = g.checks();
        if c.sampling_checked && c.rewards_recomputed && trained.contains(&hex::encode(g.group_id))
        {
            push_recent(
                &mut t.recent_checked,
                f64::from(g.mean_reward()),
                RECENT_CHECKED,
            );
        }
    }
}

/// Why a failed step must end the training thread, if it must: a local fault (I/O, memory),
/// or [`MAX_FAILED_STEPS`] failures in a row (whatever fails every batch is not the data).
/// `None`: the batch is to blame, quarantine it and go on.
fn local_fault(e: &LearnerError, failed_steps: u32) -> Option<String> {
    if matches!(e, LearnerError::Io(_)) {
        return Some("training stopped: local I/O fault".into());
    }
    if e.is_out_of_memory() {
        return Some("training stopped: out of memory".into());
    }
    (failed_steps >= MAX_FAILED_STEPS).then(|| {
        format!(
            "training stopped: {failed_steps} steps in a row failed on different batches, \
             so the fault is taken to be local (not the data)"
        )
    })
}

/// Quarantines the groups of `hand` the step refused (`st.quarantined`); returns how many.
fn quarantine_refused(c: &TrainCtx, hand: &[TrajectoryGroup], st: &StepStats) -> u64 {
    if st.quarantined.is_empty() {
        return 0;
    }
    let bad: Vec<_> = st
        .quarantined
        .iter()
        .filter_map(|q| {
            let g = hand.iter().find(|g| g.group_id == q.group_id)?;
            Some((g, q.reason.clone()))
        })
        .collect();
    quarantine_all(c, &bad)
}

/// Quarantines `bad` (group, reason) and returns how many; see [`quarantine`].
fn quarantine_all(c: &TrainCtx, bad: &[(&TrajectoryGroup, String)]) -> u64 {
    let dir = quarantine_dir(&c.ckpt_dir);
    let kept = count_kept(&dir);
    for (i, (g, reason)) in bad.iter().enumerate() {
        let id = hex::encode(g.group_id);
        tracing::warn!(group = %id, producer = %g.producer, %reason, "group quarantined, not trained");
        if kept + i as u64 >= MAX_QUARANTINE_FILES {
            tracing::warn!(group = %id, "quarantine full ({MAX_QUARANTINE_FILES} groups): not kept on disk");
            continue;
        }
        if let Err(e) = quarantine(&dir, g, reason) {
            tracing::warn!(group = %id, error = %e, "could not keep a quarantined group on disk");
        }
    }
    metrics::counter!("learner_groups_quarantined_total").increment(bad.len() as u64);
    let producers: Vec<&str> = bad.iter().map(|(g, _)| g.producer.as_str()).collect();
    on_quarantined(&producers);
    bad.len() as u64
}

/// The hook for the penalty of peers whose groups were quarantined (strikes and bans come in a
/// later step); `producers` are the producer ids the groups name — the learner's pull checks
/// that a group's producer is the peer it was pulled from.
fn on_quarantined(producers: &[&str]) {
    for p in producers {
        tracing::info!(producer = %p, "producer of a quarantined group");
    }
}

/// `<data_dir>/journal` ([`journal`]): next to the checkpoint folder.
fn journal_dir(ckpt_dir: &Path) -> PathBuf {
    ckpt_dir.parent().unwrap_or(ckpt_dir).join("journal")
}

/// `<data_dir>/quarantine`: the checkpoint folder is `<data_dir>/checkpoints`.
fn quarantine_dir(ckpt_dir: &Path) -> PathBuf {
    ckpt_dir.parent().unwrap_or(ckpt_dir).join("quarantine")
}

fn count_kept(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
            .count() as u64
    })
}

/// Keeps `g` for inspection: `<dir>/<group id hex>.bin` (the encoded group) and `.json`
/// (producer, reason, time, and the group's identifying fields).
pub(super) fn quarantine(dir: &Path, g: &TrajectoryGroup, reason: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let id = hex::encode(g.group_id);
    std::fs::write(dir.join(format!("{id}.bin")), g.encode())?;
    let now_ms = storage::unix_ms();
    let meta = json!({
        "group_id": id, "producer": g.producer, "reason": reason, "quarantined_unix_ms": now_ms,
        "version": g.version, "task_id": g.task_id, "prompt_id": g.prompt_id,
        "samples": g.samples.len(),
    });
    std::fs::write(dir.join(format!("{id}.json")), format!("{meta:#}\n"))
}

/// Leases B admissible groups from the buffer, freshest first; returns them with their lease
/// ids (the caller journals, then acks them), or `None` when asked to stop first.
fn gather(
    c: &TrainCtx,
    totals: &Totals,
    last: Option<&(StepStats, f64)>,
) -> anyhow::Result<Option<(Vec<TrajectoryGroup>, Vec<u64>)>> {
    let b = c.cfg.groups_per_step;
    let stop = || c.shared.stop.is_cancelled();
    let floor = c.shared.window.floor(c.trainer.version());
    let pruned = c.buffer.prune_below(floor)?;
    c.shared.pruned.fetch_add(pruned, Ordering::Relaxed);
    let (mut hand, mut leases) = (Vec::with_capacity(b), Vec::new());
    let mut held_since = Instant::now();
    let mut viewed = Instant::now();
    let mut starved = false;
    let recent = super::shares::recent_counts(&totals.recent_producers);
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
                return Ok(None);
            }
        }
        // Freshest first: with more admissible groups than a step uses, the oldest age out
        // instead of every group aging towards the staleness limit (docs/learner.md); within
        // the share quota, and fair before fresh across workers (`compose`).
        let established = c.shared.established_active.load(Ordering::Relaxed);
        let lease = c.buffer.lease_selected(
            floor,
            super::shares::SCAN_LIMIT,
            BUFFER_LEASE_TTL,
            |cands| compose(c, &hand, cands, b, established, &recent),
        )?;
        match lease {
            Some(l) => {
                leases.push(l.id);
                hand.extend(l.groups.into_iter().map(|(_, g)| g));
            }
            None => {
                // Starved: ask the puller for more now, and keep `/status` live while waiting.
                if !starved {
                    c.shared.pull_wake.notify_one();
                    starved = true;
                }
                if viewed.elapsed() > Duration::from_secs(1) {
                    super::status::update(c, totals, last, false);
                    viewed = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(5))
            }
        }
    }
    Ok(Some((hand, leases)))
}

/// Which of `cands` (newest first) join the batch `hand` of `b` groups: the share quota of
/// `control::admission`, counting what `hand` already holds, filled one group per worker at a
/// time (`compose_batch`: each worker's newest first, but no worker a second group while
/// another still offers its first; ties go to the worker with fewer of the `recent` trained
/// groups).
fn compose(
    c: &TrainCtx,
    hand: &[TrajectoryGroup],
    cands: &[(storage::GroupKey, TrajectoryGroup)],
    b: usize,
    established_active: usize,
    recent: &std::collections::HashMap<&str, u32>,
) -> Vec<usize> {
    use control::admission::{batch_quota, compose_batch};
    let mut index = std::collections::HashMap::new();
    let p = &c.shared.pipeline;
    let taken = super::shares::candidates(hand.iter(), p, recent, &mut index);
    let offered = super::shares::candidates(cands.iter().map(|(_, g)| g), p, recent, &mut index);
    let all: Vec<_> = taken.iter().chain(&offered).copied().collect();
    let quota = batch_quota(
        b,
        c.caps,
        established_active,
        super::shares::established_offering(&all),
    );
    compose_batch(&offered, b - hand.len(), quota, &taken)
}

/// Splits a batch into the groups to train and those whose producer is banned.
fn without_banned(
    hand: Vec<TrajectoryGroup>,
    is_banned: &dyn Fn(&str) -> bool,
) -> (Vec<TrajectoryGroup>, Vec<TrajectoryGroup>) {
    hand.into_iter().partition(|g| !is_banned(&g.producer))
}

/// The step's figures as Prometheus series (the dashboard in `docs/grafana/` plots them).
/// The reward says where it comes from (`basis`: recomputed by the learner, or reported by
/// the workers); `learner_reward_checked_mean` averages fully verified groups only. The
/// off-policy diagnostics (KL(sampler ‖ learner), the importance weights' variance, the clip
/// fraction, the gradient norm), the idle and training time and the staleness of every
/// trained group are the ones `steps.jsonl` logs.
fn export_step_metrics(st: &StepStats, t: &Totals, recomputed: bool) {
    let busy = t.idle_s + t.train_s;
    metrics::gauge!("learner_version").set(st.version as f64);
    metrics::gauge!("learner_bubble_ratio").set(if busy > 0.0 { t.idle_s / busy } else { 0.0 });
    crate::telemetry::set_seconds_total("learner_idle_seconds_total", t.idle_s);
    crate::telemetry::set_seconds_total("learner_train_seconds_total", t.train_s);
    metrics::histogram!("learner_t_train_seconds").record(st.t_train_s);
    metrics::gauge!("learner_loss").set(st.loss);
    metrics::gauge!("learner_reward_std").set(st.reward_std);
    metrics::gauge!("learner_kl_sampler_learner").set(st.kl_sampler_learner);
    metrics::gauge!("learner_importance_weight_variance").set(st.importance_weight_variance);
    metrics::gauge!("learner_clip_fraction").set(st.clip_fraction);
    metrics::gauge!("learner_grad_norm").set(st.grad_norm);
    for (&staleness, &groups) in &st.staleness_histogram {
        metrics::counter!("learner_groups_trained_by_staleness_total",
            "staleness" => staleness.to_string())
        .increment(groups);
    }
    let basis = if recomputed { "recomputed" } else { "reported" };
    metrics::gauge!("learner_reward_mean", "basis" => basis).set(st.reward_mean);
    if !t.recent_checked.is_empty() {
        let m = t.recent_checked.iter().sum::<f64>() / t.recent_checked.len() as f64;
        metrics::gauge!("learner_reward_checked_mean").set(m);
    }
    metrics::gauge!("learner_staleness_max").set(st.staleness_max as f64);
    metrics::counter!("learner_groups_dropped_stale_total").increment(st.groups_stale as u64);
    metrics::counter!("learner_groups_dropped_zero_advantage_total")
        .increment(st.groups_zero_advantage as u64);
}

fn open_log(path: &Path) -> anyhow::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Hands the trainer's current weights, in the snapshot dtype, to the publisher (replacing any
/// not yet published): the whole model, or for a LoRA run (`c.adapters`) the adapters — the
/// base itself at its base version. The trainer itself stays in f32.
fn publish(c: &TrainCtx) -> anyhow::Result<()> {
    let (trainer, dtype) = (&c.trainer, c.snapshot_dtype);
    let v = trainer.version();
    let (bytes, kind) = match &c.adapters {
        Some(s) => s.payload(trainer.policy(), v, dtype)?,
        None if dtype == policy::DType::F32 => {
            (trainer.snapshot_bytes()?, storage::PayloadKind::Full)
        }
        None => (
            trainer
                .policy()
                .to_safetensors_bytes_as(dtype)
                .map_err(learner::LearnerError::from)
                .context("serialising the snapshot")?,
            storage::PayloadKind::Full,
        ),
    };
    c.snap_tx
        .send_replace(Some((v, bytes::Bytes::from(bytes), kind)));
    Ok(())
}

/// A LoRA run whose base is published as a full version: training waits until that version
/// went out, so that no adapter version replaces it in the publisher's slot (the watch keeps
/// only the newest) — without it no worker could install an adapter.
fn wait_for_base(c: &TrainCtx) {
    let Some(base) = c.adapters.and_then(|s| s.base_version) else {
        return;
    };
    if c.trainer.version() != base {
        return;
    }
    while !c.shared.stop.is_cancelled() && c.shared.publish.published().is_none_or(|p| p < base) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer banned between the pull and the step has none of its groups trained; the
    /// others' groups keep their order.
    #[test]
    fn groups_of_banned_producers_are_split_off() {
        let group = |seed: u64, producer: &str| TrajectoryGroup {
            producer: producer.into(),
            ..storage::record::testing::group(1, seed, 2, 4)
        };
        let hand = vec![
            group(1, "a"),
            group(2, "bad"),
            group(3, "b"),
            group(4, "bad"),
        ];
        let (kept, dropped) = without_banned(hand, &|p| p == "bad");
        let seeds = |gs: &[TrajectoryGroup]| gs.iter().map(|g| g.seq).collect::<Vec<_>>();
        assert_eq!(seeds(&kept), [1, 3]);
        assert_eq!(seeds(&dropped), [2, 4]);
        let (kept, dropped) = without_banned(kept, &|_| false);
        assert_eq!((kept.len(), dropped.len()), (2, 0));
    }

    #[test]
    fn only_local_faults_or_repeated_failures_end_training() {
        let data = LearnerError::Invalid("non-finite gradient norm NaN".into());
        assert_eq!(
            local_fault(&data, 1),
            None,
            "one failed batch is the data's fault"
        );
        assert_eq!(local_fault(&data, MAX_FAILED_STEPS - 1), None);
        assert!(local_fault(&data, MAX_FAILED_STEPS).is_some());
        let io = LearnerError::Io(std::io::Error::other("disk gone"));
        assert!(local_fault(&io, 1).unwrap().contains("I/O"));
        let oom = LearnerError::Policy(policy::PolicyError::DoesNotFit("16 GiB > 8 GiB".into()));
        assert!(local_fault(&oom, 1).unwrap().contains("memory"));
        // A message that merely mentions memory is not an out-of-memory error.
        let text = LearnerError::Invalid("CUDA out of memory".into());
        assert_eq!(local_fault(&text, 1), None);
    }

    #[test]
    fn a_quarantined_group_is_kept_with_its_producer_and_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = quarantine_dir(&tmp.path().join("checkpoints"));
        assert_eq!(dir, tmp.path().join("quarantine"));
        let g = storage::record::testing::group(3, 7, 2, 4);
        quarantine(&dir, &g, "non-finite loss inf").unwrap();
        let id = hex::encode(g.group_id);
        let bytes = std::fs::read(dir.join(format!("{id}.bin"))).unwrap();
        assert_eq!(TrajectoryGroup::decode(&bytes).unwrap(), g);
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.json"))).unwrap())
                .unwrap();
        assert_eq!(meta["producer"], g.producer.as_str());
        assert_eq!(meta["reason"], "non-finite loss inf");
        assert_eq!(meta["version"], 3);
        assert_eq!(count_kept(&dir), 1);
    }
}
