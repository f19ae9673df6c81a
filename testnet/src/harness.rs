//! The process harness of every scenario: real `echo-node` processes on 127.0.0.1.
//!
//! Owns keys ([`keygen`]), waiting with deadlines ([`poll`]), the
//! node configs of a scenario ([`node_config`]), the learning swarm of the `faults` and
//! `ablation` scenarios ([`launch_swarm`]) and the one-shot `echo-node demo` runs
//! ([`run_demo`]). The process fleet itself is `echo_node::fleet::Fleet` (start `echo-node
//! run` with a config, keep each node's log, signal / kill / stop with `nix`, clean up on
//! drop), shared with `echo-node demo`.
//!
//! It talks to the nodes through their command line, their config file and their `/status`
//! JSON, using the node's own types for the last two (`echo_node::config::NodeConfig`,
//! written with `toml`; `echo_node::api::NodeStatus`) so that a renamed key is renamed here
//! too. Scenario logic (what to run, what to measure) stays in the scenario modules.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
pub use echo_node::api::NodeStatus;
pub use echo_node::config::{NodeConfig, Role};
pub use echo_node::fleet::{Fleet, Signal, STOP_GRACE};
use serde_json::Value;

/// The log filter every node runs with: warnings, plus the node's and the data plane's info
/// lines (installs, chain plans), without gossipsub's chatter.
pub const NODE_LOG_FILTER: &str = "warn,echo_node=info,dissemination=info,libp2p_gossipsub=error";

/// Set to a `tracing` filter to run every node of a scenario with it instead of
/// [`NODE_LOG_FILTER`] (e.g. `dissemination=debug` to see why fetches fail).
pub const LOG_ENV: &str = "ECHO_TESTNET_LOG";

/// The nodes' log filter: [`LOG_ENV`] when set, else [`NODE_LOG_FILTER`].
pub fn node_log_filter() -> String {
    std::env::var(LOG_ENV).unwrap_or_else(|_| NODE_LOG_FILTER.to_string())
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

/// Fails unless `bin` was built with every feature in `needed`, read from its `--version`
/// line. A scenario checks this before it spends minutes: a default build ignores
/// `ECHO_NODE_MISBEHAVE` and its "attackers" run honestly.
pub fn require_features(bin: &Path, needed: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --version", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} --version: {}",
        bin.display(),
        out.status
    );
    check_features(bin, &String::from_utf8_lossy(&out.stdout), needed)
}

/// The judgement of [`require_features`] on a `--version` line, read with the node's own
/// parser (`echo_node::cli::features_in_version`).
fn check_features(bin: &Path, line: &str, needed: &[&str]) -> anyhow::Result<()> {
    let have = echo_node::cli::features_in_version(line);
    let missing: Vec<&str> = needed
        .iter()
        .copied()
        .filter(|f| !have.contains(f))
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "{} was built without the feature(s) {} (its --version says {:?}): build it with \
         `cargo build -p echo-node --features {}` (a workspace build does), or pass --bin",
        bin.display(),
        missing.join(", "),
        line.trim(),
        missing.join(",")
    );
    Ok(())
}

/// Creates a node key under `dir` (`echo-node keygen --json --out DIR`); returns its public
/// key (hex), which the swarm's workers are configured with.
pub fn keygen(bin: &Path, dir: &Path) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(["keygen", "--json", "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    let key: Value = serde_json::from_slice(&out.stdout)?;
    Ok(key["public_key"]
        .as_str()
        .context("keygen printed no public_key")?
        .to_string())
}

/// How long a node may take to bind its ports and write its address file.
pub const START_LIMIT: Duration = Duration::from_secs(60);

/// A node config as every harness node runs it: `role` in `swarm_id`, data in `data_dir`,
/// heartbeats every `heartbeat_ms`, loopback only (no mDNS, no AutoNAT, no QUIC), and port 0
/// for both the libp2p listener and the admin endpoint: the kernel picks free ports at bind
/// time and the node writes them to its address file ([`Fleet::wait_addresses`]). Scenarios
/// set the rest on the typed struct.
pub fn node_config(role: Role, swarm_id: &str, data_dir: &Path, heartbeat_ms: u64) -> NodeConfig {
    let mut c = NodeConfig::new(role, swarm_id, data_dir.to_path_buf());
    c.network.listen = vec!["/ip4/127.0.0.1/tcp/0".into()];
    c.network.admin = "127.0.0.1:0".into();
    c.network.mdns = false;
    c.network.autonat = false;
    c.network.quic = false;
    c.network.heartbeat_interval_ms = heartbeat_ms;
    c
}

/// A node's `/status` (`echo-node status --json --admin ADDR`), or `None` while the node does
/// not answer (not up yet, or gone).
pub fn read_status(bin: &Path, admin: &str) -> Option<NodeStatus> {
    let out = Command::new(bin)
        .args(["status", "--json", "--admin", admin])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Set (to anything) to keep every run directory, also of runs that succeeded (their path is
/// printed to stderr): for reading the node logs of a slow round.
pub const KEEP_ENV: &str = "ECHO_TESTNET_KEEP";

/// Runs `f` in a fresh temporary directory named `prefix…` (node configs, stores and logs go
/// there). The directory is removed when `f` succeeds and kept when it fails — the error then
/// names it, so that a failed run's node logs can be read — or when [`KEEP_ENV`] is set.
pub fn in_run_dir<T>(
    prefix: &str,
    f: impl FnOnce(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    match f(dir.path()) {
        Ok(v) if std::env::var_os(KEEP_ENV).is_some() => {
            eprintln!("run directory kept ({KEEP_ENV}): {}", dir.keep().display());
            Ok(v)
        }
        Ok(v) => Ok(v),
        Err(e) => {
            let kept = dir.keep();
            Err(e.context(format!("logs kept in {}", kept.display())))
        }
    }
}

/// Waiting with a deadline: the test kit's [`testkit::poll`] for probes that fail with
/// `anyhow` (a node that died ends the wait at once).
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    probe: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    testkit::poll(limit, every, probe)
}

/// A running learning swarm: node 0 of `fleet` is the learner, node `i + 1` worker `i`.
pub struct Swarm {
    pub fleet: Fleet,
    pub learner_admin: String,
    pub worker_admins: Vec<String>,
}

/// Starts a learner (its config adjusted by `learner`: `[learner]`, `[scheduler]`, …) and one
/// rollout worker per entry of `worker_costs` (declared $/h), all under `root` (`learner/`,
/// `w0/`, `w1/`, …). Heartbeats every 500 ms; workers keep at most 4 pending groups.
pub fn launch_swarm(
    bin: &Path,
    root: &Path,
    swarm_id: &str,
    learner: impl FnOnce(&mut NodeConfig),
    worker_costs: &[f64],
) -> anyhow::Result<Swarm> {
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = keygen(bin, &ldir)?;
    let mut lc = node_config(Role::Learner, swarm_id, &ldir, 500);
    learner(&mut lc);
    let mut fleet = Fleet::with_log_filter(&node_log_filter());
    let i = fleet.start(bin, "learner", &lc, &[])?;
    let addrs = fleet.wait_addresses(i, &lc, START_LIMIT)?;
    let bootstrap = addrs
        .dial_addr()
        .context("the learner has no TCP address")?;
    let mut workers = Vec::new();
    for (i, cost) in worker_costs.iter().enumerate() {
        let mut w = node_config(Role::Rollout, swarm_id, &root.join(format!("w{i}")), 500);
        w.learner_public_key = Some(key.clone());
        w.network.bootstrap = vec![bootstrap.clone()];
        w.network.cost_per_hour = *cost;
        w.storage.max_pending_groups = 4;
        workers.push((fleet.start(bin, &format!("w{i}"), &w, &[])?, w));
    }
    let worker_admins = workers
        .iter()
        .map(|(i, w)| Ok(fleet.wait_addresses(*i, w, START_LIMIT)?.admin))
        .collect::<anyhow::Result<_>>()?;
    Ok(Swarm {
        fleet,
        learner_admin: addrs.admin,
        worker_admins,
    })
}

/// One `echo-node demo --json ARGS…` run (a learner and its workers in one command); returns
/// the summary line it prints last.
pub fn run_demo(bin: &Path, args: &[String]) -> anyhow::Result<Value> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A default build is refused with the cause and the command that fixes it; a build
    /// listing the feature passes.
    #[test]
    fn a_binary_without_a_needed_feature_is_refused_by_name() {
        let bin = Path::new("/x/echo-node");
        let e = check_features(bin, "echo-node 0.1.0\n", &["adversary"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/x/echo-node was built without the feature(s) adversary"),
            "{e}"
        );
        assert!(e.contains("--features adversary"), "{e}");
        let line = "echo-node 0.1.0 (features: cuda, adversary)\n";
        check_features(bin, line, &["adversary"]).unwrap();
        assert!(check_features(bin, line, &["netlab"]).is_err());
    }

    #[test]
    fn harness_configs_are_loopback_only_and_read_back() {
        let mut c = node_config(Role::Rollout, "tn-test", Path::new("/tmp/w0"), 500);
        c.network.bootstrap = vec!["/ip4/127.0.0.1/tcp/1/p2p/x".into()];
        let text = c.to_toml().unwrap();
        let back = NodeConfig::parse(&text).unwrap();
        assert_eq!(back.role, Role::Rollout);
        assert_eq!(back.network.admin, "127.0.0.1:0");
        assert_eq!(back.network.listen, ["/ip4/127.0.0.1/tcp/0"]);
        assert!(!back.network.mdns && !back.network.autonat && !back.network.quic);
        assert_eq!(back.network.heartbeat_interval_ms, 500);
        assert_eq!(back.network.bootstrap, ["/ip4/127.0.0.1/tcp/1/p2p/x"]);
    }

    #[test]
    fn run_dirs_are_removed_on_success_and_kept_on_failure() {
        let mut seen = None;
        in_run_dir("tn-test-", |d| {
            seen = Some(d.to_path_buf());
            Ok(())
        })
        .unwrap();
        assert!(!seen.unwrap().exists());
        let err = in_run_dir("tn-test-", |d| -> anyhow::Result<()> {
            std::fs::write(d.join("node.log"), "boom")?;
            anyhow::bail!("node w3 exited")
        })
        .unwrap_err();
        let text = format!("{err:#}");
        let kept = text
            .split("logs kept in ")
            .nth(1)
            .unwrap()
            .split(':')
            .next()
            .unwrap();
        assert!(Path::new(kept).join("node.log").exists(), "{text}");
        std::fs::remove_dir_all(kept).unwrap();
    }
}
