//! The broadcast benchmark roles across real processes (`testnet broadcast`'s path): a learner
//! publishing synthetic bf16 versions as deltas (`--bench-delta-changed-pct`) and two sink
//! workers that reconstruct each delta against the payload they hold before they report the
//! install. A sink that failed to reconstruct would never report the version, so every round
//! completing is the check that the deltas travelled the chains and applied.

use std::time::Duration;

use echo_node::api::NodeStatus;

use crate::swarm::{wait_for, Node};

#[test]
fn bench_delta_rounds_are_a_keyframe_then_small_deltas_every_sink_reconstructs() {
    let tmp = tempfile::tempdir().unwrap();
    let key = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        crate::swarm::keygen(&dir)
    };
    let learner_key = key("learner");
    let mut learner = Node::configure(
        tmp.path(),
        "learner",
        "learner",
        "it-bench",
        None,
        "",
        "",
        learner_key,
    );
    learner.run_args = [
        "--bench-broadcast-mb",
        "4",
        "--bench-workers",
        "2",
        "--bench-rounds",
        "3",
        "--bench-delta-changed-pct",
        "1",
    ]
    .map(String::from)
    .to_vec();
    learner.spawn();
    learner.wait_ready();
    let boot = format!("bootstrap = [\"{}\"]", learner.addr());
    let lpk = learner.key.public_key.clone();
    let mut sinks: Vec<Node> = (0..2)
        .map(|i| {
            let name = format!("w{i}");
            let mut w = Node::configure(
                tmp.path(),
                &name,
                "rollout",
                "it-bench",
                Some(&lpk),
                &boot,
                "",
                key(&name),
            );
            w.run_args = vec!["--bench-sink".into()];
            w.spawn();
            w
        })
        .collect();
    let bench = wait_for(
        "the benchmark's three rounds",
        Duration::from_secs(240),
        || {
            let st: NodeStatus = serde_json::from_value(learner.status()?).ok()?;
            st.bench.filter(|b| b.done)
        },
    );
    for s in &mut sinks {
        s.kill();
    }
    learner.kill();

    let rounds = &bench.rounds;
    assert_eq!(rounds.len(), 3, "{rounds:?}");
    assert!(!rounds[0].delta, "the first version is the keyframe");
    assert_eq!(rounds[0].bytes, rounds[0].full_bytes);
    for r in &rounds[1..] {
        assert!(r.delta, "round {} went out whole", r.round);
        assert!(
            r.bytes * 10 < r.full_bytes,
            "a 1 % delta is {} of {} bytes",
            r.bytes,
            r.full_bytes
        );
        let frac = r
            .changed_frac
            .expect("a synthetic version says what changed");
        assert!((0.005..0.02).contains(&frac), "changed {frac}");
    }
    assert!(
        rounds.iter().all(|r| r.t_bcast_all_s.is_some()),
        "every sink reported every version: {rounds:?}"
    );
}
