//! What the training thread carries ([`TrainCtx`]) and the running totals it keeps
//! ([`Totals`]): shared by the thread (`train`) and the `/status` section it refreshes
//! (`status`), which both use this module and not each other.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use learner::Trainer;
use storage::TrajectoryStore;
use tokio::sync::watch;

use super::{Shared, Snapshot};
use crate::config::LearnerConfig;
use crate::roles::RoleView;

pub(super) struct TrainCtx {
    pub trainer: Trainer,
    /// The version the trainer's weights stand at (below `trainer.version()` only when a
    /// restart could not read its newest published snapshot back): journaled batches of
    /// steps up to it are in the weights.
    pub weights_version: u64,
    pub buffer: Arc<TrajectoryStore>,
    pub shared: Arc<Shared>,
    pub snap_tx: watch::Sender<Snapshot>,
    pub view: RoleView,
    pub cfg: LearnerConfig,
    /// The dtype snapshots are shipped in (`broadcast.dtype`).
    pub snapshot_dtype: policy::DType,
    /// A LoRA run's shipping plan: versions go out as adapters on its base.
    pub adapters: Option<crate::roles::adapter::Shipping>,
    /// The share limits of a batch (`[admission]`).
    pub caps: control::admission::ShareCaps,
    /// `[admission]`, for status.
    pub admission: crate::config::AdmissionConfig,
    /// Whether every trained reward was recomputed (`verification.recompute_rewards`).
    pub rewards_recomputed: bool,
    /// Whether a producer (its peer id as the group names it) is banned now
    /// (`p2p::Client::banned_peers`).
    pub is_banned: Box<dyn Fn(&str) -> bool + Send>,
    pub ckpt_dir: PathBuf,
    pub steps_log: PathBuf,
    /// The exact evaluator of the environment, run on every published version.
    pub exact: Option<super::envs::Evaluator>,
}

/// Running totals behind the `/status` learner section.
#[derive(Default)]
pub(super) struct Totals {
    pub steps: u64,
    pub idle_s: f64,
    pub train_s: f64,
    pub recent_train_s: VecDeque<f64>,
    pub staleness: BTreeMap<u64, u64>,
    pub staleness_max: u64,
    pub dropped_stale: u64,
    pub dropped_zero: u64,
    pub dropped_other: u64,
    /// Groups of producers banned after they were pulled, dropped untrained.
    pub dropped_banned: u64,
    /// Groups quarantined (never trained) since start.
    pub quarantined: u64,
    pub reward_first: Option<f64>,
    /// Rewards of the last `train::RECENT_REWARDS` steps.
    pub recent_rewards: VecDeque<f64>,
    /// Mean rewards of the last `train::RECENT_CHECKED` trained groups whose sampled tokens
    /// and log-probs were checked and whose rewards were recomputed (fully verified groups).
    pub recent_checked: VecDeque<f64>,
    /// Producers of the last `train::RECENT_PRODUCERS` trained groups: the long-run tie-break
    /// of batch composition (`control::admission::compose_batch`).
    pub recent_producers: VecDeque<String>,
    /// Producers with their own `learner_groups_trained_total` series (at most
    /// `train::MAX_PRODUCER_SERIES`; the rest count under `producer="other"`).
    pub producer_series: std::collections::HashSet<String>,
    /// What the admin page draws.
    pub curve: crate::api::Curve,
}
