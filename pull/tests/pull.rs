//! The pull protocol between two in-process network services on 127.0.0.1: lease → durable
//! store → ack; only the learner may pull; a learner that dies before acking loses nothing
//! and stores nothing twice; and (`guard`) a hostile worker's groups are refused, not stored.

mod deadlines;
mod guard;

use std::sync::Arc;
use std::time::Duration;
use testkit::wait_for_async;

use futures::AsyncWriteExt;
use p2p::{Client, ServiceConfig};
use pull::wire::{read_message, write_message, Message};
use pull::{pull, serve, PullError, PullRequest};
use storage::record::testing;
use storage::record::GroupLimits;
use storage::TrajectoryGroup;
use storage::TrajectoryStore;

/// How long a test waits for a condition before it fails.
const WAIT: Duration = Duration::from_secs(30);

fn config(bootstrap: Vec<String>) -> ServiceConfig {
    ServiceConfig::loopback("pull-test", p2p::Role::Rollout, bootstrap, None)
}

/// A worker and a learner connected on 127.0.0.1.
async fn pair(seed: u8) -> (Client, Client) {
    let (worker, _ew, _tw) =
        p2p::start([seed; 32], config(vec![]), &mut p2p::Registry::default()).unwrap();
    let addr = wait_for_async("the worker to listen", WAIT, || async {
        worker.listen_addrs().await.ok()?.into_iter().next()
    })
    .await;
    let boot = format!("{addr}/p2p/{}", worker.local_peer_id());
    let (learner, _el, _tl) = p2p::start(
        [seed + 1; 32],
        config(vec![boot]),
        &mut p2p::Registry::default(),
    )
    .unwrap();
    (worker, learner)
}

/// The limits the guard and deadline tests pull under.
const LIMITS: GroupLimits = GroupLimits {
    vocab_size: 300,
    max_context: 64,
    logprob_floor: storage::record::DEFAULT_LOGPROB_FLOOR,
    group_size: 4,
};

/// A pull of at most `max_groups` groups under [`LIMITS`].
fn req(max_groups: u64) -> PullRequest {
    PullRequest {
        v_min: 0,
        max_groups,
        ttl: Duration::from_secs(30),
        limits: LIMITS,
        commits_from: None,
    }
}

/// A hand-written worker's answer to one pull stream: reads the `Pull`, then sends a lease of
/// `lease_id` announcing `count` groups and the `frames` as group frames (any number: a
/// hostile worker's frames need not match its lease). Returns `false` when the stream did not
/// start with a pull or a write failed (the learner hung up).
async fn answer_pull(
    s: &mut p2p::Stream,
    lease_id: u64,
    count: u64,
    frames: impl IntoIterator<Item = Vec<u8>>,
) -> bool {
    let Ok(Some(Message::Pull { .. })) = read_message(s).await else {
        return false;
    };
    let lease = Message::Lease {
        lease_id,
        count,
        log: pull::CommitLog::default(),
    };
    if write_message(s, &lease).await.is_err() {
        return false;
    }
    for bytes in frames {
        if write_message(s, &Message::Group { bytes }).await.is_err() {
            return false;
        }
    }
    true
}

/// A worker service with a store, and a learner (and a stranger) connected to it.
struct Net {
    worker: Client,
    learner: Client,
    stranger: Client,
    worker_store: Arc<TrajectoryStore>,
    buffer: Arc<TrajectoryStore>,
    _dir: tempfile::TempDir,
}

async fn net() -> Net {
    let dir = tempfile::tempdir().unwrap();
    let (worker, _ew, _tw) =
        p2p::start([11; 32], config(vec![]), &mut p2p::Registry::default()).unwrap();
    let addr = wait_for_async("the worker to listen", WAIT, || async {
        worker.listen_addrs().await.ok()?.into_iter().next()
    })
    .await;
    let boot = format!("{addr}/p2p/{}", worker.local_peer_id());
    let (learner, _el, _tl) = p2p::start(
        [12; 32],
        config(vec![boot.clone()]),
        &mut p2p::Registry::default(),
    )
    .unwrap();
    let (stranger, _es, _ts) =
        p2p::start([13; 32], config(vec![boot]), &mut p2p::Registry::default()).unwrap();
    let worker_store = Arc::new(TrajectoryStore::open(&dir.path().join("worker")).unwrap());
    let buffer = Arc::new(TrajectoryStore::open(&dir.path().join("learner")).unwrap());
    tokio::spawn(serve(
        worker.stream_control(),
        worker_store.clone(),
        learner.local_peer_id(),
    ));
    Net {
        worker,
        learner,
        stranger,
        worker_store,
        buffer,
        _dir: dir,
    }
}

impl Net {
    /// A valid group produced by this net's worker (the learner checks the producer).
    fn group(&self, version: u64, seed: u64, n: usize, tokens: usize) -> TrajectoryGroup {
        let mut g = testing::group(version, seed, n, tokens);
        g.producer = self.worker.local_peer_id().to_base58();
        g
    }
}

/// Versions of the groups in the learner's buffer, in key order.
fn buffered_versions(n: &Net) -> Vec<u64> {
    let groups = n.buffer.scan(0, 10).unwrap();
    groups.iter().map(|(k, _)| k.version).collect()
}

const REQ: PullRequest = PullRequest {
    v_min: 2,
    max_groups: 16,
    ttl: Duration::from_secs(30),
    limits: GroupLimits::PERMISSIVE,
    commits_from: None,
};

/// The first pull may race the connection being established: retry opening for a while.
async fn pull_retrying(n: &Net, req: PullRequest) -> pull::PullOutcome {
    let worker = n.worker.local_peer_id();
    wait_for_async("a pull to go through", WAIT, || {
        let buffer = n.buffer.clone();
        async move {
            match pull(&n.learner, worker, buffer, req).await {
                Ok(o) => Some(o),
                Err(PullError::Open { .. }) => None,
                Err(e) => panic!("pull failed: {e}"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_store_ack_moves_admissible_groups_exactly_once() {
    let n = net().await;
    let groups: Vec<_> = (0..6).map(|i| n.group(i / 2, i, 4, 8)).collect(); // versions 0,0,1,1,2,2
    n.worker_store.put_groups(&groups).unwrap();

    let out = pull_retrying(&n, REQ).await;
    assert_eq!(
        (out.received, out.stored, out.duplicates, out.invalid),
        (2, 2, 0, 0)
    );
    assert_eq!(out.consumed_on_worker, 2);
    let got = buffered_versions(&n);
    assert_eq!(got, [2, 2], "only versions ≥ v_min reach the learner");
    let mut arrived: Vec<_> = n
        .buffer
        .scan(0, 10)
        .unwrap()
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    arrived.sort_by_key(|g| g.group_id);
    assert_eq!(arrived, groups[4..], "bytes arrive intact");

    // Nothing admissible is left: the next pull is empty. The pull told the worker the
    // learner's window, so the four stale groups were pruned (counted as discarded-stale).
    let again = pull_retrying(&n, REQ).await;
    assert_eq!(again.lease_id, None);
    let c = n.worker_store.counters().unwrap();
    assert_eq!(
        (c.produced, c.consumed, c.discarded_stale, c.pending()),
        (6, 2, 4, 0)
    );
    assert!(n.worker_store.check_invariant().unwrap().holds());
    assert!(n.buffer.check_invariant().unwrap().holds());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_pull_gets_the_freshest_admissible_groups() {
    let n = net().await;
    let groups: Vec<_> = [3, 5, 2, 4].iter().map(|&v| n.group(v, v, 2, 4)).collect();
    n.worker_store.put_groups(&groups).unwrap();
    let req = PullRequest {
        max_groups: 2,
        ..REQ
    };
    let out = pull_retrying(&n, req).await;
    assert_eq!(out.stored, 2);
    let got = buffered_versions(&n);
    assert_eq!(got, [4, 5], "newest first");
    // v3 and v2 (= v_min, still admissible) stay on the worker for a later pull.
    assert_eq!(n.worker_store.counters().unwrap().pending(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_learner_may_pull() {
    let n = net().await;
    n.worker_store.put_group(&n.group(5, 1, 2, 2)).unwrap();
    let worker = n.worker.local_peer_id();
    let (buffer, stranger) = (n.buffer.clone(), &n.stranger);
    let err = wait_for_async("the stranger's pull to be answered", WAIT, || {
        let buffer = buffer.clone();
        async move {
            match pull(stranger, worker, buffer, REQ).await {
                Err(PullError::Open { .. }) => None,
                other => Some(other),
            }
        }
    })
    .await;
    assert!(
        matches!(err, Err(PullError::Refused(ref m)) if m.contains("only the swarm's learner")),
        "{err:?}"
    );
    assert_eq!(
        n.worker_store.counters().unwrap().leased,
        0,
        "nothing was leased to the stranger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_dies_before_acking_loses_nothing_and_stores_nothing_twice() {
    let n = net().await;
    let groups: Vec<_> = (0..3).map(|i| n.group(4, i, 2, 4)).collect();
    n.worker_store.put_groups(&groups).unwrap();
    let worker = n.worker.local_peer_id();

    // A learner that received the lease and stored it, then died before the ack: play the
    // protocol by hand up to that point.
    let control = n.learner.stream_control();
    let mut s = wait_for_async("a stream to the worker", WAIT, || {
        let mut c = control.clone();
        async move { c.open_stream(worker, pull::TRAJECTORY_PULL).await.ok() }
    })
    .await;
    let ask = Message::Pull {
        v_min: 0,
        max_groups: 16,
        ttl_ms: 300,
        commits_from: None,
    };
    write_message(&mut s, &ask).await.unwrap();
    let Some(Message::Lease { count, .. }) = read_message(&mut s).await.unwrap() else {
        panic!("no lease")
    };
    let mut received = Vec::new();
    for _ in 0..count {
        let Some(Message::Group { bytes }) = read_message(&mut s).await.unwrap() else {
            panic!("no group")
        };
        received.push(storage::TrajectoryGroup::decode(&bytes).unwrap());
    }
    n.buffer.put_groups_dedup(&received).unwrap();
    let _ = s.close().await; // dies: no ack
    drop(s);

    // After the lease expires the groups are offered again; the buffer refuses the copies and
    // the ack finally deletes them on the worker.
    let learner = &n.learner;
    let out = wait_for_async("the expired lease to be offered again", WAIT, || {
        let buffer = n.buffer.clone();
        async move {
            let req = PullRequest {
                v_min: 0,
                max_groups: 16,
                ttl: Duration::from_secs(30),
                limits: GroupLimits::PERMISSIVE,
                commits_from: None,
            };
            pull(learner, worker, buffer, req)
                .await
                .ok()
                .filter(|o| o.received > 0)
        }
    })
    .await;
    assert_eq!((out.received, out.stored, out.duplicates), (3, 0, 3));
    assert_eq!(out.consumed_on_worker, 3);
    let b = n.buffer.counters().unwrap();
    assert_eq!(
        (b.produced, b.duplicates),
        (3, 3),
        "each group stored exactly once"
    );
    let w = n.worker_store.counters().unwrap();
    assert_eq!(
        (w.produced, w.consumed, w.pending(), w.leased),
        (3, 3, 0, 6)
    );
    assert!(n.worker_store.check_invariant().unwrap().holds());
}
