//! The `forwarding` scenario (`docs/adversary.md`, "Heterogeneous clean run"): is an honest
//! slow link ever mistaken for an attack? A learner and honest workers of different uplinks
//! (`--uplinks`, Mbit/s; one at a tenth of the others by default) in one chain of plan epochs
//! short enough that every worker forwards within the run, real `echo-node run` processes on
//! 127.0.0.1. It reports the strikes and bans any node counted against any peer (the aim:
//! none), whom the learner's forwarding accounts demoted (a slow link may be), the
//! forwarding verdicts, the honest workers' install ratio and T_bcast.
//!
//! Owns the schedule and the report. Must not start, signal or stop processes itself: it asks
//! [`crate::harness::Fleet`] to.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::adversary::{http_get, settle_installs, status, trained_by_producer, InstallWatch};
use crate::harness::{self, Fleet, Role, START_LIMIT};

/// What to run.
pub struct Settings {
    /// Each worker's `network.uplink_mbps` (0: no cap).
    pub uplinks: Vec<f64>,
    /// B̂w (`broadcast.worker_mbps`), also B0: one chain.
    pub worker_mbps: f64,
    pub steps: u64,
    pub warm_start_steps: usize,
    /// Versions per plan epoch.
    pub plan_epoch: u64,
}

const HEARTBEAT_MS: u64 = 500;

/// Strikes and bans counted by one node against any peer (`observer: peer strikes` lines).
fn strikes_seen(st: &Value, observer: &str) -> (u64, u64, Vec<String>) {
    let (mut strikes, mut bans, mut lines) = (0, 0, Vec::new());
    for p in st["peers"].as_array().into_iter().flatten() {
        let n = p["strikes"].as_u64().unwrap_or(0);
        let banned = p["banned"].as_bool() == Some(true);
        if n > 0 || banned {
            let id = p["peer_id"].as_str().unwrap_or("?");
            lines.push(format!(
                "{observer}: {id} strikes {n} {:?}{}",
                p["strikes_by_reason"],
                if banned { " banned" } else { "" }
            ));
        }
        strikes += n;
        bans += u64::from(banned);
    }
    (strikes, bans, lines)
}

/// Runs the scenario; writes `forwarding.json` under `out` and returns the summary.
pub fn run(bin: &Path, s: &Settings, out: &Path) -> anyhow::Result<Value> {
    anyhow::ensure!(
        s.uplinks.len() >= 2 && s.steps >= 1,
        "--uplinks needs two or more workers"
    );
    std::fs::create_dir_all(out)?;
    let summary = harness::in_run_dir("tn-forwarding-", |root| run_once(bin, root, s))?;
    let path = out.join("forwarding.json");
    std::fs::write(&path, format!("{summary:#}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(summary)
}

fn run_once(bin: &Path, root: &Path, s: &Settings) -> anyhow::Result<Value> {
    let swarm = "tn-forwarding";
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = harness::keygen(bin, &ldir)?;
    let mut lc = harness::node_config(Role::Learner, swarm, &ldir, HEARTBEAT_MS);
    lc.learner.warm_start_steps = s.warm_start_steps;
    lc.learner.max_steps = s.steps;
    lc.broadcast.worker_mbps = s.worker_mbps;
    lc.broadcast.plan_epoch = s.plan_epoch;
    lc.network.learner_mbps = s.worker_mbps;
    lc.storage.chunk_size_kib = 64;
    let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
    let li = fleet.start(bin, "learner", &lc, &[])?;
    let laddr = fleet.wait_addresses(li, &lc, START_LIMIT)?;
    let bootstrap = laddr
        .dial_addr()
        .context("the learner has no TCP address")?;
    let mut workers = Vec::new();
    for (i, up) in s.uplinks.iter().enumerate() {
        let name = format!("w{i}");
        let mut c = harness::node_config(Role::Rollout, swarm, &root.join(&name), HEARTBEAT_MS);
        c.learner_public_key = Some(key.clone());
        c.network.bootstrap = vec![bootstrap.clone()];
        c.network.uplink_mbps = *up;
        c.broadcast.worker_mbps = s.worker_mbps;
        c.storage.max_pending_groups = 4;
        workers.push((fleet.start(bin, &name, &c, &[])?, c));
    }
    let mut admins = Vec::new();
    let mut ids = Vec::new();
    for (i, c) in &workers {
        let f = fleet.wait_addresses(*i, c, START_LIMIT)?;
        admins.push(f.admin);
        ids.push(f.peer_id);
    }
    let limit = Duration::from_secs(180 + 20 * s.steps + 2 * s.warm_start_steps as u64);
    let t0 = Instant::now();
    let mut installs = InstallWatch::default();
    let mut timed_out = false;
    let last = loop {
        std::thread::sleep(Duration::from_secs(1));
        anyhow::ensure!(fleet.exit_status(li).is_none(), "the learner exited");
        let Some(ls) = status(&laddr.admin) else {
            continue;
        };
        installs.sample(&ls, &admins, false);
        if ls["learner"]["version"].as_u64().unwrap_or(0) >= s.steps {
            break ls;
        }
        if t0.elapsed() > limit {
            eprintln!("forwarding: did not reach {} steps in {limit:?}", s.steps);
            timed_out = true;
            break ls;
        }
    };
    settle_installs(&laddr.admin, &admins, &mut installs, |_| {});
    let learner = status(&laddr.admin).unwrap_or(last);
    let trained = http_get(&laddr.admin, "/metrics")
        .map(|m| trained_by_producer(&m))
        .unwrap_or_default();
    let (mut strikes, mut bans, mut seen) = strikes_seen(&learner, "learner");
    let mut rows = Vec::new();
    for (i, admin) in admins.iter().enumerate() {
        let st = status(admin).unwrap_or(Value::Null);
        let (n, b, lines) = strikes_seen(&st, &format!("w{i}"));
        strikes += n;
        bans += b;
        seen.extend(lines);
        let id = &ids[i];
        let row = learner["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["peer_id"].as_str() == Some(id));
        rows.push(json!({
            "worker": format!("w{i}"),
            "peer_id": id,
            "uplink_mbps": s.uplinks[i],
            "installed_version": st["version"],
            "install_lag": row.map(|r| r["install_lag"].clone()),
            "score": row.map(|r| r["score"].clone()),
            "demoted": learner["forwarding"]["demoted"][id],
            "groups_trained": trained.get(id),
        }));
    }
    let unclean = fleet.stop(harness::STOP_GRACE);
    if !unclean.is_empty() {
        eprintln!("forwarding: nodes that did not stop cleanly: {unclean:?}");
    }
    let l = &learner["learner"];
    Ok(json!({
        "steps": l["version"],
        "timed_out": timed_out,
        "uplinks_mbps": s.uplinks,
        "worker_mbps": s.worker_mbps,
        "strikes": strikes,
        "bans": bans,
        "strikes_seen": seen,
        "honest_install_ratio": installs.ratio(),
        "snapshots_published": l["snapshots_published"],
        "t_bcast_s": l["t_bcast_s"],
        "t_bcast_lower_bound": l["t_bcast_lower_bound"],
        "forwarding": learner["forwarding"],
        "workers": rows,
    }))
}
