//! RL objectives for one group of G sampled responses to one prompt: GRPO, Dr.GRPO, GSPO and
//! GEPO, as pure tensor functions with candle autograd.
//!
//! Notation (per group): `p_{i,t}` = π_θ(y_t^i | x, y^i_{<t}) under the learner's current
//! weights (carries the gradient), `q_{i,t}` the same under the sampler that generated the
//! data (a constant), `A_i` the group-normalised advantage, `m_{i,t}` the loss mask and
//! `|y_i| = Σ_t m_{i,t}`.
//!
//! All four share the clipped surrogate `ℓ_{i,t} = −min(c·A_i, clip(c, 1−ε, 1+ε)·A_i)` and
//! differ only in the importance coefficient `c` (GEPO paper, Listing 1):
//! - GRPO / Dr.GRPO, token level: `c_{i,t} = p_{i,t} / q_{i,t}`;
//! - GSPO, sequence level: `c_i = p_i / q_i` with the length-normalised sequence probability
//!   `p_i = (Π_t p_{i,t})^{1/|y_i|}` (GEPO eq. 35), i.e. the geometric-mean token ratio;
//! - GEPO, group level: `c_i = p_i / Ê_q[q]`, `Ê_q[q] = Σ_j q_j² / Σ_j q_j` (GEPO eq. 2),
//!   optionally with defensive sampling (GEPO App. F eq. 37):
//!   `c_i = p_i / (ε·sg(p_i) + (1−ε)·Ê_q[q])`. Note `c_i ≠ 1` on-policy unless every `q_j` is
//!   equal.
//!
//! Aggregation: GRPO, GSPO and GEPO average `ℓ` over each sequence's tokens, then over the
//! group; Dr.GRPO (Liu et al. 2025) removes the length normalisation and divides the token sum
//! by the constant `G·T` (T = padded length), and its advantages are not divided by the
//! group's standard deviation. An optional KL penalty `β·KL(π_θ‖π_ref)` uses the k3 estimator
//! `exp(r − p) − (r − p) − 1` per token (log-space, `r` = reference log-prob).
//!
//! Optional truncated importance ratio (ECHO-2 App. F.5.3 eq. 24, cap `C` =
//! [`LossConfig::is_cap`]): `𝒥(θ) = 𝔼_{a∼π_sampler}[min(π_learner(a, θ_old) / π_sampler(a,
//! θ_old), C) · 𝒥̄(θ)]`. The truncated ratio is evaluated at θ_old, so it is a constant (no
//! gradient flows through the `min`), while `𝒥̄` keeps the θ-dependence through
//! `ρ = π_θ / π_θold`. The learner makes one optimiser update per batch, so π_learner(θ_old) is
//! the learner's probability under the weights the step starts from, i.e. `sg(p)`, and each
//! coefficient factors as `c = sg(c) · ρ` with `ρ = c / sg(c)` (value 1, gradient `∇ log c`).
//! The cap truncates the constant factor:
//!
//! `c̃ = min(sg(c), C) · ρ`, computed as `min(sg(c), C) · exp(log c − sg(log c))`,
//!
//! so `c̃ = c` (value and gradient) wherever `c ≤ C`, and `c̃ = C` with gradient
//! `C · ∇ log c` (bounded, but not zero) wherever `c > C`. `c̃` then replaces `c` in the clipped
//! surrogate above (the clip still applies to it). The truncated quantity is the objective's own
//! coefficient: the token ratio `p_{i,t}/q_{i,t}` (GRPO, Dr.GRPO, per token), the geometric-mean
//! sequence ratio `p_i/q_i` (GSPO, per sequence) and the group-expectation weight
//! `p_i/Ê_q[q]` or its defensive form (GEPO, per sequence).

use candle_core::{DType, Tensor};

use crate::{LearnerError, Result};

/// Which objective to optimise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    Grpo,
    #[serde(alias = "dr-grpo")]
    DrGrpo,
    Gspo,
    Gepo,
}

impl Objective {
    /// The config / command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Grpo => "grpo",
            Objective::DrGrpo => "dr_grpo",
            Objective::Gspo => "gspo",
            Objective::Gepo => "gepo",
        }
    }

    /// Dr.GRPO does not scale advantages by the group's standard deviation.
    pub fn scales_advantages_by_std(self) -> bool {
        self != Objective::DrGrpo
    }
}

impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Objective {
    type Err = LearnerError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "grpo" => Ok(Objective::Grpo),
            "dr_grpo" | "dr-grpo" => Ok(Objective::DrGrpo),
            "gspo" => Ok(Objective::Gspo),
            "gepo" => Ok(Objective::Gepo),
            _ => Err(LearnerError::Invalid(format!(
                "unknown objective `{s}` (expected grpo, dr_grpo, gspo or gepo)"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossConfig {
    pub objective: Objective,
    /// Clip range ε of the surrogate: the coefficient is clipped to `[1−ε, 1+ε]`.
    pub clip_eps: f64,
    /// GEPO's defensive-sampling ε (App. F eq. 37); `None` is plain GEPO. Ignored otherwise.
    pub gepo_defensive_eps: Option<f64>,
    /// Weight β of the KL penalty to the reference policy (0 = off).
    pub kl_beta: f64,
    /// Cap C of the truncated importance ratio, ECHO-2 eq. 24:
    /// `𝒥(θ) = 𝔼[min(π_learner(θ_old)/π_sampler(θ_old), C) · 𝒥̄(θ)]`, with the truncated ratio
    /// a constant (evaluated at θ_old, no gradient through the `min`). Applied to each
    /// objective's importance coefficient `c` as `c̃ = min(sg(c), C) · c/sg(c)`: the token ratio
    /// `p_{i,t}/q_{i,t}` for GRPO and Dr.GRPO, the sequence ratio `p_i/q_i` for GSPO, the
    /// group-expectation weight `p_i/Ê_q[q]` (or its defensive form) for GEPO; see the module
    /// docs. `None` (the default, also for checkpoints written before this field existed) =
    /// no truncation. Must be finite and > 0.
    #[serde(default)]
    pub is_cap: Option<f64>,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            objective: Objective::Gepo,
            clip_eps: 0.2,
            gepo_defensive_eps: None,
            kl_beta: 0.0,
            is_cap: None,
        }
    }
}

/// Group-normalised advantages: `A_i = (r_i − mean) / (std + 1e-4)` with the unbiased sample
/// standard deviation (as TRL's GRPO), or `A_i = r_i − mean` when `scale_by_std` is false
/// (Dr.GRPO). A group whose rewards are all equal carries no learning signal: its advantages
/// are exactly zero (see [`is_zero_advantage`]) and the learner drops and counts it
/// (zero-advantage groups carry no signal; `docs/learner.md`).
pub fn group_advantages(rewards: &[f32], scale_by_std: bool) -> Vec<f32> {
    let n = rewards.len();
    if n == 0 {
        return Vec::new();
    }
    let (lo, hi) = rewards
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), r| {
            (lo.min(*r), hi.max(*r))
        });
    if hi - lo <= 1e-6 {
        return vec![0.0; n];
    }
    let mean = rewards.iter().map(|r| f64::from(*r)).sum::<f64>() / n as f64;
    let centred = rewards.iter().map(|r| f64::from(*r) - mean);
    if !scale_by_std {
        return centred.map(|a| a as f32).collect();
    }
    let var = rewards
        .iter()
        .map(|r| (f64::from(*r) - mean).powi(2))
        .sum::<f64>()
        / (n as f64 - 1.0).max(1.0);
    let std = var.sqrt();
    centred.map(|a| (a / (std + 1e-4)) as f32).collect()
}

/// True when a group's advantages are all zero (no learning signal).
pub fn is_zero_advantage(advantages: &[f32]) -> bool {
    advantages.iter().all(|a| *a == 0.0)
}

/// One group's tensors, all `[G, T]` except `advantages` (`[G]`). Padding positions must have
/// mask 0 and finite log-probs (0 is fine).
pub struct GroupInput<'a> {
    /// Learner log-probs of the sampled tokens under the current weights (with gradient).
    pub learner_logp: &'a Tensor,
    /// Sampler log-probs recorded at generation time.
    pub sampler_logp: &'a Tensor,
    pub mask: &'a Tensor,
    pub advantages: &'a Tensor,
    /// Reference-policy log-probs for the KL penalty (required when `kl_beta > 0`).
    pub ref_logp: Option<&'a Tensor>,
}

/// The loss and what the learner reports about it.
#[derive(Debug)]
pub struct LossOutput {
    /// Scalar loss to minimise.
    pub loss: Tensor,
    /// Importance coefficient per sequence (token-level objectives: mean over its tokens),
    /// before any truncation by [`LossConfig::is_cap`], so that it still measures the drift
    /// between sampler and learner.
    pub coefficients: Vec<f64>,
    /// Fraction of (masked) tokens whose coefficient (after truncation) was clipped.
    pub clip_fraction: f64,
    /// Estimate of KL(sampler ‖ learner) over the group's tokens: mean of `q − p` in log space.
    pub kl_sampler_learner: f64,
}

/// Length-normalised sequence log-probability `(1/|y_i|) Σ_t m_{i,t} log π_{i,t}`, `[G, 1]`.
fn seq_mean_logp(logp: &Tensor, mask: &Tensor, lens: &Tensor) -> Result<Tensor> {
    Ok((logp * mask)?.sum_keepdim(1)?.broadcast_div(lens)?)
}

/// The untruncated importance coefficient `c` of [`Objective`] and `log c`, both with gradient:
/// `[G, T]` (token level) or `[G, 1]`.
fn raw_coefficients(cfg: &LossConfig, g: &GroupInput<'_>) -> Result<(Tensor, Tensor)> {
    let lens = g.mask.sum_keepdim(1)?.maximum(1.0)?;
    let q_logp = g.sampler_logp.detach();
    Ok(match cfg.objective {
        Objective::Grpo | Objective::DrGrpo => {
            let log_c = (g.learner_logp - &q_logp)?;
            (log_c.exp()?, log_c)
        }
        Objective::Gspo => {
            let delta = (g.learner_logp - &q_logp)?;
            let log_c = seq_mean_logp(&delta, g.mask, &lens)?;
            (log_c.exp()?, log_c)
        }
        Objective::Gepo => {
            let log_p = seq_mean_logp(g.learner_logp, g.mask, &lens)?;
            let p = log_p.exp()?;
            let q = seq_mean_logp(&q_logp, g.mask, &lens)?.exp()?;
            // Listing 1: normalized_q = q / Σq; denominator = Σ normalized_q · q = Σq² / Σq.
            let e_q = (q.sqr()?.sum_all()? / q.sum_all()?)?;
            let denom = match cfg.gepo_defensive_eps {
                None => e_q.broadcast_as(p.shape())?.contiguous()?,
                Some(eps) => {
                    (p.detach().affine(eps, 0.0)?
                        + e_q.affine(1.0 - eps, 0.0)?.broadcast_as(p.shape())?)?
                }
            };
            let log_c = (log_p - denom.log()?)?;
            ((p / denom)?, log_c)
        }
    })
}

/// ECHO-2 eq. 24 applied to a coefficient: `c̃ = min(sg(c), C) · exp(log c − sg(log c))`.
/// The first factor is the truncated ratio (a constant), the second is `ρ = π_θ/π_θold`
/// (exactly 1 in value, gradient `∇ log c`).
fn truncate(c: &Tensor, log_c: &Tensor, cap: f64) -> Result<Tensor> {
    let ratio = c.detach().minimum(cap)?;
    let rho = (log_c - log_c.detach())?.exp()?;
    Ok((ratio * rho)?)
}

/// The importance coefficient `c` of [`Objective`] — truncated to `c̃` when
/// [`LossConfig::is_cap`] is set — `[G, T]` (token level) or `[G, 1]`.
pub fn importance_coefficients(cfg: &LossConfig, g: &GroupInput<'_>) -> Result<Tensor> {
    let (c, log_c) = raw_coefficients(cfg, g)?;
    match cfg.is_cap {
        None => Ok(c),
        Some(cap) => truncate(&c, &log_c, cap),
    }
}

/// The loss of one group (see the module docs for the formulas).
pub fn group_loss(cfg: &LossConfig, g: &GroupInput<'_>) -> Result<LossOutput> {
    let (n_seq, n_tok) = g.learner_logp.dims2()?;
    if g.sampler_logp.dims2()? != (n_seq, n_tok) || g.mask.dims2()? != (n_seq, n_tok) {
        return Err(LearnerError::Invalid(
            "learner/sampler log-probs and mask must share one [G, T] shape".into(),
        ));
    }
    if g.advantages.dims1()? != n_seq {
        return Err(LearnerError::Invalid(format!(
            "{} advantages for {n_seq} sequences",
            g.advantages.dims1()?
        )));
    }
    let mask = g.mask;
    let lens = mask.sum_keepdim(1)?.maximum(1.0)?;
    let (raw, log_raw) = raw_coefficients(cfg, g)?;
    let coef = match cfg.is_cap {
        None => raw.clone(),
        Some(cap) => truncate(&raw, &log_raw, cap)?,
    };
    let coef = coef.broadcast_as((n_seq, n_tok))?.contiguous()?;
    let raw = raw.broadcast_as((n_seq, n_tok))?.contiguous()?;
    let adv = g
        .advantages
        .reshape((n_seq, 1))?
        .broadcast_as((n_seq, n_tok))?
        .contiguous()?;
    let eps = cfg.clip_eps;
    let surr1 = (&coef * &adv)?;
    let surr2 = (coef.clamp(1.0 - eps, 1.0 + eps)? * &adv)?;
    let mut per_token = surr1.minimum(&surr2)?.neg()?;
    if cfg.kl_beta > 0.0 {
        let r = g
            .ref_logp
            .ok_or_else(|| LearnerError::Invalid("kl_beta > 0 needs reference log-probs".into()))?
            .detach();
        let d = (r - g.learner_logp)?;
        let k3 = ((d.exp()? - &d)? - 1.0)?;
        per_token = (per_token + k3.affine(cfg.kl_beta, 0.0)?)?;
    }
    let masked = (&per_token * mask)?;
    let loss = match cfg.objective {
        Objective::DrGrpo => (masked.sum_all()? / (n_seq * n_tok) as f64)?,
        _ => masked.sum_keepdim(1)?.broadcast_div(&lens)?.mean_all()?,
    };

    // Reported statistics (no gradient).
    let m = mask.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let c = coef.detach().to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let c_raw = raw.detach().to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let lp = g
        .learner_logp
        .detach()
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()?;
    let sp = g.sampler_logp.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let (mut clipped, mut tokens, mut kl) = (0.0, 0.0, 0.0);
    let mut coefficients = Vec::with_capacity(n_seq);
    for i in 0..n_seq {
        let (mut sum, mut n) = (0.0, 0.0);
        for t in 0..n_tok {
            if m[i][t] > 0.0 {
                sum += c_raw[i][t];
                n += 1.0;
                if (c[i][t] - 1.0).abs() > eps {
                    clipped += 1.0;
                }
                kl += sp[i][t] - lp[i][t];
            }
        }
        tokens += n;
        coefficients.push(if n > 0.0 { sum / n } else { 1.0 });
    }
    Ok(LossOutput {
        loss,
        coefficients,
        clip_fraction: if tokens > 0.0 { clipped / tokens } else { 0.0 },
        kl_sampler_learner: if tokens > 0.0 { kl / tokens } else { 0.0 },
    })
}

/// Population variance of importance coefficients (a staleness health metric).
pub fn variance(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64
}

#[cfg(test)]
#[path = "loss_tests.rs"]
mod tests;
