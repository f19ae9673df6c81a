//! The `membership` scenario: what membership alone costs a node. For each N it starts N real
//! `echo-node` rollout workers on 127.0.0.1 that have nothing to do (their learner key
//! belongs to no running node, so no snapshot ever arrives and they never generate), waits
//! until node 0 hears all the others, then samples every process's `utime + stime`
//! (`/proc/<pid>/stat`) over `seconds`. What remains is heartbeats (signature checks of
//! every copy gossipsub delivers, decoding, the peer table), identify, Kademlia and ping.
//!
//! Owns: that scenario and its JSON. Must not touch: the nodes' behaviour (it only reads
//! their `/status` and `/proc`), the process fleet (`harness`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::harness::{self, Fleet, Role};

/// One N of the sweep.
pub struct Params {
    pub heartbeat_ms: u64,
    /// Sampling window once the swarm has settled.
    pub seconds: f64,
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).context("no utime")?.parse()?;
    let stime: u64 = f.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The sum of every sample of the `/metrics` counter family whose name ends in `family`
/// (gossipsub's `topic_msg_recv_counts_unfiltered`: every copy received;
/// `topic_msg_recv_counts`: after duplicate suppression), over all topics.
fn metric_sum(admin: &str, family: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let mut sum = 0.0;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = name.split('{').next().unwrap_or(name);
        let metric = metric.strip_suffix("_total").unwrap_or(metric);
        if metric.ends_with(family) {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    Some(sum)
}

/// Runs one N: returns its JSON row.
pub fn run_one(bin: &Path, n: usize, p: &Params) -> anyhow::Result<Value> {
    anyhow::ensure!(n >= 2, "--nodes must be ≥ 2");
    harness::in_run_dir("echo-membership-", |root| {
        let kdir = root.join("absent-learner");
        std::fs::create_dir_all(&kdir)?;
        let key = harness::keygen(bin, &kdir)?;
        let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
        let mut nodes = Vec::new();
        let mut bootstrap = Vec::new();
        for i in 0..n {
            let dir = root.join(format!("n{i}"));
            let mut c = harness::node_config(Role::Rollout, "membership", &dir, p.heartbeat_ms);
            c.learner_public_key = Some(key.clone());
            c.network.bootstrap = bootstrap.clone();
            let idx = fleet.start(bin, &format!("n{i}"), &c, &[])?;
            let a = fleet.wait_addresses(idx, &c, harness::START_LIMIT)?;
            if i == 0 {
                bootstrap = vec![a.dial_addr().context("node 0 has no TCP address")?];
            }
            nodes.push(a);
        }
        // Settled: node 0 hears every other node.
        let admin0 = nodes[0].admin.clone();
        let settle = Instant::now();
        let heard = harness::poll(Duration::from_secs(180), Duration::from_secs(1), || {
            Ok(harness::read_status(bin, &admin0).and_then(|s| {
                let active = s.network.peers.iter().filter(|p| p.active).count();
                (active + 1 >= n).then_some(active)
            }))
        })?;
        let settle_s = settle.elapsed().as_secs_f64();
        let before0 = harness::read_status(bin, &admin0).context("node 0 status")?;
        let copies0 = metric_sum(&admin0, "topic_msg_recv_counts_unfiltered");
        let unique0 = metric_sum(&admin0, "topic_msg_recv_counts");
        let t0 = Instant::now();
        let ticks0: Vec<u64> = nodes
            .iter()
            .map(|a| cpu_ticks(a.pid))
            .collect::<anyhow::Result<_>>()?;
        std::thread::sleep(Duration::from_secs_f64(p.seconds));
        let ticks1: Vec<u64> = nodes
            .iter()
            .map(|a| cpu_ticks(a.pid))
            .collect::<anyhow::Result<_>>()?;
        let secs = t0.elapsed().as_secs_f64();
        let after0 = harness::read_status(bin, &admin0).context("node 0 status")?;
        let copies1 = metric_sum(&admin0, "topic_msg_recv_counts_unfiltered");
        let unique1 = metric_sum(&admin0, "topic_msg_recv_counts");
        // Copies of each gossip message node 0 received (each one signature-checked).
        let copies_per_message = match (copies0, copies1, unique0, unique1) {
            (Some(c0), Some(c1), Some(u0), Some(u1)) if u1 > u0 => Some((c1 - c0) / (u1 - u0)),
            _ => None,
        };
        let tck = clk_tck();
        let per_node: Vec<f64> = ticks0
            .iter()
            .zip(&ticks1)
            .map(|(a, b)| (b - a) as f64 / tck / secs)
            .collect();
        let mean = per_node.iter().sum::<f64>() / n as f64;
        let max = per_node.iter().cloned().fold(0.0, f64::max);
        let hb_rx = (after0.network.counters.heartbeats_received
            - before0.network.counters.heartbeats_received) as f64
            / secs;
        let hb_tx = (after0.network.counters.heartbeats_sent
            - before0.network.counters.heartbeats_sent) as f64
            / secs;
        fleet.stop(harness::STOP_GRACE);
        Ok(json!({
            "nodes": n,
            "heartbeat_ms": p.heartbeat_ms,
            "settled": heard.is_some(),
            "settle_s": settle_s,
            "sample_s": secs,
            "cpu_core_fraction_mean": mean,
            "cpu_core_fraction_max": max,
            "node0_heartbeats_received_per_s": hb_rx,
            "node0_heartbeats_sent_per_s": hb_tx,
            "node0_copies_per_message": copies_per_message,
        }))
    })
}

/// The sweep: one row per N.
pub fn run(bin: &Path, nodes: &[usize], p: &Params) -> anyhow::Result<Value> {
    let rows = nodes
        .iter()
        .map(|&n| {
            let r = run_one(bin, n, p)?;
            eprintln!("{r}");
            Ok(r)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(json!({"scenario": "membership", "results": rows}))
}
