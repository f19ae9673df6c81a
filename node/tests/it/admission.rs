//! Admission and graded response across real processes (`docs/security.md`, "Probation and
//! admission", "Graded response"):
//! - a learner in `ticket` mode pulls only from the worker presenting a ticket that
//!   `echo-node admit` wrote for its peer id; the other worker is refused (and not struck);
//! - a worker forging log-probs is banned at its first checked group (proof), and the ban
//!   survives a restart of the learner;
//! - a worker sampling with another rule than the learner's is not pulled from, nor struck.
//!
//! Every wait polls against a deadline; children are killed and reaped on drop.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::swarm::{keygen, trained, wait_for, Node, BIN};

const LEARNER: &str = "[learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n";
const WORKER: &str = "[storage]\nmax_pending_groups = 8\n[rollout]\ngroup_size = 4\n";
const LIMIT: Duration = Duration::from_secs(240);

fn peer(status: &Value, peer_id: &str) -> Option<Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"] == peer_id)
        .cloned()
}

/// `echo-node admit PEER --hours H --config C --json`: the ticket (hex), or the error text.
fn admit(peer: &str, hours: &str, config: &std::path::Path) -> Result<String, String> {
    let out = Command::new(BIN)
        .args(["admit", peer, "--hours", hours, "--json", "--config"])
        .arg(config)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["peer_id"], peer);
    Ok(v["ticket"].as_str().unwrap().to_string())
}

#[test]
fn a_ticket_swarm_trains_only_the_admitted_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-ticket";
    let mut learner = Node::start_full(
        tmp.path(),
        "learner",
        "learner",
        swarm,
        None,
        "",
        &format!("{LEARNER}[admission]\nmode = \"ticket\"\n"),
    );
    learner.wait_ready();
    let boot = format!("bootstrap = [\"{}\"]", learner.addr());
    let lpk = learner.key.public_key.clone();
    // The admitted worker: its key first, then its ticket, then its config.
    let dir = tmp.path().join("admitted");
    std::fs::create_dir_all(&dir).unwrap();
    let key = keygen(&dir);
    let ticket = admit(&key.peer_id, "2", &learner.config).unwrap();
    // Refused: a config that is not a learner's, and a nonsense duration.
    let not_learner = tmp.path().join("rollout.toml");
    std::fs::write(
        &not_learner,
        format!("role = \"rollout\"\nswarm_id = \"{swarm}\"\ndata_dir = \"x\"\n"),
    )
    .unwrap();
    assert!(admit(&key.peer_id, "2", &not_learner)
        .unwrap_err()
        .contains("learner"));
    assert!(admit(&key.peer_id, "0", &learner.config)
        .unwrap_err()
        .contains("--hours"));
    let mut admitted = Node::launch(
        tmp.path(),
        "admitted",
        "rollout",
        swarm,
        Some(&lpk),
        &boot,
        &format!("{WORKER}[admission]\nticket = \"{ticket}\"\n"),
        key,
    );
    let mut stranger = Node::start_full(
        tmp.path(),
        "stranger",
        "rollout",
        swarm,
        Some(&lpk),
        &boot,
        WORKER,
    );
    admitted.wait_ready();
    let stranger_id = stranger.wait_ready()["peer_id"]
        .as_str()
        .unwrap()
        .to_string();
    let admitted_id = admitted.key.peer_id.clone();
    let status = wait_for("three learner steps", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? >= 3).then_some(s)
    });
    // The stranger is known to the learner (it heartbeats) and produces groups, but none of
    // them is pulled or trained; it is not struck for lacking a ticket.
    let refused = &status["learner"]["admission"]["refused"][&stranger_id];
    assert!(
        refused.as_str().unwrap_or_default().contains("ticket"),
        "{}",
        status["learner"]["admission"]
    );
    assert_eq!(status["learner"]["admission"]["mode"], "ticket");
    assert!(trained(&learner, &admitted_id) > 0);
    assert_eq!(trained(&learner, &stranger_id), 0);
    let s = peer(&status, &stranger_id).expect("the stranger is a peer");
    assert_eq!(s["strikes"].as_u64(), Some(0), "{s}");
    // It does produce groups; they stay on its disk.
    wait_for("the stranger's groups", LIMIT, || {
        let st = stranger.status()?;
        (st["rollout"]["groups"].as_u64()? > 0).then_some(())
    });
    wait_for("another learner step", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["version"].as_u64()? > status["learner"]["version"].as_u64()?).then_some(())
    });
    assert_eq!(trained(&learner, &stranger_id), 0);
    admitted.kill();
    stranger.kill();
    learner.kill();
}

/// A worker configured with another sampling rule than the learner's (here a temperature of
/// 1.0 against 1.2, and a response limit of 5 tokens against 6) would have every group refused
/// and be banned. Its heartbeats report its rule, so the learner does not pull from it, lists
/// it as refused with both rules, logs it, and strikes nothing; the worker with the learner's
/// rule trains (`docs/security.md`, "Where a response ends").
#[test]
fn a_worker_sampling_with_another_rule_is_not_pulled_from_nor_struck() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-sampling-rule";
    let mut learner = Node::start_full(tmp.path(), "learner", "learner", swarm, None, "", LEARNER);
    learner.wait_ready();
    let boot = format!("bootstrap = [\"{}\"]", learner.addr());
    let lpk = learner.key.public_key.clone();
    let start = |name: &str, rollout: &str| {
        Node::start_full(
            tmp.path(),
            name,
            "rollout",
            swarm,
            Some(&lpk),
            &boot,
            &format!("{WORKER}{rollout}"),
        )
    };
    let mut same = start("same", "");
    let mut cooler = start("cooler", "temperature = 1.0\n");
    let mut shorter = start("shorter", "max_new_tokens = 5\n");
    let id = |n: &mut Node| n.wait_ready()["peer_id"].as_str().unwrap().to_string();
    let (same_id, cooler_id, shorter_id) = (id(&mut same), id(&mut cooler), id(&mut shorter));
    let status = wait_for("three learner steps, both mismatches seen", LIMIT, || {
        let s = learner.status()?;
        let refused = &s["learner"]["admission"]["refused"];
        (s["learner"]["version"].as_u64()? >= 3
            && refused[&cooler_id].is_string()
            && refused[&shorter_id].is_string())
        .then_some(s)
    });
    let refused = &status["learner"]["admission"]["refused"];
    let why = |id: &str| refused[id].as_str().unwrap().to_string();
    assert!(
        why(&cooler_id).contains("temperature 1,") && why(&cooler_id).contains("temperature 1.2,"),
        "{refused}"
    );
    assert!(
        why(&shorter_id).contains("at most 5 new tokens") && why(&shorter_id).contains("at most 6"),
        "{refused}"
    );
    assert!(refused[&same_id].is_null(), "{refused}");
    assert!(trained(&learner, &same_id) > 0);
    for other in [&cooler_id, &shorter_id] {
        assert_eq!(trained(&learner, other), 0);
        let p = peer(&status, other).expect("a known peer");
        assert_eq!(p["strikes"].as_u64(), Some(0), "{p}");
    }
    let log = std::fs::read_to_string(&learner.log).unwrap();
    let warned = |id: &str| {
        log.lines()
            .filter(|l| l.contains("not pulling from this worker") && l.contains(id))
            .count()
    };
    assert_eq!(
        (warned(&cooler_id), warned(&shorter_id), warned(&same_id)),
        (1, 1, 0),
        "one warning per worker and rule:\n{log}"
    );
    same.kill();
    cooler.kill();
    shorter.kill();
    learner.kill();
}

/// Needs a malicious worker: only with the `adversary` feature.
#[cfg(feature = "adversary")]
#[test]
fn forged_log_probs_ban_at_once_and_the_ban_survives_a_learner_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-proof";
    let (mut learner, mut honest) =
        Node::learner_and_workers(tmp.path(), swarm, LEARNER, 1, WORKER);
    let mut bad = crate::verified::bad_worker(
        tmp.path(),
        swarm,
        &learner,
        "forged_logprobs",
        crate::verified::WORKER,
    );
    let bad_id = bad.key.peer_id.clone();
    bad.wait_ready();
    // Every group of a new identity is checked: the first forged one is proof.
    let banned = wait_for("the forger's ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?;
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(banned["ban_reason"], "logprob_mismatch", "{banned}");
    assert_eq!(banned["strikes"], 1, "banned at once: {banned}");
    assert_eq!(trained(&learner, &bad_id), 0);
    // Restart the learner on its data dir (same address): the ban is restored before the
    // forger can be pulled from again.
    crate::sigterm(learner.child.as_ref().unwrap());
    let _ = learner.child.as_mut().unwrap().wait();
    learner.child = None;
    learner.listen_arg = learner.listen.clone().unwrap();
    learner.spawn();
    let again = wait_for("the restored ban", LIMIT, || {
        let p = peer(&learner.status()?, &bad_id)?;
        (p["banned"] == true).then_some(p)
    });
    assert_eq!(again["ban_reason"], "logprob_mismatch", "{again}");
    wait_for("training after the restart", LIMIT, || {
        let s = learner.status()?;
        (s["learner"]["steps"].as_u64()? >= 2).then_some(())
    });
    assert_eq!(trained(&learner, &bad_id), 0);
    // Those steps may have trained groups buffered before the restart (the buffer is durable),
    // before the honest worker reconnected: wait for it to be a peer again.
    let h = wait_for("the honest worker back as a peer", LIMIT, || {
        peer(&learner.status()?, &honest[0].key.peer_id)
    });
    assert_eq!(
        (h["strikes"].as_u64(), h["banned"].as_bool()),
        (Some(0), Some(false)),
        "{h}"
    );
    honest[0].kill();
    bad.kill();
    learner.kill();
}
