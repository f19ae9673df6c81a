//! The learner's spot checks of pulled groups (`docs/security.md`, "Log-prob spot checks"
//! and "Checkable sampling"), the last stage of the verification pipeline
//! (`learner::Pipeline`): for a drawn fraction of groups — the worker's check rate, 1 on
//! probation, lower with a long verified history (`control::admission::check_rate`) — one
//! teacher-forced forward under the snapshot version the group claims recomputes the sampled
//! tokens' log-probs, compares them with the reported ones, and checks that each token is the
//! one the canonical sampling rule draws for the uniform the learner prescribes
//! (`learner::verdict`), with the tolerance and margin of the dtype the worker's heartbeats
//! report ([`WorkerDtypes`]).
//!
//! Owns: the [`SpotChecker`] — the draw by a secret key and the rules of `learner::spot_check`
//! and `learner::verdict`, a small cache of models by version loaded from the node's chunk
//! store, the proof-level grade of a mismatch, the check of the claimed version against the
//! versions this learner published, and the set of producers caught with a token the rule did
//! not draw.
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
//! - **Except where every group must be checked** (check rate 1: a worker on probation): a
//!   group that cannot be checked there — its snapshot collected or unloadable, a local
//!   fault — is refused as `unchecked`, without a strike, so that it neither enters training
//!   unchecked nor counts towards the worker's probation.
//! - A group the model cannot take (token id outside the vocabulary, too long) is refused as
//!   a `logprob_mismatch` (the pipeline's structure stage normally refuses it first).
//! - **Proof.** A mismatch of at least [`PROOF_FACTOR`] × the tolerance is no numeric spread
//!   — at the default tolerance 0.1 nats, twenty times the largest honest spread measured
//!   even for a half-precision worker — but a forgery: refused as `logprob_forged`, which
//!   bans at once (the penalty table, `verify.rs`).
//! - **A token the rule did not draw is proof** (`token_not_drawn`, banned at once: the
//!   margin covers every honest numeric spread). It ends the check of a producer: every later
//!   group of that producer is refused for the same reason, checked or not — so the rest of
//!   the very pull that caught it is never stored.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use learner::spot_check::{selected_by_fraction, SpotRule, MAX_TRACKED_PEERS};
use learner::verdict::{
    ByDtype, CheckReport, CheckSettings, SpotVerdict, WorkerDtype, DEFAULT_MARGIN,
    DEFAULT_TOLERANCE,
};
use learner::{Checks, LearnerError, MaskRule, ResponseTokens, StageInput};
use policy::rule::RuleParams;
use policy::{Device, ModelConfig, Policy};
use storage::Rejection;
use storage::{ChunkStore, TrajectoryGroup};

/// A difference of this many tolerances is proof of a forgery (see the module doc).
pub const PROOF_FACTOR: f32 = 100.0;

/// The outcome of a group the checker could not check, `why`: it passes unchecked
/// (`Ok(false)`) unless every group must be checked (`rate` 1, probation), where it is refused
/// as [`Rejection::Unchecked`] (no strike: the learner's side failed).
fn unchecked(rate: f64, why: &str) -> Result<bool, Rejection> {
    if rate >= 1.0 {
        Err(Rejection::Unchecked(format!(
            "every group of this worker is checked, and this one could not be: {why}"
        )))
    } else {
        Ok(false)
    }
}

/// Models kept loaded by default (the two newest versions groups were checked under).
pub const DEFAULT_CACHED_VERSIONS: usize = 2;

/// The spot checker's settings (`[verification]` keys and the learner's sampling rule; which
/// groups are checked is the pipeline's check rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotSettings {
    /// Bound on `max |reported − recomputed|` per worker dtype
    /// (`verification.logprob_tolerance`).
    pub tolerance: ByDtype<f32>,
    /// Margin δ of the draw check per worker dtype (`verification.sampling_margin`).
    pub margin: ByDtype<f64>,
    /// The log-prob and sampling temperature (`learner.temperature`, the workers' one).
    pub temperature: f32,
    /// The workers' nucleus mass (`learner.top_p`).
    pub top_p: f32,
    /// Check the draws (`verification.check_sampling`).
    pub check_sampling: bool,
    /// The run's assignment seed, from which every uniform derives.
    pub seed: [u8; 32],
    /// Models kept loaded.
    pub cached_versions: usize,
}

impl Default for SpotSettings {
    fn default() -> Self {
        SpotSettings {
            tolerance: DEFAULT_TOLERANCE,
            margin: DEFAULT_MARGIN,
            temperature: 1.0,
            top_p: 1.0,
            check_sampling: true,
            seed: [0; 32],
            cached_versions: DEFAULT_CACHED_VERSIONS,
        }
    }
}

/// The sampling dtype each rollout worker's heartbeats report, by peer id (base58): the
/// puller refreshes it every round from its peer table. A worker without a report is judged
/// as an f32 sampler on a CPU and a bf16 one on CUDA (the defaults of `rollout.dtype`).
#[derive(Debug, Clone, Default)]
pub struct WorkerDtypes(Arc<RwLock<HashMap<String, WorkerDtype>>>);

impl WorkerDtypes {
    /// Replaces the map with `workers`' reports (the current peer table: bounded by it).
    pub fn refresh<'a>(
        &self,
        workers: impl IntoIterator<Item = (p2p::PeerId, Option<&'a p2p::DeviceReport>)>,
    ) {
        let map = workers
            .into_iter()
            .map(|(peer, d)| (peer.to_string(), dtype_of(d)))
            .collect();
        if let Ok(mut m) = self.0.write() {
            *m = map;
        }
    }

    /// The dtype `producer` samples in (f32 when unknown).
    pub fn get(&self, producer: &str) -> WorkerDtype {
        self.0
            .read()
            .ok()
            .and_then(|m| m.get(producer).copied())
            .unwrap_or(WorkerDtype::F32)
    }
}

/// The dtype a heartbeat's device report names (see [`WorkerDtypes`]).
pub fn dtype_of(report: Option<&p2p::DeviceReport>) -> WorkerDtype {
    match report {
        Some(d) => d
            .dtype
            .as_deref()
            .and_then(WorkerDtype::parse)
            .unwrap_or(if d.kind == "cuda" {
                WorkerDtype::Bf16
            } else {
                WorkerDtype::F32
            }),
        None => WorkerDtype::F32,
    }
}

/// What the learner measured of each worker's sampling (`control::admission::MarginEvidence`)
/// and the margins it earned by it, by peer id (base58): the spot check judges each group at
/// its earned margins ([`SpotChecker::with_earned_margins`]); status shows them.
#[derive(Debug, Clone, Default)]
pub struct EarnedMargins(Arc<Mutex<HashMap<String, EarnedView>>>);

/// One worker's measured sampling and the margins its last checked group was judged at.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EarnedView {
    pub evidence: control::admission::MarginEvidence,
    /// The tolerance and δ its last checked group was judged at, and the dtype it claims.
    pub tolerance: f64,
    pub delta: f64,
    pub claimed: Option<WorkerDtype>,
    /// Groups refused as [`Rejection::MarginUnearned`].
    pub unearned: u64,
}

impl EarnedMargins {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, EarnedView>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The evidence measured of `producer` so far.
    pub fn evidence(&self, producer: &str) -> control::admission::MarginEvidence {
        self.lock()
            .get(producer)
            .map(|v| v.evidence)
            .unwrap_or_default()
    }

    fn update(&self, producer: &str, f: impl FnOnce(&mut EarnedView)) {
        let mut m = self.lock();
        if m.len() >= MAX_TRACKED_PEERS && !m.contains_key(producer) {
            m.clear(); // forgetting evidence only narrows margins back to the floor
        }
        f(m.entry(producer.to_string()).or_default());
    }

    /// Every worker's view.
    pub fn all(&self) -> Vec<(String, EarnedView)> {
        self.lock().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// What the checker did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpotStats {
    /// Groups recomputed and compared.
    pub checked: u64,
    /// Of those, failed on a log-prob beyond tolerance (rejected as `logprob_mismatch` or
    /// `logprob_forged`).
    pub mismatches: u64,
    /// Of those, holding a token the rule did not draw (rejected as `token_not_drawn`).
    pub not_drawn: u64,
    /// Groups refused for naming a version the learner never published.
    pub unpublished: u64,
    /// Groups left unchecked because their version's weights are gone (older than every held
    /// snapshot).
    pub skipped_unavailable: u64,
    /// Selected groups left unchecked because of a local fault (load or tensor error).
    pub errors: u64,
    /// Snapshot loads (cache misses).
    pub loads: u64,
    /// Groups refused as [`Rejection::MarginUnearned`].
    pub unearned: u64,
}

#[derive(Default)]
struct Counters {
    unearned: AtomicU64,
    checked: AtomicU64,
    mismatches: AtomicU64,
    not_drawn: AtomicU64,
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

/// The learner's log-prob spot checker (a [`learner::Stage`]).
pub struct SpotChecker {
    settings: SpotSettings,
    /// Draws the checked groups; secret to this learner.
    key: [u8; 32],
    dtypes: WorkerDtypes,
    masks: Arc<dyn MaskRule>,
    /// Producers caught with a token the rule did not draw (bounded; see the module doc).
    condemned: Mutex<HashSet<String>>,
    chunks: Arc<ChunkStore>,
    model: ModelConfig,
    device: Device,
    /// Loaded models, newest last. Locked across a load, so one version loads once.
    cache: Mutex<VecDeque<(u64, Arc<Policy>)>>,
    counters: Counters,
    /// A LoRA run's frozen base: adapter versions are checked on it.
    adapter_base: Option<Policy>,
    /// The margins each worker earned (see [`EarnedMargins`]).
    earned: EarnedMargins,
    margin_rule: control::admission::MarginRule,
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
    /// key that draws the checked groups is random (it must stay secret to this learner).
    pub fn new(
        settings: SpotSettings,
        chunks: Arc<ChunkStore>,
        model: ModelConfig,
        device: Device,
    ) -> anyhow::Result<Self> {
        Self::with_key(settings, chunks, model, device, rand::random())
    }

    /// [`SpotChecker::new`] with a given draw key (tests).
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
        anyhow::ensure!(
            settings.top_p > 0.0 && settings.top_p <= 1.0,
            "spot-check top_p must be in (0, 1], got {}",
            settings.top_p
        );
        let t = settings.tolerance;
        for tolerance in [t.f32, t.f16, t.bf16] {
            SpotRule::new(tolerance)?;
        }
        let m = settings.margin;
        anyhow::ensure!(
            [m.f32, m.f16, m.bf16]
                .iter()
                .all(|d| d.is_finite() && *d >= 0.0),
            "sampling margins must be finite and >= 0, got {m:?}"
        );
        Ok(SpotChecker {
            key,
            dtypes: WorkerDtypes::default(),
            masks: Arc::new(ResponseTokens),
            condemned: Mutex::new(HashSet::new()),
            settings,
            chunks,
            model,
            device,
            cache: Mutex::new(VecDeque::new()),
            counters: Counters::default(),
            adapter_base: None,
            earned: EarnedMargins::default(),
            margin_rule: control::admission::MarginRule::default(),
        })
    }

    /// Checks adapter versions (a LoRA run) on `base`, the learner's frozen base (a view
    /// sharing its storage): the model a worker installs is that base with the version's
    /// adapters.
    pub fn with_adapter_base(mut self, base: Option<Policy>) -> Self {
        self.adapter_base = base;
        self
    }

    /// Keeps the workers' measured sampling and earned margins in `earned` (shared with
    /// status).
    pub fn with_earned_margins(mut self, earned: EarnedMargins) -> Self {
        self.earned = earned;
        self
    }

    /// Judges each producer with the dtype `dtypes` reports for it (default: f32 for all).
    pub fn with_worker_dtypes(mut self, dtypes: WorkerDtypes) -> Self {
        self.dtypes = dtypes;
        self
    }

    /// Derives sampled positions with `rule` (default: every response token; a multi-turn
    /// environment supplies its turn-aware rule).
    pub fn with_mask_rule(mut self, rule: Arc<dyn MaskRule>) -> Self {
        self.masks = rule;
        self
    }

    /// The counts so far.
    pub fn stats(&self) -> SpotStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SpotStats {
            checked: get(&c.checked),
            mismatches: get(&c.mismatches),
            not_drawn: get(&c.not_drawn),
            unpublished: get(&c.unpublished),
            skipped_unavailable: get(&c.skipped_unavailable),
            errors: get(&c.errors),
            loads: get(&c.loads),
            unearned: get(&c.unearned),
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
        // A delta version is rebuilt from its keyframe and the deltas since.
        let Some(bytes) = crate::roles::delta::assemble_full(&self.chunks, version)? else {
            return Ok(None);
        };
        // Evict before decoding: at most `cached_versions` models are ever held (plus the
        // snapshot bytes while one is decoded).
        while cache.len() >= self.settings.cached_versions.max(1) {
            cache.pop_front();
        }
        let adapters = self
            .chunks
            .manifest(version)?
            .is_some_and(|m| matches!(m.manifest.payload, storage::PayloadKind::Adapter { .. }));
        let policy = Arc::new(match (&self.adapter_base, adapters) {
            (Some(base), true) => base.adapted(policy::lora::Adapters::from_safetensors_bytes(
                &self.model,
                &bytes,
                base.device(),
            )?)?,
            _ => Policy::from_safetensors_bytes(&self.model, &bytes, &self.device)?,
        });
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        cache.push_back((version, policy.clone()));
        Ok(Some(policy))
    }

    fn count(&self, c: &AtomicU64, result: &'static str) {
        c.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("learner_spot_checks_total", "result" => result).increment(1);
    }

    /// The check of `group` pulled from `producer` (base58 peer id), drawn with probability
    /// `rate` (the worker's check rate); blocking (runs a forward when drawn). `Ok(true)` when
    /// it was recomputed and passed. See the module doc for the rules.
    pub fn check(
        &self,
        producer: &str,
        group: &TrajectoryGroup,
        rate: f64,
    ) -> Result<bool, Rejection> {
        let c = &self.counters;
        if self.is_condemned(producer) {
            return Err(Rejection::TokenNotDrawn(
                "this producer already sent a token the sampling rule did not draw".into(),
            ));
        }
        match self.held(group.version) {
            Ok(Held::Yes) => {}
            Ok(Held::Gone) => {
                self.count(&c.skipped_unavailable, "skipped_unavailable");
                return unchecked(rate, "its snapshot version is no longer held");
            }
            Ok(Held::Never) => {
                self.count(&c.unpublished, "unpublished_version");
                return Err(Rejection::UnpublishedVersion(format!(
                    "version {} was never published",
                    group.version
                )));
            }
            Err(e) => {
                tracing::warn!(error = %e, "spot check: reading the snapshot index failed");
                self.count(&c.errors, "error");
                return unchecked(rate, "reading the snapshot index failed");
            }
        }
        if !selected_by_fraction(&group.group_id, &self.key, rate) {
            return Ok(false);
        }
        let policy = match self.model_of(group.version) {
            Ok(Some(p)) => p,
            Ok(None) => {
                self.count(&c.skipped_unavailable, "skipped_unavailable");
                return unchecked(rate, "its snapshot version is no longer held");
            }
            Err(e) => {
                tracing::warn!(version = group.version, error = %format!("{e:#}"),
                    "spot check: loading the snapshot failed");
                self.count(&c.errors, "error");
                return unchecked(rate, "loading its snapshot failed");
            }
        };
        let dtype = self.dtypes.get(producer);
        let s = &self.settings;
        let settings = CheckSettings {
            rule: RuleParams {
                temperature: s.temperature,
                top_p: s.top_p,
            },
            tolerance: s.tolerance.of(dtype),
            delta: s.margin.of(dtype),
            seed: s.seed,
            check_draws: s.check_sampling,
        };
        // The claimed dtype's margins are the ceiling; f32's the floor; between them, what
        // the worker's measured spread (this group's included) earns.
        let floor = control::admission::Margin {
            tolerance: f64::from(s.tolerance.f32),
            delta: s.margin.f32,
        };
        let ceiling = control::admission::Margin {
            tolerance: f64::from(settings.tolerance),
            delta: settings.delta,
        };
        let evidence = self.earned.evidence(producer);
        let rule = self.margin_rule;
        let judged = std::cell::Cell::new(floor);
        let earn = |spread: f32| {
            let m = control::admission::earned_margin(
                &rule,
                floor,
                ceiling,
                &evidence,
                f64::from(spread),
            );
            judged.set(m);
            (m.tolerance as f32, m.delta)
        };
        let checked = learner::verdict::check_group_earned(
            &policy,
            group,
            &settings,
            Some(&earn),
            self.masks.as_ref(),
        );
        if let Ok(report) = &checked {
            let m = judged.get();
            let passed_drift = report.logprobs.max_abs_diff <= settings.tolerance;
            self.earned.update(producer, |v| {
                if passed_drift && report.not_drawn == 0 {
                    v.evidence.record(
                        report.draws_checked as u64,
                        report.in_band as u64,
                        f64::from(report.logprobs.max_abs_diff),
                    );
                }
                v.tolerance = m.tolerance;
                v.delta = m.delta;
                v.claimed = Some(dtype);
                v.unearned +=
                    u64::from(report.verdict(settings.tolerance) == SpotVerdict::MarginUnearned);
            });
        }
        match checked {
            Ok(report) => self
                .judge(producer, group, dtype, &settings, &report)
                .map(|()| true),
            Err(LearnerError::Invalid(why)) => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.mismatches, "mismatch");
                Err(Rejection::LogprobMismatch(format!(
                    "cannot recompute: {why}"
                )))
            }
            Err(e) => {
                tracing::warn!(error = %e, "spot check: recomputation failed");
                self.count(&c.errors, "error");
                unchecked(rate, "the recomputation failed")
            }
        }
    }

    /// The penalty-free outcome of a check: pass, or the rejection its verdict calls for.
    fn judge(
        &self,
        producer: &str,
        group: &TrajectoryGroup,
        dtype: WorkerDtype,
        settings: &CheckSettings,
        report: &CheckReport,
    ) -> Result<(), Rejection> {
        let c = &self.counters;
        let v = group.version;
        match report.verdict(settings.tolerance) {
            SpotVerdict::Pass => {
                self.count(&c.checked, "pass");
                tracing::debug!(
                    version = v,
                    dtype = dtype.name(),
                    max_abs_diff = report.logprobs.max_abs_diff,
                    worst_draw_excess = report.worst_draw.map(|w| w.excess),
                    "spot check passed"
                );
                Ok(())
            }
            SpotVerdict::LogprobDrift => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.mismatches, "mismatch");
                let r = &report.logprobs;
                let proof = r.max_abs_diff >= PROOF_FACTOR * settings.tolerance;
                let detail = format!(
                    "max |Δ log-prob| {} at sample {} token {} > tolerance {} for a {} sampler \
                     (version {v})",
                    r.max_abs_diff,
                    r.worst_sample,
                    r.worst_token,
                    settings.tolerance,
                    dtype.name()
                );
                Err(match proof {
                    true => Rejection::LogprobForged(detail),
                    false => Rejection::LogprobMismatch(detail),
                })
            }
            SpotVerdict::MarginUnearned => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.unearned, "margin_unearned");
                let e = self.earned.evidence(producer);
                Err(Rejection::MarginUnearned(format!(
                    "{} of {} sampled tokens lie in the margin of a {} sampler but outside \
                         the margins this worker earned (measured spread {:.2e} over {} \
                         groups, {} of {} tokens in the band; version {v})",
                    report.outside_earned,
                    report.draws_checked,
                    dtype.name(),
                    e.max_spread,
                    e.groups,
                    e.band_tokens,
                    e.tokens
                )))
            }
            SpotVerdict::NotDrawn => {
                c.checked.fetch_add(1, Ordering::Relaxed);
                self.count(&c.not_drawn, "not_drawn");
                self.condemn(producer);
                let detail =
                    match report.worst_draw {
                        Some(w) => {
                            format!(
                        "{} of {} sampled tokens are not the rule's draw; sample {} token {} \
                         (id {}, p {:.3e}): uniform {:.6} outside [{:.6}, {:.6}]{} with margin \
                         {} for a {} sampler (version {v})",
                        report.not_drawn,
                        report.draws_checked,
                        w.sample,
                        w.token,
                        w.token_id,
                        w.window.p,
                        w.uniform,
                        w.window.lower,
                        w.window.upper,
                        if w.window.in_nucleus { "" } else { ", outside every honest nucleus" },
                        settings.delta,
                        dtype.name()
                    )
                        }
                        None => "a sampled token is not the rule's draw".into(),
                    };
                tracing::warn!(producer, %detail, "spot check: proof of tokens not drawn by the rule");
                Err(Rejection::TokenNotDrawn(detail))
            }
        }
    }

    fn is_condemned(&self, producer: &str) -> bool {
        self.condemned
            .lock()
            .map(|s| s.contains(producer))
            .unwrap_or(false)
    }

    fn condemn(&self, producer: &str) {
        if let Ok(mut s) = self.condemned.lock() {
            if s.len() >= MAX_TRACKED_PEERS {
                s.clear(); // the caught are banned by then; forgetting only costs re-checks
            }
            s.insert(producer.to_string());
        }
    }
}

/// The spot check as the last stage of the learner's pipeline (the only one that runs the
/// model, so it sees only groups every cheaper stage passed).
impl learner::Stage for SpotChecker {
    fn name(&self) -> &'static str {
        "logprob_mismatch"
    }
    fn check(&self, input: &StageInput<'_>, checks: &mut Checks) -> Result<(), Rejection> {
        checks.sampling_checked =
            SpotChecker::check(self, input.worker, input.group, input.check_rate)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "spot_tests.rs"]
mod tests;
