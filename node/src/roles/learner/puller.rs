//! The learner's puller: keeps the trajectory buffer topped up from the rollout workers.
//!
//! Every `pull_interval_ms`, and whenever the training thread takes a batch or finds none, it
//! tops the buffer up to its target: the shortfall (counting only groups still admissible
//! after the next step, [`learner::Window::buffered_from`]), less what pulls still in flight
//! asked for — a pull slower than the usual round trip no longer counts
//! ([`control::pulls::hedge`]: a worker that stops answering does not hold its share) — split
//! over the workers with no pull in flight by
//! [`control::pulls::allocate_probing`] in proportion to each worker's credit: what it claims
//! (`pending`) bounded by what the learner saw it deliver ([`control::pulls::PullLedger`]) —
//! after one group for each worker not asked for a second, so that none is starved. Pulls run
//! concurrently and independently — a worker that is slow to answer (installing a snapshot,
//! overloaded) holds back only its own share, not the next round of pulls from the others.
//!
//! Only admitted workers are pulled from ([`crate::admission::Gate`]: open, allow-list or
//! ticket, and the proof of work when asked). A worker's credit is also cut to its share of
//! the buffer, and the workers on probation together to theirs ([`super::shares`]); the
//! buffered groups that count towards the target are those a batch under the share quota
//! could use.
//!
//! Every decoded group runs the one verification pipeline ([`super::verify::PullVerifier`])
//! before it is stored; the refused ones are reported with their [`storage::Rejection`] and
//! penalised by the one exhaustive match ([`super::penalty::penalty`]): a strike per group,
//! or a ban at once on proof. A lease larger than asked for is a strike too
//! ([`pull::Offence`]). When a worker is banned (for whatever reason, by
//! whichever part of the node) its groups still in the buffer are dropped untrained and
//! counted as rejected (`TrajectoryStore::reject_producer`), and it is forgotten: if it comes
//! back under the same key it starts on probation again. Group numbers a worker skipped for
//! good come off its credit.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::admission::ShareCaps;
use control::pulls::{
    allocate_probing, covered, hedge_after, DeliveryMeter, LedgerParams, PullLedger, PROBE_AFTER,
};
use futures::stream::{FuturesUnordered, StreamExt};
use storage::record::GroupLimits;
use storage::TrajectoryStore;

use super::rule_check::SamplingCheck;
use super::shares::Idle;
use super::Shared;
use crate::admission::Gate;
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
    /// The limits of the pull request (its byte budget; the pipeline checks structure).
    limits: GroupLimits,
    caps: ShareCaps,
    gate: Gate,
    /// Where the spot check reads each worker's sampling dtype; refreshed every round.
    dtypes: super::spot::WorkerDtypes,
    /// What of a worker's sampling rule the learner's checks depend on: a worker reporting
    /// another is not pulled from.
    sampling: SamplingCheck,
}

impl PullSettings {
    /// For a learner whose public key is `learner_key`.
    pub fn of(config: &NodeConfig, learner_key: &[u8; 32]) -> Self {
        PullSettings {
            target: config.learner.buffer_target(),
            interval: Duration::from_millis(config.learner.pull_interval_ms),
            lease_ttl: Duration::from_secs(config.storage.lease_ttl_s),
            limits: group_limits(config),
            caps: config.admission.caps(),
            gate: Gate::new(config, *learner_key),
            dtypes: super::spot::WorkerDtypes::default(),
            sampling: SamplingCheck::of(config, single_turn(config)),
        }
    }

    /// Refreshes `dtypes` from the workers' heartbeats every round.
    pub fn with_dtypes(mut self, dtypes: super::spot::WorkerDtypes) -> Self {
        self.dtypes = dtypes;
        self
    }
}

/// Whether the configured task is single-turn (a task rather than a multi-turn environment);
/// one that cannot be built (the learner refused to start already) counts as single-turn.
fn single_turn(config: &NodeConfig) -> bool {
    crate::roles::build_env(config).map_or(true, |e| e.as_task().is_some())
}

/// The learner's limits on pulled groups: its model's vocabulary and context, the default
/// log-prob floor, `learner.group_size`. When the model's configuration cannot be read here,
/// vocabulary and context are left unchecked at pull time (the trainer checks them again
/// against the model it runs, and quarantines what it cannot take).
pub(super) fn group_limits(config: &NodeConfig) -> GroupLimits {
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
    /// Pulls that outlasted the hedge delay, their share asked of others.
    pulls_hedged: AtomicU64,
    /// Σ μ_i the connected workers reported in their last heartbeats (μ_pool), milli-groups/s.
    mu_pool_milli: AtomicU64,
    /// The learner version and the `v_min` of the last pull asked.
    last: Mutex<Option<(u64, u64)>>,
    /// Seconds from opening to acknowledging, of the last [`RECENT_PULLS`] pulls that did not
    /// fail: the pull round trip (`status`'s `pull_round_trip_s`).
    recent: Mutex<std::collections::VecDeque<f64>>,
    /// Buffered groups of banned workers, dropped untrained (`rejected_stored`).
    rejected_after_ban: AtomicU64,
    /// What the admission and share rules did, per worker (for status).
    admission: Mutex<AdmissionView>,
    /// Each worker's generation rate as verified from what it delivered while asked
    /// ([`DeliveryMeter`]), for the scheduler to weigh its claimed μ against.
    verified_mu: Mutex<std::collections::HashMap<p2p::PeerId, f64>>,
}

/// The puller's admission figures, per worker (at most [`MAX_VIEW_PEERS`] each).
#[derive(Debug, Default, Clone)]
pub(super) struct AdmissionView {
    /// Workers not admitted, and why.
    pub refused: BTreeMap<String, String>,
    /// Pulls where a worker claimed a backlog of more than four times its share of the buffer
    /// and the share cut its credit: evidence of an inflated backlog.
    pub backlog_capped: BTreeMap<String, u64>,
    /// Group numbers each worker skipped for good (withheld groups).
    pub skipped: BTreeMap<String, u64>,
}

/// Workers an [`AdmissionView`] map keeps at most.
const MAX_VIEW_PEERS: usize = 1024;

fn bump(m: &mut BTreeMap<String, u64>, peer: &str, n: u64) {
    if m.len() < MAX_VIEW_PEERS || m.contains_key(peer) {
        *m.entry(peer.to_string()).or_default() += n;
    }
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

    pub fn rejected_after_ban(&self) -> u64 {
        self.rejected_after_ban.load(Ordering::Relaxed)
    }

    pub fn admission(&self) -> AdmissionView {
        self.admission.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn with_admission(&self, f: impl FnOnce(&mut AdmissionView)) {
        if let Ok(mut a) = self.admission.lock() {
            f(&mut a);
        }
    }

    /// The workers' verified generation rates (groups/s), those measured so far.
    pub fn verified_mu(&self) -> std::collections::HashMap<p2p::PeerId, f64> {
        self.verified_mu
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    fn set_verified_mu(&self, meter: &DeliveryMeter<p2p::PeerId>) {
        if let Ok(mut v) = self.verified_mu.lock() {
            *v = meter.rates().map(|(p, r)| (*p, r)).collect();
        }
    }

    pub fn mu_pool(&self) -> f64 {
        self.mu_pool_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
    /// `(version filled for, v_min)` of the last pull asked: the learner's version, or the next
    /// once the step at it has taken its batch (`control::Window::filling`).
    pub fn last(&self) -> Option<(u64, u64)> {
        self.last.lock().ok().and_then(|l| *l)
    }

    /// Pulls that outlasted the hedge delay (their share was asked of others).
    pub fn hedged(&self) -> u64 {
        self.pulls_hedged.load(Ordering::Relaxed)
    }

    /// The median of the recent pull round trips (s), `None` before any pull finished.
    fn median_round_trip(&self) -> Option<f64> {
        super::median(self.recent_round_trips())
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
    dissem: dissemination::Disseminator,
    buffer: Arc<TrajectoryStore>,
    shared: Arc<Shared>,
    mut settings: PullSettings,
) {
    let window = shared.window;
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    // Workers whose pull in flight has hedged (counted once per pull; the pulls themselves,
    // their groups and start times, are the ledger's).
    let mut hedged: HashSet<p2p::PeerId> = HashSet::new();
    let mut round = 0usize;
    let mut ledger = PullLedger::new(LedgerParams::default());
    let mut meter = DeliveryMeter::default();
    let commits = shared.commits.clone();
    let verifier: Arc<dyn pull::GroupVerifier> = Arc::new(super::commits::CommittedVerifier {
        inner: super::verify::PullVerifier(shared.pipeline.clone()),
        commits: commits.clone(),
    });
    let mut banned = HashSet::new();
    let mut contributions_sent = Instant::now() - CONTRIBUTIONS_EVERY;
    loop {
        let done: Option<Done> = tokio::select! {
            _ = tick.tick() => None,
            _ = shared.pull_wake.notified() => None,
            Some(d) = in_flight.next(), if !in_flight.is_empty() => Some(d),
        };
        if let Some((peer, max_groups, took, r)) = done {
            hedged.remove(&peer);
            match &r {
                Ok(out) => {
                    ledger.record_delivery(peer, max_groups, out.delivered());
                    // Only groups stored now: a duplicate was made before, and counted then.
                    meter.delivered(&peer, out.stored as u64);
                    shared.pulls.record_round_trip(took.as_secs_f64());
                }
                Err(_) => ledger.record_failure(peer, Instant::now()),
            }
            record_outcome(&shared, &client, peer, r).await;
            strike_withheld(&client, &commits).await;
            for (p, n) in shared.pipeline.take_new_skips() {
                shared.pulls.with_admission(|a| bump(&mut a.skipped, &p, n));
                metrics::counter!("learner_seq_skipped_total").increment(n);
                if let Ok(p) = p.parse() {
                    ledger.record_skipped(p, n);
                }
            }
            continue;
        }
        let Ok(workers) = client.workers().await else {
            return;
        };
        settings
            .dtypes
            .refresh(workers.iter().map(|p| (p.peer, p.device.as_ref())));
        drop_banned(&client, &mut banned, &buffer, &shared).await;
        // What the learner did with each worker's groups, carried by its score tables.
        if contributions_sent.elapsed() >= CONTRIBUTIONS_EVERY {
            contributions_sent = Instant::now();
            let _ = client
                .set_contributions(contributions(&workers, &shared))
                .await;
        }
        for p in &banned {
            commits.forget(p);
        }
        let (workers, strangers) =
            admitted(&workers, &mut settings.gate, &settings.sampling, &shared);
        // Not admitted, not trusted to forward: the next plans seat them as chain ends.
        dissem.set_no_forward(strangers);
        // Workers with a pull in flight, and the groups those pulls asked for in total.
        let flights: Vec<(p2p::PeerId, u64, Instant)> = ledger
            .in_flight()
            .map(|(p, groups, started)| (*p, groups, started))
            .collect();
        let busy: HashSet<p2p::PeerId> = flights.iter().map(|f| f.0).collect();
        let asked: u64 = flights.iter().map(|f| f.1).sum();
        // Workers that left (or were banned) are forgotten: the ledger stays as large as the
        // set of workers.
        ledger.retain(|p| workers.iter().any(|w| w.0 == *p) || busy.contains(p));
        meter.retain(|p| workers.iter().any(|w| w.0 == *p) || busy.contains(p));
        let (active, established) = sharing_counts(&workers, &shared);
        // Only groups still admissible after the next step count as buffered, and of those
        // only what a batch under the share quota could use; those that fell out of the
        // window are deleted by the training thread before each batch.
        let (version, taken) = shared.version.get();
        let (v_min, from) = window.filling(version, taken);
        let buffered = buffered_view(&buffer, &shared, &settings, from, active, established);
        // Pulls slower than the hedge delay no longer cover their share: it is asked of the
        // others (`control::pulls::hedge`).
        let now = Instant::now();
        let hedge = hedge_after(shared.pulls.median_round_trip());
        for &(peer, groups, started) in &flights {
            if now.duration_since(started) >= hedge && hedged.insert(peer) {
                shared.pulls.pulls_hedged.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("learner_pulls_hedged_total").increment(1);
                tracing::debug!(%peer, groups, after = ?hedge, "a slow pull hedged: its share is asked of others");
            }
        }
        let covering = covered(
            flights.iter().map(|&(_, g, t)| (g, now.duration_since(t))),
            hedge,
        );
        let need = settings
            .target
            .saturating_sub(buffered.usable)
            .saturating_sub(covering);
        // A worker's time counts towards its verified rate while the learner asks for groups
        // (a shortfall, or pulls in flight) and it is meant to generate: heartbeating, and not
        // on standby by the scheduler's last order.
        let hungry = need > 0 || asked > 0;
        let standby = standby(&shared);
        for w in &workers {
            meter.observe(w.0, now, hungry && w.3 && !standby.contains(&w.0));
        }
        shared.pulls.set_verified_mu(&meter);
        let idle: Vec<&Admitted> = workers.iter().filter(|w| !busy.contains(&w.0)).collect();
        if need == 0 || idle.is_empty() {
            continue;
        }
        let credits = credits(
            &idle,
            &ledger,
            &buffered,
            &shared,
            &settings,
            active,
            established,
        );
        round = round.wrapping_add(1);
        // A worker not asked for PROBE_AFTER is asked for one group first, whatever its credit:
        // a small shortfall split by credit alone never reaches a worker at the credit floor.
        let due: Vec<bool> = idle
            .iter()
            .map(|w| ledger.due(&w.0, now, PROBE_AFTER))
            .collect();
        let shares = allocate_probing(need, &credits, &due, round);
        if let Ok(mut last) = shared.pulls.last.lock() {
            // The version this pull filled for: v_min is its window's floor.
            *last = Some((version + u64::from(taken), v_min));
        }
        for (&&(peer, _, _, _), max_groups) in idle.iter().zip(shares) {
            if max_groups == 0 {
                continue;
            }
            let client = client.clone();
            let buffer = buffer.clone();
            let verifier = verifier.clone();
            let req = pull::PullRequest {
                v_min,
                max_groups,
                ttl: settings.lease_ttl,
                limits: settings.limits,
                commits_from: commits.next(&peer),
            };
            ledger.started(peer, max_groups, now);
            in_flight.push(async move {
                // A worker that stops answering (stopped, overloaded) is given up on after
                // PULL_TIMEOUT; its share is asked of others once the pull hedges.
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

/// A worker the puller may pull from: its peer id, pending groups, μ, and whether it is active.
type Admitted = (p2p::PeerId, u64, f64, bool);

/// The workers the scheduler's last order put on standby (none without a scheduler).
fn standby(shared: &Shared) -> HashSet<p2p::PeerId> {
    shared
        .scheduler
        .as_ref()
        .and_then(|s| s.lock().ok().map(|s| s.standby().iter().copied().collect()))
        .unwrap_or_default()
}

/// How often the puller hands the workers' contributions to the network service.
const CONTRIBUTIONS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Each worker's contribution as the learner accounts it: groups its verification judged
/// (accepted, rejected), groups trained, and why it is refused (the service adds strikes).
/// Workers the learner has nothing on are left out.
fn contributions(
    workers: &[p2p::PeerView],
    shared: &Shared,
) -> std::collections::HashMap<p2p::PeerId, p2p::Contribution> {
    let mut refused = BTreeMap::new();
    shared.pulls.with_admission(|a| refused = a.refused.clone());
    let trained = shared.trained_by_producer();
    workers
        .iter()
        .filter_map(|p| {
            let id = p.peer.to_base58();
            let h = shared.pipeline.history(&id);
            let trained = trained.get(&id).copied().unwrap_or(0);
            let refused: Option<String> = refused
                .get(&id)
                .map(|r| r.chars().take(p2p::messages::MAX_REFUSED_CHARS).collect());
            let pulled = h.accepted + h.rejected;
            (pulled > 0 || trained > 0 || refused.is_some()).then(|| {
                let c = p2p::Contribution {
                    pulled,
                    accepted: h.accepted,
                    rejected: h.rejected,
                    trained,
                    strikes: 0,
                    refused,
                };
                (p.peer, c)
            })
        })
        .collect()
}

/// The workers the puller may pull from: those the admission gate lets pull
/// (`docs/admission.md`) whose heartbeats report the sampling rule the learner checks by
/// (`sampling`; a worker that reports none, an older node, is pulled from as before). A
/// refused one is shown in the learner's admission view with why (a bounded number of them);
/// a sampling mismatch is also logged once per worker and rule, since it is a configuration
/// error its operator must fix: every group it sent would be refused, and struck.
/// Also returns the workers the gate itself refuses (strangers, not merely mis-configured).
fn admitted(
    workers: &[p2p::PeerView],
    gate: &mut Gate,
    sampling: &SamplingCheck,
    shared: &Shared,
) -> (Vec<Admitted>, HashSet<p2p::PeerId>) {
    let now_s = crate::admission::now_unix_s();
    let mut out = Vec::new();
    let mut strangers = HashSet::new();
    // (worker, why it is refused, whether for its sampling rule), applied to the view at once.
    let mut verdicts = Vec::with_capacity(workers.len());
    for p in workers {
        let id = p.peer.to_base58();
        let mismatch = p
            .device
            .as_ref()
            .and_then(|d| d.sampling)
            .and_then(|r| sampling.mismatch(r))
            .map(|why| format!("sampling rule: {why}"));
        let admits = gate.admits(&id, p.admission.as_deref(), now_s);
        if admits.is_err() {
            strangers.insert(p.peer);
        }
        let verdict = admits.and_then(|()| mismatch.clone().map_or(Ok(()), Err));
        if verdict.is_ok() {
            out.push((
                p.peer,
                p.pending.unwrap_or(0),
                p.mu.unwrap_or(0.0),
                p.active,
            ));
        }
        verdicts.push((id, verdict.err(), mismatch.is_some()));
    }
    shared.pulls.with_admission(|a| {
        for (id, refused, for_sampling) in verdicts {
            let Some(why) = refused else {
                // Admitted now (a new ticket, a corrected configuration): no longer shown as
                // refused.
                a.refused.remove(&id);
                continue;
            };
            if a.refused.len() < MAX_VIEW_PEERS || a.refused.contains_key(&id) {
                if for_sampling && a.refused.get(&id) != Some(&why) {
                    tracing::warn!(worker = %id, "not pulling from this worker: {why}");
                }
                a.refused.insert(id, why);
            }
        }
    });
    (out, strangers)
}

/// The workers sharing the buffer: active and not shown bad (one whose groups were all
/// refused does not shrink the others' part; a new one counts, so that an established
/// worker's backlog cannot fill the buffer before the newcomer is ever pulled); and of those
/// the established ones (past probation). Publishes μ of the pool and the established count.
fn sharing_counts(workers: &[Admitted], shared: &Shared) -> (usize, usize) {
    let mu_pool: f64 = workers.iter().map(|w| w.2).sum();
    shared
        .pulls
        .mu_pool_milli
        .store((mu_pool * 1000.0) as u64, Ordering::Relaxed);
    let active = workers
        .iter()
        .filter(|w| {
            let h = shared.pipeline.history(&w.0.to_base58());
            w.3 && (h.accepted > 0 || h.rejected == 0)
        })
        .count();
    let established = workers
        .iter()
        .filter(|w| w.3 && !shared.pipeline.on_probation(&w.0.to_base58()))
        .count();
    shared
        .established_active
        .store(established, Ordering::Relaxed);
    (active, established)
}

/// The buffer by producer, for the next step's floor (a failed read counts as full: no pull
/// this round).
fn buffered_view(
    buffer: &TrajectoryStore,
    shared: &Shared,
    settings: &PullSettings,
    from: u64,
    active: usize,
    established: usize,
) -> super::shares::BufferView {
    match buffer.scan(from, super::shares::SCAN_LIMIT) {
        Ok(groups) => {
            let groups: Vec<_> = groups.into_iter().map(|(_, g)| g).collect();
            super::shares::view(
                &groups,
                &shared.pipeline,
                settings.caps,
                settings.target,
                active,
                established,
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the buffer");
            super::shares::BufferView {
                usable: settings.target,
                ..Default::default()
            }
        }
    }
}

/// Each idle worker's credit for the next pull: what it claims (`pending`) is only an upper
/// bound — the learner's observation of its deliveries bounds it ([`PullLedger`]; a claim of
/// u64::MAX buys nothing; the +1 tolerates a heartbeat that lags the worker's outbox) — and
/// its share of the buffer bounds that ([`super::shares::pull_caps`]).
#[allow(clippy::too_many_arguments)]
fn credits(
    idle: &[&(p2p::PeerId, u64, f64, bool)],
    ledger: &PullLedger<p2p::PeerId>,
    buffered: &super::shares::BufferView,
    shared: &Shared,
    settings: &PullSettings,
    active: usize,
    established: usize,
) -> Vec<u64> {
    let now = Instant::now();
    let pipeline = &shared.pipeline;
    let by_ledger: Vec<Idle> = idle
        .iter()
        .map(|w| {
            let peer = w.0.to_base58();
            Idle {
                credit: ledger.credit(&w.0, w.1.saturating_add(1), now),
                probation: pipeline.on_probation(&peer),
                claimed: w.1,
                peer,
            }
        })
        .collect();
    let probation_in_flight: u64 = ledger
        .in_flight()
        .filter(|(p, _, _)| pipeline.on_probation(&p.to_base58()))
        .map(|(_, groups, _)| groups)
        .sum();
    let caps = super::shares::pull_caps(
        &by_ledger,
        buffered,
        probation_in_flight,
        settings.caps,
        settings.target,
        active,
        established,
    );
    let share =
        control::admission::pull_share(settings.target, settings.caps.max_peer_share, active);
    for (w, (_, cut)) in by_ledger.iter().zip(&caps) {
        if *cut && w.claimed > share.saturating_mul(4) {
            shared
                .pulls
                .with_admission(|a| bump(&mut a.backlog_capped, &w.peer, 1));
            metrics::counter!("learner_backlog_capped_total").increment(1);
        }
    }
    caps.into_iter().map(|c| c.0).collect()
}

/// Drops the buffered groups of workers banned since the last look (by whatever part of the
/// node banned them) and forgets their histories.
async fn drop_banned(
    client: &p2p::Client,
    seen: &mut HashSet<p2p::PeerId>,
    buffer: &Arc<TrajectoryStore>,
    shared: &Shared,
) {
    let mut new = client.banned_peers();
    new.retain(|p| !seen.contains(p));
    for id in new {
        seen.insert(id);
        // Groups name their producer written out (base58), as does the pipeline's history.
        let peer = id.to_base58();
        shared.pipeline.forget(&peer);
        let b = buffer.clone();
        let p = peer.clone();
        match tokio::task::spawn_blocking(move || b.reject_producer(&p)).await {
            Ok(Ok(n)) => {
                if n > 0 {
                    tracing::warn!(%peer, groups = n, "a banned worker's buffered groups dropped untrained");
                }
                shared
                    .pulls
                    .rejected_after_ban
                    .fetch_add(n, Ordering::Relaxed);
                metrics::counter!("learner_groups_rejected_after_ban_total").increment(n);
            }
            Ok(Err(e)) => tracing::warn!(%peer, error = %e, "dropping a banned worker's groups"),
            Err(e) => tracing::warn!(%peer, error = %e, "dropping a banned worker's groups"),
        }
    }
}

/// Strikes every worker the commitments showed keeping committed groups back
/// ([`super::commits`]): one `withheld` strike per withheld number, uncommitted or mismatched
/// group.
async fn strike_withheld(client: &p2p::Client, commits: &super::commits::Commitments) {
    for (peer, account) in commits.take_verdicts() {
        metrics::counter!("learner_groups_withheld_total").increment(account.strikes());
        for _ in 0..account.strikes() {
            if let Err(e) = client
                .strike(peer, super::penalty::Strike::Withheld.report())
                .await
            {
                tracing::debug!(%peer, error = %e, "strike not recorded");
            }
        }
    }
}

async fn record_outcome(
    shared: &Shared,
    client: &p2p::Client,
    peer: p2p::PeerId,
    r: Result<pull::PullOutcome, pull::PullError>,
) {
    let strike = |report: p2p::PeerReport| async move {
        if let Err(e) = client.strike(peer, report).await {
            let reason = report.label;
            tracing::debug!(%peer, %reason, error = %e, "strike not recorded");
        }
    };
    match r {
        Ok(out) => {
            shared
                .pulls
                .groups_pulled
                .fetch_add(out.stored as u64, Ordering::Relaxed);
            // The one match: one strike per refused group for the reason it was refused, or,
            // on proof, a ban at once (its buffered groups are dropped at the next look).
            // Penalised kind by kind, in the order of their names.
            let mut by_kind: BTreeMap<&str, (super::penalty::Penalty, usize)> = BTreeMap::new();
            for r in &out.rejected {
                let entry = by_kind
                    .entry(r.as_str())
                    .or_insert((super::penalty::penalty(r), 0));
                entry.1 += 1;
            }
            if out.invalid > 0 {
                metrics::counter!("learner_groups_rejected_total").increment(out.invalid as u64);
                let reasons: BTreeMap<&str, usize> =
                    by_kind.iter().map(|(k, (_, n))| (*k, *n)).collect();
                tracing::warn!(%peer, invalid = out.invalid, reasons = ?reasons, "worker sent groups the learner refuses");
            }
            for (reason, (p, count)) in by_kind {
                match p.strike {
                    Some(s) if p.ban_at_once => {
                        tracing::warn!(%peer, %reason, "proof of forgery: banned at once");
                        if let Err(e) = client.ban(peer, s.label()).await {
                            tracing::debug!(%peer, error = %e, "ban not recorded");
                        }
                    }
                    Some(s) => {
                        for _ in 0..count {
                            strike(s.report()).await;
                        }
                    }
                    None => {}
                }
            }
        }
        Err(e) => {
            shared.pulls.pull_errors.fetch_add(1, Ordering::Relaxed);
            // The peer's fault (an oversized answer, a protocol violation, a missed read
            // deadline) is a strike; a dropped connection or a local error is not.
            match e.offence() {
                Some(offence) => {
                    tracing::warn!(%peer, error = %e, "pull failed by the worker's fault");
                    strike(offence.report()).await;
                }
                None => tracing::debug!(%peer, error = %e, "pull failed"),
            }
        }
    }
}
