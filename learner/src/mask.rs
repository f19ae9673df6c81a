//! The learner owns the loss mask (`docs/security.md`, "Learner-owned loss masks").
//!
//! A worker used to send each sample's per-token loss mask, and the trainer used it as sent:
//! a worker choosing which of its (honest) tokens are trained steers the update as surely as
//! one that forges them. The learner therefore derives every mask from the tokens itself with
//! a [`MaskRule`]: the trainer trains on the derived mask only, and the learner's verification
//! refuses (with a strike) a group whose sent mask differs from it ([`check_masks`]).
//!
//! The mask also says which response tokens were *sampled*: those with mask 1, numbered in
//! order — their position among the sampled tokens is the position of their prescribed
//! uniform (`policy::draw`), and the spot check checks exactly those tokens against it.
//!
//! Owns: the rule trait, the single-turn rule ([`ResponseTokens`]) and the comparison. A
//! multi-turn environment supplies its own rule (assistant tokens 1, tokens the environment
//! inserted 0, derived by replaying the episode) through the same trait. Must not touch: the
//! objective (it only reads the mask) or the penalty (the caller strikes).

use storage::TrajectoryGroup;

/// Derives the loss mask of a sample from the group's tokens. Pure: the same group gives the
/// same masks, on the learner and on an honest worker.
pub trait MaskRule: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &'static str;

    /// The mask of sample `sample` of `group`: one 0/1 per response token. `Err` when the
    /// tokens cannot be a sample of this task (e.g. an episode that does not replay).
    fn mask(&self, group: &TrajectoryGroup, sample: usize) -> Result<Vec<u8>, String>;
}

/// The single-turn rule: every response token is sampled and trained.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseTokens;

impl MaskRule for ResponseTokens {
    fn name(&self) -> &'static str {
        "response_tokens"
    }

    fn mask(&self, group: &TrajectoryGroup, sample: usize) -> Result<Vec<u8>, String> {
        let s = group
            .samples
            .get(sample)
            .ok_or_else(|| format!("no sample {sample}"))?;
        Ok(vec![1; s.response_tokens.len()])
    }
}

/// Why a group's sent masks are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskMismatch {
    /// The sent mask of `sample` differs from the derived one, first at `token`.
    #[error("sample {sample}: the loss mask differs from the learner's at token {token} (sent {sent}, derived {derived})")]
    Differs {
        sample: usize,
        token: usize,
        sent: u8,
        derived: u8,
    },
    /// The sent mask of `sample` has another length than its response.
    #[error("sample {sample}: {sent} mask entries for {derived} response tokens")]
    Length {
        sample: usize,
        sent: usize,
        derived: usize,
    },
    /// The rule cannot derive a mask for these tokens.
    #[error("sample {sample}: {why}")]
    Underivable { sample: usize, why: String },
}

/// Checks every sample's sent mask against `rule`'s.
pub fn check_masks(rule: &dyn MaskRule, group: &TrajectoryGroup) -> Result<(), MaskMismatch> {
    for (i, s) in group.samples.iter().enumerate() {
        let derived = rule
            .mask(group, i)
            .map_err(|why| MaskMismatch::Underivable { sample: i, why })?;
        if derived.len() != s.loss_mask.len() {
            return Err(MaskMismatch::Length {
                sample: i,
                sent: s.loss_mask.len(),
                derived: derived.len(),
            });
        }
        if let Some(j) = (0..derived.len()).find(|&j| derived[j] != s.loss_mask[j]) {
            return Err(MaskMismatch::Differs {
                sample: i,
                token: j,
                sent: s.loss_mask[j],
                derived: derived[j],
            });
        }
    }
    Ok(())
}

/// The sampled positions of a derived mask: for each response token with mask 1, its index in
/// the response and its position among the sampled tokens (0, 1, 2, … in order).
pub fn sampled_positions(mask: &[u8]) -> impl Iterator<Item = (usize, u64)> + '_ {
    mask.iter()
        .enumerate()
        .filter(|(_, &m)| m != 0)
        .enumerate()
        .map(|(pos, (j, _))| (j, pos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::Sample;

    fn group(masks: &[Vec<u8>]) -> TrajectoryGroup {
        TrajectoryGroup {
            group_id: [0; 16],
            task_id: "arith".into(),
            prompt_id: "p".into(),
            version: 0,
            seq: 0,
            producer: "w".into(),
            prompt_text: String::new(),
            prompt_tokens: vec![1],
            created_unix_ms: 0,
            signature: None,
            samples: masks
                .iter()
                .map(|m| Sample {
                    trajectory_id: [0; 16],
                    response_tokens: vec![5; 3],
                    response_text: String::new(),
                    reward: 0.0,
                    sampler_logprobs: vec![-1.0; 3],
                    loss_mask: m.clone(),
                    finished_unix_ms: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn single_turn_masks_are_all_ones_and_anything_else_is_refused() {
        let rule = ResponseTokens;
        assert_eq!(
            check_masks(&rule, &group(&[vec![1; 3], vec![1; 3]])),
            Ok(())
        );
        assert_eq!(
            check_masks(&rule, &group(&[vec![1; 3], vec![1, 0, 1]])),
            Err(MaskMismatch::Differs {
                sample: 1,
                token: 1,
                sent: 0,
                derived: 1
            })
        );
        assert!(matches!(
            check_masks(&rule, &group(&[vec![1; 2]])),
            Err(MaskMismatch::Length {
                sample: 0,
                sent: 2,
                derived: 3
            })
        ));
        // A mask of 2s (the record codec refuses them) is a difference too.
        assert!(check_masks(&rule, &group(&[vec![1, 2, 1]])).is_err());
    }

    #[test]
    fn sampled_positions_count_only_masked_in_tokens() {
        let got: Vec<(usize, u64)> = sampled_positions(&[1, 1, 0, 0, 1, 0, 1]).collect();
        assert_eq!(got, [(0, 0), (1, 1), (4, 2), (6, 3)]);
    }
}
