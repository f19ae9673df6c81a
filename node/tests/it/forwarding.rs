//! Accountable forwarding across real processes (`docs/broadcast.md`, "Accountable
//! forwarding"): a learner, two honest workers and a forwarder that stalls mid-run — it
//! forwards honestly for its first installs, then passes nothing on (`silent_after_honest`,
//! `ECHO_NODE_MISBEHAVE`). One chain (B0 = B̂w) whose seats the learner re-draws every
//! publication, so the staller is seated over an honest child after it stalled. The child
//! must go on installing the following versions (patience per node), the learner must judge
//! the silence from the child's signed receipts, and — once a second child saw it — strike the
//! staller for `silent_forwarding` and ban it, never an honest worker (the learner's own probe
//! of the staller — a chunk of a version it reported holding, withheld — is what convicts it:
//! its young children's receipts alone could not). And the receipts' other side: a parent that
//! pushes every chunk three times is charged by its children and moved, never they struck; a
//! child repaired around a slow parent is never struck; two fresh identities that sign
//! receipts of nothing about honest parents get them at most moved. Every wait polls against a
//! deadline; children are killed and reaped on drop.

use std::time::Duration;

use serde_json::Value;

use crate::swarm::{counter, wait_for, Node};
use crate::verified::{bad_worker, bad_worker_named};

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

/// Waits until every node of `nodes` has installed a version at least four past `after`
/// (versions published after it).
fn all_install_past(nodes: &mut [Node], after: u64) {
    for w in nodes {
        let name = w.name.clone();
        wait_for(&format!("{name} installing past v{after}"), LIMIT, || {
            installed(w).filter(|&v| v >= after + 4)
        });
    }
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
    all_install_past(&mut honest, after);
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

/// Every honest worker unstruck and unbanned, in the learner's table and in each honest
/// worker's own.
fn assert_no_honest_strikes(learner: &mut Node, honest: &mut [Node]) {
    let ids: Vec<String> = honest.iter().map(|w| w.key.peer_id.clone()).collect();
    let mut tables = vec![(
        "learner".to_string(),
        learner.status().expect("learner status"),
    )];
    for w in honest.iter_mut() {
        let name = w.name.clone();
        tables.push((name, w.status().expect("worker status")));
    }
    for (observer, st) in &tables {
        for id in &ids {
            let Some(p) = peer(st, id) else { continue };
            assert_eq!(p["strikes"], 0, "{observer} struck {id}: {p}");
            assert_ne!(p["banned"], true, "{observer} banned {id}: {p}");
        }
    }
}

/// Whether the learner's forwarding accounts moved `id` away from a child or demoted it.
fn moved_or_demoted(forwarding: &Value, id: &str) -> bool {
    let separated = forwarding["separated"]
        .as_array()
        .is_some_and(|s| s.iter().any(|pair| pair[0] == id));
    separated || forwarding["demoted"][id].is_string()
}

#[test]
fn a_parent_that_pushes_every_chunk_three_times_is_charged_and_moved_and_its_child_never_struck() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-overfeed";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 2, WORKER);
    let mut bad = bad_worker(tmp.path(), swarm, &learner, "overfeed_parent", WORKER);
    bad.wait_ready();
    let bad_id = bad.key.peer_id.clone();
    // Its child refused the second copy of a chunk (a protocol error charged to the sender,
    // the stream dropped) and noted it in its receipt.
    wait_for(
        "an honest child refusing a chunk pushed again",
        LIMIT,
        || {
            honest
                .iter_mut()
                .any(|w| {
                    w.status().is_some() && counter(w, "dissemination_push_duplicates_total") > 0
                })
                .then_some(())
        },
    );
    // The learner read the receipts as overfed and moved the parent.
    let after = wait_for(
        "the overfeeder moved on its children's receipts",
        LIMIT,
        || {
            let st = learner.status()?;
            let f = &st["forwarding"];
            let overfed = f["verdicts"]["overfed"].as_u64().unwrap_or(0) > 0;
            (overfed && moved_or_demoted(f, &bad_id))
                .then(|| st["learner"]["published_version"].as_u64())?
        },
    );
    all_install_past(&mut honest, after);
    assert_no_honest_strikes(&mut learner, &mut honest);
    let st = learner.status().unwrap();
    let f = &st["forwarding"];
    for w in &honest {
        assert!(f["demoted"][&w.key.peer_id].is_null(), "{f}");
    }
}

#[test]
fn a_child_repaired_around_a_slow_parent_is_never_struck() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-repaired";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 2, WORKER);
    let mut slow = bad_worker(tmp.path(), swarm, &learner, "slow_forwarder", WORKER);
    slow.wait_ready();
    let slow_id = slow.key.peer_id.clone();
    // Its children take part of each version from it and repair the rest from other holders
    // while its push goes on.
    wait_for("a slow delivery judged and a child repaired", LIMIT, || {
        let st = learner.status()?;
        let slow_seen = st["forwarding"]["verdicts"]["slow"].as_u64().unwrap_or(0) > 0;
        let repaired = honest
            .iter_mut()
            .any(|w| w.status().is_some() && counter(w, "dissemination_fetched_bytes_total") > 0);
        (slow_seen && repaired).then_some(())
    });
    let after = wait_for("the slow parent moved", LIMIT, || {
        let st = learner.status()?;
        moved_or_demoted(&st["forwarding"], &slow_id)
            .then(|| st["learner"]["published_version"].as_u64())?
    });
    all_install_past(&mut honest, after);
    assert_no_honest_strikes(&mut learner, &mut honest);
}

#[test]
fn two_fresh_children_lying_about_honest_parents_get_them_at_most_moved() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-framing";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 2, WORKER);
    let mut framers: Vec<Node> = ["f1", "f2"]
        .iter()
        .map(|name| {
            bad_worker_named(
                tmp.path(),
                name,
                swarm,
                &learner,
                "framing_receipts",
                WORKER,
            )
        })
        .collect();
    for f in &mut framers {
        f.wait_ready();
    }
    let framer_ids: Vec<String> = framers.iter().map(|f| f.key.peer_id.clone()).collect();
    let honest_ids: Vec<String> = honest.iter().map(|w| w.key.peer_id.clone()).collect();
    // Until the framers convicted themselves (each lagged under two parents: demoted as a
    // child, its receipts no longer believed), or an honest parent was accused by both.
    let end = wait_for("the framing played out", LIMIT, || {
        let st = learner.status()?;
        let f = st["forwarding"].clone();
        let accused = f["accusations"]
            .as_object()
            .is_some_and(|a| a.values().any(|n| n.as_u64() > Some(0)));
        let exposed = framer_ids.iter().all(|id| f["demoted"][id] == "child");
        (accused || exposed).then_some(f)
    });
    eprintln!("forwarding when the framing played out: {end}");
    // Let the plans signed meanwhile, and any probe under way, play out too.
    let v = learner.status().unwrap()["learner"]["published_version"]
        .as_u64()
        .unwrap_or(0);
    for w in &mut honest {
        let name = w.name.clone();
        wait_for(&format!("{name} installing past v{v}"), LIMIT, || {
            installed(w).filter(|&x| x >= v + 4)
        });
    }
    assert_no_honest_strikes(&mut learner, &mut honest);
    let st = learner.status().unwrap();
    let f = &st["forwarding"];
    assert_eq!(f["accusations"]["struck"].as_u64().unwrap_or(0), 0, "{f}");
    for id in &honest_ids {
        assert!(f["silent_strikes"][id].is_null(), "{f}");
        assert!(
            !f["excluded"]
                .as_array()
                .is_some_and(|x| x.iter().any(|p| p == id.as_str())),
            "{f}"
        );
        assert_ne!(f["demoted"][id], "silent_parent", "{f}");
    }
}
