//! Runs the scenario a `testnet` command line names: validates what the parser cannot,
//! builds the scenario's settings and prints its summary. One function per subcommand.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::chart::{Chart, Series};
use crate::cli::*;
use crate::{
    ablation, adversary, broadcast, faults, forwarding, harness, learning, membership, nat, netlab,
    sim,
};

/// `testnet broadcast`.
pub fn broadcast(args: BroadcastArgs) -> anyhow::Result<()> {
    let BroadcastArgs {
        nodes,
        size_mb,
        chunk_kb,
        worker_mbps,
        learner_mbps,
        mode,
        rounds,
        heartbeat_ms,
        from,
        wan,
        wan_seed,
        quic,
        keep_congestion_state,
        warm_up_mib,
        plan_epoch,
        link_caps,
        delta,
        changed_pct,
        run: RunOpts { bin, json, out },
    } = args;
    if let Some(from) = from {
        print_summary(&broadcast::replot(&read_json(&from)?, &out)?, json);
        return Ok(());
    }
    let wan = wan.resolve(wan_seed, link_caps)?;
    if wan.is_some() {
        netlab::ns::install_signal_teardown()?;
    }
    anyhow::ensure!(
        (100..=600_000).contains(&heartbeat_ms),
        "--heartbeat-ms must be within 100..=600000"
    );
    anyhow::ensure!(
        size_mb > 0.0 && chunk_kb >= 4,
        "--size-mb > 0, --chunk-kb >= 4"
    );
    anyhow::ensure!(
        worker_mbps > 0.0 && learner_mbps > 0.0,
        "bandwidths must be > 0"
    );
    anyhow::ensure!(
        nodes.iter().all(|n| (1..=1024).contains(n)),
        "--nodes must be in 1..=1024"
    );
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if let Some(n) = nodes.iter().find(|&&n| n > 16 * cores) {
        eprintln!(
            "warning: {n} nodes on {cores} cores: every node verifies every heartbeat, \
             so the host, not the protocol, may set T_bcast (docs/broadcast.md)"
        );
    }
    anyhow::ensure!(rounds >= 1, "--rounds must be >= 1");
    anyhow::ensure!(
        warm_up_mib.is_none_or(|m| m <= 32),
        "--warm-up-mib must be within 0..=32"
    );
    anyhow::ensure!(
        (1..=1_000_000).contains(&plan_epoch),
        "--plan-epoch must be within 1..=1000000"
    );
    anyhow::ensure!(
        (0.0..=100.0).contains(&changed_pct),
        "--changed-pct must be within 0..=100"
    );
    anyhow::ensure!(
        !delta || rounds >= 2,
        "--delta needs --rounds >= 2 (the first round is the keyframe)"
    );
    let bin = harness::node_bin(bin)?;
    let settings = broadcast::Settings {
        nodes,
        size_mb,
        chunk_kb,
        worker_mbps,
        learner_mbps,
        modes: mode,
        rounds,
        bin,
        heartbeat_ms,
        wan,
        quic,
        restart_congestion: !keep_congestion_state,
        warm_up_mib,
        plan_epoch,
        delta_changed_pct: delta.then_some(changed_pct),
    };
    let summary = broadcast::sweep(&settings, &out, !json)?;
    if json {
        println!("{summary}");
    }
    Ok(())
}

/// `testnet nat`.
pub fn nat(args: NatArgs) -> anyhow::Result<()> {
    let NatArgs {
        steps,
        per_nat,
        relay,
        timeout_s,
        wan,
        cleanup,
        run: RunOpts { bin, json, out },
    } = args;
    if cleanup {
        return nat::cleanup();
    }
    let wan = wan.resolve(1, false)?;
    anyhow::ensure!((1..=4).contains(&per_nat), "--per-nat in 1..=4");
    anyhow::ensure!((1..=1000).contains(&steps), "--steps in 1..=1000");
    let opts = nat::Opts {
        bin: harness::node_bin(bin)?,
        steps,
        per_nat,
        relay,
        timeout: std::time::Duration::from_secs(timeout_s),
        wan,
    };
    print_summary(&nat::command(&opts, &out)?, json);
    Ok(())
}

/// `testnet staleness`.
pub fn staleness(args: StalenessArgs) -> anyhow::Result<()> {
    let StalenessArgs {
        values,
        objectives,
        minutes,
        from,
        run: RunOpts { bin, json, out },
    } = args;
    if let Some(from) = from {
        print_summary(&learning::replot_staleness(&read_json(&from)?, &out)?, json);
        return Ok(());
    }
    anyhow::ensure!(minutes > 0.0, "--minutes must be > 0");
    for o in &objectives {
        anyhow::ensure!(
            ["grpo", "dr_grpo", "gspo", "gepo"].contains(&o.as_str()),
            "unknown objective {o}"
        );
    }
    let summary = learning::staleness(
        &harness::node_bin(bin)?,
        &values,
        &objectives,
        minutes,
        &out,
    )?;
    print_summary(&summary, json);
    Ok(())
}

/// `testnet overlap`.
pub fn overlap(args: OverlapArgs) -> anyhow::Result<()> {
    let OverlapArgs {
        workers,
        minutes,
        worker_groups_per_s,
        demo_args,
        from,
        run: RunOpts { bin, json, out },
    } = args;
    if let Some(from) = from {
        print_summary(&learning::report_overlap(read_json(&from)?, &out)?, json);
        return Ok(());
    }
    anyhow::ensure!(minutes > 0.0, "--minutes must be > 0");
    anyhow::ensure!(
        workers.iter().all(|w| (1..=16).contains(w)),
        "--workers in 1..=16"
    );
    let summary = learning::overlap(
        &harness::node_bin(bin)?,
        &workers,
        minutes,
        worker_groups_per_s,
        &demo_args,
        &out,
    )?;
    print_summary(&summary, json);
    Ok(())
}

/// `testnet faults`.
pub fn faults(args: FaultsArgs) -> anyhow::Result<()> {
    let FaultsArgs {
        active,
        phase_s,
        slow_period_ms,
        from,
        run: RunOpts { bin, json, out },
    } = args;
    if let Some(from) = from {
        print_summary(&faults::replot(&read_json(&from)?, &out)?, json);
        return Ok(());
    }
    anyhow::ensure!((2..=8).contains(&active), "--active must be in 2..=8");
    anyhow::ensure!(phase_s >= 10.0, "--phase-s must be >= 10");
    anyhow::ensure!(
        (20..=10_000).contains(&slow_period_ms),
        "--slow-period-ms must be in 20..=10000"
    );
    let period = std::time::Duration::from_millis(slow_period_ms);
    let summary = faults::run(&harness::node_bin(bin)?, active, phase_s, period, &out)?;
    print_summary(&summary, json);
    Ok(())
}

/// `testnet adversary`.
pub fn adversary(args: AdversaryArgs) -> anyhow::Result<()> {
    let AdversaryArgs {
        attacks,
        steps,
        batch,
        warm_start_steps,
        no_clean,
        honest,
        clean_runs,
        bin,
        json,
        out,
    } = args;
    anyhow::ensure!((1..=10).contains(&clean_runs), "--clean-runs in 1..=10");
    anyhow::ensure!((1..=10_000).contains(&steps), "--steps in 1..=10000");
    anyhow::ensure!((1..=10).contains(&batch), "--batch in 1..=10");
    anyhow::ensure!((1..=8).contains(&honest), "--honest in 1..=8");
    let mut attacks = if attacks.is_empty() {
        // Every attack whose target the scenario runs: its learner has no provisioning
        // scheduler, so `mu_inflation` would change nothing here (the scheduler's own
        // multi-process test carries it out).
        echo_node::misbehave::Attack::ALL
            .iter()
            .copied()
            .filter(|a| *a != echo_node::misbehave::Attack::MuInflation)
            .collect()
    } else {
        attacks
    };
    attacks.dedup();
    let settings = adversary::Settings {
        attacks,
        steps,
        batch,
        warm_start_steps,
        no_clean,
        honest,
        clean_runs,
    };
    let summary = adversary::run(&harness::node_bin(bin)?, &settings, &out)?;
    print_summary(&summary, json);
    Ok(())
}

/// `testnet forwarding`.
pub fn forwarding(args: ForwardingArgs) -> anyhow::Result<()> {
    let ForwardingArgs {
        uplinks,
        worker_mbps,
        steps,
        warm_start_steps,
        plan_epoch,
        run,
    } = args;
    anyhow::ensure!(
        uplinks.iter().all(|u| u.is_finite() && *u >= 0.0),
        "--uplinks: Mbit/s, 0 for none"
    );
    anyhow::ensure!(worker_mbps > 0.0, "--worker-mbps must be > 0");
    let settings = forwarding::Settings {
        uplinks,
        worker_mbps,
        steps,
        warm_start_steps,
        plan_epoch: plan_epoch.max(1),
    };
    let summary = forwarding::run(&harness::node_bin(run.bin)?, &settings, &run.out)?;
    print_summary(&summary, run.json);
    Ok(())
}

/// `testnet ablation`.
pub fn ablation(args: AblationArgs) -> anyhow::Result<()> {
    let AblationArgs {
        nodes,
        size_mb,
        pool,
        active,
        seconds,
        run: RunOpts { bin, json, out },
    } = args;
    anyhow::ensure!((1..=32).contains(&nodes), "--nodes in 1..=32");
    anyhow::ensure!(
        active >= 1 && active < pool && pool <= 12,
        "need 1 <= --active < --pool <= 12"
    );
    anyhow::ensure!(
        seconds >= 10.0 && size_mb > 0.0,
        "--seconds >= 10, --size-mb > 0"
    );
    let summary = ablation::run(
        &harness::node_bin(bin)?,
        nodes,
        size_mb,
        pool,
        active,
        seconds,
        &out,
    )?;
    print_summary(&summary, json);
    Ok(())
}

/// `testnet learning-plot`.
pub fn learning_plot(args: LearningPlotArgs) -> anyhow::Result<()> {
    let LearningPlotArgs {
        runs,
        window,
        prefix,
        out,
    } = args;
    let written = plot_step_logs(&runs, window, &prefix, &out)?;
    for w in written {
        eprintln!("wrote {}", w.display());
    }
    Ok(())
}

/// `testnet membership`.
pub fn membership(args: MembershipArgs) -> anyhow::Result<()> {
    let MembershipArgs {
        nodes,
        heartbeat_ms,
        seconds,
        run: RunOpts { bin, json, out },
    } = args;
    anyhow::ensure!(
        (100..=600_000).contains(&heartbeat_ms) && seconds > 0.0,
        "--heartbeat-ms within 100..=600000, --seconds > 0"
    );
    let bin = harness::node_bin(bin)?;
    let p = membership::Params {
        heartbeat_ms,
        seconds,
    };
    let v = membership::run(&bin, &nodes, &p)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("membership.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("writing {}", path.display()))?;
    print_summary(&v, json);
    Ok(())
}

/// `testnet sim-broadcast`.
pub fn sim_broadcast(args: SimBroadcastArgs) -> anyhow::Result<()> {
    let SimBroadcastArgs {
        nodes,
        size_mb,
        chunk_kb,
        worker_mbps,
        learner_mbps,
        mode,
        quantile,
        json,
        out,
        no_plot,
    } = args;
    anyhow::ensure!(
        size_mb > 0.0 && chunk_kb > 0,
        "--size-mb and --chunk-kb must be > 0"
    );
    anyhow::ensure!(
        worker_mbps > 0.0 && learner_mbps > 0.0,
        "bandwidths must be > 0"
    );
    anyhow::ensure!(
        quantile > 0.0 && quantile <= 1.0,
        "--quantile must be in (0, 1]"
    );
    anyhow::ensure!(nodes.iter().all(|n| *n > 0), "--nodes must be ≥ 1");
    let params = sim::Params {
        size_mb,
        chunk_kb,
        worker_mbps,
        learner_mbps,
        quantile,
    };
    let points: Vec<sim::Point> = nodes.iter().map(|&n| params.point(n, mode)).collect();
    let rows: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            serde_json::json!({
                "nodes": p.nodes, "t_bcast_s": p.t_bcast_s, "bound_s": p.bound_s,
                "n_chains": p.n_chains, "max_chain_len": p.max_chain_len,
            })
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({"scenario": "sim-broadcast", "results": rows})
        );
    } else {
        println!(
            "{:>6} {:>10} {:>10} {:>8} {:>8}",
            "N", "T_bcast s", "bound s", "chains", "max L"
        );
        for p in &points {
            println!(
                "{:>6} {:>10.3} {:>10.3} {:>8} {:>8}",
                p.nodes, p.t_bcast_s, p.bound_s, p.n_chains, p.max_chain_len
            );
        }
    }
    if !no_plot {
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("t_bcast_vs_n.png");
        params
            .chart(&nodes)
            .write_png(&path, 960, 600)
            .with_context(|| format!("writing {}", path.display()))?;
        // stderr, so that `--json` keeps stdout to one JSON line.
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A saved result file (`--from`).
fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))
}

/// The one-line JSON summary (`--json`) or a pretty one.
fn print_summary(v: &serde_json::Value, json: bool) {
    if json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

/// Reward and importance-weight-variance charts of learner step logs.
fn plot_step_logs(
    runs: &[String],
    window: usize,
    prefix: &str,
    out: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(window >= 1, "--window must be >= 1");
    std::fs::create_dir_all(out)?;
    let mut reward = Vec::new();
    let mut ivar = Vec::new();
    for r in runs {
        // The path is after the last '=' (names may contain '=', e.g. "S=3").
        let (name, path) = r
            .rsplit_once('=')
            .with_context(|| format!("--run {r}: expected NAME=PATH"))?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        let mut rows: Vec<(f64, f64, f64)> = Vec::new();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{path}:{}", i + 1))?;
            let st = &v["stats"];
            rows.push((
                (i + 1) as f64,
                st["reward_mean"].as_f64().unwrap_or(f64::NAN),
                st["importance_weight_variance"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            ));
        }
        let smooth = |f: fn(&(f64, f64, f64)) -> f64| -> Vec<(f64, f64)> {
            rows.windows(window.min(rows.len()).max(1))
                .map(|w| {
                    (
                        w[w.len() - 1].0,
                        w.iter().map(f).sum::<f64>() / w.len() as f64,
                    )
                })
                .collect()
        };
        reward.push(Series::solid(name, smooth(|r| r.1)));
        ivar.push(Series::solid(name, smooth(|r| r.2)));
    }
    let mut written = Vec::new();
    for (what, label, series) in [
        ("reward", "mean reward", reward),
        ("ivar", "importance-weight variance", ivar),
    ] {
        let path = out.join(format!("{prefix}-{what}.png"));
        Chart {
            title: format!("{label} per step ({window}-step moving average)"),
            x_label: "learner step".into(),
            y_label: label.into(),
            series,
            log_x: false,
            log_y: false,
        }
        .write_png(&path, 960, 600)?;
        written.push(path);
    }
    Ok(written)
}
