//! The `broadcast` scenario (SPEC §12–13, issue 4): real `echo-node` processes on 127.0.0.1.
//!
//! For every N: one learner started with the hidden benchmark flags
//! (`run --bench-broadcast-mb M --bench-workers N --bench-rounds R`) and N workers with
//! `--bench-sink`, bandwidth caps enforced in the nodes themselves (`network.learner_mbps` =
//! B0 on the learner, `uplink_mbps` = `downlink_mbps` = B̂w on the workers), chunk size c. The
//! learner publishes R snapshots of fresh random bytes through the real dissemination engine
//! and times each until every worker's heartbeat reports the install. T_bcast of a setting is
//! the median over its rounds, compared with the bound of SPEC §13:
//! chain `M/B̂w + (L−1)·c/B̂w` (L = the longest chain of the plan), star `max(M/B̂w, N·M/B0)`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// One sweep's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nodes: Vec<usize>,
    pub size_mb: f64,
    pub chunk_kb: u32,
    pub worker_mbps: f64,
    pub learner_mbps: f64,
    pub modes: Vec<String>,
    pub rounds: u32,
    pub bin: PathBuf,
    pub heartbeat_ms: u64,
}

/// The SPEC §13 bound in seconds. `chain_len` is L (ignored for star).
pub fn bound_s(s: &Settings, mode: &str, n: usize, chain_len: usize) -> f64 {
    let m_bits = s.size_mb * 8.0e6;
    let c_bits = f64::from(s.chunk_kb) * 1024.0 * 8.0;
    let bw = s.worker_mbps * 1e6;
    let b0 = s.learner_mbps * 1e6;
    if mode == "star" {
        (m_bits / bw).max(n as f64 * m_bits / b0)
    } else {
        m_bits / bw + chain_len.saturating_sub(1) as f64 * c_bits / bw
    }
}

/// Child processes, stopped with SIGTERM (then killed) on drop.
pub(crate) struct Procs(pub(crate) Vec<(String, Child)>);

impl Procs {
    pub(crate) fn stop(&mut self) {
        for (_, c) in &self.0 {
            signal(c.id(), "-TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (_, c) in &mut self.0 {
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.0.clear();
    }
}

/// Sends `sig` (`-TERM`, `-STOP`, …) to `pid`. A process a scenario killed on purpose is gone
/// already: nothing to report then.
pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn keygen(bin: &Path, dir: &Path) -> anyhow::Result<Value> {
    let out = Command::new(bin)
        .args(["keygen", "--json", "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

pub(crate) fn status(bin: &Path, admin: &str) -> Option<Value> {
    let out = Command::new(bin)
        .args(["status", "--json", "--admin", admin])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

pub(crate) fn spawn(
    bin: &Path,
    config: &Path,
    extra: &[String],
    log: &Path,
) -> anyhow::Result<Child> {
    let f = File::create(log)?;
    Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .args(extra)
        .env("NO_COLOR", "1")
        .env(
            "RUST_LOG",
            "warn,echo_node=info,dissemination=info,libp2p_gossipsub=error",
        )
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

/// Runs one setting (N workers, one mode); returns its result row.
pub fn run_one(s: &Settings, mode: &str, n: usize, root: &Path) -> anyhow::Result<Value> {
    let swarm = "tn-broadcast";
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = keygen(&s.bin, &ldir)?;
    let (lpk, lpeer) = (
        key["public_key"]
            .as_str()
            .context("public_key")?
            .to_string(),
        key["peer_id"].as_str().context("peer_id")?.to_string(),
    );
    let port = free_port()?;
    let admin = format!("127.0.0.1:{}", free_port()?);
    let common = |dir: &Path, admin: &str, listen: &str, net: &str| {
        format!(
            "swarm_id = \"{swarm}\"\ndata_dir = \"{}\"\n[storage]\nchunk_size_kib = {}\nkeep_snapshots = 2\n\
             [broadcast]\nmode = \"{mode}\"\nworker_mbps = {}\n[network]\nlisten = [\"{listen}\"]\n\
             admin = \"{admin}\"\nmdns = false\nautonat = false\nquic = false\nheartbeat_interval_ms = {}\n{net}\n",
            dir.display(),
            s.chunk_kb,
            s.worker_mbps,
            s.heartbeat_ms
        )
    };
    let lcfg = ldir.join("node.toml");
    std::fs::write(
        &lcfg,
        format!(
            "role = \"learner\"\n{}",
            common(
                &ldir,
                &admin,
                &format!("/ip4/127.0.0.1/tcp/{port}"),
                &format!("learner_mbps = {}", s.learner_mbps)
            )
        ),
    )?;
    let mut procs = Procs(Vec::new());
    let bench = vec![
        "--bench-broadcast-mb".to_string(),
        s.size_mb.to_string(),
        "--bench-workers".into(),
        n.to_string(),
        "--bench-rounds".into(),
        s.rounds.to_string(),
    ];
    procs.0.push((
        "learner".into(),
        spawn(&s.bin, &lcfg, &bench, &ldir.join("node.log"))?,
    ));
    for i in 0..n {
        let dir = root.join(format!("w{i}"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("node.toml");
        std::fs::write(
            &cfg,
            format!(
                "role = \"rollout\"\nlearner_public_key = \"{lpk}\"\n{}",
                common(
                    &dir,
                    &format!("127.0.0.1:{}", free_port()?),
                    "/ip4/127.0.0.1/tcp/0",
                    &format!(
                        "bootstrap = [\"/ip4/127.0.0.1/tcp/{port}/p2p/{lpeer}\"]\n\
                         uplink_mbps = {bw}\ndownlink_mbps = {bw}",
                        bw = s.worker_mbps
                    )
                )
            ),
        )?;
        procs.0.push((
            format!("w{i}"),
            spawn(
                &s.bin,
                &cfg,
                &["--bench-sink".to_string()],
                &dir.join("node.log"),
            )?,
        ));
    }
    let limit = Duration::from_secs(240 + u64::from(s.rounds) * 120);
    let t0 = Instant::now();
    let bench = loop {
        std::thread::sleep(Duration::from_millis(500));
        for (name, c) in &mut procs.0 {
            if let Some(code) = c.try_wait()? {
                bail!(
                    "{name} exited ({code}); see {}",
                    root.join(name.as_str()).display()
                );
            }
        }
        if let Some(b) = status(&s.bin, &admin).map(|v| v["bench"].clone()) {
            if b["done"] == true {
                break b;
            }
        }
        if t0.elapsed() > limit {
            bail!(
                "N = {n} {mode}: the benchmark did not finish within {limit:?}; logs in {}",
                root.display()
            );
        }
    };
    procs.stop();
    let rounds = bench["rounds"].as_array().cloned().unwrap_or_default();
    let all: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r["t_bcast_all_s"].as_f64())
        .collect();
    let q: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r["t_bcast_q_s"].as_f64())
        .collect();
    let chain_len = rounds
        .iter()
        .filter_map(|r| r["chain_lengths"].as_array())
        .flat_map(|c| c.iter().filter_map(Value::as_u64))
        .max()
        .unwrap_or(1) as usize;
    let n_chains = rounds.first().and_then(|r| r["n_chains"].as_u64());
    let bound = bound_s(s, mode, n, chain_len);
    let t = median(all.clone());
    Ok(json!({
        "mode": mode, "nodes": n, "t_bcast_s": t, "t_bcast_q_s": median(q),
        "bound_s": bound, "ratio_to_bound": t.map(|t| t / bound),
        "installed": n, "n_chains": n_chains, "longest_chain": chain_len,
        "rounds": rounds,
    }))
}

/// Runs every (mode, N) of the settings; writes `broadcast.json` (all rows) and
/// `broadcast.png` (T_bcast and bound vs N per mode) under `out`; returns the summary.
pub fn sweep(s: &Settings, out: &Path, verbose: bool) -> anyhow::Result<Value> {
    std::fs::create_dir_all(out)?;
    let mut rows = Vec::new();
    for mode in &s.modes {
        for &n in &s.nodes {
            let tmp = tempfile::Builder::new().prefix("tn-broadcast-").tempdir()?;
            let row = run_one(s, mode, n, tmp.path())?;
            if verbose {
                println!(
                    "{mode:>5} N={n:<3} T_bcast {:>7.2}s  (1/γ of workers {:>6.2}s)  bound {:>6.2}s  ratio {:.2}  chains {}  L {}",
                    row["t_bcast_s"].as_f64().unwrap_or(f64::NAN),
                    row["t_bcast_q_s"].as_f64().unwrap_or(f64::NAN),
                    row["bound_s"].as_f64().unwrap_or(f64::NAN),
                    row["ratio_to_bound"].as_f64().unwrap_or(f64::NAN),
                    row["n_chains"],
                    row["longest_chain"]
                );
            }
            rows.push(row);
        }
    }
    let settings = json!({"size_mb": s.size_mb, "chunk_kb": s.chunk_kb, "worker_mbps": s.worker_mbps,
        "learner_mbps": s.learner_mbps, "rounds": s.rounds, "heartbeat_ms": s.heartbeat_ms});
    let full = json!({"scenario": "broadcast", "settings": settings, "results": rows});
    let json_path = out.join("broadcast.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&full)?)?;
    let mut series = Vec::new();
    for mode in &s.modes {
        let pick = |key: &str| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r["mode"] == mode.as_str())
                .filter_map(|r| Some((r["nodes"].as_f64()?, r[key].as_f64()?)))
                .collect()
        };
        series.push(crate::plot::Series {
            name: format!("{mode} (measured)"),
            points: pick("t_bcast_s"),
            dashed: false,
        });
        series.push(crate::plot::Series {
            name: format!("{mode} bound"),
            points: pick("bound_s"),
            dashed: true,
        });
    }
    let png = out.join("broadcast.png");
    crate::plot::write_png(
        &crate::plot::Chart {
            title: format!(
                "T_bcast of {} MB on loopback, Bw {} / B0 {} Mbit/s",
                s.size_mb, s.worker_mbps, s.learner_mbps
            ),
            x_label: "rollout workers N".into(),
            y_label: "T_bcast (s)".into(),
            series,
            log_x: true,
            log_y: true,
        },
        &png,
        960,
        600,
    )?;
    if verbose {
        eprintln!("wrote {} and {}", json_path.display(), png.display());
    }
    let brief: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"mode": r["mode"], "nodes": r["nodes"], "t_bcast_s": r["t_bcast_s"],
            "bound_s": r["bound_s"], "installed": r["installed"], "n_chains": r["n_chains"]})
        })
        .collect();
    Ok(json!({"scenario": "broadcast", "settings": full["settings"], "results": brief}))
}
