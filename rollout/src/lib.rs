//! The rollout engine: turns the installed policy snapshot into rewarded, version-tagged
//! trajectory groups in the local [`storage::TrajectoryStore`].
//!
//! Owns: the installed-policy slot ([`PolicySlot`], updated by the node when a snapshot
//! installs), the generate → reward → record → sign → `put_group` loop ([`RolloutEngine`])
//! for single-turn tasks and for multi-turn environments (whole episodes with the KV cache
//! carried across turns, their replay by the learner and scripted play: [`episode`];
//! exact and sampled evaluation of a policy in an environment: [`eval`]),
//! the producer's self-regulation (pause while pending groups exceed a cap), the throughput
//! estimate μ_i ([`RolloutStats`]) reported in heartbeats, and the worker's side of verified
//! rollouts: the durable group counter ([`seq::SeqFile`]), the assigned prompt of each group
//! (`tasks::assign`) and the producer signature over each group.
//!
//! Must not touch: networking, snapshot transfer/verification, the learner's pulls (those use
//! the store directly), or the model/task internals (see `policy` and `tasks`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy::chat::Chat;
use policy::{GenerationPath, InferModel, Policy, PolicyError, SamplingParams, Tokenizer};
use serde::{Deserialize, Serialize};
use storage::{StorageError, TrajectoryGroup, TrajectoryStore};
use tasks::env::{Budget, Environment, TaskEnv};
use tasks::{Task, TaskError};
use tokio_util::sync::CancellationToken;

pub mod episode;
pub mod eval;
mod generate;
pub use generate::Made;
pub mod seq;
mod slot;
mod stats;

pub use slot::{InstalledPolicy, PolicySlot};
pub use stats::{RolloutStats, StatsSnapshot};

/// Replaces the engine's final step before a group is stored (signing with the worker's key):
/// the hook gets the finished, unsigned group and the engine's signing key, and must leave
/// the group as it should be stored. Only the node's test-only attacks use it.
pub type SealHook = Box<dyn FnMut(&mut TrajectoryGroup, &storage::NodeKey) + Send>;

/// Errors of the rollout engine.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// Model loading or generation failed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// An episode of a multi-turn environment failed.
    #[error(transparent)]
    Episode(#[from] episode::EpisodeError),
    /// The task failed to produce a prompt.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The trajectory store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Bad engine configuration (or a file it names holds something else).
    #[error("invalid rollout config: {0}")]
    Config(String),
    /// A file of the engine (the group counter) could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// A snapshot older than (or equal to) the installed one was offered.
    #[error("snapshot version {offered} is not newer than the installed version {installed}")]
    StaleVersion {
        /// The installed version.
        installed: u64,
        /// The offered version.
        offered: u64,
    },
}

impl RolloutError {
    /// An episode failed in the external environment program (it crashed, hung or answered
    /// garbage): the group's number is committed as abandoned, never retried.
    pub fn is_environment_failure(&self) -> bool {
        matches!(
            self,
            RolloutError::Episode(episode::EpisodeError::Env(TaskError::External { .. }))
                | RolloutError::Task(TaskError::External { .. })
        )
    }
}

/// Engine configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutConfig {
    /// Samples per prompt (n).
    pub group_size: usize,
    /// Sampling parameters; empty `stop_tokens` means the tokenizer's EOS ids.
    pub sampling: SamplingParams,
    /// Decoding loop: the inference path (`infer`, default; fused kernels, bf16 on CUDA) or
    /// the training forward (`batched`, `sequential`). In f32 all match the learner's log-probs.
    #[serde(default)]
    pub path: GenerationPath,
    /// Pause while the store holds at least this many pending groups.
    pub max_pending_groups: u64,
    /// Seed: group k's prompt and samples depend only on (seed, k) and the installed weights.
    pub seed: u64,
    /// Producing peer id recorded in every group.
    pub producer: String,
    /// Smoothing of the μ estimate (weight of the newest group, in (0, 1]).
    pub mu_ema_alpha: f64,
    /// Sleep while paused or while no policy is installed.
    pub idle_poll: Duration,
    /// Makes group/trajectory ids reproducible (tests); `None` draws a random one per engine.
    pub id_nonce: Option<[u8; 16]>,
    /// Cap on the production rate in groups/s (0 = none): emulates a slower machine (the
    /// testnet's heterogeneous capacity, like bandwidth caps emulate slow links). μ then
    /// reports the capped rate.
    #[serde(default)]
    pub max_groups_per_s: f64,
    /// The run's prompt-assignment seed (`tasks::assign::assignment_seed`): group `seq`
    /// answers the prompt `tasks::assign::assigned_index(task, seed, producer, seq)`, which the
    /// learner recomputes. `None`: prompts drawn from `seed` (local use and tests).
    #[serde(default)]
    pub assignment_seed: Option<[u8; 32]>,
    /// The inference path's dtype (`None`: the device's default, bf16 on CUDA, f32 on the CPU).
    #[serde(skip)]
    pub infer_dtype: Option<policy::DType>,
    /// Sequences decoded in one batch: `max_batch / group_size` groups are made per step, their
    /// samples decoded together (continuous batching; single-turn tasks on the inference path).
    /// 0 or at most `group_size`: one group at a time.
    #[serde(default)]
    pub max_batch: usize,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            group_size: 8,
            sampling: SamplingParams::new(8, Vec::new()),
            path: GenerationPath::default(),
            max_pending_groups: 256,
            seed: 0,
            producer: "local".into(),
            mu_ema_alpha: 0.2,
            idle_poll: Duration::from_millis(50),
            id_nonce: None,
            max_groups_per_s: 0.0,
            assignment_seed: None,
            infer_dtype: None,
            max_batch: 0,
        }
    }
}

/// What one [`RolloutEngine::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// A group was generated and stored.
    Produced {
        /// Its snapshot version.
        version: u64,
        /// Its mean reward.
        mean_reward: f32,
    },
    /// Pending groups reached the cap; nothing generated.
    Paused {
        /// Pending groups in the store.
        pending: u64,
    },
    /// No snapshot is installed yet.
    NoPolicy,
    /// Every number of this step was abandoned (its episode failed in the environment
    /// program); the last one was `seq`.
    Abandoned {
        /// The last abandoned number.
        seq: u64,
    },
    /// The scheduler put this worker on standby (see [`RolloutEngine::standby_flag`]).
    Standby,
    /// The installed version is below the learner's window (its last pull asked for groups of
    /// `floor` or newer, `TrajectoryStore::window_floor`): a group made now would be discarded
    /// at the next pull, so none is made until a newer snapshot installs. In sequential mode
    /// (S = 0) this is "refresh first": the learner asks for groups under its current version.
    Behind {
        /// The installed version.
        installed: u64,
        /// The learner's floor.
        floor: u64,
    },
}

/// Generates groups under the installed policy and writes them to the store.
pub struct RolloutEngine {
    cfg: RolloutConfig,
    /// What the engine plays: a single-turn task (a [`TaskEnv`]) or a multi-turn environment.
    env: Arc<dyn Environment>,
    /// The tokenizer and the template that renders the environment's conversations.
    chat: Chat,
    /// Bounds of a multi-turn episode.
    budget: Budget,
    store: Arc<TrajectoryStore>,
    slot: PolicySlot,
    stats: Arc<RolloutStats>,
    stop_tokens: Vec<u32>,
    nonce: [u8; 16],
    seq: u64,
    /// Set while the learner's scheduler keeps this worker on standby.
    standby: Arc<AtomicBool>,
    /// The inference-path weights of the installed version (built once per snapshot).
    infer: Option<(u64, Arc<InferModel>)>,
    /// The installed version's f32 policy on the slot's device, for the training-forward
    /// paths (`batched`, `sequential`) when the slot decodes into host memory.
    on_device: Option<(u64, Arc<Policy>)>,
    /// The producer's key: every group is signed with it (unsigned when `None`).
    signer: Option<storage::NodeKey>,
    /// Replaces signing (test-only attacks).
    seal: Option<SealHook>,
    /// Durable group counter; `seq` counts from 0 in memory when `None`.
    seq_file: Option<seq::SeqFile>,
}

impl std::fmt::Debug for RolloutEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutEngine")
            .field("cfg", &self.cfg)
            .field("env", &self.env.name())
            .field("seq", &self.seq)
            .finish()
    }
}

impl RolloutEngine {
    /// A new engine for a single-turn task; `seq` (the group counter the per-group seeds
    /// derive from) starts at 0.
    pub fn new(
        cfg: RolloutConfig,
        task: Arc<dyn Task>,
        tokenizer: Tokenizer,
        store: Arc<TrajectoryStore>,
        slot: PolicySlot,
    ) -> Result<Self, RolloutError> {
        let env: Arc<dyn Environment> = Arc::new(TaskEnv::new(task));
        let budget = Budget::of(&env.metadata());
        let chat = Chat::for_model(tokenizer, None, false)?;
        Self::for_env(cfg, env, chat, budget, store, slot)
    }

    /// A new engine for environment `env` (a single-turn task through [`TaskEnv`], or a
    /// multi-turn environment whose conversations `chat` renders and `budget` bounds).
    pub fn for_env(
        cfg: RolloutConfig,
        env: Arc<dyn Environment>,
        chat: Chat,
        budget: Budget,
        store: Arc<TrajectoryStore>,
        slot: PolicySlot,
    ) -> Result<Self, RolloutError> {
        let tokenizer = chat.tokenizer();
        if cfg.group_size == 0 || cfg.group_size > storage::record::limits::MAX_SAMPLES {
            return Err(RolloutError::Config(format!(
                "group_size must be in 1..={}",
                storage::record::limits::MAX_SAMPLES
            )));
        }
        if !(cfg.mu_ema_alpha > 0.0 && cfg.mu_ema_alpha <= 1.0) {
            return Err(RolloutError::Config(
                "mu_ema_alpha must be in (0, 1]".into(),
            ));
        }
        if cfg.producer.len() > storage::record::limits::MAX_ID {
            return Err(RolloutError::Config("producer id too long".into()));
        }
        if tokenizer.vocab_size() > slot.model_config().vocab_size {
            return Err(RolloutError::Config(format!(
                "tokenizer has {} ids but the model only {}",
                tokenizer.vocab_size(),
                slot.model_config().vocab_size
            )));
        }
        if env.metadata().is_multi_turn()
            && !cfg.sampling.stop_tokens.is_empty()
            && cfg.sampling.stop_tokens != chat.stop_tokens()
        {
            return Err(RolloutError::Config(
                "multi-turn episodes end turns at the tokenizer's stop tokens".into(),
            ));
        }
        let stop_tokens = if cfg.sampling.stop_tokens.is_empty() {
            tokenizer.eos_ids()
        } else {
            cfg.sampling.stop_tokens.clone()
        };
        let nonce = cfg.id_nonce.unwrap_or_else(rand::random);
        Ok(RolloutEngine {
            cfg,
            env,
            chat,
            budget,
            store,
            slot,
            stats: Arc::new(RolloutStats::default()),
            stop_tokens,
            nonce,
            seq: 0,
            standby: Arc::new(AtomicBool::new(false)),
            infer: None,
            on_device: None,
            signer: None,
            seal: None,
            seq_file: None,
        })
    }

    /// Signs every group with `key` (the node key its peer id derives from; the producer id in
    /// the config must be that peer id for the learner to accept the signature).
    pub fn with_signer(mut self, key: storage::NodeKey) -> Self {
        self.signer = Some(key);
        self
    }

    /// Replaces the signing step with `hook` (test-only attacks; see [`SealHook`]). Without a
    /// signer the hook gets a fresh random key.
    pub fn with_seal_hook(mut self, hook: SealHook) -> Self {
        self.seal = Some(hook);
        self
    }

    /// Keeps the durable counter at `path` (see [`seq`]) past every number used: the floor of
    /// the numbering when the store holds no commitment (a wiped store never reuses one).
    pub fn with_seq_file(mut self, path: &std::path::Path) -> Result<Self, RolloutError> {
        let f = seq::SeqFile::open(path)?;
        self.seq = self.seq.max(f.peek());
        self.seq_file = Some(f);
        Ok(self)
    }

    /// The next group number. Numbers are dense (`control::commits`): [`Self::step`] first
    /// resumes at the store's next commitment, so a group that failed or was not stored
    /// gives its number to the next one, and a restart skips none.
    fn next_seq(&mut self) -> Result<u64, RolloutError> {
        let s = self.seq;
        self.seq += 1;
        if let Some(f) = &mut self.seq_file {
            f.reserve_through(self.seq)?;
        }
        Ok(s)
    }

    /// Signs `group` (or hands it to the seal hook).
    fn seal(&mut self, group: &mut TrajectoryGroup) {
        match (&mut self.seal, &self.signer) {
            (Some(hook), Some(key)) => hook(group, key),
            (Some(hook), None) => hook(group, &storage::NodeKey::generate()),
            (None, Some(key)) => group.sign(key.signing_key()),
            (None, None) => {}
        }
    }

    /// The standby gate: while it is set the engine generates nothing (it keeps its μ
    /// estimate and the installed snapshot, so it can resume at once when activated).
    pub fn standby_flag(&self) -> Arc<AtomicBool> {
        self.standby.clone()
    }

    /// Shared statistics (μ_i, counters) for heartbeats.
    pub fn stats(&self) -> Arc<RolloutStats> {
        self.stats.clone()
    }

    /// The policy slot this engine samples from.
    pub fn slot(&self) -> &PolicySlot {
        &self.slot
    }

    /// One iteration: nothing on standby; pause if the store is over its cap; nothing while
    /// the installed version is below the learner's window ([`StepOutcome::Behind`]);
    /// otherwise generate a group (or `max_batch / group_size` groups decoded together, at
    /// most as many as the pending cap has room for) under the installed version and
    /// `put_group` each (durable before this returns; `Produced` names the last).
    pub fn step(&mut self) -> Result<StepOutcome, RolloutError> {
        let t0 = Instant::now();
        if self.standby.load(Ordering::Relaxed) {
            return Ok(StepOutcome::Standby);
        }
        // O(1) from the persisted counters (`TrajectoryStore::pending` scans the tree).
        let pending = self.store.counters()?.pending();
        if pending >= self.cfg.max_pending_groups {
            self.stats.paused.store(true, Ordering::Relaxed);
            return Ok(StepOutcome::Paused { pending });
        }
        self.stats.paused.store(false, Ordering::Relaxed);
        let floor = self.store.window_floor();
        if let Some(installed) = self.slot.version().filter(|v| *v < floor) {
            self.stats.behind.store(true, Ordering::Relaxed);
            return Ok(StepOutcome::Behind { installed, floor });
        }
        self.stats.behind.store(false, Ordering::Relaxed);
        // Dense numbering: the number after the last committed group.
        if let Some(n) = self.store.next_commit()? {
            self.seq = n;
        }
        // Several groups per step when the batch holds them, never past the pending cap.
        let room = self.cfg.max_pending_groups - pending;
        let k = (self.cfg.max_batch / self.cfg.group_size).clamp(1, room.max(1) as usize);
        let made = self.produce_groups(k)?;
        if made.is_empty() {
            return Ok(StepOutcome::NoPolicy);
        }
        // Stored or committed as abandoned in number order: the log stays dense.
        let mut groups = Vec::with_capacity(made.len());
        let mut abandoned = None;
        for m in made {
            match m {
                generate::Made::Group(g) => {
                    self.store.put_group(&g)?;
                    groups.push(*g);
                }
                generate::Made::Abandoned {
                    seq,
                    version,
                    error,
                } => {
                    self.store.abandon(seq, version)?;
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(seq, version, error = %error,
                        "episode abandoned: the environment program failed; its group number is committed as abandoned");
                    abandoned = Some(seq);
                }
            }
        }
        let Some(last) = groups.last() else {
            let seq = abandoned.expect("every number made is a group or abandoned");
            return Ok(StepOutcome::Abandoned { seq });
        };
        let (version, mean_reward) = (last.version, last.mean_reward());
        if self.cfg.max_groups_per_s > 0.0 {
            let slot = Duration::from_secs_f64(groups.len() as f64 / self.cfg.max_groups_per_s);
            if let Some(rest) = slot.checked_sub(t0.elapsed()) {
                std::thread::sleep(rest);
            }
        }
        // μ counts groups: each of a batch took its share of the step.
        let secs = t0.elapsed().as_secs_f64() / groups.len() as f64;
        for group in &groups {
            self.stats.record(group, secs, self.cfg.mu_ema_alpha);
            tracing::debug!(version = group.version, prompt = %group.prompt_id,
                reward = group.mean_reward(), "rollout group stored");
        }
        Ok(StepOutcome::Produced {
            version,
            mean_reward,
        })
    }

    /// Runs [`Self::step`] until `stop` is cancelled, sleeping `idle_poll` while paused or without a
    /// policy. A group that fails for a model or task reason is skipped and counted
    /// ([`StatsSnapshot::errors`]); a storage error ends the loop. Blocking: run it on its own thread (see [`Self::spawn`]).
    pub fn run_blocking(&mut self, stop: &CancellationToken) -> Result<(), RolloutError> {
        while !stop.is_cancelled() {
            match self.step() {
                Ok(StepOutcome::Produced { .. } | StepOutcome::Abandoned { .. }) => {}
                Ok(
                    StepOutcome::Paused { .. }
                    | StepOutcome::NoPolicy
                    | StepOutcome::Standby
                    | StepOutcome::Behind { .. },
                ) => std::thread::sleep(self.cfg.idle_poll),
                // The store failing is fatal: nothing produced could be kept.
                Err(e @ RolloutError::Storage(_)) => return Err(e),
                // A bad prompt (e.g. longer than the context) skips that group.
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "rollout group failed; skipping it");
                    std::thread::sleep(self.cfg.idle_poll);
                }
            }
        }
        Ok(())
    }

    /// Runs the engine on a dedicated OS thread; [`RunningEngine::stop`] ends it.
    pub fn spawn(mut self) -> Result<RunningEngine, RolloutError> {
        let stop = CancellationToken::new();
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("rollout".into())
            .spawn(move || self.run_blocking(&flag))
            .map_err(|e| RolloutError::Config(format!("cannot spawn rollout thread: {e}")))?;
        Ok(RunningEngine { stop, handle })
    }
}

/// An engine running on its own thread (from [`RolloutEngine::spawn`]).
#[derive(Debug)]
pub struct RunningEngine {
    stop: CancellationToken,
    handle: std::thread::JoinHandle<Result<(), RolloutError>>,
}

impl RunningEngine {
    /// Asks the engine to stop after its current group and waits for it; returns its result.
    pub fn stop(self) -> Result<(), RolloutError> {
        self.stop.cancel();
        self.handle
            .join()
            .map_err(|_| RolloutError::Config("rollout thread panicked".into()))?
    }

    /// True once the thread has exited (e.g. after an error).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

#[cfg(test)]
mod tests;
