//! Multi-turn environments across real processes: a learner and two workers train on
//! `kuhn-poker` (whole episodes generated with the KV cache carried across turns, replayed
//! and checked by the learner, exact evaluation of every published version), and a worker
//! that forges an episode's return or an observation is refused (`replay_mismatch`), struck,
//! banned, and none of its groups is trained. The same for an external environment (the
//! repository's `envs/testenv.py`): a swarm trains on it through crashes of the program, and a
//! forger of its returns is struck after replay. Every wait polls against a deadline.

use std::time::Duration;

use serde_json::Value;

use crate::swarm::{peer, rejected, trained, wait_for, Node};

const TASK: &str = "[task]\nname = \"kuhn-poker\"\nparams = { opponent = \"always-bet\" }\n";
/// Generous: a learner's warm start, first evaluation and the first strikes take minutes on
/// a loaded two-core CI machine.
const LIMIT: Duration = Duration::from_secs(600);

fn learner_sections() -> String {
    format!(
        "{TASK}[learner]\nwarm_start_steps = 30\ngroup_size = 4\ngroups_per_step = 2\n\
         [verification]\nspot_check_fraction = 1.0\n"
    )
}

fn worker_sections() -> String {
    format!("{TASK}[storage]\nmax_pending_groups = 8\n[rollout]\ngroup_size = 4\n")
}

#[test]
fn a_learner_and_two_workers_train_on_kuhn_poker_with_replayed_episodes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut workers) = Node::learner_and_workers(
        tmp.path(),
        "it-kuhn",
        &learner_sections(),
        2,
        &worker_sections(),
    );
    let status = wait_for("4 learner steps on kuhn-poker", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= 4).then_some(s)
    });
    // Both workers' groups replayed (observations, returns, masks) and passed the log-prob
    // and draw checks on every group: nobody was struck.
    let mut trained_total = 0;
    for w in &workers {
        let p = peer(&status, &w.key.peer_id).expect("a worker is a peer");
        assert_eq!(p["strikes"].as_u64(), Some(0), "{p}");
        trained_total += trained(&learner, &w.key.peer_id);
    }
    assert!(trained_total >= 8, "4 steps of 2 groups: {trained_total}");
    assert_eq!(rejected(&learner, "replay_mismatch"), 0);
    assert_eq!(rejected(&learner, "logprob_mismatch"), 0);
    // Every sampled token of every episode (all groups are checked) was the canonical rule's
    // draw from its prescribed uniform, across the turns.
    assert_eq!(rejected(&learner, "token_not_drawn"), 0);
    // Every trained sample is an episode: its reward is a chip count of Kuhn poker.
    let l = &status["learner"];
    let reward = l["last_step"]["reward_mean"].as_f64().unwrap();
    assert!((-2.0..=2.0).contains(&reward), "{l}");
    // The exact evaluation of published versions, against the named opponent.
    let curve = wait_for("an exact evaluation in the status", LIMIT, || {
        let s = learner.status()?;
        let c = s["learner"]["curve"].clone();
        (!c["eval"].as_array()?.is_empty()).then_some(c)
    });
    assert_eq!(curve["opponent"], "always-bet");
    let e: &Value = &curve["eval"][0];
    assert!(
        (e["best_response"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9,
        "{e}"
    );
    assert!(e["exploitability"].as_f64().unwrap() >= 0.0);
    assert!(!curve["reward"].as_array().unwrap().is_empty());
    let log = std::fs::read_to_string(tmp.path().join("learner/metrics/eval.jsonl")).unwrap();
    assert!(log.lines().count() >= 1 && log.contains("\"ev\""), "{log}");
    for w in &mut workers {
        w.kill();
    }
    learner.kill();
}

/// Attack code (the forging worker) exists only in a build with the `adversary` feature.
#[cfg(feature = "adversary")]
#[test]
fn a_worker_forging_returns_or_observations_is_struck_and_never_trained() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-kuhn-forged";
    let learner_config = format!("ban_after_strikes = 4\n{}", learner_sections());
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, &learner_config, 1, &worker_sections());
    let mut bad = crate::verified::bad_worker(
        tmp.path(),
        swarm,
        &learner,
        "forged_return,forged_observation",
        &worker_sections(),
    );
    let bad_id = bad.key.peer_id.clone();
    bad.wait_ready();
    let struck = wait_for("the forging worker's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?.clone();
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(struck["ban_reason"], "reward_mismatch", "{struck}");
    assert!(rejected(&learner, "replay_mismatch") >= 4);
    // Both lies were seen (the worker alternates them group by group; an observation can
    // only be forged in a group with two-turn hands).
    let log = std::fs::read_to_string(tmp.path().join("learner/node.log")).unwrap_or_default();
    assert!(
        log.contains("reported return"),
        "a forged return was refused"
    );
    let steps = learner.status().unwrap()["learner"]["version"]
        .as_u64()
        .unwrap_or(0);
    let status = wait_for("two more learner steps", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= steps + 2).then_some(s)
    });
    let h = peer(&status, &honest[0].key.peer_id).expect("the honest worker is a peer");
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "{h}"
    );
    assert_eq!(
        trained(&learner, &bad_id),
        0,
        "no group of the forger was trained"
    );
    assert!(trained(&learner, &honest[0].key.peer_id) > 0);
    honest[0].kill();
    bad.kill();
    learner.kill();
}

/// The `[task]` of an external environment: the repository's stdlib-only `envs/testenv.py`
/// with `params` (a TOML inline table).
fn external_task(params: &str) -> String {
    format!(
        "[task]\nkind = \"external\"\nname = \"testenv\"\nparams = {params}\n\
         [task.external]\ncommand = [\"python3\", \"{}/../envs/testenv.py\"]\n\
         call_timeout_ms = 30000\n",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn external_sections(params: &str) -> (String, String) {
    let task = external_task(params);
    (
        format!(
            "{task}[learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n\
             [verification]\nspot_check_fraction = 1.0\n"
        ),
        format!("{task}[storage]\nmax_pending_groups = 8\n[rollout]\ngroup_size = 4\n"),
    )
}

/// A learner and a worker train on an external environment whose program crashes in the
/// middle of every third initial state's episodes (on both sides: the same program). The
/// worker abandons those groups (logged, never a reward) and commits their numbers as
/// abandoned, so the next group takes the next initial state; the learner resolves them
/// without a strike, replays the others with its own process of the same program, trains,
/// and strikes nobody.
#[test]
fn a_swarm_trains_on_an_external_environment_that_crashes_mid_episode() {
    let tmp = tempfile::tempdir().unwrap();
    let (learner_cfg, worker_cfg) =
        external_sections("{ turns = 2, fault = \"crash\", fault_every = 3 }");
    let (mut learner, mut workers) =
        Node::learner_and_workers(tmp.path(), "it-external", &learner_cfg, 1, &worker_cfg);
    let status = wait_for("3 learner steps on the external environment", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= 3).then_some(s)
    });
    let w = &workers[0];
    let p = peer(&status, &w.key.peer_id).expect("the worker is a peer");
    assert_eq!(p["strikes"].as_u64(), Some(0), "{p}");
    assert!(trained(&learner, &w.key.peer_id) >= 6);
    assert_eq!(rejected(&learner, "replay_mismatch"), 0);
    assert_eq!(rejected(&learner, "token_not_drawn"), 0);
    // Every trained sample's reward is the program's return, in [0, 1].
    let reward = status["learner"]["last_step"]["reward_mean"]
        .as_f64()
        .unwrap();
    assert!((0.0..=1.0).contains(&reward), "{status}");
    let log = wait_for("the worker's log of an abandoned episode", LIMIT, || {
        let log = std::fs::read_to_string(&w.log).ok()?;
        log.contains("episode abandoned").then_some(log)
    });
    assert!(log.contains("exit status: 3"), "the crash is named");
    // The failed numbers reached the learner as abandoned commitments, and none as withheld.
    let id = w.key.peer_id.clone();
    let ev = wait_for("the learner's count of abandoned numbers", LIMIT, || {
        let s = learner.status()?;
        let ev = s["learner"]["admission"]["evidence"][&id].clone();
        (ev["committed_abandoned"].as_u64()? > 0).then_some(ev)
    });
    assert!(ev["withheld"].as_u64().unwrap_or(0) == 0, "{ev}");
    for w in &mut workers {
        w.kill();
    }
    learner.kill();
}

/// A worker that forges the returns of an external environment's episodes is refused after
/// the learner's replay with its own process of the program, struck, banned, never trained.
#[cfg(feature = "adversary")]
#[test]
fn a_worker_forging_external_returns_is_struck_after_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-external-forged";
    let (learner_cfg, worker_cfg) = external_sections("{ turns = 2 }");
    let learner_config = format!("ban_after_strikes = 3\n{learner_cfg}");
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, &learner_config, 1, &worker_cfg);
    let mut bad =
        crate::verified::bad_worker(tmp.path(), swarm, &learner, "forged_return", &worker_cfg);
    let bad_id = bad.key.peer_id.clone();
    bad.wait_ready();
    let struck = wait_for("the forging worker's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?.clone();
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(struck["ban_reason"], "reward_mismatch", "{struck}");
    assert!(rejected(&learner, "replay_mismatch") >= 3);
    let log = std::fs::read_to_string(tmp.path().join("learner/node.log")).unwrap_or_default();
    assert!(
        log.contains("reported return"),
        "a forged return was refused"
    );
    let status = wait_for("a learner step from the honest worker", LIMIT, || {
        let s = learner.status()?;
        (trained(&learner, &honest[0].key.peer_id) > 0).then_some(s)
    });
    let h = peer(&status, &honest[0].key.peer_id).expect("the honest worker is a peer");
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "{h}"
    );
    assert_eq!(
        trained(&learner, &bad_id),
        0,
        "no group of the forger was trained"
    );
    honest[0].kill();
    bad.kill();
    learner.kill();
}
