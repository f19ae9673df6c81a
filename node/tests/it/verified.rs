//! Verified rollouts across real processes: a learner, one honest worker and one worker that
//! carries out test-only attacks (`ECHO_NODE_MISBEHAVE`) on the groups it produces. The
//! learner must keep training on the honest worker's groups, refuse the bad worker's with the
//! right reason (`pull_groups_rejected_total{reason}` on its `/metrics`), strike it and ban it
//! (`strikes`, `banned`, `ban_reason` in the learner's `/status` peers), never the honest one —
//! whose signed groups with assigned prompts and true rewards pass end to end. Every wait
//! polls against a deadline; children are killed and reaped on drop.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::swarm::{keygen, peer, rejected, wait_for, Node, BIN};

/// Small, fast training: groups of 4 samples, 2 groups a step, after a short supervised warm
/// start. Without it the untrained model rarely scores: a group whose samples all get the same
/// reward has zero advantage and trains nothing, so a step needed tens of groups, and three
/// steps took from 30 s to past the 240-s limit on a loaded CI machine (1–3 s with it).
pub(crate) const LEARNER: &str =
    "[learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n";
pub(crate) const WORKER: &str = "[storage]\nmax_pending_groups = 8\n[rollout]\ngroup_size = 4\n";
pub(crate) const LIMIT: Duration = Duration::from_secs(240);

/// A rollout worker bootstrapping from `learner` that carries out `attacks`; `sections` are
/// its config's tables after `[network]`.
pub(crate) fn bad_worker(
    root: &Path,
    swarm: &str,
    learner: &Node,
    attacks: &str,
    sections: &str,
) -> Node {
    bad_worker_named(root, "bad", swarm, learner, attacks, sections)
}

/// [`bad_worker`] in `root/name`.
pub(crate) fn bad_worker_named(
    root: &Path,
    name: &str,
    swarm: &str,
    learner: &Node,
    attacks: &str,
    sections: &str,
) -> Node {
    let data = root.join(name);
    std::fs::create_dir_all(&data).unwrap();
    let key = keygen(&data);
    let config = data.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "role = \"rollout\"\nswarm_id = \"{swarm}\"\ndata_dir = \"{}\"\n\
             learner_public_key = \"{}\"\n\n[network]\nmdns = false\nautonat = false\n\
             heartbeat_interval_ms = 300\nbootstrap = [\"{}\"]\n\n{sections}",
            data.display(),
            learner.key.public_key,
            learner.addr()
        ),
    )
    .unwrap();
    let log = data.join("node.log");
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--admin", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env(echo_node::misbehave::ENV_VAR, attacks)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Node {
        name: name.into(),
        child: Some(child),
        config,
        log,
        listen: None,
        admin: String::new(),
        key,
        listen_arg: "/ip4/127.0.0.1/tcp/0".into(),
        run_args: Vec::new(),
    }
}

/// Waits until the learner refused at least one group of `bad` for each of `reasons`, struck
/// it that often, and trained `steps` steps; then checks the honest worker was never struck.
fn expect_refused_and_struck(swarm: &str, attacks: &str, reasons: &[&str], steps: u64) {
    // Enough strikes before the ban for every attack to be seen: the worker takes its attacks
    // in turn, one per group (`seq mod k`).
    // (The learner's sections follow its `[network]` keys, so a bare key lands there.)
    let learner_config = format!("ban_after_strikes = {}\n{LEARNER}", 4 * reasons.len());
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, &learner_config, 1, WORKER);
    let mut bad = bad_worker(tmp.path(), swarm, &learner, attacks, WORKER);
    let bad_id = bad.key.peer_id.clone();
    bad.wait_ready();
    for r in reasons {
        wait_for(&format!("a group refused as {r}"), LIMIT, || {
            learner.status()?;
            (rejected(&learner, r) > 0).then_some(())
        });
    }
    // Each refused group is a strike; past `ban_after_strikes` the worker is banned for
    // the run, for one of the reasons its groups were refused.
    let struck = wait_for("the bad worker's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?.clone();
        let n = 4 * reasons.len() as u64;
        (p["banned"] == true && p["strikes"].as_u64()? >= n && p["failures"].as_u64()? >= n)
            .then_some(p)
    });
    let ban_reason = struck["ban_reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let expected: Vec<&str> = reasons
        .iter()
        .map(|r| match *r {
            "bad_signature" | "reward_mismatch" => *r,
            _ => "invalid_group",
        })
        .collect();
    assert!(
        expected.contains(&ban_reason.as_str()),
        "banned for {ban_reason}, expected one of {expected:?}: {struck}"
    );
    // Training goes on with the honest worker's groups.
    let status = wait_for(&format!("{steps} learner steps"), LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= steps).then_some(s)
    });
    let h = peer(&status, &honest[0].key.peer_id).expect("the honest worker is a peer");
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "the honest worker was struck: {h}"
    );
    for r in [
        "bad_signature",
        "wrong_prompt",
        "reward_mismatch",
        "token_out_of_vocab",
    ] {
        if !reasons.contains(&r) {
            assert_eq!(rejected(&learner, r), 0, "unexpected {r} rejections");
        }
    }
    assert!(status["learner"]["groups_pulled"].as_u64().unwrap() > 0);
    eprintln!("bad worker after strikes: {struck}");
    honest[0].kill();
    bad.kill();
    learner.kill();
}

#[test]
fn a_worker_inflating_rewards_is_refused_and_struck_while_training_goes_on() {
    expect_refused_and_struck("it-inflated", "inflated_reward", &["reward_mismatch"], 3);
}

#[test]
fn out_of_vocab_invalid_logprobs_and_forged_signatures_are_refused_and_struck() {
    expect_refused_and_struck(
        "it-invalid",
        "out_of_vocab,invalid_logprob,bad_signature",
        &[
            "token_out_of_vocab",
            "logprob_out_of_range",
            "bad_signature",
        ],
        2,
    );
}

/// A worker that answers every pull with one group more than it leased: the pull is refused
/// as an oversized answer (bounded by the request, never stored beyond it), the worker is
/// struck and banned, and the learner trains on.
#[test]
fn an_oversized_pull_answer_is_struck_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), "it-oversized", LEARNER, 1, WORKER);
    let mut bad = bad_worker(
        tmp.path(),
        "it-oversized",
        &learner,
        "oversized_answer",
        WORKER,
    );
    let bad_id = bad.key.peer_id.clone();
    bad.wait_ready();
    let banned = wait_for("the oversized answerer's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?.clone();
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(banned["ban_reason"], "oversized_answer", "{banned}");
    let steps = learner.status().unwrap()["learner"]["version"]
        .as_u64()
        .unwrap_or(0);
    let status = wait_for("two more learner steps", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= steps + 2).then_some(s)
    });
    let h = peer(&status, &honest[0].key.peer_id).expect("the honest worker is a peer");
    assert_eq!(h["strikes"].as_u64(), Some(0), "{h}");
    honest[0].kill();
    bad.kill();
    learner.kill();
}
