//! A fleet of local `echo-node run` processes: what `echo-node demo` starts, and what the
//! testnet harness builds its scenarios on. Each node gets its own directory with its config
//! (written from a typed [`NodeConfig`]) and its log; nodes are signalled with `nix` (never by
//! shelling out), stopped with SIGTERM and a grace period, and every child still running is
//! killed and reaped when the fleet is dropped. Logs are never deleted here: a failed run's
//! logs stay for reading, and errors name their path. Nodes are started on port 0 and found
//! through the address file they write ([`Fleet::wait_addresses`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::kill;
pub use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::addr_file::{self, AddrFile};
use crate::config::NodeConfig;

/// How long [`Fleet::stop`] waits for the nodes to exit after SIGTERM before it kills them.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// The config file of the node whose directory is `dir`.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("node.toml")
}

/// The log file (stdout and stderr) of the node whose directory is `dir`.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join("node.log")
}

/// One node process of a [`Fleet`].
struct Node {
    name: String,
    log: PathBuf,
    child: Child,
    /// Exited and waited for: its pid may belong to another process by now.
    reaped: Option<ExitStatus>,
    /// Killed on purpose ([`Fleet::kill`]): its exit is no failure.
    killed: bool,
}

impl Node {
    /// Its exit status, once it has exited.
    fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait()?;
        }
        Ok(self.reaped)
    }
}

/// The node processes of one run; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Default)]
pub struct Fleet {
    nodes: Vec<Node>,
    /// `RUST_LOG` of the nodes (their default when `None`).
    log_filter: Option<String>,
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// Nodes log with this `RUST_LOG` filter.
    pub fn with_log_filter(filter: &str) -> Fleet {
        Fleet {
            nodes: Vec::new(),
            log_filter: Some(filter.to_string()),
        }
    }

    /// Writes `config` to `DIR/node.toml` (DIR = `config.data_dir`, created) and starts
    /// `exe run --config DIR/node.toml EXTRA…` as node `name`, stdout and stderr to
    /// `DIR/node.log`; returns its index in the fleet.
    pub fn start(
        &mut self,
        exe: &Path,
        name: &str,
        config: &NodeConfig,
        extra: &[String],
    ) -> anyhow::Result<usize> {
        self.start_with_env(exe, name, config, extra, &[])
    }

    /// [`Fleet::start`] with extra environment variables for the process (the testnet's
    /// adversarial scenario sets `ECHO_NODE_MISBEHAVE` this way).
    pub fn start_with_env(
        &mut self,
        exe: &Path,
        name: &str,
        config: &NodeConfig,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = config_path(dir);
        config
            .write(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        let log = log_path(dir);
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.args(["run", "--config"])
            .arg(&path)
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if let Some(f) = &self.log_filter {
            cmd.env("RUST_LOG", f);
        }
        cmd.envs(env.iter().copied());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", exe.display()))?;
        self.nodes.push(Node {
            name: name.to_string(),
            log,
            child,
            reaped: None,
            killed: false,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Waits up to `limit` for node `i` (started from `config`) to write its address file
    /// (`crate::addr_file`): the ports it actually bound. An error if it exits first.
    pub fn wait_addresses(
        &mut self,
        i: usize,
        config: &NodeConfig,
        limit: Duration,
    ) -> anyhow::Result<AddrFile> {
        let pid = self
            .nodes
            .get(i)
            .map(|n| n.child.id())
            .with_context(|| format!("no node {i} in the fleet"))?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(f) = addr_file::read(&config.data_dir, pid) {
                return Ok(f);
            }
            self.ensure_running()?;
            if Instant::now() >= deadline {
                bail!(
                    "{} wrote no address file within {limit:?}; log {}",
                    self.nodes[i].name,
                    self.nodes[i].log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to node `i`. A node that has exited is not signalled: its pid may have
    /// been reused.
    pub fn signal(&mut self, i: usize, sig: Signal) -> anyhow::Result<()> {
        let Some(node) = self.nodes.get_mut(i) else {
            bail!("no node {i} in the fleet");
        };
        if node.exited()?.is_some() {
            return Ok(());
        }
        let pid = Pid::from_raw(i32::try_from(node.child.id())?);
        match kill(pid, sig) {
            // Exited between the check and the signal.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("sending {sig} to {}", node.name)),
        }
    }

    /// Kills node `i` (SIGKILL) and waits for it; its exit is not a failure.
    pub fn kill(&mut self, i: usize) {
        if let Some(node) = self.nodes.get_mut(i) {
            let _ = node.child.kill();
            node.reaped = node.child.wait().ok();
            node.killed = true;
        }
    }

    /// How node `i` exited, or `None` while it runs (or when there is no node `i`).
    pub fn exit_status(&mut self, i: usize) -> Option<ExitStatus> {
        self.nodes
            .get_mut(i)
            .and_then(|n| n.exited().ok().flatten())
    }

    /// An error naming the first node that has exited (other than by [`Fleet::kill`]), with
    /// its log's path and last lines.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        for node in self.nodes.iter_mut().filter(|n| !n.killed) {
            if let Some(code) = node.exited()? {
                bail!(
                    "{} exited ({code}); log {}, last lines:\n{}",
                    node.name,
                    node.log.display(),
                    tail(&node.log, 15)
                );
            }
        }
        Ok(())
    }

    /// Stops every node: SIGTERM to all (a paused node is resumed first so that it can
    /// exit), up to `grace` for them to exit, then SIGKILL to the rest. Returns the nodes
    /// that did not exit cleanly by themselves (not killed on purpose), with their log paths.
    pub fn stop(&mut self, grace: Duration) -> Vec<String> {
        for i in 0..self.nodes.len() {
            let _ = self.signal(i, Signal::SIGCONT);
            let _ = self.signal(i, Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        let mut unclean = Vec::new();
        for node in &mut self.nodes {
            while node.reaped.is_none() && Instant::now() < deadline {
                if node.exited().is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if node.reaped.is_none() {
                let _ = node.child.kill();
                node.reaped = node.child.wait().ok();
            }
            if !node.killed && !node.reaped.is_some_and(|s| s.success()) {
                unclean.push(format!(
                    "{} ({}, log {})",
                    node.name,
                    node.reaped.map_or("not reaped".into(), |s| s.to_string()),
                    node.log.display()
                ));
            }
        }
        self.nodes.clear();
        unclean
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_signals_stops_and_reports_exited_processes() {
        // `sleep` stands in for a node: the fleet only needs processes to manage.
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = Fleet::new();
        let spawn = |fleet: &mut Fleet, secs: &str| {
            let child = Command::new("sleep").arg(secs).spawn().unwrap();
            fleet.nodes.push(Node {
                name: format!("sleep {secs}"),
                log: dir.path().join("node.log"),
                child,
                reaped: None,
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
        let deadline = Instant::now() + Duration::from_secs(10);
        let exited = loop {
            if let Err(e) = fleet.ensure_running() {
                break e;
            }
            assert!(Instant::now() < deadline, "a terminated node is reported");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(exited.to_string().contains("sleep 30 exited"), "{exited}");
        // The one terminated by a signal is reported as unclean; the killed one is not.
        let unclean = fleet.stop(Duration::from_secs(5));
        assert_eq!(unclean.len(), 1, "{unclean:?}");
        assert!(unclean[0].starts_with("sleep 30"), "{unclean:?}");
        assert!(fleet.nodes.is_empty());
    }
}
