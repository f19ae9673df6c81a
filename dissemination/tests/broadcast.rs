//! In-process swarms on 127.0.0.1 (temp dirs, bounded waits): chain dissemination of a 16 MB
//! random payload to 7 workers, delta republication, a corrupting forwarder, forged and replayed
//! manifests / plans, a forwarder killed mid-snapshot; churn, hostile streams and push sessions
//! in the submodules.

use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "adversary")]
use dissemination::Fault;
use dissemination::{
    BroadcastCounters, DisseminationConfig, DisseminationEvent, Disseminator, PlanMessage,
    SignedPlan,
};
use ed25519_dalek::SigningKey;
use p2p::{Client, PeerId, ScoreComponents, ServiceConfig, TopicKind, Validation};
use rand::RngCore;
use storage::{hash_bytes, ChunkStore, NodeKey, SnapshotManifest};
use tokio::sync::mpsc::UnboundedReceiver;

mod churn;
mod sessions;
mod streams;

const SWARM: &str = "diss-test";
const LEARNER_SEED: [u8; 32] = [1; 32];
const WAIT: Duration = Duration::from_secs(60);

struct Node {
    client: Client,
    d: Disseminator,
    events: UnboundedReceiver<DisseminationEvent>,
    peer: PeerId,
    addr: String,
    _dir: tempfile::TempDir,
}

fn learner_key() -> NodeKey {
    NodeKey::from_seed(LEARNER_SEED)
}

async fn start_node(
    seed: [u8; 32],
    bootstrap: Vec<String>,
    tweak: impl FnOnce(&mut DisseminationConfig),
) -> Node {
    let role = if seed == LEARNER_SEED {
        p2p::Role::Learner
    } else {
        p2p::Role::Rollout
    };
    let cfg = ServiceConfig::loopback(
        SWARM,
        role,
        bootstrap,
        Some(p2p::peer_id_from_seed(LEARNER_SEED)),
    );
    let (client, p2p_events, _task) = p2p::start(seed, cfg, &mut p2p::Registry::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChunkStore::open(dir.path(), 4).unwrap());
    let mut dcfg = DisseminationConfig::new(SWARM, learner_key().verifying_key());
    dcfg.plan.learner_mbps = 300.0;
    dcfg.plan.worker_mbps = 100.0;
    dcfg.chunk_size = 512 << 10;
    dcfg.stall_timeout = Duration::from_secs(3);
    if seed == LEARNER_SEED {
        dcfg.signing_key = Some(learner_key().signing_key().clone());
    }
    tweak(&mut dcfg);
    let (d, events) = Disseminator::start(dcfg, client.clone(), store).unwrap();
    tokio::spawn(dissemination::drive(d.clone(), client.clone(), p2p_events));
    let deadline = Instant::now() + WAIT;
    let addr = loop {
        if let Some(a) = client.listen_addrs().await.unwrap().into_iter().next() {
            break a;
        }
        assert!(Instant::now() < deadline, "node did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let peer = client.local_peer_id();
    Node {
        addr: format!("{addr}/p2p/{peer}"),
        client,
        d,
        events,
        peer,
        _dir: dir,
    }
}

/// A learner and `n` workers; worker `k` bootstraps to the learner and every earlier worker.
/// Returns once the learner sees every worker as an active rollout peer.
async fn swarm(
    n: u8,
    tweak_learner: impl FnOnce(&mut DisseminationConfig),
    tweak_worker: impl Fn(u8, &mut DisseminationConfig),
) -> (Node, Vec<Node>) {
    let learner = start_node(LEARNER_SEED, vec![], tweak_learner).await;
    let mut boot = vec![learner.addr.clone()];
    let mut workers = Vec::new();
    for k in 0..n {
        let w = start_node([10 + k; 32], boot.clone(), |c| tweak_worker(k, c)).await;
        boot.push(w.addr.clone());
        workers.push(w);
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let st = learner.client.status().await.unwrap();
        let active = st
            .peers
            .iter()
            .filter(|p| p.active && p.role == Some(p2p::Role::Rollout))
            .count();
        if active == n as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "learner sees {active} of {n} workers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (learner, workers)
}

/// A learner and `n` workers planned as one chain (B0 = B̂w: a single first hop); worker `k`
/// gets `tweak_worker(k, …)`.
async fn one_chain(
    n: u8,
    tweak_worker: impl Fn(u8, &mut DisseminationConfig),
) -> (Node, Vec<Node>) {
    swarm(n, |c| c.plan.learner_mbps = 100.0, tweak_worker).await
}

/// Scores that rank `workers` in their order, the first best: a plan chains them that way.
fn ranked(workers: &[Node]) -> Vec<(PeerId, f64)> {
    workers
        .iter()
        .enumerate()
        .map(|(i, w)| (w.peer, 90.0 - i as f64))
        .collect()
}

/// Waits for `node` to install `version`; returns the installed bytes.
async fn installed(node: &mut Node, version: u64) -> Arc<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, node.events.recv()).await {
            Ok(Some(DisseminationEvent::Installed {
                version: v,
                payload,
                ..
            })) if v >= version => {
                assert_eq!(v, version, "installed an unexpected version");
                return payload;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("event channel closed"),
            Err(_) => panic!("{} did not install v{version} in time", node.peer),
        }
    }
}

/// `read` of `node`'s counters once it reaches `want`, or its value after [`WAIT`]. A chunk
/// pushed last is counted once the stream's end frame is read, which can come a moment after
/// the install event.
async fn counted(node: &Node, read: impl Fn(&BroadcastCounters) -> u64, want: u64) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = read(&node.d.counters());
        if v >= want || Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn random(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

async fn shutdown(nodes: impl IntoIterator<Item = Node>) {
    for n in nodes {
        n.d.shutdown();
        n.client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chain_mode_16mb_to_7_workers_then_delta_republish() {
    let (learner, mut workers) = swarm(7, |_| {}, |_, _| {}).await;
    let payload = random(16_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    // B0 = 300, B̂w = 100 → 3 chains holding all 7 workers (lengths 3, 2, 2).
    let chains = &report.plan.plan.chains;
    assert_eq!(chains.len(), 3);
    let mut lens: Vec<usize> = chains.iter().map(Vec::len).collect();
    lens.sort();
    assert_eq!(lens, [2, 2, 3]);
    assert!(report.plan.plan.fetch_only.is_empty());
    let root = hash_bytes(&payload);
    for w in &mut workers {
        let got = installed(w, 1).await;
        assert_eq!(hash_bytes(&got), root);
    }
    // The learner sent the snapshot once per chain, not once per worker.
    let n_chunks = report.manifest.manifest.chunk_hashes.len() as u64;
    assert_eq!(n_chunks, 31);
    assert_eq!(learner.d.counters().pushed_bytes, 3 * payload.len() as u64);

    // Republish with 3 of 31 chunks changed (≈ 90 % identical): only those travel.
    let before_l = learner.d.counters();
    let before: Vec<_> = workers.iter().map(|w| w.d.counters()).collect();
    let mut v2 = payload.clone();
    let m = &report.manifest.manifest;
    let mut changed = 0u64;
    for i in [0usize, 10, 20] {
        let r = m.chunk_range(i).unwrap();
        changed += r.len() as u64;
        v2[r.start] ^= 0x55;
    }
    let report2 = learner
        .d
        .publish(2, [0; 32], v2.clone().into(), None)
        .await
        .unwrap();
    assert_eq!(report2.stats.new_chunks, 3);
    assert_eq!(report2.stats.reused_chunks, 28);
    for w in &mut workers {
        let got = installed(w, 2).await;
        assert_eq!(hash_bytes(&got), hash_bytes(&v2));
    }
    let after_l = learner.d.counters();
    assert_eq!(after_l.pushed_bytes - before_l.pushed_bytes, 3 * changed);
    for (w, b) in workers.iter().zip(&before) {
        let a = w.d.counters();
        // Under load a slow push can race a repair fetch for the same chunk (or a v1 push
        // still streaming what the worker completed by fetching): those copies are counted as
        // duplicates. Apart from them, only the changed chunks travelled.
        let received =
            (a.push_received_bytes - b.push_received_bytes) + (a.fetched_bytes - b.fetched_bytes);
        let duplicate = a.duplicate_bytes - b.duplicate_bytes;
        assert_eq!(
            received - duplicate,
            changed,
            "worker {} received only the changed chunks ({duplicate} duplicate bytes)",
            w.peer
        );
        assert_eq!(a.chunks_stored - b.chunks_stored, 3, "worker {}", w.peer);
        assert!(a.pushed_bytes - b.pushed_bytes <= changed);
    }
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// Needs the test-only `Fault` (the `adversary` feature: on in `cargo test --workspace`,
/// where `testnet` enables it, or with `--features adversary`).
#[cfg(feature = "adversary")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupting_forwarder_is_bypassed_and_penalised() {
    // One chain (B0 = B̂w): bad → w1 → w2; the bad worker corrupts everything it sends.
    let (learner, mut workers) = one_chain(3, |k, c: &mut DisseminationConfig| {
        if k == 0 {
            c.fault = Some(Fault::CorruptOutgoing);
        }
    })
    .await;
    let bad = workers[0].peer;
    let order = ranked(&workers);
    // Before: no transfer yet (heartbeats are not successes), so the peer is neutral.
    let deadline = Instant::now() + WAIT;
    let score_before = loop {
        if let Some(c) = score_of(&workers[1].client, bad).await.0 {
            assert_eq!(c.failures, 0);
            break c.score;
        }
        assert!(Instant::now() < deadline, "w1 did not hear the bad peer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let payload = random(4_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    assert_eq!(
        report.plan.plan.chains,
        vec![vec![bad, workers[1].peer, workers[2].peer]]
    );
    let root = hash_bytes(&payload);
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), root);
    }
    // w1 rejected the bad peer's chunks and charged it; w2 never got anything corrupt from w1.
    assert!(workers[1].d.counters().chunks_rejected >= 1);
    while let Ok(ev) = workers[2].events.try_recv() {
        if let DisseminationEvent::ChunkRejected { peer, .. } = ev {
            assert_ne!(peer, workers[1].peer, "w1 forwarded a corrupt chunk");
        }
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let c = score_of(&workers[1].client, bad)
            .await
            .0
            .expect("known peer");
        if c.failures >= 1 && c.success < 100.0 && c.score < score_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bad peer's score did not fall ({c:?} vs {score_before})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// A parent that pushes every chunk three times: its child refuses the second copy (the
/// parent's protocol error: charged to it, the stream dropped), repairs the rest, and its
/// receipt counts only the first copies — never more than it wanted — with the duplicates
/// noted (the heartbeat side: `p2p::messages`' `a_receipt_never_makes_its_heartbeat_invalid`).
#[cfg(feature = "adversary")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_overfeeding_parent_is_charged_and_its_childs_receipt_stays_in_range() {
    // One chain: bad → w1 → w2.
    let (learner, mut workers) = one_chain(3, |k, c: &mut DisseminationConfig| {
        if k == 0 {
            c.fault = Some(Fault::Overfeed);
        }
    })
    .await;
    let bad = workers[0].peer;
    let order = ranked(&workers);
    let payload = random(4_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    assert_eq!(report.plan.plan.chains[0][..2], [bad, workers[1].peer]);
    let root = hash_bytes(&payload);
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), root);
    }
    // w1's receipt of v1 names bad: the first copies only, the duplicates noted.
    let w1 = &workers[1];
    let receipt = testkit::wait_for_async("w1's receipt for v1", WAIT, || async move {
        w1.d.receipts().into_iter().find(|r| r.version == 1)
    })
    .await;
    assert_eq!(receipt.parent, bad.to_string());
    assert!(receipt.duplicates > 0, "{receipt:?}");
    assert!(receipt.bytes <= receipt.wanted, "{receipt:?}");
    // w1 charged bad a failed transfer for it.
    testkit::wait_for_async("bad charged a failed transfer by w1", WAIT, || async move {
        let c = score_of(&w1.client, bad).await.0.expect("known peer");
        (c.failures >= 1).then_some(())
    })
    .await;
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// `(score, connected)` of `peer` as `client` sees it.
async fn score_of(client: &Client, peer: PeerId) -> (Option<ScoreComponents>, bool) {
    let st = client.status().await.unwrap();
    st.peers
        .iter()
        .find(|p| p.peer_id == peer.to_string())
        .map_or((None, false), |p| (Some(p.score), p.connected))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_and_replayed_manifests_and_plans() {
    let (learner, mut workers) = swarm(1, |_| {}, |_, _| {}).await;
    let w = &mut workers[0];
    let rogue = SigningKey::from_bytes(&[99; 32]);
    let real = learner_key();
    let payload = random(100_000);
    let manifest = |v: u64, key: &SigningKey| {
        SnapshotManifest::build(SWARM, v, [0; 32], &payload, 16 << 10, &key.verifying_key())
            .unwrap()
            .sign(key)
            .unwrap()
    };
    let plan = |v: u64, seq: u64, key: &SigningKey| {
        PlanMessage {
            swarm_id: SWARM.into(),
            version: v,
            seq,
            created_unix_ms: 0,
            learner_key: key.verifying_key().to_bytes(),
            chains: vec![],
            fetch_only: vec![w.peer],
        }
        .sign(key)
        .unwrap()
    };
    let on = |d: &Disseminator, t: TopicKind, b: Vec<u8>| d.on_gossip(t, &b);
    // Signed by another key: rejected.
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, manifest(5, &rogue).encode()),
        Validation::Reject
    );
    assert_eq!(
        on(&w.d, TopicKind::Plans, plan(5, 0, &rogue).encode()),
        Validation::Reject
    );
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, b"garbage".to_vec()),
        Validation::Reject
    );
    let mut forged = plan(3, 0, real.signing_key());
    forged.plan.seq = 7;
    assert_eq!(
        on(&w.d, TopicKind::Plans, forged.encode()),
        Validation::Reject
    );
    // Real and moving forward: accepted; a duplicate is still valid; older is ignored.
    assert_eq!(
        on(
            &w.d,
            TopicKind::Snapshots,
            manifest(3, real.signing_key()).encode()
        ),
        Validation::Accept
    );
    assert_eq!(
        on(
            &w.d,
            TopicKind::Plans,
            plan(3, 1, real.signing_key()).encode()
        ),
        Validation::Accept
    );
    assert_eq!(
        on(
            &w.d,
            TopicKind::Plans,
            plan(3, 1, real.signing_key()).encode()
        ),
        Validation::Accept
    );
    assert_eq!(
        on(
            &w.d,
            TopicKind::Snapshots,
            manifest(2, real.signing_key()).encode()
        ),
        Validation::Ignore
    );
    assert_eq!(
        on(
            &w.d,
            TopicKind::Plans,
            plan(3, 0, real.signing_key()).encode()
        ),
        Validation::Ignore
    );
    assert_eq!(
        on(
            &w.d,
            TopicKind::Plans,
            plan(2, 9, real.signing_key()).encode()
        ),
        Validation::Ignore
    );
    assert_eq!(
        SignedPlan::decode(&plan(3, 2, real.signing_key()).encode())
            .unwrap()
            .plan
            .seq,
        2
    );

    // Over the network: a rogue "learner" pushing a snapshot signed with its own key is
    // refused and charged; the real learner's next version installs.
    let rogue_node = start_node([77; 32], vec![w.addr.clone()], |c| {
        c.learner_key = rogue.verifying_key();
        c.signing_key = Some(rogue.clone());
    })
    .await;
    let deadline = Instant::now() + WAIT;
    while !score_of(&rogue_node.client, w.peer).await.1 {
        assert!(Instant::now() < deadline, "the rogue node did not connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rogue_node
        .d
        .publish(
            50,
            [0; 32],
            payload.clone().into(),
            Some(vec![(w.peer, 90.0)]),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while score_of(&w.client, rogue_node.peer)
        .await
        .0
        .is_none_or(|c| c.failures == 0)
    {
        assert!(Instant::now() < deadline, "the rogue push was not charged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    learner
        .d
        .publish(
            4,
            [0; 32],
            payload.clone().into(),
            Some(vec![(w.peer, 90.0)]),
        )
        .await
        .unwrap();
    assert_eq!(hash_bytes(&installed(w, 4).await), hash_bytes(&payload));
    assert_eq!(w.d.installed_version(), Some(4));
    shutdown([rogue_node]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarder_killed_mid_snapshot_does_not_stop_the_chain() {
    // One chain of 5, downlinks capped at 100 Mbit/s so the snapshot takes a while.
    let (learner, mut workers) = one_chain(5, |_, c| {
        c.downlink_mbps = 100.0;
        c.stall_timeout = Duration::from_secs(1);
    })
    .await;
    let order = ranked(&workers);
    let payload = random(8_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    assert_eq!(report.plan.plan.chains[0].len(), 5);
    let total = report.manifest.manifest.chunk_hashes.len();
    // Kill worker 1 (second in the chain) once it holds a few chunks.
    let mut victim = workers.remove(1);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, victim.events.recv()).await {
            Ok(Some(DisseminationEvent::Progress { stored, .. })) if stored >= 3 => {
                assert!(
                    stored < total,
                    "the victim finished before it could be killed"
                );
                break;
            }
            Ok(Some(_)) => {}
            _ => panic!("victim made no progress"),
        }
    }
    shutdown([victim]).await;
    let started = Instant::now();
    let root = hash_bytes(&payload);
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), root);
    }
    // Bounded: well within the waits (each `installed` is bounded by WAIT too).
    assert!(started.elapsed() < WAIT);
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// A worker the learner does not admit (`Disseminator::set_no_forward`) is never a parent: the
/// plan seats it as a chain's tail (or fetch-only), and it still installs every version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_not_admitted_never_forwards() {
    let (learner, mut workers) = one_chain(3, |_, _| {}).await;
    // Ranked first: it heads the one chain unless it may not forward.
    let stranger = workers[0].peer;
    for (version, no_forward) in [(1, false), (2, true)] {
        if no_forward {
            learner.d.set_no_forward([stranger].into_iter().collect());
        }
        let payload = random(1_000_000);
        let report = learner
            .d
            .publish(
                version,
                [0; 32],
                payload.clone().into(),
                Some(ranked(&workers)),
            )
            .await
            .unwrap();
        let plan = &report.plan.plan;
        let parent = plan.chains.iter().any(|c| {
            c.iter()
                .position(|p| *p == stranger)
                .is_some_and(|i| i + 1 < c.len())
        });
        assert_eq!(parent, !no_forward, "v{version}: {plan:?}");
        if no_forward {
            assert!(
                plan.chains
                    .iter()
                    .flatten()
                    .chain(&plan.fetch_only)
                    .any(|p| *p == stranger),
                "v{version}: the stranger is still served: {plan:?}"
            );
        }
        for w in &mut workers {
            assert_eq!(
                hash_bytes(&installed(w, version).await),
                hash_bytes(&payload)
            );
        }
    }
    shutdown(workers).await;
    shutdown([learner]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn star_mode_and_a_fetch_only_worker() {
    // Star: the learner pushes to every worker itself (the baseline).
    let (learner, mut workers) = swarm(
        3,
        |c| c.mode = dissemination::BroadcastMode::Star,
        |_, _| {},
    )
    .await;
    let payload = random(2_000_000);
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    assert_eq!(report.plan.plan.chains.len(), 3);
    assert!(report.plan.plan.chains.iter().all(|c| c.len() == 1));
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
    }
    assert_eq!(learner.d.counters().pushed_bytes, 3 * payload.len() as u64);
    shutdown(workers).await;
    shutdown([learner]).await;

    // Chain mode with one worker scored out of forwarding: it fetches by hash instead.
    let (learner, mut workers) = swarm(3, |_| {}, |_, _| {}).await;
    let order = vec![
        (workers[0].peer, 90.0),
        (workers[1].peer, 80.0),
        (workers[2].peer, 5.0),
    ];
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    assert_eq!(report.plan.plan.fetch_only, vec![workers[2].peer]);
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
    }
    let c = workers[2].d.counters();
    assert_eq!(
        (c.fetched_bytes, c.push_received_bytes),
        (payload.len() as u64, 0)
    );
    shutdown(workers).await;
    shutdown([learner]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_joiner_catches_up_by_fetching() {
    let (learner, mut workers) = swarm(2, |_| {}, |_, _| {}).await;
    let payload = random(3_000_000);
    learner
        .d
        .publish(1, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
    }
    // Joins after the publication: no gossip or push reaches it; it asks the learner for the
    // newest manifest on connecting and fetches every chunk by hash.
    let mut late = start_node(
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
    assert_eq!(
        (c.fetched_bytes, c.push_received_bytes),
        (payload.len() as u64, 0)
    );
    shutdown([late]).await;
    shutdown(workers).await;
    shutdown([learner]).await;
}
