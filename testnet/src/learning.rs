//! Learning scenarios (SPEC §12–13) driven through `echo-node demo` (one learner and N rollout
//! processes on 127.0.0.1), one run per setting, each with a time budget:
//!
//! - `staleness`: S ∈ {0, 1, 3, 6, 11} × {GRPO, GEPO}; reports the final mean reward (last
//!   tenth of the steps) and the mean importance-weight variance per S.
//! - `overlap`: the bubble ratio against the number of rollout workers, with the threshold the
//!   capacity model predicts (`predicted_workers` = ⌈μ_target / μ per worker⌉ from the learner's
//!   online T_train, T_bcast and the workers' μ) and the observed one (the fewest workers with
//!   a bubble ratio ≤ 2 %).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::plot::{write_png, Chart, Series};

/// One `echo-node demo --json` run; returns its summary line.
pub fn demo(bin: &Path, args: &[String]) -> anyhow::Result<Value> {
    let out = Command::new(bin)
        .arg("demo")
        .arg("--json")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} demo", bin.display()))?;
    if !out.status.success() {
        bail!(
            "demo {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).with_context(|| format!("demo printed {line:?}"))
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The `staleness` scenario.
pub fn staleness(
    bin: &Path,
    values: &[u64],
    objectives: &[String],
    minutes: f64,
    out: &Path,
) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let mut rows = Vec::new();
    for obj in objectives {
        for &s in values {
            let mode = if s == 0 { "sequential" } else { "async" };
            let v = demo(
                bin,
                &[
                    "--steps".into(),
                    "1000000".into(),
                    "--minutes".into(),
                    minutes.to_string(),
                    "--mode".into(),
                    mode.into(),
                    "--staleness".into(),
                    s.to_string(),
                    "--objective".into(),
                    obj.clone(),
                ],
            )?;
            eprintln!(
                "staleness S={s:<2} {obj}: {} steps, reward {:.3} -> {:.3}, ivar {:.3}, bubble {:.3}",
                v["steps"],
                f(&v, "reward_first"),
                f(&v, "reward_last"),
                f(&v, "importance_weight_variance_mean"),
                f(&v, "bubble_ratio")
            );
            rows.push(json!({"staleness": s, "objective": obj, "summary": v}));
        }
    }
    let series = |key: &str| -> Vec<Series> {
        objectives
            .iter()
            .map(|o| Series {
                name: o.to_uppercase(),
                points: rows
                    .iter()
                    .filter(|r| r["objective"] == o.as_str())
                    .map(|r| {
                        (
                            r["staleness"].as_f64().unwrap_or(0.0),
                            f(&r["summary"], key),
                        )
                    })
                    .collect(),
                dashed: false,
            })
            .collect()
    };
    for (key, label, file) in [
        ("reward_last", "final mean reward", "staleness-reward.png"),
        (
            "importance_weight_variance_mean",
            "mean importance-weight variance",
            "staleness-ivar.png",
        ),
    ] {
        write_png(
            &Chart {
                title: format!("{label} vs staleness budget S ({minutes} min per run)"),
                x_label: "S".into(),
                y_label: label.into(),
                series: series(key),
                log_x: false,
                log_y: false,
            },
            &out.join(file),
            960,
            600,
        )?;
    }
    let full = json!({"scenario": "staleness", "minutes": minutes, "results": rows});
    std::fs::write(
        out.join("staleness.json"),
        serde_json::to_vec_pretty(&full)?,
    )?;
    let brief: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"staleness": r["staleness"], "objective": r["objective"],
            "reward_last": r["summary"]["reward_last"], "steps": r["summary"]["steps"],
            "importance_weight_variance_mean": r["summary"]["importance_weight_variance_mean"]})
        })
        .collect();
    Ok(json!({"scenario": "staleness", "results": brief}))
}

/// The `overlap` scenario.
pub fn overlap(
    bin: &Path,
    workers: &[usize],
    minutes: f64,
    worker_gps: f64,
    demo_args: &[String],
    out: &Path,
) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let mut rows = Vec::new();
    for &n in workers {
        let mut args = vec![
            "--workers".into(),
            n.to_string(),
            "--steps".into(),
            "1000000".into(),
            "--minutes".into(),
            minutes.to_string(),
            "--worker-groups-per-s".into(),
            worker_gps.to_string(),
        ];
        args.extend(demo_args.iter().cloned());
        let v = demo(bin, &args)?;
        // Capacity needed vs capacity per worker, from this run's online measurements.
        let per_worker = f(&v, "mu_pool") / n as f64;
        let predicted = (f(&v, "mu_target") / per_worker).ceil();
        eprintln!(
            "overlap N={n}: bubble {:.3}, μ_pool {:.2}, μ_target {:.2}, predicted workers {predicted}",
            f(&v, "bubble_ratio"),
            f(&v, "mu_pool"),
            f(&v, "mu_target"),
        );
        rows.push(json!({"workers": n, "bubble_ratio": v["bubble_ratio"],
            "predicted_workers": predicted.is_finite().then_some(predicted), "summary": v}));
    }
    let observed = rows
        .iter()
        .find(|r| r["bubble_ratio"].as_f64().is_some_and(|b| b <= 0.02))
        .and_then(|r| r["workers"].as_u64());
    let predicted: Vec<f64> = rows
        .iter()
        .filter_map(|r| r["predicted_workers"].as_f64())
        .collect();
    let predicted = (!predicted.is_empty()).then(|| {
        let mut p = predicted.clone();
        p.sort_by(f64::total_cmp);
        p[p.len() / 2]
    });
    write_png(
        &Chart {
            title: format!("bubble ratio vs rollout workers ({minutes} min per run)"),
            x_label: "rollout workers".into(),
            y_label: "bubble ratio".into(),
            series: vec![Series {
                name: "measured".into(),
                points: rows
                    .iter()
                    .map(|r| (r["workers"].as_f64().unwrap_or(0.0), f(r, "bubble_ratio")))
                    .collect(),
                dashed: false,
            }],
            log_x: false,
            log_y: false,
        },
        &out.join("overlap.png"),
        960,
        600,
    )?;
    let bubbles: Vec<Value> = rows
        .iter()
        .map(|r| json!({"workers": r["workers"], "bubble_ratio": r["bubble_ratio"]}))
        .collect();
    let full = json!({"scenario": "overlap", "minutes": minutes, "worker_groups_per_s": worker_gps, "demo_args": demo_args,
        "predicted_workers": predicted,
        "observed_workers": observed, "results": rows});
    std::fs::write(out.join("overlap.json"), serde_json::to_vec_pretty(&full)?)?;
    Ok(
        json!({"scenario": "overlap", "predicted_workers": predicted,
        "observed_workers": observed, "bubble_ratio": bubbles}),
    )
}

/// The `echo-node` binary next to this one (the same cargo profile), or `explicit`.
pub fn node_bin(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match explicit {
        Some(b) => b,
        None => std::env::current_exe()?
            .parent()
            .context("locating the testnet binary")?
            .join("echo-node"),
    };
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it first (`cargo build --release -p echo-node`, or pass --bin)",
        bin.display()
    );
    Ok(bin)
}
