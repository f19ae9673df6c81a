//! The `nat` scenario (`docs/netlab.md`): a learner (and, with `--relay`, a relay node) on a
//! public segment and rollout workers behind NAT routers of different kinds, all in network
//! namespaces of the [`crate::netlab`]. It runs a real swarm — the embedded default model,
//! snapshots broadcast to the workers, groups pulled back — for a few learner steps, and
//! reports per worker:
//!
//! - `peer_id`, `nat` (the router's kind), `ip` (private) and `public_ip` (the router's);
//! - `connection`: `relayed` when the learner reaches the worker through a `/p2p-circuit`
//!   address or the learner's status says so (`reachability`), `direct` when the learner holds
//!   a connection and no relay runs (the worker dialed out through its NAT), `unknown`
//!   otherwise — the lab cannot see which connection carries the traffic;
//! - `installed` (the worker's installed version at the end), `first_install_s` (seconds from
//!   the learner's first published snapshot until the worker reported an install, polled
//!   every 0.5 s), `pulled` (groups produced minus still pending, from the worker's status),
//!   `chain_position` (`[chain, position]` in the learner's plan, if any);
//! - and, for the run, `relay_bytes`: what the relay host sent during the run (its interface's
//!   transmit counter; every byte relayed through a circuit leaves the relay once, plus the
//!   relay's own control traffic), and `relay_bytes_received`; both null without `--relay`.
//!
//! With [`Opts::wan`] the same swarm runs without NAT routers: every node on its own emulated
//! WAN link ([`WanStar`]: round trip, loss, jitter), and the report adds the learner's pull
//! round trip (`pull_round_trip_s`, median and p90 of its recent pulls) and the emulator's
//! packet counts; `nat` is `none` and `public_ip` the worker's own address.
//!
//! Owns the topology of the run and the report. Processes are started by the harness's
//! `Fleet` (through [`crate::netlab::node_wrapper`]), namespaces by [`crate::netlab::topo`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::harness::{self, Fleet, Role};
use crate::netlab::topo::{Host, NatKind, NatLab, WanStar};

/// The scenario's settings.
pub struct Opts {
    pub bin: PathBuf,
    /// Learner steps to run after every worker has installed a snapshot.
    pub steps: u64,
    /// Workers behind each NAT router.
    pub per_nat: usize,
    /// Start a relay node on the public segment and let the workers reserve slots on it.
    pub relay: bool,
    /// Give up after this long.
    pub timeout: Duration,
    /// Instead of NAT routers, every node on an emulated WAN link (no relay).
    pub wan: Option<crate::broadcast::Wan>,
}

/// Where the run's hosts live: behind NAT routers, or each on an emulated WAN link.
enum Topology {
    Nat(NatLab),
    Wan(WanStar),
}

impl Topology {
    fn prefix(&self) -> &str {
        match self {
            Topology::Nat(l) => l.lab.prefix(),
            Topology::Wan(s) => s.lab.prefix(),
        }
    }

    /// `(transmitted, received)` bytes of the relay host's interface (NAT lab with a relay).
    fn relay_bytes(&self, relay: Option<&Host>) -> Option<(u64, u64)> {
        match (self, relay) {
            (Topology::Nat(lab), Some(h)) => interface_bytes(lab, &h.ns),
            _ => None,
        }
    }
}

/// The routers of the run, in order: two kinds, the endpoint-independent one twice so that
/// two such NATs face each other (the case hole punching can solve).
pub const ROUTERS: [NatKind; 3] = [
    NatKind::EndpointIndependent,
    NatKind::Symmetric,
    NatKind::EndpointIndependent,
];

/// A node's `/status` as JSON (untyped, so that fields other branches add are read when
/// present), asked from inside its namespace through its wrapper.
fn status(exe: &Path, admin: &str) -> Option<Value> {
    let out = Command::new(exe)
        .args(["status", "--json", "--admin", admin])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// `(transmitted, received)` bytes of a public host's `eth0`, read from inside its namespace.
fn interface_bytes(lab: &NatLab, ns: &str) -> Option<(u64, u64)> {
    let read = |stat| lab.lab.iface_stat(ns, "eth0", stat).ok();
    Some((read("tx_bytes")?, read("rx_bytes")?))
}

/// The NAT in front of a worker and its router's number (none on the WAN star).
type Behind = Option<(NatKind, u8)>;

/// Where a run's nodes sit: the topology, the learner's host, the relay's (if any), and each
/// worker's name, NAT and host.
type Placement = (Topology, Host, Option<Host>, Vec<(String, Behind, Host)>);

struct Worker {
    name: String,
    nat: Behind,
    ip: String,
    exe: PathBuf,
    admin: String,
    peer_id: String,
    first_install_s: Option<f64>,
}

/// `testnet nat --cleanup`: removes the namespaces of lab runs whose process is gone.
pub fn cleanup() -> anyhow::Result<()> {
    for ns in crate::netlab::ns::cleanup_leftovers(false)? {
        eprintln!("removed {ns}");
    }
    Ok(())
}

/// `testnet nat`: runs the scenario in a fresh run directory (kept if it fails), with the
/// lab torn down on signals; writes `out/nat.json`; an error when it timed out.
pub fn command(o: &Opts, out: &Path) -> anyhow::Result<Value> {
    crate::netlab::ns::install_signal_teardown()?;
    std::fs::create_dir_all(out)?;
    // The report is written in any case; a timed-out run is an error inside the run
    // directory's scope, so that its node logs are kept (and named in the error).
    harness::in_run_dir("tn-nat-", |dir| {
        let report = run(o, dir)?;
        std::fs::write(out.join("nat.json"), serde_json::to_vec_pretty(&report)?)?;
        anyhow::ensure!(
            report["timed_out"] != true,
            "not every worker installed and trained within {:?} (report in {}): {report}",
            o.timeout,
            out.join("nat.json").display()
        );
        Ok(report)
    })
}

/// Runs the scenario under `root`; returns the JSON report (`timed_out: true` when not every
/// worker installed and the steps were not trained within the timeout).
pub fn run(o: &Opts, root: &Path) -> anyhow::Result<Value> {
    anyhow::ensure!(
        !(o.relay && o.wan.is_some()),
        "a relay runs behind NATs only, not on the WAN star"
    );
    let bins = root.join("ns-bin");
    std::fs::create_dir_all(&bins)?;
    let (mut topo, learner_host, relay_host, placed) = build_topology(o)?;

    let swarm = "tn-nat";
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = harness::keygen(&o.bin, &ldir)?;
    let lexe = crate::netlab::node_wrapper(&bins, "learner", &learner_host.ns, &o.bin)?;
    let mut lc = harness::node_config(Role::Learner, swarm, &ldir, 500);
    lc.network.listen = vec![format!("/ip4/{}/tcp/0", learner_host.ip)];
    // Few warm-start steps: the scenario is about the network, not the reward.
    lc.learner.warm_start_steps = 5;
    let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
    let li = fleet.start(&lexe, "learner", &lc, &[])?;
    let laddrs = fleet.wait_addresses(li, &lc, harness::START_LIMIT)?;
    let learner_dial = laddrs
        .dial_addr()
        .context("the learner has no TCP address")?;

    let mut relay_dial = None;
    let relay_bytes_at_start = topo.relay_bytes(relay_host.as_ref());
    if let Some(h) = &relay_host {
        let dir = root.join("relay");
        let exe = crate::netlab::node_wrapper(&bins, "relay", &h.ns, &o.bin)?;
        let mut rc = harness::node_config(Role::Relay, swarm, &dir, 500);
        rc.network.listen = vec![format!("/ip4/{}/tcp/0", h.ip)];
        rc.learner_public_key = Some(key.clone());
        let ri = fleet.start(&exe, "relay", &rc, &[])?;
        let a = fleet
            .wait_addresses(ri, &rc, harness::START_LIMIT)
            .context("starting the relay (does this echo-node implement role \"relay\"?)")?;
        relay_dial = a.dial_addr();
    }

    let mut workers = Vec::new();
    for (name, nat, h) in placed {
        let dir = root.join(&name);
        let exe = crate::netlab::node_wrapper(&bins, &name, &h.ns, &o.bin)?;
        let mut w = harness::node_config(Role::Rollout, swarm, &dir, 500);
        w.network.listen = vec![format!("/ip4/{}/tcp/0", h.ip)];
        w.learner_public_key = Some(key.clone());
        w.network.bootstrap = vec![learner_dial.clone()];
        if let Some(r) = &relay_dial {
            w.network.bootstrap.push(r.clone());
            w.network.relays = vec![r.clone()];
        }
        w.storage.max_pending_groups = 4;
        let i = fleet.start(&exe, &name, &w, &[])?;
        let a = fleet.wait_addresses(i, &w, harness::START_LIMIT)?;
        workers.push(Worker {
            name,
            nat,
            ip: h.ip.to_string(),
            exe,
            admin: a.admin,
            peer_id: a.peer_id,
            first_install_s: None,
        });
    }

    let started = Instant::now();
    let (learner_st, timed_out) =
        wait_for_steps(o, &mut fleet, &lexe, &laddrs.admin, &mut workers, started)?;

    let peers = learner_st["peers"].as_array().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    let worker_ids: Vec<&str> = workers.iter().map(|x| x.peer_id.as_str()).collect();
    for w in &workers {
        let ws = status(&w.exe, &w.admin).unwrap_or(Value::Null);
        rows.push(worker_row(
            w,
            &ws,
            &peers,
            &worker_ids,
            relay_dial.is_some(),
        ));
    }
    let relay_bytes = topo
        .relay_bytes(relay_host.as_ref())
        .zip(relay_bytes_at_start)
        .map(|((tx, rx), (tx0, rx0))| (tx.saturating_sub(tx0), rx.saturating_sub(rx0)));
    let stopping = Instant::now();
    let unclean = fleet.stop(harness::STOP_GRACE);
    let stop_s = stopping.elapsed().as_secs_f64();
    let l = &learner_st["learner"];
    let (wan, packets) = match (&mut topo, o.wan) {
        (Topology::Wan(star), Some(w)) => (
            json!({"rtt_ms": w.rtt_ms, "loss_pct": w.loss_pct, "jitter_ms": w.jitter_ms}),
            star.stop()?.to_json(),
        ),
        _ => (Value::Null, Value::Null),
    };
    let report = json!({
        "scenario": "nat",
        "namespaces": topo.prefix(),
        "wan": wan,
        "emulator_packets": packets,
        "workers": rows,
        "relay": relay_dial.is_some(),
        "relay_bytes": relay_bytes.map(|(tx, _)| tx),
        "relay_bytes_received": relay_bytes.map(|(_, rx)| rx),
        "learner": {"version": l["version"], "groups_pulled": l["groups_pulled"],
            "pull_errors": l["pull_errors"], "snapshots_published": l["snapshots_published"],
            "t_bcast_s": l["t_bcast_s"], "pull_round_trip_s": l["pull_round_trip_s"],
            "pull_round_trip_p90_s": l["pull_round_trip_p90_s"]},
        "timed_out": timed_out,
        "elapsed_s": started.elapsed().as_secs_f64(),
        "unclean_exits": unclean,
        "stop_s": stop_s,
    });
    drop(topo);
    Ok(report)
}

/// Polls until the learner has trained `o.steps` steps past the moment every worker had
/// installed a snapshot (noting each worker's first install, from the first publication), or
/// `o.timeout`; returns the learner's last status and whether it timed out.
fn wait_for_steps(
    o: &Opts,
    fleet: &mut Fleet,
    lexe: &Path,
    admin: &str,
    workers: &mut [Worker],
    started: Instant,
) -> anyhow::Result<(Value, bool)> {
    let mut published_at: Option<Instant> = None;
    let mut target: Option<u64> = None;
    let mut learner_st = Value::Null;
    let done = harness::poll(o.timeout, Duration::from_millis(500), || {
        fleet.ensure_running()?;
        let Some(st) = status(lexe, admin) else {
            return Ok(None);
        };
        let l = &st["learner"];
        if published_at.is_none() && !l["published_version"].is_null() {
            published_at = Some(Instant::now());
        }
        for w in workers.iter_mut().filter(|w| w.first_install_s.is_none()) {
            let installed = status(&w.exe, &w.admin)
                .is_some_and(|s| !s["rollout"]["installed_version"].is_null());
            if installed {
                let t0 = published_at.unwrap_or(started);
                w.first_install_s = Some(t0.elapsed().as_secs_f64());
            }
        }
        let version = l["version"].as_u64().unwrap_or(0);
        if target.is_none() && workers.iter().all(|w| w.first_install_s.is_some()) {
            target = Some(version + o.steps);
        }
        learner_st = st;
        Ok(target.filter(|t| version >= *t).map(|_| ()))
    })?;
    Ok((learner_st, done.is_none()))
}

/// A worker's result row: its NAT, how the learner reaches it (`direct`, `holepunched`,
/// `relayed`), installs and pulls, its chain seat and which other workers it is connected to;
/// from its own status `ws` and the learner's peer rows `peers` (`relayed_swarm`: a relay
/// runs, so a plain connection does not prove a direct path).
fn worker_row(
    w: &Worker,
    ws: &Value,
    peers: &[Value],
    worker_ids: &[&str],
    relayed_swarm: bool,
) -> Value {
    let r = &ws["rollout"];
    let seen = peers.iter().find(|p| p["peer_id"] == w.peer_id.as_str());
    let circuit = seen.is_some_and(|p| {
        p["addrs"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x.as_str().is_some_and(|s| s.contains("/p2p-circuit")))
        })
    });
    let reach = seen.and_then(|p| p["reachability"].as_str());
    let connected = seen.is_some_and(|p| p["connected"] == true);
    let connection = if circuit || reach == Some("relayed") {
        "relayed"
    } else if reach == Some("holepunch") {
        "holepunched"
    } else if connected && !relayed_swarm {
        "direct"
    } else {
        "unknown"
    };
    let pulled = match (r["groups"].as_u64(), r["pending"].as_u64()) {
        (Some(g), Some(p)) => Some(g.saturating_sub(p)),
        (Some(g), None) => Some(g),
        _ => None,
    };
    let chain_position = seen
        .filter(|p| !p["chain"].is_null())
        .map(|p| json!([p["chain"], p["position"]]));
    // Which other workers this one holds a connection to (forwarding needs them).
    let linked: Vec<Value> = ws["peers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|p| p["connected"] == true)
        .filter(|p| {
            p["peer_id"]
                .as_str()
                .is_some_and(|id| worker_ids.contains(&id))
        })
        .map(|p| p["peer_id"].clone())
        .collect();
    let (nat, public_ip) = match w.nat {
        Some((kind, k)) => (kind.as_str(), NatLab::router_public_ip(k).to_string()),
        None => ("none", w.ip.clone()),
    };
    json!({
        "name": w.name, "peer_id": w.peer_id, "nat": nat, "ip": w.ip,
        "public_ip": public_ip,
        "connection": connection, "installed": r["installed_version"], "pulled": pulled,
        "first_install_s": w.first_install_s, "chain_position": chain_position,
        "connected_workers": linked, "reachability": reach,
    })
}

/// The namespaces of a run: NAT routers with `per_nat` workers behind each and a public
/// learner (and relay), or the WAN star; with where each worker sits.
fn build_topology(o: &Opts) -> anyhow::Result<Placement> {
    let mut placed: Vec<(String, Behind, Host)> = Vec::new();
    let (topo, learner_host, relay_host) = match o.wan {
        None => {
            let mut lab = NatLab::new("nat")?;
            let learner_host = lab.public_host("learner")?;
            let relay_host = if o.relay {
                Some(lab.public_host("relay")?)
            } else {
                None
            };
            for kind in ROUTERS {
                let k = lab.router(kind)?;
                for j in 0..o.per_nat {
                    let name = format!("w{k}{j}");
                    let h = lab.host_behind(k, &name)?;
                    placed.push((name, Some((kind, k)), h));
                }
            }
            (Topology::Nat(lab), learner_host, relay_host)
        }
        Some(w) => {
            let path =
                crate::netlab::emu::LinkParams::per_star_link(w.rtt_ms, w.loss_pct, w.jitter_ms);
            let n = 1 + ROUTERS.len() * o.per_nat;
            let star = WanStar::new("wan", n, |_| path, w.seed, None)?;
            for (i, h) in star.hosts.iter().enumerate().skip(1) {
                placed.push((format!("w{i}"), None, h.clone()));
            }
            let learner_host = star.hosts[0].clone();
            (Topology::Wan(star), learner_host, None)
        }
    };
    Ok((topo, learner_host, relay_host, placed))
}
