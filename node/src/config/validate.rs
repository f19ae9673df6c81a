//! Validation of a parsed [`NodeConfig`]: every value checked against what is allowed, every
//! problem reported with its key path, all at once; and the files it names (pre-shared key,
//! node key: present, well-formed, mode 0600) before anything is created.

use std::path::Path;

use storage::manifest::{MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};

use super::{ConfigError, NodeConfig, Problem, Ranking, Role};

/// Runs `checks` with `bad`, and says whether any of them reported a problem.
fn checks_failed(
    bad: &mut impl FnMut(&str, String),
    checks: impl FnOnce(&mut dyn FnMut(&str, String)),
) -> bool {
    let mut failed = false;
    checks(&mut |k: &str, p: String| {
        failed = true;
        bad(k, p)
    });
    failed
}

/// Whether a file's mode lets others than its owner read or write it (Unix; never elsewhere).
fn open_to_others(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// The most `rollout.max_new_tokens` may say: the longest context of the supported shapes
/// (Qwen3's 131,072 with YaRN); each response is bounded by its model's context anyway.
const MAX_NEW_TOKENS: usize = 131_072;
/// The most sequences a worker may decode in one batch.
const MAX_BATCH: usize = 4096;

impl NodeConfig {
    /// [`Self::validate`] and [`Self::validate_files`]: every problem at once. What `run`
    /// checks before it creates anything.
    pub fn validate_all(&self, file: &Path) -> Result<(), ConfigError> {
        let mut problems = self
            .validate(file)
            .err()
            .map(|e| e.problems)
            .unwrap_or_default();
        problems.extend(self.validate_files());
        ConfigError::check(file, problems)
    }

    /// The files the config names: `network.psk_file` must exist, be a pre-shared key file
    /// and be readable by its owner only (mode 0600); the node key (`key_file`, default
    /// `<data_dir>/node.key`), when it exists, must be a key file of mode 0600 (a missing one
    /// is created at the first start).
    pub fn validate_files(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Some(psk) = self
            .network
            .psk_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            if !psk.is_file() {
                out.push(Problem::new(
                    "network.psk_file",
                    format!(
                        "{} does not exist (relative paths are relative to the working directory); \
                         make it once and copy it to every node (docs/operator-guide.md, \"Private swarm\")",
                        psk.display()
                    ),
                ));
            } else if let Some(mode) = open_to_others(psk) {
                out.push(Problem::new(
                    "network.psk_file",
                    format!(
                        "{} is readable by others (mode {mode:o}): `chmod 600 {}`",
                        psk.display(),
                        psk.display()
                    ),
                ));
            } else if let Err(e) = p2p::load_psk(psk) {
                out.push(Problem::new("network.psk_file", e.to_string()));
            }
        }
        let key = self.key_path();
        if !key.exists() && self.role == Role::Learner {
            if let Some(expected) = &self.learner_public_key {
                out.push(Problem::new(
                    "learner_public_key",
                    format!(
                        "{} is set, but there is no node key at {}: a new key would not be it; \
                         put the learner's node.key there, or remove learner_public_key",
                        expected.trim(),
                        key.display()
                    ),
                ));
            }
        }
        if key.exists() {
            let name = "key_file";
            if let Some(mode) = open_to_others(&key) {
                out.push(Problem::new(
                    name,
                    format!(
                        "the node key {} is readable by others (mode {mode:o}): `chmod 600 {}`",
                        key.display(),
                        key.display()
                    ),
                ));
            } else if let Err(e) = storage::NodeKey::read(&key) {
                out.push(Problem::new(
                    name,
                    format!(
                        "{e}: restore the key from its backup, or move it away to get a new one \
                         (a new peer id)"
                    ),
                ));
            }
        }
        out
    }

    /// Checks every value; all problems are reported at once.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let mut problems: Vec<Problem> = Vec::new();
        let mut bad = |k: &str, p: String| problems.push(Problem::new(k, p));
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
            (None, Role::Learner | Role::Relay) => {}
        }
        for (k, p) in self.network.validate() {
            bad(&format!("network.{k}"), p);
        }
        self.validate_storage(&mut bad);
        if self.model.source != "embedded" && !Path::new(&self.model.source).is_dir() {
            bad(
                "model.source",
                format!(
                    "`{}` is neither \"embedded\" nor an existing Hugging Face folder",
                    self.model.source
                ),
            );
        }
        if let Some(spec) = &self.task.external {
            for (k, p) in spec.validate() {
                bad(&format!("task.external.{k}"), p);
            }
        }
        match self.task.build_env() {
            Ok(env) => {
                if let Err(e) = self.task.budget(env.as_ref()) {
                    bad("task", e.to_string());
                }
            }
            Err(e) => bad("task", e.to_string()),
        }
        self.validate_learner(&mut bad);
        self.validate_scheduler(&mut bad);
        for (k, p) in self.verification.validate() {
            bad(&format!("verification.{k}"), p);
        }
        for (k, p) in self.admission.validate(&self.network.allow_list) {
            bad(&format!("admission.{k}"), p);
        }
        self.validate_rollout(&mut bad);
        ConfigError::check(file, problems)
    }

    /// The `[storage]` table: chunk size within the manifest format's bounds, snapshots kept (a
    /// learner keeps every still-admissible version for its spot check), leases, pending groups.
    fn validate_storage(&self, bad: &mut impl FnMut(&str, String)) {
        let s = &self.storage;
        // The manifest format's bounds, in the config's unit.
        let (min_kib, max_kib) = (MIN_CHUNK_SIZE / 1024, MAX_CHUNK_SIZE / 1024);
        if !(min_kib..=max_kib).contains(&s.chunk_size_kib) {
            bad(
                "storage.chunk_size_kib",
                format!(
                    "{} is outside {min_kib}..={max_kib} (KiB)",
                    s.chunk_size_kib
                ),
            );
        }
        if !(1..=1000).contains(&s.keep_snapshots) {
            bad(
                "storage.keep_snapshots",
                format!("{} is outside 1..=1000", s.keep_snapshots),
            );
        }
        // The learner's log-prob spot check loads the weights of the version a group claims,
        // from its own snapshot store: every version still admissible (S steps, one snapshot
        // every κ) must be kept, i.e. ⌊S/κ⌋ + 1 snapshots.
        let v = &self.verification;
        if self.role == Role::Learner
            && (v.spot_check_fraction > 0.0 || v.spot_check_first_groups > 0)
        {
            if let Ok(t) = self.learner.trainer_config() {
                let kappa = t.kappa();
                let need = (t.staleness / kappa + 1) as usize;
                if s.keep_snapshots < need {
                    bad(
                        "storage.keep_snapshots",
                        format!(
                            "{} keeps fewer snapshots than the spot check needs: ⌊S/κ⌋ + 1 = {need} \
                             (S = {}, κ = {kappa}); raise it or set verification.spot_check_fraction \
                             = 0 and spot_check_first_groups = 0",
                            s.keep_snapshots, t.staleness
                        ),
                    );
                }
            }
        }
        if !(1..=86_400).contains(&s.lease_ttl_s) {
            bad(
                "storage.lease_ttl_s",
                format!("{} is outside 1..=86400 (seconds)", s.lease_ttl_s),
            );
        }
        if s.max_pending_groups == 0 || s.max_pending_groups > p2p::MAX_PENDING_CLAIM {
            bad(
                "storage.max_pending_groups",
                format!(
                    "{} is outside 1..={} (the most a heartbeat may claim)",
                    s.max_pending_groups,
                    p2p::MAX_PENDING_CLAIM
                ),
            );
        }
        if s.chunk_memory_mb > 1 << 20 {
            bad(
                "storage.chunk_memory_mb",
                format!("{} is above 1048576 (MiB)", s.chunk_memory_mb),
            );
        }
    }

    /// The `[learner]` and `[broadcast]` tables.
    fn validate_learner(&self, bad: &mut impl FnMut(&str, String)) {
        let l = &self.learner;
        if self.role == Role::Learner {
            // What the trainer and its optimiser refuse, each under its own key.
            let before = checks_failed(bad, |bad| self.validate_trainer_ranges(bad));
            if !before {
                if let Err(e) = l.trainer_config().and_then(|c| c.validate()) {
                    bad("learner", e.to_string());
                }
            }
        }
        if l.kappa == Some(0) {
            bad("learner.kappa", "must be at least 1".into());
        }
        if !(l.logprob_floor.is_finite() && (-1e4..0.0).contains(&l.logprob_floor)) {
            bad(
                "learner.logprob_floor",
                format!("{} must be in [-10000, 0)", l.logprob_floor),
            );
        }
        if l.precision == learner::Precision::Bf16 && self.model.device == policy::DeviceChoice::Cpu
        {
            bad(
                "learner.precision",
                "bf16 needs a GPU (candle's CPU has no bf16 matmul): use f16, f32 or auto".into(),
            );
        }
        if let Some(Err(e)) = l.lora.as_ref().map(|lora| lora.validate()) {
            bad("learner.lora", e.to_string());
        }
        if l.checkpoint_every == 0 {
            bad("learner.checkpoint_every", "must be at least 1".into());
        }
        if !(1..=1000).contains(&l.keep_checkpoints) {
            bad(
                "learner.keep_checkpoints",
                format!("{} is outside 1..=1000", l.keep_checkpoints),
            );
        }
        if !(10..=60_000).contains(&l.pull_interval_ms) {
            bad(
                "learner.pull_interval_ms",
                format!("{} is outside 10..=60000", l.pull_interval_ms),
            );
        }
        let max_warm_up = dissemination::wire::MAX_FILLER_BYTES >> 20;
        if self.broadcast.warm_up_mib > max_warm_up {
            bad(
                "broadcast.warm_up_mib",
                format!(
                    "{} is above {max_warm_up} (MiB: what a child reads at most)",
                    self.broadcast.warm_up_mib
                ),
            );
        }
        if !(1..=1_000_000).contains(&self.broadcast.plan_epoch) {
            bad(
                "broadcast.plan_epoch",
                format!(
                    "{} is outside 1..=1000000 (versions)",
                    self.broadcast.plan_epoch
                ),
            );
        }
        if self.broadcast.delta == Some(true) && self.broadcast.dtype != super::SnapshotDtype::Bf16
        {
            bad(
                "broadcast.delta",
                "deltas are bf16 payloads: set broadcast.dtype = \"bf16\"".into(),
            );
        }
        if !(1..=1_000_000).contains(&self.broadcast.keyframe_every) {
            bad(
                "broadcast.keyframe_every",
                format!(
                    "{} is outside 1..=1000000 (versions)",
                    self.broadcast.keyframe_every
                ),
            );
        }
        if !(self.broadcast.worker_mbps.is_finite() && self.broadcast.worker_mbps > 0.0) {
            bad(
                "broadcast.worker_mbps",
                format!("{} must be > 0 (Mbit/s)", self.broadcast.worker_mbps),
            );
        }
    }

    /// The numeric ranges of `[learner]` the trainer (`learner::TrainerConfig::validate`) and
    /// its optimiser (AdamW) would refuse at start, named by key.
    fn validate_trainer_ranges(&self, bad: &mut dyn FnMut(&str, String)) {
        let l = &self.learner;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !positive(l.lr) {
            bad(
                "learner.lr",
                format!("{} must be > 0 (the AdamW learning rate)", l.lr),
            );
        }
        if !non_negative(l.clip_eps) {
            bad(
                "learner.clip_eps",
                format!("{} must be >= 0 (the clip range ε)", l.clip_eps),
            );
        }
        if !non_negative(l.kl_beta) {
            bad(
                "learner.kl_beta",
                format!("{} must be >= 0 (0 = no KL penalty)", l.kl_beta),
            );
        }
        if let Some(cap) = l.is_cap {
            if !positive(cap) {
                bad(
                    "learner.is_cap",
                    format!("{cap} must be > 0 (or left out: no cap)"),
                );
            }
        }
        if !(l.temperature.is_finite() && l.temperature > 0.0) {
            bad(
                "learner.temperature",
                format!(
                    "{} must be > 0 (and equal rollout.temperature)",
                    l.temperature
                ),
            );
        }
        if l.groups_per_step == 0 {
            bad("learner.groups_per_step", "must be at least 1".into());
        }
        if l.group_size == 0 {
            bad("learner.group_size", "must be at least 1".into());
        }
    }

    /// The `[scheduler]` table.
    fn validate_scheduler(&self, bad: &mut impl FnMut(&str, String)) {
        let sc = &self.scheduler;
        if sc.active_workers == Some(0) {
            bad("scheduler.active_workers", "must be at least 1".into());
        }
        if sc.ranking == Ranking::Random && sc.active_workers.is_none() {
            bad(
                "scheduler.ranking",
                "\"random\" needs scheduler.active_workers (a fixed number to pick)".into(),
            );
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
    }

    /// The `[rollout]` table (and `learner.top_p`, the sampler's nucleus the learner checks).
    /// `max_new_tokens` may reach the longest context of a supported model; the worker and
    /// the learner bound each response by its model's context.
    fn validate_rollout(&self, bad: &mut impl FnMut(&str, String)) {
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
        // Generation stops at the model's context in any case (prompt + response).
        if !(1..=MAX_NEW_TOKENS).contains(&r.max_new_tokens) {
            bad(
                "rollout.max_new_tokens",
                format!("{} is outside 1..={MAX_NEW_TOKENS}", r.max_new_tokens),
            );
        }
        if r.max_batch > MAX_BATCH {
            bad(
                "rollout.max_batch",
                format!("{} is above {MAX_BATCH}", r.max_batch),
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
        let top_p = self.learner.top_p;
        if !(top_p > 0.0 && top_p <= 1.0) {
            bad("learner.top_p", format!("{top_p} is outside (0, 1]"));
        }
        if r.dtype == super::SamplingDtype::Bf16 && self.model.device == policy::DeviceChoice::Cpu {
            bad(
                "rollout.dtype",
                "bf16 sampling needs a CUDA device (the CPU backend has no bf16 matmul); use f32 or f16".into(),
            );
        }
    }
}
