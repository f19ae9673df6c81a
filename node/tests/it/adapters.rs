//! LoRA adapter versions across real processes (`docs/broadcast.md`, "Adapter snapshots").
//! A LoRA learner whose base was warm-started publishes that base once as the full version 0,
//! then only adapters: two workers install the base and then adapter versions, with the very
//! bytes the learner published, and the learner's spot check of every group recomputes the
//! workers' log-probs on its own base plus those adapters without a mismatch. A learner whose
//! base is the configured model (no warm start) publishes adapters from version 0: a worker
//! configured with another model refuses them, naming both identities, and is not struck. Every
//! wait polls against a deadline; children are killed and reaped on drop.

use std::collections::HashMap;
use std::time::Duration;

use crate::swarm::{counter, log_lines, peer, wait_for, Node};

const LIMIT: Duration = Duration::from_secs(300);
const LORA: &str = "lora = { rank = 4, alpha = 8 }\n";
const WORKER: &str = "[storage]\nmax_pending_groups = 8\n[rollout]\ngroup_size = 4\n";

/// The `key=value` fields of each log line of `node` containing `message` (`_line`: the
/// whole line).
fn logged(node: &Node, message: &str) -> Vec<HashMap<String, String>> {
    log_lines(node, message)
        .into_iter()
        .map(|plain| {
            let mut fields: HashMap<String, String> = plain
                .split_whitespace()
                .filter_map(|t| t.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            fields.insert("_line".into(), plain);
            fields
        })
        .collect()
}

/// `(version, adapter, root)` of each `message` line (installs or publications).
fn versions(node: &Node, message: &str) -> Vec<(u64, bool, String)> {
    logged(node, message)
        .into_iter()
        .filter_map(|f| {
            Some((
                f.get("version")?.parse().ok()?,
                f.get("adapter")? == "true",
                f.get("root").cloned().unwrap_or_default(),
            ))
        })
        .collect()
}

fn spot_checks(learner: &Node, result: &str) -> u64 {
    counter(
        learner,
        &format!("learner_spot_checks_total{{result=\"{result}\"}}"),
    )
}

#[test]
fn workers_install_adapter_versions_on_the_published_base() {
    let tmp = tempfile::tempdir().unwrap();
    let learner_cfg = format!(
        "[learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n{LORA}\
         [broadcast]\ndtype = \"bf16\"\n[verification]\nspot_check_fraction = 1.0\n"
    );
    let (mut learner, mut workers) =
        Node::learner_and_workers(tmp.path(), "it-lora", &learner_cfg, 2, WORKER);
    wait_for(
        "both workers to install three adapter versions, and four passed spot checks",
        LIMIT,
        || {
            let _ = learner.status()?;
            let enough = workers.iter().all(|w| {
                versions(w, "snapshot installed")
                    .iter()
                    .filter(|v| v.1)
                    .count()
                    >= 3
            });
            (enough && spot_checks(&learner, "pass") >= 4).then_some(())
        },
    );
    let status = learner.status().expect("the learner answers");
    // The workers' installs first: every version they installed was published before.
    let installs: Vec<Vec<(u64, bool, String)>> = workers
        .iter()
        .map(|w| versions(w, "snapshot installed"))
        .collect();
    let published: HashMap<u64, (bool, String)> = versions(&learner, "snapshot published")
        .into_iter()
        .map(|(v, a, r)| (v, (a, r)))
        .collect();
    // Version 0 is the base, whole; every later version is adapters.
    assert_eq!(published.get(&0).map(|p| p.0), Some(false), "{published:?}");
    assert!(
        published.iter().all(|(v, p)| *v == 0 || p.0),
        "{published:?}"
    );
    for (w, installed) in workers.iter_mut().zip(&installs) {
        w.status().expect("the worker answers");
        assert_eq!(
            installed.first().map(|i| (i.0, i.1)),
            Some((0, false)),
            "{}: {installed:?}",
            w.name
        );
        assert!(
            installed.windows(2).all(|p| p[0].0 < p[1].0),
            "{}: installed versions must increase: {installed:?}",
            w.name
        );
        for (v, adapter, root) in installed.iter().filter(|i| i.1) {
            let (was_adapter, sent) = &published[v];
            assert!(*adapter && *was_adapter);
            assert_eq!(
                root, sent,
                "{}: v{v} is not the bytes the learner published",
                w.name
            );
        }
        assert_eq!(counter(w, "node_adapter_versions_refused_total"), 0);
    }
    // The learner recomputed the workers' log-probs on its base + each version's adapters.
    for r in ["mismatch", "not_drawn"] {
        assert_eq!(spot_checks(&learner, r), 0, "honest groups failed as {r}");
    }
    for w in &workers {
        let p = peer(&status, &w.key.peer_id).expect("the worker is a peer");
        assert_eq!(p["strikes"].as_u64(), Some(0), "{p}");
    }
    for w in &mut workers {
        w.kill();
    }
    learner.kill();
}

#[test]
fn a_worker_with_another_base_refuses_adapters_naming_both_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    // No warm start: the base is the configured embedded model (seed 0), not published.
    let learner_cfg =
        format!("[learner]\nwarm_start_steps = 0\nmax_steps = 1\ngroup_size = 4\n{LORA}");
    let (mut learner, mut workers) =
        Node::learner_and_workers(tmp.path(), "it-lora-base", &learner_cfg, 1, WORKER);
    let mut other = Node::start_worker_of(
        tmp.path(),
        "other",
        "it-lora-base",
        &learner,
        &format!("{WORKER}[model]\nseed = 1\n"),
    );
    let line = wait_for(
        "the other-base worker to refuse an adapter version",
        LIMIT,
        || {
            let _ = learner.status()?;
            let _ = other.status()?;
            logged(&other, "snapshot not installed")
                .into_iter()
                .find_map(|f| f.get("_line").cloned())
        },
    );
    wait_for(
        "the same-base worker to install an adapter version",
        LIMIT,
        || {
            versions(&workers[0], "snapshot installed")
                .iter()
                .any(|v| v.1)
                .then_some(())
        },
    );
    let theirs = logged(&learner, "publishing adapter versions on this base")
        .first()
        .and_then(|f| f.get("base").cloned())
        .expect("the learner names its base");
    let mine = logged(&other, "identity of the configured model")
        .first()
        .and_then(|f| f.get("base").cloned())
        .expect("the worker names its configured model's identity");
    assert_ne!(theirs, mine);
    assert!(line.contains(&theirs) && line.contains(&mine), "{line}");
    assert!(counter(&other, "node_adapter_versions_refused_total") >= 1);
    assert_eq!(
        other.status().unwrap()["version"],
        serde_json::Value::Null,
        "nothing installed"
    );
    // Nobody is struck for it: the bytes were the learner's, verified on every hop.
    let status = learner.status().unwrap();
    for id in [&workers[0].key.peer_id, &other.key.peer_id] {
        let p = peer(&status, id).expect("a peer");
        assert_eq!(p["strikes"].as_u64(), Some(0), "{p}");
    }
    other.kill();
    workers[0].kill();
    learner.kill();
}

/// A worker that joins after the learner pushed the base (version 0) is never pushed the base
/// (the engine pushes the newest version): it fetches it — the manifest from the learner, the
/// chunks from holders — before it installs the adapter version it was sent, and refuses none.
#[test]
fn a_late_worker_fetches_the_published_base_then_installs_adapters() {
    let tmp = tempfile::tempdir().unwrap();
    let learner_cfg = format!(
        "[learner]\nwarm_start_steps = 10\ngroup_size = 4\ngroups_per_step = 2\n{LORA}\
         [broadcast]\ndtype = \"bf16\"\n"
    );
    let (mut learner, mut workers) =
        Node::learner_and_workers(tmp.path(), "it-lora-late", &learner_cfg, 1, WORKER);
    wait_for(
        "the first worker to install two adapter versions",
        LIMIT,
        || {
            let _ = learner.status()?;
            (versions(&workers[0], "snapshot installed")
                .iter()
                .filter(|v| v.1)
                .count()
                >= 2)
                .then_some(())
        },
    );
    let mut late = Node::start_worker_of(tmp.path(), "late", "it-lora-late", &learner, WORKER);
    wait_for(
        "the late worker to install an adapter version",
        LIMIT,
        || {
            let _ = late.status()?;
            versions(&late, "snapshot installed")
                .iter()
                .any(|v| v.1)
                .then_some(())
        },
    );
    let fetched = logged(&late, "fetched the adapters' base");
    assert_eq!(
        fetched.first().and_then(|f| f.get("base").cloned()),
        Some("0".to_string()),
        "the base version 0 was fetched: {fetched:?}"
    );
    assert_eq!(counter(&late, "node_adapter_versions_refused_total"), 0);
    let published: HashMap<u64, String> = versions(&learner, "snapshot published")
        .into_iter()
        .map(|(v, _, r)| (v, r))
        .collect();
    for (v, _, root) in versions(&late, "snapshot installed").iter().filter(|i| i.1) {
        assert_eq!(
            Some(root),
            published.get(v),
            "v{v}: not the learner's bytes"
        );
    }
    late.kill();
    workers[0].kill();
    learner.kill();
}
