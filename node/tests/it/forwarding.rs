//! Accountable forwarding across real processes (`docs/broadcast.md`, "Accountable
//! forwarding"): a learner, two honest workers and a forwarder that stalls mid-run — it
//! forwards honestly for its first installs, then passes nothing on (`silent_after_honest`,
//! `ECHO_NODE_MISBEHAVE`). One chain (B0 = B̂w) whose seats the learner re-draws every
//! publication, so the staller is seated over an honest child after it stalled. The child
//! must go on installing the following versions (patience per node), the learner must judge
//! the silence from the child's signed receipts, and — once a second child saw it — strike the
//! staller for `silent_forwarding` and ban it, never an honest worker. Every wait polls
//! against a deadline; children are killed and reaped on drop.

use std::time::Duration;

use serde_json::Value;

use crate::swarm::{wait_for, Node};
use crate::verified::bad_worker;

/// One chain, 64-KiB chunks (the tiny model is some forty of them), seats re-drawn every plan
/// (κ = 2, an epoch of two versions), small steps after a short warm start (without one the
/// untrained model's groups mostly have zero advantage and steps crawl: `verified.rs`).
const LEARNER: &str = "learner_mbps = 100.0\n[storage]\nchunk_size_kib = 64\n\
    [broadcast]\nplan_epoch = 2\n\
    [learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n";
const WORKER: &str = "[storage]\nmax_pending_groups = 4\n[rollout]\ngroup_size = 4\n";
const LIMIT: Duration = Duration::from_secs(240);

fn installed(node: &mut Node) -> Option<u64> {
    node.status()?["version"].as_u64()
}

fn peer<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"] == id)
}

#[test]
fn a_forwarder_that_stalls_mid_run_costs_its_children_nothing_and_is_banned() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-forwarding";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 2, WORKER);
    let mut bad = bad_worker(tmp.path(), swarm, &learner, "silent_after_honest", WORKER);
    bad.wait_ready();
    let bad_id = bad.key.peer_id.clone();
    // The staller is seen silent over a child (a judged receipt of nothing); note the newest
    // version published by then.
    let after = wait_for("a silent verdict against the staller", LIMIT, || {
        let st = learner.status()?;
        let f = &st["forwarding"];
        let silent = f["verdicts"]["silent"].as_u64().unwrap_or(0) > 0;
        let against = f["separated"]
            .as_array()?
            .iter()
            .any(|pair| pair[0] == bad_id.as_str())
            || f["silent_strikes"][&bad_id].as_u64().is_some();
        (silent && against).then(|| st["learner"]["published_version"].as_u64())?
    });
    // Its children go on installing: every honest worker reaches versions published after it.
    for w in &mut honest {
        let name = w.name.clone();
        wait_for(&format!("{name} installing past v{after}"), LIMIT, || {
            installed(w).filter(|&v| v >= after + 4)
        });
    }
    // A second child sees it too: struck for silence and banned; no honest worker is struck.
    let row = wait_for("the staller's ban", LIMIT, || {
        let st = learner.status()?;
        let p = peer(&st, &bad_id)?.clone();
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(row["ban_reason"], "silent_forwarding", "{row}");
    assert!(
        row["strikes_by_reason"]["silent_forwarding"].as_u64() >= Some(3),
        "{row}"
    );
    let st = learner.status().unwrap();
    for w in &honest {
        let p = peer(&st, &w.key.peer_id).expect("an honest worker's row");
        assert_eq!(p["strikes"], 0, "{p}");
        assert_ne!(p["banned"], true, "{p}");
    }
}
