//! A hostile worker over real loopback streams: groups that break the learner's limits or
//! claim another producer are not stored, are counted per reason, and the valid groups of the
//! same lease still arrive; a lease announcing more groups than asked is refused whole.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use p2p::Client;
use pull::{pull, serve, PullError, PullOutcome, PullRequest, TRAJECTORY_PULL};
use storage::record::testing;
use storage::TrajectoryStore;

use super::{answer_pull, pair, req, WAIT};
use testkit::wait_for_async;

async fn pull_retrying(
    learner: &Client,
    worker: p2p::PeerId,
    buffer: &Arc<TrajectoryStore>,
    req: PullRequest,
) -> Result<PullOutcome, PullError> {
    wait_for_async("a pull to go through", WAIT, || {
        let buffer = buffer.clone();
        async move {
            // Each attempt is bounded, as the node's puller bounds every pull: a stream that
            // opens before the connection settles may never be answered (the pull's read
            // deadline ends it), and the retry opens a fresh one.
            match tokio::time::timeout(Duration::from_secs(5), pull(learner, worker, buffer, req))
                .await
            {
                Err(_) | Ok(Err(PullError::Open { .. })) | Ok(Err(PullError::Timeout { .. })) => {
                    None
                }
                Ok(other) => Some(other),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_forged_groups_are_counted_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(31).await;
    let me = worker.local_peer_id().to_base58();
    let own = |seed: u64| {
        let mut g = testing::group(1, seed, 4, 8);
        g.producer = me.clone();
        g
    };
    let good = own(1);
    let mut poisoned = own(2);
    poisoned.samples[1].sampler_logprobs[2] = -1e4;
    let mut out_of_vocab = own(3);
    out_of_vocab.samples[0].response_tokens[0] = 5000;
    let forged = testing::group(1, 4, 4, 8); // producer "12D3KooWtest", not the worker
    let worker_store = Arc::new(TrajectoryStore::open(&dir.path().join("worker")).unwrap());
    worker_store
        .put_groups(&[good.clone(), poisoned, out_of_vocab, forged])
        .unwrap();
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    tokio::spawn(serve(
        worker.stream_control(),
        worker_store.clone(),
        learner.local_peer_id(),
    ));

    let out = pull_retrying(&learner, worker.local_peer_id(), &buffer, req(16))
        .await
        .expect("a pull with bad groups still succeeds");
    assert_eq!((out.received, out.stored, out.invalid), (4, 1, 3));
    assert_eq!(out.delivered(), 1, "refused groups are not delivered");
    let mut reasons: Vec<&str> = out.rejected.iter().map(|r| r.as_str()).collect();
    reasons.sort_unstable();
    assert_eq!(
        reasons,
        [
            "forged_producer",
            "logprob_out_of_range",
            "token_out_of_vocab"
        ]
    );
    let stored = buffer.scan(0, 10).unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1, good, "only the valid group is stored");
    assert_eq!(buffer.counters().unwrap().rejected_invalid, 3);
    // The whole lease is acked: the worker does not offer the refused groups again.
    assert_eq!(out.consumed_on_worker, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_larger_than_asked_is_refused_before_reading_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, learner) = pair(41).await;
    let me = worker.local_peer_id().to_base58();
    // A hand-written worker that answers every pull with a lease of 10 groups and sends them.
    let mut incoming = worker.stream_control().accept(TRAJECTORY_PULL).unwrap();
    tokio::spawn(async move {
        while let Some((_, mut s)) = incoming.next().await {
            let me = me.clone();
            tokio::spawn(async move {
                let groups = (0..10).map(|seed| {
                    let mut g = testing::group(1, seed, 4, 8);
                    g.producer = me.clone();
                    g.encode()
                });
                answer_pull(&mut s, 7, 10, groups).await;
                let _ = s.close().await;
            });
        }
    });
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    let r = pull_retrying(&learner, worker.local_peer_id(), &buffer, req(3)).await;
    match r {
        Err(PullError::OversizedLease { count: 10, max: 3 }) => {}
        other => panic!("expected an oversized-lease error, got {other:?}"),
    }
    assert!(buffer.scan(0, 100).unwrap().is_empty(), "nothing stored");
}
