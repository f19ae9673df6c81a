//! The `broadcast` scenario: T_bcast of real `echo-node` processes on 127.0.0.1 against the
//! bound (`docs/broadcast.md`, "Multi-process: `testnet broadcast`").
//!
//! For every N: one learner started with the hidden benchmark flags
//! (`run --bench-broadcast-mb M --bench-workers N --bench-rounds R`) and N workers with
//! `--bench-sink`, bandwidth caps enforced in the nodes themselves (`network.learner_mbps` =
//! B0 on the learner, `uplink_mbps` = `downlink_mbps` = B̂w on the workers), chunk size c. The
//! learner publishes R snapshots of fresh random bytes through the real dissemination engine
//! and times each until every worker's heartbeat reports the install. T_bcast of a setting is
//! the median over its rounds, compared with [`bound_s`] — the ECHO-2 paper's chain and star
//! bounds, computed by `control::plan` (the one home of those formulas).
//!
//! With [`Wan`] settings (`--rtt-ms`, `--loss-pct`, `--jitter-ms`) every node runs in its own
//! network namespace on an emulated WAN link ([`crate::netlab::topo::WanStar`]): each packet
//! between two nodes crosses the sender's and the receiver's link, which together add the RTT,
//! the loss and the jitter asked for (`docs/netlab.md`). The rows then carry `rtt_ms`,
//! `loss_pct`, `jitter_ms` and the emulator's packet counts.
//!
//! Owns the scenario's settings, the bound, its result rows and its chart. Must not start,
//! signal or stop processes itself nor write node configs by hand: that is [`crate::harness`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::chart::{Chart, Series};
use crate::harness::{self, Fleet, NodeStatus, Role};

/// How a snapshot travels from the learner to the workers (the node's `broadcast.mode`).
pub use echo_node::config::BroadcastMode;

/// Bytes in a snapshot of `size_mb` MB: snapshot sizes are decimal megabytes (10⁶ bytes) on
/// every command line, as the node's `--bench-broadcast-mb` counts them.
pub fn snapshot_bytes(size_mb: f64) -> f64 {
    size_mb * 1e6
}

/// Bytes in a chunk of `chunk_kib` KiB: `--chunk-kb` is KiB (1024 bytes) in every scenario,
/// like the node's `storage.chunk_size_kib`.
pub fn chunk_bytes(chunk_kib: u32) -> f64 {
    control::units::kib_to_bytes(u64::from(chunk_kib)) as f64
}

/// The bound on T_bcast in seconds for `n` workers: chain `M/B̂w + (L − 1)·c/B̂w` with `L` =
/// `chain_len` the longest chain of the plan, star `max(M/B̂w, N·M/B0)` (`chain_len` ignored).
/// `broadcast` and `sim-broadcast` both compare against this one function.
pub fn bound_s(
    mode: BroadcastMode,
    size_mb: f64,
    chunk_kib: u32,
    worker_mbps: f64,
    learner_mbps: f64,
    n: usize,
    chain_len: usize,
) -> f64 {
    let size = snapshot_bytes(size_mb);
    match mode {
        BroadcastMode::Chain => {
            control::plan::chain_bound_s(size, chunk_bytes(chunk_kib), worker_mbps, chain_len)
        }
        BroadcastMode::Star => control::plan::star_bound_s(size, worker_mbps, learner_mbps, n),
    }
}

/// One sweep's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nodes: Vec<usize>,
    pub size_mb: f64,
    /// Chunk size in KiB.
    pub chunk_kb: u32,
    pub worker_mbps: f64,
    pub learner_mbps: f64,
    pub modes: Vec<BroadcastMode>,
    pub rounds: u32,
    pub bin: PathBuf,
    pub heartbeat_ms: u64,
    /// Emulated WAN conditions (nodes in network namespaces), or plain loopback.
    pub wan: Option<Wan>,
    /// Nodes listen on QUIC only (else TCP only).
    pub quic: bool,
    /// `network.restart_congestion` of every node (a fresh BBR model per push).
    pub restart_congestion: bool,
    /// `broadcast.warm_up_mib` of every node (`None`: the node default).
    pub warm_up_mib: Option<u64>,
    /// The learner's `broadcast.plan_epoch`.
    pub plan_epoch: u64,
    /// Publish bf16 versions as sparse deltas, this percentage of values changed per version
    /// (the first round is the keyframe); `None`: every round a whole random snapshot.
    pub delta_changed_pct: Option<f64>,
}

/// WAN conditions of a broadcast run: node-to-node round trip, per-direction loss, jitter.
#[derive(Debug, Clone, Copy)]
pub struct Wan {
    pub rtt_ms: f64,
    pub loss_pct: f64,
    pub jitter_ms: f64,
    /// Seed of the emulator's loss and jitter draws.
    pub seed: u64,
    /// The bandwidth caps are the emulated links' (each node's link serialises at its cap in
    /// both directions) rather than the workers' own token buckets.
    pub link_caps: bool,
}

/// Where the nodes of one setting run: the `echo-node` command for node `i` (0 = learner) and
/// the address it listens on.
struct Placement {
    star: Option<crate::netlab::topo::WanStar>,
    exes: Vec<PathBuf>,
    listen: Vec<String>,
}

impl Placement {
    fn new(s: &Settings, n: usize, root: &Path) -> anyhow::Result<Placement> {
        let on = |ip: &str| {
            if s.quic {
                format!("/ip4/{ip}/udp/0/quic-v1")
            } else {
                format!("/ip4/{ip}/tcp/0")
            }
        };
        let Some(w) = s.wan else {
            return Ok(Placement {
                star: None,
                exes: vec![s.bin.clone(); n + 1],
                listen: vec![on("127.0.0.1"); n + 1],
            });
        };
        let path = crate::netlab::emu::LinkParams::per_star_link(w.rtt_ms, w.loss_pct, w.jitter_ms);
        let params = |i| host_link(path, w.link_caps, s, i);
        let star = crate::netlab::topo::WanStar::new("bc", n + 1, params, w.seed, None)?;
        let bins = root.join("ns-bin");
        std::fs::create_dir_all(&bins)?;
        let mut exes = Vec::new();
        let mut listen = Vec::new();
        for (i, h) in star.hosts.iter().enumerate() {
            exes.push(crate::netlab::node_wrapper(
                &bins,
                &format!("node{i}"),
                &h.ns,
                &s.bin,
            )?);
            listen.push(on(&h.ip.to_string()));
        }
        Ok(Placement {
            star: Some(star),
            exes,
            listen,
        })
    }
}

/// The emulated link of host `i` (0 = the learner): the WAN path's delay, jitter and loss,
/// and with `link_caps` a serialisation rate of the host's cap (B0 for the learner, B̂w for a
/// worker).
fn host_link(
    path: crate::netlab::emu::LinkParams,
    link_caps: bool,
    s: &Settings,
    i: usize,
) -> crate::netlab::emu::LinkParams {
    let mbps = if i == 0 {
        s.learner_mbps
    } else {
        s.worker_mbps
    };
    crate::netlab::emu::LinkParams {
        rate_bps: link_caps.then_some(mbps * 1e6),
        ..path
    }
}

impl Settings {
    fn bound_s(&self, mode: BroadcastMode, n: usize, chain_len: usize) -> f64 {
        bound_s(
            mode,
            self.size_mb,
            self.chunk_kb,
            self.worker_mbps,
            self.learner_mbps,
            n,
            chain_len,
        )
    }
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

/// Starts the learner (benchmark role) and `n` sink workers of one setting under `root`;
/// returns the fleet and the learner's admin address.
fn launch(
    s: &Settings,
    mode: BroadcastMode,
    n: usize,
    root: &Path,
    at: &Placement,
) -> anyhow::Result<(Fleet, String)> {
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = harness::keygen(&s.bin, &ldir)?;
    let config = |role, dir: &Path| {
        let mut c = harness::node_config(role, "tn-broadcast", dir, s.heartbeat_ms);
        c.storage.chunk_size_kib = s.chunk_kb;
        c.storage.keep_snapshots = 2;
        c.broadcast.mode = mode;
        c.broadcast.worker_mbps = s.worker_mbps;
        c.network.quic = s.quic;
        c.network.restart_congestion = s.restart_congestion;
        if let Some(mib) = s.warm_up_mib {
            c.broadcast.warm_up_mib = mib;
        }
        c.broadcast.plan_epoch = s.plan_epoch;
        c
    };
    let mut learner = config(Role::Learner, &ldir);
    learner.network.learner_mbps = s.learner_mbps;
    learner.network.listen = vec![at.listen[0].clone()];
    let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
    let bench = [
        "--bench-broadcast-mb".to_string(),
        s.size_mb.to_string(),
        "--bench-workers".into(),
        n.to_string(),
        "--bench-rounds".into(),
        s.rounds.to_string(),
    ];
    let delta = s
        .delta_changed_pct
        .map(|p| ["--bench-delta-changed-pct".to_string(), p.to_string()]);
    let bench: Vec<String> = bench
        .into_iter()
        .chain(delta.into_iter().flatten())
        .collect();
    let l = fleet.start(&at.exes[0], "learner", &learner, &bench)?;
    let addrs = fleet.wait_addresses(l, &learner, harness::START_LIMIT)?;
    let bootstrap = addrs
        .dial_addr_on(if s.quic { "/quic-v1" } else { "/tcp/" })
        .context("the learner has no address of the chosen transport")?;
    for i in 0..n {
        let mut w = config(Role::Rollout, &root.join(format!("w{i}")));
        w.learner_public_key = Some(key.clone());
        w.network.bootstrap = vec![bootstrap.clone()];
        // With link caps the worker's own buckets are off: its link is the cap.
        let own_cap = if s.wan.is_some_and(|w| w.link_caps) {
            0.0
        } else {
            s.worker_mbps
        };
        w.network.uplink_mbps = own_cap;
        w.network.downlink_mbps = own_cap;
        w.network.listen = vec![at.listen[i + 1].clone()];
        fleet.start(
            &at.exes[i + 1],
            &format!("w{i}"),
            &w,
            &["--bench-sink".into()],
        )?;
    }
    Ok((fleet, addrs.admin))
}

/// Runs one setting (N workers, one mode); returns its result row.
pub fn run_one(s: &Settings, mode: BroadcastMode, n: usize, root: &Path) -> anyhow::Result<Value> {
    let mut at = Placement::new(s, n, root)?;
    let (mut fleet, admin) = launch(s, mode, n, root, &at)?;
    // The admin endpoint is on the learner's loopback: in a namespace, ask from inside it.
    let status_bin = at.exes[0].clone();
    let limit = Duration::from_secs(240 + u64::from(s.rounds) * 120);
    let bench = harness::poll(limit, Duration::from_millis(500), || {
        fleet.ensure_running()?;
        Ok(harness::read_status(&status_bin, &admin)
            .and_then(|st: NodeStatus| st.bench)
            .filter(|b| b.done))
    })?;
    let Some(bench) = bench else {
        bail!(
            "N = {n} {}: the benchmark did not finish within {limit:?}; logs in {}",
            mode.as_str(),
            root.display()
        );
    };
    fleet.stop(harness::STOP_GRACE);
    let packets = match at.star.as_mut() {
        Some(star) => star.stop()?.to_json(),
        None => Value::Null,
    };
    drop(at);
    let rounds = bench.rounds;
    let chain_len = rounds
        .iter()
        .flat_map(|r| r.chain_lengths.iter().copied())
        .max()
        .unwrap_or(1);
    let n_chains = rounds.first().map(|r| r.n_chains);
    let sizes = RoundSizes::of(&rounds);
    // The bound of a round is that of the bytes it sent: a delta round's is the delta's.
    let bound_of = |bytes: f64| {
        let at = Settings {
            size_mb: bytes / 1e6,
            ..s.clone()
        };
        at.bound_s(mode, n, chain_len)
    };
    let bound = bound_of(sizes.bytes_per_version);
    // The first round on its own: connections, streams and congestion windows start cold
    // there (docs/netlab.md), and a swarm's first snapshot — and every new worker's — is its
    // biggest transfer (with deltas, the keyframe); the later rounds' median says what a warm
    // swarm pays.
    let first = rounds.first().and_then(|r| r.t_bcast_all_s);
    let first_bound = rounds.first().map(|r| bound_of(r.bytes as f64));
    let later = median(
        rounds
            .iter()
            .skip(1)
            .filter_map(|r| r.t_bcast_all_s)
            .collect(),
    );
    // T_bcast is the median of the rounds that send `bytes_per_version`: with deltas, the
    // delta rounds (the keyframe is the first round, reported on its own).
    let typical = |r: &&echo_node::api::BenchRound| !sizes.delta || r.delta;
    let t = median(
        rounds
            .iter()
            .filter(typical)
            .filter_map(|r| r.t_bcast_all_s)
            .collect(),
    );
    let t_q = median(
        rounds
            .iter()
            .filter(typical)
            .filter_map(|r| r.t_bcast_q_s)
            .collect(),
    );
    Ok(json!({
        "mode": mode.as_str(), "nodes": n, "t_bcast_s": t, "t_bcast_q_s": t_q,
        "bound_s": bound, "ratio_to_bound": t.map(|t| t / bound),
        "bytes_per_version": sizes.bytes_per_version, "full_bytes": sizes.full_bytes,
        "delta": sizes.delta, "changed_pct": s.delta_changed_pct,
        "t_bcast_first_s": first, "bound_first_s": first_bound,
        "first_ratio_to_bound": first.zip(first_bound).map(|(t, b)| t / b),
        "t_bcast_later_s": later, "later_ratio_to_bound": later.map(|t| t / bound),
        "installed": n, "n_chains": n_chains, "longest_chain": chain_len,
        "rtt_ms": s.wan.map(|w| w.rtt_ms), "loss_pct": s.wan.map(|w| w.loss_pct),
        "jitter_ms": s.wan.map(|w| w.jitter_ms), "link_caps": s.wan.map(|w| w.link_caps),
        "emulator_packets": packets,
        "rounds": rounds,
    }))
}

/// The payload sizes of a run's rounds: the median bytes sent per version (with deltas, over
/// the delta rounds) and the full snapshot's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RoundSizes {
    bytes_per_version: f64,
    full_bytes: f64,
    /// Some round went out as a delta.
    delta: bool,
}

impl RoundSizes {
    fn of(rounds: &[echo_node::api::BenchRound]) -> RoundSizes {
        let delta = rounds.iter().any(|r| r.delta);
        let sent = rounds
            .iter()
            .filter(|r| !delta || r.delta)
            .map(|r| r.bytes as f64)
            .collect();
        let full = rounds
            .iter()
            .map(|r| r.full_bytes.max(r.bytes) as f64)
            .collect();
        RoundSizes {
            bytes_per_version: median(sent).unwrap_or(0.0),
            full_bytes: median(full).unwrap_or(0.0),
            delta,
        }
    }
}

/// Runs every (mode, N) of the settings; writes `broadcast.json` (all rows) and
/// `broadcast.png` (T_bcast and bound vs N per mode) under `out`; returns the summary.
pub fn sweep(s: &Settings, out: &Path, verbose: bool) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let mut rows = Vec::new();
    let bar = crate::progress::bar((s.modes.len() * s.nodes.len()) as u64, "broadcast settings");
    for &mode in &s.modes {
        for &n in &s.nodes {
            bar.set_message(format!("{} N={n}", mode.as_str()));
            let row = harness::in_run_dir("tn-broadcast-", |dir| run_one(s, mode, n, dir))?;
            if verbose {
                bar.suspend(|| {
                    println!(
                        "{:>5} N={n:<3} T_bcast {:>7.2}s  (1/γ of workers {:>6.2}s)  bound {:>6.2}s  ratio {:.2} (first round {:.2})  chains {}  L {}",
                        mode.as_str(),
                        row["t_bcast_s"].as_f64().unwrap_or(f64::NAN),
                        row["t_bcast_q_s"].as_f64().unwrap_or(f64::NAN),
                        row["bound_s"].as_f64().unwrap_or(f64::NAN),
                        row["ratio_to_bound"].as_f64().unwrap_or(f64::NAN),
                        row["first_ratio_to_bound"].as_f64().unwrap_or(f64::NAN),
                        row["n_chains"],
                        row["longest_chain"]
                    )
                });
            }
            rows.push(row);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let settings = json!({"size_mb": s.size_mb, "chunk_kb": s.chunk_kb, "worker_mbps": s.worker_mbps,
        "learner_mbps": s.learner_mbps, "rounds": s.rounds, "heartbeat_ms": s.heartbeat_ms,
        "rtt_ms": s.wan.map(|w| w.rtt_ms), "loss_pct": s.wan.map(|w| w.loss_pct),
        "jitter_ms": s.wan.map(|w| w.jitter_ms), "link_caps": s.wan.map(|w| w.link_caps),
        "quic": s.quic, "restart_congestion": s.restart_congestion,
        "warm_up_mib": s.warm_up_mib.unwrap_or(echo_node::config::BroadcastConfig::default().warm_up_mib),
        "plan_epoch": s.plan_epoch,
        "delta_changed_pct": s.delta_changed_pct});
    let full = json!({"scenario": "broadcast", "settings": settings, "results": rows});
    let json_path = out.join("broadcast.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&full)?)?;
    let png = out.join("broadcast.png");
    chart(&full)?.write_png(&png, 960, 600)?;
    if verbose {
        eprintln!("wrote {} and {}", json_path.display(), png.display());
    }
    Ok(summary(&full))
}

/// Re-draws `broadcast.png` under `out` from a saved `broadcast.json`; returns its summary.
pub fn replot(full: &Value, out: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    chart(full)?.write_png(&out.join("broadcast.png"), 960, 600)?;
    Ok(summary(full))
}

/// The `--json` summary of a full result: settings and one brief row per run.
fn summary(full: &Value) -> Value {
    let brief: Vec<Value> = full["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            json!({"mode": r["mode"], "nodes": r["nodes"], "t_bcast_s": r["t_bcast_s"],
            "bound_s": r["bound_s"], "installed": r["installed"], "n_chains": r["n_chains"],
            "bytes_per_version": r["bytes_per_version"], "full_bytes": r["full_bytes"],
            "t_bcast_first_s": r["t_bcast_first_s"], "bound_first_s": r["bound_first_s"],
            "rtt_ms": r["rtt_ms"], "loss_pct": r["loss_pct"]})
        })
        .collect();
    json!({"scenario": "broadcast", "settings": full["settings"], "results": brief,
        "rtt_ms": full["settings"]["rtt_ms"], "loss_pct": full["settings"]["loss_pct"]})
}

/// T_bcast (measured) and the bound vs N, per mode in the order of the rows, log-log.
fn chart(full: &Value) -> anyhow::Result<Chart> {
    let rows = full["results"]
        .as_array()
        .context("not a broadcast result: no `results` array")?;
    let mut modes: Vec<&str> = Vec::new();
    for m in rows.iter().filter_map(|r| r["mode"].as_str()) {
        if !modes.contains(&m) {
            modes.push(m);
        }
    }
    let mut series = Vec::new();
    for mode in modes {
        let pick = |key: &str| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r["mode"] == mode)
                .filter_map(|r| Some((r["nodes"].as_f64()?, r[key].as_f64()?)))
                .collect()
        };
        series.push(Series::solid(
            format!("{mode} (measured)"),
            pick("t_bcast_s"),
        ));
        series.push(Series::dashed(format!("{mode} bound"), pick("bound_s")));
    }
    let st = &full["settings"];
    let num = |k: &str| st[k].as_f64().unwrap_or(f64::NAN);
    Ok(Chart {
        title: match st["rtt_ms"].as_f64() {
            Some(rtt) => format!(
                "T_bcast of {} MB, emulated WAN (RTT {rtt} ms, loss {} %), Bw {} / B0 {} Mbit/s",
                num("size_mb"),
                st["loss_pct"].as_f64().unwrap_or(0.0),
                num("worker_mbps"),
                num("learner_mbps")
            ),
            None => format!(
                "T_bcast of {} MB on loopback, Bw {} / B0 {} Mbit/s",
                num("size_mb"),
                num("worker_mbps"),
                num("learner_mbps")
            ),
        },
        x_label: "rollout workers N".into(),
        y_label: "T_bcast (s)".into(),
        series,
        log_x: true,
        log_y: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_use_decimal_megabytes_and_kibibyte_chunks() {
        // M = 64 MB, c = 1024 KiB, B̂w = 100 Mbit/s, L = 2: 5.12 s + 1 MiB / 12.5 MB/s.
        let chain = bound_s(BroadcastMode::Chain, 64.0, 1024, 100.0, 300.0, 4, 2);
        assert!(
            (chain - (5.12 + 1_048_576.0 / 12.5e6)).abs() < 1e-12,
            "{chain}"
        );
        // Star at N = 8 over B0 = 300 Mbit/s: 8 · 64 MB / 37.5 MB/s.
        let star = bound_s(BroadcastMode::Star, 64.0, 1024, 100.0, 300.0, 8, 99);
        assert!((star - 8.0 * 64e6 / 37.5e6).abs() < 1e-12, "{star}");
        // The saved run of docs/broadcast.md: N = 4 chain, L = 2.
        assert!(
            (bound_s(BroadcastMode::Chain, 64.0, 1024, 100.0, 300.0, 4, 2) - 5.20388608).abs()
                < 1e-9
        );
    }

    #[test]
    fn link_caps_put_b0_on_the_learners_link_and_bw_on_each_workers() {
        let s = Settings {
            nodes: vec![2],
            size_mb: 16.0,
            chunk_kb: 1024,
            worker_mbps: 100.0,
            learner_mbps: 300.0,
            modes: vec![BroadcastMode::Chain],
            rounds: 1,
            bin: PathBuf::new(),
            heartbeat_ms: 500,
            wan: None,
            quic: false,
            restart_congestion: true,
            warm_up_mib: None,
            plan_epoch: control::seats::EPOCH_VERSIONS,
            delta_changed_pct: None,
        };
        let path = crate::netlab::emu::LinkParams::per_star_link(100.0, 0.5, 0.0);
        let rates: Vec<_> = (0..3)
            .map(|i| host_link(path, true, &s, i).rate_bps)
            .collect();
        assert_eq!(rates, [Some(300e6), Some(100e6), Some(100e6)]);
        let plain = host_link(path, false, &s, 1);
        assert_eq!(
            (plain.rate_bps, plain.delay, plain.loss),
            (None, path.delay, path.loss)
        );
    }

    fn round(bytes: usize, full_bytes: usize, delta: bool) -> echo_node::api::BenchRound {
        echo_node::api::BenchRound {
            round: 0,
            version: 1,
            bytes,
            full_bytes,
            delta,
            changed_frac: None,
            prepare_s: 0.0,
            t_bcast_all_s: Some(1.0),
            t_bcast_q_s: None,
            n_chains: 1,
            chain_lengths: vec![2],
            fetch_only: 0,
            learner_pushed_bytes: 0,
            learner_served_bytes: 0,
        }
    }

    /// With deltas the bytes per version are the delta rounds' (the keyframe is not a
    /// typical version); without, every round's; a row from a node that predates
    /// `full_bytes` counts what it sent.
    #[test]
    fn bytes_per_version_is_the_delta_rounds_median() {
        let delta = [
            round(64_000_000, 64_000_000, false),
            round(900_000, 64_000_000, true),
            round(1_000_000, 64_000_000, true),
            round(1_100_000, 64_000_000, true),
        ];
        let s = RoundSizes::of(&delta);
        assert_eq!(
            (s.bytes_per_version, s.full_bytes, s.delta),
            (1_000_000.0, 64_000_000.0, true)
        );
        let whole = [round(64_000_000, 0, false), round(64_000_000, 0, false)];
        let s = RoundSizes::of(&whole);
        assert_eq!(
            (s.bytes_per_version, s.full_bytes, s.delta),
            (64e6, 64e6, false)
        );
    }

    #[test]
    fn the_chart_has_a_measured_and_a_bound_series_per_mode() {
        let full = json!({"settings": {"size_mb": 64.0, "worker_mbps": 100.0, "learner_mbps": 300.0},
        "results": [
            {"mode": "chain", "nodes": 4, "t_bcast_s": 5.6, "bound_s": 5.2},
            {"mode": "star", "nodes": 4, "t_bcast_s": 7.0, "bound_s": 6.8},
            {"mode": "chain", "nodes": 8, "t_bcast_s": 6.6, "bound_s": 5.3},
        ]});
        let c = chart(&full).unwrap();
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "chain (measured)",
                "chain bound",
                "star (measured)",
                "star bound"
            ]
        );
        assert_eq!(c.series[0].points, [(4.0, 5.6), (8.0, 6.6)]);
        assert!(c.series[1].dashed && !c.series[0].dashed);
        assert_eq!(summary(&full)["results"].as_array().unwrap().len(), 3);
        assert!(chart(&json!({})).is_err());
    }
}
