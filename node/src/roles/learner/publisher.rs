//! The learner's publisher: hands the newest snapshot the training thread produced to the
//! dissemination engine, and measures each broadcast's T_bcast from the workers' install
//! reports (the rule is `control::capacity::broadcast_done`): it wakes at each change of the
//! peer view (`p2p::Client::peer_changes`: a heartbeat, a connection, a ban), so a
//! measurement ends with the heartbeat that completes it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use control::capacity::{broadcast_completed_at, broadcast_done};
use dissemination::Disseminator;
use tokio::sync::watch;

use super::{push_recent, Shared, Snapshot, NONE};

/// T_bcast samples kept for the median.
const RECENT_BCAST: usize = 16;

/// What the publisher reports.
pub(super) struct PublishStats {
    /// The newest published version ([`NONE`] before the first).
    published: AtomicU64,
    /// The same, for the heartbeat feeder to wait on.
    published_tx: watch::Sender<Option<u64>>,
    snapshots: AtomicU64,
    /// Published versions whose T_bcast is still being measured, with their publish time.
    in_flight: Mutex<Vec<(u64, Instant)>>,
    /// The last [`RECENT_BCAST`] T_bcast measurements (seconds).
    t_bcast: Mutex<VecDeque<f64>>,
}

impl Default for PublishStats {
    fn default() -> Self {
        PublishStats {
            published: AtomicU64::new(NONE),
            published_tx: watch::channel(None).0,
            snapshots: AtomicU64::new(0),
            in_flight: Mutex::new(Vec::new()),
            t_bcast: Mutex::new(VecDeque::new()),
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

    /// Median of the recent T_bcast measurements and how many there are.
    pub fn t_bcast(&self) -> (Option<f64>, usize) {
        match self.t_bcast.lock() {
            Ok(t) => (super::median(t.iter().copied()), t.len()),
            Err(_) => (None, 0),
        }
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
            if let Ok(mut t) = self.t_bcast.lock() {
                push_recent(&mut t, secs, RECENT_BCAST);
            }
            false
        });
    }

    fn record(&self, version: u64, started: Instant) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.push((version, started));
            // Versions nobody installs (no workers yet) are not measured forever.
            let excess = f.len().saturating_sub(RECENT_BCAST);
            f.drain(..excess);
        }
        self.published.store(version, Ordering::Relaxed);
        self.published_tx.send_replace(Some(version));
        self.snapshots.fetch_add(1, Ordering::Relaxed);
    }
}

/// Publishes the newest snapshot handed over by the training thread, and measures each
/// published version's T_bcast as the workers' install reports arrive.
pub(super) async fn run(
    dissem: Disseminator,
    client: p2p::Client,
    config_hash: [u8; 32],
    rx: watch::Receiver<Snapshot>,
    shared: Arc<Shared>,
) {
    tokio::join!(
        publish(dissem, &client, config_hash, rx, &shared),
        measure(&client, &shared)
    );
}

/// Ends T_bcast measurements: at every change of the peer view (a heartbeat carries a
/// worker's installed version) while a version is in flight.
async fn measure(client: &p2p::Client, shared: &Shared) {
    let mut changes = client.peer_changes();
    while changes.changed().await.is_ok() {
        let in_flight = shared.publish.in_flight.lock().is_ok_and(|f| !f.is_empty());
        if in_flight && measure_now(client, shared).await.is_err() {
            return;
        }
    }
}

/// One T_bcast check against the peer view as it is now.
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
) {
    let mut published = None::<u64>;
    while rx.changed().await.is_ok() {
        let Some((version, bytes)) = rx.borrow_and_update().clone() else {
            continue;
        };
        if published.is_some_and(|p| p >= version) {
            continue;
        }
        let t0 = Instant::now();
        match dissem
            .publish(version, config_hash, bytes.clone(), None)
            .await
        {
            Ok(report) => {
                published = Some(version);
                shared.publish.record(version, t0);
                // Workers that installed while the pushes started end it at once.
                let _ = measure_now(client, shared).await;
                metrics::counter!("learner_snapshots_published_total").increment(1);
                metrics::gauge!("learner_published_version").set(version as f64);
                tracing::info!(
                    version,
                    bytes = bytes.len(),
                    chains = report.plan.plan.chains.len(),
                    secs = t0.elapsed().as_secs_f64(),
                    "snapshot published"
                );
            }
            Err(e) => tracing::warn!(version, error = %e, "publishing the snapshot failed"),
        }
    }
}
