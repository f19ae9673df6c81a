//! The CLI from the outside: `keygen`, `run` (good and bad configs, clean shutdown), `inspect`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

fn echo_node() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_echo-node"));
    c.env_remove("RUST_LOG");
    c
}

/// `echo-node run --config cfg`, which must fail; its stderr.
fn run_refused(cfg: &Path) -> String {
    let out = echo_node()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Replaces `from` by `to` in the file at `path`.
fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap().replace(from, to);
    std::fs::write(path, text).unwrap();
}

fn run_ok(args: &[&str]) -> Output {
    let out = echo_node().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "echo-node {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// A child process that is killed and reaped when dropped, even if the test fails.
struct Node {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Node {
    fn start(config: &Path) -> Node {
        let mut child = echo_node()
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Node { child, lines }
    }

    /// Waits (bounded) for a log line containing `needle`.
    fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!(
            "no log line containing {needle:?} within {timeout:?}; saw:\n{}",
            seen.join("\n")
        );
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        crate::sigterm(&self.child);
        let child = &mut self.child;
        testkit::wait_for(
            "the node to stop after SIGTERM",
            Duration::from_secs(20),
            || child.try_wait().unwrap(),
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn learner_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("node.toml");
    let text = format!(
        "role = \"learner\"\nswarm_id = \"cli-test\"\ndata_dir = \"{}\"\n\
         [learner]\nwarm_start_steps = 0\nmax_steps = 1\n\
         [network]\nlisten = [\"/ip4/127.0.0.1/tcp/0\"]\nadmin = \"127.0.0.1:0\"\n{extra}",
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn keygen_writes_a_key_and_refuses_to_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("keys");
    let out = run_ok(&["keygen", "--out", out_dir.to_str().unwrap(), "--json"]);
    let v = json(&out);
    let peer = v["peer_id"].as_str().unwrap();
    let public = v["public_key"].as_str().unwrap();
    assert!(peer.starts_with("12D3KooW"), "{peer}");
    assert_eq!(public.len(), 64);
    let key = storage::NodeKey::read(&out_dir.join("node.key")).unwrap();
    assert_eq!(key.public_hex(), public);

    let text = run_ok(&["keygen", "--out", dir.path().join("k2").to_str().unwrap()]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("peer id:") && text.contains("public key:"),
        "{text}"
    );

    let again = echo_node()
        .args(["keygen", "--out", out_dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("refusing to overwrite"));
    assert_eq!(
        storage::NodeKey::read(&out_dir.join("node.key"))
            .unwrap()
            .public_hex(),
        public
    );
}

#[test]
fn run_with_a_bad_config_names_every_bad_key_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(
        dir.path(),
        "[storage]\nkeep_snapshots = 0\nlease_ttl_s = 0\n[broadcast]\nwarm_up_mib = 33\n",
    );
    let err = run_refused(&cfg);
    assert!(
        err.contains("storage.keep_snapshots")
            && err.contains("storage.lease_ttl_s")
            && err.contains("broadcast.warm_up_mib"),
        "{err}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "a bad config must not create the data dir"
    );

    let cfg = learner_config(dir.path(), "[storage]\nkeep_snapshotz = 2\n");
    let err = run_refused(&cfg);
    assert!(
        err.contains("unknown field `keep_snapshotz`") && err.contains("storage"),
        "{err}"
    );

    let out = echo_node()
        .args(["run", "--config", "/nonexistent/echo.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn run_overrides_are_validated_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(dir.path(), "");
    let out = echo_node()
        .args([
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--admin",
            "192.0.2.1:80",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("network.admin"));
}

/// Issue 49 (1): a second node on a listen address the first one listens on refuses to start
/// with the operator guide's `listening on …` error, before it creates its data dir (the
/// swarm's listeners use SO_REUSEPORT, which alone would let both listen); so does a node
/// whose admin port another process holds.
#[test]
fn a_second_node_on_a_port_in_use_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let first_dir = dir.path().join("first");
    std::fs::create_dir_all(&first_dir).unwrap();
    let first = Node::start(&learner_config(&first_dir, ""));
    let data = first_dir.join("data");
    let addrs = testkit::wait_for(
        "the first node's address file",
        Duration::from_secs(60),
        || echo_node::addr_file::read(&data, first.child.id()),
    );
    let listen = addrs
        .listen
        .iter()
        .find(|a| a.contains("/tcp/"))
        .expect("a TCP listen address")
        .clone();
    let second_dir = dir.path().join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let cfg = learner_config(&second_dir, "");
    replace_in(&cfg, "/ip4/127.0.0.1/tcp/0", &listen);
    let err = run_refused(&cfg);
    assert!(
        err.contains(&format!("error: listening on {listen}"))
            && err.contains("another process is already listening"),
        "{err}"
    );
    assert!(!second_dir.join("data").exists(), "nothing is created");

    // The admin port.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = held.local_addr().unwrap();
    let cfg = learner_config(&second_dir, "");
    replace_in(
        &cfg,
        "admin = \"127.0.0.1:0\"",
        &format!("admin = \"{admin}\""),
    );
    let err = run_refused(&cfg);
    assert!(
        err.contains(&format!("listening on {admin}")) && err.contains("another process"),
        "{err}"
    );
    assert!(!second_dir.join("data").exists(), "nothing is created");
    drop(first);
}

#[test]
fn run_opens_the_stores_and_stops_cleanly_on_sigterm_then_inspect_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(dir.path(), "");
    let mut node = Node::start(&cfg);
    node.wait_for_line("node started", Duration::from_secs(60));
    // While the node runs, its stores are locked: inspect says why.
    let busy = echo_node()
        .args(["inspect", "trajectories", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!busy.status.success());
    assert!(String::from_utf8_lossy(&busy.stderr).contains("is a node running"));
    let status = node.terminate();
    assert!(status.success(), "exit status {status:?}");
    node.wait_for_line("stopped cleanly", Duration::from_secs(5));

    let data = dir.path().join("data");
    assert!(data.join("node.key").exists());
    let v = json(&run_ok(&[
        "inspect",
        "trajectories",
        "--data-dir",
        data.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(v["counters"]["produced"], 0);
    assert_eq!(v["invariant_holds"], true);
    let v = json(&run_ok(&[
        "inspect",
        "snapshots",
        "--config",
        cfg.to_str().unwrap(),
        "--json",
    ]));
    // A lone learner publishes its version 0 into its own chunk store (unless stopped first).
    assert!(v["manifests"].as_u64().is_some_and(|n| n <= 1), "{v}");
}

#[test]
fn inspect_shows_groups_counters_and_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let data = storage::DataDir::new(dir.path());
    let key = storage::NodeKey::generate();
    {
        let t = storage::TrajectoryStore::open(&data.trajectories()).unwrap();
        let groups: Vec<_> = (0..5)
            .map(|i| storage::record::testing::group(i / 2, i, 4, 8))
            .collect();
        t.put_groups(&groups).unwrap();
        t.prune_below(1).unwrap();
        let c = storage::ChunkStore::open(&data.snapshots(), 3).unwrap();
        let payload = vec![42u8; 10_000];
        let m = storage::SnapshotManifest::build(
            "demo",
            7,
            [3; 32],
            &payload,
            4096,
            &key.verifying_key(),
        )
        .unwrap()
        .sign(key.signing_key())
        .unwrap();
        c.publish(&m, &payload.clone().into()).unwrap();
        // v8: a delta on v7 whose reconstructed payload has its own root.
        let delta = vec![7u8; 3_000];
        let mut m = storage::SnapshotManifest::build(
            "demo",
            8,
            [3; 32],
            &delta,
            4096,
            &key.verifying_key(),
        )
        .unwrap();
        m.payload = storage::PayloadKind::Delta {
            base_version: 7,
            full_root: [0xab; 32],
        };
        c.publish(&m.sign(key.signing_key()).unwrap(), &delta.into())
            .unwrap();
    }
    let d = dir.path().to_str().unwrap();
    let v = json(&run_ok(&[
        "inspect",
        "trajectories",
        "--data-dir",
        d,
        "--json",
        "--list",
        "10",
    ]));
    assert_eq!(v["counters"]["produced"], 5);
    assert_eq!(v["counters"]["discarded_stale"], 2);
    assert_eq!(v["counters"]["pending"], 3);
    assert_eq!(v["invariant_holds"], true);
    assert_eq!(v["groups"].as_array().unwrap().len(), 3);
    assert_eq!(v["groups"][0]["version"], 1);

    let v = json(&run_ok(&[
        "inspect",
        "manifest",
        "--data-dir",
        d,
        "--version",
        "7",
        "--json",
    ]));
    assert_eq!(v["version"], 7);
    assert_eq!(v["total_len"], 10_000);
    assert_eq!(v["chunks"].as_array().unwrap().len(), 3);
    assert_eq!(v["signature_valid"], true);
    assert_eq!(v["learner_key"], key.public_hex());
    assert_eq!(v["payload"]["kind"], "full");
    assert_eq!(v["full_root"], v["root_hash"]);
    assert!(v["created"].as_str().unwrap().ends_with('Z'), "{v}");

    // The latest is the delta: its kind, base and the signed root of what it reconstructs.
    let full_root = "ab".repeat(32);
    let v = json(&run_ok(&["inspect", "manifest", "--data-dir", d, "--json"]));
    assert_eq!(v["version"], 8);
    assert_eq!(v["payload"]["kind"], "delta");
    assert_eq!(v["payload"]["base_version"], 7);
    assert_eq!(v["payload"]["full_root"], full_root);
    assert_eq!(v["full_root"], full_root);
    assert_ne!(v["root_hash"], full_root);
    let v = json(&run_ok(&[
        "inspect",
        "snapshots",
        "--data-dir",
        d,
        "--json",
    ]));
    let snaps = v["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 2);
    assert_eq!(snaps[0]["payload"]["kind"], "full");
    assert_eq!(snaps[0]["full_root"], snaps[0]["root_hash"]);
    assert_eq!(snaps[1]["payload"]["kind"], "delta");
    assert_eq!(snaps[1]["payload"]["base_version"], 7);
    assert_eq!(snaps[1]["full_root"], full_root);

    let text =
        String::from_utf8(run_ok(&["inspect", "snapshots", "--data-dir", d]).stdout).unwrap();
    assert!(text.contains("v7") && text.contains("complete"), "{text}");
    assert!(
        text.contains("delta on v7") && text.contains(&full_root),
        "{text}"
    );

    let missing = echo_node()
        .args(["inspect", "manifest", "--data-dir", d, "--version", "3"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no manifest for version 3"), "{err}");
    assert!(err.contains("versions held: v7, v8"), "{err}");

    // A reader that closes the pipe at once (`inspect … | head -0`): a quiet success.
    let mut child = echo_node()
        .args(["inspect", "manifest", "--data-dir", d, "--version", "7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_device_this_build_cannot_use_is_refused_at_start_with_a_clear_message() {
    // This test binary is the CPU build (no `cuda` feature).
    let dir = tempfile::tempdir().unwrap();
    let config = learner_config(dir.path(), "");
    for (how, args) in [
        ("flag", ["--device", "cuda"]),
        ("flag", ["--device", "cuda:1"]),
    ] {
        let out = echo_node()
            .args(["run", "--config", config.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{how} {args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("model.device") && err.contains("without CUDA"),
            "{how} {args:?}: {err}"
        );
    }
    // In the config file too; a malformed device is a config error naming the key.
    let config = learner_config(dir.path(), "[model]\ndevice = \"cuda\"\n");
    let out = echo_node()
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without CUDA"));
    let config = learner_config(dir.path(), "[model]\ndevice = \"tpu\"\n");
    let out = echo_node()
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.device"), "{err}");
    // `auto` on this build runs on the CPU and says so.
    let config = learner_config(dir.path(), "[model]\ndevice = \"auto\"\n");
    let mut node = Node::start(&config);
    let line = node.wait_for_line("model device", Duration::from_secs(60));
    assert!(line.contains("kind=cpu"), "{line}");
    // The role is up (and with it the SIGTERM handler): a clean stop.
    node.wait_for_line("learner window", Duration::from_secs(60));
    assert!(node.terminate().success());
}

/// `echo-node doctor --json --config C ARGS…`: (exit success, check name → (status, hint)).
fn doctor(config: &Path, args: &[&str]) -> (bool, Vec<(String, String, String)>) {
    let out = echo_node()
        .args(["doctor", "--json", "--timeout-s", "3", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let v = json(&out);
    let checks = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("status"), s("hint"))
        })
        .collect();
    (out.status.success(), checks)
}

fn find<'a>(
    checks: &'a [(String, String, String)],
    name: &str,
    status: &str,
) -> &'a (String, String, String) {
    checks
        .iter()
        .find(|c| c.0 == name && c.1 == status)
        .unwrap_or_else(|| panic!("no {status} check {name} in {checks:?}"))
}

#[test]
fn doctor_passes_a_good_config_and_names_every_failure_with_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    // A good learner config with its key: every check ok or warn, exit 0.
    let good = learner_config(dir.path(), "");
    run_ok(&["keygen", "--out", dir.path().join("data").to_str().unwrap()]);
    let (ok, checks) = doctor(&good, &[]);
    assert!(ok, "{checks:?}");
    for name in [
        "config",
        "key",
        "data_dir",
        "clock",
        "tcp",
        "listen",
        "admin",
        "bootstrap",
        "reachability",
    ] {
        assert!(
            checks.iter().any(|c| c.0 == name),
            "{name} missing: {checks:?}"
        );
    }
    assert!(checks.iter().all(|c| c.1 != "fail"), "{checks:?}");
    find(&checks, "key", "ok");
    // The TCP congestion control is judged from this host's setting: BBR passes, anything
    // else warns with the sysctl that fixes it.
    let host =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    if host.trim().starts_with("bbr") {
        find(&checks, "tcp", "ok");
    } else {
        let tcp = find(&checks, "tcp", "warn");
        assert!(tcp.2.contains("tcp_congestion_control=bbr"), "{tcp:?}");
    }

    // A world-readable key.
    let key = dir.path().join("data").join("node.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (ok, checks) = doctor(&good, &[]);
    assert!(!ok);
    assert!(
        find(&checks, "key", "fail").2.contains("chmod 600"),
        "{checks:?}"
    );
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    // An invalid config: only that is reported.
    let bad_dir = dir.path().join("bad");
    std::fs::create_dir_all(&bad_dir).unwrap();
    let bad = learner_config(&bad_dir, "[storage]\nkeep_snapshots = 0\n");
    let (ok, checks) = doctor(&bad, &[]);
    assert!(!ok);
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert!(
        find(&checks, "config", "fail").2.contains("fix the keys"),
        "{checks:?}"
    );

    // A data dir that cannot be created (below a regular file).
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let cfg = dir.path().join("nodir.toml");
    std::fs::write(
        &cfg,
        format!(
            "role = \"learner\"\nswarm_id = \"cli-test\"\ndata_dir = \"{}\"\n\
             [network]\nlisten = [\"/ip4/127.0.0.1/tcp/0\"]\nadmin = \"127.0.0.1:0\"\n",
            file.join("sub").display()
        ),
    )
    .unwrap();
    let (ok, checks) = doctor(&cfg, &[]);
    assert!(!ok);
    assert!(
        find(&checks, "data_dir", "fail").2.contains("write access"),
        "{checks:?}"
    );

    // A device this (CPU) build cannot use.
    let gpu_dir = dir.path().join("gpu");
    std::fs::create_dir_all(&gpu_dir).unwrap();
    let gpu = learner_config(&gpu_dir, "[model]\ndevice = \"cuda\"\n");
    let (ok, checks) = doctor(&gpu, &[]);
    assert!(!ok);
    assert!(
        find(&checks, "device", "fail").2.contains("build-cuda"),
        "{checks:?}"
    );

    // A listen port held by another process (this test holds it).
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let busy = std::fs::read_to_string(&good).unwrap().replace(
        "/ip4/127.0.0.1/tcp/0",
        &format!("/ip4/127.0.0.1/tcp/{port}"),
    );
    let busy_cfg = dir.path().join("busy.toml");
    std::fs::write(&busy_cfg, busy).unwrap();
    let (ok, checks) = doctor(&busy_cfg, &[]);
    assert!(!ok);
    assert!(
        find(&checks, "listen", "fail")
            .2
            .contains("another process"),
        "{checks:?}"
    );
}

#[test]
fn doctor_dials_and_identifies_bootstrap_peers() {
    let dir = tempfile::tempdir().unwrap();
    // A real learner to bootstrap from; its bound address comes from its address file.
    let lcfg = learner_config(dir.path(), "");
    let learner = Node::start(&lcfg);
    let data = dir.path().join("data");
    let deadline = Instant::now() + Duration::from_secs(60);
    let addrs = loop {
        if let Some(a) = echo_node::addr_file::read(&data, learner.child.id()) {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "the learner wrote no address file"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pk = storage::NodeKey::read(&data.join("node.key"))
        .unwrap()
        .public_hex();
    // Something that accepts TCP but speaks no libp2p: never identified.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_addr = format!(
        "/ip4/127.0.0.1/tcp/{}/p2p/{}",
        mute.local_addr().unwrap().port(),
        addrs.peer_id
    );
    let worker = |bootstrap: &str, name: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "role = \"rollout\"\nswarm_id = \"cli-test\"\ndata_dir = \"{}\"\nlearner_public_key = \"{pk}\"\n\
                 [network]\nlisten = [\"/ip4/127.0.0.1/tcp/0\"]\nadmin = \"127.0.0.1:0\"\nmdns = false\n\
                 bootstrap = [\"{bootstrap}\"]\n",
                dir.path().join(format!("{name}-data")).display()
            ),
        )
        .unwrap();
        path
    };
    let (ok, checks) = doctor(&worker(&addrs.dial_addr().unwrap(), "w-good.toml"), &[]);
    assert!(ok, "{checks:?}");
    find(&checks, "bootstrap", "ok");
    let (ok, checks) = doctor(&worker(&mute_addr, "w-mute.toml"), &[]);
    assert!(!ok);
    assert!(
        find(&checks, "bootstrap", "fail").2.contains("peer id"),
        "{checks:?}"
    );
    drop(learner);
}
