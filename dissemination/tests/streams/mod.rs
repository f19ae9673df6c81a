//! Stream hardening and persisted replay marks, in-process on 127.0.0.1: both ends of a push
//! record the transfer (the learner learns its workers' speeds); a silent parent and an
//! oversized hello and endless warm-up filler are dropped on their deadline / bound and
//! charged; a restarted worker
//! refuses the signed manifests and orders it had moved past.

use std::time::{Duration, Instant};

use dissemination::{wire, ActivationOrder, Disseminator, CHUNK_STREAM};
use futures::{AsyncReadExt, AsyncWriteExt};
use p2p::{ServiceConfig, TopicKind, Validation};
use storage::{hash_bytes, SnapshotManifest};

use super::{
    installed, learner_key, random, score_of, shutdown, start_node, swarm, LEARNER_SEED, SWARM,
    WAIT,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_ends_of_a_push_record_it_so_the_learner_knows_worker_speeds() {
    let (learner, mut workers) = swarm(
        2,
        |c| c.mode = dissemination::BroadcastMode::Star,
        |_, _| {},
    )
    .await;
    let payload = random(2_000_000);
    learner
        .d
        .publish(1, [0; 32], payload.clone().into(), None)
        .await
        .unwrap();
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
    }
    // The learner only sent: without sender-side records its view of every worker's Speed
    // stayed 0. The receivers' view of the learner is measured as before.
    for w in &workers {
        let deadline = Instant::now() + WAIT;
        loop {
            let c = score_of(&learner.client, w.peer).await.0.expect("known");
            if c.avg_speed_bps > 0.0 && c.speed > 0.0 {
                assert_eq!(c.failures, 0, "{c:?}");
                break;
            }
            assert!(Instant::now() < deadline, "no speed for {}: {c:?}", w.peer);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let c = score_of(&w.client, learner.peer).await.0.expect("known");
        assert!(c.avg_speed_bps > 0.0, "{c:?}");
    }
    shutdown(workers).await;
    shutdown([learner]).await;
}

/// Waits until worker `w` has dropped the stream `s` (a read on it ends instead of hanging)
/// and has charged `sender` its `failures`-th failed transfer, for `what`.
async fn dropped_and_charged<S: futures::AsyncRead + Unpin>(
    s: &mut S,
    w: &super::Node,
    sender: p2p::PeerId,
    failures: u64,
    what: &str,
) {
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(WAIT, s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("the worker must drop {what}"));
    assert!(matches!(n, Ok(0) | Err(_)), "{what}: {n:?}");
    let deadline = Instant::now() + WAIT;
    loop {
        let charged = score_of(&w.client, sender)
            .await
            .0
            .map_or(0, |c| c.failures);
        if charged >= failures {
            return;
        }
        assert!(Instant::now() < deadline, "{what} was not charged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_parent_an_oversized_hello_and_endless_filler_are_dropped_and_charged() {
    let w = start_node([21; 32], vec![], |c| {
        c.read_timeout = Duration::from_millis(300)
    })
    .await;
    // A raw peer of the swarm: opens chunk streams to the worker by hand.
    let cfg = ServiceConfig::loopback(
        SWARM,
        p2p::Role::Rollout,
        vec![w.addr.clone()],
        Some(p2p::peer_id_from_seed(LEARNER_SEED)),
    );
    let (raw, _events, _task) = p2p::start([22; 32], cfg, &mut p2p::Registry::default()).unwrap();
    let control = raw.stream_control();
    let open = || {
        let mut c = control.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                if let Ok(s) = c.open_stream(w.peer, CHUNK_STREAM).await {
                    return s;
                }
                assert!(Instant::now() < deadline, "no chunk stream to the worker");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let sender = raw.local_peer_id();

    // Silent: the worker gives up on its read deadline and drops the stream (the read below
    // ends instead of hanging), and charges the silent peer.
    let mut s = open().await;
    dropped_and_charged(&mut s, &w, sender, 1, "a silent stream").await;

    // A hello announcing 32 MiB (as a manifest-carrying hello of version 2 could): refused
    // after its length, before anything is allocated or a signature could be checked.
    let mut s = open().await;
    let mut header = Vec::new();
    let mut len = 32u64 << 20;
    while len >= 0x80 {
        header.push(len as u8 | 0x80);
        len >>= 7;
    }
    header.push(len as u8);
    // The worker may refuse (and close) as soon as it has the length: writes may fail.
    let _ = s.write_all(&header).await;
    let _ = s.write_all(&[0; 1024]).await;
    let _ = s.flush().await;
    dropped_and_charged(&mut s, &w, sender, 2, "an oversized hello").await;

    // Filler (the warm-up of a stream before its first hello) past its bound: read and
    // dropped up to `MAX_FILLER_BYTES`, then the stream is dropped and the sender charged.
    let mut s = open().await;
    let frame = wire::filler_frame(wire::MAX_HELLO_BYTES);
    // Twice the bound: the writes must fail (the worker dropped the stream) well before.
    let cap = 2 * wire::MAX_FILLER_BYTES / frame.len() as u64;
    let mut written = 0;
    while written < cap && p2p::framing::write_frame(&mut s, &frame).await.is_ok() {
        written += 1;
    }
    assert!(written < cap, "the worker read {written} frames of filler");
    let _ = s.flush().await;
    dropped_and_charged(&mut s, &w, sender, 3, "endless filler").await;
    assert_eq!(w.d.counters().chunks_stored, 0);
    raw.shutdown().await;
    shutdown([w]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_worker_refuses_what_it_had_moved_past() {
    let keep = tempfile::tempdir().unwrap();
    let path = keep.path().join(storage::replay::REPLAY_FILE_NAME);
    let key = learner_key();
    let manifest = |v: u64, payload: &[u8]| {
        SnapshotManifest::build(SWARM, v, [0; 32], payload, 16 << 10, &key.verifying_key())
            .unwrap()
            .sign(key.signing_key())
            .unwrap()
            .encode()
    };
    let order = |seq: u64| {
        ActivationOrder {
            swarm_id: SWARM.into(),
            seq,
            created_unix_ms: 0,
            learner_key: key.verifying_key().to_bytes(),
            active: vec![],
            standby: vec![],
        }
        .sign(key.signing_key())
        .unwrap()
        .encode()
    };
    let on = |d: &Disseminator, t: TopicKind, b: &[u8]| d.on_gossip(t, b);
    let (p4, p5, p5b, p6) = (
        random(50_000),
        random(50_000),
        random(50_000),
        random(50_000),
    );
    let with_replay = |c: &mut dissemination::DisseminationConfig| {
        c.replay_path = Some(path.clone());
    };

    // A signed manifest carries its creation time: the bytes of "the same" manifest are the
    // ones signed once (what the learner stores and answers catch-ups with).
    let m5 = manifest(5, &p5);
    let w = start_node([31; 32], vec![], with_replay).await;
    assert_eq!(on(&w.d, TopicKind::Snapshots, &m5), Validation::Accept);
    assert_eq!(on(&w.d, TopicKind::Plans, &order(5)), Validation::Accept);
    shutdown([w]).await;
    assert!(path.exists(), "the marks were persisted");

    // "Restart": a new engine (and store) with the same replay file.
    let w = start_node([31; 32], vec![], with_replay).await;
    // Replays of older or other learner-signed messages: refused.
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, &manifest(4, &p4)),
        Validation::Ignore
    );
    // Another manifest signed under the accepted version: refused too.
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, &manifest(5, &p5b)),
        Validation::Ignore
    );
    assert_eq!(on(&w.d, TopicKind::Plans, &order(5)), Validation::Ignore);
    assert_eq!(on(&w.d, TopicKind::Plans, &order(4)), Validation::Ignore);
    // The very manifest accepted last is still fine (the learner's catch-up answer), and
    // newer ones move on.
    assert_eq!(on(&w.d, TopicKind::Snapshots, &m5), Validation::Accept);
    assert_eq!(on(&w.d, TopicKind::Plans, &order(6)), Validation::Accept);
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, &manifest(6, &p6)),
        Validation::Accept
    );
    shutdown([w]).await;

    // Without the file (a node run without a data directory) the old ones pass: the file is
    // what carries the protection.
    let w = start_node([31; 32], vec![], |_| {}).await;
    assert_eq!(
        on(&w.d, TopicKind::Snapshots, &manifest(4, &p4)),
        Validation::Accept
    );
    shutdown([w]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manifest_too_large_for_the_hello_still_travels_by_push() {
    // 4 KiB chunks, 2 100 of them: the signed manifest (≈ 67 KB) does not fit a 64 KiB hello,
    // so every hello carries only its digest. One chain: learner → w0 → w1. A long stall
    // timeout keeps repair out of it: every chunk must arrive by push (w1's parent is a
    // worker, whose hello names a manifest it cannot send).
    let (learner, mut workers) = swarm(
        2,
        |c| {
            c.plan.learner_mbps = 100.0;
            c.chunk_size = 4 << 10;
        },
        |_, c| {
            c.chunk_size = 4 << 10;
            c.stall_timeout = Duration::from_secs(600);
        },
    )
    .await;
    let payload = random(2_100 * 4096);
    let order = vec![(workers[0].peer, 90.0), (workers[1].peer, 80.0)];
    let report = learner
        .d
        .publish(1, [0; 32], payload.clone().into(), Some(order))
        .await
        .unwrap();
    assert!(report.manifest.encode().len() > dissemination::wire::MAX_INLINE_BYTES);
    assert_eq!(
        report.plan.plan.chains,
        vec![vec![workers[0].peer, workers[1].peer]]
    );
    for w in &mut workers {
        assert_eq!(hash_bytes(&installed(w, 1).await), hash_bytes(&payload));
        let c = w.d.counters();
        assert_eq!(
            (c.push_received_bytes, c.fetched_bytes),
            (payload.len() as u64, 0),
            "{}",
            w.peer
        );
    }
    shutdown(workers).await;
    shutdown([learner]).await;
}
