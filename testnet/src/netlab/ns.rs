//! Network namespaces of one lab run, named with a unique run prefix (`nlab-<pid>-`), and
//! their teardown: on drop, on error return, and on SIGINT / SIGTERM / SIGHUP (a signal
//! thread, [`install_signal_teardown`]). [`cleanup_leftovers`] removes what a killed run left
//! behind, by prefix.
//!
//! Everything of a run lives inside its namespaces (bridges, veth pairs, TUN devices, NAT
//! rules), never in the host's: deleting the namespaces removes it all. Processes a run starts
//! inside its namespaces are killed (SIGKILL, by pid from `ip netns pids`) before their
//! namespace is deleted, so none outlives the run in a namespace that no longer has a name.
//!
//! Owns the `ip`/`iptables` command calls and the naming. Must not decide topologies (that is
//! [`super::topo`]) nor start node processes (that is the harness's `Fleet`).

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::Mutex;

/// Every lab name starts with this.
pub const PREFIX: &str = "nlab-";

/// Errors of the lab layer.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("the network lab needs root (CAP_NET_ADMIN); run it as root or with sudo")]
    NotRoot,
    #[error("`{0}` is not installed: run scripts/netlab-install.sh")]
    MissingTool(&'static str),
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The namespaces of runs still alive in this process, for the signal thread.
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Whether this process can run a lab: root, `ip` and `iptables` present. The error says
/// what is missing (tests print it and skip).
pub fn preflight() -> Result<(), LabError> {
    // Root: the effective uid, as /proc/self/status reports it (no FFI needed).
    let status = std::fs::read_to_string("/proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if euid != "0" {
        return Err(LabError::NotRoot);
    }
    for tool in ["ip", "iptables"] {
        let found = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(LabError::MissingTool(tool));
        }
    }
    Ok(())
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, LabError> {
    let out: Output = Command::new(cmd).args(args).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            cmd: format!("{cmd} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The namespaces of one run. Dropping it removes them (and kills what runs inside).
pub struct Lab {
    prefix: String,
    namespaces: Vec<String>,
}

impl Lab {
    /// A new run, prefix `nlab-<pid>-<tag>-`; checks [`preflight`] first.
    pub fn new(tag: &str) -> Result<Lab, LabError> {
        preflight()?;
        Ok(Lab {
            prefix: format!("{PREFIX}{}-{tag}-", std::process::id()),
            namespaces: Vec::new(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Creates namespace `<prefix><name>` with loopback up and IPv6 off (no router
    /// solicitations on the lab's links); returns its full name.
    pub fn add_ns(&mut self, name: &str) -> Result<String, LabError> {
        let ns = format!("{}{name}", self.prefix);
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ns.clone());
        run("ip", &["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        self.ip(&ns, &["link", "set", "lo", "up"])?;
        self.sysctl(&ns, "net.ipv6.conf.all.disable_ipv6", "1")?;
        self.sysctl(&ns, "net.ipv6.conf.default.disable_ipv6", "1")?;
        Ok(ns)
    }

    /// `ip -n NS ARGS…`.
    pub fn ip(&self, ns: &str, args: &[&str]) -> Result<String, LabError> {
        let mut a = vec!["-n", ns];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// `ip netns exec NS ARGS…`.
    pub fn exec(&self, ns: &str, args: &[&str]) -> Result<String, LabError> {
        let mut a = vec!["netns", "exec", ns];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Counter `stat` of device `dev` in `ns` (`/sys/class/net/DEV/statistics/STAT`, read from
    /// inside the namespace: `tx_bytes`, `tx_dropped`, …).
    pub fn iface_stat(&self, ns: &str, dev: &str, stat: &str) -> Result<u64, LabError> {
        let path = format!("/sys/class/net/{dev}/statistics/{stat}");
        let out = self.exec(ns, &["cat", &path])?;
        out.trim().parse().map_err(|_| LabError::Command {
            cmd: format!("cat {path}"),
            stderr: format!("not a counter: {out:?}"),
        })
    }

    pub fn sysctl(&self, ns: &str, key: &str, value: &str) -> Result<(), LabError> {
        self.exec(ns, &["sysctl", "-q", "-w", &format!("{key}={value}")])
            .map(drop)
    }

    /// A veth pair: `if_a` in `ns_a`, `if_b` in `ns_b`, both up.
    pub fn veth(&self, ns_a: &str, if_a: &str, ns_b: &str, if_b: &str) -> Result<(), LabError> {
        self.ip(
            ns_a,
            &[
                "link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", ns_b,
            ],
        )?;
        self.ip(ns_a, &["link", "set", if_a, "up"])?;
        self.ip(ns_b, &["link", "set", if_b, "up"])?;
        Ok(())
    }

    /// Deletes every namespace of the run, killing what runs inside first. Idempotent.
    pub fn teardown(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            remove_ns(&ns);
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).remove(&ns);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Kills the processes inside `ns` (by pid) and deletes it; errors are ignored (it may be
/// gone already).
fn remove_ns(ns: &str) {
    if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace().filter(|p| p.parse::<u32>().is_ok()) {
            let _ = Command::new("kill").args(["-KILL", pid]).output();
        }
    }
    let _ = run("ip", &["netns", "del", ns]);
}

/// Tears every live lab of this process down when SIGINT, SIGTERM or SIGHUP arrives, then
/// exits with 128 + the signal. Call once.
pub fn install_signal_teardown() -> Result<(), LabError> {
    super::sys::on_termination(|sig| {
        let live: Vec<String> =
            std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .collect();
        eprintln!("signal {sig}: removing {} lab namespaces", live.len());
        for ns in live.iter().rev() {
            remove_ns(ns);
        }
        std::process::exit(128 + sig);
    })?;
    Ok(())
}

/// The lab namespaces on this machine: `(name, pid of the run that made it)`.
pub fn list_lab_namespaces() -> Result<Vec<(String, Option<u32>)>, LabError> {
    let out = run("ip", &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(|n| {
            let pid = n[PREFIX.len()..]
                .split('-')
                .next()
                .and_then(|p| p.parse().ok());
            (n.to_string(), pid)
        })
        .collect())
}

/// Removes lab namespaces whose run is gone (its pid no longer exists), or all of them with
/// `all`; returns the names removed.
pub fn cleanup_leftovers(all: bool) -> Result<Vec<String>, LabError> {
    let me = std::process::id();
    let mut removed = Vec::new();
    for (ns, pid) in list_lab_namespaces()? {
        let alive =
            pid.is_some_and(|p| p == me || std::path::Path::new(&format!("/proc/{p}")).exists());
        if all || !alive {
            remove_ns(&ns);
            removed.push(ns);
        }
    }
    Ok(removed)
}
