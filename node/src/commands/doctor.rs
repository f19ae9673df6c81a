//! `echo-node doctor [--config F] [--json]`: the preflight a user runs before joining a swarm.
//! Each check prints one line — ok, warn or fail — with what it found and, unless ok, how to fix
//! it; the command exits non-zero when any check fails.
//!
//! Checks: the config (parsed and validated), the node key (present, 0600, and on a learner the
//! key the config names), the data dir (writable, free space), the model's device (the one
//! `model.device` selects, with its free memory), the clock, the host's TCP congestion control
//! (snapshots cross WAN links on TCP; see [`judge_tcp_congestion`]), the listen and admin
//! ports (bindable now), the bootstrap peers (dialled and identified from a throw-away
//! identity, so a running node is not disturbed), and this node's reachability (AutoNAT's
//! verdict, if any, within the wait).
//!
//! The rules that judge a measurement (free space, clock) are pure functions, tested without
//! I/O; the probes around them do the I/O.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::config::{NodeConfig, Role};

/// What a check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// How to fix it (empty when ok).
    pub hint: String,
}

fn check(name: &'static str, status: Status, detail: String, hint: &str) -> Check {
    Check {
        name,
        status,
        detail,
        hint: hint.to_string(),
    }
}

const GIB: u64 = 1 << 30;

/// Free space on the data dir's disk: a node writes snapshots (the model's size, times
/// `storage.keep_snapshots`) and trajectories; below 100 MiB it will fail, below 1 GiB soon.
pub fn judge_free_space(free_bytes: u64) -> Status {
    if free_bytes < 100 << 20 {
        Status::Fail
    } else if free_bytes < GIB {
        Status::Warn
    } else {
        Status::Ok
    }
}

/// The clock: heartbeats and leases carry wall-clock times, and TLS-like handshakes do not
/// care, but a clock years off (an unset RTC) makes every age and expiry meaningless. Sane =
/// after 2025-01-01 and before 2100.
pub fn judge_clock(now_unix_s: u64) -> Status {
    const Y2025: u64 = 1_735_689_600;
    const Y2100: u64 = 4_102_444_800;
    if (Y2025..Y2100).contains(&now_unix_s) {
        Status::Ok
    } else {
        Status::Fail
    }
}

/// The kernel's TCP congestion control. Snapshot chunks cross every hop of a chain on one TCP
/// connection, and loss-based algorithms collapse on long lossy paths: in the WAN lab
/// (`docs/netlab.md`), one hop moving 16 MB at 100 ms RTT and 0.5 % loss took 3.3 s with BBR
/// and 76–98 s with CUBIC (the Linux default on most distributions). A rate-based algorithm
/// (BBR) is therefore advised; anything else is a warning, not a failure — on a LAN or a
/// loss-free link it does not matter.
pub fn judge_tcp_congestion(algorithm: &str) -> Status {
    if algorithm.trim().starts_with("bbr") {
        Status::Ok
    } else {
        Status::Warn
    }
}

const TCP_CONGESTION_HINT: &str = "on lossy WAN links use BBR: sysctl -w net.ipv4.tcp_congestion_control=bbr (and net.core.default_qdisc=fq; persist both in /etc/sysctl.d/)";

fn tcp_check() -> Check {
    let path = "/proc/sys/net/ipv4/tcp_congestion_control";
    let a = match std::fs::read_to_string(path) {
        Ok(a) => a.trim().to_string(),
        Err(e) => {
            let detail = format!("could not read {path}: {e}");
            return check("tcp", Status::Warn, detail, TCP_CONGESTION_HINT);
        }
    };
    match judge_tcp_congestion(&a) {
        Status::Ok => check("tcp", Status::Ok, format!("TCP congestion control is {a}"), ""),
        status => check(
            "tcp",
            status,
            format!("TCP congestion control is {a}: on long lossy paths a snapshot moves tens of times slower than with BBR"),
            TCP_CONGESTION_HINT,
        ),
    }
}

pub fn doctor(args: &DoctorArgs) -> anyhow::Result<()> {
    let checks = run_checks(args);
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    if args.json {
        println!("{}", serde_json::json!({ "checks": checks }));
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<12} {}", c.name, c.detail);
            if !c.hint.is_empty() {
                println!("      {:<12} fix: {}", "", c.hint);
            }
        }
    }
    anyhow::ensure!(!failed, "doctor: some checks failed (see above)");
    Ok(())
}

fn run_checks(args: &DoctorArgs) -> Vec<Check> {
    let mut out = Vec::new();
    let config = match NodeConfig::load(&args.config).and_then(|c| {
        c.validate(&args.config)?;
        Ok(c)
    }) {
        Ok(c) => {
            out.push(check(
                "config",
                Status::Ok,
                format!(
                    "{} is valid ({} in swarm {})",
                    args.config.display(),
                    c.role,
                    c.swarm_id
                ),
                "",
            ));
            c
        }
        Err(e) => {
            out.push(check(
                "config",
                Status::Fail,
                e.to_string(),
                "fix the keys listed (configs/ has commented examples); nothing else is checked until the config is valid",
            ));
            return out;
        }
    };
    out.push(key_check(&config));
    if config.network.psk_file.is_some() {
        // `run` refuses the same problems.
        let psk: Vec<String> = config
            .validate_files()
            .into_iter()
            .filter(|p| p.key == "network.psk_file")
            .map(|p| p.message)
            .collect();
        out.push(if psk.is_empty() {
            check(
                "psk",
                Status::Ok,
                "the pre-shared key file is readable by its owner only and well-formed".into(),
                "",
            )
        } else {
            check(
                "psk",
                Status::Fail,
                psk.join("; "),
                "make the file as in docs/operator-guide.md \"Private swarm\" and `chmod 600` it",
            )
        });
    }
    out.push(data_dir_check(&config.data_dir));
    out.push(clock_check());
    out.push(tcp_check());
    out.push(device_check(&config));
    out.extend(port_checks(&config));
    out.extend(network_checks(&config, Duration::from_secs(args.timeout_s)));
    out
}

fn key_check(config: &NodeConfig) -> Check {
    let path = config.key_path();
    if !path.exists() {
        let status = if config.role == Role::Learner && config.learner_public_key.is_some() {
            Status::Fail
        } else {
            Status::Warn
        };
        return check(
            "key",
            status,
            format!("{} does not exist", path.display()),
            "the first `echo-node run` creates it; or `echo-node keygen --out DIR` (a learner must use the key its workers trust)",
        );
    }
    let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
    if let Ok(mode) = mode {
        if mode & 0o077 != 0 {
            return check(
                "key",
                Status::Fail,
                format!("{} is readable by others (mode {mode:o})", path.display()),
                &format!("chmod 600 {}", path.display()),
            );
        }
    }
    let key = match storage::NodeKey::read(&path) {
        Ok(k) => k,
        Err(e) => {
            return check(
                "key",
                Status::Fail,
                format!("{}: {e}", path.display()),
                "restore the key from its backup, or move it away and let the node create a new one (a new peer id)",
            )
        }
    };
    if config.role == Role::Learner {
        if let Some(expected) = &config.learner_public_key {
            if expected.trim() != key.public_hex() {
                return check(
                    "key",
                    Status::Fail,
                    format!("{} is not the learner_public_key of the config", path.display()),
                    "point key_file at the learner's key, or give the workers this key's public key",
                );
            }
        }
    }
    let peer = crate::state::peer_id(&key).unwrap_or_default();
    check(
        "key",
        Status::Ok,
        format!("{} (peer id {peer})", path.display()),
        "",
    )
}

fn data_dir_check(dir: &Path) -> Check {
    let probe = || -> std::io::Result<u64> {
        std::fs::create_dir_all(dir)?;
        let f = dir.join(format!(".doctor-{}", std::process::id()));
        std::fs::write(&f, b"ok")?;
        std::fs::remove_file(&f)?;
        let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    };
    match probe() {
        Ok(free) => {
            let status = judge_free_space(free);
            check(
                "data_dir",
                status,
                format!(
                    "{} is writable, {:.1} GiB free",
                    dir.display(),
                    free as f64 / GIB as f64
                ),
                if status == Status::Ok {
                    ""
                } else {
                    "free disk space or move data_dir: snapshots need the model's size × keep_snapshots"
                },
            )
        }
        Err(e) => check(
            "data_dir",
            Status::Fail,
            format!("{} is not writable: {e}", dir.display()),
            "create it and give the node's user write access, or point data_dir elsewhere",
        ),
    }
}

fn device_check(config: &NodeConfig) -> Check {
    match policy::device::select(config.model.device) {
        Ok(device) => {
            let d = policy::device::describe(&device);
            check(
                "device",
                Status::Ok,
                format!(
                    "model.device = \"{}\": {} {} ({:.1} of {:.1} GiB free{})",
                    config.model.device,
                    d.kind,
                    d.name,
                    d.memory_free_bytes as f64 / GIB as f64,
                    d.memory_total_bytes as f64 / GIB as f64,
                    d.compute_capability
                        .map_or(String::new(), |c| format!(", compute capability {c}"))
                ),
                "",
            )
        }
        Err(e) => check(
            "device",
            Status::Fail,
            format!("model.device = \"{}\": {e}", config.model.device),
            "use a binary built with scripts/build-cuda.sh on a machine with the GPU and its driver, or set model.device = \"cpu\"",
        ),
    }
}

fn clock_check() -> Check {
    let now = storage::unix_ms() / 1000;
    let status = judge_clock(now);
    check(
        "clock",
        status,
        format!("system time is {now} s since the Unix epoch"),
        if status == Status::Ok {
            ""
        } else {
            "set the system clock (enable NTP: timedatectl set-ntp true)"
        },
    )
}

/// The socket address a listen multiaddr binds, and whether it is UDP (QUIC).
fn bind_target(addr: &str) -> Option<(SocketAddr, bool)> {
    p2p::transport::bind_target(&addr.parse().ok()?)
}

fn port_checks(config: &NodeConfig) -> Vec<Check> {
    let mut out = Vec::new();
    for addr in &config.network.listen {
        let Some((sa, udp)) = bind_target(addr) else {
            out.push(check(
                "listen",
                Status::Warn,
                format!("{addr}: not an IP/TCP or IP/UDP address, not checked"),
                "",
            ));
            continue;
        };
        let r = if udp {
            UdpSocket::bind(sa).map(|_| ())
        } else {
            TcpListener::bind(sa).map(|_| ())
        };
        out.push(match r {
            Ok(()) => check("listen", Status::Ok, format!("{addr} can be bound"), ""),
            Err(e) => check(
                "listen",
                Status::Fail,
                format!("listening on {addr}: {}", p2p::transport::bind_failure(&e)),
                "`run` refuses this address too: another process holds it; stop it or pick another port (0 = any)",
            ),
        });
    }
    // Validated above, so it parses.
    if let Ok(sa) = config.network.admin.parse::<SocketAddr>() {
        out.push(match TcpListener::bind(sa) {
            Ok(_) => check("admin", Status::Ok, format!("{sa} can be bound"), ""),
            Err(e) => check(
                "admin",
                Status::Fail,
                format!("listening on {sa}: {}", p2p::transport::bind_failure(&e)),
                "another process (a running node?) holds the admin port: stop it or set network.admin",
            ),
        });
    }
    out
}

/// Dials the bootstrap peers from a throw-away identity and waits up to `wait` for each to be
/// connected and identified, and for AutoNAT's verdict on this host.
fn network_checks(config: &NodeConfig, wait: Duration) -> Vec<Check> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return vec![check(
                "bootstrap",
                Status::Fail,
                format!("cannot start a runtime: {e}"),
                "",
            )]
        }
    };
    rt.block_on(async {
        match probe_network(config, wait).await {
            Ok(checks) => checks,
            Err(e) => vec![check(
                "bootstrap",
                Status::Fail,
                format!("{e:#}"),
                "check network.psk_file and the listen addresses",
            )],
        }
    })
}

async fn probe_network(config: &NodeConfig, wait: Duration) -> anyhow::Result<Vec<Check>> {
    let mut out = Vec::new();
    // A throw-away identity on loopback port 0: the node's own key and ports stay free for it.
    let key = storage::NodeKey::generate();
    let mut svc = crate::state::service_config(config, key.seed())?;
    svc.network.listen = vec!["/ip4/127.0.0.1/tcp/0".into()];
    svc.network.mdns = false;
    let mut registry = p2p::Registry::default();
    let (client, _events, task) =
        p2p::start(key.seed(), svc, &mut registry).context("starting a probe network service")?;
    let wanted: Vec<(String, Option<p2p::PeerId>)> = config
        .network
        .bootstrap
        .iter()
        .map(|a| (a.clone(), a.parse().ok().and_then(|m| p2p::peer_id_of(&m))))
        .collect();
    let deadline = Instant::now() + wait;
    let mut identified = std::collections::HashSet::new();
    let mut external = Vec::new();
    while Instant::now() < deadline {
        let st = client.status().await?;
        for p in st
            .peers
            .iter()
            .filter(|p| p.connected && p.agent_version.is_some())
        {
            identified.insert(p.peer_id.clone());
        }
        external = st.external_addrs.clone();
        let all = wanted
            .iter()
            .all(|(_, id)| id.is_some_and(|id| identified.contains(&id.to_string())));
        if all && !external.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if wanted.is_empty() {
        out.push(if config.role == Role::Learner {
            check("bootstrap", Status::Ok, "none configured (a learner is dialled by its workers)".into(), "")
        } else {
            check(
                "bootstrap",
                Status::Warn,
                "none configured: only mDNS on this LAN can find peers".into(),
                "add the learner's (or a bootstrap node's) /ip4/…/tcp/…/p2p/<peer id> to network.bootstrap",
            )
        });
    }
    for (addr, id) in &wanted {
        out.push(match id {
            None => check(
                "bootstrap",
                Status::Fail,
                format!("{addr} has no /p2p/<peer id>"),
                "append the peer's id: …/tcp/4001/p2p/12D3KooW…",
            ),
            Some(id) if identified.contains(&id.to_string()) => check(
                "bootstrap",
                Status::Ok,
                format!("{addr} reached and identified"),
                "",
            ),
            Some(_) => check(
                "bootstrap",
                Status::Fail,
                format!("{addr} not reached within {wait:?}"),
                "check the address and peer id, that the peer runs, firewalls on both sides, and for a private swarm the same psk_file",
            ),
        });
    }
    out.push(if external.is_empty() {
        check(
            "reachability",
            Status::Warn,
            format!("no public address confirmed within {wait:?} (AutoNAT)"),
            "behind a NAT peers cannot dial you: open/forward the listen port, or configure network.relays",
        )
    } else {
        check(
            "reachability",
            Status::Ok,
            format!("publicly reachable at {}", external.join(", ")),
            "",
        )
    });
    client.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_and_clock_rules() {
        assert_eq!(judge_free_space(50 << 20), Status::Fail);
        assert_eq!(judge_free_space(500 << 20), Status::Warn);
        assert_eq!(judge_free_space(10 * GIB), Status::Ok);
        assert_eq!(judge_clock(0), Status::Fail, "an unset clock (1970)");
        assert_eq!(judge_clock(1_800_000_000), Status::Ok);
        assert_eq!(judge_clock(5_000_000_000), Status::Fail);
    }

    #[test]
    fn only_a_rate_based_tcp_congestion_control_passes_quietly() {
        assert_eq!(judge_tcp_congestion("bbr\n"), Status::Ok);
        assert_eq!(judge_tcp_congestion("bbr3"), Status::Ok);
        assert_eq!(judge_tcp_congestion("cubic"), Status::Warn);
        assert_eq!(judge_tcp_congestion("reno"), Status::Warn);
        assert_eq!(judge_tcp_congestion(""), Status::Warn);
    }

    #[test]
    fn listen_addresses_map_to_sockets() {
        assert_eq!(
            bind_target("/ip4/127.0.0.1/tcp/4001"),
            Some(("127.0.0.1:4001".parse().unwrap(), false))
        );
        assert_eq!(
            bind_target("/ip4/0.0.0.0/udp/4001/quic-v1"),
            Some(("0.0.0.0:4001".parse().unwrap(), true))
        );
        assert_eq!(bind_target("/dns4/example.org/tcp/1"), None);
    }
}
