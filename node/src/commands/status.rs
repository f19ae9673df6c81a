//! `echo-node status [--admin HOST:PORT] [--config FILE] [--json]`: ask a running node's admin
//! endpoint for its view of the swarm.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::Value;

use crate::cli::StatusArgs;
use crate::config::NodeConfig;

pub fn status(args: &StatusArgs) -> anyhow::Result<()> {
    let admin = match (&args.admin, &args.config) {
        (Some(a), _) => a.clone(),
        (None, Some(c)) => NodeConfig::load(c)?.network.admin,
        (None, None) => p2p::NetworkConfig::default().admin,
    };
    let body = http_get(&admin, "/status")?;
    let v: Value = serde_json::from_str(&body)
        .with_context(|| format!("the reply of {admin}/status is not JSON"))?;
    if args.json {
        println!("{v}");
    } else {
        print!("{}", render(&v));
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

fn num(v: &Value, k: &str, prec: usize) -> String {
    match v.get(k) {
        Some(Value::Number(n)) => n
            .as_f64()
            .map_or_else(|| n.to_string(), |x| format!("{x:.prec$}")),
        Some(Value::Null) | None => "-".into(),
        Some(x) => x.to_string(),
    }
}

fn text(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(x) => x.to_string(),
    }
}

/// The human view of a status object.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    let peers = v
        .get("peers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    out.push_str(&format!(
        "node {}  role {}  swarm {}  installed version {}  software {}\n",
        text(v, "peer_id"),
        text(v, "role"),
        text(v, "swarm_id"),
        text(v, "version"),
        text(v, "node_version"),
    ));
    out.push_str(&format!(
        "listening on {}  connected peers {}  known peers {}{}\n",
        v.get("listen_addrs")
            .and_then(Value::as_array)
            .map(|a| a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        text(v, "connected_peers"),
        peers.len(),
        if v.get("private_swarm")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            "  (private swarm)"
        } else {
            ""
        }
    ));
    if let Some(l) = v.get("learner").filter(|l| !l.is_null()) {
        out.push_str(&format!(
            "learner: version {}  S {}  κ {}  bubble {}  μ_pool {} / μ_target {}  T_train {} s  T_bcast {} s\n",
            text(l, "version"),
            text(l, "staleness"),
            text(l, "kappa"),
            num(l, "bubble_ratio", 3),
            num(l, "mu_pool", 2),
            num(l, "mu_target", 2),
            num(l, "t_train_s", 2),
            num(l, "t_bcast_s", 2),
        ));
        out.push_str(&format!(
            "         steps {}  reward (last 20) {}  Δmax observed {} / bound {} (eq. 7), {} (eq. 12)  snapshots {}\n",
            text(l, "steps"),
            num(l, "reward_recent", 3),
            text(l, "staleness_max"),
            text(l, "delta_max_bound"),
            text(l, "delta_max_bound_under_overlap"),
            text(l, "snapshots_published"),
        ));
        let sch = &l["scheduler"];
        if sch["enabled"] == true {
            let count = |k: &str| sch[k].as_array().map_or(0, Vec::len);
            out.push_str(&format!(
                "scheduler ({}): {} active, {} standby, {} $/h, μ active {} (groups/s)\n",
                text(sch, "policy"),
                count("active"),
                count("standby"),
                num(sch, "active_cost_per_hour", 2),
                num(sch, "active_mu", 2),
            ));
        }
    }
    let standby: Vec<&str> = v["learner"]["scheduler"]["standby"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "peer id", "role", "version", "addrs", "score", "speed", "success", "stab.", "decay",
        "hb age s", "pending", "μ", "$/h", "active",
    ]);
    for p in &peers {
        let addrs = p
            .get("addrs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let addr = match addrs.len() {
            0 => "-".to_string(),
            1 => addrs[0].as_str().unwrap_or("").to_string(),
            n => format!("{} (+{})", addrs[0].as_str().unwrap_or(""), n - 1),
        };
        let version = format!(
            "{} / v{}",
            text(p, "node_version"),
            text(p, "installed_version")
        );
        t.add_row(vec![
            text(p, "peer_id"),
            text(p, "role"),
            version,
            addr,
            num(p, "score", 1),
            num(p, "speed", 1),
            num(p, "success", 1),
            num(p, "stability", 1),
            num(p, "decay", 2),
            num(p, "heartbeat_age_s", 1),
            text(p, "pending"),
            num(p, "mu", 2),
            num(p, "cost_per_hour", 2),
            if standby.contains(&text(p, "peer_id").as_str()) {
                "standby".into()
            } else if p.get("active").and_then(Value::as_bool).unwrap_or(false) {
                "yes".into()
            } else {
                "no".into()
            },
        ]);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_peers_learner_and_scheduler() {
        let v: Value = serde_json::json!({
            "peer_id": "12D3", "role": "learner", "version": null,
            "learner": {"version": 7, "staleness": 3, "kappa": 2, "mu_target": 1.5,
                        "scheduler": {"enabled": true, "policy": "fixed", "active": [],
                                      "standby": ["12D3KooWx"], "active_cost_per_hour": 0.4}},
            "peers": [{"peer_id": "12D3KooWx", "role": "rollout", "addrs": ["/ip4/127.0.0.1/tcp/1"],
                       "score": 12.5, "speed": 0.0, "success": 100.0, "stability": 30.0, "decay": 1.0,
                       "heartbeat_age_s": 0.5, "pending": 3, "active": true}]
        });
        let s = render(&v);
        assert!(
            s.contains("12D3KooWx") && s.contains("12.5") && s.contains("rollout"),
            "{s}"
        );
        assert!(
            s.contains("μ_target 1.50") && s.contains("1 standby"),
            "{s}"
        );
        assert!(s.contains("standby │") || s.contains("standby "), "{s}");
    }
}
