//! The learner's publisher: hands the newest snapshot the training thread produced to the
//! dissemination engine, and measures each broadcast's T_bcast from the workers' install
//! reports (the rule is `control::capacity::broadcast_done`): it wakes at each change of the
//! peer view (`p2p::Client::peer_changes`: a heartbeat, a connection, a ban), so a
//! measurement ends with the heartbeat that completes it. A version that does not complete
//! is not dropped from the measure: it counts as a lower bound (`≥ t`,
//! `control::capacity::t_bcast_estimate`) — frozen when the learner stops waiting for it,
//! growing while it is in flight — so a starving swarm never shows the last good median.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use control::capacity::{
    broadcast_completed_at, broadcast_done, t_bcast_estimate, BcastEstimate, BcastSample,
};
use dissemination::Disseminator;
use tokio::sync::watch;

use storage::PayloadKind;

use super::{push_recent, Shared, Snapshot, NONE};
use crate::roles::delta::DeltaPublisher;

/// T_bcast samples kept for the median.
const RECENT_BCAST: usize = 16;
/// Payload sizes kept for the median bytes per version (the last this many versions).
const RECENT_PAYLOADS: usize = 1024;

/// What the publisher reports.
pub(super) struct PublishStats {
    /// The newest published version ([`NONE`] before the first).
    published: AtomicU64,
    /// The same, for the heartbeat feeder to wait on.
    published_tx: watch::Sender<Option<u64>>,
    snapshots: AtomicU64,
    /// Published versions whose T_bcast is still being measured, with their publish time.
    in_flight: Mutex<Vec<(u64, Instant)>>,
    /// The last [`RECENT_BCAST`] T_bcast measurements: exact, or lower bounds of versions
    /// given up (more than [`RECENT_BCAST`] newer ones in flight).
    t_bcast: Mutex<VecDeque<BcastSample>>,
    /// Bytes of the newest full payload in the shipping dtype (what a version costs without
    /// deltas or adapters), and the bytes each of the last [`RECENT_PAYLOADS`] published
    /// versions actually put on the chains (full, delta or adapter payload).
    bytes: Mutex<(Option<u64>, VecDeque<u64>)>,
    /// Bytes per published version by kind (delta snapshots only).
    payloads: Mutex<Option<PayloadTotals>>,
    /// The engine, for the catch-ups it served.
    engine: std::sync::OnceLock<Disseminator>,
}

/// Running sums behind [`crate::api::SnapshotPayloads`].
#[derive(Default, Clone, Copy)]
struct PayloadTotals {
    keyframes: u64,
    keyframe_bytes: u64,
    deltas: u64,
    delta_bytes: u64,
    /// Full bf16 bytes of the versions published as deltas.
    delta_full_bytes: u64,
    last: Option<(u64, bool)>,
}

impl Default for PublishStats {
    fn default() -> Self {
        PublishStats {
            published: AtomicU64::new(NONE),
            published_tx: watch::channel(None).0,
            snapshots: AtomicU64::new(0),
            in_flight: Mutex::new(Vec::new()),
            t_bcast: Mutex::new(VecDeque::new()),
            bytes: Mutex::new((None, VecDeque::new())),
            payloads: Mutex::new(None),
            engine: std::sync::OnceLock::new(),
        }
    }
}

impl PublishStats {
    pub fn published(&self) -> Option<u64> {
        let p = self.published.load(Ordering::Relaxed);
        (p != NONE).then_some(p)
    }

    /// Changes with every publication.
    pub fn subscribe(&self) -> watch::Receiver<Option<u64>> {
        self.published_tx.subscribe()
    }

    pub fn snapshots(&self) -> u64 {
        self.snapshots.load(Ordering::Relaxed)
    }

    /// Bytes of a full snapshot payload, and the median bytes published per version (upper
    /// median over the last [`RECENT_PAYLOADS`] versions); `None` before the first.
    pub fn payload_bytes(&self) -> (Option<u64>, Option<u64>) {
        let Ok(b) = self.bytes.lock() else {
            return (None, None);
        };
        let mut sizes: Vec<u64> = b.1.iter().copied().collect();
        sizes.sort_unstable();
        (b.0, sizes.get(sizes.len() / 2).copied())
    }

    /// Counts one published version: `payload` bytes went out, a full payload is `full`
    /// (`None`: unchanged, for a LoRA run's adapter versions).
    fn record_bytes(&self, payload: usize, full: Option<usize>) {
        if let Ok(mut b) = self.bytes.lock() {
            if let Some(full) = full {
                b.0 = Some(full as u64);
            }
            push_recent(&mut b.1, payload as u64, RECENT_PAYLOADS);
        }
    }

    /// Records one version published with delta snapshots on: `bytes` went out, `full` is
    /// its full bf16 size.
    fn record_payload(&self, bytes: u64, full: u64, delta: bool) {
        let Ok(mut p) = self.payloads.lock() else {
            return;
        };
        let t = p.get_or_insert_with(PayloadTotals::default);
        if delta {
            t.deltas += 1;
            t.delta_bytes += bytes;
            t.delta_full_bytes += full;
        } else {
            t.keyframes += 1;
            t.keyframe_bytes += bytes;
        }
        t.last = Some((bytes, delta));
    }

    /// Bytes per version by kind, the delta ratio and the catch-ups served (`None` until a
    /// version went out with delta snapshots on).
    pub fn payloads(&self) -> Option<crate::api::SnapshotPayloads> {
        let t = (*self.payloads.lock().ok()?)?;
        let mean = |sum: u64, n: u64| (n > 0).then(|| sum as f64 / n as f64);
        Some(crate::api::SnapshotPayloads {
            keyframes: t.keyframes,
            deltas: t.deltas,
            keyframe_bytes_mean: mean(t.keyframe_bytes, t.keyframes),
            delta_bytes_mean: mean(t.delta_bytes, t.deltas),
            delta_ratio: (t.delta_full_bytes > 0)
                .then(|| t.delta_bytes as f64 / t.delta_full_bytes as f64),
            last_bytes: t.last.map(|l| l.0),
            last_delta: t.last.map(|l| l.1),
            catch_ups_served: self
                .engine
                .get()
                .map_or(0, |d| d.counters().catch_ups_served),
        })
    }

    /// The T_bcast estimate from the recent measurements, and how many there are. Versions
    /// still in flight count too, as lower bounds, once they have taken longer than the
    /// estimate without them: until then they say nothing about it (every broadcast is in
    /// flight for a while), after that they are what it must show.
    pub fn t_bcast(&self) -> (Option<BcastEstimate>, usize) {
        let mut samples: Vec<BcastSample> = match self.t_bcast.lock() {
            Ok(t) => t.iter().copied().collect(),
            Err(_) => return (None, 0),
        };
        let so_far = t_bcast_estimate(&samples).map_or(0.0, |e| e.secs);
        if let Ok(f) = self.in_flight.lock() {
            samples.extend(
                f.iter()
                    .map(|(_, at)| at.elapsed().as_secs_f64())
                    .filter(|&secs| secs > so_far)
                    .map(|secs| BcastSample {
                        secs,
                        lower_bound: true,
                    }),
            );
        }
        (t_bcast_estimate(&samples), samples.len())
    }

    /// Ends the T_bcast measurement of every in-flight version the active workers (their
    /// installed versions and install times in `installed`) have installed. The end is the
    /// install time the reports state (`broadcast_completed_at`: a held-back report states
    /// its age), or now when one is unknown; never before the publication, never after now.
    fn measure(&self, installed: &[(Option<u64>, Option<Instant>)]) {
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return;
        };
        let versions: Vec<Option<u64>> = installed.iter().map(|(v, _)| *v).collect();
        let now = Instant::now();
        in_flight.retain(|(v, at)| {
            if !broadcast_done(&versions, *v) {
                return true;
            }
            let end = broadcast_completed_at(installed, *v).map_or(now, |t| t.clamp(*at, now));
            let secs = end.duration_since(*at).as_secs_f64();
            metrics::histogram!("learner_t_bcast_seconds").record(secs);
            tracing::debug!(version = v, secs, "snapshot broadcast complete");
            let exact = BcastSample {
                secs,
                lower_bound: false,
            };
            if let Ok(mut t) = self.t_bcast.lock() {
                push_recent(&mut t, exact, RECENT_BCAST);
            }
            false
        });
    }

    fn record(&self, version: u64, started: Instant) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.push((version, started));
            // Versions not installed while many newer ones were published are not measured
            // forever: each leaves its age as a lower bound.
            let excess = f.len().saturating_sub(RECENT_BCAST);
            for (v, at) in f.drain(..excess) {
                let secs = at.elapsed().as_secs_f64();
                tracing::debug!(
                    version = v,
                    secs,
                    "broadcast given up unfinished: T_bcast ≥ secs"
                );
                if let Ok(mut t) = self.t_bcast.lock() {
                    let bound = BcastSample {
                        secs,
                        lower_bound: true,
                    };
                    push_recent(&mut t, bound, RECENT_BCAST);
                }
            }
        }
        self.published.store(version, Ordering::Relaxed);
        self.published_tx.send_replace(Some(version));
        self.snapshots.fetch_add(1, Ordering::Relaxed);
    }
}

/// Publishes the newest snapshot handed over by the training thread, and measures each
/// published version's T_bcast as the workers' install reports arrive.
/// `keyframe_every` is `Some` when bf16 versions go out as deltas (`[broadcast] delta`).
pub(super) async fn run(
    dissem: Disseminator,
    client: p2p::Client,
    config_hash: [u8; 32],
    rx: watch::Receiver<Snapshot>,
    shared: Arc<Shared>,
    keyframe_every: Option<u64>,
) {
    tokio::join!(
        publish(
            dissem.clone(),
            &client,
            config_hash,
            rx,
            &shared,
            keyframe_every
        ),
        watch_peers(&client, &shared, &dissem)
    );
}

/// At every change of the peer view (a heartbeat carries a worker's installed version, a
/// worker joined or left): ends the T_bcast measurements it completes while a version is in
/// flight, and announces the next version's plan ahead of it when a standing plan is due
/// (`Disseminator::announce_if_due`: typically a swarm's first workers — the learner
/// publishes its start-up version before any joined, so they catch it up and would
/// otherwise meet their first push on cold streams — a worker that joined, and the first
/// version of each plan epoch, whenever nothing is in flight).
async fn watch_peers(client: &p2p::Client, shared: &Shared, dissem: &Disseminator) {
    let mut changes = client.peer_changes();
    while changes.changed().await.is_ok() {
        let Ok(peers) = client.peers().await else {
            return;
        };
        let in_flight = shared.publish.in_flight.lock().is_ok_and(|f| !f.is_empty());
        if in_flight {
            shared.publish.measure(&p2p::active_install_times(&peers));
        }
        if let Err(e) = dissem.announce_if_due(&peers).await {
            tracing::debug!(error = %e, "standing plan not announced");
        }
    }
}

async fn measure_now(client: &p2p::Client, shared: &Shared) -> Result<(), p2p::P2pError> {
    let peers = client.peers().await?;
    shared.publish.measure(&p2p::active_install_times(&peers));
    Ok(())
}

async fn publish(
    dissem: Disseminator,
    client: &p2p::Client,
    config_hash: [u8; 32],
    mut rx: watch::Receiver<Snapshot>,
    shared: &Shared,
    keyframe_every: Option<u64>,
) {
    let _ = shared.publish.engine.set(dissem.clone());
    let mut published = None::<u64>;
    // The previously published bf16 payload: deltas are taken against what went out, never
    // against re-rounded weights (versions the watch channel skipped never went out).
    let mut deltas = keyframe_every.map(DeltaPublisher::new);
    // The previously published adapter payload (a LoRA run): what a delta would save is
    // measured, not shipped.
    let mut last_adapters: Option<bytes::Bytes> = None;
    while rx.changed().await.is_ok() {
        let Some((version, full, kind)) = rx.borrow_and_update().clone() else {
            continue;
        };
        if published.is_some_and(|p| p >= version) {
            continue;
        }
        let t0 = Instant::now();
        let (bytes, kind, root) = match deltas.take() {
            // Adapters (a LoRA run, published without deltas) carry their own root.
            None => (
                full.clone(),
                kind,
                matches!(kind, PayloadKind::Adapter { .. })
                    .then(|| hex::encode(storage::hash_bytes(&full))),
            ),
            Some(d) => {
                // Passes over both payloads: off the async workers.
                let f = full.clone();
                let k = d.keyframe_every();
                let done = tokio::task::spawn_blocking(move || {
                    let p = d.prepare(version, &f);
                    (d, p)
                })
                .await;
                let (d, (bytes, kind, root)) = done.unwrap_or_else(|_| {
                    let root = storage::hash_bytes(&full);
                    (
                        DeltaPublisher::new(k),
                        (full.clone(), PayloadKind::Full, root),
                    )
                });
                deltas = Some(d);
                (bytes, kind, Some(hex::encode(root)))
            }
        };
        match dissem
            .publish_as(version, config_hash, bytes.clone(), kind, None)
            .await
        {
            Ok(report) => {
                published = Some(version);
                if let Some(d) = &mut deltas {
                    d.published(version, full.clone(), kind);
                    let counter = match kind {
                        PayloadKind::Delta { .. } => "learner_snapshot_deltas_total",
                        _ => "learner_snapshot_keyframes_total",
                    };
                    metrics::counter!(counter).increment(1);
                    shared.publish.record_payload(
                        bytes.len() as u64,
                        full.len() as u64,
                        kind != PayloadKind::Full,
                    );
                    metrics::gauge!("learner_snapshot_bytes").set(bytes.len() as f64);
                    metrics::gauge!("learner_snapshot_delta_ratio")
                        .set(bytes.len() as f64 / full.len().max(1) as f64);
                }
                // An adapter version is no full payload: the full size stays the base's.
                let full_len = (!matches!(kind, PayloadKind::Adapter { .. })).then_some(full.len());
                shared.publish.record_bytes(bytes.len(), full_len);
                shared.publish.record(version, t0);
                // Workers that installed while the pushes started end it at once.
                let _ = measure_now(client, shared).await;
                metrics::counter!("learner_snapshots_published_total").increment(1);
                metrics::gauge!("learner_published_version").set(version as f64);
                if matches!(kind, PayloadKind::Adapter { .. }) {
                    measure_adapters(&mut last_adapters, version, &bytes).await;
                }
                tracing::info!(
                    version,
                    bytes = bytes.len(),
                    full_bytes = full.len(),
                    delta = matches!(kind, PayloadKind::Delta { .. }),
                    adapter = matches!(kind, PayloadKind::Adapter { .. }),
                    // Absent for a full payload (its root is the manifest's).
                    root = root.as_deref().map(tracing::field::display),
                    chains = report.plan.plan.chains.len(),
                    secs = t0.elapsed().as_secs_f64(),
                    "snapshot published"
                );
            }
            Err(e) => tracing::warn!(version, error = %e, "publishing the snapshot failed"),
        }
    }
}

/// Logs what a delta of adapter version `version` (`bytes`) against the one published before
/// (`last`, then replaced) would save: the fraction of changed values and the delta's size
/// (`docs/broadcast.md`, "Deltas of adapters do not pay"). A pass over both payloads and a
/// trial delta: off the async workers.
async fn measure_adapters(last: &mut Option<bytes::Bytes>, version: u64, bytes: &bytes::Bytes) {
    let Some(prev) = last.replace(bytes.clone()) else {
        return;
    };
    let cur = bytes.clone();
    let measured =
        tokio::task::spawn_blocking(move || crate::roles::adapter::changed_fraction(&prev, &cur))
            .await;
    if let Ok(Some((changed, delta))) = measured {
        metrics::gauge!("learner_adapter_changed_fraction").set(changed);
        tracing::info!(
            version,
            changed,
            delta_ratio = ?delta,
            "adapter values changed since the last version"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_bytes_are_the_full_size_and_the_median_per_version() {
        let s = PublishStats::default();
        assert_eq!(s.payload_bytes(), (None, None));
        // A keyframe then two deltas: the median is a delta's size, the full size the
        // keyframe's.
        s.record_bytes(1000, Some(1000));
        s.record_bytes(120, Some(1000));
        s.record_bytes(80, Some(1000));
        assert_eq!(s.payload_bytes(), (Some(1000), Some(120)));
        for _ in 0..RECENT_PAYLOADS {
            s.record_bytes(10, Some(1000));
        }
        assert_eq!(s.payload_bytes(), (Some(1000), Some(10)));
        // A LoRA run's adapter versions leave the full size the base's.
        s.record_bytes(5, None);
        assert_eq!(s.payload_bytes().0, Some(1000));
    }
}
