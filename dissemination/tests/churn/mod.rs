//! Churn in the data plane, in-process on 127.0.0.1 (temp dirs, bounded waits): a worker
//! that joins after a snapshot was broadcast gets its chunks from the other workers, not
//! from the learner; a late joiner whose serving peer leaves mid-download finishes from
//! another holder; a holder that goes silent without closing its connection does not
//! stall a download (chunk-fetch reads have deadlines); and a push to a worker the plan names
//! before the pusher can reach it is tried again until it can.

use std::time::{Duration, Instant};

use dissemination::DisseminationConfig;
use p2p::ServiceConfig;
use storage::hash_bytes;

use super::{
    counted, installed, one_chain, random, ranked, shutdown, start_node, swarm, Node, LEARNER_SEED,
    SWARM, WAIT,
};

/// A stall timeout shorter than the other tests' so that repairs start soon.
fn stall(c: &mut DisseminationConfig) {
    c.stall_timeout = Duration::from_secs(2);
}

/// A node of these tests: [`start_node`] with the short stall timeout, then `tweak`.
async fn node(
    seed: [u8; 32],
    bootstrap: Vec<String>,
    tweak: impl FnOnce(&mut DisseminationConfig),
) -> Node {
    start_node(seed, bootstrap, |c| {
        stall(c);
        tweak(c)
    })
    .await
}

/// A learner, two workers holding v1, and the workers' served bytes before a joiner.
async fn swarm_holding(payload: &[u8]) -> (Node, Vec<Node>) {
    let (learner, mut workers) = swarm(2, stall, |_, c| stall(c)).await;
    learner
        .d
        .publish(1, [0; 32], payload.to_vec().into(), None)
        .await
        .unwrap();
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(payload));
    }
    (learner, workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_joiner_gets_the_snapshot_from_peers_not_the_learner() {
    let payload = random(4_000_000);
    let (learner, workers) = swarm_holding(&payload).await;
    let learner_served = learner.d.counters().served_bytes;
    let workers_served: u64 = workers.iter().map(|w| w.d.counters().served_bytes).sum();

    // Joins after the publication: only the small signed manifest and plan come from the
    // learner (the catch-up request); every chunk comes from a worker.
    let mut late = node(
        [50; 32],
        vec![learner.addr.clone(), workers[0].addr.clone()],
        |_| {},
    )
    .await;
    assert_eq!(
        hash_bytes(&installed(&mut late, 1).await),
        hash_bytes(&payload)
    );
    let c = late.d.counters();
    assert_eq!(c.fetched_bytes, payload.len() as u64);
    assert_eq!(
        learner.d.counters().served_bytes,
        learner_served,
        "the learner served chunks to the late joiner"
    );
    let served: u64 = workers.iter().map(|w| w.d.counters().served_bytes).sum();
    assert_eq!(served - workers_served, payload.len() as u64);
    shutdown([late]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_leaving_mid_download_is_replaced_by_another_holder() {
    let payload = random(8_000_000);
    let (learner, mut workers) = swarm_holding(&payload).await;
    let before: Vec<u64> = workers
        .iter()
        .map(|w| w.d.counters().served_bytes)
        .collect();

    // A slow joiner (20 Mbit/s down: about 3 s for 8 MB) fetching by hash.
    let mut late = node(
        [60; 32],
        vec![learner.addr.clone(), workers[0].addr.clone()],
        |c| c.downlink_mbps = 20.0,
    )
    .await;
    // Whichever worker serves first leaves once it has served part of the snapshot.
    let deadline = Instant::now() + WAIT;
    let victim = loop {
        let serving = workers
            .iter()
            .zip(&before)
            .position(|(w, b)| w.d.counters().served_bytes > *b);
        if let Some(i) = serving {
            break i;
        }
        assert!(Instant::now() < deadline, "no worker started serving");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let v = workers.remove(victim);
    let fetched_at_kill = late.d.counters().fetched_bytes;
    shutdown([v]).await;
    assert!(
        fetched_at_kill < payload.len() as u64,
        "the joiner finished before its provider left"
    );

    // The download resumes from the other holder and completes.
    assert_eq!(
        hash_bytes(&installed(&mut late, 1).await),
        hash_bytes(&payload)
    );
    let survivor = &workers[0];
    let survivor_before = before[1 - victim];
    assert!(
        survivor.d.counters().served_bytes > survivor_before,
        "the remaining worker served nothing"
    );
    assert!(late.d.counters().fetched_bytes >= payload.len() as u64);
    shutdown([late]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// A holder that accepts chunk-fetch streams and then never answers (a frozen process, or a
/// host that vanished without closing its TCP connections) must not stall a download: the
/// fetch gives up at its per-read deadline (`DisseminationConfig::read_timeout`) and asks the
/// next holder; without that deadline the repair round would wait on the silent holder for
/// as long as the connection stays open, and the joiner would never install.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_holder_does_not_stall_a_download() {
    use futures::StreamExt;
    let payload = random(2_000_000);
    let (learner, mut workers) = swarm(2, stall, |_, c| stall(c)).await;
    // The silent holder: a bare p2p node (heartbeats as a rollout worker) that takes every
    // chunk-fetch stream and holds it open without a byte.
    let cfg = ServiceConfig::loopback(
        SWARM,
        p2p::Role::Rollout,
        vec![learner.addr.clone()],
        Some(p2p::peer_id_from_seed(LEARNER_SEED)),
    );
    let (silent, _ev, _task) = p2p::start([70; 32], cfg, &mut p2p::Registry::default()).unwrap();
    let mut incoming = silent
        .stream_control()
        .accept(dissemination::CHUNK_FETCH)
        .unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((_, s)) = incoming.next().await {
            held.push(s);
        }
    });
    // Planned first: the late joiner asks it before the real workers.
    let order = vec![
        (silent.local_peer_id(), 95.0),
        (workers[0].peer, 90.0),
        (workers[1].peer, 80.0),
    ];
    learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
    }
    let mut late = node(
        [71; 32],
        vec![learner.addr.clone(), workers[0].addr.clone()],
        |_| {},
    )
    .await;
    assert_eq!(
        hash_bytes(&installed(&mut late, 1).await),
        hash_bytes(&payload)
    );
    silent.shutdown().await;
    shutdown([late]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// Gossip can carry a plan to a parent before the child it names is reachable from there (its
/// first heartbeat, with its addresses, comes tens of milliseconds later; a new worker is
/// still connecting). The push must try again, not give up and leave the child — and the rest
/// of its chain — to repair the whole snapshot from holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_to_a_child_not_reachable_yet_is_tried_again() {
    let learner = start_node(LEARNER_SEED, vec![], |_| {}).await;
    // The plan names a worker that does not exist yet: the learner's first open fails.
    let seed = [80; 32];
    let child = p2p::peer_id_from_seed(seed);
    let payload = random(2_000_000);
    learner
        .d
        .publish(
            1,
            [0; 32],
            payload.clone().into(),
            Some(vec![(child, 50.0)]),
        )
        .await
        .unwrap();
    // The learner's first open failed (the worker does not exist yet) before it starts: wait
    // for that, or under load the first try could run only after the worker is up.
    assert!(counted(&learner, |c| c.push_open_retries, 1).await >= 1);
    // It starts now. Its stall timeout is far beyond the wait for the install, so it installs
    // only if the learner's push reaches it (a repair would fetch from the learner).
    let mut w = start_node(seed, vec![learner.addr.clone()], |c| {
        c.stall_timeout = Duration::from_secs(3600)
    })
    .await;
    assert_eq!(
        hash_bytes(&installed(&mut w, 1).await),
        hash_bytes(&payload)
    );
    let pushed = counted(&w, |c| c.push_received_bytes, payload.len() as u64).await;
    assert_eq!(
        w.d.counters().fetched_bytes,
        0,
        "the child repaired instead"
    );
    assert_eq!(pushed, payload.len() as u64);
    shutdown([w]).await;
    shutdown([learner]).await;
}

/// A forwarder's uplink carries its chain: while its push to its child still has chunks to
/// send, it answers fetches as if it held nothing, and a joiner's repair gets the snapshot from
/// others (here the learner) instead of slowing that push.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarder_busy_pushing_declines_fetches() {
    // One chain, learner -> w0 -> w1; w1 takes chunks at 0.5 Mbit/s, so w0's push to it lasts
    // about a minute (the test ends long before).
    let (learner, mut workers) = one_chain(2, |k, c| {
        stall(c);
        if k == 1 {
            c.downlink_mbps = 0.5;
        }
    })
    .await;
    let payload = random(4_000_000);
    let order = ranked(&workers);
    learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    let w0 = &mut workers[0];
    assert_eq!(hash_bytes(&installed(w0, 1).await), hash_bytes(&payload));

    // A joiner that knows w0 (connected to it first) repairs everything at once.
    let mut late = node(
        [90; 32],
        vec![workers[0].addr.clone(), learner.addr.clone()],
        |_| {},
    )
    .await;
    assert_eq!(
        hash_bytes(&installed(&mut late, 1).await),
        hash_bytes(&payload)
    );
    assert_eq!(
        workers[1].d.counters().installs,
        0,
        "premise: w0's push to the slow w1 was still going"
    );
    let w0 = workers[0].d.counters();
    assert_eq!(w0.served_bytes, 0, "the busy forwarder served the joiner");
    assert!(w0.fetches_declined > 0, "the joiner never asked w0");
    let fetched = counted(&late, |c| c.fetched_bytes, payload.len() as u64).await;
    assert_eq!(fetched, payload.len() as u64);
    shutdown([late]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}
