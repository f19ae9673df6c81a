//! The relay role and transports with real `echo-node` processes on 127.0.0.1:
//! - a `relay` node, a learner and a worker that both listen *only* through reservations on
//!   the relay and know only the relay's address: the worker finds the learner through the
//!   relay's DHT, reaches it only through the relay's circuit, installs a snapshot, and the
//!   learner pulls its groups through the circuit;
//! - a learner and a worker on QUIC only: the snapshot broadcast and the pulls run over QUIC.
//!
//! What the relay test proves and what it does not: loopback cannot firewall, so "behind NAT"
//! is emulated by giving learner and worker no direct listen address at all (the worker's
//! config names no address of the learner, and the learner announces only its `/p2p-circuit`
//! address). Neither can then accept a direct connection, hole punching (DCUtR) has nothing to
//! punch to, and every byte between them crosses the relay — which the status of both ends
//! and the relay's circuit counters confirm. It does not exercise real NAT mappings, AutoNAT
//! verdicts or a successful hole punch: that is the network-namespace testnet (`testnet nat`,
//! iptables NAT between namespaces).

use std::path::Path;

use serde_json::Value;

use crate::swarm::{keygen, wait_for, Node, WAIT};

/// A node with a fresh key in `root/name`, its config written here (every network setting in
/// `network`), started with `--listen <listen>`.
fn launch(
    root: &Path,
    name: &str,
    role: &str,
    learner_pk: Option<&str>,
    listen: &str,
    network: &str,
    sections: &str,
) -> Node {
    let data = root.join(name);
    std::fs::create_dir_all(&data).unwrap();
    let key = keygen(&data);
    let learner_line = learner_pk
        .map(|k| format!("learner_public_key = \"{k}\"\n"))
        .unwrap_or_default();
    let config = data.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "role = \"{role}\"\nswarm_id = \"it-relay\"\ndata_dir = \"{}\"\n{learner_line}\n\
             [network]\nmdns = false\nautonat = false\nheartbeat_interval_ms = 300\n{network}\n\
             {sections}",
            data.display()
        ),
    )
    .unwrap();
    let mut node = Node {
        name: name.to_string(),
        child: None,
        config,
        log: data.join("node.log"),
        listen: None,
        listen_arg: listen.to_string(),
        admin: String::new(),
        key,
        run_args: Vec::new(),
    };
    node.spawn();
    node
}

/// `status.peers[]` row of `peer_id`.
fn row(status: &Value, peer_id: &str) -> Option<Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"] == peer_id)
        .cloned()
}

const LEARNER: &str = "[learner]\nwarm_start_steps = 0\nmax_steps = 4\n";
const WORKER: &str = "[storage]\nmax_pending_groups = 4\n";

#[test]
fn a_worker_reaches_the_learner_only_through_the_relay() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut relay = launch(root, "relay", "relay", None, "/ip4/127.0.0.1/tcp/0", "", "");
    relay.wait_ready();
    let relay_addr = relay.addr();
    let boot = format!("bootstrap = [\"{relay_addr}\"]");
    let circuit = format!("{relay_addr}/p2p-circuit");

    let mut learner = launch(root, "learner", "learner", None, &circuit, &boot, LEARNER);
    let lst = wait_for("the learner's reservation", WAIT, || {
        let st = learner.status()?;
        (st["nat"]["reservations"].as_array()?.len() == 1).then_some(st)
    });
    assert!(
        lst["listen_addrs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a.as_str().unwrap().contains("/p2p-circuit")),
        "the learner listens only through the relay: {lst}"
    );
    let lpk = learner.key.public_key.clone();
    let lid = learner.key.peer_id.clone();
    let mut worker = launch(root, "w0", "rollout", Some(&lpk), &circuit, &boot, WORKER);
    let wid = worker.key.peer_id.clone();

    // The worker installs a snapshot, and the learner pulls groups from it.
    let limit = std::time::Duration::from_secs(240);
    wait_for("the worker to install a snapshot", limit, || {
        worker.status()?["version"].as_u64()
    });
    wait_for("the learner to pull groups from the worker", limit, || {
        let pulled = learner.status()?["learner"]["groups_pulled"].as_u64()?;
        (pulled >= 1).then_some(())
    });

    // Both ends see a relayed connection; the worker's heartbeats say it is relay-only.
    let wst = worker.status().unwrap();
    let l_row = row(&wst, &lid).expect("the worker knows the learner");
    assert_eq!(l_row["connection"], "relayed", "{l_row}");
    assert_eq!(wst["reachability"], "relayed", "{}", wst["nat"]);
    let w_row = wait_for("the learner's row for the worker", WAIT, || {
        row(&learner.status()?, &wid).filter(|r| r["reachability"] == "relayed")
    });
    assert_eq!(w_row["connection"], "relayed", "{w_row}");
    // The only worker, relay-only: alone in chain 0, where it forwards to nobody.
    let w_row = wait_for("the worker's chain position", limit, || {
        row(&learner.status()?, &wid).filter(|r| !r["chain"].is_null())
    });
    assert_eq!(
        (w_row["chain"].clone(), w_row["position"].clone()),
        (0.into(), 0.into())
    );

    // The relay carried it: two reservations, at least one circuit; no stores of its own.
    let rst = relay.status().unwrap();
    assert_eq!(rst["role"], "relay");
    let server = &rst["nat"]["relay_server"];
    assert_eq!(server["reservations"], 2, "{server}");
    assert!(
        server["circuits_accepted_total"].as_u64().unwrap() >= 1,
        "{server}"
    );
    let relay_dir = root.join("relay");
    for store in ["trajectories", "snapshots"] {
        assert!(
            !relay_dir.join(store).exists(),
            "a relay opened a {store} store"
        );
    }
}

#[test]
fn a_broadcast_and_pulls_run_over_quic_only() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let quic = "/ip4/127.0.0.1/udp/0/quic-v1";
    let mut learner = launch(root, "learner", "learner", None, quic, "", LEARNER);
    learner.wait_ready();
    let laddr = learner.addr();
    assert!(laddr.contains("/quic-v1"), "{laddr}");
    let boot = format!("bootstrap = [\"{laddr}\"]");
    let lpk = learner.key.public_key.clone();
    let mut worker = launch(root, "w0", "rollout", Some(&lpk), quic, &boot, WORKER);
    let wid = worker.key.peer_id.clone();
    let limit = std::time::Duration::from_secs(240);
    wait_for("the worker to install a snapshot over QUIC", limit, || {
        worker.status()?["version"].as_u64()
    });
    wait_for("the learner to pull groups over QUIC", limit, || {
        let pulled = learner.status()?["learner"]["groups_pulled"].as_u64()?;
        (pulled >= 1).then_some(())
    });
    let st = learner.status().unwrap();
    assert_eq!(st["quic"], true);
    let w_row = row(&st, &wid).expect("the learner knows the worker");
    assert_eq!(w_row["connection"], "direct", "{w_row}");
    let addrs = w_row["addrs"].as_array().unwrap();
    assert!(
        !addrs.is_empty()
            && addrs
                .iter()
                .all(|a| a.as_str().unwrap().contains("/quic-v1")),
        "{w_row}"
    );
}

#[test]
fn the_relay_example_config_is_valid_and_needs_no_model() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/relay.toml");
    let c = echo_node::config::NodeConfig::load(&path).unwrap();
    c.validate(&path).unwrap();
    assert_eq!(c.role, p2p::Role::Relay);
    assert!(c.learner_public_key.is_none());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("[model]"), "a relay config needs no [model]");
}
