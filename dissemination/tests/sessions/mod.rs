//! Push sessions (chunk stream 4.0.0), in-process on 127.0.0.1 (temp dirs, bounded waits): a
//! parent sends later versions on the chunk stream it kept open after a confirmed push, and a
//! kept stream the child closed meanwhile is replaced by a fresh one without charging the
//! child.

use std::time::{Duration, Instant};

use dissemination::Disseminator;
use p2p::{Client, PeerId, ScoreComponents};

use super::{installed, random, score_of, shutdown, swarm, Node, WAIT};

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
