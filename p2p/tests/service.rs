//! In-process network services on 127.0.0.1: heartbeats, transfer events feeding the ECHO
//! score, a bulk stream over a test protocol (the slot the bulk-transfer crates build on), and
//! the defences against untrusted peers (strikes and bans, the heartbeat rate limit, inbound
//! connection limits).

use std::time::{Duration, Instant};
use testkit::wait_for_async;

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use p2p::{
    Client, Event, Heartbeat, PeerId, PeerReport, ReportLabel, Role, ServiceConfig, StreamProtocol,
    TopicKind, TransferEvent,
};

/// A strike label as a role would name its own offence (the network crate reads none).
const INVALID_GROUP: ReportLabel = ReportLabel::new("invalid_group");
/// How long a test waits for a condition before it fails.
const WAIT: Duration = Duration::from_secs(30);

/// A protocol of this test only: p2p carries streams of any protocol its callers name.
const TEST_STREAM: StreamProtocol = StreamProtocol::new("/echo-swarm/p2p-test-stream/1.0.0");

fn config(bootstrap: Vec<String>) -> ServiceConfig {
    ServiceConfig::loopback("p2p-test", Role::Rollout, bootstrap, None)
}

/// Accepts one `TEST_STREAM` on `client` and reads it to its end: the sender and the bytes.
fn receive_one(client: &Client) -> tokio::task::JoinHandle<(PeerId, Vec<u8>)> {
    let mut incoming = client.stream_control().accept(TEST_STREAM).unwrap();
    tokio::spawn(async move {
        let (peer, mut s) = incoming.next().await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        (peer, buf)
    })
}

async fn sees(client: &Client, peer: PeerId) -> Option<p2p::PeerStatus> {
    let st = client.status().await.ok()?;
    st.peers
        .into_iter()
        .find(|p| p.peer_id == peer.to_string() && p.active)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_transfers_and_streams() {
    let mut reg = p2p::Registry::default();
    let (a, _ea, ta) = p2p::start([1; 32], config(vec![]), &mut reg).unwrap();
    let a_addr = wait_for_async("a to listen", WAIT, || async {
        a.listen_addrs().await.ok()?.into_iter().next()
    })
    .await;
    let boot = format!("{a_addr}/p2p/{}", a.local_peer_id());
    let (b, _eb, tb) =
        p2p::start([2; 32], config(vec![boot]), &mut p2p::Registry::default()).unwrap();
    assert_eq!(b.local_peer_id(), p2p::peer_id_from_seed([2; 32]));

    // Heartbeats both ways.
    let pb = wait_for_async("a to hear b", WAIT, || sees(&a, b.local_peer_id())).await;
    assert_eq!(pb.role, Some(Role::Rollout));
    wait_for_async("b to hear a", WAIT, || sees(&b, a.local_peer_id())).await;

    // A transfer event of 12.5 MB in 1 s = 100 Mbit/s → Speed 100.
    let ev = TransferEvent {
        bytes: 12_500_000,
        duration: Duration::from_secs(1),
        success: true,
    };
    a.record_transfer(b.local_peer_id(), ev).await.unwrap();
    let pb = wait_for_async("the transfer to count", WAIT, || async {
        sees(&a, b.local_peer_id())
            .await
            .filter(|p| p.score.speed > 99.999)
    })
    .await;
    assert!((pb.score.avg_speed_bps - 100e6).abs() < 1.0);

    // A bulk stream on a test protocol: b pushes bytes to a, a echoes their length.
    let server = receive_one(&a);
    let payload = vec![7u8; 1 << 20];
    let mut s = b
        .stream_control()
        .open_stream(a.local_peer_id(), TEST_STREAM)
        .await
        .unwrap();
    s.write_all(&payload).await.unwrap();
    s.close().await.unwrap();
    let (peer, got) = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((peer, got.len()), (b.local_peer_id(), payload.len()));

    a.shutdown().await;
    b.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), ta).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), tb).await;
}

/// A started node and what is needed to stop it.
struct Node {
    client: Client,
    events: tokio::sync::mpsc::Receiver<Event>,
    task: tokio::task::JoinHandle<()>,
}

impl Node {
    fn start(seed: u8, cfg: ServiceConfig) -> Node {
        let (client, events, task) =
            p2p::start([seed; 32], cfg, &mut p2p::Registry::default()).unwrap();
        Node {
            client,
            events,
            task,
        }
    }

    async fn bootstrap_addr(&self) -> String {
        let addr = self.listen_addr().await;
        format!("{addr}/p2p/{}", self.client.local_peer_id())
    }

    /// The node's first listen address, once it listens.
    async fn listen_addr(&self) -> p2p::Multiaddr {
        wait_for_async("a node to listen", WAIT, || async {
            self.client.listen_addrs().await.ok()?.into_iter().next()
        })
        .await
    }

    /// The same as a TCP socket address (the loopback configs listen on TCP only).
    async fn listen_socket(&self) -> std::net::SocketAddr {
        let addr = self.listen_addr().await;
        match (addr.iter().next(), addr.iter().nth(1)) {
            (
                Some(p2p::multiaddr::Protocol::Ip4(ip)),
                Some(p2p::multiaddr::Protocol::Tcp(port)),
            ) => (ip, port).into(),
            _ => panic!("not a TCP listen address: {addr}"),
        }
    }

    async fn stop(self) {
        self.client.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

async fn row(client: &Client, peer: PeerId) -> Option<p2p::PeerStatus> {
    let st = client.status().await.ok()?;
    st.peers.into_iter().find(|p| p.peer_id == peer.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strikes_ban_a_peer_for_the_run_in_both_directions() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut a = Node::start(11, config(vec![]));
        let boot = a.bootstrap_addr().await;
        // b keeps re-dialing a (its bootstrap peer) every few seconds.
        let b = Node::start(12, config(vec![boot]));
        let (pa, pb) = (a.client.local_peer_id(), b.client.local_peer_id());
        wait_for_async("a to hear b", WAIT, || sees(&a.client, pb)).await;
        assert!(!a.client.is_banned(&pb));

        // Two strikes: counted, not yet banned (default threshold 3).
        a.client
            .strike(pb, PeerReport::strike(INVALID_GROUP))
            .await
            .unwrap();
        a.client
            .strike(pb, PeerReport::strike(ReportLabel::new("stream_violation")))
            .await
            .unwrap();
        let r = wait_for_async("two strikes", WAIT, || async {
            row(&a.client, pb).await.filter(|r| r.strikes == 2)
        })
        .await;
        assert!(!r.banned && r.active && r.connected);
        assert_eq!(r.score.failures, 2);
        assert!(!a.client.is_banned(&pb));

        // The third bans.
        a.client
            .strike(pb, PeerReport::strike(INVALID_GROUP))
            .await
            .unwrap();
        let r = wait_for_async("b to be banned and disconnected", WAIT, || async {
            row(&a.client, pb)
                .await
                .filter(|r| r.banned && !r.connected)
        })
        .await;
        assert_eq!(r.ban_reason.as_deref(), Some("invalid_group"));
        assert_eq!(r.strikes, 3);
        assert_eq!(r.strikes_by_reason["invalid_group"], 2);
        assert_eq!(r.strikes_by_reason["stream_violation"], 1);
        assert!(!r.active, "a banned peer is never active");
        assert!(a.client.is_banned(&pb));
        assert_eq!(a.client.banned_peers(), vec![pb]);
        let banned = loop {
            match a.events.recv().await.expect("event stream open") {
                Event::PeerBanned { peer, reason } => break (peer, reason),
                _ => continue,
            }
        };
        assert_eq!(banned, (pb, INVALID_GROUP));
        let st = a.client.status().await.unwrap();
        assert_eq!((st.counters.strikes, st.counters.bans), (3, 1));

        // b's re-dials are refused (inbound), and so is a's own dial (outbound).
        wait_for_async("b's re-dial to be refused", WAIT, || async {
            let st = a.client.status().await.ok()?;
            (st.counters.connections_denied >= 1).then_some(())
        })
        .await;
        // …and b backs off instead of redialing in a loop. A refused node used to redial at
        // once, whatever asked for the dial (a Kademlia query, a stream open, a repair): in CI
        // a banned worker cost its learner about a hundred handshakes a second for minutes.
        // Here b asks for 20 dials, each as soon as the last one's connection is closed: the
        // first few reach a (and are refused there), then b holds its dials back (1 s, 2 s, …)
        // and refuses them itself.
        let refused = |st: &p2p::NetworkStatus| {
            st.counters.connections_denied + st.counters.connection_errors
        };
        let before = refused(&a.client.status().await.unwrap());
        let a_addr = a.client.listen_addrs().await.unwrap().remove(0);
        let mut held_back = 0;
        for _ in 0..20 {
            let n = refused(&a.client.status().await.unwrap());
            let dial = b
                .client
                .dial(a_addr.clone().with(p2p::multiaddr::Protocol::P2p(pa)))
                .await;
            match dial {
                Err(e) => {
                    assert!(e.to_string().contains("closed our last connections"), "{e}");
                    held_back += 1;
                }
                Ok(()) => {
                    // The dial's outcome: a refused it, and b saw the connection close.
                    wait_for_async("a to refuse b's dial", WAIT, || async {
                        let st = a.client.status().await.ok()?;
                        (refused(&st) > n).then_some(())
                    })
                    .await;
                    wait_for_async("b to see the connection closed", WAIT, || async {
                        row(&b.client, pa).await.filter(|r| !r.connected)
                    })
                    .await;
                }
            }
        }
        let reached = refused(&a.client.status().await.unwrap()) - before;
        assert!(held_back >= 10, "b held back only {held_back} of 20 dials");
        assert!(
            reached <= 10,
            "{reached} of b's dials reached a after its ban"
        );
        let b_addr = b.client.listen_addrs().await.unwrap().remove(0);
        let dial = a
            .client
            .dial(b_addr.with(p2p::multiaddr::Protocol::P2p(pb)))
            .await;
        assert!(
            dial.is_err(),
            "a dial to a banned peer is refused: {dial:?}"
        );
        // Still banned and disconnected, never pruned; b never got a connection back.
        let r = row(&a.client, pb)
            .await
            .expect("a banned peer's row is kept");
        assert!(r.banned && !r.connected && !r.active);
        let sb = b.client.status().await.unwrap();
        assert!(sb
            .peers
            .iter()
            .all(|p| p.peer_id != pa.to_string() || !p.connected));
        a.stop().await;
        b.stop().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_flood_is_ignored_and_struck_once_per_window() {
    tokio::time::timeout(Duration::from_secs(120), async {
        // The receiver's interval is long (10 min): it accepts at most one heartbeat of b
        // per 5 min, so every spammed one is ignored however slowly this machine runs.
        let mut slow = config(vec![]);
        slow.network.heartbeat_interval_ms = 600_000;
        let a = Node::start(21, slow);
        let boot = a.bootstrap_addr().await;
        let b = Node::start(22, config(vec![boot]));
        let pb = b.client.local_peer_id();
        wait_for_async("a to hear b", WAIT, || sees(&a.client, pb)).await;

        // b publishes valid heartbeats of its own, far faster than anyone's interval.
        let topic = TopicKind::Heartbeat.topic_name("p2p-test");
        let spam = 200u64;
        for seq in 0..spam {
            // JSON rather than a struct literal: valid whatever optional fields `Heartbeat`
            // gains.
            let hb = serde_json::json!({
                "v": p2p::messages::HEARTBEAT_VERSION, "swarm_id": "p2p-test", "role": "rollout",
                "node_version": "spam", "installed_version": null, "mu": 0.0,
                "cost_per_hour": 0.0, "availability": 1.0, "pending": 0,
                "forward_rate_bps": 0.0, "receive_rate_bps": 0.0, "started_unix_ms": 1,
                "sent_unix_ms": 1, "seq": 1_000_000 + seq,
            });
            let bytes = serde_json::to_vec(&hb).unwrap();
            assert!(Heartbeat::decode(&bytes, "p2p-test").is_ok());
            b.client.publish_raw(topic.clone(), bytes).await.unwrap();
        }
        let r = wait_for_async("a to strike b for the flood", WAIT, || async {
            row(&a.client, pb).await.filter(|r| r.strikes >= 1)
        })
        .await;
        // One strike for the window (at most one per 100 min here), not a ban.
        assert_eq!(r.strikes_by_reason.get("heartbeat_flood"), Some(&1));
        assert_eq!(r.strikes, 1);
        assert!(!r.banned);
        // Ignored, not recorded: no spam heartbeat replaced b's real one.
        assert_eq!(r.node_version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
        assert!(r.heartbeats <= 2, "{} heartbeats recorded", r.heartbeats);
        let st = a.client.status().await.unwrap();
        assert!(
            st.counters.heartbeats_ignored >= 4 * 10,
            "{:?}",
            st.counters
        );
        // A heartbeat is not a success: the flood left b with one failure and no success.
        assert_eq!((r.score.successes, r.score.failures), (0, 1));
        a.stop().await;
        b.stop().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_connections_beyond_the_limit_are_refused() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut one = config(vec![]);
        one.network.max_inbound = 1;
        let a = Node::start(31, one);
        let boot = a.bootstrap_addr().await;
        let b = Node::start(32, config(vec![boot.clone()]));
        wait_for_async("a to hear b", WAIT, || {
            sees(&a.client, b.client.local_peer_id())
        })
        .await;
        // c's connection would be a's second inbound one.
        let c = Node::start(33, config(vec![boot]));
        wait_for_async("c's connection to be refused", WAIT, || async {
            let st = a.client.status().await.ok()?;
            (st.counters.connections_denied >= 1).then_some(())
        })
        .await;
        let st = a.client.status().await.unwrap();
        assert_eq!(st.connected_peers, 1, "only b holds a connection");
        assert!(row(&a.client, c.client.local_peer_id())
            .await
            .is_none_or(|r| !r.connected));
        a.stop().await;
        b.stop().await;
        c.stop().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_gossip_messages_are_strikes_that_ban_their_author() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let a = Node::start(41, config(vec![]));
        let boot = a.bootstrap_addr().await;
        let b = Node::start(42, config(vec![boot]));
        let pb = b.client.local_peer_id();
        wait_for_async("a to hear b", WAIT, || sees(&a.client, pb)).await;
        let topic = TopicKind::Heartbeat.topic_name("p2p-test");
        for garbage in [&b"{not json"[..], b"[]", b"{\"v\":99}"] {
            b.client
                .publish_raw(topic.clone(), garbage.to_vec())
                .await
                .unwrap();
        }
        let r = wait_for_async("a to ban b for bad messages", WAIT, || async {
            row(&a.client, pb).await.filter(|r| r.banned)
        })
        .await;
        assert_eq!(r.ban_reason.as_deref(), Some("bad_message"));
        assert_eq!((r.rejected_messages, r.strikes), (3, 3));
        assert_eq!(r.strikes_by_reason["bad_message"], 3);
        // The last valid heartbeat is kept; the row stays, inactive.
        assert_eq!(r.role, Some(Role::Rollout));
        assert!(!r.active);
        assert!(a.client.is_banned(&pb));
        let st = a.client.status().await.unwrap();
        assert_eq!(st.counters.messages_rejected, 3);
        a.stop().await;
        b.stop().await;
    })
    .await
    .expect("test timed out");
}

/// Manifests, plans and orders are authored by the learner only: a message on those topics
/// authored by another peer is rejected before any role sees it, and its author is struck and
/// banned at once — for `replay` when the bytes are a message the learner published, for
/// `forged_message` otherwise (garbage, a forgery).
#[tokio::test]
async fn snapshot_and_plan_messages_not_authored_by_the_learner_ban_their_author() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let learner = p2p::peer_id_from_seed([43; 32]);
        let with_learner = |bootstrap| {
            let mut c = config(bootstrap);
            c.learner = Some(learner);
            c
        };
        let a = Node::start(43, with_learner(vec![]));
        let boot = a.bootstrap_addr().await;
        let b = Node::start(44, with_learner(vec![boot.clone()]));
        let c = Node::start(45, with_learner(vec![boot]));
        let (pb, pc) = (b.client.local_peer_id(), c.client.local_peer_id());
        wait_for_async("a to hear b and c", WAIT, || async {
            (sees(&a.client, pb).await.is_some() && sees(&a.client, pc).await.is_some())
                .then_some(())
        })
        .await;
        let topic = TopicKind::Snapshots.topic_name("p2p-test");
        let manifest = b"a learner-signed manifest".to_vec();
        // The learner publishes; its subscribers must be known to it first.
        wait_for_async("the learner to publish", WAIT, || async {
            a.client
                .publish_raw(topic.clone(), manifest.clone())
                .await
                .ok()
        })
        .await;
        // b re-publishes the learner's bytes: a replay.
        wait_for_async("b to replay", WAIT, || async {
            b.client
                .publish_raw(topic.clone(), manifest.clone())
                .await
                .ok()
        })
        .await;
        let r = wait_for_async("a to ban b", WAIT, || async {
            row(&a.client, pb).await.filter(|r| r.banned)
        })
        .await;
        // Unambiguous evidence: banned at the first such message, not the third.
        assert_eq!(r.ban_reason.as_deref(), Some("replay"));
        assert_eq!(r.strikes_by_reason["replay"], 1, "{r:?}");
        // c publishes bytes the learner never did: a forgery, named as such.
        wait_for_async("c to publish garbage", WAIT, || async {
            c.client.publish_raw(topic.clone(), vec![7; 8]).await.ok()
        })
        .await;
        let r = wait_for_async("a to ban c", WAIT, || async {
            row(&a.client, pc).await.filter(|r| r.banned)
        })
        .await;
        assert_eq!(r.ban_reason.as_deref(), Some("forged_message"));
        assert_eq!(r.strikes_by_reason["forged_message"], 1, "{r:?}");
        assert!(a.client.is_banned(&pb) && a.client.is_banned(&pc));
        a.stop().await;
        b.stop().await;
        c.stop().await;
    })
    .await
    .expect("test timed out");
}

/// Heartbeats carry the sender's dial hints (its listen addresses, no `/p2p` suffix) to
/// every node, also to nodes it never connected to (relayed by a hub): the addresses a
/// forwarder needs for its first push to a child it never met, handed to Kademlia (whose
/// routing table answers a dial by peer id) and shown in `status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_carry_dial_hints_to_every_node() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let hub = Node::start(31, config(vec![]));
        let boot = hub.bootstrap_addr().await;
        let a = Node::start(32, config(vec![boot.clone()]));
        let b = Node::start(33, config(vec![boot]));
        let pb = b.client.local_peer_id();
        let b_addrs: Vec<String> = wait_for_async("b to listen", WAIT, || async {
            Some(b.client.listen_addrs().await.ok()?)
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().map(|a| a.to_string()).collect())
        })
        .await;
        let hints = wait_for_async("a to hold b's dial hints", WAIT, || async {
            let st = a.client.status().await.ok()?;
            st.peers
                .into_iter()
                .find(|p| p.peer_id == pb.to_string() && !p.dial_hints.is_empty())
                .map(|p| p.dial_hints)
        })
        .await;
        assert!(
            hints.len() <= p2p::messages::MAX_HEARTBEAT_ADDRS,
            "{hints:?}"
        );
        for h in &hints {
            assert!(
                b_addrs.contains(h),
                "{h} is one of b's listen addresses {b_addrs:?}"
            );
        }
        for n in [a, b, hub] {
            n.stop().await;
        }
    })
    .await
    .expect("test timed out");
}

/// `Client::open_stream` to a peer this node is not connected to dials it from a new local
/// port, not the listening one (which bootstrap dials keep): two peers whose dials from their
/// listening ports cross meet as one TCP simultaneous-open connection on which both start the
/// Noise handshake as initiator, and both dials fail — what a forwarder's first push did at
/// 100 ms RTT when the child's Kademlia query dialed it at the same moment. The peer here is
/// a bare TCP listener posing as a bootstrap peer: it records the source port of every
/// connection and drops it (so no libp2p connection ever stands and every open dials anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_open_dials_from_a_new_port() {
    use std::sync::{Arc, Mutex};
    tokio::time::timeout(Duration::from_secs(60), async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
        let record = seen.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((socket, from)) = listener.accept().await {
                record.lock().unwrap().push((Instant::now(), from.port()));
                drop(socket);
            }
        });
        let fake = p2p::peer_id_from_seed([41; 32]);
        let boot = format!("/ip4/127.0.0.1/tcp/{}/p2p/{fake}", at.port());
        let b = Node::start(42, config(vec![boot]));
        let listen_port = b.listen_socket().await.port();
        // The bootstrap dial comes from the listening port: the listener tells the two apart.
        wait_for_async(
            "the bootstrap dial from the listening port",
            WAIT,
            || async {
                let s = seen.lock().unwrap();
                s.iter().any(|&(_, port)| port == listen_port).then_some(())
            },
        )
        .await;
        // Each open fails (the listener drops the connection). A dial already under way when
        // the open asks (a bootstrap redial, a Kademlia query) makes the open wait for it
        // instead of dialing, so up to three opens are tried.
        let mut from_new_port = false;
        for _ in 0..3 {
            let asked = Instant::now();
            let open = b.client.open_stream(fake, TEST_STREAM);
            let r = tokio::time::timeout(Duration::from_secs(10), open).await;
            assert!(!matches!(r, Ok(Ok(_))), "a bare TCP listener gave a stream");
            from_new_port = seen
                .lock()
                .unwrap()
                .iter()
                .any(|&(t, port)| t >= asked && port != listen_port);
            if from_new_port {
                break;
            }
        }
        let seen = seen.lock().unwrap().clone();
        assert!(
            from_new_port,
            "no dial from a new port after the opens: {seen:?} (listening port {listen_port})"
        );
        // A test's own accept loop: nothing to hand back, it only has to end.
        acceptor.abort();
        b.stop().await;
    })
    .await
    .expect("test timed out");
}

/// An open that finds a dial to the peer already under way waits for it, and when that dial
/// fails (here: a TCP proxy in front of the peer holds the first connection, then drops it,
/// as a simultaneous open does), the open dials again instead of failing: the stream opens
/// through the proxy's next connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_open_outlives_a_failed_dial_it_waited_for() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let c = Node::start(51, config(vec![]));
        let target = c.listen_socket().await;
        let received = receive_one(&c.client);
        // The proxy holds its first connection until `release`, then drops it; it relays
        // every later one to c.
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_port = proxy.local_addr().unwrap().port();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let relay = tokio::spawn(async move {
            let (first, _) = proxy.accept().await.unwrap();
            let _ = held_tx.send(());
            let _ = release_rx.await;
            drop(first);
            while let Ok((mut inbound, _)) = proxy.accept().await {
                tokio::spawn(async move {
                    let mut out = tokio::net::TcpStream::connect(target).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                });
            }
        });
        let pc = c.client.local_peer_id();
        // b knows c only at the proxy, as a bootstrap peer: its first dial is the held one.
        let b = Node::start(
            52,
            config(vec![format!("/ip4/127.0.0.1/tcp/{proxy_port}/p2p/{pc}")]),
        );
        held_rx.await.unwrap();
        let opener = b.client.clone();
        let open = tokio::spawn(async move { opener.open_stream(pc, TEST_STREAM).await });
        // Let the open find the held dial under way (if it came later, it would dial anew and
        // the test would pass without the retry: never a false failure).
        tokio::time::sleep(Duration::from_millis(300)).await;
        release_tx.send(()).unwrap();
        let mut s = open
            .await
            .unwrap()
            .expect("the open dials again after the dial it waited for failed");
        s.write_all(b"through the second dial").await.unwrap();
        s.close().await.unwrap();
        assert_eq!(received.await.unwrap().1, b"through the second dial");
        // A test's own accept loop: nothing to hand back, it only has to end.
        relay.abort();
        b.stop().await;
        c.stop().await;
    })
    .await
    .expect("test timed out");
}
