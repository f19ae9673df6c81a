//! The one verification pipeline of pulled groups (`docs/security.md`, "One verification
//! pipeline"): an ordered chain of checks whose only output a trainer accepts,
//! [`Verified<TrajectoryGroup>`].
//!
//! The chain, cheapest first, stops at the first refusal:
//! 1. **admissible version**: `v ≥ v_min` of the pull (`inadmissible`, not the worker's
//!    fault: a group can age out of the window in transit);
//! 2. **structure** ([`storage::record::check_group`] against the learner's
//!    [`GroupLimits`]): schema, non-empty prompt and responses, vocabulary, context, log-prob
//!    floor, group size, and that the producer is the peer pulled from — everything the
//!    training forward needs, so the trainer does not check again;
//! 3. the caller's [`Stage`]s in the order added (the node adds: producer signature, assigned
//!    prompt and fresh sequence number, recomputed rewards, the log-prob and sampling check).
//!
//! Every stage refuses with a [`Rejection`], the closed enum of every stage's reasons (in
//! `storage`, the lowest crate that needs it: the pull protocol's verifier answers one too);
//! the node's learner role maps it to a penalty by one exhaustive `match`
//! (`node/src/roles/learner/penalty.rs`).
//!
//! The pipeline also keeps what it verified of each worker ([`Standings`]: accepted and
//! rejected groups, skipped sequence numbers) and hands stages the worker's check rate
//! (probation and history, `control::admission`), so "check every group of a new identity,
//! fewer of a worker with a long verified record" is one rule in one place.
//!
//! [`Verified`] has no public constructor: only [`Pipeline::verify`] and
//! [`Pipeline::from_own_buffer`] make one. The latter re-wraps a group this learner's
//! pipeline accepted before and stored in its own buffer (pulls store nothing else; the
//! learner's disk is trusted): it checks nothing again, it only restores the record of which
//! costly checks the group passed, while the pipeline remembers it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use control::admission::{PeerHistory, ProbationParams, SeqGaps, Standings};
use storage::record::{check_group, GroupLimits};
use storage::Rejection;
use storage::TrajectoryGroup;

/// Which of the costly checks a verified group passed (the cheap ones — structure, and every
/// stage the pipeline has — it passed all).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checks {
    /// Its rewards were recomputed by the learner from its responses.
    pub rewards_recomputed: bool,
    /// Its sampled tokens and log-probs were recomputed under the claimed version (the spot
    /// check ran on it, and passed).
    pub sampling_checked: bool,
}

/// A group every stage of a [`Pipeline`] accepted. Dereferences to the group.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified<T> {
    inner: T,
    checks: Checks,
    limits: GroupLimits,
}

impl<T> Verified<T> {
    /// Which costly checks it passed.
    pub fn checks(&self) -> Checks {
        self.checks
    }

    /// The limits its structure was checked against (a trainer refuses a group verified for
    /// a larger model than its own).
    pub fn limits(&self) -> &GroupLimits {
        &self.limits
    }

    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T> std::ops::Deref for Verified<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

/// What a stage sees of one group.
#[derive(Debug, Clone, Copy)]
pub struct StageInput<'a> {
    /// The peer the group was pulled from (base58; the structure stage has checked that the
    /// group names it as producer).
    pub worker: &'a str,
    /// The ed25519 public key `worker`'s peer id embeds, decoded by the caller (which has the
    /// typed peer id; this crate has no libp2p): what the group's signature is checked with.
    /// `None` when the id embeds no ed25519 key, or the caller did not give one.
    pub worker_key: Option<[u8; 32]>,
    pub group: &'a TrajectoryGroup,
    /// The fraction of this worker's groups that get the costly checks now: 1 on probation,
    /// then falling with its verified history (`control::admission::check_rate`).
    pub check_rate: f64,
}

/// One step of the chain. `check` must never panic, keep only its own bookkeeping, record
/// the costly checks it ran in `checks`, and refuse with the [`Rejection`] of its reason.
pub trait Stage: Send + Sync {
    /// The stable name of the stage, for the chain's description ([`Pipeline::stage_names`]).
    fn name(&self) -> &'static str;
    fn check(&self, input: &StageInput<'_>, checks: &mut Checks) -> Result<(), Rejection>;
}

/// Groups whose [`Checks`] the pipeline remembers for [`Pipeline::from_own_buffer`] (a few
/// buffers' worth; an older group comes back with no costly check recorded, which only makes
/// a reward figure say it is unverified).
const REMEMBERED_CHECKS: usize = 4096;

/// Per-worker record: history and sequence gaps.
#[derive(Debug)]
struct Ledger {
    standings: Standings<String>,
    gaps: HashMap<String, SeqGaps>,
    /// Newly skipped numbers per worker, not yet taken by the caller.
    new_skips: HashMap<String, u64>,
    checks: HashMap<[u8; 16], Checks>,
    checks_order: VecDeque<[u8; 16]>,
}

/// The ordered chain (see the module doc).
pub struct Pipeline {
    limits: GroupLimits,
    stages: Vec<Box<dyn Stage>>,
    ledger: Mutex<Ledger>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("limits", &self.limits)
            .field("stages", &self.stage_names())
            .finish()
    }
}

/// The name of the built-in first stages.
pub const STRUCTURE: &str = "structure";

/// The structure limits of a learner training `model` on groups of `group_size` samples
/// (0: any size): its vocabulary and context, the default log-prob floor.
pub fn limits_of(model: &policy::ModelConfig, group_size: usize) -> GroupLimits {
    GroupLimits {
        vocab_size: model.vocab_size,
        max_context: model.max_position_embeddings,
        logprob_floor: storage::record::DEFAULT_LOGPROB_FLOOR,
        group_size,
    }
}

impl Pipeline {
    /// A pipeline of the built-in stages only (admissible version, structure against
    /// `limits`, which must be the training model's) and the default probation rule.
    pub fn new(limits: GroupLimits) -> Self {
        Self::with_probation(limits, ProbationParams::default())
    }

    pub fn with_probation(limits: GroupLimits, probation: ProbationParams) -> Self {
        Pipeline {
            limits,
            stages: Vec::new(),
            ledger: Mutex::new(Ledger {
                standings: Standings::new(probation),
                gaps: HashMap::new(),
                new_skips: HashMap::new(),
                checks: HashMap::new(),
                checks_order: VecDeque::new(),
            }),
        }
    }

    /// Appends `stage` (it runs after those already present).
    pub fn with_stage(mut self, stage: impl Stage + 'static) -> Self {
        self.stages.push(Box::new(stage));
        self
    }

    /// The stages in order, the built-in one first.
    pub fn stage_names(&self) -> Vec<&'static str> {
        std::iter::once(STRUCTURE)
            .chain(self.stages.iter().map(|s| s.name()))
            .collect()
    }

    pub fn limits(&self) -> &GroupLimits {
        &self.limits
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // A panic elsewhere while the lock was held leaves consistent counters.
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the chain over `group`, pulled from `worker` with the pull's `v_min`; records the
    /// outcome in the worker's history.
    pub fn verify(
        &self,
        worker: &str,
        v_min: u64,
        group: TrajectoryGroup,
    ) -> Result<Verified<TrajectoryGroup>, Rejection> {
        let checks = self.check(worker, v_min, &group)?;
        Ok(Verified {
            inner: group,
            checks,
            limits: self.limits,
        })
    }

    /// [`Pipeline::verify`] by reference (for a caller that stores the group itself): the
    /// costly checks it passed, or the first refusal. Stages see no worker key: a chain with a
    /// signature stage is run through [`Pipeline::check_keyed`].
    pub fn check(
        &self,
        worker: &str,
        v_min: u64,
        group: &TrajectoryGroup,
    ) -> Result<Checks, Rejection> {
        self.check_keyed(worker, None, v_min, group)
    }

    /// [`Pipeline::check`] with the public key `worker`'s id embeds ([`StageInput::worker_key`]).
    pub fn check_keyed(
        &self,
        worker: &str,
        worker_key: Option<[u8; 32]>,
        v_min: u64,
        group: &TrajectoryGroup,
    ) -> Result<Checks, Rejection> {
        if group.version < v_min {
            return Err(Rejection::Inadmissible {
                version: group.version,
                v_min,
            });
        }
        let result = check_group(group, &self.limits, worker)
            .map_err(Rejection::from)
            .and_then(|()| {
                let input = StageInput {
                    worker,
                    worker_key,
                    group,
                    check_rate: self.rate(worker),
                };
                let mut checks = Checks::default();
                for s in &self.stages {
                    s.check(&input, &mut checks)?;
                }
                Ok(checks)
            });
        let mut l = self.ledger();
        let Ledger {
            standings: st,
            gaps,
            new_skips,
            checks: remembered,
            checks_order,
        } = &mut *l;
        match &result {
            Ok(c) => {
                st.record_accepted(&worker.to_string(), group.version, storage::unix_ms());
                let skipped = gaps.entry(worker.to_string()).or_default().see(group.seq);
                if skipped > 0 {
                    st.record_skipped(&worker.to_string(), skipped);
                    *new_skips.entry(worker.to_string()).or_default() += skipped;
                }
                if remembered.insert(group.group_id, *c).is_none() {
                    checks_order.push_back(group.group_id);
                    while checks_order.len() > REMEMBERED_CHECKS {
                        if let Some(old) = checks_order.pop_front() {
                            remembered.remove(&old);
                        }
                    }
                }
                // Bounded like the standings: one gap record per worker it knows.
                if gaps.len() > control::admission::MAX_STANDINGS {
                    gaps.clear();
                }
            }
            // Aged out in transit: not the worker's doing.
            Err(Rejection::Inadmissible { .. }) => {}
            Err(_) => st.record_rejected(&worker.to_string()),
        }
        result
    }

    /// Re-wraps a group from this learner's own buffer (see the module doc: nothing is
    /// checked again; the costly checks it passed are restored while remembered).
    pub fn from_own_buffer(&self, group: TrajectoryGroup) -> Verified<TrajectoryGroup> {
        let checks = self
            .ledger()
            .checks
            .get(&group.group_id)
            .copied()
            .unwrap_or_default();
        Verified {
            inner: group,
            checks,
            limits: self.limits,
        }
    }

    /// The check rate of `worker`'s next group.
    pub fn rate(&self, worker: &str) -> f64 {
        self.ledger()
            .standings
            .rate(&worker.to_string(), storage::unix_ms())
    }

    /// Whether `worker` is on probation (`control::admission::on_probation`: too few
    /// accepted groups, versions or seconds of verified history).
    pub fn on_probation(&self, worker: &str) -> bool {
        self.ledger()
            .standings
            .on_probation(&worker.to_string(), storage::unix_ms())
    }

    /// What the pipeline verified of `worker`.
    pub fn history(&self, worker: &str) -> PeerHistory {
        self.ledger().standings.history(&worker.to_string())
    }

    /// Every worker's history (for status).
    pub fn histories(&self) -> Vec<(String, PeerHistory)> {
        let l = self.ledger();
        l.standings.iter().map(|(k, h)| (k.clone(), *h)).collect()
    }

    /// Sequence numbers skipped for good since the last call, per worker (the caller takes
    /// them off the workers' pull credit).
    pub fn take_new_skips(&self) -> Vec<(String, u64)> {
        self.ledger().new_skips.drain().collect()
    }

    /// Forgets `worker` (banned): if it ever comes back it is on probation again.
    pub fn forget(&self, worker: &str) {
        let mut l = self.ledger();
        l.standings.forget(&worker.to_string());
        l.gaps.remove(worker);
        l.new_skips.remove(worker);
    }

    /// The probation rule in force.
    pub fn probation(&self) -> ProbationParams {
        *self.ledger().standings.params()
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
