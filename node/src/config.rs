//! The node's TOML config: parsing (unknown keys rejected) and validation that reports every
//! bad value with its key path and what is allowed.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Learner,
    Rollout,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Learner => "learner",
            Role::Rollout => "rollout",
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// `learner` (one per swarm) or `rollout`.
    pub role: Role,
    /// Name of the swarm; gossip topics and manifests carry it.
    pub swarm_id: String,
    /// Where the node keeps its key and stores.
    pub data_dir: PathBuf,
    /// The node key; default `<data_dir>/node.key` (created at first start).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Hex ed25519 public key of the swarm's learner: the swarm's authority (SPEC §3).
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
}

/// `[scheduler]`: cost-aware activation of rollout workers (SPEC §10, ECHO-2 §3.4).
#[derive(Debug, Clone, Deserialize, PartialEq)]
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
    pub ranking: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: false,
            active_workers: None,
            sustain_s: 30.0,
            release_margin: 0.25,
            announce_interval_ms: 2000,
            ranking: "rho".into(),
        }
    }
}

/// `[broadcast]`: how the learner disseminates snapshots (SPEC §6).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BroadcastConfig {
    /// `chain` (scored forwarding chains, the default) or `star` (the learner sends to every
    /// worker; the baseline).
    pub mode: String,
    /// B̂w: the forwarding bandwidth assumed per worker when planning chains (Mbit/s);
    /// N_ch = max(1, ⌊B0 / B̂w⌋) with B0 = `network.learner_mbps`.
    pub worker_mbps: f64,
}

impl Default for BroadcastConfig {
    fn default() -> Self {
        BroadcastConfig {
            mode: "chain".into(),
            worker_mbps: 100.0,
        }
    }
}

/// `[model]`: which policy the swarm trains. Workers must name the same model as the learner:
/// a snapshot whose model-config hash differs from the worker's is refused at install.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// `"embedded"` (the tiny built-in Qwen3 with a byte tokenizer) or the path of a local
    /// Hugging Face folder (config.json, tokenizer.json, *.safetensors). Nothing is downloaded.
    pub source: String,
    /// Seed of the embedded model's random initialisation (the learner's; workers receive
    /// the weights as snapshots).
    pub seed: u64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            source: "embedded".into(),
            seed: 0,
        }
    }
}

/// `[task]`: a built-in task (`arith`, `jsonl-math`, `knights-knaves`) and its parameters.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    pub name: String,
    /// Task parameters, e.g. `{ max_operand = 9, ops = "+" }` (see docs/tasks.md).
    pub params: serde_json::Value,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            name: "arith".into(),
            params: serde_json::json!({}),
        }
    }
}

/// Learner mode (SPEC §8).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Bounded staleness: train on groups with `v_τ ≥ v − S`, publish every κ steps.
    Async,
    /// ECHO's sequential mode: every batch comes from the learner's current version
    /// (S = 0, κ = 1: publish after every step and wait for groups generated under it).
    Sequential,
}

/// `[learner]`: Algorithm 1's knobs. Defaults are the ones measured in docs/learner.md to make
/// the embedded model learn `arith` on two CPU cores.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LearnerConfig {
    pub mode: Mode,
    /// `grpo`, `dr_grpo`, `gspo` or `gepo`.
    pub objective: String,
    /// Staleness budget S (groups with `v_τ < v − S` never enter a batch).
    pub staleness: u64,
    /// Publication period κ; default max(S − 1, 1).
    pub kappa: Option<u64>,
    /// B: groups per step (R = B × group_size trajectories).
    pub groups_per_step: usize,
    /// n: samples per group the learner expects (the workers' `rollout.group_size`).
    pub group_size: usize,
    pub lr: f64,
    /// Weight β of the KL penalty to the initial (warm-started) policy; 0 = off.
    pub kl_beta: f64,
    /// Clip range ε.
    pub clip_eps: f64,
    /// Truncated importance-ratio cap C (ECHO-2 eq. 24); unset = off.
    pub is_cap: Option<f64>,
    /// Temperature T of the learner's log-probs; must equal `rollout.temperature`.
    pub temperature: f32,
    /// Supervised warm-start steps on the task's reference answers before version 0 is
    /// published (0 = off; a restarted learner resumes from its checkpoint instead).
    pub warm_start_steps: usize,
    /// Checkpoint every N steps (and at shutdown).
    pub checkpoint_every: u64,
    /// Stop training after this many steps in total (0 = never); the node keeps serving.
    pub max_steps: u64,
    /// How often the learner pulls from workers when its buffer is short (milliseconds); it
    /// also pulls at once whenever a training step takes a batch or finds none.
    pub pull_interval_ms: u64,
    /// Groups the learner keeps buffered (0 = 2 × groups_per_step: the next batch is pulled
    /// while the current one trains; more only ages the groups — the freshest are trained
    /// first and the rest expire).
    pub buffer_groups: u64,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            mode: Mode::Async,
            objective: "gepo".into(),
            staleness: 3,
            kappa: None,
            groups_per_step: 4,
            group_size: 16,
            lr: 1e-3,
            kl_beta: 0.05,
            clip_eps: 0.2,
            is_cap: None,
            temperature: 1.2,
            warm_start_steps: 60,
            checkpoint_every: 50,
            max_steps: 0,
            pull_interval_ms: 100,
            buffer_groups: 0,
        }
    }
}

/// `[rollout]`: how a worker samples.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// n: samples per prompt (one group).
    pub group_size: usize,
    pub max_new_tokens: usize,
    /// Sampling temperature; must equal `learner.temperature`.
    pub temperature: f32,
    pub top_p: f32,
    /// Seed of prompt choice and sampling; default derived from the node's key.
    pub seed: Option<u64>,
    /// Cap on this worker's production in groups/s (0 = none): emulates a slower machine in
    /// a testnet.
    pub max_groups_per_s: f64,
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
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Snapshot chunk size in KiB (SPEC §5 default 1 MiB).
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
    pub problems: Vec<(String, String)>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config {}:", self.file.display())?;
        for (key, problem) in &self.problems {
            write!(f, "\n  - {key}: {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl NodeConfig {
    /// Reads and parses `file`; values are validated by [`NodeConfig::validate`].
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: file.to_path_buf(),
            problems: vec![(key.to_string(), problem)],
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| err("(file)", format!("cannot read: {e}")))?;
        Self::parse(&text).map_err(|(key, problem)| err(&key, problem))
    }

    /// Parses TOML text; the error names the key path.
    pub fn parse(text: &str) -> Result<Self, (String, String)> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let key = if path == "." {
                "(top level)".to_string()
            } else {
                path
            };
            (key, e.into_inner().message().trim().to_string())
        })
    }

    /// Checks every value; all problems are reported at once.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let mut problems: Vec<(String, String)> = Vec::new();
        let mut bad = |k: &str, p: String| problems.push((k.to_string(), p));
        let id_ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
        if self.swarm_id.is_empty() || self.swarm_id.len() > 64 || !self.swarm_id.chars().all(id_ok)
        {
            bad(
                "swarm_id",
                format!(
                    "`{}` must be 1–64 characters of a-z, A-Z, 0-9, '-', '_', '.'",
                    self.swarm_id
                ),
            );
        }
        if self.data_dir.as_os_str().is_empty() {
            bad("data_dir", "must not be empty".into());
        }
        match (&self.learner_public_key, self.role) {
            (Some(k), _) => {
                if let Err(e) = storage::keys::parse_public_key(k) {
                    bad("learner_public_key", format!("{e} (as printed by `echo-node keygen`)"));
                }
            }
            (None, Role::Rollout) => bad(
                "learner_public_key",
                "required for role = \"rollout\": a worker trusts only snapshots signed by this key".into(),
            ),
            (None, Role::Learner) => {}
        }
        for (k, p) in self.network.validate() {
            bad(&format!("network.{k}"), p);
        }
        let s = &self.storage;
        let chunk_ok = (4..=65_536).contains(&s.chunk_size_kib);
        if !chunk_ok {
            bad(
                "storage.chunk_size_kib",
                format!("{} is outside 4..=65536 (KiB)", s.chunk_size_kib),
            );
        }
        if !(1..=1000).contains(&s.keep_snapshots) {
            bad(
                "storage.keep_snapshots",
                format!("{} is outside 1..=1000", s.keep_snapshots),
            );
        }
        if !(1..=86_400).contains(&s.lease_ttl_s) {
            bad(
                "storage.lease_ttl_s",
                format!("{} is outside 1..=86400 (seconds)", s.lease_ttl_s),
            );
        }
        if s.max_pending_groups == 0 {
            bad("storage.max_pending_groups", "must be at least 1".into());
        }
        if s.chunk_memory_mb > 1 << 20 {
            bad(
                "storage.chunk_memory_mb",
                format!("{} is above 1048576 (MiB)", s.chunk_memory_mb),
            );
        }
        if self.model.source != "embedded" && !Path::new(&self.model.source).is_dir() {
            bad(
                "model.source",
                format!(
                    "`{}` is neither \"embedded\" nor an existing Hugging Face folder",
                    self.model.source
                ),
            );
        }
        if let Err(e) = tasks::build_task(&self.task.name, &self.task.params) {
            bad("task", e.to_string());
        }
        let l = &self.learner;
        if let Err(e) = l.objective.parse::<learner::Objective>() {
            bad("learner.objective", e.to_string());
        }
        if self.role == Role::Learner {
            if let Err(e) = l.trainer_config().and_then(|c| c.validate()) {
                bad("learner", e.to_string());
            }
        }
        if l.kappa == Some(0) {
            bad("learner.kappa", "must be at least 1".into());
        }
        if l.checkpoint_every == 0 {
            bad("learner.checkpoint_every", "must be at least 1".into());
        }
        if !(10..=60_000).contains(&l.pull_interval_ms) {
            bad(
                "learner.pull_interval_ms",
                format!("{} is outside 10..=60000", l.pull_interval_ms),
            );
        }
        if !matches!(self.broadcast.mode.as_str(), "chain" | "star") {
            bad(
                "broadcast.mode",
                format!("`{}` must be \"chain\" or \"star\"", self.broadcast.mode),
            );
        }
        if !(self.broadcast.worker_mbps.is_finite() && self.broadcast.worker_mbps > 0.0) {
            bad(
                "broadcast.worker_mbps",
                format!("{} must be > 0 (Mbit/s)", self.broadcast.worker_mbps),
            );
        }
        let sc = &self.scheduler;
        if sc.active_workers == Some(0) {
            bad("scheduler.active_workers", "must be at least 1".into());
        }
        match (sc.ranking.as_str(), sc.active_workers) {
            ("rho", _) | ("random", Some(_)) => {}
            ("random", None) => bad(
                "scheduler.ranking",
                "\"random\" needs scheduler.active_workers (a fixed number to pick)".into(),
            ),
            (other, _) => bad(
                "scheduler.ranking",
                format!("`{other}` must be \"rho\" or \"random\""),
            ),
        }
        if !(sc.sustain_s.is_finite() && sc.sustain_s >= 0.0) {
            bad(
                "scheduler.sustain_s",
                format!("{} must be >= 0", sc.sustain_s),
            );
        }
        if !(sc.release_margin.is_finite() && sc.release_margin >= 0.0) {
            bad(
                "scheduler.release_margin",
                format!("{} must be >= 0", sc.release_margin),
            );
        }
        if !(100..=600_000).contains(&sc.announce_interval_ms) {
            bad(
                "scheduler.announce_interval_ms",
                format!("{} is outside 100..=600000", sc.announce_interval_ms),
            );
        }
        let r = &self.rollout;
        if !(1..=storage::record::limits::MAX_SAMPLES).contains(&r.group_size) {
            bad(
                "rollout.group_size",
                format!(
                    "{} is outside 1..={}",
                    r.group_size,
                    storage::record::limits::MAX_SAMPLES
                ),
            );
        }
        if !(1..=4096).contains(&r.max_new_tokens) {
            bad(
                "rollout.max_new_tokens",
                format!("{} is outside 1..=4096", r.max_new_tokens),
            );
        }
        if !(r.temperature.is_finite() && r.temperature >= 0.0) {
            bad(
                "rollout.temperature",
                format!("{} must be >= 0 (0 = greedy)", r.temperature),
            );
        }
        if !(r.max_groups_per_s.is_finite() && r.max_groups_per_s >= 0.0) {
            bad(
                "rollout.max_groups_per_s",
                format!("{} must be >= 0 (0 = no cap)", r.max_groups_per_s),
            );
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            bad("rollout.top_p", format!("{} is outside (0, 1]", r.top_p));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                file: file.to_path_buf(),
                problems,
            })
        }
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
            Mode::Async => (self.staleness, self.kappa),
            Mode::Sequential => (0, Some(1)),
        };
        Ok(learner::TrainerConfig {
            loss: learner::LossConfig {
                objective: self.objective.parse()?,
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
            Err(p) => vec![p],
            Ok(c) => c.validate(Path::new("t.toml")).unwrap_err().problems,
        }
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
