//! Log-prob spot checks (`docs/security.md`, "Log-prob spot checks"): recompute the log-probs
//! of a pulled group's sampled tokens under the snapshot version the group claims, compare them
//! with the log-probs the worker reported, and choose which groups get this check.
//!
//! Owns: the recomputation ([`recompute_logprobs`], one batched teacher-forced forward of the
//! training model, no gradient), the comparison rule ([`compare`], [`SpotRule`]) and the
//! sampler of checked groups ([`SpotSampler`], [`selected_by_fraction`]).
//! Must not touch: where the claimed version's weights come from (the node's learner role
//! loads them from its chunk store), the network, or the penalty for a failed check (the
//! caller strikes the peer).
//!
//! ## Why the maximum, and the tolerance
//! A worker that forges log-probs steers the importance weights of the objective: raising the
//! reported `log q` of one token lowers the ratio `p/q` of that token (and of its sequence
//! under sequence-level objectives). A forgery on a *single* token must therefore fail, so the
//! rule compares the **maximum** absolute difference over all response tokens of the group
//! with a tolerance; a robust statistic (median, trimmed mean) would by design ignore a
//! one-token forgery. The maximum is only as good as the honest spread is small: on the CPU in
//! f32 the inference path with its KV cache and the learner's full-sequence forward agree to
//! ~1e-6 (measured: `examples/spot_check.rs`; figures in `docs/security.md`), so
//! [`DEFAULT_TOLERANCE`] = 1e-3 leaves a margin of two to three orders of magnitude against
//! honest f32 workers and still rejects a +0.05 forgery. Workers that sample in half precision
//! (bf16 on CUDA) have a much larger honest spread; a swarm with such workers must raise the
//! tolerance to the measured bf16 spread (see the doc section).

use std::collections::HashMap;

use candle_core::DType;
use policy::Policy;
use storage::TrajectoryGroup;

use crate::{LearnerError, Result};

/// Default tolerance on `max |reported − recomputed|` over a group's response tokens, for
/// workers that sample in f32 (see the module doc for the measurement behind it).
pub const DEFAULT_TOLERANCE: f32 = 1e-3;

/// Default fraction of pulled groups checked.
pub const DEFAULT_FRACTION: f64 = 0.05;

/// Default number of a new peer's first groups that are always checked.
pub const DEFAULT_FIRST_GROUPS: u32 = 4;

/// Producers whose group count [`SpotSampler`] remembers at most.
pub const MAX_TRACKED_PEERS: usize = 65_536;

fn invalid(msg: impl Into<String>) -> LearnerError {
    LearnerError::Invalid(msg.into())
}

/// Checks that `group` can be fed to a model of `vocab` tokens and `context` positions:
/// samples present, non-empty prompt and responses, token ids in the vocabulary, prompt +
/// response within the context, one reported log-prob per response token.
pub fn check_shape(group: &TrajectoryGroup, vocab: usize, context: usize) -> Result<()> {
    if group.samples.is_empty() {
        return Err(invalid("group without samples"));
    }
    if group.prompt_tokens.is_empty() {
        return Err(invalid("empty prompt"));
    }
    let out_of_vocab = |t: &[u32]| t.iter().copied().find(|&t| t as usize >= vocab);
    if let Some(t) = out_of_vocab(&group.prompt_tokens) {
        return Err(invalid(format!(
            "prompt token {t} ≥ vocabulary size {vocab}"
        )));
    }
    for (i, s) in group.samples.iter().enumerate() {
        let n = s.response_tokens.len();
        if n == 0 {
            return Err(invalid(format!("sample {i}: empty response")));
        }
        if let Some(t) = out_of_vocab(&s.response_tokens) {
            return Err(invalid(format!(
                "sample {i}: response token {t} ≥ vocabulary size {vocab}"
            )));
        }
        if group.prompt_tokens.len().saturating_add(n) > context {
            return Err(invalid(format!(
                "sample {i}: {} prompt + response tokens > context {context}",
                group.prompt_tokens.len() + n
            )));
        }
        if s.sampler_logprobs.len() != n {
            return Err(invalid(format!(
                "sample {i}: {} log-probs for {n} response tokens",
                s.sampler_logprobs.len()
            )));
        }
    }
    Ok(())
}

/// The log-prob of every sampled response token of `group` under `policy` at `temperature`
/// (the rollout's log-prob temperature): one teacher-forced, right-padded forward over all the
/// group's samples ([`policy::batch_response_logprobs`], the trainer's own computation), on
/// the policy's no-grad view (no op graph is recorded). Entry `[i][j]` aligns with `group.samples[i].sampler_logprobs[j]`.
///
/// A group the model cannot take (see [`check_shape`]) is an [`LearnerError::Invalid`], never a
/// panic.
pub fn recompute_logprobs(
    policy: &Policy,
    group: &TrajectoryGroup,
    temperature: f32,
) -> Result<Vec<Vec<f32>>> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(invalid(format!(
            "temperature must be > 0, got {temperature}"
        )));
    }
    let cfg = policy.config();
    check_shape(group, cfg.vocab_size, cfg.max_position_embeddings)?;
    let pairs: Vec<(&[u32], &[u32])> = group
        .samples
        .iter()
        .map(|s| (group.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
        .collect();
    let (lp, _mask) = policy::batch_response_logprobs(&policy.no_grad()?, &pairs, temperature)?;
    let rows = lp.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(rows
        .into_iter()
        .zip(&group.samples)
        .map(|(mut row, s)| {
            row.truncate(s.response_tokens.len());
            row
        })
        .collect())
}

/// How far a group's reported log-probs are from the recomputed ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotReport {
    /// `max |reported − recomputed|` over all response tokens (+∞ when a reported value is not
    /// finite).
    pub max_abs_diff: f32,
    /// Sample and token index of that maximum.
    pub worst_sample: usize,
    pub worst_token: usize,
    /// Mean absolute difference over all tokens (for logs and measurements only).
    pub mean_abs_diff: f32,
    /// Response tokens compared.
    pub tokens: usize,
}

/// Compares `group`'s reported log-probs with `recomputed` (from [`recompute_logprobs`]);
/// an error when the shapes differ.
pub fn compare(group: &TrajectoryGroup, recomputed: &[Vec<f32>]) -> Result<SpotReport> {
    if recomputed.len() != group.samples.len() {
        return Err(invalid(format!(
            "{} recomputed rows for {} samples",
            recomputed.len(),
            group.samples.len()
        )));
    }
    let mut r = SpotReport {
        max_abs_diff: 0.0,
        worst_sample: 0,
        worst_token: 0,
        mean_abs_diff: 0.0,
        tokens: 0,
    };
    let mut sum = 0f64;
    for (i, (s, row)) in group.samples.iter().zip(recomputed).enumerate() {
        if row.len() != s.sampler_logprobs.len() {
            return Err(invalid(format!(
                "sample {i}: {} recomputed log-probs for {} reported",
                row.len(),
                s.sampler_logprobs.len()
            )));
        }
        for (j, (&q, &p)) in s.sampler_logprobs.iter().zip(row).enumerate() {
            // Only sampled tokens have a sampler log-prob: a multi-turn episode's observation
            // tokens (loss mask 0) were not sampled.
            if s.loss_mask.get(j) == Some(&0) {
                continue;
            }
            let d = (q - p).abs();
            // NaN compares false: map it to +∞ so that it is the worst, never ignored.
            let d = if d.is_finite() { d } else { f32::INFINITY };
            sum += f64::from(d);
            r.tokens += 1;
            if d > r.max_abs_diff {
                r.max_abs_diff = d;
                r.worst_sample = i;
                r.worst_token = j;
            }
        }
    }
    if r.tokens > 0 {
        r.mean_abs_diff = (sum / r.tokens as f64) as f32;
    }
    Ok(r)
}

/// The pass/fail rule: a group passes when `max |reported − recomputed| ≤ tolerance`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpotRule {
    pub tolerance: f32,
}

impl Default for SpotRule {
    fn default() -> Self {
        SpotRule {
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

impl SpotRule {
    /// A rule with `tolerance` (finite, > 0).
    pub fn new(tolerance: f32) -> Result<Self> {
        if !(tolerance.is_finite() && tolerance > 0.0) {
            return Err(invalid(format!(
                "spot-check tolerance must be finite and > 0, got {tolerance}"
            )));
        }
        Ok(SpotRule { tolerance })
    }

    /// Whether `report` passes.
    pub fn passes(&self, report: &SpotReport) -> bool {
        report.max_abs_diff <= self.tolerance
    }

    /// Recomputes, compares and judges `group` under `policy`: `Ok((report, passed))`, or an
    /// error when the group does not fit the model.
    pub fn check(
        &self,
        policy: &Policy,
        group: &TrajectoryGroup,
        temperature: f32,
    ) -> Result<(SpotReport, bool)> {
        let recomputed = recompute_logprobs(policy, group, temperature)?;
        let report = compare(group, &recomputed)?;
        Ok((report, self.passes(&report)))
    }
}

/// Why a group is (not) spot-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// One of its producer's first groups.
    FirstGroups,
    /// Drawn by the fraction.
    Sampled,
    /// Not checked.
    Skip,
}

impl Selection {
    pub fn is_checked(self) -> bool {
        self != Selection::Skip
    }
}

/// Whether the group `group_id` is drawn, with probability `fraction`, under the secret `key`:
/// the first 8 bytes of BLAKE3-keyed(`key`, id) as a uniform `u64` below `fraction · 2⁶⁴`.
/// Deterministic per (id, key), so a group pulled twice is judged the same way; the key must
/// stay secret to the learner (a random one per run), or a worker could grind group ids that
/// are never drawn.
pub fn selected_by_fraction(group_id: &[u8; 16], key: &[u8; 32], fraction: f64) -> bool {
    if fraction <= 0.0 || fraction.is_nan() {
        return false;
    }
    if fraction >= 1.0 {
        return true;
    }
    let h = blake3::keyed_hash(key, group_id);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    let u = u64::from_le_bytes(b) as f64 / 18_446_744_073_709_551_616.0; // 2⁶⁴
    u < fraction
}

/// Chooses the groups to spot-check: every one of a producer's first `first_groups` groups,
/// and otherwise a `fraction` of groups drawn by [`selected_by_fraction`].
///
/// The per-producer counts are bounded by [`MAX_TRACKED_PEERS`]: when the map is full it is
/// cleared, which makes every producer "new" again — more checks, never fewer (a fresh peer id
/// costs an attacker nothing, so forgetting must not exempt anyone).
#[derive(Debug, Clone)]
pub struct SpotSampler {
    fraction: f64,
    first_groups: u32,
    key: [u8; 32],
    seen: HashMap<String, u32>,
    cap: usize,
}

impl SpotSampler {
    /// A sampler with `fraction` in [0, 1] and the secret `key`.
    pub fn new(fraction: f64, first_groups: u32, key: [u8; 32]) -> Result<Self> {
        Self::with_cap(fraction, first_groups, key, MAX_TRACKED_PEERS)
    }

    /// [`SpotSampler::new`] remembering at most `cap` (≥ 1) producers.
    pub fn with_cap(fraction: f64, first_groups: u32, key: [u8; 32], cap: usize) -> Result<Self> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(invalid(format!(
                "spot-check fraction must be in [0, 1], got {fraction}"
            )));
        }
        Ok(SpotSampler {
            fraction,
            first_groups,
            key,
            seen: HashMap::new(),
            cap: cap.max(1),
        })
    }

    /// Decides for the next group `group_id` of `producer` (and counts it).
    pub fn select(&mut self, producer: &str, group_id: &[u8; 16]) -> Selection {
        let count = match self.seen.get_mut(producer) {
            Some(c) => c,
            None => {
                if self.seen.len() >= self.cap {
                    self.seen.clear();
                }
                self.seen.entry(producer.to_string()).or_insert(0)
            }
        };
        let earlier = *count;
        *count = count.saturating_add(1);
        if earlier < self.first_groups {
            Selection::FirstGroups
        } else if selected_by_fraction(group_id, &self.key, self.fraction) {
            Selection::Sampled
        } else {
            Selection::Skip
        }
    }

    /// Producers currently remembered.
    pub fn tracked(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
#[path = "spot_check_tests.rs"]
mod tests;
