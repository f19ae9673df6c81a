//! Hostile timing and sizes over real loopback streams: a worker that never answers, a learner
//! that never asks, a worker that answers with more groups than leased or with a frame past
//! the pull's byte budget — each ends in a typed error (the peer's fault) and nothing stored;
//! and a worker that closes the stream after the ack, or whose busy node drops a stream before
//! answering, which is no strike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{AsyncWriteExt, StreamExt};
use p2p::Client;
use pull::wire::{read_message, Message};
use pull::{
    pull_verified_with, serve_with, NoVerification, PullError, PullOptions, PullOutcome,
    PullRequest, ServeOptions, TRAJECTORY_PULL,
};
use storage::record::testing;
use storage::TrajectoryStore;

use super::{answer_pull, pair, req, LIMITS, WAIT};
use testkit::wait_for_async;

const FAST: PullOptions = PullOptions {
    read_timeout: Duration::from_millis(500),
};

/// Pulls until the stream opens (the first attempts may race the connection); each attempt is
/// bounded by the pull's own deadlines.
async fn pull_once_open(
    learner: &Client,
    worker: p2p::PeerId,
    buffer: &Arc<TrajectoryStore>,
    req: PullRequest,
) -> Result<PullOutcome, PullError> {
    wait_for_async("a pull stream to open", WAIT, || {
        let buffer = buffer.clone();
        async move {
            let v = Arc::new(NoVerification);
            match pull_verified_with(learner, worker, buffer, req, v, FAST).await {
                Err(PullError::Open { .. }) => None,
                other => Some(other),
            }
        }
    })
    .await
}

/// The stream ended early (`UnexpectedEof`): a lost stream, not the worker's fault.
fn assert_lost_stream(r: &Result<PullOutcome, PullError>) {
    match r {
        Err(e @ PullError::Io(io)) => {
            assert_eq!(io.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
            assert!(!e.is_peer_fault(), "{e}");
            assert_eq!(e.offence(), None, "{e}");
        }
        other => panic!("expected a lost stream, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(51).await;
    // Accepts every pull stream and stays silent, holding it open.
    let mut incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let h2 = held.clone();
    tokio::spawn(async move {
        while let Some((_, s)) = incoming.next().await {
            h2.lock().unwrap().push(s);
        }
    });
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        pull_once_open(&learner, worker.local_peer_id(), &buffer, req(4)),
    )
    .await
    .expect("the pull must end on its own deadline, not hang");
    match &r {
        Err(e @ PullError::Timeout { what, .. }) => {
            assert_eq!(*what, "the lease");
            assert!(e.is_peer_fault());
            assert_eq!(e.offence(), Some(pull::Offence::StreamViolation));
        }
        other => panic!(
            "expected a timeout, got {other:?} after {:?}",
            started.elapsed()
        ),
    }
    assert!(
        !held.lock().unwrap().is_empty(),
        "the silent worker got the stream"
    );
    assert!(buffer.scan(0, 10).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_never_asks_is_dropped_by_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(53).await;
    let store = Arc::new(TrajectoryStore::open(&dir.path().join("worker")).unwrap());
    let opts = ServeOptions {
        read_timeout: Duration::from_millis(300),
        ..ServeOptions::default()
    };
    tokio::spawn(serve_with(
        worker.stream_control(),
        store,
        learner.local_peer_id(),
        opts,
    ));
    let control = learner.stream_control();
    let worker_id = worker.local_peer_id();
    let mut s = wait_for_async("a stream to the worker", WAIT, || {
        let mut c = control.clone();
        async move { c.open_stream(worker_id, TRAJECTORY_PULL).await.ok() }
    })
    .await;
    // Say nothing: the worker gives up on its read deadline, tells us why and closes.
    let answer = tokio::time::timeout(Duration::from_secs(20), read_message(&mut s))
        .await
        .expect("the worker must drop a silent stream");
    match answer {
        Ok(Some(Message::Error { message })) => {
            assert!(message.contains("timed out"), "{message}")
        }
        other => panic!("expected the worker's timeout error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_groups_than_leased_is_an_oversized_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(55).await;
    let me = worker.local_peer_id().to_base58();
    let store = Arc::new(TrajectoryStore::open(&dir.path().join("worker")).unwrap());
    let groups: Vec<_> = (0..2)
        .map(|i| {
            let mut g = testing::group(1, i, 4, 8);
            g.producer = me.clone();
            g
        })
        .collect();
    store.put_groups(&groups).unwrap();
    // The test-only attack switch the node sets for `oversized_answer`.
    let opts = ServeOptions {
        testing_oversized_answer: true,
        ..ServeOptions::default()
    };
    tokio::spawn(serve_with(
        worker.stream_control(),
        store,
        learner.local_peer_id(),
        opts,
    ));
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let r = pull_once_open(&learner, worker.local_peer_id(), &buffer, req(8)).await;
    match &r {
        Err(e @ PullError::OversizedAnswer(m)) => {
            assert!(m.contains("beyond the 2"), "{m}");
            assert_eq!(e.offence(), Some(pull::Offence::OversizedAnswer));
        }
        other => panic!("expected an oversized answer, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_past_the_pull_budget_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(57).await;
    let budget = pull::byte_budget(&req(1));
    let per_group = pull::max_group_bytes(&LIMITS) as u64;
    assert_eq!(budget, per_group);
    // A hand-written worker: a lease of one group, then a "group" frame of 1 MiB — far above
    // what the learner's limits allow one group to be.
    let mut incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    tokio::spawn(async move {
        while let Some((_, mut s)) = incoming.next().await {
            tokio::spawn(async move {
                answer_pull(&mut s, 1, 1, [vec![7; 1 << 20]]).await;
                let _ = s.close().await;
            });
        }
    });
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let r = pull_once_open(&learner, worker.local_peer_id(), &buffer, req(1)).await;
    match &r {
        Err(e @ PullError::OversizedAnswer(m)) => {
            assert!(m.contains("exceeds the limit"), "{m}");
            assert!(e.is_peer_fault());
        }
        other => panic!("expected an oversized answer, got {other:?}"),
    }
    assert!(buffer.scan(0, 10).unwrap().is_empty(), "nothing stored");
}

/// A worker that takes the ack and closes the stream without its `Done` (what an honest
/// worker does when a busy learner acked after the worker's deadline): the groups the learner
/// verified are stored, and the pull fails as a lost stream, not as the worker's fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_closing_after_the_ack_is_not_struck() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(59).await;
    let mut g = testing::group(1, 0, 4, 8);
    g.producer = worker.local_peer_id().to_base58();
    let bytes = g.encode();
    let mut incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    let (acked_tx, acked_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut acked_tx = Some(acked_tx);
        while let Some((_, mut s)) = incoming.next().await {
            if !answer_pull(&mut s, 9, 1, [bytes.clone()]).await {
                continue;
            }
            if let Ok(Some(Message::Ack { lease_id })) = read_message(&mut s).await {
                if let Some(tx) = acked_tx.take() {
                    let _ = tx.send(lease_id);
                }
            }
            let _ = s.close().await;
        }
    });
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let r = pull_once_open(&learner, worker.local_peer_id(), &buffer, req(1)).await;
    assert_lost_stream(&r);
    let acked = tokio::time::timeout(Duration::from_secs(10), acked_rx)
        .await
        .expect("the worker saw the ack")
        .unwrap();
    assert_eq!(acked, 9);
    assert_eq!(
        buffer.scan(0, 10).unwrap().len(),
        1,
        "the verified group is stored"
    );
}

/// A worker's node that drops an inbound pull stream unanswered because its accepting task has
/// not taken the previous one yet (libp2p-stream's one-slot channel; what a busy honest worker
/// does under load): the learner reads the end of the stream before any lease, a lost stream,
/// not the worker's fault. The stream left waiting in the slot is the one that times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_stream_dropped_by_a_busy_worker_is_not_struck() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(61).await;
    // Registered, never polled: the first stream fills the slot, the next one is dropped.
    let _incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let id = worker.local_peer_id();
    // Whichever stream arrives first takes the slot; the other is dropped.
    let first = pull_once_open(&learner, id, &buffer, req(1));
    let second = pull_once_open(&learner, id, &buffer, req(1));
    let (a, b) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(first, second)
    })
    .await
    .expect("both pulls end on their own");
    let (mut timeouts, mut lost) = (0, 0);
    for r in [&a, &b] {
        match r {
            Err(e @ PullError::Timeout { .. }) => {
                assert!(e.is_peer_fault(), "{e}");
                timeouts += 1;
            }
            // The drop races the learner's request: a failed write or the end of the stream
            // (`a_stream_closed_before_the_lease_is_not_struck`), a lost stream either way.
            Err(e @ PullError::Io(_)) => {
                assert_eq!(e.offence(), None, "{e}");
                lost += 1;
            }
            other => panic!("expected a timeout and a lost stream, got {other:?}"),
        }
    }
    assert_eq!((timeouts, lost), (1, 1), "{a:?} / {b:?}");
    assert!(buffer.scan(0, 10).unwrap().is_empty(), "nothing stored");
}

/// The end of the stream where the lease belongs — what the learner reads when a busy worker's
/// node drops the stream after the request went out (see the test above) — is a lost stream,
/// not a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_closed_before_the_lease_is_not_struck() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(63).await;
    let mut incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    tokio::spawn(async move {
        while let Some((_, mut s)) = incoming.next().await {
            let _ = read_message(&mut s).await;
            let _ = s.close().await;
        }
    });
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let r = pull_once_open(&learner, worker.local_peer_id(), &buffer, req(1)).await;
    assert_lost_stream(&r);
    assert!(buffer.scan(0, 10).unwrap().is_empty(), "nothing stored");
}
