//! The `faults` scenario (SPEC §12–13, ECHO-2 App. D / Table 4): one learner running the
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

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Value};

use crate::broadcast::{signal, status};
use crate::plot::{write_png, Chart, Series};

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
        let v = status(&self.bin, &self.admin)?;
        let l = &v["learner"];
        let s = (
            self.t0.elapsed().as_secs_f64(),
            l["version"].as_f64()?,
            l["idle_s"].as_f64().unwrap_or(0.0),
            l["train_s"].as_f64().unwrap_or(0.0),
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
    let crate::swarm::Swarm {
        mut procs,
        learner_admin: admin,
        worker_admins,
    } = crate::swarm::launch(
        bin,
        root,
        "tn-faults",
        &format!(
            "[learner]\nwarm_start_steps = 60\n[scheduler]\nenabled = true\nactive_workers = {active}\n\
             announce_interval_ms = 500\n"
        ),
        &costs,
    )?;
    let mut run = Run {
        bin: bin.to_path_buf(),
        admin,
        t0: Instant::now(),
        samples: Vec::new(),
    };
    // Warm-up: training has started and the standby worker is on standby.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let ready = status(bin, &run.admin).is_some_and(|v| {
            v["learner"]["version"].as_u64().is_some_and(|x| x >= 20)
                && v["learner"]["scheduler"]["standby"]
                    .as_array()
                    .is_some_and(|s| s.len() == 1)
        });
        if ready {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the swarm did not start training within 300 s; logs in {}",
                root.display()
            );
        }
    }
    run.t0 = Instant::now();
    run.observe(phase_s, |_| {});
    let baseline = between(&run.samples, 0.0, phase_s);

    // Fault 1: w0 at half speed for one phase.
    let t_slow = run.t0.elapsed().as_secs_f64();
    let pid0 = procs.0[1].1.id();
    let mut stopped = false;
    run.observe(phase_s, |e| {
        let stop_now = e.fract() < 0.5;
        if stop_now != stopped {
            signal(pid0, if stop_now { "-STOP" } else { "-CONT" });
            stopped = stop_now;
        }
    });
    signal(pid0, "-CONT");
    run.observe(phase_s / 2.0, |_| {});

    // Fault 2: w1 killed.
    let t_drop = run.t0.elapsed().as_secs_f64();
    if let Some((_, c)) = procs.0.get_mut(2) {
        let _ = c.kill();
        let _ = c.wait();
    }
    run.observe(phase_s, |_| {});
    let end = run.t0.elapsed().as_secs_f64();
    // The standby worker (the dearest, last) must now be generating.
    let spare = status(bin, &worker_admins[active]).unwrap_or(Value::Null);
    let standby_activated =
        spare["rollout"]["standby"] == false && spare["rollout"]["groups"].as_u64() > Some(0);
    procs.stop();

    let rates = windowed(&run.samples, 5.0);
    let fault = |name: &str, start: f64, stop: f64| {
        let (rate, bubble) = between(&run.samples, start, stop);
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
    };
    let faults = vec![
        fault("worker slowed 0.5x", t_slow, t_slow + phase_s),
        fault("worker dropped", t_drop, end),
    ];
    write_png(
        &Chart {
            title: "learner steps/s (5-s windows): slowed worker, then dropped worker".into(),
            x_label: "seconds since baseline start".into(),
            y_label: "steps/s".into(),
            series: vec![
                Series {
                    name: "steps/s".into(),
                    points: rates.clone(),
                    dashed: false,
                },
                Series {
                    name: "baseline".into(),
                    points: vec![(0.0, baseline.0), (end, baseline.0)],
                    dashed: true,
                },
                Series {
                    name: "slowed (start/end)".into(),
                    points: vec![
                        (t_slow, 0.0),
                        (t_slow, baseline.0),
                        (t_slow + phase_s, baseline.0),
                        (t_slow + phase_s, 0.0),
                    ],
                    dashed: true,
                },
                Series {
                    name: "dropped".into(),
                    points: vec![(t_drop, 0.0), (t_drop, baseline.0)],
                    dashed: true,
                },
            ],
            log_x: false,
            log_y: false,
        },
        &out.join("faults.png"),
        960,
        600,
    )?;
    let full = json!({"scenario": "faults", "active_workers": active, "phase_s": phase_s,
        "baseline": {"steps_per_s": baseline.0, "bubble_ratio": baseline.1},
        "faults": faults, "standby_activated": standby_activated, "samples": run.samples});
    std::fs::write(out.join("faults.json"), serde_json::to_vec_pretty(&full)?)?;
    Ok(
        json!({"scenario": "faults", "baseline": full["baseline"], "faults": full["faults"],
        "standby_activated": standby_activated}),
    )
}
