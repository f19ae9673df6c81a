//! Churn: short-lived nodes joining and leaving a swarm over and over, each with a fresh peer
//! id, must not grow a long-lived node's per-peer state without bound. The peer table (which
//! also holds each peer's strikes and heartbeat rate-limit state) forgets a silent,
//! disconnected peer after `membership::FORGET_AFTER_INTERVALS` heartbeat intervals (30 s
//! at the 100 ms used here) and never holds more than `membership::MAX_KNOWN_PEERS`.

use std::time::Duration;
use testkit::wait_for_async;

use p2p::{Client, PeerId, Role, ServiceConfig};

const CYCLES: u8 = 50;

fn config(bootstrap: Vec<String>) -> ServiceConfig {
    let mut c = ServiceConfig::loopback("p2p-churn", Role::Rollout, bootstrap, None);
    c.network.heartbeat_interval_ms = 100;
    c
}

struct Node {
    client: Client,
    _events: tokio::sync::mpsc::Receiver<p2p::Event>,
    task: tokio::task::JoinHandle<()>,
}

impl Node {
    fn start(seed: u8, cfg: ServiceConfig) -> Node {
        let (client, events, task) =
            p2p::start([seed; 32], cfg, &mut p2p::Registry::default()).unwrap();
        Node {
            client,
            _events: events,
            task,
        }
    }

    async fn bootstrap_addr(&self) -> String {
        let addr = wait_for_async("a node to listen", Duration::from_secs(30), || async {
            self.client.listen_addrs().await.ok()?.into_iter().next()
        })
        .await;
        format!("{addr}/p2p/{}", self.client.local_peer_id())
    }

    async fn stop(self) {
        self.client.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// The peer ids in `client`'s peer table, and whether `peer` is active there.
async fn table(client: &Client) -> Option<Vec<p2p::PeerStatus>> {
    client.status().await.ok().map(|s| s.peers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_short_lived_nodes_leave_no_trace_in_the_peer_table() {
    let test = async {
        let hub = Node::start(1, config(vec![]));
        let boot = hub.bootstrap_addr().await;
        let stable = Node::start(2, config(vec![boot.clone()]));
        let stable_id = stable.client.local_peer_id();

        let mut churned: Vec<PeerId> = Vec::new();
        let mut max_known = 0;
        for i in 0..CYCLES {
            let node = Node::start(10 + i, config(vec![boot.clone()]));
            let id = node.client.local_peer_id();
            wait_for_async(
                "the hub to hear a short-lived node",
                Duration::from_secs(30),
                || async {
                    table(&hub.client)
                        .await?
                        .into_iter()
                        .find(|p| p.peer_id == id.to_string() && p.active)
                },
            )
            .await;
            max_known = max_known.max(table(&hub.client).await.unwrap().len());
            node.stop().await;
            churned.push(id);
        }
        // Everyone was seen: the table did grow while they were around.
        assert!(max_known >= 2, "max known {max_known}");

        // Once their heartbeats are older than the forget window, the churned ids are gone
        // and only the stable peer remains.
        let rows = wait_for_async(
            "the churned peers to be forgotten",
            Duration::from_secs(90),
            || async {
                let rows = table(&hub.client).await?;
                let left = rows
                    .iter()
                    .filter(|r| churned.iter().any(|c| c.to_string() == r.peer_id))
                    .count();
                (left == 0).then_some(rows)
            },
        )
        .await;
        assert!(
            rows.len() <= 1,
            "peer table after churn: {} rows",
            rows.len()
        );
        // The stable peer is still there and active under the (effective) alive window.
        let st = wait_for_async(
            "the stable peer to be active",
            Duration::from_secs(30),
            || async {
                table(&hub.client)
                    .await?
                    .into_iter()
                    .find(|p| p.peer_id == stable_id.to_string() && p.active)
            },
        )
        .await;
        assert!(!st.banned && st.strikes == 0);
        // Churn is not misbehaviour: nobody was struck or banned.
        let s = hub.client.status().await.unwrap();
        assert!(s.peers.iter().all(|p| !p.banned));
        assert!(
            s.counters.heartbeats_received >= u64::from(CYCLES),
            "heartbeats received {}",
            s.counters.heartbeats_received
        );
        stable.stop().await;
        hub.stop().await;
    };
    tokio::time::timeout(Duration::from_secs(300), test)
        .await
        .expect("the churn test finished in time");
}
