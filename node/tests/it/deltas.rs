//! bf16 delta snapshots across real processes (`docs/broadcast.md`, "Delta snapshots"): a
//! learner with `[broadcast] dtype = "bf16"` (deltas on by default) and three workers on
//! chains. The learner logs the BLAKE3 of each version's full bf16 payload; every worker logs
//! the BLAKE3 of the payload it loaded, reconstructed from deltas. They must be equal for
//! every version a worker installed, and every worker must have installed deltas.

use std::collections::HashMap;
use std::time::Duration;

use crate::swarm::{log_lines, wait_for, Node};

/// `(version, delta, root)` of each log line with `message`, ANSI colours stripped.
fn logged(node: &Node, message: &str) -> Vec<(u64, bool, String)> {
    let mut out = Vec::new();
    for plain in log_lines(node, message) {
        let field = |k: &str| {
            plain
                .split_whitespace()
                .find_map(|t| t.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
        };
        if let (Some(v), Some(d), Some(r)) = (field("version"), field("delta"), field("root")) {
            if let Ok(v) = v.parse() {
                out.push((v, d == "true", r));
            }
        }
    }
    out
}

#[test]
fn workers_install_bf16_deltas_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut learner, mut workers) = Node::learner_and_workers(
        tmp.path(),
        "it-delta",
        // A post-training learning rate: at the demo's 1e-3 nearly every value changes.
        "[learner]\nlr = 1e-5\n[broadcast]\ndtype = \"bf16\"\nkeyframe_every = 4\n",
        3,
        "",
    );
    let limit = Duration::from_secs(300);
    wait_for(
        "every worker to install at least two delta versions",
        limit,
        || {
            let _ = learner.status()?;
            workers
                .iter()
                .all(|w| {
                    logged(w, "snapshot installed")
                        .iter()
                        .filter(|l| l.1)
                        .count()
                        >= 2
                })
                .then_some(())
        },
    );
    let published: HashMap<u64, (bool, String)> = logged(&learner, "snapshot published")
        .into_iter()
        .map(|(v, d, r)| (v, (d, r)))
        .collect();
    for w in &mut workers {
        w.kill();
    }
    learner.kill();

    assert!(
        published.values().any(|(d, _)| *d),
        "the learner published deltas"
    );
    assert!(published.values().any(|(d, _)| !*d), "and keyframes");
    for w in &workers {
        let installs = logged(w, "snapshot installed");
        assert!(
            installs.iter().filter(|l| l.1).count() >= 2,
            "{} installed deltas",
            w.name
        );
        for (v, delta, root) in installs {
            let (pub_delta, pub_root) = published
                .get(&v)
                .unwrap_or_else(|| panic!("{} installed v{v}, never published", w.name));
            assert_eq!(delta, *pub_delta, "{} v{v}: kind", w.name);
            assert_eq!(
                &root, pub_root,
                "{} v{v}: the loaded weights differ",
                w.name
            );
        }
        let refused = std::fs::read_to_string(&w.log)
            .unwrap_or_default()
            .matches("snapshot not installed")
            .count();
        println!("{}: {refused} versions refused (missing base)", w.name);
    }
}
