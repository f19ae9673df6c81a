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
    /// The learner's accounting of its forwarders: receipts judged, verdicts, demotions,
    /// exclusions, separations (`docs/broadcast.md`, "Accountable forwarding").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<dissemination::ForwardingView>,
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
    /// Median broadcast time (until a fraction 1/γ of the active workers installed), counting
    /// unfinished versions as lower bounds (`control::capacity::t_bcast_estimate`).
    pub t_bcast_s: Option<f64>,
    /// `t_bcast_s` is a lower bound (`≥`): some version had not completed when measured. Then
    /// `mu_min` and `mu_target` are lower bounds too, and the `delta_max_bound*` figures are
    /// lower bounds of the bounds.
    pub t_bcast_lower_bound: bool,
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
    /// Bytes of a full snapshot payload in the shipping dtype (the newest published).
    #[serde(default)]
    pub snapshot_bytes_full: Option<u64>,
    /// Median bytes published per version over the last 1024 versions: the payload that
    /// went on the chains, full, delta or adapter.
    #[serde(default)]
    pub snapshot_bytes_median: Option<u64>,
    /// The version the weights stood at when this run started (0 for a fresh model): the
    /// checkpoint's, or the newest published snapshot's read back after it. Journaled steps
    /// after it were not in the weights and their groups are trained again.
    #[serde(default)]
    pub started_from_version: u64,
    /// Bytes per version by kind, delta ratio, catch-ups served (`null` unless
    /// `[broadcast] delta` is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_payloads: Option<SnapshotPayloads>,
    pub groups_pulled: u64,
    pub pull_errors: u64,
    /// Pulls that outlasted the hedge delay (four median round trips, 0.1–10 s): from then on
    /// their share of the shortfall was asked of other workers (`docs/learner.md`, "Hedged
    /// pulls").
    #[serde(default)]
    pub pulls_hedged: u64,
    /// Median and 90th percentile of the recent pull round trips (opening the stream to the
    /// worker's last frame after the ack, for pulls that did not fail), in seconds.
    #[serde(default)]
    pub pull_round_trip_s: Option<f64>,
    #[serde(default)]
    pub pull_round_trip_p90_s: Option<f64>,
    /// Groups quarantined (kept under `<data_dir>/quarantine/`, never trained) since start.
    pub groups_quarantined: u64,
    /// The version the puller last asked workers for groups for — the learner's version, or
    /// the next one once the step at it has taken its batch (`control::Window::filling`) —
    /// and the `v_min` (oldest admissible version) it asked with:
    /// `version − v_min = min(S, version)`.
    pub last_pull_version: Option<u64>,
    pub last_pull_v_min: Option<u64>,
    pub buffer_pending: Option<u64>,
    pub groups_dropped_stale: u64,
    pub groups_dropped_zero_advantage: u64,
    pub groups_dropped_other: u64,
    /// Pulled groups of producers banned before they were trained (dropped untrained).
    #[serde(default)]
    pub groups_dropped_banned: u64,
    pub groups_pruned: u64,
    /// Observed staleness Δ = v − v_τ of trained groups → count.
    pub staleness_histogram: BTreeMap<u64, u64>,
    pub staleness_max: u64,
    pub reward_first: Option<f64>,
    /// Mean reward over the last 20 steps.
    pub reward_recent: Option<f64>,
    /// Where the rewards of `reward_first` / `reward_recent` come from: `recomputed` (the
    /// learner recomputed every trained sample's reward from its response,
    /// `verification.recompute_rewards`) or `reported` (the workers' claims, not verified).
    pub reward_basis: String,
    /// Mean reward of the last (at most 64) trained groups that were fully verified: rewards
    /// recomputed and sampled tokens and log-probs checked under the claimed version — the
    /// figure no unchecked group can move. `null` before the first.
    pub reward_recent_checked: Option<f64>,
    /// How many groups `reward_recent_checked` averages.
    pub reward_checked_groups: usize,
    /// Buffered groups of banned workers, dropped untrained (counted as rejected).
    pub groups_rejected_after_ban: u64,
    /// Admission, probation and shares (`docs/security.md`, "Probation and admission").
    pub admission: AdmissionStatus,
    pub last_step: Option<LastStep>,
    /// The run's curves (reward per step; exact evaluation per published version).
    #[serde(default)]
    pub curve: Curve,
}

/// Most points kept per curve: past it every other point is dropped (the whole run keeps
/// its shape at half the resolution; the newest point is always kept).
pub const CURVE_POINTS: usize = 1000;

/// What the admin page draws over the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Curve {
    /// (step, mean reward of the step).
    pub reward: Vec<(u64, f64)>,
    /// The exact evaluation of each published version (environments with an exact
    /// evaluator: Kuhn poker).
    pub eval: Vec<EvalPoint>,
    /// The opponent the evaluation is against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opponent: Option<String>,
    /// One point per training step, in wall-clock time: what the admin page charts against a
    /// time axis.
    pub timeline: Vec<TimePoint>,
}

/// The learner's figures at the end of one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimePoint {
    /// When the step ended (Unix milliseconds).
    pub unix_ms: u64,
    pub step: u64,
    /// Mean reward of the step's groups.
    pub reward: f64,
    /// T_idle / (T_idle + T_train) since start.
    pub bubble: f64,
    /// The T_bcast estimate then (`null` before the first broadcast completed).
    pub t_bcast_s: Option<f64>,
    /// Rollout throughput as the learner consumes it: groups trained in the step over the
    /// step's wall time (waiting for groups included), groups/s.
    pub groups_per_s: f64,
}

impl Curve {
    /// Appends to a curve, thinning it past [`CURVE_POINTS`].
    pub fn push<T>(points: &mut Vec<T>, p: T) {
        if points.len() >= CURVE_POINTS {
            let mut i = 0;
            points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
        points.push(p);
    }
}

/// The exact figures of one published version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    pub version: u64,
    /// Expected return per episode against the environment's opponent.
    pub ev: f64,
    /// The best response's value against that opponent.
    pub best_response: f64,
    /// What a best-responding opponent wins against the policy (0 at an equilibrium).
    pub exploitability: f64,
    /// Mean probability of an output that is no legal action.
    #[serde(default)]
    pub illegal_mass: f64,
    /// When the illegal mass exceeds `rollout::eval::ILLEGAL_MASS_CHECK`: the mean chips of
    /// sampled hands (the exact EV assumes canonical conversations after illegal words) and
    /// its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_ev: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_stderr: Option<f64>,
}

/// The learner's admission figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AdmissionStatus {
    /// `open`, `allow_list` or `ticket`.
    pub mode: String,
    /// Proof of work asked of each peer id (bits; 0 = none).
    pub pow_bits: u32,
    /// N: a worker's first N accepted groups are all checked (probation).
    pub probation_groups: u64,
    pub max_peer_share: f64,
    pub probation_share: f64,
    /// Admitted active workers past probation.
    pub established_workers: usize,
    /// Workers not admitted, and why.
    pub refused: BTreeMap<String, String>,
    /// Evidence against workers, per peer id (non-zero counters only): `skipped` group
    /// numbers (withheld groups), `backlog_capped` pulls where a claimed backlog beyond four
    /// times its buffer share met the share cap.
    pub evidence: BTreeMap<String, BTreeMap<String, u64>>,
    /// What the verification pipeline verified of each worker.
    pub workers: Vec<WorkerStanding>,
    /// The sampling margins each spot-checked worker earned (`docs/security.md`, "Earned
    /// margins"), by peer id.
    pub earned_margins: BTreeMap<String, EarnedMarginStatus>,
}

/// The margins one worker earned by its measured sampling.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EarnedMarginStatus {
    /// The dtype its heartbeats claim.
    pub claimed: Option<String>,
    /// The log-prob tolerance and δ its last checked group was judged at.
    pub tolerance: f64,
    pub delta: f64,
    /// Checked groups, tokens and tokens in the margin band (admitted only by the margins).
    pub groups: u64,
    pub tokens: u64,
    pub band_tokens: u64,
    /// The largest log-prob spread measured against the learner's recompute.
    pub max_spread: f64,
    /// Groups refused for tokens inside the claimed margins but outside the earned ones.
    pub unearned: u64,
}

/// One worker's verified history.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerStanding {
    pub peer_id: String,
    /// Groups that passed every stage.
    pub accepted: u64,
    /// Groups refused by a stage.
    pub rejected: u64,
    /// Group numbers it skipped for good.
    pub skipped: u64,
    /// Still on probation (every group checked, the probation share applies).
    pub probation: bool,
    /// Fraction of its next groups that get the full check.
    pub check_rate: f64,
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
    /// Σμ of the active workers as the scheduler counts it: each claim capped by the verified
    /// rate (`roles::scheduler::CLAIM_TOLERANCE`).
    pub active_mu: f64,
    /// Each worker's generation rate as the learner verified it: valid groups delivered per
    /// second of the time the learner asked for groups (groups/s), once measured.
    pub verified_mu: std::collections::BTreeMap<String, f64>,
    /// Workers whose claimed μ counted for less than claimed (more than
    /// `CLAIM_TOLERANCE` × their verified rate).
    pub claims_capped: Vec<String>,
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
    /// Generation waits for a newer snapshot: the installed one is below the learner's window
    /// (its last pull's `v_min`; in sequential mode, every version bump until the new one
    /// installs).
    pub behind_window: bool,
    pub errors: u64,
    /// Moving average of the groups' mean rewards.
    pub reward_ema: f64,
    /// The learner's activation order keeps this worker on standby.
    pub standby: bool,
    /// Version of the last group written.
    pub last_group_version: u64,
    pub pending: Option<u64>,
    /// Where the installed payload stands on the learner's chain of bf16 deltas (`null`
    /// before the first install; `docs/broadcast.md`, "Catch-up").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installed_payload: Option<InstalledPayload>,
    /// Catch-ups done: a delta version this worker had no base for, reached by fetching the
    /// deltas after what it held, or the keyframe and the deltas since.
    pub catch_ups: u64,
    /// Bytes fetched for those catch-ups.
    pub catch_up_bytes: u64,
    /// The version rebuilt from the durable payload in the chunk store at start (`null`:
    /// none held).
    pub restored_version: Option<u64>,
}

/// Whether a worker's installed version is a keyframe or a delta on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadPosition {
    /// A full payload.
    Keyframe,
    /// A delta (or a chain of deltas) applied to the keyframe named.
    Delta,
}

/// A worker's installed payload on the delta chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstalledPayload {
    pub version: u64,
    pub position: PayloadPosition,
    /// The keyframe the chain starts at (the installed version itself on a keyframe; `null`
    /// when this worker no longer holds the chain's manifests).
    pub keyframe_version: Option<u64>,
    /// Deltas applied since that keyframe.
    pub deltas_since_keyframe: u64,
}

/// What the learner's published versions cost (bf16 delta snapshots): bytes per version by
/// kind and the workers' catch-ups it served.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SnapshotPayloads {
    pub keyframes: u64,
    pub deltas: u64,
    /// Mean bytes of a version published whole.
    pub keyframe_bytes_mean: Option<f64>,
    /// Mean bytes of a version published as a delta.
    pub delta_bytes_mean: Option<f64>,
    /// Bytes of the delta versions over the full bf16 bytes of the same versions.
    pub delta_ratio: Option<f64>,
    /// Bytes of the newest published version, and whether it was a delta.
    pub last_bytes: Option<u64>,
    pub last_delta: Option<bool>,
    /// Manifest requests for a version older than the newest the learner answered: each is
    /// one link of a worker's catch-up (`dissemination_catch_ups_served_total`).
    pub catch_ups_served: u64,
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
    /// Payload bytes sent: the whole snapshot, or a delta's bytes.
    pub bytes: usize,
    /// Bytes of the full snapshot payload of this version.
    #[serde(default)]
    pub full_bytes: usize,
    /// Whether the version went out as a delta (else whole: a keyframe).
    #[serde(default)]
    pub delta: bool,
    /// Fraction of bf16 values changed since the version before (synthetic delta rounds).
    #[serde(default)]
    pub changed_frac: Option<f64>,
    /// Seconds to make the payload (and encode the delta) before publishing.
    #[serde(default)]
    pub prepare_s: f64,
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

/// Fills each rollout worker's `install_lag`: versions its installed snapshot trails
/// `version` (this node's: the learner's newest published, a worker's installed).
pub fn fill_install_lag(peers: &mut [p2p::PeerStatus], version: Option<u64>) {
    for p in peers.iter_mut() {
        if p.role == Some(p2p::Role::Rollout) {
            p.install_lag = version
                .zip(p.installed_version)
                .map(|(v, i)| v.saturating_sub(i));
        }
    }
}

/// Fills each peer's `chain` and `position` from the current plan's `chains` (peer ids;
/// `chains[j][k]` is chain `j`, position `k`, 0 = receives from the learner). Peers outside
/// the plan (fetch-only, standby, not yet planned) keep `null`.
pub fn fill_chain_positions(peers: &mut [p2p::PeerStatus], chains: Option<&[Vec<String>]>) {
    let Some(chains) = chains else {
        return;
    };
    for p in peers.iter_mut() {
        for (j, chain) in chains.iter().enumerate() {
            if let Some(k) = chain.iter().position(|id| *id == p.peer_id) {
                p.chain = u32::try_from(j).ok();
                p.position = u32::try_from(k).ok();
            }
        }
    }
}

/// One line on this node's reachability for the human `status` view, with the relay
/// server's load when it serves as a relay.
pub fn nat_line(net: &p2p::NetworkStatus) -> String {
    let nat = &net.nat;
    let mut line = format!(
        "reachability {}  (AutoNAT {:?}, relay reservations {}, hole punches {} ok / {} failed)",
        net.reachability,
        nat.autonat,
        nat.reservations.len(),
        nat.holepunch_successes,
        nat.holepunch_failures,
    );
    if let Some(r) = &nat.relay_server {
        line.push_str(&format!(
            "\nrelay server: {} reservations, {} circuits open ({} accepted, {} denied since start)",
            r.reservations, r.circuits, r.circuits_accepted_total, r.circuits_denied_total
        ));
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str) -> p2p::PeerStatus {
        serde_json::from_value(serde_json::json!({
            "peer_id": id, "role": "rollout", "addrs": [], "installed_version": null,
            "score": 50.0, "speed": 0.0, "success": 100.0, "stability": 0.0, "decay": 1.0,
            "avg_speed_bps": 0.0, "successes": 0, "failures": 0, "consecutive_failures": 0,
            "chain": null, "position": null, "mu": null,
            "cost_per_hour": null, "pending": null, "active": true, "connected": true,
            "node_version": null, "agent_version": null, "availability": null,
            "forward_rate_bps": null, "receive_rate_bps": null, "heartbeat_age_s": null,
            "heartbeats": 0, "started_unix_ms": null, "rejected_messages": 0,
            "gossip_score": null
        }))
        .expect("a peer row")
    }

    #[test]
    fn chain_positions_come_from_the_plan() {
        let mut peers = vec![peer("a"), peer("b"), peer("c"), peer("d")];
        let chains = vec![vec!["b".to_string(), "a".into()], vec!["c".to_string()]];
        fill_chain_positions(&mut peers, Some(&chains));
        let got: Vec<(Option<u32>, Option<u32>)> =
            peers.iter().map(|p| (p.chain, p.position)).collect();
        assert_eq!(
            got,
            [
                (Some(0), Some(1)),
                (Some(0), Some(0)),
                (Some(1), Some(0)),
                (None, None)
            ]
        );
        // An older peer row without reachability still decodes.
        assert_eq!(peers[0].reachability, None);
        let mut none = vec![peer("a")];
        fill_chain_positions(&mut none, None);
        assert_eq!(none[0].chain, None);
    }
}
