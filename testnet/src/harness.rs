//! The process harness of every scenario: real `echo-node` processes on 127.0.0.1.
//!
//! Owns the node fleet ([`Fleet`]: start `echo-node run` with a config, keep each node's log
//! file, signal / kill / stop the processes, clean up on drop), ports ([`free_port`]), keys
//! ([`keygen`]), waiting with deadlines ([`wait_for`]), the learning swarm of the `faults` and
//! `ablation` scenarios ([`launch_swarm`]) and the one-shot `echo-node demo` runs
//! ([`run_demo`]). It talks to the nodes only through their command line, their config file
//! and their `/status` JSON — never through node internals.
//!
//! The two points where the harness depends on the node's formats are isolated on purpose:
//! [`write_node_config`] (the TOML a node reads) and [`read_status`] (the JSON `echo-node
//! status --json` prints). Scenario logic (what to run, what to measure) stays in the scenario
//! modules.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// How long [`Fleet::stop`] waits for the nodes to exit after SIGTERM before it kills them.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// The log filter every node runs with: warnings, plus the node's and the data plane's info
/// lines (installs, chain plans), without gossipsub's chatter.
const NODE_LOG_FILTER: &str = "warn,echo_node=info,dissemination=info,libp2p_gossipsub=error";

/// A free TCP port on 127.0.0.1 (bound, read, released: another process may take it before
/// the node binds it, which a later issue addresses).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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

/// A node identity written by `echo-node keygen`.
#[derive(Debug, Clone)]
pub struct NodeKey {
    pub public_key: String,
    pub peer_id: String,
}

/// Creates a node key under `dir` (`echo-node keygen --json --out DIR`).
pub fn keygen(bin: &Path, dir: &Path) -> anyhow::Result<NodeKey> {
    let out = Command::new(bin)
        .args(["keygen", "--json", "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    let key: Value = serde_json::from_slice(&out.stdout)?;
    let field = |k: &str| -> anyhow::Result<String> {
        Ok(key[k]
            .as_str()
            .with_context(|| format!("keygen printed no {k}"))?
            .to_string())
    };
    Ok(NodeKey {
        public_key: field("public_key")?,
        peer_id: field("peer_id")?,
    })
}

/// A node's role, as its config names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Learner,
    Rollout,
}

/// What a scenario puts into one node's config file.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub role: Role,
    pub swarm_id: String,
    pub data_dir: PathBuf,
    /// The learner's key, which rollout workers verify snapshots and heartbeats with.
    pub learner_public_key: Option<String>,
    /// The libp2p listen multiaddr.
    pub listen: String,
    /// The admin (`/status`) address, `127.0.0.1:PORT`.
    pub admin: String,
    pub heartbeat_interval_ms: u64,
    /// Further `[network]` keys, one `key = value` TOML line each (bootstrap, caps, cost).
    pub network: Vec<String>,
    /// Further tables (`[storage]`, `[broadcast]`, `[learner]`, …) as TOML text.
    pub tables: String,
}

/// The config file of the node whose directory is `dir`.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("node.toml")
}

/// The log file (stdout and stderr) of the node whose directory is `dir`.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("node.log")
}

/// Writes the node config of `spec` to `path`. Every node runs on loopback only: no mDNS, no
/// AutoNAT, no QUIC.
pub fn write_node_config(path: &Path, spec: &NodeSpec) -> anyhow::Result<()> {
    std::fs::write(path, render_node_config(spec))
        .with_context(|| format!("writing {}", path.display()))
}

fn render_node_config(spec: &NodeSpec) -> String {
    let role = match spec.role {
        Role::Learner => "learner",
        Role::Rollout => "rollout",
    };
    let mut toml = format!(
        "role = \"{role}\"\nswarm_id = \"{}\"\ndata_dir = \"{}\"\n",
        spec.swarm_id,
        spec.data_dir.display()
    );
    if let Some(pk) = &spec.learner_public_key {
        toml += &format!("learner_public_key = \"{pk}\"\n");
    }
    toml += &format!(
        "[network]\nlisten = [\"{}\"]\nadmin = \"{}\"\nmdns = false\nautonat = false\nquic = false\n\
         heartbeat_interval_ms = {}\n",
        spec.listen, spec.admin, spec.heartbeat_interval_ms
    );
    for line in &spec.network {
        toml += line;
        toml.push('\n');
    }
    toml += &spec.tables;
    toml
}

/// A node's `/status` JSON (`echo-node status --json --admin ADDR`), or `None` while the node
/// does not answer (not up yet, or gone).
pub fn read_status(bin: &Path, admin: &str) -> Option<Value> {
    let out = Command::new(bin)
        .args(["status", "--json", "--admin", admin])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Polls `probe` every `every` until it returns `Some` (which is returned) or `timeout` has
/// passed (`None`); an error of `probe` ends the wait at once.
pub fn wait_for<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(every.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// One node process of a [`Fleet`].
struct Node {
    name: String,
    log: PathBuf,
    child: Child,
    /// Exited and waited for: its pid may belong to another process by now.
    reaped: bool,
    /// Killed by the scenario ([`Fleet::kill`]): its exit is no failure.
    killed: bool,
}

/// The node processes of one run, stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Default)]
pub struct Fleet {
    nodes: Vec<Node>,
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// Starts `bin run --config DIR/node.toml EXTRA…` as node `name`, stdout and stderr to
    /// `DIR/node.log`; returns its index in the fleet.
    pub fn start(
        &mut self,
        bin: &Path,
        name: &str,
        dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<usize> {
        let log = log_path(dir);
        let f = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(config_path(dir))
            .args(extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", NODE_LOG_FILTER)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.nodes.push(Node {
            name: name.to_string(),
            log,
            child,
            reaped: false,
            killed: false,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Sends `sig` to node `i`. A node that has exited (a scenario may kill one on purpose)
    /// is not signalled: its pid may have been reused.
    pub fn signal(&mut self, i: usize, sig: Signal) -> anyhow::Result<()> {
        let Some(node) = self.nodes.get_mut(i) else {
            bail!("no node {i} in the fleet");
        };
        if node.reaped || node.child.try_wait()?.is_some() {
            node.reaped = true;
            return Ok(());
        }
        let pid = Pid::from_raw(i32::try_from(node.child.id())?);
        match kill(pid, sig) {
            // Exited between the check and the signal.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("sending {sig} to {}", node.name)),
        }
    }

    /// Kills node `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(node) = self.nodes.get_mut(i) {
            let _ = node.child.kill();
            let _ = node.child.wait();
            node.reaped = true;
            node.killed = true;
        }
    }

    /// An error naming the first node that has exited (other than by [`Fleet::kill`]), and
    /// its log.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        for node in self.nodes.iter_mut().filter(|n| !n.killed) {
            if let Some(code) = node.child.try_wait()? {
                node.reaped = true;
                bail!("{} exited ({code}); see {}", node.name, node.log.display());
            }
        }
        Ok(())
    }

    /// Stops every node: SIGTERM to all (a paused node is resumed first so that it can
    /// exit), up to [`STOP_GRACE`] for them to exit, then SIGKILL to the rest.
    pub fn stop(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = self.signal(i, Signal::SIGCONT);
            let _ = self.signal(i, Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        for node in &mut self.nodes {
            if !node.reaped {
                let _ = wait_for(
                    deadline.saturating_duration_since(Instant::now()),
                    Duration::from_millis(50),
                    || Ok(node.child.try_wait().ok().flatten()),
                );
            }
            let _ = node.child.kill();
            let _ = node.child.wait();
            node.reaped = true;
        }
        self.nodes.clear();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running learning swarm: node 0 of `fleet` is the learner, node `i + 1` worker `i`.
pub struct Swarm {
    pub fleet: Fleet,
    pub learner_admin: String,
    pub worker_admins: Vec<String>,
}

/// Starts a learner with `learner_tables` (TOML tables: `[learner]`, `[scheduler]`, …) and one
/// rollout worker per entry of `worker_costs` (declared $/h), all under `root` (`learner/`,
/// `w0/`, `w1/`, …). Heartbeats every 500 ms; workers keep at most 4 pending groups.
pub fn launch_swarm(
    bin: &Path,
    root: &Path,
    swarm_id: &str,
    learner_tables: &str,
    worker_costs: &[f64],
) -> anyhow::Result<Swarm> {
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = keygen(bin, &ldir)?;
    let port = free_port()?;
    let learner_admin = format!("127.0.0.1:{}", free_port()?);
    let spec = |role, dir: &Path, admin: &str, listen: String| NodeSpec {
        role,
        swarm_id: swarm_id.to_string(),
        data_dir: dir.to_path_buf(),
        learner_public_key: None,
        listen,
        admin: admin.to_string(),
        heartbeat_interval_ms: 500,
        network: Vec::new(),
        tables: String::new(),
    };
    write_node_config(
        &config_path(&ldir),
        &NodeSpec {
            tables: learner_tables.to_string(),
            ..spec(
                Role::Learner,
                &ldir,
                &learner_admin,
                format!("/ip4/127.0.0.1/tcp/{port}"),
            )
        },
    )?;
    let mut fleet = Fleet::new();
    fleet.start(bin, "learner", &ldir, &[])?;
    let mut worker_admins = Vec::new();
    for (i, cost) in worker_costs.iter().enumerate() {
        let dir = root.join(format!("w{i}"));
        std::fs::create_dir_all(&dir)?;
        let admin = format!("127.0.0.1:{}", free_port()?);
        write_node_config(
            &config_path(&dir),
            &NodeSpec {
                learner_public_key: Some(key.public_key.clone()),
                network: vec![
                    format!(
                        "bootstrap = [\"/ip4/127.0.0.1/tcp/{port}/p2p/{}\"]",
                        key.peer_id
                    ),
                    format!("cost_per_hour = {cost}"),
                ],
                tables: "[storage]\nmax_pending_groups = 4\n".into(),
                ..spec(Role::Rollout, &dir, &admin, "/ip4/127.0.0.1/tcp/0".into())
            },
        )?;
        fleet.start(bin, &format!("w{i}"), &dir, &[])?;
        worker_admins.push(admin);
    }
    Ok(Swarm {
        fleet,
        learner_admin,
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

    fn spec() -> NodeSpec {
        NodeSpec {
            role: Role::Rollout,
            swarm_id: "tn-test".into(),
            data_dir: PathBuf::from("/tmp/w0"),
            learner_public_key: Some("ab12".into()),
            listen: "/ip4/127.0.0.1/tcp/0".into(),
            admin: "127.0.0.1:9000".into(),
            heartbeat_interval_ms: 500,
            network: vec![
                "bootstrap = [\"/ip4/127.0.0.1/tcp/1/p2p/x\"]".into(),
                "cost_per_hour = 0.1".into(),
            ],
            tables: "[storage]\nmax_pending_groups = 4\n[broadcast]\nmode = \"chain\"\n".into(),
        }
    }

    #[test]
    fn the_node_config_is_toml_with_every_key_in_its_table() {
        let v: toml::Table = toml::from_str(&render_node_config(&spec())).unwrap();
        assert_eq!(v["role"].as_str(), Some("rollout"));
        assert_eq!(v["learner_public_key"].as_str(), Some("ab12"));
        assert_eq!(v["data_dir"].as_str(), Some("/tmp/w0"));
        let net = v["network"].as_table().unwrap();
        assert_eq!(net["admin"].as_str(), Some("127.0.0.1:9000"));
        assert_eq!(net["mdns"].as_bool(), Some(false));
        assert_eq!(net["quic"].as_bool(), Some(false));
        assert_eq!(net["heartbeat_interval_ms"].as_integer(), Some(500));
        assert_eq!(net["cost_per_hour"].as_float(), Some(0.1));
        assert_eq!(net["bootstrap"].as_array().unwrap().len(), 1);
        assert_eq!(v["storage"]["max_pending_groups"].as_integer(), Some(4));
        assert_eq!(v["broadcast"]["mode"].as_str(), Some("chain"));

        let learner = NodeSpec {
            role: Role::Learner,
            learner_public_key: None,
            network: Vec::new(),
            tables: String::new(),
            ..spec()
        };
        let v: toml::Table = toml::from_str(&render_node_config(&learner)).unwrap();
        assert_eq!(v["role"].as_str(), Some("learner"));
        assert!(!v.contains_key("learner_public_key"));
    }

    #[test]
    fn wait_for_returns_the_first_answer_or_none_at_the_deadline() {
        let mut calls = 0;
        let got = wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            Ok((calls == 3).then_some(calls))
        })
        .unwrap();
        assert_eq!(got, Some(3));
        let never = wait_for(Duration::from_millis(20), Duration::from_millis(5), || {
            Ok(None::<()>)
        })
        .unwrap();
        assert_eq!(never, None);
        let failed = wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
            anyhow::bail!("node gone") as anyhow::Result<Option<()>>
        });
        assert!(failed.is_err());
    }

    #[test]
    fn the_fleet_signals_stops_and_reports_exited_processes() {
        // `sleep` stands in for a node: the fleet only needs a process to manage.
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = Fleet::new();
        let spawn = |fleet: &mut Fleet, secs: &str| {
            let child = Command::new("sleep").arg(secs).spawn().unwrap();
            fleet.nodes.push(Node {
                name: format!("sleep {secs}"),
                log: dir.path().join("node.log"),
                child,
                reaped: false,
                killed: false,
            });
        };
        spawn(&mut fleet, "30");
        spawn(&mut fleet, "30");
        fleet.ensure_running().unwrap();
        fleet.signal(0, Signal::SIGSTOP).unwrap();
        fleet.signal(0, Signal::SIGCONT).unwrap();
        fleet.kill(1);
        // A killed node is neither signalled again nor an error to signal, nor a failure.
        fleet.signal(1, Signal::SIGTERM).unwrap();
        fleet.ensure_running().unwrap();
        assert!(fleet.signal(7, Signal::SIGTERM).is_err());
        fleet.signal(0, Signal::SIGTERM).unwrap();
        let exited = wait_for(Duration::from_secs(10), Duration::from_millis(10), || {
            Ok(fleet.ensure_running().err())
        })
        .unwrap()
        .expect("a terminated node is reported");
        assert!(exited.to_string().contains("sleep 30 exited"), "{exited}");
        let started = Instant::now();
        fleet.stop();
        assert!(fleet.nodes.is_empty());
        assert!(started.elapsed() < STOP_GRACE);
    }
}
