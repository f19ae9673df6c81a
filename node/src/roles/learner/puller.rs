//! The learner's puller: keeps the trajectory buffer topped up from the rollout workers.
//!
//! Every `pull_interval_ms`, and whenever the training thread takes a batch or finds none, it
//! tops the buffer up to its target: the shortfall (counting only groups still admissible
//! after the next step, [`learner::Window::buffered_from`]), less what pulls still in flight
//! asked for, split over the workers with no pull in flight by
//! [`control::pulls::allocate_capped`] in proportion to each worker's credit: what it claims
//! (`pending`) bounded by what the learner saw it deliver ([`control::pulls::PullLedger`]). Pulls run concurrently and independently — a worker that
//! is slow to answer (installing a snapshot, overloaded) holds back only its own share, not the
//! next round of pulls from the others.
//!
//! Every pull carries the learner's [`GroupLimits`] (its model's vocabulary and context, the
//! log-prob floor, the group size) and its verification layers ([`super::verify`]):
//! `pull::pull_verified` stores only groups that pass both and that name the worker as their
//! producer, and reports the others per reason. Every refused group is a strike against the
//! worker ([`super::verify::strike_reason`]), and so is a lease larger than asked for.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::pulls::{allocate_capped, LedgerParams, PullLedger};
use futures::stream::{FuturesUnordered, StreamExt};
use storage::record::GroupLimits;
use storage::TrajectoryStore;

use super::Shared;
use crate::config::NodeConfig;

/// One pull from one worker gives up after this long (its lease on the worker expires). Every
/// read of the pull already has its own deadline (`pull::READ_TIMEOUT`); this bounds a peer
/// that trickles each frame just inside it.
const PULL_TIMEOUT: Duration = Duration::from_secs(120);

/// The puller's settings, taken from the resolved config.
pub(super) struct PullSettings {
    /// Groups to keep buffered.
    target: u64,
    interval: Duration,
    /// Lease time asked of the workers.
    lease_ttl: Duration,
    /// What a pulled group must satisfy to be stored.
    limits: GroupLimits,
    /// The verification layers run on every group that passes `limits`.
    verifier: Arc<dyn pull::GroupVerifier>,
    /// Where the spot check reads each worker's sampling dtype; refreshed every round.
    dtypes: super::spot::WorkerDtypes,
}

impl PullSettings {
    pub fn of(config: &NodeConfig, verifier: Arc<dyn pull::GroupVerifier>) -> Self {
        PullSettings {
            target: config.learner.buffer_target(),
            interval: Duration::from_millis(config.learner.pull_interval_ms),
            lease_ttl: Duration::from_secs(config.storage.lease_ttl_s),
            limits: group_limits(config),
            verifier,
            dtypes: super::spot::WorkerDtypes::default(),
        }
    }

    /// Refreshes `dtypes` from the workers' heartbeats every round.
    pub fn with_dtypes(mut self, dtypes: super::spot::WorkerDtypes) -> Self {
        self.dtypes = dtypes;
        self
    }
}

/// The learner's limits on pulled groups: its model's vocabulary and context, the default
/// log-prob floor, `learner.group_size`. When the model's configuration cannot be read here,
/// vocabulary and context are left unchecked at pull time (the trainer checks them again
/// against the model it runs, and quarantines what it cannot take).
fn group_limits(config: &NodeConfig) -> GroupLimits {
    let model = if config.model.source == "embedded" {
        Ok(policy::ModelConfig::tiny())
    } else {
        let path = std::path::Path::new(&config.model.source).join("config.json");
        std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|json| policy::ModelConfig::from_hf_json(&json).map_err(|e| e.to_string()))
    };
    let (vocab_size, max_context) = match model {
        Ok(m) => (m.vocab_size, m.max_position_embeddings),
        Err(e) => {
            tracing::warn!(error = %e, "model config unreadable: pulled groups are not checked against vocabulary and context");
            let p = GroupLimits::PERMISSIVE;
            (p.vocab_size, p.max_context)
        }
    };
    GroupLimits {
        vocab_size,
        max_context,
        logprob_floor: config.learner.logprob_floor,
        group_size: config.learner.group_size,
    }
}

/// What the puller reports.
#[derive(Default)]
pub(super) struct PullStats {
    groups_pulled: AtomicU64,
    pull_errors: AtomicU64,
    /// Σ μ_i the connected workers reported in their last heartbeats (μ_pool), milli-groups/s.
    mu_pool_milli: AtomicU64,
    /// The learner version and the `v_min` of the last pull asked.
    last: Mutex<Option<(u64, u64)>>,
    /// Seconds from opening to acknowledging, of the last [`RECENT_PULLS`] pulls that did not
    /// fail: the pull round trip (`status`'s `pull_round_trip_s`).
    recent: Mutex<std::collections::VecDeque<f64>>,
}

/// How many pull round trips [`PullStats`] keeps.
const RECENT_PULLS: usize = 64;

impl PullStats {
    pub fn groups_pulled(&self) -> u64 {
        self.groups_pulled.load(Ordering::Relaxed)
    }
    pub fn errors(&self) -> u64 {
        self.pull_errors.load(Ordering::Relaxed)
    }

    pub fn mu_pool(&self) -> f64 {
        self.mu_pool_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
    /// `(learner version, v_min)` of the last pull asked.
    pub fn last(&self) -> Option<(u64, u64)> {
        self.last.lock().ok().and_then(|l| *l)
    }

    /// The round trips of the recent pulls that did not fail, in seconds.
    pub fn recent_round_trips(&self) -> Vec<f64> {
        self.recent
            .lock()
            .map(|r| r.iter().copied().collect())
            .unwrap_or_default()
    }

    fn record_round_trip(&self, secs: f64) {
        metrics::histogram!("learner_pull_seconds").record(secs);
        if let Ok(mut r) = self.recent.lock() {
            super::push_recent(&mut r, secs, RECENT_PULLS);
        }
    }
}

/// A finished pull: the worker, the groups asked, how long it took, how it ended.
type Done = (
    p2p::PeerId,
    u64,
    std::time::Duration,
    Result<pull::PullOutcome, pull::PullError>,
);

pub(super) async fn run(
    client: p2p::Client,
    buffer: Arc<TrajectoryStore>,
    shared: Arc<Shared>,
    settings: PullSettings,
) {
    let window = shared.window;
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    // Peers with a pull in flight, and how many groups those pulls asked for in total.
    let mut busy = HashSet::new();
    let mut asked = 0u64;
    let mut round = 0usize;
    let mut ledger = PullLedger::new(LedgerParams::default());
    loop {
        let done: Option<Done> = tokio::select! {
            _ = tick.tick() => None,
            _ = shared.pull_wake.notified() => None,
            Some(d) = in_flight.next(), if !in_flight.is_empty() => Some(d),
        };
        if let Some((peer, max_groups, took, r)) = done {
            busy.remove(&peer);
            asked -= max_groups;
            match &r {
                Ok(out) => {
                    ledger.record_delivery(peer, max_groups, out.delivered());
                    shared.pulls.record_round_trip(took.as_secs_f64());
                }
                Err(_) => ledger.record_failure(peer, Instant::now()),
            }
            record_outcome(&shared, &client, peer, r).await;
            continue;
        }
        let Ok(workers) = client.workers().await else {
            return;
        };
        settings
            .dtypes
            .refresh(workers.iter().map(|p| (p.peer, p.device.as_ref())));
        let workers: Vec<(p2p::PeerId, u64, f64)> = workers
            .iter()
            .map(|p| (p.peer, p.pending.unwrap_or(0), p.mu.unwrap_or(0.0)))
            .collect();
        // Workers that left (or were banned) are forgotten: the ledger stays as large as the
        // set of workers.
        ledger.retain(|p| workers.iter().any(|w| w.0 == *p) || busy.contains(p));
        let mu_pool: f64 = workers.iter().map(|w| w.2).sum();
        shared
            .pulls
            .mu_pool_milli
            .store((mu_pool * 1000.0) as u64, Ordering::Relaxed);
        // Only groups still admissible after the next step count as buffered; those that fell
        // out of the window are deleted by the training thread before each batch.
        let version = shared.version.load(Ordering::Relaxed);
        let v_min = window.floor(version);
        let pending = buffer
            .pending_from(window.buffered_from(version))
            .unwrap_or(settings.target);
        let need = settings
            .target
            .saturating_sub(pending)
            .saturating_sub(asked);
        let idle: Vec<&(p2p::PeerId, u64, f64)> =
            workers.iter().filter(|w| !busy.contains(&w.0)).collect();
        if need == 0 || idle.is_empty() {
            continue;
        }
        // What a worker claims (`pending`) is only an upper bound: its credit is what the
        // learner saw it deliver ([`PullLedger`]); a claim of u64::MAX buys nothing. The +1
        // tolerates a heartbeat that lags the worker's outbox.
        let now = Instant::now();
        let credits: Vec<u64> = idle
            .iter()
            .map(|w| ledger.credit(&w.0, w.1.saturating_add(1), now))
            .collect();
        round = round.wrapping_add(1);
        let shares = allocate_capped(need, &credits, round);
        if let Ok(mut last) = shared.pulls.last.lock() {
            *last = Some((version, v_min));
        }
        for (&&(peer, _, _), max_groups) in idle.iter().zip(shares) {
            if max_groups == 0 {
                continue;
            }
            let client = client.clone();
            let buffer = buffer.clone();
            let verifier = settings.verifier.clone();
            let req = pull::PullRequest {
                v_min,
                max_groups,
                ttl: settings.lease_ttl,
                limits: settings.limits,
            };
            busy.insert(peer);
            ledger.started(peer, max_groups);
            asked += max_groups;
            in_flight.push(async move {
                // A worker that stops answering (stopped, overloaded) is given up on after
                // PULL_TIMEOUT; its share is asked of others meanwhile.
                let started = Instant::now();
                let pulled = pull::pull_verified(&client, peer, buffer, req, verifier);
                let r = tokio::time::timeout(PULL_TIMEOUT, pulled).await;
                (
                    peer,
                    max_groups,
                    started.elapsed(),
                    r.unwrap_or_else(|_| Err(pull::PullError::Refused("timed out".into()))),
                )
            });
        }
    }
}

async fn record_outcome(
    shared: &Shared,
    client: &p2p::Client,
    peer: p2p::PeerId,
    r: Result<pull::PullOutcome, pull::PullError>,
) {
    let strike = |reason: p2p::StrikeReason| async move {
        if let Err(e) = client.strike(peer, reason).await {
            tracing::debug!(%peer, %reason, error = %e, "strike not recorded");
        }
    };
    match r {
        Ok(out) => {
            shared
                .pulls
                .groups_pulled
                .fetch_add(out.stored as u64, Ordering::Relaxed);
            if out.invalid > 0 {
                metrics::counter!("learner_groups_rejected_total").increment(out.invalid as u64);
                tracing::warn!(%peer, invalid = out.invalid, reasons = ?out.rejected, "worker sent groups the learner refuses");
            }
            // One strike per refused group, for the reason it was refused.
            for (reason, count) in &out.rejected {
                if let Some(s) = super::verify::strike_reason(reason) {
                    for _ in 0..*count {
                        strike(s).await;
                    }
                }
            }
        }
        Err(e) => {
            shared.pulls.pull_errors.fetch_add(1, Ordering::Relaxed);
            // The peer's fault (an oversized answer, a protocol violation, a missed read
            // deadline) is a strike; a dropped connection or a local error is not.
            match e.strike_reason() {
                Some(reason) => {
                    tracing::warn!(%peer, error = %e, "pull failed by the worker's fault");
                    strike(reason).await;
                }
                None => tracing::debug!(%peer, error = %e, "pull failed"),
            }
        }
    }
}
