//! The provisioning scheduler across real processes: a learner keeping 4 of 6
//! workers active (`scheduler.active_workers = 4`, the cheapest by ρ = cost/μ), the other two
//! on standby through learner-signed activation orders; an active worker is killed and a
//! standby one is activated and generates while training continues; and a worker claiming a
//! huge μ is ranked by the rate the learner verified instead. Bounded waits.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::swarm::{wait_for, Node};

fn ids(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A learner in `root/learner` whose scheduler keeps `k` workers active, ready; and the
/// `[network]` line that bootstraps a worker from it.
fn scheduling_learner(root: &std::path::Path, swarm: &str, k: usize) -> (Node, String) {
    let mut learner = Node::start_full(
        root,
        "learner",
        "learner",
        swarm,
        None,
        "",
        &format!(
            "[learner]\nwarm_start_steps = 2\n[scheduler]\nenabled = true\nactive_workers = {k}\n\
             announce_interval_ms = 500\n"
        ),
    );
    learner.wait_ready();
    let boot = format!("bootstrap = [\"{}\"]", learner.addr());
    (learner, boot)
}

/// An honest worker `name` declaring `cost` $/h, started.
fn worker(
    root: &std::path::Path,
    name: &str,
    swarm: &str,
    learner: &Node,
    boot: &str,
    cost: f64,
) -> Node {
    Node::start_full(
        root,
        name,
        "rollout",
        swarm,
        Some(&learner.key.public_key),
        &format!("{boot}\ncost_per_hour = {cost}"),
        "[storage]\nmax_pending_groups = 2\n",
    )
}

#[test]
fn a_standby_worker_replaces_a_killed_active_one_and_training_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-scheduler";
    let limit = std::time::Duration::from_secs(150);
    let (mut learner, boot) = scheduling_learner(tmp.path(), swarm, 4);
    // w0..w3 cost 0.1 $/h, w4 and w5 cost 1.0 $/h: the last two end up on standby.
    let mut workers: Vec<Node> = (0..6)
        .map(|i| {
            let cost = if i < 4 { 0.1 } else { 1.0 };
            worker(tmp.path(), &format!("w{i}"), swarm, &learner, &boot, cost)
        })
        .collect();
    let id = |w: &Node| w.key.peer_id.clone();
    let cheap: BTreeSet<String> = workers[..4].iter().map(id).collect();
    let dear: BTreeSet<String> = workers[4..].iter().map(id).collect();

    // 4 active (the cheap ones), 2 on standby, and the standby workers know it.
    wait_for(
        "4 cheap workers active and 2 dear ones on standby",
        limit,
        || {
            let s = learner.status()?;
            let sch = &s["learner"]["scheduler"];
            (ids(&sch["active"]) == cheap && ids(&sch["standby"]) == dear).then_some(())
        },
    );
    for w in workers[4..].iter_mut() {
        let name = w.name.clone();
        wait_for(&format!("{name} to report standby"), limit, || {
            (w.status()?["rollout"]["standby"] == true).then_some(())
        });
    }
    let v0 = wait_for("training", limit, || {
        learner.status()?["learner"]["version"]
            .as_u64()
            .filter(|&v| v >= 2)
    });

    // Kill an active worker: a standby one replaces it at once.
    let killed = id(&workers[0]);
    workers[0].kill();
    let promoted = wait_for("a standby worker to be activated", limit, || {
        let s = learner.status()?;
        let active = ids(&s["learner"]["scheduler"]["active"]);
        let p: Vec<String> = active.intersection(&dear).cloned().collect();
        (!active.contains(&killed) && active.len() == 4 && p.len() == 1).then(|| p[0].clone())
    });
    let w = workers
        .iter_mut()
        .find(|w| w.key.peer_id == promoted)
        .unwrap();
    let groups_before = w.status().unwrap()["rollout"]["groups"]
        .as_u64()
        .unwrap_or(0);
    wait_for("the promoted worker to generate", limit, || {
        let r = &w.status()?["rollout"];
        (r["standby"] == false && r["groups"].as_u64()? > groups_before).then_some(())
    });
    wait_for("training to continue", limit, || {
        learner.status()?["learner"]["version"]
            .as_u64()
            .filter(|&v| v >= v0 + 5)
    });
}

/// A worker claiming μ = 10⁶ groups/s (`mu_inflation`) is dear (1 $/h against 0.1 $/h) but
/// ranks first by its claimed ρ: with `active_workers = 2` it joins two honest workers that
/// have been generating, becomes active, and sends one of them to standby. Once the learner
/// has verified its rate (valid groups delivered per second it asked for them), the claim
/// counts for at most twice that rate: the liar is ranked by what it delivers, goes to
/// standby, and both honest workers generate again. Without the cap it would stay active for good. (An attack: needs the
/// `adversary` feature, as `verified`'s set-up it uses.)
#[cfg(feature = "adversary")]
#[test]
fn a_worker_claiming_a_huge_mu_is_ranked_by_its_verified_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-scheduler-mu";
    let limit = std::time::Duration::from_secs(180);
    let (mut learner, boot) = scheduling_learner(tmp.path(), swarm, 2);
    let mut honest: Vec<Node> = (0..2)
        .map(|i| worker(tmp.path(), &format!("w{i}"), swarm, &learner, &boot, 0.1))
        .collect();
    let honest_ids: BTreeSet<String> = honest.iter().map(|w| w.key.peer_id.clone()).collect();
    // Both honest workers have measured their μ (ranked by ρ, not as unmeasured).
    for w in honest.iter_mut() {
        let name = w.name.clone();
        wait_for(&format!("{name} to measure its mu"), limit, || {
            (w.status()?["rollout"]["mu"].as_f64()? > 0.0).then_some(())
        });
    }

    // The key line before the first table belongs to the `[network]` table above it.
    let mut liar = crate::verified::bad_worker_named(
        tmp.path(),
        "liar",
        swarm,
        &learner,
        "mu_inflation",
        "cost_per_hour = 1.0\n[storage]\nmax_pending_groups = 2\n",
    );
    liar.wait_ready();
    let liar_id = liar.key.peer_id.clone();
    wait_for("the liar active on its claim", limit, || {
        let s = learner.status()?;
        let active = ids(&s["learner"]["scheduler"]["active"]);
        (active.contains(&liar_id) && active.len() == 2).then_some(())
    });
    let verified = wait_for(
        "the liar's claim capped by its verified rate",
        limit,
        || {
            let s = learner.status()?;
            let sch = &s["learner"]["scheduler"];
            let capped = ids(&sch["claims_capped"]).contains(&liar_id);
            let rate = sch["verified_mu"][&liar_id].as_f64()?;
            (capped && ids(&sch["active"]) == honest_ids && ids(&sch["standby"]).contains(&liar_id))
                .then_some(rate)
        },
    );
    assert!(
        verified * 2.0 < echo_node::misbehave::INFLATED_MU,
        "verified {verified} groups/s"
    );
    wait_for("the liar to report standby", limit, || {
        (liar.status()?["rollout"]["standby"] == true).then_some(())
    });
    for w in honest.iter_mut() {
        let name = w.name.clone();
        let before = w.status().unwrap()["rollout"]["groups"]
            .as_u64()
            .unwrap_or(0);
        wait_for(&format!("{name} to generate"), limit, || {
            let r = &w.status()?["rollout"];
            (r["standby"] == false && r["groups"].as_u64()? > before).then_some(())
        });
    }
}
