//! `echo-node status [--admin HOST:PORT] [-c|--config FILE] [--wide] [--json]`: ask a running
//! node's admin endpoint for its view of the swarm. The peer table is narrow by default (fits
//! an 80–100 column terminal: short peer ids, the columns an operator acts on); `--wide` shows
//! every column and full ids.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::api::NodeStatus;
use crate::cli::StatusArgs;
use crate::config::NodeConfig;

pub fn status(args: &StatusArgs) -> anyhow::Result<()> {
    let admin = match (&args.admin, &args.config) {
        (Some(a), _) => a.clone(),
        (None, Some(c)) => NodeConfig::load(c)?.network.admin,
        (None, None) => p2p::NetworkConfig::default().admin,
    };
    let body = http_get(&admin, "/status")?;
    if args.json {
        // As served: a newer node's extra fields pass through.
        let v: serde_json::Value = serde_json::from_str(&body)
            .with_context(|| format!("the reply of {admin}/status is not JSON"))?;
        println!("{v}");
    } else {
        let st: NodeStatus = serde_json::from_str(&body).with_context(|| {
            format!("the reply of {admin}/status is not an echo-node status object")
        })?;
        print!("{}", render(&st, args.wide));
    }
    Ok(())
}

/// GET `http://HOST:PORT{path}` of an admin endpoint (loopback HTTP: no TLS, no proxy, no
/// redirects) and return the body; `ureq` does the HTTP/1.1 framing, chunked bodies included.
/// Connecting is bounded by 3 s and the whole exchange by 10 s.
pub fn http_get(host_port: &str, path: &str) -> anyhow::Result<String> {
    let addr: SocketAddr = host_port
        .to_socket_addrs()
        .with_context(|| format!("`{host_port}` is not HOST:PORT"))?
        .next()
        .with_context(|| format!("`{host_port}` resolves to no address"))?;
    let unreachable = || {
        format!("cannot reach the admin endpoint {addr} (is the node running? see network.admin in its config)")
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(3)))
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut reply = agent
        .get(format!("http://{addr}{path}"))
        .header("accept", "application/json")
        .call()
        .with_context(unreachable)?;
    let code = reply.status();
    let body = reply
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_string()
        .with_context(unreachable)?;
    anyhow::ensure!(
        code.is_success(),
        "{addr}{path} answered `{code}`: {}",
        body.trim()
    );
    Ok(body)
}

/// `x` with `prec` decimals, `-` when unknown.
fn num(x: Option<f64>, prec: usize) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// `x`, `-` when unknown.
fn opt<T: ToString>(x: Option<T>) -> String {
    x.map_or_else(|| "-".into(), |x| x.to_string())
}

/// `cpu`, or `cuda` with free / total GiB and the compute capability.
fn device(d: Option<&p2p::DeviceReport>) -> String {
    let Some(d) = d else {
        return "-".into();
    };
    if d.kind != "cuda" {
        return d.kind.clone();
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    format!(
        "{} {:.1}/{:.1} GiB free{}",
        d.name,
        gib(d.memory_free_bytes),
        gib(d.memory_total_bytes),
        d.compute_capability
            .as_ref()
            .map_or(String::new(), |c| format!(" (cc {c})"))
    )
}

/// A worker's installed payload on the delta chain, its catch-ups and restore.
fn payload_line(r: &crate::api::RolloutStatus) -> String {
    let at = match &r.installed_payload {
        None => "none".to_string(),
        Some(p) => match p.position {
            crate::api::PayloadPosition::Keyframe => format!("v{} keyframe", p.version),
            crate::api::PayloadPosition::Delta => format!(
                "v{} delta chain ({} since keyframe v{})",
                p.version,
                p.deltas_since_keyframe,
                opt(p.keyframe_version)
            ),
        },
    };
    format!(
        "worker: installed {at}  catch-ups {} ({} B)  restored {}\n",
        r.catch_ups,
        r.catch_up_bytes,
        opt(r.restored_version)
    )
}

/// The human view of a status object; `wide`: every peer column and full peer ids.
pub fn render(st: &NodeStatus, wide: bool) -> String {
    let net = &st.network;
    let mut out = String::new();
    out.push_str(&format!(
        "node {}  role {}  swarm {}  installed version {}  software {}\n",
        net.peer_id,
        net.role,
        net.swarm_id,
        opt(st.version),
        st.node_version,
    ));
    out.push_str(&format!(
        "listening on {}  connected peers {}  known peers {}{}\n",
        net.listen_addrs.join(", "),
        net.connected_peers,
        net.peers.len(),
        if net.private_swarm {
            "  (private swarm)"
        } else {
            ""
        }
    ));
    out.push_str(&crate::api::nat_line(net));
    let empty = std::collections::BTreeMap::new();
    let (mut standby, mut refused): (&[String], _) = (&[], &empty);
    if let Some(l) = &st.learner {
        out.push_str(&learner_lines(l));
        standby = &l.scheduler.standby;
        refused = &l.admission.refused;
    }
    if let Some(r) = &st.rollout {
        out.push_str(&payload_line(r));
        out.push_str(&contribution_line(net));
    }
    let view = PeerMarks { standby, refused };
    out.push_str(&if wide {
        peer_table(&net.peers, &view)
    } else {
        narrow_peer_table(&net.peers, &view)
    });
    out.push('\n');
    out.push_str(&refused_lines(refused));
    out.push_str(&bans(net));
    out
}

/// The learner's lines: window, throughput, rewards, snapshots and the scheduler.
fn learner_lines(l: &crate::api::LearnerStatus) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "learner: version {}  S {}  κ {}  bubble {:.3}  μ_pool {:.2} / μ_target {}{}  T_train {} s  T_bcast {}{} s\n",
        l.version,
        l.staleness,
        l.kappa,
        l.bubble_ratio,
        l.mu_pool,
        if l.t_bcast_lower_bound { "≥ " } else { "" },
        num(l.mu_target, 2),
        num(l.t_train_s, 2),
        if l.t_bcast_lower_bound { "≥ " } else { "" },
        num(l.t_bcast_s, 2),
    ));
    out.push_str(&format!(
        "         steps {}  reward (last 20, {}) {}  fully verified {} ({} groups)  Δmax observed {} / bound {} (eq. 7), {} (eq. 12)  snapshots {}\n",
        l.steps,
        l.reward_basis,
        num(l.reward_recent, 3),
        num(l.reward_recent_checked, 3),
        l.reward_checked_groups,
        l.staleness_max,
        opt(l.delta_max_bound),
        opt(l.delta_max_bound_under_overlap),
        l.snapshots_published,
    ));
    if let Some(p) = &l.snapshot_payloads {
        out.push_str(&format!(
            "         snapshots: {} keyframes (mean {} B), {} deltas (mean {} B, ratio {}), catch-ups served {}\n",
            p.keyframes,
            num(p.keyframe_bytes_mean, 0),
            p.deltas,
            num(p.delta_bytes_mean, 0),
            num(p.delta_ratio, 3),
            p.catch_ups_served,
        ));
    }
    let sch = &l.scheduler;
    if sch.enabled {
        // A claimed μ counted for less than claimed: more than twice what the worker delivered.
        let capped = match sch.claims_capped.len() {
            0 => String::new(),
            n => format!(", {n} μ claim(s) capped by delivery"),
        };
        out.push_str(&format!(
            "scheduler ({}): {} active, {} standby, {:.2} $/h, μ active {:.2} (groups/s){capped}\n",
            sch.policy.as_deref().unwrap_or("-"),
            sch.active.len(),
            sch.standby.len(),
            sch.active_cost_per_hour,
            sch.active_mu,
        ));
    }
    out
}

/// A worker's contribution as the learner accounts it: its row of the learner's last score
/// table (a learner-authored gossip message), not the worker's own counters.
fn contribution_line(net: &p2p::NetworkStatus) -> String {
    let Some(table) = &net.learner_scores else {
        return "learner's account: no score table from the learner yet\n".into();
    };
    let age = storage::unix_ms().saturating_sub(table.sent_unix_ms) as f64 / 1000.0;
    let row = table.entries.iter().find(|e| e.peer_id == net.peer_id);
    match row.and_then(|e| e.contribution.as_ref().map(|c| (e, c))) {
        None => format!(
            "learner's account (score table {age:.0} s old): nothing on this worker yet{}\n",
            row.map_or(String::new(), |e| format!(" (score {:.1})", e.score))
        ),
        Some((e, c)) => format!(
            "learner's account (score table {age:.0} s old): pulled {}  accepted {}  rejected {}  trained {}  strikes {}  score {:.1}{}\n",
            c.pulled,
            c.accepted,
            c.rejected,
            c.trained,
            c.strikes,
            e.score,
            c.refused
                .as_ref()
                .map_or(String::new(), |r| format!("\n  REFUSED by the learner (not pulled from): {r}"))
        ),
    }
}

/// What the learner decided about each peer, for the state column.
struct PeerMarks<'a> {
    standby: &'a [String],
    /// Workers the learner does not pull from, and why.
    refused: &'a std::collections::BTreeMap<String, String>,
}

impl PeerMarks<'_> {
    /// `banned`, `refused` (not pulled from: admission or a sampling-rule mismatch),
    /// `standby`, `yes` (active) or `no`.
    fn state(&self, p: &p2p::PeerStatus) -> &'static str {
        if p.banned {
            "banned"
        } else if self.refused.contains_key(&p.peer_id) {
            "refused"
        } else if self.standby.contains(&p.peer_id) {
            "standby"
        } else if p.active {
            "yes"
        } else {
            "no"
        }
    }
}

/// A peer id's first four and last eight characters (every Ed25519 peer id starts `12D3KooW`:
/// the tail tells them apart), as the admin page shows them.
fn short_id(id: &str) -> String {
    let n = id.chars().count();
    if n <= 16 {
        return id.to_string();
    }
    let head: String = id.chars().take(4).collect();
    let tail: String = id.chars().skip(n - 8).collect();
    format!("{head}…{tail}")
}

/// The workers the learner does not pull from, each with why (full ids: the reason is what
/// their operator must fix).
fn refused_lines(refused: &std::collections::BTreeMap<String, String>) -> String {
    if refused.is_empty() {
        return String::new();
    }
    let mut out = String::from("refused by the learner (not pulled from):\n");
    for (id, why) in refused {
        out.push_str(&format!("  {id}: {why}\n"));
    }
    out
}

/// The default peer table: short ids and the columns an operator acts on (`--wide`: all).
fn narrow_peer_table(peers: &[p2p::PeerStatus], marks: &PeerMarks<'_>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "peer",
        "role",
        "installed",
        "score",
        "hb age s",
        "pending",
        "μ",
        "state",
    ]);
    for p in peers {
        let installed = format!(
            "v{}{}",
            opt(p.installed_version),
            p.install_lag
                .filter(|&l| l > 0)
                .map_or(String::new(), |l| format!(" (−{l})"))
        );
        t.add_row(vec![
            short_id(&p.peer_id),
            p.role.map_or_else(|| "-".into(), |r| r.to_string()),
            installed,
            format!("{:.1}", p.score.score),
            num(p.heartbeat_age_s, 1),
            opt(p.pending),
            num(p.mu, 2),
            marks.state(p).to_string(),
        ]);
    }
    t.to_string()
}

/// One row per known peer: identity, version, score parts, pending work and state.
fn peer_table(peers: &[p2p::PeerStatus], marks: &PeerMarks<'_>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "peer id", "role", "version", "device", "addrs", "score", "speed", "success", "stab.",
        "decay", "hb age s", "pending", "μ", "$/h", "active",
    ]);
    for p in peers {
        let addr = match p.addrs.as_slice() {
            [] => "-".to_string(),
            [a] => a.clone(),
            [a, rest @ ..] => format!("{a} (+{})", rest.len()),
        };
        let version = format!(
            "{} / v{}{}",
            p.node_version.as_deref().unwrap_or("-"),
            opt(p.installed_version),
            p.install_lag
                .filter(|&l| l > 0)
                .map_or(String::new(), |l| format!(" (−{l})"))
        );
        let s = &p.score;
        t.add_row(vec![
            p.peer_id.clone(),
            p.role.map_or_else(|| "-".into(), |r| r.to_string()),
            version,
            device(p.device.as_ref()),
            addr,
            format!("{:.1}", s.score),
            format!("{:.1}", s.speed),
            format!("{:.1}", s.success),
            format!("{:.1}", s.stability),
            format!("{:.2}", s.decay),
            num(p.heartbeat_age_s, 1),
            opt(p.pending),
            num(p.mu, 2),
            num(p.cost_per_hour, 2),
            marks.state(p).to_string(),
        ]);
    }
    t.to_string()
}

/// The defence counters, and a table of the banned peers with their reasons (empty when no
/// strike was ever counted).
fn bans(net: &p2p::NetworkStatus) -> String {
    let c = &net.counters;
    if c.strikes == 0 && c.bans == 0 && c.connections_denied == 0 {
        return String::new();
    }
    let mut out = format!(
        "strikes {}  bans {}  connections refused {}  heartbeats rate-limited {}\n",
        c.strikes, c.bans, c.connections_denied, c.heartbeats_ignored
    );
    let banned: Vec<&p2p::PeerStatus> = net.peers.iter().filter(|p| p.banned).collect();
    if banned.is_empty() {
        return out;
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "banned peer",
        "role",
        "reason",
        "strikes",
        "by reason",
    ]);
    for p in banned {
        let by: Vec<String> = p
            .strikes_by_reason
            .iter()
            .map(|(r, n)| format!("{r} ×{n}"))
            .collect();
        t.add_row(vec![
            p.peer_id.clone(),
            p.role.map_or_else(|| "-".into(), |r| r.to_string()),
            p.ban_reason.clone().unwrap_or_else(|| "-".into()),
            p.strikes.to_string(),
            by.join(", "),
        ]);
    }
    out.push_str(&format!("bans (for the run):\n{t}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_learner_scheduler_and_peers() {
        let st: NodeStatus = serde_json::from_str(
            r#"{
              "peer_id": "12D3", "role": "learner", "swarm_id": "s", "listen_addrs": [],
              "external_addrs": [], "connected_peers": 1, "private_swarm": false, "quic": false,
              "local": {"installed_version": null, "mu": 0.0, "availability": 1.0, "pending": 0,
                        "forward_rate_bps": 0.0, "receive_rate_bps": 0.0},
              "counters": {}, "learner_scores": null, "version": null, "node_version": "0.1.0",
              "learner": {"version": 7, "staleness": 3, "kappa": 2, "mu_target": 1.5,
                          "scheduler": {"enabled": true, "policy": "fixed", "active": [],
                                        "standby": ["12D3KooWx"], "active_cost_per_hour": 0.4,
                                        "claims_capped": ["12D3KooWx"]}},
              "peers": [{"peer_id": "12D3KooWx", "role": "rollout", "addrs": ["/ip4/127.0.0.1/tcp/1"],
                         "installed_version": null, "chain": null, "position": null, "mu": null,
                         "cost_per_hour": null, "pending": 3, "connected": true,
                         "node_version": null, "agent_version": null, "availability": null,
                         "forward_rate_bps": null, "receive_rate_bps": null,
                         "heartbeat_age_s": 0.5, "heartbeats": 3, "started_unix_ms": null,
                         "rejected_messages": 0, "gossip_score": null,
                         "score": 12.5, "speed": 0.0, "success": 100.0, "stability": 30.0, "decay": 1.0,
                         "avg_speed_bps": 0.0, "successes": 3, "failures": 0,
                         "consecutive_failures": 0, "active": true,
                       "device": {"kind": "cuda", "name": "NVIDIA H100", "memory_total_bytes": 85899345920,
                                  "memory_free_bytes": 64424509440, "compute_capability": "9.0"}}]
        }"#,
        )
        .unwrap();
        let s = render(&st, true);
        assert!(
            s.contains("12D3KooWx") && s.contains("12.5") && s.contains("rollout"),
            "{s}"
        );
        assert!(
            s.contains("μ_target 1.50") && s.contains("1 standby"),
            "{s}"
        );
        assert!(s.contains("1 μ claim(s) capped by delivery"), "{s}");
        assert!(s.contains("standby │") || s.contains("standby "), "{s}");
        assert!(s.contains("NVIDIA H100 60.0/80.0 GiB free (cc 9.0)"), "{s}");
        // No strike yet: no defence section.
        assert!(!s.contains("bans"), "{s}");
    }

    /// The default table fits a 100-column terminal, and a worker the learner refuses is
    /// marked `refused` with why, not `yes` (issue 49).
    #[test]
    fn the_default_table_is_narrow_and_marks_refused_workers() {
        let mut v: serde_json::Value = serde_json::from_str(
            r#"{
              "peer_id": "12D3", "role": "learner", "swarm_id": "s", "listen_addrs": [],
              "external_addrs": [], "connected_peers": 1, "private_swarm": false, "quic": false,
              "local": {"installed_version": null, "mu": 0.0, "availability": 1.0, "pending": 0,
                        "forward_rate_bps": 0.0, "receive_rate_bps": 0.0},
              "counters": {}, "learner_scores": null, "version": 4, "node_version": "0.1.0",
              "learner": {"version": 4, "admission": {"refused": {
                  "12D3KooWRefusedWorkerPeerIdAAAAAAAAAAAAAAAAAAAAAAAA":
                  "sampling rule: temperature 1 is not the learner's 1.2"}}},
              "peers": []
            }"#,
        )
        .unwrap();
        let peer = |id: &str| {
            serde_json::json!({"peer_id": id, "role": "rollout", "addrs": ["/ip4/127.0.0.1/tcp/4001"],
                "installed_version": 4, "chain": 0, "position": 1, "mu": 1.5,
                "cost_per_hour": 0.2, "pending": 20, "connected": true,
                "node_version": "0.1.0", "agent_version": null, "availability": 1.0,
                "forward_rate_bps": null, "receive_rate_bps": null, "heartbeat_age_s": 0.4,
                "heartbeats": 9, "started_unix_ms": null, "rejected_messages": 0,
                "gossip_score": null, "score": 55.5, "speed": 40.0, "success": 99.9,
                "stability": 30.0, "decay": 1.0, "avg_speed_bps": 0.0, "successes": 3,
                "failures": 0, "consecutive_failures": 0, "active": true,
                "device": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85_899_345_920_u64,
                           "memory_free_bytes": 64_424_509_440_u64, "compute_capability": "9.0"}})
        };
        v["peers"] = serde_json::json!([
            peer("12D3KooWRefusedWorkerPeerIdAAAAAAAAAAAAAAAAAAAAAAAA"),
            peer("12D3KooWGoodWorkerPeerIdBBBBBBBBBBBBBBBBBBBBBBBBBBB")
        ]);
        let st: NodeStatus = serde_json::from_value(v).unwrap();
        let narrow = render(&st, false);
        let table: Vec<&str> = narrow.lines().filter(|l| l.contains('│')).collect();
        assert!(!table.is_empty(), "{narrow}");
        for l in &table {
            assert!(
                l.chars().count() <= 100,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        let refused_row = table.iter().find(|l| l.contains("AAAAAAAA")).unwrap();
        assert!(
            refused_row.contains("refused") && !refused_row.contains(" yes "),
            "{narrow}"
        );
        let good_row = table.iter().find(|l| l.contains("BBBBBBBB")).unwrap();
        assert!(good_row.contains("yes"), "{narrow}");
        assert!(
            narrow.contains("12D3KooWRefusedWorkerPeerIdAAAAAAAAAAAAAAAAAAAAAAAA: sampling rule"),
            "the full id and the reason below the table: {narrow}"
        );
        let wide = render(&st, true);
        assert!(
            wide.contains("NVIDIA H100") && wide.contains("decay"),
            "{wide}"
        );
        assert!(!narrow.contains("decay"), "{narrow}");
    }

    /// On a worker, what the learner did with its groups comes from the learner's score
    /// table (its row's contribution), refusal included.
    #[test]
    fn a_worker_sees_its_contribution_from_the_learners_score_table() {
        let me = "12D3KooWMeWorkerPeerIdCCCCCCCCCCCCCCCCCCCCCCCCCCCCC";
        let v = serde_json::json!({
            "peer_id": me, "role": "rollout", "swarm_id": "s", "listen_addrs": [],
            "external_addrs": [], "connected_peers": 1, "private_swarm": false, "quic": false,
            "local": {"installed_version": 3, "mu": 1.0, "availability": 1.0, "pending": 20,
                      "forward_rate_bps": 0.0, "receive_rate_bps": 0.0},
            "counters": {}, "version": 3, "node_version": "0.1.0", "peers": [],
            "rollout": {"installed_version": 3, "groups": 40},
            "learner_scores": {"v": 1, "swarm_id": "s", "sent_unix_ms": storage::unix_ms(),
                "entries": [{"peer_id": me, "score": 80.0, "speed": 100.0, "success": 90.0,
                             "stability": 100.0, "decay": 1.0,
                             "contribution": {"pulled": 20, "accepted": 18, "rejected": 2,
                                              "trained": 16, "strikes": 1,
                                              "refused": "sampling rule: temperature 1 is not 1.2"}}]}
        });
        let st: NodeStatus = serde_json::from_value(v.clone()).unwrap();
        let s = render(&st, false);
        assert!(
            s.contains("pulled 20  accepted 18  rejected 2  trained 16  strikes 1"),
            "{s}"
        );
        assert!(
            s.contains("REFUSED by the learner (not pulled from): sampling rule"),
            "{s}"
        );
        let mut older = v;
        older["learner_scores"]["entries"][0]
            .as_object_mut()
            .unwrap()
            .remove("contribution");
        let st: NodeStatus = serde_json::from_value(older).unwrap();
        assert!(render(&st, false).contains("nothing on this worker yet (score 80.0)"));
    }

    #[test]
    fn render_shows_banned_peers_with_their_reason() {
        let mut v: serde_json::Value = serde_json::from_str(
            r#"{
              "peer_id": "12D3", "role": "learner", "swarm_id": "s", "listen_addrs": [],
              "external_addrs": [], "connected_peers": 0, "private_swarm": false, "quic": false,
              "local": {"installed_version": null, "mu": 0.0, "availability": 1.0, "pending": 0,
                        "forward_rate_bps": 0.0, "receive_rate_bps": 0.0},
              "counters": {"strikes": 3, "bans": 1, "connections_denied": 2},
              "learner_scores": null, "version": null, "node_version": "0.1.0", "peers": []
            }"#,
        )
        .unwrap();
        let peer = |id: &str, banned: bool| {
            serde_json::json!({"peer_id": id, "role": "rollout", "addrs": [],
                "installed_version": null, "chain": null, "position": null, "mu": null,
                "cost_per_hour": null, "pending": null, "connected": false,
                "node_version": null, "agent_version": null, "availability": null,
                "forward_rate_bps": null, "receive_rate_bps": null, "heartbeat_age_s": null,
                "heartbeats": 0, "started_unix_ms": null, "rejected_messages": 1,
                "gossip_score": null, "score": 0.0, "speed": 0.0, "success": 0.0,
                "stability": 0.0, "decay": 1.0, "avg_speed_bps": 0.0, "successes": 0,
                "failures": 3, "consecutive_failures": 3, "active": false,
                "banned": banned, "ban_reason": banned.then_some("corrupt_chunk"),
                "strikes": 3, "strikes_by_reason": {"corrupt_chunk": 2, "bad_message": 1}})
        };
        v["peers"] = serde_json::json!([peer("12D3KooWbad", true), peer("12D3KooWok", false)]);
        let st: NodeStatus = serde_json::from_value(v).unwrap();
        let s = render(&st, true);
        assert!(
            s.contains("strikes 3  bans 1  connections refused 2"),
            "{s}"
        );
        let bans = &s[s.find("bans (for the run)").expect("a bans table")..];
        assert!(
            bans.contains("12D3KooWbad") && !bans.contains("12D3KooWok"),
            "{s}"
        );
        assert!(
            bans.contains("corrupt_chunk ×2, bad_message ×1")
                || bans.contains("bad_message ×1, corrupt_chunk ×2"),
            "{s}"
        );
        assert!(s.contains("banned │") || s.contains("banned "), "{s}");
    }
}
