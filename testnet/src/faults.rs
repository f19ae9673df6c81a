//! The `faults` scenario (`docs/experiments.md`, "Faults"; the ECHO-2 paper's App. D /
//! Table 4): one learner running the
//! scheduler with `active_workers = K` and K + 1 rollout workers (the dearest one on standby),
//! real processes on 127.0.0.1. After a warm-up and a baseline phase two faults are injected
//! from outside, one after the other:
//!
//! - `slowed`: an active worker runs at half speed — SIGSTOP / SIGCONT with a 50 % duty cycle
//!   (period 1 s) for one phase, then it runs freely again;
//! - `dropped`: an active worker is killed (SIGKILL); the scheduler activates the standby.
//!
//! The learner's `/status` is sampled every second. Per fault: `throughput_drop` = 1 − (lowest
//! 5-s windowed steps/s during the fault phase) / (baseline steps/s), `recovery_s` = time from
//! the fault until the windowed rate is back at ≥ 90 % of the baseline (null if it never is
//! within the phase), `bubble_increase` = bubble ratio during the phase − baseline bubble.
//!
//! Owns the fault schedule, the measurements and the chart. Must not start, signal or stop
//! processes itself: it asks [`crate::harness::Fleet`] to.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::Signal;
use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::chart::{Chart, Series};
use crate::harness::{self, read_status};

/// One sample of the learner: (seconds since start, version, idle_s, train_s).
type Sample = (f64, f64, f64, f64);

struct Run {
    bin: std::path::PathBuf,
    admin: String,
    t0: Instant,
    samples: Vec<Sample>,
}

impl Run {
    fn sample(&mut self) -> Option<Sample> {
        let l = read_status(&self.bin, &self.admin)?.learner?;
        let s = (
            self.t0.elapsed().as_secs_f64(),
            l.version as f64,
            l.idle_s,
            l.train_s,
        );
        self.samples.push(s);
        Some(s)
    }

    /// Samples for `secs`, calling `during(elapsed)` about every 100 ms (fault injection).
    fn observe(&mut self, secs: f64, mut during: impl FnMut(f64)) {
        let start = Instant::now();
        let mut next = Instant::now();
        while start.elapsed().as_secs_f64() < secs {
            if Instant::now() >= next {
                let _ = self.sample();
                next += Duration::from_secs(1);
            }
            during(start.elapsed().as_secs_f64());
            std::thread::sleep(Duration::from_millis(100));
        }
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

/// Runs the scenario; writes `faults.json` and `faults.png` under `out`.
pub fn run(bin: &Path, active: usize, phase_s: f64, out: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    // Configs, stores and node logs stay under OUT/faults-run for inspection.
    let root = &out.join("faults-run");
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    let mut costs = vec![0.1; active];
    costs.push(0.5); // the dearest worker starts on standby
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
        },
        &costs,
    )?;
    let mut run = Run {
        bin: bin.to_path_buf(),
        admin,
        t0: Instant::now(),
        samples: Vec::new(),
    };
    let bar = crate::progress::bar(5, "faults phases");
    bar.set_message("warm-up");
    // Warm-up: training has started and the standby worker is on standby.
    let ready = harness::poll(Duration::from_secs(300), Duration::from_secs(1), || {
        Ok(read_status(bin, &run.admin)
            .and_then(|st| st.learner)
            .is_some_and(|l| l.version >= 20 && l.scheduler.standby.len() == 1)
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
    run.observe(phase_s, |_| {});
    let baseline = between(&run.samples, 0.0, phase_s);
    bar.inc(1);

    // Fault 1: w0 (fleet node 1) at half speed for one phase.
    bar.set_message("worker slowed");
    let t_slow = run.t0.elapsed().as_secs_f64();
    let mut stopped = false;
    run.observe(phase_s, |e| {
        let stop_now = e.fract() < 0.5;
        if stop_now != stopped {
            let sig = if stop_now {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            };
            // A failed signal only weakens the fault; the measurement shows it.
            let _ = fleet.signal(1, sig);
            stopped = stop_now;
        }
    });
    fleet.signal(1, Signal::SIGCONT)?;
    bar.inc(1);
    bar.set_message("recovering");
    run.observe(phase_s / 2.0, |_| {});
    bar.inc(1);

    // Fault 2: w1 (fleet node 2) killed.
    bar.set_message("worker dropped");
    let t_drop = run.t0.elapsed().as_secs_f64();
    fleet.kill(2);
    run.observe(phase_s, |_| {});
    let end = run.t0.elapsed().as_secs_f64();
    // The standby worker (the dearest, last) must now be generating.
    let spare = read_status(bin, &worker_admins[active]).and_then(|st| st.rollout);
    let standby_activated = spare.is_some_and(|r| !r.standby && r.groups > 0);
    fleet.stop(harness::STOP_GRACE);
    bar.finish_and_clear();

    let rates = windowed(&run.samples, 5.0);
    let fault = |name: &str, start: f64, stop: f64| {
        fault_row(&run.samples, &rates, baseline, end, name, (start, stop))
    };
    let faults = vec![
        fault("worker slowed 0.5x", t_slow, t_slow + phase_s),
        fault("worker dropped", t_drop, end),
    ];
    let full = json!({"scenario": "faults", "active_workers": active, "phase_s": phase_s,
        "baseline": {"steps_per_s": baseline.0, "bubble_ratio": baseline.1},
        "faults": faults, "standby_activated": standby_activated, "end_s": end,
        "samples": run.samples});
    std::fs::write(out.join("faults.json"), serde_json::to_vec_pretty(&full)?)?;
    replot(&full, out)
}

/// One fault's result row over `[start, stop]` (`window`): throughput in steps/s and its drop
/// below the `baseline` (steps/s, bubble ratio) at the fault's lowest 5 s window, the time
/// until a window after that low is back at ≥ 90 % of the baseline (before `end`), and the
/// bubble ratio and its increase.
fn fault_row(
    samples: &[Sample],
    rates: &[(f64, f64)],
    baseline: (f64, f64),
    end: f64,
    name: &str,
    window: (f64, f64),
) -> Value {
    let (start, stop) = window;
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
        .find(|(t, r)| *t >= low_at && *t <= end && *r >= 0.9 * baseline.0)
        .map(|(t, _)| t - start);
    json!({"fault": name, "start_s": start, "steps_per_s": rate,
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

/// Learner steps/s in 5-s windows through the run, with the baseline and the two faults'
/// start (and, for the slowed worker, end) as dashed reference lines.
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
    let t_slow = num(&full["faults"][0]["start_s"])?;
    let t_drop = num(&full["faults"][1]["start_s"])?;
    // Runs saved before `end_s` was recorded end at their last sample.
    let end = full["end_s"]
        .as_f64()
        .or_else(|| samples.last().map(|s| s.0))
        .unwrap_or(t_drop);
    Ok(Chart {
        title: "learner steps/s (5-s windows): slowed worker, then dropped worker".into(),
        x_label: "seconds since baseline start".into(),
        y_label: "steps/s".into(),
        series: vec![
            Series::solid("steps/s", windowed(&samples, 5.0)),
            Series::dashed("baseline", vec![(0.0, base), (end, base)]),
            Series::dashed(
                "slowed (start/end)",
                vec![
                    (t_slow, 0.0),
                    (t_slow, base),
                    (t_slow + phase_s, base),
                    (t_slow + phase_s, 0.0),
                ],
            ),
            Series::dashed("dropped", vec![(t_drop, 0.0), (t_drop, base)]),
        ],
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
        let full = json!({"phase_s": 10.0, "baseline": {"steps_per_s": 2.0},
            "faults": [{"start_s": 10.0}, {"start_s": 25.0}], "standby_activated": true,
            "samples": samples});
        let c = chart(&full).unwrap();
        assert_eq!(c.series.len(), 4);
        assert_eq!(c.series[1].points, [(0.0, 2.0), (39.0, 2.0)]);
        assert_eq!(c.series[2].points[2], (20.0, 2.0));
        let dir = tempfile::tempdir().unwrap();
        let summary = replot(&full, dir.path()).unwrap();
        assert_eq!(summary["standby_activated"], true);
        assert!(dir.path().join("faults.png").exists());
        assert!(chart(&json!({"samples": []})).is_err());
    }
}
