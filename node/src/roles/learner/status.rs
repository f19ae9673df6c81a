//! The learner's section of `/status` ([`LearnerStatus`]), and the capacity figures behind it:
//! μ_min, μ_target = γ·μ_min and the Δ_max bounds of ECHO-2 (eq. 2, 7, 12), from the online
//! medians of T_train and T_bcast with groups as the unit (R = B).

use std::sync::atomic::Ordering;

use control::capacity::{self, Requirement, GAMMA};
use learner::StepStats;

use super::ctx::{Totals, TrainCtx};
use super::NONE;
use std::collections::BTreeMap;

use crate::api::{AdmissionStatus, LastStep, LearnerStatus, RoleSection, WorkerStanding};
use crate::config::LearnerMode;

/// Recomputes the learner's status and publishes it to the role view (and μ_target to the
/// scheduler).
pub(super) fn update(c: &TrainCtx, t: &Totals, last: Option<&(StepStats, f64)>, finished: bool) {
    let cfg = c.trainer.config();
    let s = &c.shared;
    let busy = t.idle_s + t.train_s;
    let (t_bcast_estimate, t_bcast_samples) = s.publish.t_bcast();
    let (snapshot_bytes_full, snapshot_bytes_median) = s.publish.payload_bytes();
    // A lower bound makes μ_min (and μ_target, which the scheduler follows) a lower bound and
    // the Δ_max figures lower bounds of the bounds: flagged with it.
    let t_bcast = t_bcast_estimate.map(|e| e.secs);
    let t_bcast_lower_bound = t_bcast_estimate.is_some_and(|e| e.lower_bound);
    let t_train = super::median(t.recent_train_s.iter().copied());
    let mu_pool = s.pulls.mu_pool();
    let round_trips = s.pulls.recent_round_trips();
    let kappa = cfg.kappa() as u32;
    let b = cfg.groups_per_step as f64;
    let (mut mu_min, mut infeasible, mut delta_bound, mut delta_bound_overlap) =
        (None, false, None, None);
    if let (Some(tt), Some(tb)) = (t_train, t_bcast) {
        match capacity::mu_min(kappa, b, tt, tb) {
            Requirement::Feasible { mu_min: m } => mu_min = Some(m),
            Requirement::Infeasible { .. } => infeasible = true,
        }
        delta_bound = capacity::delta_max_conservative(kappa, tb, b, mu_pool, tt);
        delta_bound_overlap = capacity::delta_max_under_overlap(kappa, tb, tt);
    }
    let mu_target = mu_min.map(|m| GAMMA * m);
    s.mu_target_milli.store(
        mu_target.map_or(NONE, |m| (m * 1000.0) as u64),
        Ordering::Relaxed,
    );
    let scheduler = s
        .scheduler
        .as_ref()
        .and_then(|st| st.lock().ok().map(|st| st.view()))
        .unwrap_or_default();
    let last_step = last.map(|(st, idle)| LastStep {
        reward_mean: st.reward_mean,
        reward_std: st.reward_std,
        loss: st.loss,
        kl_sampler_learner: st.kl_sampler_learner,
        importance_weight_variance: st.importance_weight_variance,
        grad_norm: st.grad_norm,
        zero_advantage_fraction: st.zero_advantage_fraction,
        t_train_s: st.t_train_s,
        idle_s: *idle,
        staleness_max: st.staleness_max,
    });
    let last_pull = s.pulls.last();
    let status = LearnerStatus {
        version: c.trainer.version(),
        mode: match c.cfg.mode {
            LearnerMode::Async => "async",
            LearnerMode::Sequential => "sequential",
        }
        .into(),
        objective: cfg.loss.objective.to_string(),
        staleness: s.window.staleness,
        kappa: cfg.kappa(),
        groups_per_step: cfg.groups_per_step,
        steps: t.steps,
        finished,
        bubble_ratio: if busy > 0.0 { t.idle_s / busy } else { 0.0 },
        idle_s: t.idle_s,
        train_s: t.train_s,
        t_train_s: t_train,
        t_bcast_s: t_bcast,
        t_bcast_lower_bound,
        t_bcast_samples,
        mu_pool,
        mu_min,
        mu_target,
        scheduler,
        mu_units: "groups/s".into(),
        capacity_infeasible: infeasible,
        delta_max_bound: delta_bound,
        delta_max_bound_under_overlap: delta_bound_overlap,
        published_version: s.publish.published(),
        snapshots_published: s.publish.snapshots(),
        snapshot_bytes_full,
        snapshot_bytes_median,
        started_from_version: c.weights_version,
        snapshot_payloads: s.publish.payloads(),
        groups_pulled: s.pulls.groups_pulled(),
        pull_errors: s.pulls.errors(),
        pulls_hedged: s.pulls.hedged(),
        pull_round_trip_s: super::median(round_trips.iter().copied()),
        pull_round_trip_p90_s: super::quantile(&round_trips, 0.9),
        groups_quarantined: t.quarantined,
        last_pull_version: last_pull.map(|l| l.0),
        last_pull_v_min: last_pull.map(|l| l.1),
        buffer_pending: c.buffer.pending().ok(),
        groups_dropped_stale: t.dropped_stale,
        groups_dropped_zero_advantage: t.dropped_zero,
        groups_dropped_other: t.dropped_other,
        groups_dropped_banned: t.dropped_banned,
        groups_pruned: s.pruned.load(Ordering::Relaxed),
        staleness_histogram: t.staleness.clone(),
        staleness_max: t.staleness_max,
        reward_first: t.reward_first,
        reward_recent: mean(&t.recent_rewards),
        reward_basis: if c.rewards_recomputed {
            "recomputed"
        } else {
            "reported"
        }
        .into(),
        reward_recent_checked: mean(&t.recent_checked),
        reward_checked_groups: t.recent_checked.len(),
        groups_rejected_after_ban: s.pulls.rejected_after_ban(),
        admission: admission(c),
        last_step,
        curve: t.curve.clone(),
    };
    c.view.set(RoleSection::Learner(Box::new(status)));
}

fn mean(xs: &std::collections::VecDeque<f64>) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The admission section: the rules in force, the puller's figures, the pipeline's
/// histories.
fn admission(c: &TrainCtx) -> AdmissionStatus {
    let s = &c.shared;
    let view = s.pulls.admission();
    let mut evidence: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (kind, m) in [
        ("skipped", &view.skipped),
        ("backlog_capped", &view.backlog_capped),
    ] {
        for (peer, n) in m.iter().filter(|(_, n)| **n > 0) {
            evidence
                .entry(peer.clone())
                .or_default()
                .insert(kind.into(), *n);
        }
    }
    // The commitments: withheld numbers and broken commitments are evidence (struck); stale
    // and abandoned committed numbers are not, and are shown to tell honest pruning (or an
    // environment that fails) from withholding.
    for (peer, c) in s.commits.counts() {
        for (kind, n) in [
            ("withheld", c.withheld),
            ("commit_broken", c.broken),
            ("committed_stale", c.stale),
            ("committed_abandoned", c.abandoned),
        ] {
            if n > 0 {
                evidence
                    .entry(peer.clone())
                    .or_default()
                    .insert(kind.into(), n);
            }
        }
    }
    for (peer, v) in s.margins.all() {
        if v.unearned > 0 {
            evidence
                .entry(peer)
                .or_default()
                .insert("margin_unearned".into(), v.unearned);
        }
    }
    let probation = s.pipeline.probation();
    let now_ms = storage::unix_ms();
    let mut workers: Vec<WorkerStanding> = s
        .pipeline
        .histories()
        .into_iter()
        .map(|(peer, h)| WorkerStanding {
            probation: control::admission::on_probation(&probation, &h, now_ms),
            check_rate: control::admission::check_rate(&probation, &h, now_ms),
            peer_id: peer,
            accepted: h.accepted,
            rejected: h.rejected,
            skipped: h.skipped,
        })
        .collect();
    workers.sort_by(|a, b| b.accepted.cmp(&a.accepted).then(a.peer_id.cmp(&b.peer_id)));
    workers.truncate(256);
    AdmissionStatus {
        mode: c.admission.mode.as_str().into(),
        pow_bits: c.admission.pow_bits,
        probation_groups: probation.probation_groups,
        max_peer_share: c.caps.max_peer_share,
        probation_share: c.caps.probation_share,
        established_workers: s.established_active.load(Ordering::Relaxed),
        refused: view.refused,
        evidence,
        workers,
        earned_margins: s
            .margins
            .all()
            .into_iter()
            .take(256)
            .map(|(peer, v)| {
                (
                    peer,
                    crate::api::EarnedMarginStatus {
                        claimed: v.claimed.map(|d| d.name().to_string()),
                        tolerance: v.tolerance,
                        delta: v.delta,
                        groups: v.evidence.groups,
                        tokens: v.evidence.tokens,
                        band_tokens: v.evidence.band_tokens,
                        max_spread: v.evidence.max_spread,
                        unearned: v.unearned,
                    },
                )
            })
            .collect(),
    }
}
