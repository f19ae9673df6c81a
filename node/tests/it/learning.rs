//! The learning loop across real processes: the `echo-node demo` smoke test (the demo contract in `docs/operator-guide.md`) and a
//! learner killed with SIGKILL mid-run and restarted (the crash test). Bounded waits;
//! every child is reaped on drop.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::swarm::{wait_for, Node, BIN};

/// Every learner step logged in `metrics/steps.jsonl`.
fn steps(learner_data: &Path) -> Vec<Value> {
    std::fs::read_to_string(learner_data.join("metrics/steps.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// No group id appears in two steps' `trained_groups`.
fn assert_no_group_trained_twice(steps: &[Value]) -> usize {
    let mut seen = HashSet::new();
    for s in steps {
        for g in s["trained_groups"].as_array().unwrap() {
            let g = g.as_str().unwrap().to_string();
            assert!(
                seen.insert(g.clone()),
                "group {g} trained twice (step {})",
                s["step"]
            );
        }
    }
    seen.len()
}

fn invariant_holds(data: &Path) -> bool {
    crate::swarm::inspect(data, "trajectories")["invariant_holds"] == true
}

/// SIGTERM, then wait (bounded) for a clean exit.
fn terminate(node: &mut Node) {
    let mut child = node.child.take().expect("running");
    crate::sigterm(&child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} did not stop within 30 s of SIGTERM", node.name);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{} exited with {status}", node.name);
}

#[test]
fn demo_with_two_workers_trains_publishes_and_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--workers",
            "2",
            "--steps",
            "6",
            "--json",
            "--warm-start-steps",
            "5",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("demo did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {stderr}");
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["steps"], 6, "{v}");
    assert_eq!(v["version"], 6, "{v}");
    for k in ["reward_first", "reward_last", "bubble_ratio"] {
        assert!(v[k].as_f64().is_some_and(f64::is_finite), "{k} in {v}");
    }
    // κ = 2 (S = 3): versions 0, 2, 4 and 6 are published.
    assert!(v["snapshots"].as_u64().unwrap() >= 3, "{v}");
    // Step 6 trained groups of version ≥ 6 − S = 3, so some worker installed version ≥ 3.
    let versions: Vec<u64> = v["worker_versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(versions.iter().any(|&w| w >= 2), "{v}");
    assert_eq!(v["invariant_holds"], true, "{v}");
    assert_eq!(v["clean_exit"], true, "{v}");
    let log = steps(&dir.join("learner"));
    assert_eq!(log.len(), 6);
    assert!(log
        .iter()
        .all(|s| s["stats"]["staleness_max"].as_u64().unwrap() <= 3));
    assert!(assert_no_group_trained_twice(&log) > 0);
    // The learner trains on the CPU (`auto` without CUDA), so it kept freed memory in its
    // heap, set before any of its threads had started (`learner::heap`); a worker left its
    // heap alone.
    if !cfg!(feature = "cuda") {
        let node_log = |who: &str| std::fs::read_to_string(dir.join(who).join("node.log")).unwrap();
        let kept = "training on the CPU: freed memory stays in the heap";
        assert!(
            node_log("learner").contains(kept),
            "{}",
            node_log("learner")
        );
        assert!(!node_log("worker-1").contains("freed memory"));
    }
}

#[test]
fn a_learner_killed_mid_run_resumes_without_training_a_group_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-crash";
    let (mut learner, mut workers) = Node::learner_and_workers(
        tmp.path(),
        swarm,
        "[learner]\nwarm_start_steps = 5\ncheckpoint_every = 4\n",
        2,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let limit = Duration::from_secs(240);
    let version = |n: &mut Node| n.status()?["learner"]["version"].as_u64();
    let before = wait_for("the learner to reach version 9", limit, || {
        version(&mut learner).filter(|&v| v >= 9)
    });
    learner.kill(); // SIGKILL, mid-run
    let logged_before = steps(&tmp.path().join("learner")).len();
    // Same address, so that the workers' bootstrap redials reach the restarted learner.
    learner.listen_arg = learner.listen.clone().unwrap();
    learner.spawn();
    wait_for("the restarted learner to train 6 more steps", limit, || {
        version(&mut learner).filter(|&v| v >= before + 6)
    });
    let weights = learner.status().unwrap()["learner"]["started_from_version"]
        .as_u64()
        .unwrap();
    terminate(&mut learner);
    for w in &mut workers {
        terminate(w);
    }

    let log = steps(&tmp.path().join("learner"));
    assert!(log.len() > logged_before, "no step after the restart");
    // It resumed from its newest published snapshot (every κ steps; it had reached ≥ 9, and
    // checkpoints every 4 steps), not from scratch.
    let first_after = log[logged_before]["step"].as_u64().unwrap();
    assert!(first_after >= 9, "restarted at step {first_after}");
    // Steps logged before the kill past the weights it resumed with were rolled back by the
    // crash: their groups come back from the learner's journal and are trained again. Those
    // weights are the newest published snapshot's (`first_after − 1`), or the checkpoint's
    // when that snapshot was cut short by the kill (then numbered on after it). In the history
    // the model has (the steps up to those weights, then the steps after the restart) no
    // group is trained twice.
    assert!(
        weights < first_after,
        "weights {weights}, first step {first_after}"
    );
    let kept: Vec<Value> = log[..logged_before]
        .iter()
        .filter(|s| s["step"].as_u64().unwrap() <= weights)
        .chain(&log[logged_before..])
        .cloned()
        .collect();
    assert_no_group_trained_twice(&kept);
    // Published versions do not go back across the crash. (Equal is possible: a version the
    // training thread handed to the publisher just before the kill, but that never reached
    // the chunk store, is published again by the restarted learner.)
    let published: Vec<u64> = log
        .iter()
        .filter(|s| s["published"] == true)
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    assert!(
        published.windows(2).all(|w| w[0] <= w[1]),
        "published versions went backwards: {published:?}"
    );
    for name in ["learner", "w0", "w1"] {
        assert!(
            invariant_holds(&tmp.path().join(name)),
            "invariant on {name}"
        );
    }
}

/// A worker that stops answering in the middle of a pull (SIGSTOP: its connections stay
/// open, nothing is read or written) does not hold its share of the learner's buffer: the
/// pull hedges (`control::pulls::hedge`), its share is asked of the other worker, and once
/// continued the stopped worker is pulled from and trained on again, without a strike.
#[test]
fn a_stopped_worker_does_not_hold_its_share_of_the_learners_buffer() {
    use nix::sys::signal::Signal;
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut workers) = Node::learner_and_workers(
        tmp.path(),
        "it-hedge",
        "[learner]\nwarm_start_steps = 2\n",
        2,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let limit = Duration::from_secs(240);
    let learner_status = |n: &mut Node| n.status().map(|s| s["learner"].clone());
    wait_for("the learner to train from both workers", limit, || {
        let ok = workers
            .iter()
            .all(|w| crate::swarm::trained(&learner, &w.key.peer_id) > 0);
        ok.then_some(())
    });
    let before = learner_status(&mut learner).unwrap();
    let stopped = workers[0].child.as_ref().expect("running");
    crate::signal(stopped, Signal::SIGSTOP);
    // Stopped only until a pull hedges (well inside the pull's 10-s read deadline, so the
    // stopped worker's pull does not fail: a stop is no fault of its data).
    let during = wait_for("a pull to hedge while w0 is stopped", limit, || {
        let l = learner_status(&mut learner)?;
        (l["pulls_hedged"].as_u64()? > before["pulls_hedged"].as_u64()?).then_some(l)
    });
    let w0_during = crate::swarm::trained(&learner, &workers[0].key.peer_id);
    crate::signal(workers[0].child.as_ref().expect("running"), Signal::SIGCONT);
    // Continued, w0 is pulled from and trained on again: a hedge is no strike.
    wait_for("groups of w0 trained after it continued", limit, || {
        (crate::swarm::trained(&learner, &workers[0].key.peer_id) > w0_during).then_some(())
    });
    let after = learner.status().unwrap();
    terminate(&mut learner);
    for w in &mut workers {
        terminate(w);
    }
    assert!(during["pulls_hedged"].as_u64().unwrap() >= 1, "{during}");
    let w0 = after["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer_id"] == workers[0].key.peer_id.as_str())
        .expect("w0 among the learner's peers");
    assert_eq!(w0["strikes"], 0, "{w0}");
    assert!(invariant_holds(&tmp.path().join("learner")));
}

#[test]
fn a_restart_with_another_staleness_keeps_one_window_for_the_whole_learner() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-window";
    let (mut learner, mut workers) = Node::learner_and_workers(
        tmp.path(),
        swarm,
        "[learner]\nwarm_start_steps = 2\nstaleness = 3\ncheckpoint_every = 2\n",
        1,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let limit = Duration::from_secs(240);
    let learner_status = |n: &mut Node| n.status().map(|s| s["learner"].clone());
    let before = wait_for("the learner to reach version 4", limit, || {
        learner_status(&mut learner)?["version"]
            .as_u64()
            .filter(|&v| v >= 4)
    });
    terminate(&mut learner);
    // The operator edits S and restarts: the run resumes from its checkpoint.
    let text = std::fs::read_to_string(&learner.config).unwrap();
    assert!(text.contains("staleness = 3"), "{text}");
    std::fs::write(
        &learner.config,
        text.replace("staleness = 3", "staleness = 1"),
    )
    .unwrap();
    learner.listen_arg = learner.listen.clone().unwrap();
    learner.spawn();
    // Wait for a pull asked after the restart (at a version past the restart point).
    let l = wait_for("a pull by the restarted learner", limit, || {
        let l = learner_status(&mut learner)?;
        l["last_pull_version"]
            .as_u64()
            .filter(|&v| v > before)
            .map(|_| l)
    });
    terminate(&mut learner);
    terminate(&mut workers[0]);

    // One value everywhere: the checkpoint's S = 3 (documented in docs/learner.md).
    assert_eq!(l["staleness"], 3, "status: {l}");
    let (v, v_min) = (
        l["last_pull_version"].as_u64().unwrap(),
        l["last_pull_v_min"].as_u64().unwrap(),
    );
    assert_eq!(
        v - v_min,
        v.min(3),
        "the puller's window: v {v}, v_min {v_min}"
    );
    // The trainer's admissions stay within S = 3.
    let log = steps(&tmp.path().join("learner"));
    assert!(log
        .iter()
        .all(|s| s["stats"]["staleness_max"].as_u64().unwrap() <= 3));
    // And the node said which value it uses, and why.
    let text = std::fs::read_to_string(&learner.log).unwrap();
    assert!(
        text.contains("learner.staleness") && text.contains("keeps the checkpoint's value"),
        "no warning about the ignored config value in the log"
    );
    assert!(
        text.contains("learner window") && text.contains("staleness=3"),
        "{text}"
    );
}
