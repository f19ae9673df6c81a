//! Two in-process network services on 127.0.0.1: heartbeats, transfer events feeding the ECHO
//! score, and a bulk stream over a test protocol (the slot the bulk-transfer crates build on).

use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use p2p::{Client, PeerId, Role, ServiceConfig, StreamProtocol, TransferEvent};

/// A protocol of this test only: p2p carries streams of any protocol its callers name.
const TEST_STREAM: StreamProtocol = StreamProtocol::new("/echo-swarm/p2p-test-stream/1.0.0");

fn config(bootstrap: Vec<String>) -> ServiceConfig {
    ServiceConfig::loopback("p2p-test", Role::Rollout, bootstrap, None)
}

async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let a_addr = wait_for("a to listen", || async {
        a.listen_addrs().await.ok()?.into_iter().next()
    })
    .await;
    let boot = format!("{a_addr}/p2p/{}", a.local_peer_id());
    let (b, _eb, tb) =
        p2p::start([2; 32], config(vec![boot]), &mut p2p::Registry::default()).unwrap();
    assert_eq!(b.local_peer_id(), p2p::peer_id_from_seed([2; 32]));

    // Heartbeats both ways.
    let pb = wait_for("a to hear b", || sees(&a, b.local_peer_id())).await;
    assert_eq!(pb.role, Some(Role::Rollout));
    wait_for("b to hear a", || sees(&b, a.local_peer_id())).await;

    // A transfer event of 12.5 MB in 1 s = 100 Mbit/s → Speed 100.
    let ev = TransferEvent {
        bytes: 12_500_000,
        duration: Duration::from_secs(1),
        success: true,
    };
    a.record_transfer(b.local_peer_id(), ev).await.unwrap();
    let pb = wait_for("the transfer to count", || async {
        sees(&a, b.local_peer_id())
            .await
            .filter(|p| p.score.speed > 99.999)
    })
    .await;
    assert!((pb.score.avg_speed_bps - 100e6).abs() < 1.0);

    // A bulk stream on a test protocol: b pushes bytes to a, a echoes their length.
    let mut incoming = a.stream_control().accept(TEST_STREAM).unwrap();
    let server = tokio::spawn(async move {
        let (peer, mut s) = incoming.next().await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        (peer, buf.len())
    });
    let payload = vec![7u8; 1 << 20];
    let mut s = b
        .stream_control()
        .open_stream(a.local_peer_id(), TEST_STREAM)
        .await
        .unwrap();
    s.write_all(&payload).await.unwrap();
    s.close().await.unwrap();
    let (peer, n) = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((peer, n), (b.local_peer_id(), payload.len()));

    a.shutdown().await;
    b.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), ta).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), tb).await;
}
