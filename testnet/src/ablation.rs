//! The `ablation` scenario (`docs/experiments.md`, "Ablation"; the ECHO-2 paper's §5.5): what
//! each part of the system buys.
//!
//! - **No P2P**: T_bcast of one snapshot with forwarding chains (`full`) against the learner
//!   sending to every worker itself (`nop2p`, star), same N, caps and payload (the `broadcast`
//!   harness).
//! - **Random activation**: a mixed-price pool (costs 0.1 … 3.2 $/h, doubling) of which the
//!   scheduler keeps K active for the same time budget, choosing by ρ = cost/μ (`full`) or in
//!   a fixed random order (`random`). Cost per step = mean cost rate of the active workers ×
//!   elapsed hours / learner steps.
//!
//! Owns the comparisons and their summary. Must not start, signal or stop processes itself
//! (that is [`crate::harness`]'s job) nor draw charts by hand ([`crate::chart`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Value};

use crate::broadcast::{self, BroadcastMode};
use crate::harness::{self, read_status};
use echo_node::config::Ranking;

/// One learning run; returns (steps, mean active $/h, seconds, active ids at the end).
fn cost_run(
    bin: &Path,
    root: &Path,
    ranking: Ranking,
    costs: &[f64],
    k: usize,
    secs: f64,
) -> anyhow::Result<Value> {
    let mut sw = harness::launch_swarm(
        bin,
        root,
        "tn-ablation",
        |l| {
            l.learner.warm_start_steps = 60;
            l.scheduler.enabled = true;
            l.scheduler.active_workers = Some(k);
            l.scheduler.ranking = ranking;
            l.scheduler.announce_interval_ms = 500;
        },
        costs,
    )?;
    // Warm-up: training has started and the scheduler has put the rest on standby.
    let start_version = harness::poll(Duration::from_secs(300), Duration::from_secs(1), || {
        let l = read_status(bin, &sw.learner_admin).and_then(|st| st.learner);
        Ok(
            l.filter(|l| l.scheduler.standby.len() == costs.len() - k && l.version >= 5)
                .map(|l| l.version),
        )
    })?;
    let Some(start_version) = start_version else {
        bail!("{ranking}: the swarm did not start training within 300 s");
    };
    let t0 = Instant::now();
    let (mut cost_sum, mut n) = (0.0, 0u32);
    let mut last = None;
    while t0.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(l) = read_status(bin, &sw.learner_admin).and_then(|st| st.learner) {
            if l.scheduler.enabled {
                cost_sum += l.scheduler.active_cost_per_hour;
                n += 1;
            }
            last = Some(l);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    sw.fleet.stop(harness::STOP_GRACE);
    let steps = last.as_ref().map_or(start_version, |l| l.version) - start_version;
    let rate = if n > 0 {
        cost_sum / f64::from(n)
    } else {
        f64::NAN
    };
    Ok(
        json!({"ranking": ranking, "steps": steps, "seconds": elapsed,
        "active_cost_per_hour": rate,
        "cost_per_step": if steps > 0 { rate * elapsed / 3600.0 / steps as f64 } else { f64::NAN },
        "active": last.map(|l| l.scheduler.active)}),
    )
}

/// Runs the scenario; writes `ablation.json` under `out`.
pub fn run(
    bin: &Path,
    nodes: usize,
    size_mb: f64,
    pool: usize,
    active: usize,
    secs: f64,
    out: &Path,
) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let settings = broadcast::Settings {
        nodes: vec![nodes],
        size_mb,
        chunk_kb: 1024,
        worker_mbps: 100.0,
        learner_mbps: 300.0,
        modes: vec![BroadcastMode::Chain, BroadcastMode::Star],
        rounds: 1,
        bin: bin.to_path_buf(),
        heartbeat_ms: 500,
        wan: None,
        quic: false,
        restart_congestion: true,
        warm_up_mib: None,
        plan_epoch: control::seats::EPOCH_VERSIONS,
        delta_changed_pct: None,
    };
    let bar = crate::progress::bar(4, "ablation runs");
    let mut t = Vec::new();
    for mode in [BroadcastMode::Chain, BroadcastMode::Star] {
        bar.set_message(format!("broadcast, {}", mode.as_str()));
        t.push(harness::in_run_dir("tn-ablation-bc-", |dir| {
            broadcast::run_one(&settings, mode, nodes, dir)
        })?);
        bar.inc(1);
    }
    let costs: Vec<f64> = (0..pool).map(|i| 0.1 * 2f64.powi(i as i32)).collect();
    bar.set_message("activation by cost/μ");
    let full = harness::in_run_dir("tn-ablation-", |dir| {
        cost_run(bin, dir, Ranking::Rho, &costs, active, secs)
    })?;
    bar.inc(1);
    bar.set_message("random activation");
    let random = harness::in_run_dir("tn-ablation-", |dir| {
        cost_run(bin, dir, Ranking::Random, &costs, active, secs)
    })?;
    bar.finish_and_clear();
    let summary = json!({
        "scenario": "ablation",
        "t_bcast_full_s": t[0]["t_bcast_s"], "t_bcast_nop2p_s": t[1]["t_bcast_s"],
        "cost_per_step_full": full["cost_per_step"], "cost_per_step_random": random["cost_per_step"],
        "steps_full": full["steps"], "steps_random": random["steps"],
        "active_cost_per_hour_full": full["active_cost_per_hour"],
        "active_cost_per_hour_random": random["active_cost_per_hour"],
    });
    let detail = json!({"summary": summary, "broadcast": t, "pool_costs": costs,
        "active_workers": active, "seconds": secs, "full": full, "random": random});
    std::fs::write(
        out.join("ablation.json"),
        serde_json::to_vec_pretty(&detail)?,
    )?;
    Ok(summary)
}
