//! The `faults` scenario (`docs/experiments.md`, "Faults"; the ECHO-2 paper's App. D /
//! Table 4): one learner running the scheduler with `active_workers = K` and K + 2 rollout
//! workers (the two dearest on standby), real processes on 127.0.0.1, on one forwarding chain
//! (B̂w = B0, so N_ch = 1) whose seats are not re-drawn during the run. After a warm-up and a
//! baseline phase four single-worker faults are injected from outside, one after the other,
//! each followed by half a phase of recovery:
//!
//! - `worker slowed`: an active worker that feeds no generating worker (it only generates) runs at
//!   half speed — SIGSTOP / SIGCONT with a 50 % duty cycle (period 100 ms by default:
//!   half its compute and half its bandwidth, each stop short against a training step; a
//!   period of 1 s is a different fault, a node frozen for half a second at a time) — for one
//!   phase;
//! - `forwarder slowed`: the active worker nearest the chain's head that feeds a generating
//!   worker below it (it carries every version to them) is slowed the same way;
//! - `forwarder dropped`: such a forwarder is killed (SIGKILL): its child stalls, repairs from
//!   other holders, and the learner excises it from the plan; the scheduler activates a
//!   standby worker;
//! - `worker dropped`: an active tail is killed; the second standby is activated.
//!
//! The learner's `/status` is sampled every second: its version, idle and train time, and each
//! worker's chain seat and install lag. Per fault: `throughput_drop` = 1 − (lowest 5-s windowed
//! steps/s during the fault phase) / (baseline steps/s), `recovery_s` = time from the fault
//! until the windowed rate is back at ≥ 90 % of the baseline (null if it is not before the next
//! fault), `bubble_increase` = bubble ratio during the phase − baseline bubble; and for the
//! broadcast side, the other chain members' highest install lag and the seconds in which one
//! of them lagged more than any did in the baseline (the cascade below a faulty forwarder), and
//! the share of the phase in which the faulty worker fed a generating worker.
//!
//! Owns the fault schedule, the measurements and the chart. Must not start, signal or stop
//! processes itself: it asks [`crate::harness::Fleet`] to.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::harness::Signal;
use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::chart::{Chart, Series};
use crate::harness::{self, read_status, NodeStatus};

/// One sample of the learner: (seconds since start, version, idle_s, train_s).
type Sample = (f64, f64, f64, f64);

/// One rollout worker's place as the learner's `/status` shows it.
#[derive(Debug, Clone, PartialEq)]
struct Seat {
    id: String,
    /// The chain and position in the learner's current plan (`None`: not in a chain).
    chain: Option<u32>,
    position: Option<u32>,
    /// Versions its installed snapshot trails the learner's newest.
    lag: Option<u64>,
    /// Whether the scheduler has it generating (not on standby).
    active: bool,
}

/// The seats at one sample: (seconds since start, seats).
type Look = (f64, Vec<Seat>);

impl Seat {
    fn json(&self) -> Value {
        json!({"id": self.id, "chain": self.chain, "position": self.position, "lag": self.lag,
            "active": self.active})
    }
}

/// The workers a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    /// A worker that feeds generating workers below it.
    Forwarder,
    /// A worker that feeds no generating worker: it only generates.
    Tail,
}

/// Whether `id` feeds a generating worker in `seats`: an active worker further down its chain
/// that is not in `dead` receives every version through it. (A standby worker installs too,
/// but makes nothing a late install could delay; it may sit between the two.)
fn feeds(seats: &[Seat], id: &str, dead: &[String]) -> bool {
    let Some(me) = seats.iter().find(|s| s.id == id) else {
        return false;
    };
    let (Some(chain), Some(pos)) = (me.chain, me.position) else {
        return false;
    };
    seats.iter().any(|s| {
        s.chain == Some(chain) && s.position > Some(pos) && s.active && !dead.contains(&s.id)
    })
}

/// The worker a fault of kind `target` hits among the active ones not in `dead`: for a
/// forwarder the one nearest a chain's head that feeds a generating worker (a head carries
/// every version to its whole chain); for a tail the deepest one that feeds none. Ties go to the lower peer id,
/// so a run's choice does not depend on the order of the status. `None` when the plan has no
/// such worker.
fn pick(seats: &[Seat], dead: &[String], target: Target) -> Option<String> {
    let candidates = seats.iter().filter(|s| {
        s.chain.is_some()
            && s.active
            && !dead.contains(&s.id)
            && feeds(seats, &s.id, dead) == (target == Target::Forwarder)
    });
    let chosen = match target {
        Target::Forwarder => {
            candidates.min_by(|a, b| a.position.cmp(&b.position).then(a.id.cmp(&b.id)))
        }
        Target::Tail => candidates.max_by(|a, b| a.position.cmp(&b.position).then(b.id.cmp(&a.id))),
    };
    chosen.map(|s| s.id.clone())
}

/// The looks with a time in `[a, b]`.
fn looks_in(looks: &[Look], (a, b): (f64, f64)) -> impl Iterator<Item = &Look> {
    looks.iter().filter(move |l| l.0 >= a && l.0 <= b)
}

/// The share of the looks in `window` in which `id` fed a generating worker.
fn forwarding_share(looks: &[Look], id: &str, dead: &[String], window: (f64, f64)) -> f64 {
    let (mut parent, mut all) = (0usize, 0usize);
    for (_, seats) in looks_in(looks, window) {
        all += 1;
        parent += usize::from(feeds(seats, id, dead));
    }
    if all == 0 {
        f64::NAN
    } else {
        parent as f64 / all as f64
    }
}

/// Over the looks in `window`, for the active chain members not in `skip` (the faulty worker
/// and the dead): the highest install lag, and the seconds in which one of them lagged by more than
/// `allowed` (each lagging look counts until the next look, or the window's end).
fn others_lag(looks: &[Look], skip: &[String], window: (f64, f64), allowed: u64) -> (u64, f64) {
    let inside: Vec<&Look> = looks_in(looks, window).collect();
    let worst = |seats: &[Seat]| {
        seats
            .iter()
            .filter(|s| s.chain.is_some() && s.active && !skip.contains(&s.id))
            .filter_map(|s| s.lag)
            .max()
            .unwrap_or(0)
    };
    let (mut max, mut lagging) = (0u64, 0.0);
    for (i, (t, seats)) in inside.iter().enumerate() {
        let w = worst(seats);
        max = max.max(w);
        if w > allowed {
            let next = inside.get(i + 1).map_or(window.1, |l| l.0);
            lagging += next - t;
        }
    }
    (max, lagging)
}

struct Run {
    bin: std::path::PathBuf,
    admin: String,
    t0: Instant,
    samples: Vec<Sample>,
    looks: Vec<Look>,
}

impl Run {
    fn sample(&mut self) -> Option<Sample> {
        let st: NodeStatus = read_status(&self.bin, &self.admin)?;
        let l = st.learner?;
        let t = self.t0.elapsed().as_secs_f64();
        let s = (t, l.version as f64, l.idle_s, l.train_s);
        self.samples.push(s);
        let active = l.scheduler.active;
        let seats = st
            .network
            .peers
            .iter()
            .filter(|p| p.role == Some(echo_node::config::Role::Rollout))
            .map(|p| Seat {
                id: p.peer_id.clone(),
                chain: p.chain,
                position: p.position,
                lag: p.install_lag,
                active: active.contains(&p.peer_id),
            })
            .collect();
        self.looks.push((t, seats));
        Some(s)
    }

    /// Samples about every second for `secs`.
    fn observe(&mut self, secs: f64) {
        let start = Instant::now();
        let mut next = Instant::now();
        while start.elapsed().as_secs_f64() < secs {
            if Instant::now() >= next {
                let _ = self.sample();
                next += Duration::from_secs(1);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The worker a fault of kind `target` hits now (a fresh sample), or an error naming the
    /// plan the learner showed.
    fn pick(&mut self, dead: &[String], target: Target) -> anyhow::Result<String> {
        let _ = self.sample();
        let seats = self.looks.last().map(|l| l.1.as_slice()).unwrap_or(&[]);
        pick(seats, dead, target).with_context(|| {
            format!("no active {target:?} worker in the learner's plan: {seats:?}")
        })
    }

    /// Runs `node` at half speed for `secs` while sampling: stopped (SIGSTOP) for the first
    /// half of every `period`, running (SIGCONT) for the second. The signals come from their
    /// own thread, so that a slow status read does not stretch a stop.
    fn slowed(
        &mut self,
        fleet: &mut harness::Fleet,
        node: usize,
        secs: f64,
        period: Duration,
    ) -> anyhow::Result<()> {
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let duty = scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    // A failed signal only weakens the fault; the measurement shows it.
                    let _ = fleet.signal(node, Signal::SIGSTOP);
                    std::thread::sleep(period / 2);
                    let _ = fleet.signal(node, Signal::SIGCONT);
                    std::thread::sleep(period / 2);
                }
            });
            self.observe(secs);
            done.store(true, Ordering::Relaxed);
            let _ = duty.join();
        });
        fleet.signal(node, Signal::SIGCONT)
    }
}

/// Steps/s over trailing windows of `w` seconds: (time, rate).
fn windowed(samples: &[Sample], w: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        if let Some(p) = samples[..i].iter().rev().find(|p| s.0 - p.0 >= w) {
            out.push((s.0, (s.1 - p.1) / (s.0 - p.0)));
        }
    }
    out
}

fn between(samples: &[Sample], a: f64, b: f64) -> (f64, f64) {
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.0 >= a && s.0 <= b).collect();
    match (inside.first(), inside.last()) {
        (Some(x), Some(y)) if y.0 > x.0 => {
            let rate = (y.1 - x.1) / (y.0 - x.0);
            let (idle, train) = (y.2 - x.2, y.3 - x.3);
            let bubble = if idle + train > 0.0 {
                idle / (idle + train)
            } else {
                0.0
            };
            (rate, bubble)
        }
        _ => (f64::NAN, f64::NAN),
    }
}

/// One injected fault: its name, the worker it hit (`wN`, and its peer id), and when it ran.
struct Fault {
    name: &'static str,
    node: String,
    id: String,
    start: f64,
    /// The end of the fault phase (a slowed worker runs freely again; a dropped one stays
    /// dead).
    stop: f64,
    /// The end of the recovery window after it (the next fault's start, or the run's end).
    until: f64,
    /// The workers dead before this fault.
    dead_before: Vec<String>,
}

/// Runs the scenario (a slowed worker is stopped for the first half of every `slow_period`);
/// writes `faults.json` and `faults.png` under `out`.
pub fn run(
    bin: &Path,
    active: usize,
    phase_s: f64,
    slow_period: Duration,
    out: &Path,
) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    // Configs, stores and node logs stay under OUT/faults-run for inspection.
    let root = &out.join("faults-run");
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    let mut costs = vec![0.1; active];
    // The two dearest workers start on standby: one replaces each dropped worker.
    costs.extend([0.5, 0.6]);
    let harness::Swarm {
        mut fleet,
        learner_admin: admin,
        worker_admins,
    } = harness::launch_swarm(
        bin,
        root,
        "tn-faults",
        |l| {
            l.learner.warm_start_steps = 60;
            l.scheduler.enabled = true;
            l.scheduler.active_workers = Some(active);
            l.scheduler.announce_interval_ms = 500;
            // One chain (N_ch = ⌊B0 / B̂w⌋ = 1 with the default B0 of 300 Mbit/s), so that
            // every worker but the tail forwards; seats stay put, so that a tail's fault stays a
            // worker fault and a head's a forwarder fault (a slow parent still moves by its
            // children's receipts; `forwarding_share` shows whether it did).
            l.broadcast.worker_mbps = 300.0;
            l.broadcast.plan_epoch = 1_000_000;
        },
        &costs,
    )?;
    // Peer id → (fleet node, name); the learner is fleet node 0, `wN` is node N + 1.
    let mut workers = Vec::new();
    for (i, w) in worker_admins.iter().enumerate() {
        let st = read_status(bin, w).with_context(|| format!("w{i} does not answer"))?;
        workers.push((st.network.peer_id, i + 1, format!("w{i}")));
    }
    let node_of = |id: &str| {
        workers
            .iter()
            .find(|w| w.0 == id)
            .map(|w| (w.1, w.2.clone()))
            .with_context(|| format!("{id} is not one of this run's workers"))
    };
    let mut run = Run {
        bin: bin.to_path_buf(),
        admin,
        t0: Instant::now(),
        samples: Vec::new(),
        looks: Vec::new(),
    };
    let bar = crate::progress::bar(9, "faults phases");
    bar.set_message("warm-up");
    // Warm-up: training has started and both standby workers are on standby.
    let ready = harness::poll(Duration::from_secs(300), Duration::from_secs(1), || {
        Ok(read_status(bin, &run.admin)
            .and_then(|st| st.learner)
            .is_some_and(|l| l.version >= 20 && l.scheduler.standby.len() == 2)
            .then_some(()))
    })?;
    if ready.is_none() {
        bail!(
            "the swarm did not start training within 300 s; logs in {}",
            root.display()
        );
    }
    bar.inc(1);
    bar.set_message("baseline");
    run.t0 = Instant::now();
    run.observe(phase_s);
    let baseline = between(&run.samples, 0.0, phase_s);
    let (baseline_lag, _) = others_lag(&run.looks, &[], (0.0, phase_s), u64::MAX);
    bar.inc(1);

    let schedule = [
        ("worker slowed 0.5x", Target::Tail, false),
        ("forwarder slowed 0.5x", Target::Forwarder, false),
        ("forwarder dropped", Target::Forwarder, true),
        ("worker dropped", Target::Tail, true),
    ];
    let mut dead: Vec<String> = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    for (k, (name, target, drop)) in schedule.into_iter().enumerate() {
        let id = run.pick(&dead, target)?;
        let (node, node_name) = node_of(&id)?;
        bar.set_message(format!("{name} ({node_name})"));
        let start = run.t0.elapsed().as_secs_f64();
        let dead_before = dead.clone();
        if drop {
            fleet.kill(node);
            dead.push(id.clone());
            run.observe(phase_s);
        } else {
            run.slowed(&mut fleet, node, phase_s, slow_period)?;
        }
        let stop = run.t0.elapsed().as_secs_f64();
        bar.inc(1);
        if k + 1 < schedule.len() {
            bar.set_message("recovering");
            run.observe(phase_s / 2.0);
            bar.inc(1);
        }
        if let Some(prev) = faults.last_mut() {
            prev.until = start;
        }
        faults.push(Fault {
            name,
            node: node_name,
            id,
            start,
            stop,
            until: f64::INFINITY,
            dead_before,
        });
    }
    let end = run.t0.elapsed().as_secs_f64();
    // Both standby workers (the dearest, last) must have been activated: each is generating
    // now, or was killed as an active worker by a later fault.
    let standby_activated = (active..worker_admins.len()).all(|i| {
        let killed = workers.iter().any(|w| w.1 == i + 1 && dead.contains(&w.0));
        killed
            || read_status(bin, &worker_admins[i])
                .and_then(|st| st.rollout)
                .is_some_and(|r| !r.standby && r.groups > 0)
    });
    fleet.stop(harness::STOP_GRACE);
    bar.finish_and_clear();

    let rates = windowed(&run.samples, 5.0);
    let rows: Vec<Value> = faults
        .iter()
        .map(|f| {
            let mut row = fault_row(
                &run.samples,
                &rates,
                baseline,
                f.name,
                (f.start, f.stop, f.until.min(end)),
            );
            let mut skip = f.dead_before.clone();
            skip.push(f.id.clone());
            let window = (f.start, f.until.min(end));
            let (max_lag, lagging_s) = others_lag(&run.looks, &skip, window, baseline_lag);
            row["worker"] = json!(f.node);
            row["forwarding_share"] = json!(forwarding_share(
                &run.looks,
                &f.id,
                &f.dead_before,
                (f.start, f.stop)
            ));
            row["others_max_install_lag"] = json!(max_lag);
            row["others_lagging_s"] = json!(lagging_s);
            row
        })
        .collect();
    let seats: Vec<Value> = run
        .looks
        .iter()
        .map(|(t, seats)| json!([t, seats.iter().map(Seat::json).collect::<Vec<_>>()]))
        .collect();
    let full = json!({"scenario": "faults", "active_workers": active, "phase_s": phase_s,
        "slow_period_s": slow_period.as_secs_f64(),
        "baseline": {"steps_per_s": baseline.0, "bubble_ratio": baseline.1,
            "max_install_lag": baseline_lag},
        "faults": rows, "standby_activated": standby_activated, "end_s": end,
        "samples": run.samples, "seats": seats});
    std::fs::write(out.join("faults.json"), serde_json::to_vec_pretty(&full)?)?;
    replot(&full, out)
}

/// One fault's result row over `window` = (start, stop, until): throughput in steps/s over
/// the fault phase [start, stop] and its drop below the `baseline` (steps/s, bubble ratio) at
/// the phase's lowest 5 s window, the time until a window after that low is back at ≥ 90 % of
/// the baseline (before `until`, the next fault's start), and the bubble ratio and its
/// increase.
fn fault_row(
    samples: &[Sample],
    rates: &[(f64, f64)],
    baseline: (f64, f64),
    name: &str,
    window: (f64, f64, f64),
) -> Value {
    let (start, stop, until) = window;
    let (rate, bubble) = between(samples, start, stop);
    let min = rates
        .iter()
        .filter(|(t, _)| *t >= start && *t <= stop)
        .map(|r| r.1)
        .fold(f64::INFINITY, f64::min);
    // Recovered: the first window after the fault's lowest point back at ≥ 90 %.
    let low_at = rates
        .iter()
        .filter(|(t, _)| *t >= start && *t <= stop)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(start, |r| r.0);
    let recovery = rates
        .iter()
        .find(|(t, r)| *t >= low_at && *t <= until && *r >= 0.9 * baseline.0)
        .map(|(t, _)| t - start);
    json!({"fault": name, "start_s": start, "stop_s": stop, "steps_per_s": rate,
        "throughput_drop": if min.is_finite() { (1.0 - min / baseline.0).max(0.0) } else { f64::NAN },
        "recovery_s": recovery, "bubble_ratio": bubble,
        "bubble_increase": bubble - baseline.1})
}

/// Draws `faults.png` under `out` from a fresh or saved `faults.json` (`testnet faults
/// --from`); returns the summary.
pub fn replot(full: &Value, out: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    chart(full)?.write_png(&out.join("faults.png"), 960, 600)?;
    Ok(
        json!({"scenario": "faults", "baseline": full["baseline"], "faults": full["faults"],
        "standby_activated": full["standby_activated"]}),
    )
}

/// Learner steps/s in 5-s windows through the run, with the baseline and each fault as
/// dashed reference lines: a slowed worker's phase as a box from its start to its end, a
/// dropped worker's kill as a vertical line.
fn chart(full: &Value) -> anyhow::Result<Chart> {
    let samples: Vec<Sample> = full["samples"]
        .as_array()
        .context("not a faults result: no `samples` array")?
        .iter()
        .filter_map(|s| {
            let s = s.as_array()?;
            Some((
                s.first()?.as_f64()?,
                s.get(1)?.as_f64()?,
                s.get(2)?.as_f64()?,
                s.get(3)?.as_f64()?,
            ))
        })
        .collect();
    let num = |v: &Value| {
        v.as_f64()
            .context("a faults result without its phase times")
    };
    let base = full["baseline"]["steps_per_s"].as_f64().unwrap_or(f64::NAN);
    let phase_s = num(&full["phase_s"])?;
    let rows = full["faults"]
        .as_array()
        .filter(|r| !r.is_empty())
        .context("a faults result without its faults")?;
    let mut series = vec![Series::solid("steps/s", windowed(&samples, 5.0))];
    let mut last_start = 0.0f64;
    for row in rows {
        let name = row["fault"].as_str().unwrap_or("fault");
        let start = num(&row["start_s"])?;
        last_start = last_start.max(start);
        let points = if name.contains("dropped") {
            vec![(start, 0.0), (start, base)]
        } else {
            // Runs saved before `stop_s` was recorded slowed their worker for one phase.
            let stop = row["stop_s"].as_f64().unwrap_or(start + phase_s);
            vec![(start, 0.0), (start, base), (stop, base), (stop, 0.0)]
        };
        series.push(Series::dashed(name, points));
    }
    // Runs saved before `end_s` was recorded end at their last sample.
    let end = full["end_s"]
        .as_f64()
        .or_else(|| samples.last().map(|s| s.0))
        .unwrap_or(last_start);
    series.insert(
        1,
        Series::dashed("baseline", vec![(0.0, base), (end, base)]),
    );
    Ok(Chart {
        title: format!(
            "learner steps/s (5-s windows) through {} faults",
            rows.len()
        ),
        x_label: "seconds since baseline start".into(),
        y_label: "steps/s".into(),
        series,
        log_x: false,
        log_y: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_phases_come_from_the_samples() {
        // 2 steps/s for 10 s, then 1 step/s; the learner idles 1 s of every 4 throughout.
        let samples: Vec<Sample> = (0..=20)
            .map(|t| {
                let t = f64::from(t);
                let v = if t <= 10.0 {
                    2.0 * t
                } else {
                    20.0 + (t - 10.0)
                };
                (t, v, 0.25 * t, 0.75 * t)
            })
            .collect();
        let w = windowed(&samples, 5.0);
        assert_eq!(w.first(), Some(&(5.0, 2.0)));
        assert_eq!(w.last(), Some(&(20.0, 1.0)));
        let (rate, bubble) = between(&samples, 0.0, 10.0);
        assert_eq!(rate, 2.0);
        assert!((bubble - 0.25).abs() < 1e-12);
        assert!(between(&samples, 30.0, 40.0).0.is_nan());
    }

    #[test]
    fn a_saved_result_replots_with_its_reference_lines() {
        let samples: Vec<Value> = (0..40)
            .map(|t| json!([f64::from(t), 2.0 * f64::from(t), 0.0, f64::from(t)]))
            .collect();
        // A run saved before `stop_s` (its slowed worker ran one phase), and one with it.
        let full = json!({"phase_s": 10.0, "baseline": {"steps_per_s": 2.0},
            "faults": [{"fault": "worker slowed 0.5x", "start_s": 10.0},
                {"fault": "forwarder slowed 0.5x", "start_s": 22.0, "stop_s": 27.0},
                {"fault": "worker dropped", "start_s": 30.0}],
            "standby_activated": true, "samples": samples});
        let c = chart(&full).unwrap();
        assert_eq!(c.series.len(), 5);
        assert_eq!(c.series[1].points, [(0.0, 2.0), (39.0, 2.0)]);
        assert_eq!(c.series[2].points[2], (20.0, 2.0));
        assert_eq!(c.series[3].points[3], (27.0, 0.0));
        assert_eq!(c.series[4].points, [(30.0, 0.0), (30.0, 2.0)]);
        assert!(chart(&json!({"phase_s": 1.0, "samples": [], "faults": []})).is_err());
        let dir = tempfile::tempdir().unwrap();
        let summary = replot(&full, dir.path()).unwrap();
        assert_eq!(summary["standby_activated"], true);
        assert!(dir.path().join("faults.png").exists());
        assert!(chart(&json!({"samples": []})).is_err());
    }

    fn seat(id: &str, chain: u32, position: u32, lag: u64) -> Seat {
        Seat {
            id: id.into(),
            chain: Some(chain),
            position: Some(position),
            lag: Some(lag),
            active: true,
        }
    }

    fn standby(mut s: Seat) -> Seat {
        s.active = false;
        s
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// One chain a → b → c → d, all active.
    fn chain() -> Vec<Seat> {
        vec![
            seat("b", 0, 1, 0),
            seat("d", 0, 3, 0),
            seat("a", 0, 0, 0),
            seat("c", 0, 2, 0),
        ]
    }

    #[test]
    fn a_forwarder_feeds_a_generating_worker_below_it_and_a_tail_none() {
        let seats = chain();
        assert!(feeds(&seats, "a", &[]));
        assert!(feeds(&seats, "c", &[]));
        assert!(!feeds(&seats, "d", &[]));
        // A dead or standby worker below is fed for nothing; a worker outside every chain
        // feeds none.
        assert!(!feeds(&seats, "c", &ids(&["d"])));
        let mut spare = seats.clone();
        spare[1] = standby(spare[1].clone());
        assert!(!feeds(&spare, "c", &[]));
        // A standby worker between them does not cut the feed: a → b (standby) → c.
        spare[0] = standby(spare[0].clone());
        assert!(feeds(&spare, "a", &[]));
        let mut out = seats.clone();
        out.push(Seat {
            id: "e".into(),
            chain: None,
            position: None,
            lag: None,
            active: true,
        });
        assert!(!feeds(&out, "e", &[]));
        assert!(!feeds(&seats, "nobody", &[]));
    }

    #[test]
    fn faults_hit_the_head_forwarder_or_the_deepest_active_tail() {
        let seats = chain();
        assert_eq!(pick(&seats, &[], Target::Forwarder).as_deref(), Some("a"));
        assert_eq!(pick(&seats, &[], Target::Tail).as_deref(), Some("d"));
        // With c and d on standby, b feeds nobody who generates: it is the tail, and standby
        // workers are never hit.
        let mut spare = seats.clone();
        spare[1] = standby(spare[1].clone());
        spare[3] = standby(spare[3].clone());
        assert_eq!(pick(&spare, &[], Target::Tail).as_deref(), Some("b"));
        assert_eq!(pick(&spare, &[], Target::Forwarder).as_deref(), Some("a"));
        // With d dead, c is the deepest worker feeding none; with a dead, b (still in the plan
        // at position 1) is the forwarder nearest the head.
        assert_eq!(
            pick(&seats, &ids(&["d"]), Target::Tail).as_deref(),
            Some("c")
        );
        assert_eq!(
            pick(&seats, &ids(&["a"]), Target::Forwarder).as_deref(),
            Some("b")
        );
        // A single worker forwards to nobody.
        assert_eq!(pick(&seats[..1], &[], Target::Forwarder), None);
        // Two chains: heads tie on position, the lower id wins, whatever the order.
        let two = vec![
            seat("y", 1, 0, 0),
            seat("z", 1, 1, 0),
            seat("x", 0, 0, 0),
            seat("w", 0, 1, 0),
        ];
        assert_eq!(pick(&two, &[], Target::Forwarder).as_deref(), Some("x"));
        assert_eq!(pick(&two, &[], Target::Tail).as_deref(), Some("w"));
    }

    #[test]
    fn the_cascade_is_the_others_lag_above_the_baseline() {
        // a heads the chain; from t = 2 to t = 4 its children b and c fall 3 versions behind
        // (a itself, the faulty one, falls 5 behind), then catch up.
        let looks: Vec<Look> = (0..=6)
            .map(|t| {
                let behind = if (2..=4).contains(&t) { 3 } else { 1 };
                let own = if (2..=4).contains(&t) { 5 } else { 0 };
                (
                    f64::from(t),
                    vec![
                        seat("a", 0, 0, own),
                        seat("b", 0, 1, behind),
                        seat("c", 0, 2, behind),
                    ],
                )
            })
            .collect();
        let skip = ids(&["a"]);
        // Allowed 1 (the baseline's worst): lagging from t = 2 until the look at t = 5.
        assert_eq!(others_lag(&looks, &skip, (0.0, 6.0), 1), (3, 3.0));
        // The last look inside the window counts until the window's end.
        assert_eq!(others_lag(&looks, &skip, (3.0, 3.5), 1), (3, 0.5));
        // Counting the faulty worker itself would report its own lag.
        assert_eq!(others_lag(&looks, &[], (0.0, 6.0), 1).0, 5);
        assert_eq!(others_lag(&looks, &skip, (0.0, 6.0), 3), (3, 0.0));
        // A standby worker's lag is not counted: it generates nothing a late install delays.
        let mut idle = looks.clone();
        for (_, seats) in &mut idle {
            seats[1] = standby(seats[1].clone());
            seats[2] = standby(seats[2].clone());
        }
        assert_eq!(others_lag(&idle, &skip, (0.0, 6.0), 1), (0, 0.0));
        // a fed b and c in every look; c never fed anyone.
        assert_eq!(forwarding_share(&looks, "a", &[], (0.0, 6.0)), 1.0);
        assert_eq!(forwarding_share(&looks, "c", &[], (0.0, 6.0)), 0.0);
        assert!(forwarding_share(&looks, "a", &[], (10.0, 11.0)).is_nan());
    }
}
