//! The spot check's verdict on one group (`docs/security.md`, "Checkable sampling"): in the one
//! teacher-forced forward the log-prob spot check already runs, the learner checks both that
//! each reported log-prob matches its own (within a tolerance) and that each sampled token is
//! the one the canonical rule (`policy::rule`) draws for the uniform the learner prescribed
//! (`policy::draw`), within a margin δ.
//!
//! The verdict distinguishes three outcomes, because they call for different responses:
//! - [`SpotVerdict::Pass`]: every sampled token is the rule's draw and its log-prob within
//!   the tolerance (the drift within tolerance is in the [`CheckReport`]);
//! - [`SpotVerdict::LogprobDrift`]: every token is the rule's draw, but a reported log-prob is
//!   beyond the tolerance — forged log-probs, or a sampler whose numeric spread is larger than
//!   its declared dtype's (a strike, not proof);
//! - [`SpotVerdict::NotDrawn`]: a token the rule would not have drawn from its uniform even
//!   with the margin — a written response, or one sampled from another version than claimed.
//!   No honest sampler produces it (the margin covers the measured numeric spread): proof.
//!
//! Owns: the pure comparison of one group against one forward. Must not touch: which groups
//! are checked, where the weights come from, the penalty (the node's learner role).

use candle_core::{DType, Tensor};
use policy::draw::SampleStream;
use policy::rule::{token_windows, Margins, RuleParams, TokenWindow};
use policy::Policy;
use storage::TrajectoryGroup;

use crate::mask::{sampled_positions, MaskRule};
use crate::spot_check::{check_shape, SpotReport};
use crate::{LearnerError, Result};

/// The dtype a worker samples in (its heartbeat's `device.dtype`): the honest numeric spread,
/// and so the tolerance and margin its groups are judged with, depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerDtype {
    F32,
    F16,
    Bf16,
}

impl WorkerDtype {
    /// `f32`, `f16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            WorkerDtype::F32 => "f32",
            WorkerDtype::F16 => "f16",
            WorkerDtype::Bf16 => "bf16",
        }
    }

    /// The dtype a name denotes.
    pub fn parse(name: &str) -> Option<Self> {
        [WorkerDtype::F32, WorkerDtype::F16, WorkerDtype::Bf16]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// One value per [`WorkerDtype`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ByDtype<T> {
    pub f32: T,
    pub f16: T,
    pub bf16: T,
}

impl<T: Copy> ByDtype<T> {
    pub fn of(&self, d: WorkerDtype) -> T {
        match d {
            WorkerDtype::F32 => self.f32,
            WorkerDtype::F16 => self.f16,
            WorkerDtype::Bf16 => self.bf16,
        }
    }
}

/// Default log-prob tolerances (`docs/security.md`, "Checkable sampling", has the measured
/// spreads): f32 about 100× its largest honest |Δ| (9.1e-6 on 413k tokens), f16 3× its
/// (0.066: 0.05 struck 3 honest groups in 10,000); bf16 is not measured here (candle's CPU
/// backend has no bf16 matmul) and takes 8× the f16 spread (three fewer mantissa bits) with
/// the same 2× headroom, until a GPU measurement replaces it.
pub const DEFAULT_TOLERANCE: ByDtype<f32> = ByDtype {
    f32: 1e-3,
    f16: 0.2,
    bf16: 1.0,
};

/// Default margins δ of the draw check: f32 500× its largest honest cumulative-probability
/// spread (2.0e-6), f16 3× its (0.0165), bf16 8× the f16 spread with 2× headroom (not measured
/// here, see [`DEFAULT_TOLERANCE`]).
pub const DEFAULT_MARGIN: ByDtype<f64> = ByDtype {
    f32: 1e-3,
    f16: 0.05,
    bf16: 0.25,
};

/// What the check needs besides the group and the weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckSettings {
    /// The rule the workers sample with (`learner.temperature`, `learner.top_p`).
    pub rule: RuleParams,
    /// Bound on `|reported − recomputed|` log-prob (per worker dtype); also the relative
    /// per-token probability margin of the draw check.
    pub tolerance: f32,
    /// Margin δ on cumulative probabilities (per worker dtype).
    pub delta: f64,
    /// The run's assignment seed: the uniforms derive from it.
    pub seed: [u8; 32],
    /// Check the draws (false: log-probs only, for samplers that do not follow the rule).
    pub check_draws: bool,
}

/// One sampled token's draw, as the learner sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawFinding {
    pub sample: usize,
    /// Index in the response.
    pub token: usize,
    /// Position among the sample's sampled tokens (the uniform's position).
    pub position: u64,
    pub token_id: u32,
    pub uniform: f64,
    pub window: TokenWindow,
    /// How far the uniform lies outside the window (0 inside, +∞ outside every nucleus).
    pub excess: f64,
}

/// What one check found.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// Reported against recomputed log-probs of the sampled tokens.
    pub logprobs: SpotReport,
    /// Sampled tokens whose draw was checked.
    pub draws_checked: usize,
    /// Of those, outside their window.
    pub not_drawn: usize,
    /// The token with the largest excess (the first of them on ties), if any was checked.
    pub worst_draw: Option<DrawFinding>,
    /// Drawn tokens the margins admit that the exact window (no margin) does not: the rate
    /// of these is the worker's band rate (`control::admission::MarginEvidence`).
    pub in_band: usize,
    /// Drawn tokens the claimed dtype's margins admit but the margins the worker earned do not
    /// ([`check_group_earned`]; 0 when judged at the claimed margins).
    pub outside_earned: usize,
}

/// The outcomes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpotVerdict {
    Pass,
    LogprobDrift,
    NotDrawn,
    /// Every token is within the claimed dtype's margins, but some only with margins the
    /// worker has not earned (`control::admission::earned_margin`): not proof, and not
    /// trained.
    MarginUnearned,
}

impl CheckReport {
    /// The verdict under `tolerance`: a token not drawn outranks any log-prob drift.
    pub fn verdict(&self, tolerance: f32) -> SpotVerdict {
        if self.not_drawn > 0 {
            SpotVerdict::NotDrawn
        } else if self.logprobs.max_abs_diff > tolerance {
            SpotVerdict::LogprobDrift
        } else if self.outside_earned > 0 {
            SpotVerdict::MarginUnearned
        } else {
            SpotVerdict::Pass
        }
    }
}

/// Recomputes `group` under `policy` (one teacher-forced forward of all its samples, no
/// gradient) and checks every sampled token (mask 1 under `masks`) for log-prob drift and,
/// with `settings.check_draws`, for being the rule's draw from its prescribed uniform. A group
/// the model cannot take is [`LearnerError::Invalid`], never a panic.
pub fn check_group(
    policy: &Policy,
    group: &TrajectoryGroup,
    settings: &CheckSettings,
    masks: &dyn MaskRule,
) -> Result<CheckReport> {
    check_group_earned(policy, group, settings, None, masks)
}

/// [`check_group`], with each drawn token also judged against the margins the worker earned
/// (`earned`: its tolerance and δ given this group's largest log-prob spread, each at most
/// the claimed one of `settings`): a token inside
/// the claimed margins but outside the earned ones counts in
/// [`CheckReport::outside_earned`].
pub fn check_group_earned(
    policy: &Policy,
    group: &TrajectoryGroup,
    settings: &CheckSettings,
    earned: Option<&dyn Fn(f32) -> (f32, f64)>,
    masks: &dyn MaskRule,
) -> Result<CheckReport> {
    let cfg = policy.config();
    check_shape(group, cfg.vocab_size, cfg.max_position_embeddings)?;
    let t = settings.rule.temperature;
    let logprob_t = if t > 0.0 { t } else { 1.0 };
    let pairs: Vec<(&[u32], &[u32])> = group
        .samples
        .iter()
        .map(|s| (group.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
        .collect();
    let logits = policy::batch_response_logits(policy, &pairs)?; // per sample [len, V]
    let mut drift = DriftAcc::default();
    let (mut rows, mut targets, mut at) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (s, l)) in group.samples.iter().zip(&logits).enumerate() {
        let mask = masks
            .mask(group, i)
            .map_err(|e| LearnerError::Invalid(format!("sample {i}: {e}")))?;
        let sampled: Vec<(usize, u64)> = sampled_positions(&mask).collect();
        if sampled.is_empty() {
            continue;
        }
        let idx: Vec<u32> = sampled.iter().map(|&(j, _)| j as u32).collect();
        let idx = Tensor::new(idx.as_slice(), l.device())?;
        let chosen = l.index_select(&idx, 0)?; // [k, V]
        let tok: Vec<u32> = sampled.iter().map(|&(j, _)| s.response_tokens[j]).collect();
        let lp = policy::token_logprobs(
            &chosen.unsqueeze(0)?,
            &Tensor::new(tok.as_slice(), l.device())?.unsqueeze(0)?,
            logprob_t,
        )?
        .squeeze(0)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
        for (&(j, _), recomputed) in sampled.iter().zip(lp) {
            drift.add(i, j, s.sampler_logprobs[j], recomputed);
        }
        if settings.check_draws {
            let stream =
                SampleStream::prescribed(&settings.seed, &group.producer, group.seq, i as u64);
            for (&(j, pos), &id) in sampled.iter().zip(&tok) {
                at.push((i, j, pos, id, stream.uniform(pos)));
            }
            rows.push(chosen);
            targets.extend(tok);
        }
    }
    let mut report = CheckReport {
        logprobs: drift.report(),
        draws_checked: at.len(),
        not_drawn: 0,
        worst_draw: None,
        in_band: 0,
        outside_earned: 0,
    };
    if at.is_empty() {
        return Ok(report);
    }
    let margins = Margins::new(settings.tolerance, settings.delta);
    let all = Tensor::cat(&rows, 0)?;
    let windows = token_windows(&all, &targets, settings.rule, margins)?;
    let exact = token_windows(&all, &targets, settings.rule, Margins::new(0.0, 0.0))?;
    // The earned margins may depend on this group's own spread.
    let earned = match earned.map(|f| f(report.logprobs.max_abs_diff)) {
        Some((t, d)) => Some(token_windows(
            &all,
            &targets,
            settings.rule,
            Margins::new(t.min(settings.tolerance), d.min(settings.delta)),
        )?),
        None => None,
    };
    for (i, ((sample, token, position, token_id, uniform), window)) in
        at.into_iter().zip(windows).enumerate()
    {
        let excess = window.excess(uniform);
        report.not_drawn += usize::from(excess > 0.0);
        if excess == 0.0 {
            report.in_band += usize::from(!exact[i].admits(uniform));
            if let Some(e) = &earned {
                report.outside_earned += usize::from(!e[i].admits(uniform));
            }
        }
        if report.worst_draw.is_none_or(|w| excess > w.excess) {
            report.worst_draw = Some(DrawFinding {
                sample,
                token,
                position,
                token_id,
                uniform,
                window,
                excess,
            });
        }
    }
    Ok(report)
}

/// Max and mean of `|reported − recomputed|` over the sampled tokens (non-finite counts as +∞).
#[derive(Default)]
struct DriftAcc {
    report: Option<SpotReport>,
    sum: f64,
}

impl DriftAcc {
    fn add(&mut self, sample: usize, token: usize, reported: f32, recomputed: f32) {
        let d = (reported - recomputed).abs();
        let d = if d.is_finite() { d } else { f32::INFINITY };
        self.sum += f64::from(d);
        let r = self.report.get_or_insert(SpotReport {
            max_abs_diff: -1.0,
            worst_sample: 0,
            worst_token: 0,
            mean_abs_diff: 0.0,
            tokens: 0,
        });
        r.tokens += 1;
        if d > r.max_abs_diff {
            (r.max_abs_diff, r.worst_sample, r.worst_token) = (d, sample, token);
        }
    }

    fn report(self) -> SpotReport {
        let mut r = self.report.unwrap_or(SpotReport {
            max_abs_diff: 0.0,
            worst_sample: 0,
            worst_token: 0,
            mean_abs_diff: 0.0,
            tokens: 0,
        });
        r.max_abs_diff = r.max_abs_diff.max(0.0);
        if r.tokens > 0 {
            r.mean_abs_diff = (self.sum / r.tokens as f64) as f32;
        }
        r
    }
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
