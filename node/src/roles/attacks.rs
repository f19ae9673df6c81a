//! Test-only attacks carried out at the network layer by a worker started with
//! `ECHO_NODE_MISBEHAVE` ([`crate::misbehave`]): the ones that need no change to how a role
//! produces or serves data.
//!
//! - `pending_inflation`: every heartbeat claims `pending = u64::MAX` ([`pending_claim`], the
//!   one hook in the heartbeat feeder) — a scheduler or puller that trusts the claim would
//!   keep pulling from (or favouring) this worker.
//! - `backlog_inflation` (its claim part): heartbeats claim 64× the groups held, below the
//!   claim limit ([`pending_claim`]); the rollout role keeps the large backlog itself.
//! - `sybil_rekey` (its re-key part): once the learner has been unreachable for
//!   [`REKEY_AFTER`] (its ban closes every connection), the worker wipes its identity — key,
//!   group counter, store, proof of work — and exits with `REKEY_EXIT_CODE`; the harness
//!   starts it again, and it comes back under a fresh key ([`spawn`]).
//! - `mu_inflation`: every heartbeat claims μ = [`crate::misbehave::INFLATED_MU`] groups/s
//!   ([`mu_claim`]) — a scheduler that trusts the claim activates this worker first and sends
//!   the honest ones to standby.
//! - `heartbeat_spam`: well-formed, correctly encoded heartbeats published about 50 times per
//!   heartbeat interval ([`spawn`]) on top of the service's own ones.
//! - `replay_after_restart`: every learner-signed message seen on the snapshot and plan
//!   topics is recorded ([`tap`]) and the oldest ones are re-published periodically, so that
//!   a worker that restarts (and may have forgotten what it has seen) is offered old
//!   manifests and activation orders.
//!
//! Owns: these attacks and nothing else. Must not touch: the roles' data path (the
//! other attacks live at their role's hook), the defences (they must catch this as they
//! would any stranger). An honest node never reaches this module: every entry point checks
//! [`crate::misbehave::Misbehaviour::has`] first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Probe, Tasks};
use crate::misbehave::{Attack, Misbehaviour};
use crate::state::NodeState;
use tokio::sync::mpsc;

/// Heartbeats sent per heartbeat interval by `heartbeat_spam`.
pub const SPAM_FACTOR: u32 = 50;
/// Signed messages kept for replay (the first ones seen: the oldest are the point).
const REPLAY_KEEP: usize = 64;
/// How many of the oldest recorded messages each replay round re-publishes.
const REPLAY_BATCH: usize = 4;
/// One replay round every this many heartbeat intervals: every interval, so that a worker
/// that just restarted is offered the old messages before the next genuine ones reach it.
const REPLAY_EVERY_INTERVALS: u32 = 1;

/// The `pending` field this node's heartbeat claims: the truth for an honest node,
/// `u64::MAX` under `pending_inflation`.
pub fn pending_claim(m: &Misbehaviour, real: u64) -> u64 {
    if m.has(Attack::PendingInflation) {
        u64::MAX
    } else if m.has(Attack::BacklogInflation) {
        real.saturating_mul(crate::misbehave::BACKLOG_CLAIM_FACTOR)
            .clamp(1, p2p::MAX_PENDING_CLAIM)
    } else {
        real
    }
}

/// The delivery receipts this node signs: the truth for an honest node; under
/// `framing_receipts`, each says its parent sent nothing at all (no hello for this or a newer
/// version, no byte) — what a silent forwarder's child would sign.
pub fn receipts_claim(
    m: &Misbehaviour,
    real: Vec<p2p::DeliveryReceipt>,
) -> Vec<p2p::DeliveryReceipt> {
    if !m.has(Attack::FramingReceipts) {
        return real;
    }
    real.into_iter()
        .map(|r| p2p::DeliveryReceipt {
            bytes: 0,
            duplicates: 0,
            spoke: false,
            hello_ms: None,
            first_ms: None,
            last_ms: None,
            ..r
        })
        .collect()
}

/// The μ this node's heartbeat claims: its measured rate for an honest node,
/// [`crate::misbehave::INFLATED_MU`] under `mu_inflation`.
pub fn mu_claim(m: &Misbehaviour, real: f64) -> f64 {
    if m.has(Attack::MuInflation) {
        crate::misbehave::INFLATED_MU
    } else {
        real
    }
}

/// The device this node's heartbeat claims: the truth for an honest node, a CUDA device
/// sampling in bf16 under `false_dtype`.
pub fn device_claim(m: &Misbehaviour, real: p2p::DeviceReport) -> p2p::DeviceReport {
    if m.has(Attack::FalseDtype) {
        p2p::DeviceReport {
            kind: "cuda".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            dtype: Some("bf16".into()),
            ..real
        }
    } else {
        real
    }
}

/// The pending groups a worker keeps before it pauses: far more than configured under
/// `backlog_inflation`, so that its real backlog stands behind its inflated claim.
pub fn pending_limit(m: &Misbehaviour, configured: u64) -> u64 {
    if m.has(Attack::BacklogInflation) {
        crate::misbehave::BACKLOG_PENDING
    } else {
        configured
    }
}

/// How long a `sybil_rekey` worker waits, disconnected from the learner, before it takes
/// itself for banned and re-keys.
pub const REKEY_AFTER: Duration = Duration::from_secs(4);

/// The `sybil_rekey` watch: once connected to the learner and then cut off for
/// [`REKEY_AFTER`], wipe this node's identity and exit.
async fn rekey_when_banned(client: p2p::Client, state: Arc<NodeState>, learner: p2p::PeerId) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let (mut met, mut cut_since) = (false, None::<std::time::Instant>);
    loop {
        tick.tick().await;
        let Ok(net) = client.status().await else {
            return;
        };
        let connected = net
            .peers
            .iter()
            .any(|p| p.peer_id == learner.to_base58() && p.connected);
        if connected {
            met = true;
            cut_since = None;
            continue;
        }
        if !met {
            continue;
        }
        let since = *cut_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < REKEY_AFTER {
            continue;
        }
        let dir = &state.config.data_dir;
        tracing::warn!("sybil_rekey: cut off from the learner, wiping this identity to come back under a new key");
        for f in [
            state.config.key_path(),
            dir.join("rollout.seq"),
            dir.join(crate::admission::WORK_FILE),
        ] {
            let _ = std::fs::remove_file(f);
        }
        // The store's groups carry the old producer id; a new identity starts empty.
        let _ = std::fs::remove_dir_all(dir.join("trajectories"));
        std::process::exit(crate::misbehave::REKEY_EXIT_CODE);
    }
}

/// The learner-signed gossip a `replay_after_restart` worker has seen, oldest first.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<VecDeque<Recorded>>>);

/// One recorded message: its topic and its bytes, as they arrived.
pub type Recorded = (p2p::TopicKind, Vec<u8>);

impl Recorder {
    /// Keeps `data` if it is new and there is room (the first [`REPLAY_KEEP`] distinct ones).
    pub fn record(&self, topic: p2p::TopicKind, data: &[u8]) {
        let Ok(mut q) = self.0.lock() else { return };
        if q.len() < REPLAY_KEEP && !q.iter().any(|(_, d)| d == data) {
            q.push_back((topic, data.to_vec()));
        }
    }

    /// The oldest `n` recorded messages.
    pub fn oldest(&self, n: usize) -> Vec<Recorded> {
        self.0
            .lock()
            .map(|q| q.iter().take(n).cloned().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |q| q.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Puts a recorder between the network service's events and their consumer when this node
/// replays; otherwise hands `events` back untouched. The events are forwarded unchanged (the
/// dissemination engine still judges every one).
pub fn tap(
    m: &Misbehaviour,
    mut events: mpsc::Receiver<p2p::Event>,
) -> (mpsc::Receiver<p2p::Event>, Option<Recorder>) {
    if !m.has(Attack::ReplayAfterRestart) {
        return (events, None);
    }
    let recorder = Recorder::default();
    let (tx, rx) = mpsc::channel(1024);
    let rec = recorder.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if let p2p::Event::Gossip { topic, data, .. } = &ev {
                if matches!(topic, p2p::TopicKind::Snapshots | p2p::TopicKind::Plans) {
                    rec.record(*topic, data);
                }
            }
            if tx.send(ev).await.is_err() {
                break;
            }
        }
    });
    (rx, Some(recorder))
}

/// Starts this node's periodic network attacks (none for an honest node): heartbeat spam and
/// the replay of `recorder`'s messages, as tasks of `tasks` (the caller stops them at shutdown).
pub fn spawn(
    tasks: &Tasks,
    state: &Arc<NodeState>,
    client: &p2p::Client,
    probe: Probe,
    recorder: Option<Recorder>,
) {
    let m = &state.misbehave;
    let interval = Duration::from_millis(state.config.network.heartbeat_interval_ms.max(1));
    if m.has(Attack::HeartbeatSpam) {
        let (client, state) = (client.clone(), state.clone());
        tasks.spawn(async move {
            let period = (interval / SPAM_FACTOR).max(Duration::from_millis(1));
            let mut tick = tokio::time::interval(period);
            let started = storage::unix_ms();
            let mut seq = 0u64;
            let mut sent = 0u64;
            loop {
                tick.tick().await;
                seq += 1;
                let (installed_version, mu) = probe();
                let hb = spam_heartbeat(&state, installed_version, mu, started, seq);
                match client.publish(p2p::TopicKind::Heartbeat, hb.encode()).await {
                    Ok(()) => sent += 1,
                    Err(p2p::P2pError::ServiceStopped) => break,
                    Err(_) => {} // no peers yet, or gossipsub refused it: keep trying
                }
                if seq.is_multiple_of(500) {
                    tracing::warn!(sent, tried = seq, "heartbeat_spam: heartbeats published");
                }
            }
        });
    }
    if m.has(Attack::SybilRekey) {
        if let Some(learner) = state
            .config
            .learner_public_key
            .as_deref()
            .and_then(|k| storage::keys::parse_public_key(k).ok())
            .and_then(|k| p2p::peer_id_from_public(k.to_bytes()).ok())
        {
            tasks.spawn(rekey_when_banned(client.clone(), state.clone(), learner));
        }
    }
    if let Some(rec) = recorder {
        let client = client.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(interval * REPLAY_EVERY_INTERVALS);
            let (mut replayed, mut rounds) = (0u64, 0u64);
            loop {
                tick.tick().await;
                rounds += 1;
                for (topic, data) in rec.oldest(REPLAY_BATCH) {
                    if client.publish(topic, data).await.is_ok() {
                        replayed += 1;
                    }
                }
                if replayed > 0 && rounds.is_multiple_of(10) {
                    tracing::warn!(
                        replayed,
                        recorded = rec.len(),
                        "replay_after_restart: old signed messages re-published"
                    );
                }
            }
        });
    }
}

/// A heartbeat that passes every check of `p2p::Heartbeat::decode`: only its rate is wrong.
pub fn spam_heartbeat(
    state: &NodeState,
    installed_version: Option<u64>,
    mu: f64,
    started_unix_ms: u64,
    seq: u64,
) -> p2p::Heartbeat {
    let now = storage::unix_ms();
    p2p::Heartbeat {
        v: p2p::messages::HEARTBEAT_VERSION,
        swarm_id: state.config.swarm_id.clone(),
        role: state.config.role,
        node_version: crate::state::NODE_VERSION.to_string(),
        installed_version,
        mu: match mu_claim(&state.misbehave, mu) {
            mu if mu.is_finite() => mu.clamp(0.0, 1e9),
            _ => 0.0,
        },
        cost_per_hour: state.config.network.cost_per_hour,
        availability: 1.0,
        pending: pending_claim(&state.misbehave, state.trajectories.pending().unwrap_or(0)),
        forward_rate_bps: 0.0,
        receive_rate_bps: 0.0,
        started_unix_ms,
        // Distinct content every time (gossip de-duplicates identical messages).
        sent_unix_ms: now,
        seq,
        reachability: None,
        addrs: Vec::new(),
        device: None,
        receipts: Vec::new(),
        admission: None,
        install_age_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pending_inflation_inflates_the_claim() {
        let honest = Misbehaviour::default();
        assert_eq!(pending_claim(&honest, 7), 7);
        let other = Misbehaviour::parse("heartbeat_spam").unwrap();
        assert_eq!(pending_claim(&other, 7), 7);
        let bad = Misbehaviour::parse("pending_inflation").unwrap();
        assert_eq!(pending_claim(&bad, 7), u64::MAX);
        // A backlog claim stays below the heartbeat's limit: a lie nothing can refuse.
        let backlog = Misbehaviour::parse("backlog_inflation").unwrap();
        assert_eq!(
            pending_claim(&backlog, 7),
            7 * crate::misbehave::BACKLOG_CLAIM_FACTOR
        );
        assert_eq!(pending_claim(&backlog, u64::MAX), p2p::MAX_PENDING_CLAIM);
    }

    #[test]
    fn only_mu_inflation_inflates_mu() {
        assert_eq!(mu_claim(&Misbehaviour::default(), 1.5), 1.5);
        let other = Misbehaviour::parse("pending_inflation").unwrap();
        assert_eq!(mu_claim(&other, 1.5), 1.5);
        let bad = Misbehaviour::parse("mu_inflation").unwrap();
        assert_eq!(mu_claim(&bad, 1.5), crate::misbehave::INFLATED_MU);
    }

    #[test]
    fn the_recorder_keeps_the_first_distinct_messages_oldest_first() {
        let r = Recorder::default();
        r.record(p2p::TopicKind::Snapshots, b"v1");
        r.record(p2p::TopicKind::Snapshots, b"v1");
        r.record(p2p::TopicKind::Plans, b"plan1");
        for i in 0..(2 * REPLAY_KEEP) {
            r.record(p2p::TopicKind::Snapshots, format!("v{}", i + 2).as_bytes());
        }
        assert_eq!(r.len(), REPLAY_KEEP);
        let oldest = r.oldest(2);
        assert_eq!(oldest[0], (p2p::TopicKind::Snapshots, b"v1".to_vec()));
        assert_eq!(oldest[1], (p2p::TopicKind::Plans, b"plan1".to_vec()));
    }

    #[tokio::test]
    async fn tap_forwards_every_event_and_records_only_signed_topics() {
        let (tx, rx) = mpsc::channel(8);
        let m = Misbehaviour::parse("replay_after_restart").unwrap();
        let (mut out, rec) = tap(&m, rx);
        let rec = rec.expect("a replaying node records");
        let peer = p2p::PeerId::random();
        let gossip = |topic, data: &[u8]| p2p::Event::Gossip {
            topic,
            message_id: p2p::MessageId::new(data),
            propagation_source: peer,
            source: Some(peer),
            data: data.to_vec(),
        };
        tx.send(gossip(p2p::TopicKind::Snapshots, b"manifest"))
            .await
            .unwrap();
        tx.send(gossip(p2p::TopicKind::Heartbeat, b"hb"))
            .await
            .unwrap();
        tx.send(p2p::Event::PeerConnected(peer)).await.unwrap();
        drop(tx);
        let mut n = 0;
        while out.recv().await.is_some() {
            n += 1;
        }
        assert_eq!(n, 3, "every event reaches the consumer");
        assert_eq!(
            rec.oldest(10),
            vec![(p2p::TopicKind::Snapshots, b"manifest".to_vec())]
        );
        let honest = Misbehaviour::default();
        let (_tx2, rx2) = mpsc::channel::<p2p::Event>(1);
        assert!(
            tap(&honest, rx2).1.is_none(),
            "an honest node is not tapped"
        );
    }
}
