//! Churn in the data plane, in-process on 127.0.0.1 (temp dirs, bounded waits): a worker
//! that joins after a snapshot was broadcast gets its chunks from the other workers, not
//! from the learner; a late joiner whose serving peer leaves mid-download finishes from
//! another holder; and a holder that goes silent without closing its connection does not
//! stall a download (chunk-fetch reads have deadlines).

use std::time::{Duration, Instant};

use dissemination::DisseminationConfig;
use p2p::ServiceConfig;
use storage::hash_bytes;

use super::{installed, random, shutdown, start_node, swarm, Node, LEARNER_SEED, SWARM, WAIT};

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
