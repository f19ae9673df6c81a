//! Learner durability across a `kill -9` between checkpoints (`docs/learner.md`, "Crash
//! semantics"): the batches acked since the last checkpoint are in the learner's journal at
//! the kill; the restarted learner resumes from the newest snapshot it had published (never
//! publishing a version number again with other weights), takes the journaled batches those
//! weights hold as consumed, puts every later one back into its buffer and trains it again,
//! and its store's accounting still holds. Bounded waits; children reaped on drop.

use std::path::Path;
use std::time::Duration;

use crate::swarm::{inspect, wait_for, Node};

/// The journal folder's batch files: the step each was trained as, and its groups
/// (length-prefixed encoded groups).
fn journaled(data: &Path) -> Vec<(u64, Vec<storage::TrajectoryGroup>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(data.join("journal")) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let Some(step) = name
            .strip_prefix("batch-")
            .and_then(|n| n.strip_suffix(".bin"))
            .and_then(|n| n.split_once("-step-"))
            .map(|(_, step)| step.parse::<u64>().unwrap())
        else {
            continue;
        };
        let bytes = std::fs::read(&p).unwrap();
        let mut rest = bytes.as_slice();
        let mut groups = Vec::new();
        while !rest.is_empty() {
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            groups.push(storage::TrajectoryGroup::decode(&rest[8..8 + len]).unwrap());
            rest = &rest[8 + len..];
        }
        out.push((step, groups));
    }
    out
}

/// The newest snapshot version in a stopped node's store whose chunks are all there.
fn newest_complete_snapshot(data: &Path) -> Option<u64> {
    inspect(data, "snapshots")["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["missing"] == 0)
        .filter_map(|s| s["version"].as_u64())
        .max()
}

/// No checkpoint during the run: every batch trained before the kill is in the journal.
/// A snapshot every 3 steps, so that the kill can fall between two publications.
const LEARNER: &str =
    "[learner]\nwarm_start_steps = 0\ncheckpoint_every = 1000\nstaleness = 4\nkappa = 3\n";

#[test]
fn a_learner_killed_between_checkpoints_gets_its_acked_groups_back() {
    killed_between_checkpoints("it-journal", LEARNER);
}

/// The same for a LoRA learner: its checkpoint (version 0) holds adapters, the versions it
/// published after it are adapter versions in bf16, and the restart continues from the
/// newest of them (its adapters on the same base, `Trainer::resume_from_adapters`) — else it
/// would continue from version 0's adapters under a later number, and the workers' groups of
/// the published versions would fail their spot checks.
#[test]
fn a_lora_learner_killed_between_checkpoints_resumes_from_its_adapter_versions() {
    let cfg = format!("{LEARNER}lora = {{ rank = 4, alpha = 8 }}\n[broadcast]\ndtype = \"bf16\"\n");
    killed_between_checkpoints("it-journal-lora", &cfg);
}

fn killed_between_checkpoints(swarm: &str, learner_cfg: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, workers) = Node::learner_and_workers(
        tmp.path(),
        swarm,
        learner_cfg,
        2,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let limit = Duration::from_secs(240);
    let data = tmp.path().join("learner");
    // Killed a step or two after a publication, so that some batches are trained after the
    // newest snapshot. What the restart must do is computed from the learner's files at the
    // kill, so no exact kill point is needed; but a step can finish between the status read
    // and the kill, and a kill that lands right at a publication leaves nothing to restore.
    // Such a run proves nothing about this case: the learner is restarted (which also
    // restores and empties its journal) and killed again later, up to `ATTEMPTS` times.
    const ATTEMPTS: u32 = 4;
    let mut attempt = 0;
    let mut killed_at = 0;
    let (at_kill, published) = loop {
        attempt += 1;
        killed_at = wait_for(
            "the learner to train past 4 steps, not at a publication",
            limit,
            || {
                learner.status()?["learner"]["version"]
                    .as_u64()
                    .filter(|&v| v >= 4 && v > killed_at && v % 3 != 0)
            },
        );
        learner.kill(); // SIGKILL
        let at_kill = journaled(&data);
        let published = newest_complete_snapshot(&data).expect("version 0 is published at start");
        if attempt == ATTEMPTS || at_kill.iter().any(|(step, _)| *step > published) {
            break (at_kill, published);
        }
        eprintln!("attempt {attempt}: the kill landed at publication v{published}; again");
        learner.listen_arg = learner.listen.clone().unwrap();
        learner.spawn();
    };
    let groups = |keep: &dyn Fn(u64) -> bool| -> Vec<storage::TrajectoryGroup> {
        at_kill
            .iter()
            .filter(|(step, _)| keep(*step))
            .flat_map(|(_, gs)| gs.clone())
            .collect()
    };
    let (in_weights, back) = (groups(&|s| s <= published), groups(&|s| s > published));
    if attempt == 1 {
        // A restart empties the journal, so only the first run has all its steps in it.
        assert!(
            in_weights.len() + back.len() >= 4 * 4,
            "4 steps of B = 4 groups were journaled, found {}",
            in_weights.len() + back.len()
        );
    }
    assert!(
        !back.is_empty(),
        "batches trained after the newest snapshot (v{published}) at the kill: {:?}",
        at_kill.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    let steps_log = data.join("metrics/steps.jsonl");
    let before = std::fs::read_to_string(&steps_log).unwrap().lines().count();
    learner.listen_arg = learner.listen.clone().unwrap();
    // The log is appended to across restarts: this restart's lines come after `offset`.
    let offset = std::fs::metadata(&learner.log).unwrap().len() as usize;
    learner.spawn();
    let this_run = || -> Option<String> {
        let log = std::fs::read_to_string(&learner.log).ok()?;
        log.get(offset..).map(str::to_string)
    };
    let line = wait_for(
        "the restarted learner to restore its journal",
        limit,
        || {
            this_run()?
                .lines()
                .find(|l| l.contains("are back in the buffer"))
                .map(str::to_string)
        },
    );
    let log = this_run().unwrap();
    assert!(
        line.contains(&format!("restored={}", back.len()))
            && line.contains(&format!("in_weights={}", in_weights.len())),
        "{} groups of steps after v{published} go back, {} are in its weights: {line}",
        back.len(),
        in_weights.len()
    );
    if published > 0 {
        let resumed = log
            .lines()
            .find(|l| l.contains("resumed from the newest published snapshot"));
        assert!(
            resumed.is_some_and(|l| l.contains(&format!("version={published}"))),
            "the restart resumes from v{published}: {resumed:?}"
        );
    }
    // The restored groups are trained again (the buffer holds them, so the puller does not
    // top it up with fresher ones first): at least one of them within a few steps; a group
    // the resumed weights hold never is.
    let ids = |gs: &[storage::TrajectoryGroup]| -> std::collections::HashSet<String> {
        gs.iter().map(|g| hex::encode(g.group_id)).collect()
    };
    let (ids, held) = (ids(&back), ids(&in_weights));
    let after = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&steps_log)
            .unwrap_or_default()
            .lines()
            .skip(before)
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let trained_after = || -> Vec<String> {
        after()
            .into_iter()
            .flat_map(|s| s["trained_groups"].as_array().cloned().unwrap_or_default())
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect()
    };
    let retrained = wait_for("a restored group to be trained again", limit, || {
        let n = trained_after().iter().filter(|g| ids.contains(*g)).count();
        (n > 0).then_some(n)
    });
    assert!(
        !trained_after().iter().any(|g| held.contains(g)),
        "a group the resumed snapshot holds was trained again"
    );
    // Training went on from the resumed version: no version number came twice.
    assert_eq!(after()[0]["step"], published + 1);
    // Every verification layer (spot checks included, always on a new peer's first groups)
    // runs on what the restarted learner pulls, and the honest workers sampled under exactly
    // the weights their groups name: none of them is struck.
    let worker_entries = |status: &serde_json::Value| -> Option<Vec<serde_json::Value>> {
        workers
            .iter()
            .map(|w| {
                status["peers"]
                    .as_array()?
                    .iter()
                    .find(|p| p["peer_id"] == w.key.peer_id.as_str())
                    .cloned()
            })
            .collect()
    };
    let entries = wait_for("the restarted learner to pull 8 groups", limit, || {
        let status = learner.status()?;
        (status["learner"]["groups_pulled"].as_u64()? >= 8)
            .then(|| worker_entries(&status))
            .flatten()
    });
    for e in &entries {
        assert_eq!(e["strikes"].as_u64(), Some(0), "{e}");
    }
    eprintln!(
        "resumed at v{published}: {retrained} of {} restored groups trained again, {} held",
        ids.len(),
        held.len()
    );
    learner.kill();
    let v = inspect(&data, "trajectories");
    assert_eq!(v["invariant_holds"], true, "{v}");
}
