//! NAT traversal and transports with in-process services on 127.0.0.1:
//! - a `relay` node, a node `a` that listens only through a reservation on the relay (no direct
//!   listener at all: nobody can dial it directly), and a node `b` that knows only the relay:
//!   `b` discovers `a` through the relay's DHT, connects through the circuit, hears `a`'s
//!   heartbeats (which say `relayed`) and pushes a bulk stream to it over the circuit; the relay
//!   counts the reservation and the circuit;
//! - two nodes on QUIC only: heartbeats and a bulk stream over `/udp/…/quic-v1`.
//!
//! Loopback cannot firewall, so "behind NAT" is emulated by giving the NATed nodes no direct
//! listen address; hole punching (DCUtR) then has nothing to punch to and the connection stays
//! relayed. What real NATs do is proven by the network-namespace testnet (`testnet nat`).

use std::time::Duration;
use testkit::wait_for_async;

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use p2p::{
    Client, ConnectionKind, Multiaddr, PeerId, Reachability, Role, ServiceConfig, StreamProtocol,
};

/// How long a test waits for a condition before it fails.
const WAIT: Duration = Duration::from_secs(45);

const TEST_STREAM: StreamProtocol = StreamProtocol::new("/echo-swarm/p2p-test-relay/1.0.0");

async fn active_peer(client: &Client, peer: PeerId) -> Option<p2p::PeerStatus> {
    let st = client.status().await.ok()?;
    st.peers
        .into_iter()
        .find(|p| p.peer_id == peer.to_string() && p.active)
}

async fn first_listen(c: &Client) -> Multiaddr {
    wait_for_async("a listen address", WAIT, || async {
        c.listen_addrs().await.ok()?.into_iter().next()
    })
    .await
}

/// Pushes 1 MiB from `from` to `to` on [`TEST_STREAM`] and checks that all of it arrived.
async fn push_stream(from: &Client, to: &Client) {
    let mut incoming = to.stream_control().accept(TEST_STREAM).unwrap();
    let server = tokio::spawn(async move {
        let (peer, mut s) = incoming.next().await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        (peer, buf)
    });
    let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut s = from
        .stream_control()
        .open_stream(to.local_peer_id(), TEST_STREAM)
        .await
        .unwrap();
    s.write_all(&payload).await.unwrap();
    s.close().await.unwrap();
    let (peer, got) = tokio::time::timeout(Duration::from_secs(45), server)
        .await
        .expect("the stream arrives in time")
        .unwrap();
    assert_eq!(peer, from.local_peer_id());
    assert!(got == payload, "the stream's bytes arrive intact");
}

async fn stop(nodes: Vec<(Client, tokio::task::JoinHandle<()>)>) {
    for (c, t) in nodes {
        c.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_relay_is_reached_through_a_circuit() {
    let swarm = "p2p-relay-test";
    let relay_cfg = ServiceConfig::loopback(swarm, Role::Relay, vec![], None);
    let (relay, _er, tr) = p2p::start([10; 32], relay_cfg, &mut p2p::Registry::default()).unwrap();
    let relay_addr = format!(
        "{}/p2p/{}",
        first_listen(&relay).await,
        relay.local_peer_id()
    );

    // `a`: no direct listener, only `<relay>/p2p-circuit`.
    let mut a_cfg = ServiceConfig::loopback(swarm, Role::Rollout, vec![relay_addr.clone()], None);
    a_cfg.network.listen = vec![format!("{relay_addr}/p2p-circuit")];
    let (a, _ea, ta) = p2p::start([11; 32], a_cfg, &mut p2p::Registry::default()).unwrap();
    let st = wait_for_async("a's reservation on the relay", WAIT, || async {
        let st = a.status().await.ok()?;
        (!st.nat.reservations.is_empty()).then_some(st)
    })
    .await;
    assert_eq!(st.nat.reservations, [relay.local_peer_id().to_string()]);
    assert!(
        st.listen_addrs.iter().all(|l| l.contains("/p2p-circuit")),
        "a listens only through the relay: {:?}",
        st.listen_addrs
    );

    // `b`: knows only the relay (also no direct listener: the connection cannot be punched).
    let mut b_cfg = ServiceConfig::loopback(swarm, Role::Rollout, vec![relay_addr.clone()], None);
    b_cfg.network.listen = vec![format!("{relay_addr}/p2p-circuit")];
    let (b, _eb, tb) = p2p::start([12; 32], b_cfg, &mut p2p::Registry::default()).unwrap();

    // b discovers a through the relay's DHT, connects through the circuit, hears a.
    let pa = wait_for_async("b to connect to a through the relay", WAIT, || async {
        active_peer(&b, a.local_peer_id())
            .await
            .filter(|p| p.reachability.is_some() && p.connection.is_some())
    })
    .await;
    assert_eq!(pa.connection, Some(ConnectionKind::Relayed));
    assert!(matches!(
        pa.reachability,
        Some(Reachability::Relayed | Reachability::Holepunch)
    ));
    assert_eq!(
        a.status().await.unwrap().reachability,
        Reachability::Relayed
    );

    // Bulk data crosses the circuit.
    push_stream(&b, &a).await;

    // The relay counts reservations and circuits, and says it is a relay.
    let rs = wait_for_async("the relay's counters", WAIT, || async {
        let st = relay.status().await.ok()?;
        let s = st.nat.relay_server.clone()?;
        (s.reservations >= 2 && s.circuits_accepted_total >= 1).then_some(st)
    })
    .await;
    assert_eq!(rs.role, Role::Relay);
    let rb = wait_for_async("the relay to hear b", WAIT, || {
        active_peer(&relay, b.local_peer_id())
    })
    .await;
    assert_eq!(rb.connection, Some(ConnectionKind::Direct));
    assert_eq!(rb.reachability, Some(Reachability::Relayed));

    stop(vec![(b, tb), (a, ta), (relay, tr)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_streams_run_over_quic_only() {
    let quic_only = |bootstrap: Vec<String>| {
        let mut c = ServiceConfig::loopback("p2p-quic-test", Role::Rollout, bootstrap, None);
        c.network.quic = true;
        c.network.listen = vec!["/ip4/127.0.0.1/udp/0/quic-v1".into()];
        c
    };
    let (a, _ea, ta) =
        p2p::start([21; 32], quic_only(vec![]), &mut p2p::Registry::default()).unwrap();
    let a_addr = first_listen(&a).await;
    assert!(a_addr.to_string().contains("/quic-v1"), "{a_addr}");
    let boot = format!("{a_addr}/p2p/{}", a.local_peer_id());
    let (b, _eb, tb) = p2p::start(
        [22; 32],
        quic_only(vec![boot]),
        &mut p2p::Registry::default(),
    )
    .unwrap();
    let pa = wait_for_async("b to hear a over QUIC", WAIT, || {
        active_peer(&b, a.local_peer_id())
    })
    .await;
    assert_eq!(pa.connection, Some(ConnectionKind::Direct));
    assert!(
        pa.addrs.iter().all(|x| x.contains("/quic-v1")),
        "{:?}",
        pa.addrs
    );
    wait_for_async("a to hear b over QUIC", WAIT, || {
        active_peer(&a, b.local_peer_id())
    })
    .await;
    assert!(a.status().await.unwrap().quic);
    push_stream(&b, &a).await;
    stop(vec![(b, tb), (a, ta)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listeners_get_a_quic_companion() {
    let mut c = ServiceConfig::loopback("p2p-quic-auto", Role::Rollout, vec![], None);
    c.network.quic = true;
    let (a, _ea, ta) = p2p::start([31; 32], c, &mut p2p::Registry::default()).unwrap();
    let addrs = wait_for_async("both listeners", WAIT, || async {
        let l = a.listen_addrs().await.ok()?;
        (l.len() >= 2).then_some(l)
    })
    .await;
    let text: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    assert!(text.iter().any(|x| x.contains("/tcp/")), "{text:?}");
    assert!(text.iter().any(|x| x.contains("/quic-v1")), "{text:?}");
    stop(vec![(a, ta)]).await;
}
