//! Swarm membership with real `echo-node` processes on 127.0.0.1: discovery, `status --json`,
//! private swarms (pre-shared key, allow-list), malformed heartbeats, restart with the same
//! peer id. Every wait polls a condition against a deadline; every child is killed and reaped
//! on drop, also when a test fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_echo-node");
const HEARTBEAT_MS: u64 = 300;
pub(crate) const WAIT: Duration = Duration::from_secs(45);
/// These tests are about membership: the roles run but stay nearly idle (no warm start, one
/// training step, at most one pending group per worker), so that the machine's two cores
/// serve the network.
const QUIET_ROLES: &str =
    "[storage]\nmax_pending_groups = 1\n[learner]\nwarm_start_steps = 0\nmax_steps = 1\n";

/// Polls until a condition holds, or panics with what it waited for (the test kit's).
pub(crate) use testkit::wait_for;

/// The lines of `node`'s log containing `message`, ANSI colours stripped.
pub(crate) fn log_lines(node: &Node, message: &str) -> Vec<String> {
    lines_containing(
        &std::fs::read_to_string(&node.log).unwrap_or_default(),
        message,
    )
}

/// The lines of a piece of a log containing `message`, ANSI colours stripped.
pub(crate) fn lines_containing(text: &str, message: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.contains(message)) {
        let mut plain = String::new();
        let mut esc = false;
        for c in line.chars() {
            match (esc, c) {
                (false, '\u{1b}') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => plain.push(c),
            }
        }
        out.push(plain);
    }
    out
}

/// `echo-node inspect WHAT --json` on a stopped node's data dir (`trajectories`,
/// `snapshots`), parsed; panics with the node's stderr when it fails.
pub(crate) fn inspect(data: &Path, what: &str) -> Value {
    let out = Command::new(BIN)
        .args(["inspect", what, "--json", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "inspect {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub(crate) struct Key {
    pub(crate) peer_id: String,
    pub(crate) public_key: String,
}

pub(crate) fn keygen(dir: &Path) -> Key {
    let out = Command::new(BIN)
        .args(["keygen", "--json", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    Key {
        peer_id: v["peer_id"].as_str().unwrap().to_string(),
        public_key: v["public_key"].as_str().unwrap().to_string(),
    }
}

/// A running node; killed and reaped on drop.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) child: Option<Child>,
    pub(crate) config: PathBuf,
    pub(crate) log: PathBuf,
    /// The node's TCP listen address, learned from its status (it listens on port 0).
    pub(crate) listen: Option<String>,
    /// The admin endpoint, learned from the node's address file once it is up (the node binds
    /// port 0); empty until then.
    pub(crate) admin: String,
    pub(crate) key: Key,
    /// `--listen` of the next spawn (port 0 by default; a restart may pin the old address).
    pub(crate) listen_arg: String,
    /// More arguments of `echo-node run` (e.g. the benchmark roles' hidden flags).
    pub(crate) run_args: Vec<String>,
}

impl Node {
    /// Writes a config for `role` under `root/name` and starts the node (roles kept quiet).
    fn start(
        root: &Path,
        name: &str,
        role: &str,
        swarm: &str,
        learner_pk: Option<&str>,
        network_extra: &str,
    ) -> Node {
        Node::start_full(
            root,
            name,
            role,
            swarm,
            learner_pk,
            network_extra,
            QUIET_ROLES,
        )
    }

    /// A new node with a fresh key in `root/name`; `sections` are TOML tables appended after
    /// `[network]` (the role's settings).
    pub(crate) fn start_full(
        root: &Path,
        name: &str,
        role: &str,
        swarm: &str,
        learner_pk: Option<&str>,
        network_extra: &str,
        sections: &str,
    ) -> Node {
        let data = root.join(name);
        std::fs::create_dir_all(&data).unwrap();
        let key = keygen(&data);
        Node::launch(
            root,
            name,
            role,
            swarm,
            learner_pk,
            network_extra,
            sections,
            key,
        )
    }

    /// A rollout worker in `root/name` joining `learner`'s swarm: bootstrapped at the
    /// learner's address and trusting its key; `sections` as in [`Node::start_full`].
    pub(crate) fn start_worker_of(
        root: &Path,
        name: &str,
        swarm: &str,
        learner: &Node,
        sections: &str,
    ) -> Node {
        let boot = format!("bootstrap = [\"{}\"]", learner.addr());
        let lpk = learner.key.public_key.clone();
        Node::start_full(root, name, "rollout", swarm, Some(&lpk), &boot, sections)
    }

    /// Like [`Node::start`] for a node whose key exists already in `root/name`.
    fn start_with_key(
        root: &Path,
        name: &str,
        role: &str,
        swarm: &str,
        learner_pk: Option<&str>,
        network_extra: &str,
        key: Key,
    ) -> Node {
        Node::launch(
            root,
            name,
            role,
            swarm,
            learner_pk,
            network_extra,
            QUIET_ROLES,
            key,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        root: &Path,
        name: &str,
        role: &str,
        swarm: &str,
        learner_pk: Option<&str>,
        network_extra: &str,
        sections: &str,
        key: Key,
    ) -> Node {
        let mut node = Node::configure(
            root,
            name,
            role,
            swarm,
            learner_pk,
            network_extra,
            sections,
            key,
        );
        node.spawn();
        node
    }

    /// Writes the node's config (as [`Node::launch`]) without starting it: set `run_args`,
    /// then [`Node::spawn`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn configure(
        root: &Path,
        name: &str,
        role: &str,
        swarm: &str,
        learner_pk: Option<&str>,
        network_extra: &str,
        sections: &str,
        key: Key,
    ) -> Node {
        let data = root.join(name);
        let learner_line = learner_pk
            .map(|k| format!("learner_public_key = \"{k}\"\n"))
            .unwrap_or_default();
        let heartbeat = if network_extra.contains("heartbeat_interval_ms") {
            String::new()
        } else {
            format!("heartbeat_interval_ms = {HEARTBEAT_MS}\n")
        };
        let config = data.join("node.toml");
        std::fs::write(
            &config,
            format!(
                "role = \"{role}\"\nswarm_id = \"{swarm}\"\ndata_dir = \"{}\"\n{learner_line}\n[network]\n\
                 mdns = false\nautonat = false\n{heartbeat}{network_extra}\n{sections}",
                data.display()
            ),
        )
        .unwrap();
        Node {
            name: name.to_string(),
            child: None,
            config,
            log: data.join("node.log"),
            listen: None,
            listen_arg: "/ip4/127.0.0.1/tcp/0".into(),
            admin: String::new(),
            key,
            run_args: Vec::new(),
        }
    }

    pub(crate) fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--listen", &self.listen_arg, "--admin", "127.0.0.1:0"])
            .args(&self.run_args)
            .env("RUST_LOG", "info,p2p=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        // A new process binds new ports: learn them from its address file.
        self.admin.clear();
    }

    /// Dialable address with peer id (call after `wait_ready`).
    pub(crate) fn addr(&self) -> String {
        let listen = self.listen.as_ref().expect("wait_ready() first");
        format!("{listen}/p2p/{}", self.key.peer_id)
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `echo-node status --admin … --json`, or None while the endpoint does not answer.
    pub(crate) fn status(&mut self) -> Option<Value> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(code)) = c.try_wait() {
                panic!(
                    "node {} exited with {code}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if self.admin.is_empty() {
                let data = self.config.parent().expect("the config is in the data dir");
                self.admin = echo_node::addr_file::read(data, c.id())?.admin;
            }
        }
        let out = Command::new(BIN)
            .args(["status", "--json", "--admin", &self.admin])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let st: Value = serde_json::from_slice(&out.stdout).ok()?;
        // Only our own node counts (not whoever else answers on a reused port).
        if st["peer_id"] != self.key.peer_id.as_str() {
            return None;
        }
        if let Some(a) = st["listen_addrs"].as_array().and_then(|a| a.first()) {
            self.listen = a.as_str().map(str::to_string);
        }
        Some(st)
    }

    /// A learner (`learner_sections` after its `[network]` table) in `root/learner`, ready,
    /// and `n` workers `w0…` bootstrapping from it (`worker_sections`), started.
    pub(crate) fn learner_and_workers(
        root: &Path,
        swarm: &str,
        learner_sections: &str,
        n: usize,
        worker_sections: &str,
    ) -> (Node, Vec<Node>) {
        let mut learner = Node::start_full(
            root,
            "learner",
            "learner",
            swarm,
            None,
            "",
            learner_sections,
        );
        learner.wait_ready();
        let workers = (0..n)
            .map(|i| {
                Node::start_worker_of(root, &format!("w{i}"), swarm, &learner, worker_sections)
            })
            .collect();
        (learner, workers)
    }

    pub(crate) fn wait_ready(&mut self) -> Value {
        let name = self.name.clone();
        wait_for(&format!("{name}'s admin endpoint"), WAIT, || self.status())
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.name, self.log_tail());
        }
        self.kill();
    }
}

/// Waits until `node` has published `n` more heartbeats: the negative checks that follow
/// ("still not connected") are given time measured in the node's own progress, not a sleep.
fn wait_heartbeats(node: &mut Node, n: u64) {
    let sent = |node: &mut Node| node.status()?["counters"]["heartbeats_sent"].as_u64();
    let start = wait_for("the heartbeat counter", WAIT, || sent(node));
    wait_for(&format!("{n} more heartbeats"), WAIT, || {
        (sent(node)? >= start + n).then_some(())
    });
}

/// A peer's entry in a node's status.
pub(crate) fn peer<'a>(status: &'a Value, peer_id: &str) -> Option<&'a Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"] == peer_id)
}

/// The peer as `status` shows it once a heartbeat of it has arrived and it is active.
fn active_peer(status: &Value, peer_id: &str) -> Option<Value> {
    peer(status, peer_id)
        .filter(|p| p["active"] == true && p["role"].is_string())
        .cloned()
}

/// One reply of an admin endpoint: status code, `content-type` and body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) body: String,
}

/// `GET http://{addr}{path}` with `ureq` (loopback: no proxy; non-2xx replies are returned,
/// not errors), bounded by 10 s.
pub(crate) fn http_get(addr: &str, path: &str) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut reply = agent
        .get(format!("http://{addr}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {addr}{path}: {e}"));
    let content_type = reply
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = reply
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_string()
        .unwrap_or_else(|e| panic!("GET {addr}{path}: reading the body: {e}"));
    Reply {
        status: reply.status().as_u16(),
        content_type,
        body,
    }
}

const PEER_FIELDS: [&str; 15] = [
    "peer_id",
    "role",
    "addrs",
    "installed_version",
    "score",
    "speed",
    "success",
    "stability",
    "decay",
    "chain",
    "position",
    "mu",
    "cost_per_hour",
    "pending",
    "active",
];

#[test]
fn learner_and_three_workers_discover_each_other_and_a_restart_keeps_the_peer_id() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-discovery";
    let mut learner = Node::start(tmp.path(), "learner", "learner", swarm, None, "");
    learner.wait_ready();
    let boot = format!("bootstrap = [\"{}\"]\ncost_per_hour = 0.35", learner.addr());
    let lpk = learner.key.public_key.clone();
    let mut workers: Vec<Node> = (0..3)
        .map(|i| {
            Node::start(
                tmp.path(),
                &format!("w{i}"),
                "rollout",
                swarm,
                Some(&lpk),
                &boot,
            )
        })
        .collect();
    let ids: Vec<String> = workers.iter().map(|w| w.key.peer_id.clone()).collect();

    // The learner sees all three workers, with every field of the status contract (`docs/protocol.md`).
    let started = Instant::now();
    let st = wait_for("the learner to list three active workers", WAIT, || {
        let st = learner.status()?;
        // Addresses come from identify, which may land just after the first heartbeat.
        let has_addrs = |p: Value| p["addrs"].as_array().is_some_and(|a| !a.is_empty());
        ids.iter()
            .all(|id| active_peer(&st, id).is_some_and(has_addrs))
            .then_some(st)
    });
    eprintln!("learner saw 3 workers after {:?}", started.elapsed());
    assert_eq!(st["peer_id"], learner.key.peer_id.as_str());
    assert_eq!(st["role"], "learner");
    assert!(st.get("version").is_some());
    for id in &ids {
        let p = peer(&st, id).unwrap();
        for f in PEER_FIELDS {
            assert!(p.get(f).is_some(), "field {f} missing in {p}");
        }
        assert_eq!(p["role"], "rollout");
        assert_eq!(p["cost_per_hour"], 0.35);
        assert!(p["score"].as_f64().unwrap() > 0.0, "{p}");
        assert!(!p["addrs"].as_array().unwrap().is_empty(), "{p}");
        assert!(p["pending"].as_u64().is_some_and(|n| n <= 1), "{p}");
    }
    // Every worker sees the learner and the two other workers.
    let all: Vec<String> = std::iter::once(learner.key.peer_id.clone())
        .chain(ids.iter().cloned())
        .collect();
    for w in workers.iter_mut() {
        let me = w.key.peer_id.clone();
        wait_for(&format!("{} to see the whole swarm", w.name), WAIT, || {
            let st = w.status()?;
            all.iter()
                .filter(|id| **id != me)
                .all(|id| active_peer(&st, id).is_some())
                .then_some(())
        });
    }

    // The human table and /metrics (both metric families in one response).
    let out = Command::new(BIN)
        .args(["status", "--wide", "--admin", &learner.admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && ids.iter().all(|id| text.contains(id.as_str())),
        "{text}"
    );
    let reply = http_get(&learner.admin, "/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let metrics = reply.body;
    assert!(
        metrics.contains("p2p_heartbeats_received_total"),
        "metrics-crate series missing"
    );
    assert!(
        metrics.contains("libp2p_"),
        "libp2p prometheus-client series missing"
    );

    // Restart: worker 0 is killed and started again on its data dir: same peer id, new process.
    let before = peer(&st, &ids[0]).unwrap()["started_unix_ms"]
        .as_u64()
        .unwrap();
    workers[0].kill();
    workers[0].spawn();
    let p = wait_for(
        "the restarted worker to rejoin under its peer id",
        WAIT,
        || {
            let st = learner.status()?;
            active_peer(&st, &ids[0]).filter(|p| p["started_unix_ms"].as_u64() != Some(before))
        },
    );
    assert_eq!(p["peer_id"], ids[0].as_str());
    assert_eq!(p["connected"], true);
    let own = wait_for("the restarted worker's status", WAIT, || {
        workers[0].status()
    });
    assert_eq!(own["peer_id"], ids[0].as_str());
}

fn write_psk(path: &Path, byte: u8) {
    std::fs::write(path, p2p::psk_file_contents([byte; 32])).unwrap();
    // `run` refuses a pre-shared key others can read.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

#[test]
fn a_node_with_the_wrong_pre_shared_key_cannot_connect() {
    let tmp = tempfile::tempdir().unwrap();
    let (good, bad) = (tmp.path().join("good.key"), tmp.path().join("bad.key"));
    write_psk(&good, 1);
    write_psk(&bad, 2);
    let swarm = "it-psk";
    let psk = |p: &Path| format!("psk_file = \"{}\"\nquic = false", p.display());
    let mut learner = Node::start(tmp.path(), "learner", "learner", swarm, None, &psk(&good));
    let st = learner.wait_ready();
    assert_eq!(st["private_swarm"], true);
    assert_eq!(st["quic"], false);
    let lpk = learner.key.public_key.clone();
    let boot = format!("bootstrap = [\"{}\"]\n", learner.addr());
    let ok = Node::start(
        tmp.path(),
        "ok",
        "rollout",
        swarm,
        Some(&lpk),
        &(boot.clone() + &psk(&good)),
    );
    let mut wrong = Node::start(
        tmp.path(),
        "wrong",
        "rollout",
        swarm,
        Some(&lpk),
        &(boot + &psk(&bad)),
    );
    // Positive control: the worker with the right key joins; the wrong key's handshakes fail.
    wait_for(
        "the right-key worker to join and the wrong-key handshake to fail",
        WAIT,
        || {
            let st = learner.status()?;
            (active_peer(&st, &ok.key.peer_id).is_some()
                && st["counters"]["connection_errors"].as_u64()? >= 1)
                .then_some(())
        },
    );
    // Give the wrong-key node a few more heartbeat intervals and redials: still nothing.
    wait_heartbeats(&mut learner, 5);
    let st = learner.status().unwrap();
    assert!(
        peer(&st, &wrong.key.peer_id).is_none(),
        "wrong-key node got in: {st}"
    );
    // Issue 49 (3): both sides say why at WARN, the default level: a failed handshake that
    // names the swarm key.
    let warned = |node: &Node, what: &str| {
        log_lines(node, what)
            .into_iter()
            .find(|l| l.contains("WARN") && l.contains("psk_file"))
    };
    wait_for(
        "the learner's WARN about the wrong key's handshake",
        WAIT,
        || warned(&learner, "inbound connection failed in its handshake"),
    );
    wait_for(
        "the wrong-key worker's WARN about its handshake",
        WAIT,
        || warned(&wrong, "connection failed in its handshake"),
    );
    let ws = wrong.status().unwrap();
    assert_eq!(ws["connected_peers"], 0, "{ws}");
    assert!(
        ws["peers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["role"].is_null()),
        "{ws}"
    );
}

#[test]
fn a_node_outside_the_allow_list_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-allow";
    // Keys first: the allow-lists name peer ids.
    let ins = tmp.path().join("insider");
    std::fs::create_dir_all(&ins).unwrap();
    let insider_key = keygen(&ins);
    let insider_id = insider_key.peer_id.clone();
    let allow = |ids: &[&str]| {
        format!(
            "allow_list = [{}]\n",
            ids.iter()
                .map(|i| format!("\"{i}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut learner = Node::start(
        tmp.path(),
        "learner",
        "learner",
        swarm,
        None,
        &allow(&[&insider_id]),
    );
    learner.wait_ready();
    let lpk = learner.key.public_key.clone();
    let boot = format!("bootstrap = [\"{}\"]\n", learner.addr());
    let insider_net = boot.clone() + &allow(&[&learner.key.peer_id]);
    let insider = Node::start_with_key(
        tmp.path(),
        "insider",
        "rollout",
        swarm,
        Some(&lpk),
        &insider_net,
        insider_key,
    );
    let mut outsider = Node::start(tmp.path(), "outsider", "rollout", swarm, Some(&lpk), &boot);
    wait_for(
        "the insider to join and the outsider to be refused",
        WAIT,
        || {
            let st = learner.status()?;
            (active_peer(&st, &insider.key.peer_id).is_some()
                && st["counters"]["connections_denied"].as_u64()? >= 1)
                .then_some(())
        },
    );
    wait_heartbeats(&mut learner, 5);
    let st = learner.status().unwrap();
    assert!(
        peer(&st, &outsider.key.peer_id).is_none(),
        "outsider got in: {st}"
    );
    // The outsider's dials reach the TCP/noise layer and are then closed by the learner: no
    // heartbeat ever gets through to it.
    let os = outsider.status().unwrap();
    assert!(
        os["peers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["role"].is_null()),
        "{os}"
    );
    assert_eq!(os["counters"]["heartbeats_received"], 0, "{os}");
    // Issue 49 (3): the learner's WARN names the peer id to add to its allow list.
    let add = format!("add \"{}\" to it", outsider.key.peer_id);
    wait_for(
        "the learner's WARN naming the outsider's peer id",
        WAIT,
        || {
            log_lines(&learner, &add)
                .into_iter()
                .find(|l| l.contains("WARN") && l.contains("network.allow_list"))
        },
    );
}

#[test]
fn malformed_heartbeats_are_dropped_and_the_sender_score_falls() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-garbage";
    let mut learner = Node::start(tmp.path(), "learner", "learner", swarm, None, "");
    learner.wait_ready();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A test peer built on the p2p crate: valid heartbeats from its service, garbage on demand.
    let seed = [0x5a; 32];
    let cfg = p2p::ServiceConfig {
        network: p2p::NetworkConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".into()],
            bootstrap: vec![learner.addr()],
            heartbeat_interval_ms: HEARTBEAT_MS,
            autonat: false,
            quic: false,
            ..p2p::NetworkConfig::default()
        },
        swarm_id: swarm.into(),
        role: p2p::Role::Rollout,
        node_version: "test".into(),
        learner: Some(learner.key.peer_id.parse().unwrap()),
    };
    let mut registry = p2p::Registry::default();
    let (client, _events, _task) = rt
        .block_on(async { p2p::start(seed, cfg, &mut registry) })
        .unwrap();
    let me = client.local_peer_id().to_string();
    assert_eq!(me, p2p::peer_id_from_seed(seed).to_string());

    // Heartbeats are not transfers: the peer stays neutral (Success 50, no event yet).
    let before = wait_for("the learner to score the test peer", WAIT, || {
        let st = learner.status()?;
        active_peer(&st, &me).filter(|p| p["heartbeats"].as_u64() >= Some(3))
    });
    let score_before = before["score"].as_f64().unwrap();
    assert_eq!(before["success"], 50.0);
    assert_eq!(before["successes"], 0);
    assert_eq!(before["rejected_messages"], 0);

    let topic = p2p::TopicKind::Heartbeat.topic_name(swarm);
    let mut wrong_version: Value = serde_json::json!({"v": 99, "swarm_id": swarm});
    wrong_version["role"] = "rollout".into();
    let garbage: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        serde_json::to_vec(&wrong_version).unwrap(),
        vec![b'x'; 4096], // over the 2 KiB heartbeat limit
    ];
    rt.block_on(async {
        for g in garbage {
            client.publish_raw(topic.clone(), g).await.unwrap();
        }
    });
    let after = wait_for(
        "the learner to reject the garbage and lower the score",
        WAIT,
        || {
            let st = learner.status()?;
            let p = peer(&st, &me)?.clone();
            (p["rejected_messages"].as_u64()? >= 3 && p["score"].as_f64()? < score_before)
                .then_some((st, p))
        },
    );
    let (st, p) = after;
    assert!(p["success"].as_f64().unwrap() < 100.0, "{p}");
    assert!(p["failures"].as_u64().unwrap() >= 3, "{p}");
    assert!(st["counters"]["messages_rejected"].as_u64().unwrap() >= 1);
    // Dropped: nothing of the garbage replaced the last valid heartbeat.
    assert_eq!(p["role"], "rollout");
    assert_eq!(p["node_version"], "test");
    // gossipsub's own score (P₄ invalid-message penalty) is below zero.
    if let Some(g) = p["gossip_score"].as_f64() {
        assert!(g < 0.0, "gossipsub score {g} after invalid messages");
    }
    // Three rejected messages are three strikes: banned for the run (default threshold 3).
    let p = wait_for("the learner to ban the sender", WAIT, || {
        let st = learner.status()?;
        peer(&st, &me).filter(|p| p["banned"] == true).cloned()
    });
    assert_eq!(p["ban_reason"], "bad_message", "{p}");
    assert_eq!(p["active"], false, "{p}");
    rt.block_on(client.shutdown());
}

/// `cargo test -p echo-node --test it -- --ignored --nocapture discovery_16`: time until each of
/// 16 nodes (1 learner + 15 workers) lists all 15 others as active, then the learner's idle
/// CPU and RSS. Numbers go to docs/protocol.md.
#[test]
#[ignore = "measurement, ~1 min"]
fn discovery_16_nodes_measurement() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-16";
    let t0 = Instant::now();
    let hb = "heartbeat_interval_ms = 1000\n";
    let mut learner = Node::start(tmp.path(), "learner", "learner", swarm, None, hb);
    learner.wait_ready();
    let lpk = learner.key.public_key.clone();
    let boot = format!("bootstrap = [\"{}\"]\n{hb}", learner.addr());
    let mut nodes: Vec<Node> = (0..15)
        .map(|i| {
            Node::start(
                tmp.path(),
                &format!("w{i}"),
                "rollout",
                swarm,
                Some(&lpk),
                &boot,
            )
        })
        .collect();
    let ids: Vec<String> = std::iter::once(learner.key.peer_id.clone())
        .chain(nodes.iter().map(|n| n.key.peer_id.clone()))
        .collect();
    let spawned = t0.elapsed();
    nodes.insert(0, learner);
    let mut done = vec![None; nodes.len()];
    wait_for(
        "full discovery of 16 nodes",
        Duration::from_secs(120),
        || {
            for (i, n) in nodes.iter_mut().enumerate() {
                if done[i].is_some() {
                    continue;
                }
                let me = n.key.peer_id.clone();
                let st = n.status()?;
                if ids
                    .iter()
                    .filter(|id| **id != me)
                    .all(|id| active_peer(&st, id).is_some())
                {
                    done[i] = Some(t0.elapsed());
                }
            }
            done.iter().all(Option::is_some).then_some(())
        },
    );
    let full = done.iter().flatten().max().unwrap();
    println!("16 nodes: all spawned after {spawned:?}; full discovery (every node lists 15 active peers) after {full:?}");
    // Idle CPU and RSS of the learner over 10 s.
    let pid = nodes[0].child.as_ref().unwrap().id();
    let ticks = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let (c0, t) = (ticks(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let cpu = (ticks(pid) - c0) as f64 / 100.0 / t.elapsed().as_secs_f64() * 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap()
        .to_string();
    println!("learner with 15 peers, heartbeat 1 s: idle CPU {cpu:.2} % of one core; {rss}");
    let wpid = nodes[1].child.as_ref().unwrap().id();
    let (c0, t) = (ticks(wpid), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let cpu = (ticks(wpid) - c0) as f64 / 100.0 / t.elapsed().as_secs_f64() * 100.0;
    let status = std::fs::read_to_string(format!("/proc/{wpid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap()
        .to_string();
    println!("worker with 15 peers: idle CPU {cpu:.2} % of one core; {rss}");
}

/// The learner's `learner_groups_trained_total{producer="…"}` (0 when absent).
pub(crate) fn trained(learner: &Node, producer: &str) -> u64 {
    counter(
        learner,
        &format!("learner_groups_trained_total{{producer=\"{producer}\"}}"),
    )
}

/// The value of the learner's counter `series` (name and labels as exported; 0 when absent).
pub(crate) fn counter(learner: &Node, series: &str) -> u64 {
    let body = http_get(&learner.admin, "/metrics").body;
    body.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The learner's `pull_groups_rejected_total{reason="…"}`.
pub(crate) fn rejected(learner: &Node, reason: &str) -> u64 {
    counter(
        learner,
        &format!("pull_groups_rejected_total{{reason=\"{reason}\"}}"),
    )
}
