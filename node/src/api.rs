//! The admin endpoint's JSON contract: what `GET /status` serves and what `echo-node status`,
//! `echo-node demo`, the admin page and the testnet harness read back. One set of types,
//! `Serialize + Deserialize`, so that a field renamed here is renamed for every reader.
//!
//! The shape is stable (fields may be added, never renamed): `docs/protocol.md`, "Admin
//! endpoint". Every field a reader may miss on an older node is `#[serde(default)]`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /status`: the network service's view of the swarm, plus the role's own section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    #[serde(flatten)]
    pub network: p2p::NetworkStatus,
    /// The snapshot version this node works with (installed on a worker, published by the
    /// learner); `null` before the first.
    pub version: Option<u64>,
    /// Software version of `echo-node`.
    pub node_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learner: Option<LearnerStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The broadcast benchmark (testnet `broadcast`), when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchStatus>,
}

/// The role's section of [`NodeStatus`], replaced as the role makes progress.
#[derive(Debug, Clone)]
pub enum RoleSection {
    Learner(Box<LearnerStatus>),
    Rollout(RolloutStatus),
    Bench(BenchStatus),
}

/// The learner's figures (ECHO-2 notation; the glossary in `docs/architecture.md` maps each
/// symbol to its config key).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnerStatus {
    /// Learner version v (optimiser steps taken, counting from the initial snapshot).
    pub version: u64,
    /// `async` or `sequential`.
    pub mode: String,
    pub objective: String,
    /// Staleness budget S in effect (the trainer's: see `docs/learner.md`, "Restarts").
    pub staleness: u64,
    /// Publication period κ in effect.
    pub kappa: u64,
    /// B.
    pub groups_per_step: usize,
    pub steps: u64,
    /// `learner.max_steps` reached: the node keeps serving but trains no more.
    pub finished: bool,
    /// T_idle / (T_idle + T_train) since start.
    pub bubble_ratio: f64,
    pub idle_s: f64,
    pub train_s: f64,
    /// Median step time over the recent steps.
    pub t_train_s: Option<f64>,
    /// Median broadcast time (until a fraction 1/γ of the active workers installed).
    pub t_bcast_s: Option<f64>,
    pub t_bcast_samples: usize,
    /// Σ μ_i over the connected workers (groups/s).
    pub mu_pool: f64,
    pub mu_min: Option<f64>,
    pub mu_target: Option<f64>,
    pub scheduler: SchedulerStatus,
    pub mu_units: String,
    /// κ·T_train ≤ T_bcast: no pool keeps this learner busy.
    pub capacity_infeasible: bool,
    /// Δ_max bounds of ECHO-2 eq. 7 and eq. 12.
    pub delta_max_bound: Option<u64>,
    pub delta_max_bound_under_overlap: Option<u64>,
    pub published_version: Option<u64>,
    pub snapshots_published: u64,
    pub groups_pulled: u64,
    pub pull_errors: u64,
    /// Groups quarantined (kept under `<data_dir>/quarantine/`, never trained) since start.
    pub groups_quarantined: u64,
    /// The learner version when the puller last asked workers for groups, and the `v_min`
    /// (oldest admissible version) it asked with: `version − v_min = min(S, version)`.
    pub last_pull_version: Option<u64>,
    pub last_pull_v_min: Option<u64>,
    pub buffer_pending: Option<u64>,
    pub groups_dropped_stale: u64,
    pub groups_dropped_zero_advantage: u64,
    pub groups_dropped_other: u64,
    pub groups_pruned: u64,
    /// Observed staleness Δ = v − v_τ of trained groups → count.
    pub staleness_histogram: BTreeMap<u64, u64>,
    pub staleness_max: u64,
    pub reward_first: Option<f64>,
    /// Mean reward over the last 20 steps.
    pub reward_recent: Option<f64>,
    pub last_step: Option<LastStep>,
}

/// The figures of the learner's most recent step.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LastStep {
    pub reward_mean: f64,
    pub reward_std: f64,
    pub loss: f64,
    pub kl_sampler_learner: f64,
    pub importance_weight_variance: f64,
    pub grad_norm: f64,
    pub zero_advantage_fraction: f64,
    pub t_train_s: f64,
    pub idle_s: f64,
    pub staleness_max: u64,
}

/// The provisioning scheduler's view (`enabled: false` when it is off).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerStatus {
    pub enabled: bool,
    /// `target` (follow μ_target) or `fixed` (`scheduler.active_workers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranking: Option<crate::config::Ranking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_workers: Option<usize>,
    pub active: Vec<String>,
    pub standby: Vec<String>,
    pub active_cost_per_hour: f64,
    pub active_mu: f64,
    pub mu_target: Option<f64>,
    pub orders_published: u64,
}

/// A rollout worker's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutStatus {
    pub installed_version: Option<u64>,
    /// μ_i in groups/s.
    pub mu: f64,
    pub groups: u64,
    pub samples: u64,
    pub tokens: u64,
    /// Generation paused: `storage.max_pending_groups` groups wait to be pulled.
    pub paused: bool,
    pub errors: u64,
    /// Moving average of the groups' mean rewards.
    pub reward_ema: f64,
    /// The learner's activation order keeps this worker on standby.
    pub standby: bool,
    /// Version of the last group written.
    pub last_group_version: u64,
    pub pending: Option<u64>,
}

/// The broadcast benchmark's progress and results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchStatus {
    /// `joining`, `publishing` or `done`.
    pub phase: String,
    pub done: bool,
    pub size_mb: f64,
    pub workers: usize,
    pub rounds: Vec<BenchRound>,
}

/// One benchmark broadcast.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchRound {
    pub round: u32,
    pub version: u64,
    pub bytes: usize,
    /// Until every worker installed.
    pub t_bcast_all_s: Option<f64>,
    /// Until a fraction 1/γ installed (the T_bcast the learner measures online).
    pub t_bcast_q_s: Option<f64>,
    pub n_chains: usize,
    pub chain_lengths: Vec<usize>,
    pub fetch_only: usize,
    pub learner_pushed_bytes: u64,
    pub learner_served_bytes: u64,
}
