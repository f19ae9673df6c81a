//! Broadcast measurements (in-process, loopback, in-node caps). Ignored by default — they take
//! a minute or more; run with
//! `cargo test -p dissemination --release --test bench -- --ignored --nocapture`
//! and read the JSON lines they print (numbers in `docs/broadcast.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dissemination::{BroadcastMode, DisseminationConfig, DisseminationEvent, Disseminator};
use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use p2p::{Client, ServiceConfig};
use rand::RngCore;
use storage::{ChunkStore, NodeKey};
use tokio::sync::mpsc::UnboundedReceiver;

const SWARM: &str = "diss-bench";
const LEARNER_SEED: [u8; 32] = [1; 32];
/// The raw-stream baseline's own protocol: plain bytes, no framing.
const RAW_STREAM: libp2p::StreamProtocol =
    libp2p::StreamProtocol::new("/echo-swarm-bench/raw/1.0.0");

struct Node {
    client: Client,
    d: Disseminator,
    events: UnboundedReceiver<DisseminationEvent>,
    store: Arc<ChunkStore>,
    addr: String,
    _dir: tempfile::TempDir,
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
    let mut cfg = ServiceConfig::loopback(
        SWARM,
        role,
        bootstrap,
        Some(p2p::peer_id_from_seed(LEARNER_SEED)),
    );
    cfg.network.heartbeat_interval_ms = 500;
    let (client, p2p_events, _task) = p2p::start(seed, cfg, &mut p2p::Registry::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChunkStore::open(dir.path(), 2).unwrap());
    let key = NodeKey::from_seed(LEARNER_SEED);
    let mut dcfg = DisseminationConfig::new(SWARM, key.verifying_key());
    if seed == LEARNER_SEED {
        dcfg.signing_key = Some(key.signing_key().clone());
    }
    tweak(&mut dcfg);
    let (d, events) = Disseminator::start(dcfg, client.clone(), store.clone()).unwrap();
    tokio::spawn(dissemination::drive(d.clone(), client.clone(), p2p_events));
    let addr = loop {
        if let Some(a) = client.listen_addrs().await.unwrap().into_iter().next() {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Node {
        addr: format!("{addr}/p2p/{}", client.local_peer_id()),
        client,
        d,
        events,
        store,
        _dir: dir,
    }
}

async fn wait_installed(n: &mut Node, version: u64) {
    loop {
        match tokio::time::timeout(Duration::from_secs(300), n.events.recv()).await {
            Ok(Some(DisseminationEvent::Installed { version: v, .. })) if v == version => return,
            Ok(Some(_)) => {}
            _ => panic!("no install"),
        }
    }
}

async fn run_broadcast(n: u8, mode: BroadcastMode, size: usize, bw: f64, b0: f64) -> f64 {
    let chunk = 1u32 << 20;
    let learner = start_node(LEARNER_SEED, vec![], |c| {
        c.mode = mode;
        c.chunk_size = chunk;
        c.uplink_mbps = b0;
        c.plan.learner_mbps = b0;
        c.plan.worker_mbps = bw;
    })
    .await;
    let mut boot = vec![learner.addr.clone()];
    let mut workers = Vec::new();
    for k in 0..n {
        let w = start_node([10 + k; 32], boot.clone(), |c| {
            c.uplink_mbps = bw;
            c.downlink_mbps = bw;
        })
        .await;
        boot.push(w.addr.clone());
        workers.push(w);
    }
    let ids: Vec<(p2p::PeerId, f64)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (w.client.local_peer_id(), 90.0 - i as f64 * 0.1))
        .collect();
    // Let connections settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut payload = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut payload);
    let payload = bytes::Bytes::from(payload);
    let t0 = Instant::now();
    let report = learner
        .d
        .publish(1, [0; 32], payload, Some(ids))
        .await
        .unwrap();
    let publish_s = t0.elapsed().as_secs_f64();
    for w in &mut workers {
        wait_installed(w, 1).await;
    }
    let t = t0.elapsed().as_secs_f64();
    let max_len = report
        .plan
        .plan
        .chains
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    let chain_bound = control::plan::chain_bound_s(size as f64, chunk as f64, bw, max_len);
    let star_bound = control::plan::star_bound_s(size as f64, bw, b0, n as usize);
    println!(
        "{{\"scenario\":\"broadcast\",\"mode\":\"{}\",\"n\":{n},\"size_bytes\":{size},\"chunk_bytes\":{chunk},\"bw_mbps\":{bw},\"b0_mbps\":{b0},\"chains\":{},\"max_len\":{max_len},\"t_bcast_s\":{t:.3},\"publish_s\":{publish_s:.3},\"chain_bound_s\":{chain_bound:.3},\"star_bound_s\":{star_bound:.3}}}",
        if mode == BroadcastMode::Chain { "chain" } else { "star" },
        report.plan.plan.chains.len()
    );
    for w in workers.into_iter().chain([learner]) {
        w.d.shutdown();
        w.client.shutdown().await;
    }
    t
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: about a minute per N; run explicitly"]
async fn broadcast_chain_vs_star() {
    let size = std::env::var("BENCH_SIZE_MB")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(64)
        * 1_000_000;
    let ns: Vec<u8> = std::env::var("BENCH_N")
        .unwrap_or_else(|_| "4,8,16".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    }
    let modes = std::env::var("BENCH_MODES").unwrap_or_else(|_| "chain,star".into());
    for n in ns {
        if modes.contains("chain") {
            run_broadcast(n, BroadcastMode::Chain, size, 100.0, 300.0).await;
        }
        if modes.contains("star") {
            run_broadcast(n, BroadcastMode::Star, size, 100.0, 300.0).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: single-hop throughput, uncapped"]
async fn single_hop_throughput_vs_raw_stream() {
    let size = 256_000_000usize;
    let learner = start_node(LEARNER_SEED, vec![], |c| c.chunk_size = 1 << 20).await;
    let mut w = start_node([10; 32], vec![learner.addr.clone()], |_| {}).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Raw libp2p stream over the same connection (a protocol of this benchmark's own).
    let mut incoming = w.client.stream_control().accept(RAW_STREAM).unwrap();
    let sink = tokio::spawn(async move {
        let (_, mut s) = incoming.next().await.unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0usize;
        loop {
            let k = s.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    let block = vec![7u8; 1 << 20];
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut s = learner
        .client
        .stream_control()
        .open_stream(w.client.local_peer_id(), RAW_STREAM)
        .await
        .unwrap();
    for _ in 0..size / block.len() {
        s.write_all(&block).await.unwrap();
    }
    s.close().await.unwrap();
    let n = sink.await.unwrap();
    let raw = t0.elapsed().as_secs_f64();
    let raw_cpu = cpu_seconds() - cpu0;
    assert_eq!(n, size / block.len() * block.len());
    let mut payload = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut payload);
    let payload = bytes::Bytes::from(payload);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    learner
        .d
        .publish(
            1,
            [0; 32],
            payload.clone(),
            Some(vec![(w.client.local_peer_id(), 90.0)]),
        )
        .await
        .unwrap();
    let publish_s = t0.elapsed().as_secs_f64();
    // When the last chunk was verified and held, then when the install (assembly + root hash)
    // was reported.
    let mut last_chunk_s = 0.0;
    loop {
        match tokio::time::timeout(Duration::from_secs(300), w.events.recv()).await {
            Ok(Some(DisseminationEvent::Progress { stored, total, .. })) if stored == total => {
                last_chunk_s = t0.elapsed().as_secs_f64();
            }
            Ok(Some(DisseminationEvent::Installed { version: 1, .. })) => {
                // The last chunk's progress event can trail the install's.
                if last_chunk_s == 0.0 {
                    last_chunk_s = t0.elapsed().as_secs_f64();
                }
                break;
            }
            Ok(Some(_)) => {}
            _ => panic!("no install"),
        }
    }
    let verified = t0.elapsed().as_secs_f64();
    let verified_cpu = cpu_seconds() - cpu0;
    // The chunk files are written behind the install (the stores' memory tiers): how long
    // until both ends have everything on disk too.
    let (ls, ws) = (learner.store.clone(), w.store.clone());
    tokio::task::spawn_blocking(move || {
        ls.flush();
        ws.flush();
    })
    .await
    .unwrap();
    let persisted = t0.elapsed().as_secs_f64();
    println!(
        "{{\"scenario\":\"single_hop\",\"size_bytes\":{size},\"raw_stream_mb_s\":{:.1},\"verified_mb_s\":{:.1},\"verified_excluding_publish_mb_s\":{:.1},\"overhead_pct\":{:.1},\"overhead_excluding_publish_pct\":{:.1},\"publish_s\":{publish_s:.3},\"last_chunk_s\":{last_chunk_s:.3},\"installed_s\":{verified:.3},\"persisted_s\":{persisted:.3},\"raw_cpu_s\":{raw_cpu:.2},\"verified_cpu_s\":{verified_cpu:.2}}}",
        n as f64 / raw / 1e6,
        size as f64 / verified / 1e6,
        size as f64 / (verified - publish_s) / 1e6,
        (verified / raw - 1.0) * 100.0,
        ((verified - publish_s) / raw - 1.0) * 100.0,
    );
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}
