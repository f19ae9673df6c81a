//! The node's TOML config, resolved once (the shape of ripgrep's `hiargs.rs`): the file is
//! parsed into typed settings (serde enums for every closed set of values, unknown keys
//! rejected), command-line overrides are applied, and [`validate`] reports every bad value with
//! its key path and what is allowed — all at once, before anything is created. What the node
//! runs with is the resulting [`NodeConfig`]; nobody re-reads the file.
//!
//! The types are `Serialize` too: `echo-node demo` and the testnet harness write node configs
//! with `toml` from these structs, so a key renamed here is renamed for them.

mod admission;
mod parse;
mod validate;
mod verification;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use admission::{AdmissionConfig, AdmissionMode};
pub use learner::Objective;
pub use parse::{Location, Problem};
pub use verification::{PerDtype, VerificationConfig};

/// What a node does in the swarm: `learner`, `rollout`, or `relay` (a relay / bootstrap node:
/// circuit relay server, Kademlia and AutoNAT server; no model, no stores). The same type
/// travels in heartbeats.
pub use p2p::Role;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// `learner` (one per swarm), `rollout`, or `relay` (reads only `[network]`).
    pub role: Role,
    /// Name of the swarm; gossip topics and manifests carry it.
    pub swarm_id: String,
    /// Where the node keeps its key and stores.
    pub data_dir: PathBuf,
    /// The node key; default `<data_dir>/node.key` (created at first start).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Hex ed25519 public key of the swarm's learner: the swarm's authority (`docs/protocol.md`).
    /// Required for rollout nodes; a learner checks it against its own key.
    #[serde(default)]
    pub learner_public_key: Option<String>,
    #[serde(default)]
    pub network: p2p::NetworkConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    /// The policy model (both roles; a worker must use the learner's model).
    #[serde(default)]
    pub model: ModelConfig,
    /// The task the swarm trains on (both roles).
    #[serde(default)]
    pub task: TaskConfig,
    /// Learner settings (read by `role = "learner"` only).
    #[serde(default)]
    pub learner: LearnerConfig,
    /// Rollout settings (read by `role = "rollout"` only).
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// Snapshot dissemination (read by the learner).
    #[serde(default)]
    pub broadcast: BroadcastConfig,
    /// The provisioning scheduler (read by the learner).
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// What the learner verifies of pulled groups (read by the learner).
    #[serde(default)]
    pub verification: VerificationConfig,
    /// Which workers the learner pulls from and the batch shares of new ones (learner); the
    /// credential a worker presents (rollout).
    #[serde(default)]
    pub admission: AdmissionConfig,
}

/// How the scheduler ranks workers for activation.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Ranking {
    /// Cheapest per unit of throughput first, ρ = c/μ (ECHO-2's rule).
    Rho,
    /// A fixed pseudo-random order: the ablation baseline; needs `active_workers`.
    Random,
}

impl fmt::Display for Ranking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ranking::Rho => "rho",
            Ranking::Random => "random",
        })
    }
}

/// `[scheduler]`: cost-aware activation of rollout workers (ECHO-2 §3.4; `docs/learner.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Off: every connected worker generates. On: the learner keeps the cheapest workers (by
    /// ρ = cost / μ) that reach μ_target = γ·μ_min active and the rest on standby.
    pub enabled: bool,
    /// Operator override: keep exactly this many workers active (the cheapest by ρ; workers
    /// not yet measured rank by cost), instead of following μ_target.
    pub active_workers: Option<usize>,
    /// Seconds μ_pool must stay below the target (or above it by the margin) before workers
    /// are activated (released); a failed worker is replaced at once.
    pub sustain_s: f64,
    /// Release only above μ_target·(1 + margin).
    pub release_margin: f64,
    /// The activation order is re-gossiped at least this often (late joiners learn it).
    pub announce_interval_ms: u64,
    /// `rho` (cheapest per unit of throughput first, the paper's rule) or `random` (a fixed
    /// random order: the ablation baseline; needs `active_workers`).
    pub ranking: Ranking,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: false,
            active_workers: None,
            sustain_s: 30.0,
            release_margin: 0.25,
            announce_interval_ms: 2000,
            ranking: Ranking::Rho,
        }
    }
}

/// How the learner disseminates snapshots: `chain` (scored forwarding chains, ECHO-2 §4.2) or
/// `star` (the learner sends to every worker; the baseline).
pub use dissemination::BroadcastMode;

/// `[broadcast]`: how the learner disseminates snapshots (`docs/broadcast.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BroadcastConfig {
    /// `chain` (scored forwarding chains, the default) or `star` (the learner sends to every
    /// worker; the baseline).
    pub mode: BroadcastMode,
    /// B̂w: the forwarding bandwidth assumed per worker when planning chains (Mbit/s);
    /// N_ch = max(1, ⌊B0 / B̂w⌋) with B0 = `network.learner_mbps`.
    pub worker_mbps: f64,
    /// The dtype of the weights in a snapshot: `f32` (exactly the learner's weights) or `bf16`
    /// (half the bytes on every hop; workers load it into their model's dtype). The learner
    /// always trains and checkpoints in f32.
    pub dtype: SnapshotDtype,
    /// Versions per plan epoch: at the first version of each the learner re-draws the chain
    /// seats among workers of similar score, so that no seat is held for a whole run
    /// (`docs/broadcast.md`, "Seats").
    pub plan_epoch: u64,
    /// With `dtype = "bf16"`: publish each version as a sparse delta against the bf16 payload
    /// published before it (changed positions + values; `docs/broadcast.md`, "Delta
    /// snapshots"). Unset = on for bf16; it cannot be on for f32.
    pub delta: Option<bool>,
    /// With deltas: a full payload (keyframe) at least every this many versions, so a worker
    /// that fell behind needs at most this many − 1 deltas; also whenever a delta would not
    /// be smaller than the full payload.
    pub keyframe_every: u64,
    /// MiB of filler a parent sends on a chunk stream it opens to a new child before the
    /// first version exists, so that the stream's flow-control window has grown by then
    /// (`docs/protocol.md`, "Warm-up filler"; 0 = none, at most 32). Once per new
    /// parent–child pair, while the links are idle.
    pub warm_up_mib: u64,
}

impl BroadcastConfig {
    /// Whether the learner publishes deltas (`delta`, defaulting to on for bf16).
    pub fn delta_enabled(&self) -> bool {
        self.dtype == SnapshotDtype::Bf16 && self.delta.unwrap_or(true)
    }
}

impl Default for BroadcastConfig {
    fn default() -> Self {
        BroadcastConfig {
            mode: BroadcastMode::Chain,
            worker_mbps: 100.0,
            dtype: SnapshotDtype::F32,
            plan_epoch: control::seats::EPOCH_VERSIONS,
            delta: None,
            keyframe_every: 16,
            warm_up_mib: dissemination::DEFAULT_WARM_UP_BYTES >> 20,
        }
    }
}

/// `broadcast.dtype`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotDtype {
    F32,
    Bf16,
}

impl SnapshotDtype {
    pub fn dtype(self) -> policy::DType {
        match self {
            SnapshotDtype::F32 => policy::DType::F32,
            SnapshotDtype::Bf16 => policy::DType::BF16,
        }
    }
}

/// `[model]`: which policy the swarm trains. Workers must name the same model as the learner:
/// a snapshot whose model-config hash differs from the worker's is refused at install.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// `"embedded"` (the tiny built-in Qwen3 with a byte tokenizer) or the path of a local
    /// Hugging Face folder (config.json, tokenizer.json, *.safetensors). Nothing is downloaded.
    pub source: String,
    /// Seed of the embedded model's random initialisation (the learner's; workers receive
    /// the weights as snapshots).
    pub seed: u64,
    /// Where the model runs: `auto` (the first CUDA GPU when this binary was built with the
    /// `cuda` feature and one is present, else the CPU), `cpu`, `cuda` (= `cuda:0`) or
    /// `cuda:N`. `echo-node run|demo --device` overrides it.
    pub device: policy::DeviceChoice,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            source: "embedded".into(),
            seed: 0,
            device: policy::DeviceChoice::Auto,
        }
    }
}

/// What `[task] name` names.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// A built-in task or environment (`tasks::build_env`).
    #[default]
    Builtin,
    /// A program speaking the environment protocol (`[task.external]`, docs/environments.md).
    External,
}

impl TaskKind {
    fn is_builtin(&self) -> bool {
        *self == TaskKind::Builtin
    }
}

/// `[task]`: a built-in task (`arith`, `jsonl-math`, `knights-knaves`) or multi-turn
/// environment (`kuhn-poker`, `holdem`) and its parameters, or (`kind = "external"`) an
/// environment program described by `[task.external]`, to which `params` are sent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    #[serde(skip_serializing_if = "TaskKind::is_builtin")]
    pub kind: TaskKind,
    pub name: String,
    /// Task parameters, e.g. `{ max_operand = 9, ops = "+" }` (see docs/tasks.md).
    pub params: serde_json::Value,
    /// Multi-turn environments: most agent turns per episode (default: the environment's).
    /// Learner and workers must agree on the three budgets (the learner replays episodes
    /// with them; docs/environments.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Most tokens the model samples in one turn (default: the environment's suggestion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turn_tokens: Option<usize>,
    /// Most tokens of an episode after its first prompt (turns and observations together).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_episode_tokens: Option<usize>,
    /// `kind = "external"`: the program, its pin and its limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<tasks::external::ExternalSpec>,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            name: "arith".into(),
            params: serde_json::json!({}),
            max_turns: None,
            max_turn_tokens: None,
            max_episode_tokens: None,
            kind: TaskKind::Builtin,
            external: None,
        }
    }
}

impl TaskConfig {
    /// The configured environment: a built-in one, or the external program started (once
    /// per process and pin; `tasks::external::start` checks its determinism).
    pub fn build_env(
        &self,
    ) -> Result<std::sync::Arc<dyn tasks::env::Environment>, tasks::TaskError> {
        match (self.kind, &self.external) {
            (TaskKind::Builtin, None) => tasks::build_env(&self.name, &self.params),
            (TaskKind::External, Some(spec)) => {
                Ok(tasks::external::start(&self.name, &self.params, spec)?)
            }
            (TaskKind::Builtin, Some(_)) => Err(tasks::TaskError::InvalidParams {
                task: self.name.clone(),
                reason: "[task.external] needs kind = \"external\"".into(),
            }),
            (TaskKind::External, None) => Err(tasks::TaskError::InvalidParams {
                task: self.name.clone(),
                reason: "kind = \"external\" needs a [task.external] table naming the command"
                    .into(),
            }),
        }
    }

    /// A `--task` of the command line: a built-in name, or `external:ADAPTER[:ARG]` for one
    /// of the adapters under `envs/` (`testenv`, `reasoning-gym:DATASET`,
    /// `textarena:ENV_ID`, `verifiers:ENV_ID`; ARG goes into `params`), run by
    /// `$ECHO_ENV_PYTHON` (default `python3`) with the default limits.
    pub fn from_cli(task: &str, params: serde_json::Value) -> Result<Self, tasks::TaskError> {
        let Some(rest) = task.strip_prefix("external:") else {
            return Ok(TaskConfig {
                name: task.to_string(),
                params,
                ..Default::default()
            });
        };
        let (adapter, arg) = rest.split_once(':').unwrap_or((rest, ""));
        let bad = |reason: String| tasks::TaskError::InvalidParams {
            task: task.to_string(),
            reason,
        };
        let (script, key) = match adapter {
            "testenv" => ("testenv.py", None),
            "reasoning-gym" => ("reasoning_gym_env.py", Some("dataset")),
            "textarena" => ("textarena_env.py", Some("env_id")),
            "verifiers" => ("verifiers_env.py", Some("env_id")),
            other => {
                return Err(bad(format!(
                    "unknown adapter {other:?} (testenv, reasoning-gym, textarena, verifiers)"
                )))
            }
        };
        let mut params = match params {
            serde_json::Value::Null => serde_json::json!({}),
            p @ serde_json::Value::Object(_) => p,
            _ => return Err(bad("parameters must be a JSON object".into())),
        };
        if let Some(key) = key {
            if arg.is_empty() {
                return Err(bad(format!("give the {key}: external:{adapter}:NAME")));
            }
            params[key] = serde_json::json!(arg);
        }
        let dir = if std::path::Path::new("envs").join(script).is_file() {
            std::path::PathBuf::from("envs")
        } else {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../envs")
        };
        // Absolute: the configs written from this one may run elsewhere (`demo`'s nodes).
        let file = |f: &str| std::fs::canonicalize(dir.join(f)).unwrap_or_else(|_| dir.join(f));
        let python = std::env::var("ECHO_ENV_PYTHON").unwrap_or_else(|_| "python3".into());
        Ok(TaskConfig {
            kind: TaskKind::External,
            name: rest.to_string(),
            params,
            external: Some(tasks::external::ExternalSpec {
                command: vec![python, file(script).display().to_string()],
                pin_files: vec![file("echo_env.py")],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// The pin learner and workers must agree on (external environments only; `None` for
    /// built-in ones or when a pinned file cannot be read, which starting refuses anyway).
    pub fn env_pin(&self) -> Option<[u8; 32]> {
        match (self.kind, &self.external) {
            (TaskKind::External, Some(spec)) => {
                tasks::external::pin(&self.name, &self.params, spec).ok()
            }
            _ => None,
        }
    }

    /// The episode budget of `env` with this section's overrides.
    pub fn budget(
        &self,
        env: &dyn tasks::env::Environment,
    ) -> Result<tasks::env::Budget, tasks::TaskError> {
        let meta = env.metadata();
        tasks::env::Budget::of(&meta).with(
            &meta,
            self.max_turns,
            self.max_turn_tokens,
            self.max_episode_tokens,
        )
    }
}

/// Learner mode (`docs/learner.md`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LearnerMode {
    /// Bounded staleness: train on groups with `v_τ ≥ v − S`, publish every κ steps.
    Async,
    /// ECHO's sequential mode: every batch comes from the learner's current version
    /// (S = 0, κ = 1: publish after every step and wait for groups generated under it).
    Sequential,
}

/// `[learner]`: Algorithm 1's knobs. Defaults are the ones measured in docs/learner.md to make
/// the embedded model learn `arith` on two CPU cores.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LearnerConfig {
    pub mode: LearnerMode,
    /// `grpo`, `dr_grpo`, `gspo` or `gepo`.
    pub objective: Objective,
    /// Staleness budget S (groups with `v_τ < v − S` never enter a batch).
    pub staleness: u64,
    /// Publication period κ; default max(S − 1, 1).
    pub kappa: Option<u64>,
    /// B: groups per step (R = B × group_size trajectories).
    pub groups_per_step: usize,
    /// n: samples per group the learner expects (the workers' `rollout.group_size`).
    pub group_size: usize,
    /// Padded tokens per forward/backward pass: a step is micro-batched into passes of at
    /// most this many tokens, gradients summed (bounds activation memory; 0 = one pass).
    pub micro_batch_tokens: usize,
    pub lr: f64,
    /// Weight β of the KL penalty to the initial (warm-started) policy; 0 = off.
    pub kl_beta: f64,
    /// Clip range ε.
    pub clip_eps: f64,
    /// Truncated importance-ratio cap C (ECHO-2 eq. 24); unset = off.
    pub is_cap: Option<f64>,
    /// Temperature T of the learner's log-probs; must equal `rollout.temperature`.
    pub temperature: f32,
    /// The workers' nucleus mass, which the spot check's sampling check applies; must equal
    /// `rollout.top_p`.
    pub top_p: f32,
    /// Supervised warm-start steps on the task's reference answers before version 0 is
    /// published (0 = off; a restarted learner resumes from its checkpoint instead).
    pub warm_start_steps: usize,
    /// Checkpoint every N steps (and at shutdown).
    pub checkpoint_every: u64,
    /// Checkpoints kept on disk (the newest first): a restart whose newest checkpoint cannot
    /// be read falls back to the newest readable one, with a WARN naming the broken file.
    pub keep_checkpoints: usize,
    /// Stop training after this many steps in total (0 = never); the node keeps serving.
    pub max_steps: u64,
    /// How often the learner pulls from workers when its buffer is short (milliseconds); it
    /// also pulls at once whenever a training step takes a batch or finds none.
    pub pull_interval_ms: u64,
    /// Groups the learner keeps buffered (0 = 2 × groups_per_step: the next batch is pulled
    /// while the current one trains; more only ages the groups — the freshest are trained
    /// first and the rest expire).
    pub buffer_groups: u64,
    /// A pulled group with a sampled-token log-prob below this is refused (`docs/security.md`):
    /// an honest sampler at temperature ≥ 0.5 over a 150 k vocabulary stays far above it, and
    /// a forged −1e4 would overflow the importance ratio.
    pub logprob_floor: f32,
    /// LoRA post-training: `lora = { rank = 8, alpha = 16 }` (optional `targets`, default all
    /// seven projections). The model loaded from `[model]` becomes the frozen base and only
    /// the adapters train; absent = full fine-tuning (`docs/model.md`, "LoRA").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<policy::LoraConfig>,
    /// A learner training on the CPU keeps freed memory in its heap instead of handing large
    /// blocks back to the kernel after every use (`learner::heap`): a quarter to a half less
    /// step time at Qwen3-0.6B's shape for up to 23 % more resident memory. No effect on a GPU.
    pub keep_freed_memory: bool,
    /// The learner's compute dtype: `auto` (bf16 on a GPU, f32 on the CPU), `bf16` (GPU
    /// only), `f16` or `f32`; master weights, moments and losses stay f32 (`docs/learner.md`).
    pub precision: learner::Precision,
    /// Recompute each layer's activations in the backward (attention in chunks of queries):
    /// one layer's activations per pass instead of all, for one more forward.
    pub recompute: bool,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            mode: LearnerMode::Async,
            objective: Objective::Gepo,
            staleness: 3,
            kappa: None,
            groups_per_step: 4,
            group_size: 16,
            micro_batch_tokens: 4096,
            lr: 1e-3,
            kl_beta: 0.05,
            clip_eps: 0.2,
            is_cap: None,
            temperature: 1.2,
            top_p: 1.0,
            warm_start_steps: 60,
            checkpoint_every: 50,
            keep_checkpoints: learner::checkpoint::DEFAULT_KEEP_CHECKPOINTS,
            max_steps: 0,
            pull_interval_ms: 100,
            buffer_groups: 0,
            logprob_floor: storage::record::DEFAULT_LOGPROB_FLOOR,
            lora: None,
            keep_freed_memory: true,
            precision: learner::Precision::Auto,
            recompute: false,
        }
    }
}

/// `[rollout]`: how a worker samples.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// n: samples per prompt (one group).
    pub group_size: usize,
    /// The most tokens a response may have. On a learner: the workers' value, where it holds
    /// a single-turn response that has no stop token to end (`response_end`).
    pub max_new_tokens: usize,
    /// Sampling temperature; must equal `learner.temperature`.
    pub temperature: f32,
    pub top_p: f32,
    /// Seed of sampling; default derived from the node's key. (Prompts are not chosen by the
    /// worker: each group answers the prompt assigned to its sequence number, see
    /// `docs/security.md`, "Verified rollouts".)
    pub seed: Option<u64>,
    /// Cap on this worker's production in groups/s (0 = none): emulates a slower machine in
    /// a testnet.
    pub max_groups_per_s: f64,
    /// The dtype the worker samples in: `auto` (bf16 on CUDA, f32 on the CPU), `f32`, `f16`
    /// or `bf16` (CUDA only). Reported in heartbeats: the learner judges the worker's groups
    /// with that dtype's tolerance and margin (`[verification]`).
    pub dtype: SamplingDtype,
    /// Sequences a worker decodes in one batch: `max_batch / group_size` groups per step,
    /// their samples decoded together with slots refilled as samples finish (single-turn tasks
    /// on the inference path; `docs/gpu.md`, "Many groups in flight"). 0: one group at a time.
    pub max_batch: usize,
}

/// `rollout.dtype`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SamplingDtype {
    #[default]
    Auto,
    F32,
    F16,
    Bf16,
}

impl SamplingDtype {
    /// The dtype generation runs in on `device`.
    pub fn resolve(self, device: &policy::Device) -> policy::DType {
        match self {
            SamplingDtype::Auto => policy::infer::default_dtype(device),
            SamplingDtype::F32 => policy::DType::F32,
            SamplingDtype::F16 => policy::DType::F16,
            SamplingDtype::Bf16 => policy::DType::BF16,
        }
    }

    /// The name a heartbeat reports for generation in `dtype` on `device`.
    pub fn report(self, device: &policy::Device) -> &'static str {
        match self.resolve(device) {
            policy::DType::F16 => "f16",
            policy::DType::BF16 => "bf16",
            _ => "f32",
        }
    }
}

impl RolloutConfig {
    /// The rule this worker samples with, as its heartbeats report it.
    pub fn sampling_report(&self) -> p2p::SamplingReport {
        p2p::SamplingReport {
            temperature: self.temperature,
            top_p: self.top_p,
            max_new_tokens: self.max_new_tokens as u32,
            env_pin: None,
        }
    }
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            group_size: 16,
            max_new_tokens: 6,
            temperature: 1.2,
            top_p: 1.0,
            seed: None,
            max_groups_per_s: 0.0,
            dtype: SamplingDtype::Auto,
            max_batch: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Snapshot chunk size in KiB (default 1 MiB; `storage::manifest` bounds it).
    pub chunk_size_kib: u32,
    /// Snapshots kept in the chunk store; older chunks are collected.
    pub keep_snapshots: usize,
    /// How long a pulled lease stays valid before its groups are pullable again.
    pub lease_ttl_s: u64,
    /// The rollout engine pauses while more groups than this are pending.
    pub max_pending_groups: u64,
    /// Memory tier of the chunk store (MiB): verified chunks are forwarded and assembled from
    /// memory and written to disk behind (0: write every chunk through).
    pub chunk_memory_mb: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            chunk_size_kib: 1024,
            keep_snapshots: 3,
            lease_ttl_s: 30,
            max_pending_groups: 10_000,
            chunk_memory_mb: storage::DEFAULT_MEMORY_BYTES >> 20,
        }
    }
}

/// Every problem found in a config file.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

impl ConfigError {
    /// `Ok` when `problems` is empty, else the error naming `file`.
    pub(crate) fn check(file: &Path, problems: Vec<Problem>) -> Result<(), ConfigError> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                file: file.to_path_buf(),
                problems,
            })
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "invalid config {} ({n} problem{}):",
            self.file.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {}: {}", p.key, p.message)?;
            if let Some(at) = &p.at {
                write!(f, "\n    at {at}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl NodeConfig {
    /// A config with every section at its default: what a file naming only `role`,
    /// `swarm_id` and `data_dir` means.
    pub fn new(role: Role, swarm_id: &str, data_dir: PathBuf) -> Self {
        NodeConfig {
            role,
            swarm_id: swarm_id.to_string(),
            data_dir,
            key_file: None,
            learner_public_key: None,
            network: p2p::NetworkConfig::default(),
            storage: StorageConfig::default(),
            model: ModelConfig::default(),
            task: TaskConfig::default(),
            learner: LearnerConfig::default(),
            rollout: RolloutConfig::default(),
            broadcast: BroadcastConfig::default(),
            scheduler: SchedulerConfig::default(),
            verification: VerificationConfig::default(),
            admission: AdmissionConfig::default(),
        }
    }

    /// The config as a TOML file `echo-node run --config` reads back to the same value.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Writes [`Self::to_toml`] to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = self
            .to_toml()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        std::fs::write(path, text)
    }

    /// Reads and parses `file`; values are validated by [`NodeConfig::validate`]. When the
    /// file has problems, the values that did parse are validated too, so that every problem
    /// is reported at once ([`parse`]).
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let err = |problems: Vec<Problem>| ConfigError {
            file: file.to_path_buf(),
            problems,
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| err(vec![Problem::new("(file)", format!("cannot read: {e}"))]))?;
        let (config, mut problems) = parse::parse_lenient(&text);
        match config {
            Some(c) if problems.is_empty() => Ok(c),
            Some(c) => {
                // Keys dropped for a parse problem are at their defaults: their checks are
                // not reported again.
                let dropped: Vec<String> = problems.iter().map(|p| p.key.clone()).collect();
                if let Err(e) = c.validate_all(file) {
                    problems.extend(e.problems.into_iter().filter(|p| {
                        !dropped
                            .iter()
                            .any(|d| p.key == *d || p.key.starts_with(&format!("{d}.")))
                    }));
                }
                Err(err(problems))
            }
            None => Err(err(problems)),
        }
    }

    /// Parses TOML text; the error lists every problem (with the key path, and the line and
    /// column where the text shows it).
    pub fn parse(text: &str) -> Result<Self, Vec<Problem>> {
        parse::parse(text)
    }

    /// Where the learner keeps its checkpoints.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.data_dir.join("checkpoints")
    }

    pub fn data(&self) -> storage::DataDir {
        storage::DataDir::new(&self.data_dir)
    }

    pub fn key_path(&self) -> PathBuf {
        self.key_file
            .clone()
            .unwrap_or_else(|| self.data().key_file())
    }
}

impl LearnerConfig {
    /// The trainer's configuration (sequential mode forces S = 0 and κ = 1).
    pub fn trainer_config(&self) -> learner::Result<learner::TrainerConfig> {
        let (staleness, kappa) = match self.mode {
            LearnerMode::Async => (self.staleness, self.kappa),
            LearnerMode::Sequential => (0, Some(1)),
        };
        Ok(learner::TrainerConfig {
            loss: learner::LossConfig {
                objective: self.objective,
                clip_eps: self.clip_eps,
                kl_beta: self.kl_beta,
                is_cap: self.is_cap,
                ..learner::LossConfig::default()
            },
            optim: learner::AdamWConfig {
                lr: self.lr,
                weight_decay: 0.0,
                max_grad_norm: Some(1.0),
                ..learner::AdamWConfig::default()
            },
            temperature: self.temperature,
            staleness,
            kappa,
            groups_per_step: self.groups_per_step,
            group_size: self.group_size,
            micro_batch_tokens: self.micro_batch_tokens,
            precision: self.precision,
            recompute: self.recompute,
            query_chunk: 0,
        })
    }

    /// Groups kept buffered ahead of training.
    pub fn buffer_target(&self) -> u64 {
        if self.buffer_groups > 0 {
            self.buffer_groups
        } else {
            2 * self.groups_per_step as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    fn ok(text: &str) -> NodeConfig {
        let c = NodeConfig::parse(text).unwrap();
        c.validate(Path::new("t.toml")).unwrap();
        c
    }

    fn problems(text: &str) -> Vec<(String, String)> {
        match NodeConfig::parse(text) {
            Err(p) => p,
            Ok(c) => c.validate(Path::new("t.toml")).unwrap_err().problems,
        }
        .into_iter()
        .map(|p| (p.key, p.message))
        .collect()
    }

    #[test]
    fn minimal_configs_get_defaults() {
        let c = ok("role = \"learner\"\nswarm_id = \"demo\"\ndata_dir = \"d\"\n");
        assert_eq!(c.storage, StorageConfig::default());
        assert_eq!(c.network, p2p::NetworkConfig::default());
        let c = ok(&format!(
            "role = \"rollout\"\nswarm_id = \"demo\"\ndata_dir = \"d\"\nlearner_public_key = \"{KEY}\"\n"
        ));
        assert_eq!(c.role, Role::Rollout);
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_path() {
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[storage]\nkeep_snapshot = 3\n");
        assert_eq!(p[0].0, "storage.keep_snapshot");
        assert!(p[0].1.contains("unknown field `keep_snapshot`"), "{p:?}");
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\ncolour = 1\n");
        assert!(p[0].1.contains("unknown field `colour`"), "{p:?}");
    }

    #[test]
    fn bad_values_name_the_key_and_what_is_allowed() {
        let p = problems("role = \"lerner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n");
        assert_eq!(p[0].0, "role");
        assert!(
            p[0].1.contains("learner") && p[0].1.contains("rollout"),
            "{p:?}"
        );

        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[storage]\nkeep_snapshots = \"three\"\n");
        assert_eq!(p[0].0, "storage.keep_snapshots");

        let p = problems(
            "role = \"rollout\"\nswarm_id = \"bad id!\"\ndata_dir = \"d\"\n\
             [storage]\nkeep_snapshots = 0\nchunk_size_kib = 1\n[network]\nadmin = \"10.0.0.1:80\"\n",
        );
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "swarm_id",
                "learner_public_key",
                "network.admin",
                "storage.chunk_size_kib",
                "storage.keep_snapshots"
            ]
        );
    }

    /// Issue 49 (4): three problems in one file are three problems, each with its key path
    /// and where it is; the values that did parse are checked in the same report.
    #[test]
    fn every_problem_of_a_file_is_reported_at_once_with_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(
            &file,
            "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n\
             [storage]\nkeep_snapshot = 3\nlease_ttl_s = \"long\"\n\
             [learner]\nlr = -1.0\nclip_eps = -7\n",
        )
        .unwrap();
        let e = NodeConfig::load(&file).unwrap_err();
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "storage.keep_snapshot",
                "storage.lease_ttl_s",
                "learner.lr",
                "learner.clip_eps"
            ],
            "{e}"
        );
        let unknown = e.problems[0].at.as_ref().expect("located");
        assert_eq!((unknown.line, unknown.column, unknown.width), (5, 1, 13));
        let typed = e.problems[1].at.as_ref().expect("located");
        assert_eq!((typed.line, typed.column), (6, 15));
        let text = e.to_string();
        assert!(text.contains("(4 problems)"), "{text}");
        assert!(
            text.contains("line 5, column 1") && text.contains("5 | keep_snapshot = 3"),
            "{text}"
        );
        assert!(
            text.contains("| ^^^^^^^^^^^^^\n"),
            "a caret under the key: {text}"
        );
        assert!(
            !text.contains("LossConfig") && !text.contains("AdamWConfig"),
            "no debug dump: {text}"
        );
    }

    /// A TOML syntax error, a duplicate key among them, is reported with its line, column and
    /// a caret.
    #[test]
    fn toml_syntax_errors_have_a_line_a_column_and_a_caret() {
        for (text, line) in [
            (
                "role = \"learner\"\nswarm_id = \"x\"\nswarm_id = \"y\"\n",
                3,
            ),
            ("role = \"learner\"\n[storage\nkeep_snapshots = 3\n", 2),
        ] {
            let p = NodeConfig::parse(text).unwrap_err();
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].key, "(syntax)");
            let at = p[0].at.as_ref().expect("located");
            assert_eq!(at.line, line, "{p:?}");
            let shown = at.to_string();
            assert!(
                shown.contains('^') && shown.contains(&format!("line {line}, column")),
                "{shown}"
            );
        }
    }

    /// Ranges the trainer or its optimiser would refuse only after the node started are
    /// refused here, by key.
    #[test]
    fn trainer_ranges_are_checked_by_key() {
        let head = "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[learner]\n";
        for (line, key) in [
            ("lr = -1.0", "learner.lr"),
            ("lr = 0.0", "learner.lr"),
            ("clip_eps = -7.0", "learner.clip_eps"),
            ("kl_beta = -0.1", "learner.kl_beta"),
            ("is_cap = 0.0", "learner.is_cap"),
            ("temperature = 0.0", "learner.temperature"),
            ("groups_per_step = 0", "learner.groups_per_step"),
            ("keep_checkpoints = 0", "learner.keep_checkpoints"),
        ] {
            let p = problems(&format!("{head}{line}\n"));
            assert!(p.iter().any(|(k, _)| k == key), "{line}: {p:?}");
            assert!(p.iter().all(|(k, _)| k != "learner"), "{line}: {p:?}");
        }
    }

    /// The pre-shared key and the node key are checked before anything is created: present,
    /// well-formed, mode 0600.
    #[cfg(unix)]
    #[test]
    fn psk_and_key_files_are_checked_for_existence_format_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let psk = dir.path().join("swarm.key");
        let data = dir.path().join("data");
        let text = format!(
            "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"{}\"\n[network]\npsk_file = \"{}\"\nquic = false\n",
            data.display(),
            psk.display()
        );
        let c = NodeConfig::parse(&text).unwrap();
        let files = |c: &NodeConfig| -> Vec<String> {
            c.validate_files()
                .into_iter()
                .map(|p| format!("{}: {}", p.key, p.message))
                .collect()
        };
        assert!(files(&c)[0].contains("does not exist"), "{:?}", files(&c));
        std::fs::write(&psk, "not a key").unwrap();
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            files(&c)[0].contains("/key/swarm/psk/1.0.0/"),
            "{:?}",
            files(&c)
        );
        std::fs::write(&psk, p2p::psk_file_contents([3; 32])).unwrap();
        assert!(files(&c).is_empty(), "{:?}", files(&c));
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(files(&c)[0].contains("chmod 600"), "{:?}", files(&c));
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The node key: absent is fine (created at the first start), 0644 or garbage is not.
        std::fs::create_dir_all(&data).unwrap();
        let key = data.join("node.key");
        storage::NodeKey::generate().write_new(&key).unwrap();
        assert!(files(&c).is_empty(), "{:?}", files(&c));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let f = files(&c);
        assert!(
            f[0].starts_with("key_file:") && f[0].contains("chmod 600"),
            "{f:?}"
        );
        std::fs::write(&key, "garbage").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(files(&c)[0].contains("first line"), "{:?}", files(&c));
    }

    #[test]
    fn deltas_default_on_for_bf16_and_are_refused_for_f32() {
        let base = "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[broadcast]\n";
        assert!(
            !ok(base).broadcast.delta_enabled(),
            "f32 ships full payloads"
        );
        assert!(ok(&format!("{base}dtype = \"bf16\"\n"))
            .broadcast
            .delta_enabled());
        let off = ok(&format!("{base}dtype = \"bf16\"\ndelta = false\n"));
        assert!(!off.broadcast.delta_enabled());
        let p = problems(&format!("{base}delta = true\nkeyframe_every = 0\n"));
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["broadcast.delta", "broadcast.keyframe_every"]);
    }

    #[test]
    fn written_configs_read_back_to_the_same_value() {
        let mut c = NodeConfig::new(Role::Rollout, "demo", PathBuf::from("/tmp/x y"));
        c.learner_public_key = Some(KEY.into());
        c.network.listen = vec!["/ip4/127.0.0.1/tcp/0".into()];
        c.learner.objective = Objective::DrGrpo;
        c.learner.kappa = Some(2);
        c.scheduler.ranking = Ranking::Random;
        c.scheduler.active_workers = Some(1);
        c.broadcast.mode = BroadcastMode::Star;
        let text = c.to_toml().unwrap();
        let back = NodeConfig::parse(&text).unwrap();
        back.validate(Path::new("t.toml")).unwrap();
        assert_eq!(back.to_toml().unwrap(), text);
        assert_eq!(back.learner, c.learner);
        assert_eq!(back.broadcast, c.broadcast);
        assert!(
            text.contains("objective = \"dr_grpo\"") && text.contains("mode = \"star\""),
            "{text}"
        );
    }

    #[test]
    fn closed_sets_name_their_values() {
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[broadcast]\nmode = \"ring\"\n");
        assert_eq!(p[0].0, "broadcast.mode");
        assert!(p[0].1.contains("chain") && p[0].1.contains("star"), "{p:?}");
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[learner]\nobjective = \"ppo\"\n");
        assert_eq!(p[0].0, "learner.objective");
        assert!(p[0].1.contains("gepo"), "{p:?}");
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[scheduler]\nranking = \"cost\"\n");
        assert_eq!(p[0].0, "scheduler.ranking");
        let p = problems("role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[storage]\nchunk_size_kib = 65537\n");
        assert!(p[0].1.contains("4..=65536"), "{p:?}");
    }

    #[test]
    fn lora_settings_are_optional_and_validated() {
        let head = "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n[learner]\n";
        assert_eq!(ok(head).learner.lora, None);
        let c = ok(&format!("{head}lora = {{ rank = 8, alpha = 16 }}\n"));
        assert_eq!(c.learner.lora, Some(policy::LoraConfig::new(8, 16.0)));
        let back = NodeConfig::parse(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back.learner, c.learner);
        for (bad, needle) in [
            ("{ rank = 0, alpha = 16 }", "rank must be at least 1"),
            ("{ rank = 4, alpha = -1 }", "alpha must be positive"),
            (
                "{ rank = 4, alpha = 8, targets = [\"qkv\"] }",
                "unknown target \"qkv\"",
            ),
        ] {
            let p = problems(&format!("{head}lora = {bad}\n"));
            assert_eq!(p[0].0, "learner.lora", "{p:?}");
            assert!(p[0].1.contains(needle), "{p:?}");
        }
        let p = problems(&format!("{head}lora = {{ rank = 4 }}\n"));
        assert!(p[0].1.contains("alpha"), "{p:?}");
    }

    #[test]
    fn shipped_example_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = NodeConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                c.validate(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 2, "expected example configs in {}", dir.display());
    }
}
