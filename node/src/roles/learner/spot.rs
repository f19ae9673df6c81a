//! The learner's log-prob spot checks of pulled groups (`docs/security.md`, "Log-prob spot
//! checks"), as a [`pull::GroupVerifier`]: for a sampled fraction of groups (and every new
//! producer's first groups) the sampled tokens' log-probs are recomputed under the snapshot
//! version the group claims and compared with the reported ones.
//!
//! Owns: the [`SpotChecker`] — the sampler and the rule of `learner::spot_check`, a small
//! cache of models by version loaded from the node's chunk store, and the check of the claimed
//! version against the versions this learner published.
//! Must not touch: the pull protocol, the chunk store's contents (read only) or the peer's
//! penalty (the puller strikes the peer for every rejection the verifier returns).
//!
//! ## Rules
//! - **Unpublished versions are refused, every group.** An honest worker only generates
//!   under a snapshot the learner published, and the learner stores every snapshot in its own
//!   chunk store before any worker can fetch it; old snapshots are collected from the oldest
//!   up. So a claimed version that the store does not hold although it is not older than the
//!   oldest held one was never published: the claim is forged (a worker could otherwise
//!   escape every check by naming a version the learner cannot load). Refused as
//!   `unpublished_version`. This costs one read of the manifest index per group.
//! - **Older than the oldest held snapshot** (collected, or a group from before a restart):
//!   the weights are unavailable, which is not the worker's fault: the group is not checked
//!   (counted in [`SpotStats::skipped_unavailable`]). The chunk store must keep every
//!   published version of the staleness window, i.e. `storage.keep_snapshots ≥ ⌊S/κ⌋ + 1`
//!   (the default S = 3, κ = 2, keep 3 does), or admissible groups escape the check.
//! - **Local faults are not the peer's**: a snapshot that fails to load, or a tensor error, is
//!   logged and counted ([`SpotStats::errors`]); the group passes.
//! - A group the model cannot take (token id outside the vocabulary, too long) is refused as
//!   a `logprob_mismatch` (the pull guard's limits normally refuse it first).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use learner::spot_check::{
    SpotRule, SpotSampler, DEFAULT_FIRST_GROUPS, DEFAULT_FRACTION, DEFAULT_TOLERANCE,
};
use learner::LearnerError;
use policy::{Device, ModelConfig, Policy};
use storage::record::GroupRejection;
use storage::{ChunkStore, TrajectoryGroup};

/// Stable rejection reasons (the keys of the puller's per-reason counts).
pub const REASON_MISMATCH: &str = "logprob_mismatch";
pub const REASON_UNPUBLISHED: &str = "unpublished_version";

/// Models kept loaded by default (the two newest versions groups were checked under).
pub const DEFAULT_CACHED_VERSIONS: usize = 2;

/// The spot checker's settings (`[verification]` keys and the learner's temperature).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotSettings {
    /// Fraction of groups checked (`verification.spot_check_fraction`).
    pub fraction: f64,
    /// A producer's first groups always checked (`verification.spot_check_first_groups`).
    pub first_groups: u32,
    /// Bound on `max |reported − recomputed|` (see `learner::spot_check`).
    pub tolerance: f32,
    /// The log-prob temperature (`learner.temperature`, equal to the workers' one).
    pub temperature: f32,
    /// Models kept loaded.
    pub cached_versions: usize,
}

impl Default for SpotSettings {
    fn default() -> Self {
        SpotSettings {
            fraction: DEFAULT_FRACTION,
            first_groups: DEFAULT_FIRST_GROUPS,
            tolerance: DEFAULT_TOLERANCE,
            temperature: 1.0,
            cached_versions: DEFAULT_CACHED_VERSIONS,
        }
    }
}

/// What the checker did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpotStats {
    /// Groups recomputed and compared.
    pub checked: u64,
    /// Of those, failed (rejected as `logprob_mismatch`).
    pub mismatches: u64,
    /// Groups refused for naming a version the learner never published.
    pub unpublished: u64,
    /// Groups left unchecked because their version's weights are gone (older than every held
    /// snapshot).
    pub skipped_unavailable: u64,
    /// Selected groups left unchecked because of a local fault (load or tensor error).
    pub errors: u64,
    /// Snapshot loads (cache misses).
    pub loads: u64,
}

#[derive(Default)]
struct Counters {
    checked: AtomicU64,
    mismatches: AtomicU64,
    unpublished: AtomicU64,
    skipped_unavailable: AtomicU64,
    errors: AtomicU64,
    loads: AtomicU64,
}

/// Where a claimed version stands in the chunk store.
enum Held {
    Yes,
    /// Older than every held snapshot (collected) or no snapshot at all.
    Gone,
    /// Within or after the held range but not held: never published.
    Never,
}

/// The learner's log-prob spot checker (a [`pull::GroupVerifier`]).
pub struct SpotChecker {
    settings: SpotSettings,
    rule: SpotRule,
    sampler: Mutex<SpotSampler>,
    chunks: Arc<ChunkStore>,
    model: ModelConfig,
    device: Device,
    /// Loaded models, newest last. Locked across a load, so one version loads once.
    cache: Mutex<VecDeque<(u64, Arc<Policy>)>>,
    counters: Counters,
}

impl std::fmt::Debug for SpotChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpotChecker")
            .field("settings", &self.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SpotChecker {
    /// A checker reading snapshots of `model` from `chunks`, recomputing on `device`. The
    /// sampler's key is drawn at random (it must stay secret to this learner).
    pub fn new(
        settings: SpotSettings,
        chunks: Arc<ChunkStore>,
        model: ModelConfig,
        device: Device,
    ) -> anyhow::Result<Self> {
        Self::with_key(settings, chunks, model, device, rand::random())
    }

    /// [`SpotChecker::new`] with a given sampler key (tests).
    pub fn with_key(
        settings: SpotSettings,
        chunks: Arc<ChunkStore>,
        model: ModelConfig,
        device: Device,
        key: [u8; 32],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            settings.temperature.is_finite() && settings.temperature > 0.0,
            "spot-check temperature must be > 0, got {}",
            settings.temperature
        );
        Ok(SpotChecker {
            rule: SpotRule::new(settings.tolerance)?,
            sampler: Mutex::new(SpotSampler::new(
                settings.fraction,
                settings.first_groups,
                key,
            )?),
            settings,
            chunks,
            model,
            device,
            cache: Mutex::new(VecDeque::new()),
            counters: Counters::default(),
        })
    }

    /// The counts so far.
    pub fn stats(&self) -> SpotStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SpotStats {
            checked: get(&c.checked),
            mismatches: get(&c.mismatches),
            unpublished: get(&c.unpublished),
            skipped_unavailable: get(&c.skipped_unavailable),
            errors: get(&c.errors),
            loads: get(&c.loads),
        }
    }

    fn held(&self, version: u64) -> Result<Held, storage::StorageError> {
        let versions = self.chunks.versions()?;
        Ok(match versions.first() {
            None => Held::Gone,
            Some(_) if versions.binary_search(&version).is_ok() => Held::Yes,
            Some(&oldest) if version < oldest => Held::Gone,
            Some(_) => Held::Never,
        })
    }

    /// The model of `version`, from the cache or loaded from the chunk store. `Ok(None)` when
    /// its chunks are gone (collected meanwhile).
    fn model_of(&self, version: u64) -> anyhow::Result<Option<Arc<Policy>>> {
        // A poisoned lock (a panic while it was held) still guards a consistent deque.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.iter().position(|(v, _)| *v == version) {
            if let Some(entry) = cache.remove(i) {
                let model = entry.1.clone();
                cache.push_back(entry);
                return Ok(Some(model));
            }
        }
        let bytes = match self.chunks.assemble(version) {
            Ok(b) => b,
            Err(
                storage::StorageError::NotFound { .. } | storage::StorageError::Incomplete { .. },
            ) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // Evict before decoding: at most `cached_versions` models are ever held (plus the
        // snapshot bytes while one is decoded).
        while cache.len() >= self.settings.cached_versions.max(1) {
            cache.pop_front();
        }
        let policy = Arc::new(Policy::from_safetensors_bytes(
            &self.model,
            &bytes,
            &self.device,
        )?);
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        cache.push_back((version, policy.clone()));
        Ok(Some(policy))
    }

    fn count(&self, c: &AtomicU64, result: &'static str) {
        c.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("learner_spot_checks_total", "result" => result).increment(1);
    }

    /// The check of `group` pulled from `producer` (base58 peer id); blocking (runs a forward
    /// when the group is selected). See the module doc for the rules.
    pub fn check(&self, producer: &str, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        let c = &self.counters;
        match self.held(group.version) {
            Ok(Held::Yes) => {}
            Ok(Held::Gone) => {
                // Not drawn through the sampler: such a group must not use up one of its
                // producer's always-checked first groups.
                self.count(&c.skipped_unavailable, "skipped_unavailable");
                return Ok(());
            }
            Ok(Held::Never) => {
                self.count(&c.unpublished, "unpublished_version");
                return Err(GroupRejection::Unverified {
                    reason: REASON_UNPUBLISHED,
                    detail: format!("version {} was never published", group.version),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "spot check: reading the snapshot index failed");
                self.count(&c.errors, "error");
                return Ok(());
            }
        }
        if !self.selected(producer, group) {
            return Ok(());
        }
        let policy = match self.model_of(group.version) {
            Ok(Some(p)) => p,
            Ok(None) => {
                self.count(&c.skipped_unavailable, "skipped_unavailable");
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(version = group.version, error = %format!("{e:#}"),
                    "spot check: loading the snapshot failed");
                self.count(&c.errors, "error");
                return Ok(());
            }
        };
        match self.rule.check(&policy, group, self.settings.temperature) {
            Ok((report, true)) => {
                self.count(&c.checked, "pass");
                tracing::debug!(
                    version = group.version,
                    max_abs_diff = report.max_abs_diff,
                    "spot check passed"
                );
                Ok(())
            }
            Ok((report, false)) => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.mismatches, "mismatch");
                Err(GroupRejection::Unverified {
                    reason: REASON_MISMATCH,
                    detail: format!(
                        "max |Δ log-prob| {} at sample {} token {} > tolerance {} (version {})",
                        report.max_abs_diff,
                        report.worst_sample,
                        report.worst_token,
                        self.rule.tolerance,
                        group.version
                    ),
                })
            }
            Err(LearnerError::Invalid(why)) => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.mismatches, "mismatch");
                Err(GroupRejection::Unverified {
                    reason: REASON_MISMATCH,
                    detail: format!("cannot recompute: {why}"),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "spot check: recomputation failed");
                self.count(&c.errors, "error");
                Ok(())
            }
        }
    }

    fn selected(&self, producer: &str, group: &TrajectoryGroup) -> bool {
        self.sampler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .select(producer, &group.group_id)
            .is_checked()
    }
}

/// The spot check as the last of the learner's verification layers (the only one that runs
/// the model, so it sees only groups every cheaper layer passed).
impl super::verify::Layer for SpotChecker {
    fn name(&self) -> &'static str {
        REASON_MISMATCH
    }
    fn check(&self, worker: &p2p::PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        SpotChecker::check(self, &worker.to_base58(), group)
    }
}

impl pull::GroupVerifier for SpotChecker {
    fn verify(&self, worker: &p2p::PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        self.check(&worker.to_base58(), group)
    }
}

#[cfg(test)]
#[path = "spot_tests.rs"]
mod tests;
