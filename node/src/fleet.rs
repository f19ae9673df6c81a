//! A fleet of local `echo-node run` processes: what `echo-node demo` starts, and what the
//! testnet harness builds its scenarios on. Each node gets its own directory with its config
//! (written from a typed [`NodeConfig`]) and its log; nodes are stopped with SIGTERM and a
//! deadline, and every child still running is killed and reaped when the fleet is dropped.
//! Logs are never deleted here: a failed run's logs stay for reading.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::config::NodeConfig;

/// One node process.
pub struct Proc {
    pub name: String,
    pub child: Child,
    /// The node's combined stdout and stderr.
    pub log: PathBuf,
    pub config: PathBuf,
}

impl Proc {
    /// Sends `signal`; a process that already exited is not an error.
    pub fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Child processes, killed and reaped on drop.
#[derive(Default)]
pub struct Fleet {
    pub procs: Vec<Proc>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Fleet {
    /// Writes `config` to `dir/node.toml` and starts `exe run --config` on it with its output
    /// in `dir/node.log`; `extra` arguments follow.
    pub fn spawn(
        &mut self,
        exe: &Path,
        name: &str,
        dir: &Path,
        config: &NodeConfig,
        extra: &[String],
    ) -> anyhow::Result<&mut Proc> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("node.toml");
        config
            .write(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        let log = dir.join("node.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(exe)
            .args(["run", "--config"])
            .arg(&path)
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name} ({})", exe.display()))?;
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            log,
            config: path,
        });
        Ok(self.procs.last_mut().expect("just pushed"))
    }

    /// SIGTERM to every node, then waits up to `limit` for all to exit. Returns the nodes that
    /// did not exit cleanly (with their log paths).
    pub fn stop(&mut self, limit: Duration) -> Vec<String> {
        for p in &self.procs {
            p.signal(Signal::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        let mut bad = Vec::new();
        for p in &mut self.procs {
            if !wait_until(&mut p.child, deadline).is_some_and(|s| s.success()) {
                bad.push(format!("{} (log {})", p.name, p.log.display()));
            }
        }
        self.procs.clear();
        bad
    }

    /// An error naming the first node that exited, with the end of its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(s) = p.child.try_wait()? {
                bail!(
                    "{} exited early ({s}); log {}, last lines:\n{}",
                    p.name,
                    p.log.display(),
                    tail(&p.log, 15)
                );
            }
        }
        Ok(())
    }
}

/// Waits for `child` until `deadline`; its exit status, or `None` if it is still running.
pub fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => return None,
        }
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
