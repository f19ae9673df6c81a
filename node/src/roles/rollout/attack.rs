//! Test-only attacks on the groups a worker produces (built only with the `adversary`
//! feature): which attacks exist, when a `late_liar` or `sybil_rekey` worker starts lying,
//! how a finished group is corrupted, and the seal hook that does it before signing.

use crate::misbehave::Attack;
use storage::TrajectoryGroup;

use crate::state::NodeState;

/// The attacks carried out on the groups a worker produces.
pub const GROUP_ATTACKS: [Attack; 14] = [
    Attack::InflatedReward,
    Attack::ForgedLogprobs,
    Attack::InvalidLogprob,
    Attack::OutOfVocab,
    Attack::Overlong,
    Attack::BadSignature,
    Attack::LateLiar,
    Attack::SybilRekey,
    Attack::MaskPoisoning,
    Attack::ForcedTokens,
    Attack::StaleVersion,
    Attack::ForgedReturn,
    Attack::ForgedObservation,
    Attack::FalseDtype,
];

/// The group attacks that need the model ([`super::forge`]).
const MODEL_ATTACKS: [Attack; 3] = [
    Attack::ForcedTokens,
    Attack::StaleVersion,
    Attack::FalseDtype,
];

/// Whether a group contains an exact answer (a sample of full reward): what a
/// `withhold_by_reward` worker never sends.
pub fn has_exact_answer(g: &TrajectoryGroup) -> bool {
    g.samples.iter().any(|s| s.reward >= 1.0)
}

/// Whether group `seq` of a worker carrying out `attack` is tampered with: always, except
/// for the honest prefix of `late_liar` and `sybil_rekey` (which then forge log-probs).
pub fn forges(attack: Attack, seq: u64) -> bool {
    use crate::misbehave::{LATE_LIAR_HONEST_GROUPS, SYBIL_HONEST_GROUPS};
    match attack {
        Attack::LateLiar => seq >= LATE_LIAR_HONEST_GROUPS,
        Attack::SybilRekey => seq >= SYBIL_HONEST_GROUPS,
        _ => true,
    }
}

/// Corrupts a finished group with `attack` (test only); `vocab` and `context` are the model's.
/// Log-prob, token and length changes keep the group schema-valid (it must be stored and
/// served): only the learner's own checks can refuse it.
pub fn tamper(attack: Attack, g: &mut TrajectoryGroup, vocab: usize, context: usize) {
    // Some attacks need a token to work on.
    if g.samples[0].response_tokens.is_empty() {
        let s = &mut g.samples[0];
        s.response_tokens.push(32);
        s.sampler_logprobs.push(-1.0);
        s.loss_mask.push(1);
    }
    match attack {
        Attack::InflatedReward => g.samples.iter_mut().for_each(|s| s.reward = 1.0),
        Attack::ForgedLogprobs | Attack::LateLiar | Attack::SybilRekey => {
            g.samples.iter_mut().for_each(|s| {
                s.sampler_logprobs
                    .iter_mut()
                    .for_each(|lp| *lp = (*lp + 0.5).min(0.0))
            })
        }
        Attack::InvalidLogprob => g.samples[0].sampler_logprobs[0] = -1e4,
        // Honest tokens, log-probs and rewards: only which tokens are trained is chosen.
        Attack::MaskPoisoning => g.samples.iter_mut().for_each(|s| {
            s.loss_mask.iter_mut().step_by(2).for_each(|m| *m = 0);
        }),
        Attack::OutOfVocab => {
            let s = &mut g.samples[0];
            let last = s.response_tokens.len() - 1;
            s.response_tokens[last] = u32::try_from(vocab).unwrap_or(u32::MAX);
        }
        Attack::ForgedReturn => g.samples[0].reward += 1.0,
        // The first observation token (loss mask 0) of an episode becomes another token of
        // the same observation: the story the environment told is changed. A group without
        // observations (one-turn episodes) gets a forged return instead.
        Attack::ForgedObservation => {
            let forged = g.samples.iter_mut().any(|s| {
                let obs: Vec<usize> = (0..s.loss_mask.len())
                    .filter(|&i| s.loss_mask[i] == 0)
                    .collect();
                let first = obs.first().copied();
                let other = obs
                    .iter()
                    .copied()
                    .find(|&i| Some(s.response_tokens[i]) != first.map(|f| s.response_tokens[f]));
                match (first, other) {
                    (Some(f), Some(o)) => {
                        s.response_tokens.swap(f, o);
                        true
                    }
                    _ => false,
                }
            });
            if !forged {
                g.samples[0].reward += 1.0;
            }
        }
        Attack::Overlong => {
            let s = &mut g.samples[0];
            let want = (context + 1).saturating_sub(g.prompt_tokens.len());
            while s.response_tokens.len() < want {
                s.response_tokens.push(32);
                s.sampler_logprobs.push(-1.0);
                s.loss_mask.push(1);
            }
        }
        _ => {}
    }
}

/// The seal hook of a misbehaving worker: tamper with group `seq` by attack `seq mod k` (when
/// [`forges`] says so, the model-aware ones through `forger`; the id goes to `forged_file`),
/// then sign it (with a fresh key for `bad_signature`, with the node key otherwise: the lie is
/// the worker's own).
fn attack_hook(
    attacks: Vec<Attack>,
    vocab: usize,
    context: usize,
    mut forger: Option<crate::roles::forge::Forger>,
    forged_file: std::path::PathBuf,
) -> rollout::SealHook {
    Box::new(move |g, key| {
        let attack = attacks[(g.seq % attacks.len() as u64) as usize];
        let mut forged = forges(attack, g.seq);
        if forged {
            match forger.as_mut().filter(|_| MODEL_ATTACKS.contains(&attack)) {
                Some(f) => match f.forge(attack, g) {
                    Ok(true) => {}
                    Ok(false) => return g.sign(key.signing_key()), // honest this once
                    Err(e) => {
                        tracing::warn!(%attack, error = %format!("{e:#}"), "forging failed");
                        forged = false;
                    }
                },
                None => tamper(attack, g, vocab, context),
            }
        }
        if attack == Attack::BadSignature {
            g.sign(storage::NodeKey::generate().signing_key());
        } else {
            g.sign(key.signing_key());
        }
        if forged {
            use std::io::Write;
            let line = format!("{}\n", hex::encode(g.group_id));
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&forged_file)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            tracing::warn!(%attack, seq = g.seq, "TEST-ONLY: stored a corrupted group");
        }
    })
}

/// The seal hook of a worker started with group attacks in `ECHO_NODE_MISBEHAVE`, or `None`
/// for an honest one. The model-aware forgeries (`MODEL_ATTACKS`) get a [`Forger`] over the
/// worker's own policy slot; they are of single-turn groups, so a multi-turn environment
/// gets the model-free `tamper` instead.
///
/// [`Forger`]: crate::roles::forge::Forger
pub(super) fn seal_hook(
    state: &NodeState,
    model: &policy::ModelConfig,
    slot: &rollout::PolicySlot,
    env: &dyn tasks::env::Environment,
    sampling: &policy::SamplingParams,
    tokenizer: &policy::Tokenizer,
    assignment_seed: [u8; 32],
) -> Option<rollout::SealHook> {
    let attacks: Vec<Attack> = GROUP_ATTACKS
        .into_iter()
        .filter(|a| state.misbehave.has(*a))
        .collect();
    if attacks.is_empty() {
        return None;
    }
    let forger = MODEL_ATTACKS
        .iter()
        .any(|a| state.misbehave.has(*a))
        .then_some(())
        .and(env.as_task().cloned())
        .map(|task| {
            let mut params = sampling.clone();
            params.stop_tokens = tokenizer.eos_ids();
            crate::roles::forge::Forger::new(
                slot.clone(),
                task,
                tokenizer.clone(),
                assignment_seed,
                params,
            )
        });
    let forged_file = state.config.data_dir.join(crate::misbehave::FORGED_FILE);
    Some(attack_hook(
        attacks,
        model.vocab_size,
        model.max_position_embeddings,
        forger,
        forged_file,
    ))
}
