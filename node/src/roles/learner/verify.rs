//! The learner's verification of pulled groups (`docs/security.md`, "Verified rollouts"): an
//! ordered list of [`Layer`]s run by the pull protocol ([`pull::pull_verified`]) on every
//! group that passed `storage::record::check_group`, before the group is stored. The first
//! layer that refuses a group names the reason; the puller turns it into a strike
//! ([`strike_reason`]).
//!
//! Layers, cheapest first:
//! 1. [`SignatureLayer`] (`bad_signature`): the group is signed by the key of the peer it was
//!    pulled from, which is also its `producer`.
//! 2. [`PromptLayer`] (`wrong_prompt`): its prompt (id, text and tokens) is the one assigned
//!    to (producer, `seq`) by `tasks::assign`, and the worker has not used that `seq` for
//!    another group ([`STALE_SEQ`], without a strike, for a `seq` older than it remembers).
//! 3. [`RewardLayer`] (`reward_mismatch`): every sample's reward, recomputed by the task from
//!    the decoded response tokens, equals the reported one within [`REWARD_TOLERANCE`].
//! 4. [`MaskLayer`] (`mask_mismatch`): every sample's loss mask is the one the learner derives
//!    from the tokens (`learner::mask`; the trainer trains on the derived mask only).
//!
//! More layers (the spot check: `logprob_mismatch`, `token_not_drawn`) are appended with
//! [`Verifier::with_layer`]. Owns: the layers and the reason → strike mapping. Must not touch:
//! the pull protocol, the store, the swarm (the puller strikes).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use p2p::{PeerId, StrikeReason};
use policy::Tokenizer;
use storage::record::GroupRejection;
use storage::TrajectoryGroup;
use tasks::Task;

use crate::config::NodeConfig;

/// Largest difference between a reported and a recomputed reward that is accepted. Rewards of
/// the built-in tasks are exact fractions computed the same way on both sides, so any real
/// difference is a lie, not rounding.
pub const REWARD_TOLERANCE: f32 = 1e-6;
/// Sequence numbers remembered per worker (the newest ones); an older one is refused.
pub const SEQ_WINDOW: usize = 8192;
/// Workers whose sequence numbers are remembered; past it the ledger forgets one.
pub const MAX_TRACKED_WORKERS: usize = 1024;

/// One verification step. `check` must be pure apart from its own bookkeeping, never panic,
/// and return `GroupRejection::Unverified` with the layer's stable reason on refusal.
pub trait Layer: Send + Sync {
    /// The stable reason of this layer's rejections (a metrics label, a strike reason).
    fn name(&self) -> &'static str;
    fn check(&self, worker: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection>;
}

/// The learner's ordered verification layers; plugs into [`pull::pull_verified`].
#[derive(Default)]
pub struct Verifier {
    layers: Vec<Box<dyn Layer>>,
}

impl Verifier {
    /// Appends `layer` (it runs after the ones already present).
    pub fn with_layer(mut self, layer: impl Layer + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// The layers' names, in order.
    pub fn layer_names(&self) -> Vec<&'static str> {
        self.layers.iter().map(|l| l.name()).collect()
    }

    /// The layers `[verification]` switches on, for a learner whose public key is
    /// `learner_key` (the assignment seed derives from it and the swarm id).
    pub fn for_learner(config: &NodeConfig, learner_key: &[u8; 32]) -> anyhow::Result<Self> {
        let v = &config.verification;
        let mut out = Verifier::default();
        if v.signatures {
            out = out.with_layer(SignatureLayer);
        }
        if v.assigned_prompts || v.recompute_rewards {
            let task = super::super::build_task(config)?;
            let tokenizer = Arc::new(learner_tokenizer(config)?);
            if v.assigned_prompts {
                let seed = tasks::assign::assignment_seed(&config.swarm_id, learner_key);
                out = out.with_layer(PromptLayer::new(task.clone(), tokenizer.clone(), seed));
            }
            if v.recompute_rewards {
                out = out.with_layer(RewardLayer { task, tokenizer });
            }
        }
        Ok(out.with_layer(MaskLayer(super::super::mask_rule(config))))
    }
}

impl pull::GroupVerifier for Verifier {
    fn verify(&self, worker: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        self.layers.iter().try_for_each(|l| l.check(worker, group))
    }
}

/// The tokenizer of the configured model, without loading its weights.
fn learner_tokenizer(config: &NodeConfig) -> anyhow::Result<Tokenizer> {
    use anyhow::Context;
    if config.model.source == "embedded" {
        return Ok(Tokenizer::byte());
    }
    let path = std::path::Path::new(&config.model.source).join("tokenizer.json");
    Tokenizer::from_file(&path, &[]).with_context(|| format!("loading {}", path.display()))
}

/// Reason of a group whose sequence number is below the ones the learner still remembers for
/// its worker ([`SeqLedger`]): refused, since it could not be checked for reuse, but not
/// struck — an honest worker holding many groups may have one pulled that late.
pub const STALE_SEQ: &str = "stale_seq";

/// The strike a rejection reason earns (`None`: not the worker's fault, e.g. a group that
/// aged out of the window in transit, or of the sequence-number window).
pub fn strike_reason(reason: &str) -> Option<StrikeReason> {
    Some(match reason {
        "inadmissible" | STALE_SEQ => return None,
        "bad_signature" => StrikeReason::BadSignature,
        "wrong_prompt" => StrikeReason::WrongPrompt,
        "reward_mismatch" => StrikeReason::RewardMismatch,
        "logprob_mismatch" => StrikeReason::LogprobMismatch,
        "mask_mismatch" => StrikeReason::MaskMismatch,
        "token_not_drawn" => StrikeReason::TokenNotDrawn,
        // The schema and limit checks of `check_group`, and any future layer without its own.
        _ => StrikeReason::InvalidGroup,
    })
}

fn reject(reason: &'static str, detail: impl Into<String>) -> GroupRejection {
    GroupRejection::Unverified {
        reason,
        detail: detail.into(),
    }
}

/// The 32-byte ed25519 public key an ed25519 peer id embeds (an identity multihash of the
/// protobuf-encoded key: `00 24 | 08 01 12 20 | key`), checked by deriving the peer id back.
/// `None` for peer ids of other key types (hashed, RSA, secp256k1): those cannot sign groups.
pub fn peer_public_key(peer: &PeerId) -> Option<[u8; 32]> {
    const PREFIX: [u8; 6] = [0x00, 0x24, 0x08, 0x01, 0x12, 0x20];
    let bytes = peer.to_bytes();
    let key: [u8; 32] = bytes.strip_prefix(&PREFIX)?.try_into().ok()?;
    (p2p::peer_id_from_public(key).ok()? == *peer).then_some(key)
}

/// `bad_signature`: signed by the key of the peer pulled from, which is also the producer.
#[derive(Debug, Default, Clone, Copy)]
pub struct SignatureLayer;

impl Layer for SignatureLayer {
    fn name(&self) -> &'static str {
        "bad_signature"
    }
    fn check(&self, worker: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        if group.producer != worker.to_base58() {
            return Err(reject(
                self.name(),
                format!("producer {:?} is not the peer pulled from", group.producer),
            ));
        }
        let key = peer_public_key(worker)
            .ok_or_else(|| reject(self.name(), "the peer id does not embed an ed25519 key"))?;
        group
            .verify_signature(&key)
            .map_err(|e| reject(self.name(), format!("group seq {}: {e}", group.seq)))
    }
}

/// `wrong_prompt`: the prompt assigned to (producer, seq), and a sequence number not used
/// before for another group.
pub struct PromptLayer {
    task: Arc<dyn Task>,
    tokenizer: Arc<Tokenizer>,
    seed: [u8; 32],
    ledger: Mutex<SeqLedger>,
}

impl PromptLayer {
    pub fn new(task: Arc<dyn Task>, tokenizer: Arc<Tokenizer>, seed: [u8; 32]) -> Self {
        PromptLayer {
            task,
            tokenizer,
            seed,
            ledger: Mutex::new(SeqLedger::default()),
        }
    }
}

/// The pure part of [`PromptLayer`]: is `group`'s prompt the one assigned to its producer and
/// sequence number? Compares task, prompt id, prompt text and prompt tokens.
pub fn check_assigned_prompt(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    seed: &[u8; 32],
    group: &TrajectoryGroup,
) -> Result<(), String> {
    if group.task_id != task.name() {
        return Err(format!(
            "task {:?}, the swarm trains {:?}",
            group.task_id,
            task.name()
        ));
    }
    let index = tasks::assign::assigned_index(task, seed, &group.producer, group.seq);
    let prompt = task
        .prompt(index)
        .map_err(|e| format!("assigned prompt {index}: {e}"))?;
    if prompt.id != group.prompt_id {
        return Err(format!(
            "seq {} answers prompt {:?}, assigned {:?}",
            group.seq, group.prompt_id, prompt.id
        ));
    }
    if prompt.text != group.prompt_text {
        return Err(format!(
            "seq {}: prompt text differs from the task's",
            group.seq
        ));
    }
    let tokens = tokenizer
        .encode_prompt(&prompt.text)
        .map_err(|e| format!("tokenizing the assigned prompt: {e}"))?;
    if tokens != group.prompt_tokens {
        return Err(format!(
            "seq {}: prompt tokens are not the prompt's",
            group.seq
        ));
    }
    Ok(())
}

impl Layer for PromptLayer {
    fn name(&self) -> &'static str {
        "wrong_prompt"
    }
    fn check(&self, worker: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        check_assigned_prompt(self.task.as_ref(), &self.tokenizer, &self.seed, group)
            .map_err(|d| reject(self.name(), d))?;
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger
            .admit(worker, group.seq, group.group_id)
            .map_err(|e| match e {
                SeqRefusal::Reused(seq) => {
                    reject(self.name(), format!("seq {seq} reused for another group"))
                }
                SeqRefusal::BelowWindow { seq, floor } => reject(
                    STALE_SEQ,
                    format!(
                        "seq {seq} is below the {SEQ_WINDOW} newest of this worker (from {floor})"
                    ),
                ),
            })
    }
}

/// Why [`SeqLedger::admit`] refuses a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqRefusal {
    /// Used before for another group (a worker drawing its assigned prompt twice).
    Reused(u64),
    /// Below the numbers still remembered for the worker: it cannot be checked for reuse.
    BelowWindow { seq: u64, floor: u64 },
}

/// Which sequence numbers each worker has used, and for which group: a `seq` may come again
/// only with the same group (a repeated pull after a lost ack; the buffer deduplicates it).
/// Bounded: the newest [`SEQ_WINDOW`] numbers per worker and [`MAX_TRACKED_WORKERS`] workers;
/// a number below a worker's window is refused (it would otherwise escape the check) without
/// a strike ([`STALE_SEQ`]).
/// In memory: a restarted learner starts empty (replays of trained groups are refused by the
/// trainer's consumed-id record).
#[derive(Debug, Default)]
pub struct SeqLedger {
    workers: HashMap<PeerId, WorkerSeqs>,
}

#[derive(Debug, Default)]
struct WorkerSeqs {
    seen: BTreeMap<u64, [u8; 16]>,
    /// Numbers below this were forgotten and are refused.
    floor: u64,
}

impl SeqLedger {
    /// Records `seq` → `group_id` for `worker`, or says why it is refused.
    pub fn admit(
        &mut self,
        worker: &PeerId,
        seq: u64,
        group_id: [u8; 16],
    ) -> Result<(), SeqRefusal> {
        if !self.workers.contains_key(worker) && self.workers.len() >= MAX_TRACKED_WORKERS {
            if let Some(k) = self.workers.keys().next().copied() {
                self.workers.remove(&k);
            }
        }
        let w = self.workers.entry(*worker).or_default();
        if seq < w.floor {
            return Err(SeqRefusal::BelowWindow {
                seq,
                floor: w.floor,
            });
        }
        match w.seen.get(&seq) {
            Some(id) if *id == group_id => return Ok(()),
            Some(_) => return Err(SeqRefusal::Reused(seq)),
            None => {}
        }
        w.seen.insert(seq, group_id);
        while w.seen.len() > SEQ_WINDOW {
            if let Some((oldest, _)) = w.seen.pop_first() {
                w.floor = oldest + 1;
            }
        }
        Ok(())
    }
}

/// `reward_mismatch`: every reward recomputed from the task's prompt and the decoded response.
pub struct RewardLayer {
    pub task: Arc<dyn Task>,
    pub tokenizer: Arc<Tokenizer>,
}

/// The pure part of [`RewardLayer`]: `Err((reason, detail))` on the first sample whose
/// response text is not the decoding of its tokens or whose recomputed reward differs by more
/// than [`REWARD_TOLERANCE`].
pub fn check_rewards(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    group: &TrajectoryGroup,
) -> Result<(), (&'static str, String)> {
    if group.task_id != task.name() {
        return Err((
            "wrong_prompt",
            format!("task {:?} is not the swarm's", group.task_id),
        ));
    }
    let prompt = task
        .prompt_by_id(&group.prompt_id)
        .map_err(|e| ("wrong_prompt", format!("cannot recompute rewards: {e}")))?;
    for (i, s) in group.samples.iter().enumerate() {
        let text = tokenizer
            .decode(&s.response_tokens)
            .map_err(|e| ("reward_mismatch", format!("sample {i}: cannot decode: {e}")))?;
        if text != s.response_text {
            return Err((
                "reward_mismatch",
                format!("sample {i}: response text is not the decoding of its tokens"),
            ));
        }
        let r = task.reward(&prompt, &text).value;
        if (r - s.reward).abs() > REWARD_TOLERANCE || !s.reward.is_finite() {
            return Err((
                "reward_mismatch",
                format!("sample {i}: reported reward {}, recomputed {r}", s.reward),
            ));
        }
    }
    Ok(())
}

impl Layer for RewardLayer {
    fn name(&self) -> &'static str {
        "reward_mismatch"
    }
    fn check(&self, _: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        check_rewards(self.task.as_ref(), &self.tokenizer, group).map_err(|(r, d)| reject(r, d))
    }
}

/// `mask_mismatch`: the sent loss masks are the learner's own (see `learner::mask`).
pub struct MaskLayer(pub Arc<dyn learner::MaskRule>);

impl Layer for MaskLayer {
    fn name(&self) -> &'static str {
        "mask_mismatch"
    }
    fn check(&self, _: &PeerId, group: &TrajectoryGroup) -> Result<(), GroupRejection> {
        learner::mask::check_masks(self.0.as_ref(), group)
            .map_err(|e| reject(self.name(), format!("seq {}: {e}", group.seq)))
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
