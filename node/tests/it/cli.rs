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
    fn wait_for(&self, needle: &str, timeout: Duration) -> String {
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
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "node did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
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
        "[storage]\nkeep_snapshots = 0\nlease_ttl_s = 0\n",
    );
    let out = echo_node()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("storage.keep_snapshots") && err.contains("storage.lease_ttl_s"),
        "{err}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "a bad config must not create the data dir"
    );

    let cfg = learner_config(dir.path(), "[storage]\nkeep_snapshotz = 2\n");
    let out = echo_node()
        .args(["run", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("unknown field `keep_snapshotz`")
            && err.contains("storage"),
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

#[test]
fn run_opens_the_stores_and_stops_cleanly_on_sigterm_then_inspect_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(dir.path(), "");
    let mut node = Node::start(&cfg);
    node.wait_for("node started", Duration::from_secs(60));
    // While the node runs, its stores are locked: inspect says why.
    let busy = echo_node()
        .args(["inspect", "trajectories", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!busy.status.success());
    assert!(String::from_utf8_lossy(&busy.stderr).contains("is a node running"));
    let status = node.terminate();
    assert!(status.success(), "exit status {status:?}");
    node.wait_for("stopped cleanly", Duration::from_secs(5));

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

    let v = json(&run_ok(&["inspect", "manifest", "--data-dir", d, "--json"]));
    assert_eq!(v["version"], 7);
    assert_eq!(v["total_len"], 10_000);
    assert_eq!(v["chunks"].as_array().unwrap().len(), 3);
    assert_eq!(v["signature_valid"], true);
    assert_eq!(v["learner_key"], key.public_hex());

    let text =
        String::from_utf8(run_ok(&["inspect", "snapshots", "--data-dir", d]).stdout).unwrap();
    assert!(text.contains("v7") && text.contains("complete"), "{text}");

    let missing = echo_node()
        .args(["inspect", "manifest", "--data-dir", d, "--version", "3"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no manifest for version 3"));
}

#[test]
fn a_device_this_build_cannot_use_is_refused_at_start_with_a_clear_message() {
    // This test binary is the CPU build (no `cuda` feature).
    let dir = tempfile::tempdir().unwrap();
    let config = learner_config(dir.path(), "");
    for (how, args) in [("flag", ["--device", "cuda"]), ("flag", ["--device", "cuda:1"])] {
        let out = echo_node()
            .args(["run", "--config", config.to_str().unwrap()])
            .args(&args)
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
    let line = node.wait_for("model device", Duration::from_secs(60));
    assert!(line.contains("kind=cpu"), "{line}");
    assert!(node.terminate().success());
}
