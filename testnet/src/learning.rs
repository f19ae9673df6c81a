//! Learning scenarios driven through `echo-node demo` (one learner and N rollout processes on
//! 127.0.0.1), one run per setting, each with a time budget (`docs/experiments.md`, sections
//! "Staleness" and "Overlap"):
//!
//! - `staleness`: S ∈ {0, 1, 3, 6, 11} × {GRPO, GEPO}; reports the final mean reward (last
//!   tenth of the steps) and the mean importance-weight variance per S.
//! - `overlap`: the bubble ratio against the number of rollout workers, with the threshold the
//!   capacity model predicts (`predicted_workers` = ⌈μ_target / μ per worker⌉ from the learner's
//!   online T_train, T_bcast and the workers' μ) and the observed one (the fewest workers with
//!   a bubble ratio ≤ 2 %).
//!
//! Owns the runs' arguments, their analysis and their charts. Must not run processes itself:
//! every run goes through [`crate::harness::run_demo`].

use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};

use crate::chart::{Chart, Series};
use crate::harness::run_demo;

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
    let bar = crate::progress::bar((objectives.len() * values.len()) as u64, "staleness runs");
    for obj in objectives {
        for &s in values {
            let mode = if s == 0 { "sequential" } else { "async" };
            bar.set_message(format!("S={s} {obj}"));
            let v = run_demo(
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
            bar.suspend(|| {
                eprintln!(
                    "staleness S={s:<2} {obj}: {} steps, reward {:.3} -> {:.3}, ivar {:.3}, bubble {:.3}",
                    v["steps"],
                    f(&v, "reward_first"),
                    f(&v, "reward_last"),
                    f(&v, "importance_weight_variance_mean"),
                    f(&v, "bubble_ratio")
                )
            });
            rows.push(json!({"staleness": s, "objective": obj, "summary": v}));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let full = json!({"scenario": "staleness", "minutes": minutes, "results": rows});
    std::fs::write(
        out.join("staleness.json"),
        serde_json::to_vec_pretty(&full)?,
    )?;
    replot_staleness(&full, out)
}

/// Draws `staleness-reward.png` and `staleness-ivar.png` under `out` from a fresh or saved
/// `staleness.json` (`testnet staleness --from`); returns the summary.
pub fn replot_staleness(full: &Value, out: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let rows = full["results"]
        .as_array()
        .context("not a staleness result: no `results` array")?;
    let minutes = full["minutes"].as_f64().unwrap_or(f64::NAN);
    // Objectives in the order of their first run.
    let mut objectives: Vec<String> = Vec::new();
    for o in rows.iter().filter_map(|r| r["objective"].as_str()) {
        if !objectives.iter().any(|x| x == o) {
            objectives.push(o.to_string());
        }
    }
    let series = |key: &str| -> Vec<Series> {
        objectives
            .iter()
            .map(|o| {
                Series::solid(
                    o.to_uppercase(),
                    rows.iter()
                        .filter(|r| r["objective"] == o.as_str())
                        .map(|r| {
                            (
                                r["staleness"].as_f64().unwrap_or(0.0),
                                f(&r["summary"], key),
                            )
                        })
                        .collect(),
                )
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
        Chart {
            title: format!("{label} vs staleness budget S ({minutes} min per run)"),
            x_label: "S".into(),
            y_label: label.into(),
            series: series(key),
            log_x: false,
            log_y: false,
        }
        .write_png(&out.join(file), 960, 600)?;
    }
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
    let bar = crate::progress::bar(workers.len() as u64, "overlap runs");
    for &n in workers {
        bar.set_message(format!("{n} workers"));
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
        let v = run_demo(bin, &args)?;
        // Capacity needed vs capacity per worker, from this run's online measurements.
        let per_worker = f(&v, "mu_pool") / n as f64;
        let predicted = (f(&v, "mu_target") / per_worker).ceil();
        bar.suspend(|| {
            eprintln!(
                "overlap N={n}: bubble {:.3}, μ_pool {:.2}, μ_target {:.2}, predicted workers {predicted}",
                f(&v, "bubble_ratio"),
                f(&v, "mu_pool"),
                f(&v, "mu_target"),
            )
        });
        rows.push(json!({"workers": n, "bubble_ratio": v["bubble_ratio"],
            "predicted_workers": predicted.is_finite().then_some(predicted), "summary": v}));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let full = json!({"scenario": "overlap", "minutes": minutes, "worker_groups_per_s": worker_gps,
        "demo_args": demo_args, "results": rows});
    report_overlap(full, out)
}

/// What an overlap sweep shows against the capacity model (the overlap check of `docs/experiments.md`), from its rows
/// (`workers`, `bubble_ratio`, `predicted_workers` each). Pure, so it is tested without runs.
///
/// - `observed_workers`: the fewest workers with a bubble ≤ 2 %.
/// - `predicted_workers`: the median of the per-run predictions ⌈μ_target / (μ_pool / n)⌉ —
///   each run predicts from its own online T_train and T_bcast, which grow with the number of
///   processes on one host, so a single run's prediction is noisy.
/// - `threshold_error`: |observed − predicted| / predicted; the check allows 0.2.
/// - `flat_from_threshold`: every count from the observed threshold on stays at ≤ 2 %.
pub fn overlap_verdict(rows: &[Value]) -> Value {
    let mut rows: Vec<&Value> = rows.iter().collect();
    rows.sort_by_key(|r| r["workers"].as_u64());
    let observed = rows
        .iter()
        .find(|r| {
            r["bubble_ratio"]
                .as_f64()
                .is_some_and(|b| b <= OVERLAP_BUBBLE)
        })
        .and_then(|r| r["workers"].as_u64());
    let mut predicted: Vec<f64> = rows
        .iter()
        .filter_map(|r| r["predicted_workers"].as_f64())
        .collect();
    predicted.sort_by(f64::total_cmp);
    let predicted = predicted.get(predicted.len() / 2).copied();
    let error = match (observed, predicted) {
        (Some(o), Some(p)) if p > 0.0 => Some((o as f64 - p).abs() / p),
        _ => None,
    };
    let flat = observed.map(|o| {
        rows.iter()
            .filter(|r| r["workers"].as_u64().is_some_and(|n| n >= o))
            .all(|r| {
                r["bubble_ratio"]
                    .as_f64()
                    .is_some_and(|b| b <= OVERLAP_BUBBLE)
            })
    });
    json!({"predicted_workers": predicted, "observed_workers": observed,
        "threshold_error": error, "flat_from_threshold": flat,
        "check_holds": error.is_some_and(|e| e <= 0.2) && flat == Some(true)})
}

/// The bubble ratio the overlap check asks for once capacity suffices.
const OVERLAP_BUBBLE: f64 = 0.02;

/// Writes `overlap.json` (the runs plus [`overlap_verdict`]) and `overlap.png` (measured
/// bubble, the 2 % line, the predicted threshold) under `out`; returns the summary.
/// `full` is a saved or fresh `overlap.json` (`testnet overlap --from` re-reports one).
pub fn report_overlap(mut full: Value, out: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let rows = full["results"]
        .as_array()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("not an overlap result: no `results` array"))?;
    anyhow::ensure!(!rows.is_empty(), "an overlap result without runs");
    let verdict = overlap_verdict(&rows);
    let mut points: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r["workers"].as_f64().unwrap_or(0.0), f(r, "bubble_ratio")))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (x0, x1) = (points[0].0, points[points.len() - 1].0);
    let top = points.iter().map(|p| p.1).fold(OVERLAP_BUBBLE, f64::max);
    let mut series = vec![
        Series::solid("measured", points),
        Series::dashed(
            "2 % target",
            vec![(x0, OVERLAP_BUBBLE), (x1, OVERLAP_BUBBLE)],
        ),
    ];
    if let Some(p) = verdict["predicted_workers"].as_f64() {
        series.push(Series::dashed(
            format!("predicted threshold ({p})"),
            vec![(p, 0.0), (p, top)],
        ));
    }
    let minutes = full["minutes"].as_f64().unwrap_or(0.0);
    Chart {
        title: format!("bubble ratio vs rollout workers ({minutes} min per run)"),
        x_label: "rollout workers".into(),
        y_label: "bubble ratio".into(),
        series,
        log_x: false,
        log_y: false,
    }
    .write_png(&out.join("overlap.png"), 960, 600)?;
    merge(&mut full, &verdict);
    std::fs::write(out.join("overlap.json"), serde_json::to_vec_pretty(&full)?)?;
    let bubbles: Vec<Value> = rows
        .iter()
        .map(|r| json!({"workers": r["workers"], "bubble_ratio": r["bubble_ratio"]}))
        .collect();
    let mut summary = json!({"scenario": "overlap", "bubble_ratio": bubbles});
    merge(&mut summary, &verdict);
    Ok(summary)
}

/// Copies the fields of the object `src` into the object `dst`.
fn merge(dst: &mut Value, src: &Value) {
    if let (Some(dst), Some(src)) = (dst.as_object_mut(), src.as_object()) {
        for (k, v) in src {
            dst.insert(k.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(points: &[(u64, f64, f64)]) -> Vec<Value> {
        points
            .iter()
            .map(|&(n, b, p)| json!({"workers": n, "bubble_ratio": b, "predicted_workers": p}))
            .collect()
    }

    #[test]
    fn a_threshold_within_twenty_percent_with_a_flat_tail_holds() {
        // The capped sweep of docs/experiments.md: predictions 7,6,8,6,6,8,6 (median 6),
        // first ≤ 2 % at 5.
        let r = rows(&[
            (2, 0.567, 7.0),
            (3, 0.259, 6.0),
            (4, 0.076, 8.0),
            (5, 0.012, 6.0),
            (6, 0.011, 6.0),
            (7, 0.012, 8.0),
            (8, 0.013, 6.0),
        ]);
        let v = overlap_verdict(&r);
        assert_eq!(v["observed_workers"], 5);
        assert_eq!(v["predicted_workers"], 6.0);
        assert!((v["threshold_error"].as_f64().unwrap() - 1.0 / 6.0).abs() < 1e-12);
        assert_eq!(v["flat_from_threshold"], true);
        assert_eq!(v["check_holds"], true);
        // Row order does not matter.
        let mut rev = r.clone();
        rev.reverse();
        assert_eq!(overlap_verdict(&rev), v);
    }

    #[test]
    fn a_bubble_rising_again_or_a_distant_threshold_fails() {
        // The earlier sweep: 8 workers back at 8 %.
        let v = overlap_verdict(&rows(&[(5, 0.024, 7.0), (6, 0.018, 6.0), (8, 0.080, 7.0)]));
        assert_eq!(v["observed_workers"], 6);
        assert_eq!(v["flat_from_threshold"], false);
        assert_eq!(v["check_holds"], false);
        // Threshold 4 against a prediction of 6: 33 % off.
        let v = overlap_verdict(&rows(&[(4, 0.014, 6.0), (5, 0.017, 6.0), (6, 0.010, 6.0)]));
        assert_eq!(v["check_holds"], false);
        // Nothing at ≤ 2 %.
        let v = overlap_verdict(&rows(&[(1, 0.3, 2.0), (2, 0.05, 2.0)]));
        assert_eq!(v["observed_workers"], Value::Null);
        assert_eq!(v["check_holds"], false);
    }

    #[test]
    fn report_writes_the_verdict_and_refuses_a_result_without_runs() {
        let dir = tempfile::tempdir().unwrap();
        let full = json!({"scenario": "overlap", "minutes": 1.5,
            "results": rows(&[(5, 0.012, 6.0), (6, 0.011, 6.0)])});
        let summary = report_overlap(full, dir.path()).unwrap();
        assert_eq!(summary["check_holds"], true);
        let saved: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("overlap.json")).unwrap())
                .unwrap();
        assert_eq!(saved["observed_workers"], 5);
        assert_eq!(saved["results"].as_array().unwrap().len(), 2);
        assert!(
            std::fs::metadata(dir.path().join("overlap.png"))
                .unwrap()
                .len()
                > 0
        );
        assert!(report_overlap(json!({"minutes": 1}), dir.path()).is_err());
        assert!(report_overlap(json!({"results": []}), dir.path()).is_err());
    }

    #[test]
    fn a_saved_staleness_result_replots_per_objective() {
        let dir = tempfile::tempdir().unwrap();
        let row = |s: u64, o: &str, r: f64| {
            json!({"staleness": s, "objective": o, "summary": {"reward_last": r, "steps": 10,
                "importance_weight_variance_mean": 0.01 * s as f64}})
        };
        let full = json!({"scenario": "staleness", "minutes": 1.0, "results": [
            row(0, "grpo", 0.4), row(3, "grpo", 0.45), row(0, "gepo", 0.37), row(3, "gepo", 0.44)]});
        let summary = replot_staleness(&full, dir.path()).unwrap();
        let rows = summary["results"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1]["reward_last"], 0.45);
        for f in ["staleness-reward.png", "staleness-ivar.png"] {
            assert!(dir.path().join(f).exists(), "{f}");
        }
        assert!(replot_staleness(&json!({"minutes": 1}), dir.path()).is_err());
    }
}
