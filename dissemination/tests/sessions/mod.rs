//! Push sessions (chunk stream 4.0.0), in-process on 127.0.0.1 (temp dirs, bounded waits): a
//! parent sends later versions on the chunk stream it kept open after a confirmed push, a
//! kept stream the child closed meanwhile is replaced by a fresh one without charging the
//! child, and a plan announced before the first manifest opens every parent's stream ahead of
//! the first chunk.

use std::time::{Duration, Instant};

use dissemination::Disseminator;
use p2p::{Client, LocalStatus, PeerId, ScoreComponents, TopicKind, Validation};

use super::{counted, installed, one_chain, random, ranked, score_of, shutdown, swarm, Node, WAIT};

/// Polls `f` every 20 ms until it yields a value; fails the test with `what` after [`WAIT`].
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: impl std::fmt::Display,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `d` keeps `n` chunk streams open (a push is confirmed just after the child
/// installs, so the parent keeps its stream a moment later).
async fn kept(d: &Disseminator, n: usize) {
    eventually(format!("never kept {n} chunk streams"), || async {
        (d.kept_sessions() == n).then_some(())
    })
    .await
}

/// Publishes `version` (2 MB of fresh bytes) from `learner`; waits for `w` to install exactly
/// those bytes and for the learner to keep its stream to `w`.
async fn push_version(learner: &Node, w: &mut Node, version: u64) {
    let payload = random(2_000_000);
    learner
        .d
        .publish(version, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    assert_eq!(*installed(w, version).await, payload);
    kept(&learner.d, 1).await;
}

/// Waits until `client` has recorded `successes` transfers of `peer`; returns its score.
async fn successes(client: &Client, peer: PeerId, successes: u64) -> ScoreComponents {
    eventually(
        format!("{peer}: fewer than {successes} transfers"),
        || async {
            score_of(client, peer)
                .await
                .0
                .filter(|c| c.successes >= successes)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn later_versions_go_on_the_kept_chunk_stream() {
    let (learner, mut workers) = swarm(1, |_| {}, |_, _| {}).await;
    let w = &mut workers[0];
    for v in 1..=3u64 {
        push_version(&learner, w, v).await;
    }
    let c = learner.d.counters();
    assert_eq!(
        (c.sessions_reused, c.sessions_stale),
        (2, 0),
        "v2 and v3 went on v1's stream"
    );
    let s = successes(&learner.client, w.peer, 3).await;
    assert_eq!(s.failures, 0, "{s:?}");
    shutdown(workers).await;
    shutdown([learner]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_stream_the_child_closed_is_replaced_without_a_charge() {
    let idle = Duration::from_millis(300);
    let (learner, mut workers) = swarm(1, |_| {}, |_, c| c.session_idle_timeout = idle).await;
    let w = &mut workers[0];
    push_version(&learner, w, 1).await;
    // The child gives up on the next hello after `idle`; the learner (default timeout) still
    // holds the stream as reusable.
    eventually("the child never closed its idle session", || async {
        (w.d.counters().sessions_ended_idle >= 1).then_some(())
    })
    .await;
    push_version(&learner, w, 2).await;
    let c = learner.d.counters();
    assert_eq!(
        (c.sessions_reused, c.sessions_stale),
        (0, 1),
        "the closed stream was found stale and replaced"
    );
    let s = successes(&learner.client, w.peer, 2).await;
    assert_eq!(
        s.failures, 0,
        "the child was charged for closing an idle stream: {s:?}"
    );
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// The first version of a run, with its plan announced first (`announce_plan`): before any
/// manifest exists the learner holds an open chunk stream to the first hop and the first hop
/// one to its child (`sessions_warmed`), the chain tail none; the version then goes out on
/// those streams (each counted as reused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_announced_plan_opens_every_parents_stream_before_the_first_manifest() {
    let (learner, mut workers) = one_chain(3, |_, _| {}).await;
    let plan = learner
        .d
        .announce_plan(1, Some(ranked(&workers)))
        .await
        .unwrap()
        .expect("nothing published yet: announced");
    let chain: Vec<PeerId> = workers.iter().map(|w| w.peer).collect();
    assert_eq!(plan.plan.chains, vec![chain]);
    // Gossip reaches the workers once the mesh has formed; handed over directly as well, so
    // that the test does not wait on the mesh (an accepted plan is accepted again).
    for w in &workers {
        assert_eq!(
            w.d.on_gossip(TopicKind::Plans, &plan.encode()),
            Validation::Accept
        );
    }
    for (what, node) in [
        ("the learner", &learner),
        ("the first hop", &workers[0]),
        ("the second hop", &workers[1]),
    ] {
        eventually(format!("{what} never warmed its chunk stream"), || async {
            (node.d.counters().sessions_warmed == 1 && node.d.kept_sessions() == 1).then_some(())
        })
        .await;
    }
    let tail = workers[2].d.counters();
    assert_eq!(
        (tail.sessions_warmed, workers[2].d.kept_sessions()),
        (0, 0),
        "the tail has no child"
    );
    // Each warm stream carried the filler that grows its window, and the children read it.
    let warm_up = dissemination::DEFAULT_WARM_UP_BYTES;
    for (what, node) in [
        ("the learner", &learner),
        ("the first hop", &workers[0]),
        ("the second hop", &workers[1]),
    ] {
        assert_eq!(node.d.counters().warm_up_bytes, warm_up, "{what}");
    }
    assert_eq!(tail.warm_up_bytes, 0);
    let payload = random(2_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(ranked(&workers)))
        .await
        .unwrap();
    assert_eq!(report.plan, plan, "the announced plan is the one published");
    for w in workers.iter_mut() {
        assert_eq!(*installed(w, 1).await, payload);
    }
    for (what, node) in [
        ("the learner", &learner),
        ("the first hop", &workers[0]),
        ("the second hop", &workers[1]),
    ] {
        assert_eq!(
            counted(node, |c| c.sessions_reused, 1).await,
            1,
            "{what} pushed on a new stream, not the warmed one"
        );
    }
    // Once a version is out, no plan is announced for it, nor for the next one while it is
    // in flight (no worker has reported it installed: the new plan would take the children
    // of its pushes away) ...
    assert!(learner.d.announce_plan(1, None).await.unwrap().is_none());
    assert!(
        learner.d.announce_plan(2, None).await.unwrap().is_none(),
        "announced while version 1 was in flight"
    );
    assert_eq!(learner.d.counters().plans_announced, 1);
    // ... and once every active worker reports it (the heartbeat goes out at once), it is.
    report_installed(&workers, 1).await;
    let next = eventually("the next version's plan was never announced", || async {
        learner.d.announce_plan(2, None).await.unwrap()
    })
    .await;
    assert_eq!((next.plan.version, next.plan.seq), (2, 0));
    assert_eq!(learner.d.counters().plans_announced, 2);
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// Each worker's heartbeat reports `version` installed (sent at once).
async fn report_installed(workers: &[Node], version: u64) {
    for w in workers {
        let status = LocalStatus {
            installed_version: Some(version),
            ..LocalStatus::default()
        };
        w.client.set_local_status(status).await.unwrap();
    }
}

/// The learner's standing-plan rule between versions (`announce_if_due`): the first version
/// of a plan epoch re-draws the seats, so its plan has new pairs and goes out ahead of it —
/// not while the version before is in flight, once only, and the publication keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_epochs_first_plan_is_announced_once_the_version_before_is_out() {
    let (learner, mut workers) = swarm(
        3,
        |c| {
            c.plan.learner_mbps = 100.0;
            c.plan.epoch_versions = 2;
        },
        |_, _| {},
    )
    .await;
    let due = || async {
        let peers = learner.client.peers().await.unwrap();
        learner.d.announce_if_due(&peers).await.unwrap()
    };
    // Before anything is published there is no next version to announce.
    assert!(due().await.is_none());
    let payload = random(2_000_000);
    learner
        .d
        .publish(1, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    for w in workers.iter_mut() {
        assert_eq!(*installed(w, 1).await, payload);
    }
    // Version 2 starts epoch 1, but version 1 is in flight (no install reported yet).
    assert!(
        due().await.is_none(),
        "announced while version 1 was in flight"
    );
    report_installed(&workers, 1).await;
    let plan = eventually("the epoch's first plan was never announced", due).await;
    assert_eq!(plan.plan.version, 2);
    assert!(due().await.is_none(), "announced twice");
    assert_eq!(learner.d.counters().plans_announced, 1);
    let report = learner
        .d
        .publish(2, [0; 32], random(2_000_000).into(), None)
        .await
        .unwrap();
    assert_eq!(report.plan, plan, "the publication kept the announced plan");
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// A version published while its warm stream still carries filler: the filler stops at the
/// manifest and the push waits for that warm-up and takes its stream, instead of dialing a
/// cold one beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_due_during_the_filler_takes_the_warm_stream() {
    let filler = 32u64 << 20;
    let (learner, mut workers) = swarm(
        1,
        |c| {
            c.plan.learner_mbps = 100.0;
            // 1 Mbit/s: each 64 KiB filler frame takes half a second, so the publication
            // finds one under way (32 MiB of it would take minutes).
            c.uplink_mbps = 1.0;
            c.warm_up_bytes = filler;
        },
        |_, _| {},
    )
    .await;
    let plan = learner
        .d
        .announce_plan(1, Some(ranked(&workers)))
        .await
        .unwrap()
        .expect("nothing published yet: announced");
    eventually("the filler never started", || async {
        (learner.d.counters().warm_up_bytes > 0).then_some(())
    })
    .await;
    let payload = random(100_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(ranked(&workers)))
        .await
        .unwrap();
    assert_eq!(report.plan, plan);
    assert_eq!(*installed(&mut workers[0], 1).await, payload);
    // The push is counted once the child's status is read, a moment after its install.
    let reused = counted(&learner, |c| c.sessions_reused, 1).await;
    let c = learner.d.counters();
    assert_eq!(
        (c.sessions_warmed, reused, c.sessions_stale),
        (1, 1, 0),
        "the push did not take the warm stream: {c:?}"
    );
    assert!(
        c.warm_up_bytes < filler,
        "the filler went on after the manifest: {} B",
        c.warm_up_bytes
    );
    shutdown(workers).await;
    shutdown([learner]).await;
}
