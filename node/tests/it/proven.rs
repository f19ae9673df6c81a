//! Proven rollouts across real processes (`docs/security.md`, "Checkable sampling" and
//! "Learner-owned loss masks"): the learner prescribes every sampled token's uniform and
//! derives every loss mask itself. An honest worker sampling in half precision passes every
//! check, never struck; a worker that writes its responses (with their true log-probs) is
//! banned at its first checked group, and one that chooses its loss masks at its strike
//! threshold — neither has a group trained. Every wait polls against a deadline; children are
//! killed and reaped on drop.

use serde_json::Value;

use crate::swarm::{http_get, peer, rejected, trained, wait_for, Node};
use crate::verified::{bad_worker_named, LEARNER, LIMIT, WORKER};

/// The learner's `learner_spot_checks_total{result="…"}`.
fn spot_checks(learner: &Node, result: &str) -> u64 {
    let body = http_get(&learner.admin, "/metrics").body;
    let series = format!("learner_spot_checks_total{{result=\"{result}\"}}");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn version(status: &Value) -> Option<u64> {
    status["learner"]["version"].as_u64()
}

/// A worker sampling in f16 (`rollout.dtype`, reported in its heartbeats) against a learner
/// that spot-checks every group of a warm-started model: every check passes with the f16
/// tolerance and margin, and the worker is never struck.
#[test]
fn an_honest_f16_worker_passes_every_check_and_is_never_struck() {
    let tmp = tempfile::tempdir().unwrap();
    let learner_cfg = format!("{LEARNER}[verification]\nspot_check_fraction = 1.0\n");
    let worker_cfg = format!("{WORKER}dtype = \"f16\"\n");
    let (mut learner, mut workers) =
        Node::learner_and_workers(tmp.path(), "it-f16", &learner_cfg, 1, &worker_cfg);
    let id = workers[0].key.peer_id.clone();
    let status = wait_for("8 learner steps on checked f16 groups", LIMIT, || {
        let s = learner.status()?;
        (version(&s)? >= 8 && spot_checks(&learner, "pass") >= 8).then_some(s)
    });
    let w = peer(&status, &id).expect("the worker is a peer");
    assert_eq!(w["device"]["dtype"], "f16", "{w}");
    assert_eq!(
        (w["strikes"].as_u64(), w["banned"].as_bool()),
        (Some(0), Some(false)),
        "an honest f16 worker was struck: {w}"
    );
    for r in ["mismatch", "not_drawn"] {
        assert_eq!(spot_checks(&learner, r), 0, "honest groups failed as {r}");
    }
    assert!(trained(&learner, &id) > 0);
    workers[0].kill();
    learner.kill();
}

/// Next to an honest worker, one that writes its responses and reports their true
/// log-probs (`forced_tokens`) and one that chooses its loss masks (`mask_poisoning`). The
/// first is banned at once for `token_not_drawn` (its first groups are always checked), the
/// second for `mask_mismatch` (every group's mask is checked); neither has a single group
/// trained, and the honest worker is never struck while training goes on.
#[test]
fn forced_tokens_and_poisoned_masks_are_banned_before_a_group_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), "it-proven", LEARNER, 1, WORKER);
    let mut forced = bad_worker_named(
        tmp.path(),
        "forced",
        "it-proven",
        &learner,
        "forced_tokens",
        WORKER,
    );
    let mut masks = bad_worker_named(
        tmp.path(),
        "masks",
        "it-proven",
        &learner,
        "mask_poisoning",
        WORKER,
    );
    let (forced_id, masks_id) = (forced.key.peer_id.clone(), masks.key.peer_id.clone());
    forced.wait_ready();
    masks.wait_ready();
    for (id, reason) in [
        (&forced_id, "token_not_drawn"),
        (&masks_id, "mask_mismatch"),
    ] {
        let p = wait_for(&format!("the {reason} ban"), LIMIT, || {
            let p = peer(&learner.status()?, id).cloned()?;
            (p["banned"] == true).then_some(p)
        });
        assert_eq!(p["ban_reason"], reason, "{p}");
        assert!(rejected(&learner, reason) > 0);
    }
    let steps = version(&learner.status().unwrap()).unwrap_or(0);
    let status = wait_for("three more learner steps", LIMIT, || {
        let s = learner.status()?;
        (version(&s)? >= steps + 3).then_some(s)
    });
    assert_eq!(
        trained(&learner, &forced_id),
        0,
        "a forced group was trained"
    );
    assert_eq!(
        trained(&learner, &masks_id),
        0,
        "a poisoned group was trained"
    );
    let h = peer(&status, &honest[0].key.peer_id).expect("the honest worker is a peer");
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "the honest worker was struck: {h}"
    );
    assert!(trained(&learner, &honest[0].key.peer_id) > 0);
    for n in [&mut forced, &mut masks, &mut honest[0], &mut learner] {
        n.kill();
    }
}
