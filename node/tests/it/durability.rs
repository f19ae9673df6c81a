//! Learner durability across a `kill -9` between checkpoints (`docs/learner.md`, "Crash
//! semantics"): the batches acked since the last checkpoint are in the learner's journal at
//! the kill, the restarted learner puts every one of them back into its buffer and empties
//! the journal, and its store's accounting still holds. Bounded waits; children reaped on drop.

use std::path::Path;
use std::time::Duration;

use crate::swarm::{wait_for, Node, BIN};

/// Groups in the journal folder's batch files (length-prefixed encoded groups).
fn journaled(data: &Path) -> Vec<storage::TrajectoryGroup> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(data.join("journal")) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path();
        if !p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("batch-")
        {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            out.push(storage::TrajectoryGroup::decode(&rest[8..8 + len]).unwrap());
            rest = &rest[8 + len..];
        }
    }
    out
}

#[test]
fn a_learner_killed_between_checkpoints_gets_its_acked_groups_back() {
    let tmp = tempfile::tempdir().unwrap();
    // No checkpoint during the run: every batch trained before the kill is in the journal.
    let (mut learner, _workers) = Node::learner_and_workers(
        tmp.path(),
        "it-journal",
        "[learner]\nwarm_start_steps = 0\ncheckpoint_every = 1000\n",
        2,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let limit = Duration::from_secs(240);
    wait_for("the learner to train 3 steps", limit, || {
        learner.status()?["learner"]["version"]
            .as_u64()
            .filter(|&v| v >= 3)
    });
    learner.kill(); // SIGKILL
    let data = tmp.path().join("learner");
    let at_kill = journaled(&data);
    assert!(
        at_kill.len() >= 3 * 4,
        "3 steps of B = 4 groups were journaled, found {}",
        at_kill.len()
    );
    learner.listen_arg = learner.listen.clone().unwrap();
    learner.spawn();
    wait_for(
        "the restarted learner to restore its journal",
        limit,
        || {
            let log = std::fs::read_to_string(&learner.log).ok()?;
            log.lines()
                .find(|l| l.contains("are back in the buffer"))
                .map(str::to_string)
        },
    );
    let log = std::fs::read_to_string(&learner.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("are back in the buffer"))
        .unwrap();
    assert!(
        line.contains(&format!("restored={}", at_kill.len())),
        "every journaled group went back ({} at the kill): {line}",
        at_kill.len()
    );
    // The restored groups are trained again (the buffer holds them, so the puller does not
    // top it up with fresher ones first): at least one of them within a few steps.
    let ids: std::collections::HashSet<String> =
        at_kill.iter().map(|g| hex::encode(g.group_id)).collect();
    let steps_log = data.join("metrics/steps.jsonl");
    let before = std::fs::read_to_string(&steps_log).unwrap().lines().count();
    let retrained = wait_for("a restored group to be trained again", limit, || {
        let text = std::fs::read_to_string(&steps_log).ok()?;
        let n = text
            .lines()
            .skip(before)
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .flat_map(|s| s["trained_groups"].as_array().cloned().unwrap_or_default())
            .filter(|g| g.as_str().is_some_and(|g| ids.contains(g)))
            .count();
        (n > 0).then_some(n)
    });
    eprintln!("{retrained} of {} restored groups trained again", ids.len());
    learner.kill();
    let out = std::process::Command::new(BIN)
        .args(["inspect", "trajectories", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["invariant_holds"], true, "{v}");
}
