//! Committed group numbers across real processes (`control::commits`, `docs/security.md`,
//! "Withholding"): a learner, one honest worker and one `withhold_by_reward` worker — whose
//! groups are honest, but which never sends one containing an exact answer (they stay stored
//! and committed, and are left out of every lease). The learner must strike and ban the
//! withholder for the committed groups it kept back, and never strike the honest worker,
//! whose committed groups the learner's window ages out (the staleness budget is one version
//! and the worker keeps a backlog, so honest stale pruning happens all along).

use std::time::Duration;

use crate::swarm::{peer, wait_for, Node};
use crate::verified::{bad_worker, WORKER};

const LIMIT: Duration = Duration::from_secs(300);

/// Enough warm start for the tiny model to answer some prompts exactly; a window of one
/// version, so that honest backlogs go stale.
const LEARNER: &str = "[learner]\nwarm_start_steps = 60\ngroup_size = 4\ngroups_per_step = 2\n\
                       staleness = 1\n";

#[test]
fn a_withholding_worker_is_struck_and_honest_stale_pruning_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-withhold";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 1, WORKER);
    let mut bad = bad_worker(tmp.path(), swarm, &learner, "withhold_by_reward", WORKER);
    let bad_id = bad.key.peer_id.clone();
    let honest_id = honest[0].key.peer_id.clone();
    bad.wait_ready();
    let banned = wait_for("the withholder's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?.clone();
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(banned["ban_reason"], "withheld", "{banned}");
    // The honest worker's committed groups aged out of the window (stale, not struck).
    let status = wait_for("honest committed groups resolved as stale", LIMIT, || {
        let s = learner.status()?;
        let stale =
            s["learner"]["admission"]["evidence"][&honest_id]["committed_stale"].as_u64()?;
        (stale > 0).then_some(s)
    });
    let h = peer(&status, &honest_id).expect("the honest worker is a peer");
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "the honest worker was struck: {h}"
    );
    let ev = &status["learner"]["admission"]["evidence"][&honest_id];
    assert!(
        ev["withheld"].is_null() && ev["commit_broken"].is_null(),
        "{ev}"
    );
    eprintln!("withholder at its ban: {banned}; honest evidence: {ev}");
    honest[0].kill();
    bad.kill();
    learner.kill();
}
