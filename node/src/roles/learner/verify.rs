//! The learner's verification of pulled groups (`docs/security.md`, "One verification
//! pipeline"): the node's stages of the one chain (`learner::Pipeline`), the chain built from
//! `[verification]` and its plug into the pull protocol ([`PullVerifier`]). Each stage
//! refuses with its own variant of [`Rejection`] (`storage::rejection`, a closed enum); what a
//! rejection costs the worker is one exhaustive `match` in `super::penalty`.
//!
//! The chain, in order (the first refusal names the reason):
//! 0. the pipeline's own first stage (`structure`): admissible version, schema, non-empty
//!    sequences, vocabulary, context, log-prob floor, group size, producer = the peer pulled
//!    from (`storage::record::check_group`);
//! 1. [`SignatureLayer`] (`bad_signature`): the group is signed by the key of the peer it was
//!    pulled from;
//! 2. [`PromptLayer`] (`wrong_prompt`): its prompt (id, text and tokens) is the one assigned
//!    to (producer, `seq`) by `tasks::assign`, and the worker has not used that `seq` for
//!    another group (`stale_seq`, without a strike, for a `seq` older than it remembers);
//! 3. [`RewardLayer`] (`reward_mismatch`): every sample's reward, recomputed by the task from
//!    the decoded response tokens, equals the reported one within [`REWARD_TOLERANCE`].
//!    For a multi-turn environment, [`ReplayLayer`] (`replay_mismatch`) instead replays every
//!    episode from its decoded actions: the observations in the trajectory must be the
//!    environment's own, the return the replayed one, the loss mask the assistant tokens;
//! 4. for a single-turn task, [`EndLayer`] (`response_end`): every response ends at its
//!    first stop token or after the most tokens a worker may sample, as an honest sampler's
//!    do;
//! 5. [`MaskLayer`] (`mask_mismatch`): every sample's loss mask is the one the learner derives
//!    from the tokens (`learner::mask`; [`EpisodeMask`] for a multi-turn environment; the
//!    trainer trains on the derived mask only);
//! 6. the spot check (`super::spot`), at the worker's check rate, appended by the learner
//!    role: log-probs recomputed under the claimed version (`logprob_mismatch` /
//!    `logprob_forged`) and each sampled token the canonical sampling rule's draw for the
//!    uniform the learner prescribes (`token_not_drawn`).
//!
//! Owns: these stages and the chain's assembly. Must not touch: the penalties
//! (`super::penalty`), the pull protocol, the store, the swarm (the puller strikes and bans).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use learner::{Checks, Pipeline, Stage, StageInput};
use p2p::PeerId;
use policy::chat::Chat;
use policy::Tokenizer;
use storage::record::GroupLimits;
use storage::{Rejection, TrajectoryGroup};
use tasks::env::{Budget, Environment, TaskEnv};
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

/// The learner's pipeline of the stages `[verification]` switches on (the spot check is
/// appended by the caller: it needs the chunk store), for a learner whose public key is
/// `learner_key` (the assignment seed derives from it and the swarm id), checking structure
/// against `limits` (its model's), with the probation rule of `[verification]`.
pub fn pipeline_for_learner(
    config: &NodeConfig,
    learner_key: &[u8; 32],
    limits: GroupLimits,
) -> anyhow::Result<Pipeline> {
    let v = &config.verification;
    let mut out = Pipeline::with_probation(limits, v.probation());
    let env = super::super::build_env(config)?;
    let tokenizer = Arc::new(learner_tokenizer(config)?);
    let context = model_context(config)?;
    if v.signatures {
        out = out.with_stage(SignatureLayer);
    }
    if v.assigned_prompts || v.recompute_rewards {
        let chat = Arc::new(super::super::build_chat(
            config,
            (*tokenizer).clone(),
            env.as_ref(),
        )?);
        if v.assigned_prompts {
            let seed = tasks::assign::assignment_seed(&config.swarm_id, learner_key);
            out = out.with_stage(PromptLayer::for_env(env.clone(), chat.clone(), seed));
        }
        if v.recompute_rewards {
            out = match env.as_task() {
                Some(task) => out.with_stage(RewardLayer {
                    task: task.clone(),
                    tokenizer: tokenizer.clone(),
                }),
                None => out.with_stage(ReplayLayer {
                    budget: config.task.budget(env.as_ref())?,
                    context,
                    env: env.clone(),
                    chat,
                }),
            };
        }
    }
    if env.as_task().is_some() {
        out = out.with_stage(EndLayer {
            stops: tokenizer.eos_ids(),
            max_new_tokens: config.rollout.max_new_tokens,
            context,
        });
    }
    // A replayed environment's masks are the replay's, compared exactly by `ReplayLayer`: a
    // second replay would only add a chance for an external program to fail.
    if v.recompute_rewards && env.as_task().is_none() {
        return Ok(out);
    }
    Ok(out.with_stage(MaskLayer(super::super::mask_rule(config)?)))
}

/// The pipeline as the pull protocol's verifier: every decoded group runs the whole chain
/// (with the pull's `v_min`) before it is stored.
#[derive(Clone)]
pub struct PullVerifier(pub Arc<Pipeline>);

impl pull::GroupVerifier for PullVerifier {
    fn verify(
        &self,
        worker: &PeerId,
        req: &pull::PullRequest,
        group: &TrajectoryGroup,
    ) -> Result<(), Rejection> {
        self.0
            .check_keyed(
                &worker.to_base58(),
                peer_public_key(worker),
                req.v_min,
                group,
            )
            .map(|_| ())
    }
}

/// The tokenizer of the configured model, without loading its weights.
pub(crate) fn learner_tokenizer(config: &NodeConfig) -> anyhow::Result<Tokenizer> {
    use anyhow::Context;
    if config.model.source == "embedded" {
        return Ok(Tokenizer::byte());
    }
    // The workers' own tokenizer (`policy::hf::load_hf_dir`'s): the stop ids of the folder's
    // `config.json` and `generation_config.json` count, or the learner would judge where a
    // worker's responses and turns end by other stop tokens than the ones it sampled with.
    let dir = std::path::Path::new(&config.model.source);
    policy::hf::load_tokenizer(dir).with_context(|| format!("loading {}", dir.display()))
}

/// The configured model's context length, without loading its weights.
pub(crate) fn model_context(config: &NodeConfig) -> anyhow::Result<usize> {
    use anyhow::Context;
    if config.model.source == "embedded" {
        return Ok(policy::ModelConfig::tiny().max_position_embeddings);
    }
    let path = std::path::Path::new(&config.model.source).join("config.json");
    let json =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(policy::ModelConfig::from_hf_json(&json)?.max_position_embeddings)
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

impl Stage for SignatureLayer {
    fn name(&self) -> &'static str {
        "bad_signature"
    }
    fn check(&self, input: &StageInput<'_>, _: &mut Checks) -> Result<(), Rejection> {
        let group = input.group;
        if group.producer != input.worker {
            return Err(Rejection::BadSignature(format!(
                "producer {:?} is not the peer pulled from",
                group.producer
            )));
        }
        // The key comes from the typed peer id pulled from (`PullVerifier`), never from
        // the producer string.
        let key = input.worker_key.ok_or_else(|| {
            Rejection::BadSignature("the peer id does not embed an ed25519 key".into())
        })?;
        group
            .verify_signature(&key)
            .map_err(|e| Rejection::BadSignature(format!("group seq {}: {e}", group.seq)))
    }
}

/// `wrong_prompt`: the prompt (for an environment: the initial state) assigned to
/// (producer, seq), and a sequence number not used before for another group.
pub struct PromptLayer {
    env: Arc<dyn Environment>,
    chat: Arc<Chat>,
    seed: [u8; 32],
    ledger: Mutex<SeqLedger>,
}

impl PromptLayer {
    /// The layer of a single-turn task.
    pub fn new(task: Arc<dyn Task>, tokenizer: Arc<Tokenizer>, seed: [u8; 32]) -> Self {
        let chat = Chat::new((*tokenizer).clone(), policy::chat::Template::Prompt);
        Self::for_env(Arc::new(TaskEnv::new(task)), Arc::new(chat), seed)
    }

    /// The layer of an environment whose prompts `chat` renders.
    pub fn for_env(env: Arc<dyn Environment>, chat: Arc<Chat>, seed: [u8; 32]) -> Self {
        PromptLayer {
            env,
            chat,
            seed,
            ledger: Mutex::new(SeqLedger::default()),
        }
    }
}

/// The pure part of [`PromptLayer`]: is `group`'s prompt the one assigned to its producer and
/// sequence number? Compares task, prompt id, prompt text and prompt tokens.
pub fn check_assigned_prompt(
    env: &dyn Environment,
    chat: &Chat,
    seed: &[u8; 32],
    group: &TrajectoryGroup,
) -> Result<(), EnvRefusal> {
    if group.task_id != env.name() {
        return Err(format!(
            "task {:?}, the swarm trains {:?}",
            group.task_id,
            env.name()
        )
        .into());
    }
    let states = env.metadata().num_initial_states;
    let index = tasks::assign::index_for(states, seed, &group.producer, group.seq);
    let prompt = match env.reset(index) {
        Ok(start) => start.prompt,
        Err(e @ tasks::TaskError::External { .. }) => {
            return Err(EnvRefusal::EnvFailed(format!(
                "assigned prompt {index}: {e}"
            )))
        }
        Err(e) => return Err(format!("assigned prompt {index}: {e}").into()),
    };
    if prompt.id != group.prompt_id {
        return Err(format!(
            "seq {} answers prompt {:?}, assigned {:?}",
            group.seq, group.prompt_id, prompt.id
        )
        .into());
    }
    if prompt.text != group.prompt_text {
        return Err(format!("seq {}: prompt text differs from the task's", group.seq).into());
    }
    let tokens = chat
        .open(env.system_prompt().as_deref(), &prompt.text)
        .map_err(|e| format!("tokenizing the assigned prompt: {e}"))?;
    if tokens != group.prompt_tokens {
        return Err(format!("seq {}: prompt tokens are not the prompt's", group.seq).into());
    }
    Ok(())
}

/// Why a check that runs the environment refuses a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvRefusal {
    /// The record is not what the environment gives (the worker's fault).
    Record(String),
    /// The environment itself failed (an external program crashed, hung or answered
    /// garbage): not a verdict on the record, and no strike ([`Rejection::EnvFailed`]).
    EnvFailed(String),
}

impl From<String> for EnvRefusal {
    fn from(s: String) -> Self {
        EnvRefusal::Record(s)
    }
}

impl EnvRefusal {
    /// The rejection: `record`'s for a record that is not the environment's (the stage's
    /// own variant), [`Rejection::EnvFailed`] when the environment failed.
    fn reject(self, record: fn(String) -> Rejection) -> Rejection {
        match self {
            EnvRefusal::Record(d) => record(d),
            EnvRefusal::EnvFailed(d) => {
                tracing::warn!(detail = %d, "a group could not be verified: the environment failed (no strike)");
                Rejection::EnvFailed(d)
            }
        }
    }
}

impl Stage for PromptLayer {
    fn name(&self) -> &'static str {
        "wrong_prompt"
    }
    fn check(&self, input: &StageInput<'_>, _: &mut Checks) -> Result<(), Rejection> {
        let group = input.group;
        check_assigned_prompt(self.env.as_ref(), &self.chat, &self.seed, group)
            .map_err(|d| d.reject(Rejection::WrongPrompt))?;
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger
            .admit(input.worker, group.seq, group.group_id)
            .map_err(|e| match e {
                SeqRefusal::Reused(seq) => {
                    Rejection::WrongPrompt(format!("seq {seq} reused for another group"))
                }
                SeqRefusal::BelowWindow { seq, floor } => Rejection::StaleSeq(format!(
                    "seq {seq} is below the {SEQ_WINDOW} newest of this worker (from {floor})"
                )),
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
/// a strike ([`Rejection::StaleSeq`]: an honest worker holding many groups may have one
/// pulled that late).
/// In memory: a restarted learner starts empty (replays of trained groups are refused by the
/// trainer's consumed-id record).
#[derive(Debug, Default)]
pub struct SeqLedger {
    workers: HashMap<String, WorkerSeqs>,
}

#[derive(Debug, Default)]
struct WorkerSeqs {
    seen: BTreeMap<u64, [u8; 16]>,
    /// Numbers below this were forgotten and are refused.
    floor: u64,
}

impl SeqLedger {
    /// Records `seq` → `group_id` for `worker`, or says why it is refused.
    pub fn admit(&mut self, worker: &str, seq: u64, group_id: [u8; 16]) -> Result<(), SeqRefusal> {
        if !self.workers.contains_key(worker) && self.workers.len() >= MAX_TRACKED_WORKERS {
            if let Some(k) = self.workers.keys().next().cloned() {
                self.workers.remove(&k);
            }
        }
        let w = self.workers.entry(worker.to_string()).or_default();
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

/// The pure part of [`RewardLayer`]: the rejection of the first sample whose response text is
/// not the decoding of its tokens or whose recomputed reward differs by more than
/// [`REWARD_TOLERANCE`] (`wrong_prompt` for a group of another task or an unknown prompt).
pub fn check_rewards(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    group: &TrajectoryGroup,
) -> Result<(), Rejection> {
    if group.task_id != task.name() {
        return Err(Rejection::WrongPrompt(format!(
            "task {:?} is not the swarm's",
            group.task_id
        )));
    }
    let prompt = task
        .prompt_by_id(&group.prompt_id)
        .map_err(|e| Rejection::WrongPrompt(format!("cannot recompute rewards: {e}")))?;
    for (i, s) in group.samples.iter().enumerate() {
        let text = tokenizer
            .decode(&s.response_tokens)
            .map_err(|e| Rejection::RewardMismatch(format!("sample {i}: cannot decode: {e}")))?;
        if text != s.response_text {
            return Err(Rejection::RewardMismatch(format!(
                "sample {i}: response text is not the decoding of its tokens"
            )));
        }
        let r = task.reward(&prompt, &text).value;
        if (r - s.reward).abs() > REWARD_TOLERANCE || !s.reward.is_finite() {
            return Err(Rejection::RewardMismatch(format!(
                "sample {i}: reported reward {}, recomputed {r}",
                s.reward
            )));
        }
    }
    Ok(())
}

impl Stage for RewardLayer {
    fn name(&self) -> &'static str {
        "reward_mismatch"
    }
    fn check(&self, input: &StageInput<'_>, checks: &mut Checks) -> Result<(), Rejection> {
        check_rewards(self.task.as_ref(), &self.tokenizer, input.group)?;
        checks.rewards_recomputed = true;
        Ok(())
    }
}

/// `response_end`: every response of a single-turn task ends where an honest sampler stops
/// (`policy::sampling`): at its first stop token, or after the most tokens it may draw,
/// `min(max_new_tokens, context − prompt)`. Every token of a response may be an honest draw
/// (the spot check sees to that) and the response still be chosen: cut before its stop token
/// where a prefix earns more (`427` cut to `42`), or continued past it. Multi-turn episodes
/// are held to their turns' ends by [`ReplayLayer`] instead. `stops` and `max_new_tokens` are
/// the workers' (the configured tokenizer's stop ids, `rollout.max_new_tokens`).
pub struct EndLayer {
    pub stops: Vec<u32>,
    pub max_new_tokens: usize,
    pub context: usize,
}

/// The pure part of [`EndLayer`]: `Err(detail)` for the first sample that does not end as
/// sampled.
pub fn check_response_ends(
    stops: &[u32],
    max_new_tokens: usize,
    context: usize,
    group: &TrajectoryGroup,
) -> Result<(), String> {
    let most = max_new_tokens.min(context.saturating_sub(group.prompt_tokens.len()));
    for (i, s) in group.samples.iter().enumerate() {
        let tokens = &s.response_tokens;
        if let Some(j) = tokens.iter().position(|t| stops.contains(t)) {
            if j + 1 != tokens.len() {
                return Err(format!(
                    "sample {i}: goes on for {} tokens after its stop token at {j}",
                    tokens.len() - j - 1
                ));
            }
        } else if tokens.len() != most {
            return Err(format!(
                "sample {i}: ends after {} tokens without a stop token (a sample stops at one, \
                 or after {most} tokens)",
                tokens.len()
            ));
        }
    }
    Ok(())
}

impl Stage for EndLayer {
    fn name(&self) -> &'static str {
        "response_end"
    }
    fn check(&self, input: &StageInput<'_>, _: &mut Checks) -> Result<(), Rejection> {
        let group = input.group;
        check_response_ends(&self.stops, self.max_new_tokens, self.context, group)
            .map_err(|d| Rejection::ResponseEnd(format!("seq {}: {d}", group.seq)))
    }
}

/// `mask_mismatch`: the sent loss masks are the learner's own (see `learner::mask`).
pub struct MaskLayer(pub Arc<dyn learner::MaskRule>);

impl Stage for MaskLayer {
    fn name(&self) -> &'static str {
        "mask_mismatch"
    }
    fn check(&self, input: &StageInput<'_>, _: &mut Checks) -> Result<(), Rejection> {
        let group = input.group;
        learner::mask::check_masks(self.0.as_ref(), group)
            .map_err(|e| Rejection::MaskMismatch(format!("seq {}: {e}", group.seq)))
    }
}

/// `replay_mismatch`: every episode of a multi-turn environment replays from its decoded
/// actions (`rollout::episode::replay`): the trajectory's observations are the environment's
/// own, the return is the replayed Σ r_t, the loss mask covers the assistant's tokens
/// exactly, and the text is the decoding of the tokens. Budgets and context are the ones the
/// workers play with (the swarm's `[task]` section and model).
pub struct ReplayLayer {
    pub env: Arc<dyn Environment>,
    pub chat: Arc<Chat>,
    pub budget: Budget,
    pub context: usize,
}

/// The pure part of [`ReplayLayer`]: `Err(detail)` for the first sample that does not replay.
pub fn check_replay(
    env: &dyn Environment,
    chat: &Chat,
    budget: Budget,
    context: usize,
    group: &TrajectoryGroup,
) -> Result<(), EnvRefusal> {
    if group.task_id != env.name() {
        return Err(format!("task {:?} is not the swarm's", group.task_id).into());
    }
    let seed = env
        .seed_of(&group.prompt_id)
        .ok_or_else(|| format!("{:?} is no initial state", group.prompt_id))?;
    let spec = rollout::episode::Spec {
        env,
        chat,
        budget,
        context,
    };
    for (i, s) in group.samples.iter().enumerate() {
        let played = rollout::episode::replay(
            spec,
            seed,
            &group.prompt_tokens,
            &s.response_tokens,
            s.reward,
        )
        .map_err(|e| match e.env_failed() {
            true => EnvRefusal::EnvFailed(format!("sample {i}: {e}")),
            false => EnvRefusal::Record(format!("sample {i}: {e}")),
        })?;
        if s.loss_mask != played.mask() {
            return Err(format!("sample {i}: the loss mask is not the assistant's tokens").into());
        }
        let text = chat
            .tokenizer()
            .decode(&s.response_tokens)
            .unwrap_or_default();
        if text != s.response_text {
            return Err(
                format!("sample {i}: response text is not the decoding of its tokens").into(),
            );
        }
    }
    Ok(())
}

impl Stage for ReplayLayer {
    fn name(&self) -> &'static str {
        "replay_mismatch"
    }
    fn check(&self, input: &StageInput<'_>, checks: &mut Checks) -> Result<(), Rejection> {
        check_replay(
            self.env.as_ref(),
            &self.chat,
            self.budget,
            self.context,
            input.group,
        )
        .map_err(|d| d.reject(Rejection::ReplayMismatch))?;
        // Replaying recomputes every episode's return: the reward figures it feeds are verified.
        checks.rewards_recomputed = true;
        Ok(())
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;

/// The multi-turn mask rule: replays the episode (`rollout::episode::replay`) and takes its
/// assistant-token mask; a sample that does not replay has no mask (`Err`).
pub struct EpisodeMask {
    pub env: Arc<dyn Environment>,
    pub chat: Arc<Chat>,
    pub budget: Budget,
    pub context: usize,
    /// Masks already derived, by the content of the sample (the trainer asks for each one
    /// more than once; an external environment answers every replay by process round trips).
    pub derived: MaskCache,
}

/// Masks by a hash of what determines them (task, prompt id and tokens, response, reward);
/// bounded: cleared when full.
#[derive(Default)]
pub struct MaskCache(Mutex<HashMap<[u8; 32], Vec<u8>>>);

/// Entries a [`MaskCache`] holds before it is cleared.
const MASK_CACHE_ENTRIES: usize = 4096;

impl MaskCache {
    fn key(group: &TrajectoryGroup, s: &storage::Sample) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        for part in [group.task_id.as_bytes(), group.prompt_id.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for tokens in [&group.prompt_tokens, &s.response_tokens] {
            h.update(&(tokens.len() as u64).to_le_bytes());
            for t in tokens.iter() {
                h.update(&t.to_le_bytes());
            }
        }
        h.update(&s.reward.to_bits().to_le_bytes());
        *h.finalize().as_bytes()
    }
}

impl learner::MaskRule for EpisodeMask {
    fn name(&self) -> &'static str {
        "episode_assistant_tokens"
    }

    fn mask(&self, group: &TrajectoryGroup, sample: usize) -> Result<Vec<u8>, String> {
        let s = group
            .samples
            .get(sample)
            .ok_or_else(|| format!("no sample {sample}"))?;
        let seed = self
            .env
            .seed_of(&group.prompt_id)
            .ok_or_else(|| format!("{:?} is no initial state", group.prompt_id))?;
        let key = MaskCache::key(group, s);
        let cache = || self.derived.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mask) = cache().get(&key) {
            return Ok(mask.clone());
        }
        let spec = rollout::episode::Spec {
            env: self.env.as_ref(),
            chat: &self.chat,
            budget: self.budget,
            context: self.context,
        };
        let mask = rollout::episode::replay(
            spec,
            seed,
            &group.prompt_tokens,
            &s.response_tokens,
            s.reward,
        )
        .map(|p| p.mask())
        .map_err(|e| e.to_string())?;
        let mut c = cache();
        if c.len() >= MASK_CACHE_ENTRIES {
            c.clear();
        }
        c.insert(key, mask.clone());
        Ok(mask)
    }
}
