//! The canonical sampling rule: the one way every generation path (the training forward's
//! `batched` and `sequential` loops, the inference path, CPU and CUDA alike, and a multi-turn
//! environment's turns) turns a row of logits and a uniform `u ∈ [0, 1)` into a token, and the
//! learner's check that a reported token is the one the rule picks (`docs/model.md`, "The
//! canonical sampling rule"; `docs/security.md`, "Checkable sampling").
//!
//! **The rule**, for logits `l` over the vocabulary, temperature `T`, nucleus mass `top_p`:
//! 1. `T = 0`: greedy, the arg-max (lowest id among equal maxima); `u` is unused.
//! 2. Otherwise the weights `e_i = exp((l_i − max l) / T)` (the softmax numerators; the
//!    probabilities are `p_i = e_i / Z`, `Z = Σ e_i`).
//! 3. Top-p: the nucleus is `K = {i : e_i ≥ τ}`, where `τ` is the largest value such that
//!    `Σ_{e_j ≥ τ} e_j ≥ top_p · Z` (the smallest set of most probable tokens holding `top_p`
//!    of the mass; tokens tied with the last one are all in). `top_p = 1`: every token.
//! 4. Inverse CDF **in token-id order**: with `M = Σ_{i ∈ K} e_i`, the token is the smallest
//!    id `t ∈ K` with `Σ_{i ∈ K, i ≤ t} e_i > u · M`.
//!
//! Why token-id order, not probability order: a small numeric difference between two
//! machines then moves each CDF boundary by at most that difference, so the token changes only
//! when `u` lies within the difference of a boundary. In probability order, two nearly equal
//! probabilities swapping ranks would move every boundary after them.
//!
//! The reported log-prob is `log softmax(l / T)[t]` over the *full* vocabulary (`T = 0`: at
//! temperature 1), before truncation — the quantity the learner recomputes.
//!
//! **Implementation** ([`draw`], [`draw_rows`]): the weights in f32 with a libm-free `exp`
//! (the same bits on every platform; the loop vectorises), their sums in f64 in a fixed order,
//! the nucleus threshold by a mass-weighted quickselect (never a sort of the vocabulary), the
//! walk skipping whole blocks by their sums, rows in parallel. Deterministic: the same logits
//! and `u` give the same token on every path.
//!
//! **The check** ([`token_windows`]): from the learner's own logits, for each reported token,
//! the interval of uniforms for which an honest worker — whose probabilities differ from the
//! learner's by numeric noise only — could have drawn it. With a per-token relative margin
//! `r` (every honest `p'_i` within a factor `1 + r` of `p_i`; from the log-prob tolerance) and a
//! mass margin `δ` (every honest set mass within `δ`), the honest nucleus `K'` lies between
//! `K_small = {c : A(p_c/g) − p_c < top_p − δ}` and `K_big = {c : A(p_c·g) < top_p + δ}`,
//! where `A(x) = Σ_{p_i > x} p_i` is the mass above `x` and `g = (1 + r)²` (a token is surely
//! in when the tokens that could outrank it hold too little, and can be in only while those
//! that surely outrank it do not already hold enough), so
//! `u ∈ [F'(t−1), F'(t))` implies
//! `u ≥ (p(K_small ∩ [0, t)) − δ) / (p(K_big) + δ)` and
//! `u ≤ (p(K_big ∩ [0, t]) + δ) / (p(K_small) − δ)`, and `t ∈ K_big`. A token outside that
//! window was not drawn by the rule from the uniform the learner prescribed; a forced token of
//! probability `p` survives with probability about `p + 2δ`.

use std::cell::RefCell;

use candle_core::{DType, Tensor, D};
use rayon::prelude::*;

use crate::error::{PolicyError, Result};

/// A drawn token and its log-prob (see the module doc for the convention).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: u32,
    pub logprob: f32,
}

/// The rule's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleParams {
    /// Softmax temperature; 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = no truncation.
    pub top_p: f32,
}

thread_local! {
    /// Per-thread scratch: the weights of one row, and the working copy of the selection.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Draws one token from `logits` with uniform `u` by the canonical rule.
pub fn draw(logits: &[f32], rule: RuleParams, u: f64) -> Result<Drawn> {
    SCRATCH.with(|s| {
        let (e, work) = &mut *s.borrow_mut();
        draw_with(logits, rule, u, e, work)
    })
}

/// Rows below this many logits in all are drawn on the calling thread (the thread pool's
/// hand-off costs more than it saves on a small vocabulary).
const PARALLEL_MIN_LOGITS: usize = 1 << 16;

/// Draws one token per row of `logits` (`uniforms.len()` rows of `vocab` logits each, row
/// major), rows in parallel.
pub fn draw_rows(
    logits: &[f32],
    vocab: usize,
    rule: RuleParams,
    uniforms: &[f64],
) -> Result<Vec<Drawn>> {
    if vocab == 0 || logits.len() != vocab * uniforms.len() {
        return Err(PolicyError::Sampling(format!(
            "{} logits are not {} rows of {vocab}",
            logits.len(),
            uniforms.len()
        )));
    }
    if logits.len() < PARALLEL_MIN_LOGITS || uniforms.len() == 1 {
        return logits
            .chunks_exact(vocab)
            .zip(uniforms)
            .map(|(row, &u)| draw(row, rule, u))
            .collect();
    }
    logits
        .par_chunks_exact(vocab)
        .zip(uniforms.par_iter())
        .map(|(row, &u)| draw(row, rule, u))
        .collect()
}

/// Draws one token per uniform from one shared row of logits (the first step after a
/// prefill: every sample starts from the prompt's logits), in parallel.
pub fn draw_shared(row: &[f32], rule: RuleParams, uniforms: &[f64]) -> Result<Vec<Drawn>> {
    if row.len() * uniforms.len() < PARALLEL_MIN_LOGITS || uniforms.len() == 1 {
        return uniforms.iter().map(|&u| draw(row, rule, u)).collect();
    }
    uniforms.par_iter().map(|&u| draw(row, rule, u)).collect()
}

fn draw_with(
    logits: &[f32],
    rule: RuleParams,
    u: f64,
    e: &mut Vec<f32>,
    work: &mut Vec<f32>,
) -> Result<Drawn> {
    // One branch-free pass (it vectorises): the maximum, and whether any logit is NaN or +∞.
    let (mut max, mut bad) = (f32::NEG_INFINITY, false);
    for &x in logits {
        bad |= x.is_nan() | (x == f32::INFINITY);
        max = if x > max { x } else { max };
    }
    if bad {
        let (i, x) = logits
            .iter()
            .enumerate()
            .find(|(_, x)| x.is_nan() || **x == f32::INFINITY)
            .map_or((0, f32::NAN), |(i, x)| (i, *x));
        return Err(PolicyError::Sampling(format!("logit {i} is {x}")));
    }
    if max == f32::NEG_INFINITY {
        return Err(PolicyError::Sampling("no finite logit".into()));
    }
    let inv_t = inv_temperature(rule);
    e.clear();
    e.extend(logits.iter().map(|&x| exp_nonpos((x - max) * inv_t)));
    // Block sums: Z, and (without truncation) the skips of the inverse-CDF walk below.
    let mut blocks: Vec<f64> = e.chunks(WALK_BLOCK).map(sum_f64).collect();
    let z: f64 = blocks.iter().sum();
    let logprob = |tok: usize| (f64::from((logits[tok] - max) * inv_t) - z.ln()) as f32;
    if rule.temperature == 0.0 {
        let arg = logits.iter().position(|&x| x == max).unwrap_or(0);
        return Ok(Drawn {
            token: arg as u32,
            logprob: logprob(arg),
        });
    }
    let tau = if rule.top_p < 1.0 {
        nucleus_threshold(e, f64::from(rule.top_p) * z, work)
    } else {
        0.0
    };
    // Inverse CDF over the kept weights (e ≥ τ; zero weights add nothing) in id order: whole
    // blocks are skipped by their sums, the block that crosses `u · M` is walked token by token.
    if tau > 0.0 {
        blocks = e.chunks(WALK_BLOCK).map(|b| masked_sum(b, tau)).collect();
    }
    let tok = walk(e, &blocks, tau, u * blocks.iter().sum::<f64>());
    Ok(Drawn {
        token: tok as u32,
        logprob: logprob(tok),
    })
}

/// The unnormalised weights `exp((x − max) / T)` of a finite row, as [`draw`] computes them.
pub(crate) fn weights(logits: &[f32], rule: RuleParams) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let inv_t = inv_temperature(rule);
    logits
        .iter()
        .map(|&x| exp_nonpos((x - max) * inv_t))
        .collect()
}

/// `1 / T`, with greedy decoding (`T = 0`) weighting as `T = 1` (its log-probs).
pub(crate) fn inv_temperature(rule: RuleParams) -> f32 {
    let t = if rule.temperature > 0.0 {
        rule.temperature
    } else {
        1.0
    };
    1.0 / t
}

/// The inverse CDF over the kept weights (`e ≥ τ`; zero weights add nothing) in id order:
/// the first token whose running sum passes `target`. Whole blocks of [`WALK_BLOCK`] are
/// skipped by their sums `blocks`; the block that crosses `target` is walked token by token.
/// A `target` rounded past the total gives the last kept token.
pub(crate) fn walk(e: &[f32], blocks: &[f64], tau: f32, target: f64) -> usize {
    let mut cum = 0f64;
    for (bi, (block, &s)) in e.chunks(WALK_BLOCK).zip(blocks).enumerate() {
        if cum + s <= target {
            cum += s;
            continue;
        }
        for (k, &x) in block.iter().enumerate() {
            if x > 0.0 && x >= tau {
                cum += f64::from(x);
                if cum > target {
                    return bi * WALK_BLOCK + k;
                }
            }
        }
    }
    e.iter().rposition(|&x| x > 0.0 && x >= tau).unwrap_or(0)
}

/// The nucleus threshold `τ` that [`draw`] uses for `logits` (0 without truncation or when
/// rounding keeps every token in): what the device rule's emulation is compared against.
pub(crate) fn threshold_of(logits: &[f32], rule: RuleParams) -> f32 {
    let e = weights(logits, rule);
    if rule.temperature == 0.0 || rule.top_p >= 1.0 {
        return 0.0;
    }
    let z: f64 = e.chunks(WALK_BLOCK).map(sum_f64).sum();
    nucleus_threshold(&e, f64::from(rule.top_p) * z, &mut Vec::new())
}

/// Tokens per block of the inverse-CDF walk.
pub(crate) const WALK_BLOCK: usize = 256;
/// Independent partial sums of [`sum_f64`].
const LANES: usize = 8;

/// `e^x` for `x ≤ 0` in f32 arithmetic alone (Cephes' `expf`: range reduction by `ln 2`, a
/// degree-6 polynomial, the exponent set from the bits): no libm call, so a row's loop
/// vectorises and every platform computes the same bits. Relative error below 3·10⁻⁷;
/// 0 below −87 (where f32 `exp` leaves the normal range) and for −∞.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2²³: adding it rounds to the nearest integer, which its low bits then hold.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(-87.0);
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `Σ xs` in f64 in a fixed order ([`LANES`] interleaved partial sums, combined pairwise):
/// deterministic, and the loop vectorises.
pub(crate) fn sum_f64(xs: &[f32]) -> f64 {
    masked_sum(xs, f32::NEG_INFINITY)
}

/// `Σ_{x ≥ floor} x` in f64, in the fixed order of [`sum_f64`].
pub(crate) fn masked_sum(xs: &[f32], floor: f32) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            acc[k] += if c[k] >= floor { f64::from(c[k]) } else { 0.0 };
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in chunks.remainder() {
        if x >= floor {
            s += f64::from(x);
        }
    }
    s
}

/// The nucleus threshold `τ` of the module doc for weights `e` and `target = top_p · Z`: the
/// largest weight `τ` with `Σ_{e_j ≥ τ} e_j ≥ target`, by a mass-weighted quickselect — a
/// three-way partition around a pivot, then only the side that holds `τ` is kept (expected
/// linear time; no sort of the vocabulary). When rounding keeps the sum below `target`, every
/// token is in (τ = 0).
fn nucleus_threshold(e: &[f32], target: f64, work: &mut Vec<f32>) -> f32 {
    work.clear();
    work.extend(e.iter().copied().filter(|&x| x > 0.0));
    let desc = |a: &f32, b: &f32| b.total_cmp(a);
    let mut s = &mut work[..];
    // The mass of the weights known to be above the slice `s`.
    let mut above = 0f64;
    let mut rounds = 0;
    loop {
        rounds += 1;
        if s.len() <= 64 || rounds > 64 {
            s.sort_unstable_by(desc);
            for &x in s.iter() {
                above += f64::from(x);
                if above >= target {
                    return x;
                }
            }
            return 0.0;
        }
        let pivot = median3(s[0], s[s.len() / 2], s[s.len() - 1]);
        let (gt, eq) = partition3(s, pivot);
        let m_gt = sum_f64(&s[..gt]);
        if above + m_gt >= target {
            s = &mut s[..gt];
            continue;
        }
        let m_eq = sum_f64(&s[gt..gt + eq]);
        if above + m_gt + m_eq >= target {
            return pivot;
        }
        above += m_gt + m_eq;
        s = &mut s[gt + eq..];
    }
}

fn median3(a: f32, b: f32, c: f32) -> f32 {
    a.max(b).min(a.min(b).max(c))
}

/// Reorders `s` as `[> pivot | = pivot | < pivot]` and returns the lengths of the first two.
fn partition3(s: &mut [f32], pivot: f32) -> (usize, usize) {
    let (mut lt, mut i, mut gt) = (0usize, 0usize, s.len());
    // Invariant: s[..lt] > pivot, s[lt..i] = pivot, s[gt..] < pivot.
    while i < gt {
        if s[i] > pivot {
            s.swap(lt, i);
            lt += 1;
            i += 1;
        } else if s[i] < pivot {
            gt -= 1;
            s.swap(i, gt);
        } else {
            i += 1;
        }
    }
    (lt, i - lt)
}

/// The check's margins (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margins {
    /// Relative margin on each token's probability, `r`: honest `p'_i ∈ [p_i/(1+r), p_i(1+r)]`
    /// (from a log-prob tolerance `tol`: `r = e^tol − 1`).
    pub relative: f64,
    /// Margin on cumulative masses, `δ`.
    pub delta: f64,
}

impl Margins {
    /// Margins from a log-prob tolerance and a mass margin δ.
    pub fn new(logprob_tolerance: f32, delta: f64) -> Self {
        Margins {
            relative: f64::from(logprob_tolerance).exp_m1().max(0.0),
            delta: delta.max(0.0),
        }
    }
}

/// Where an honest worker's uniform must lie for it to have drawn one token (see
/// [`token_windows`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenWindow {
    /// Smallest admissible uniform.
    pub lower: f64,
    /// Largest admissible uniform.
    pub upper: f64,
    /// Whether the token can be in an honest nucleus (always true without truncation).
    pub in_nucleus: bool,
    /// The token's probability under the learner's logits.
    pub p: f64,
}

impl TokenWindow {
    /// How far `u` lies outside the window (0 inside; +∞ for a token outside every honest
    /// nucleus): the margin a check would have needed to pass this token.
    pub fn excess(&self, u: f64) -> f64 {
        if !self.in_nucleus {
            return f64::INFINITY;
        }
        (self.lower - u).max(u - self.upper).max(0.0)
    }

    /// Whether the rule could have drawn the token from `u`.
    pub fn admits(&self, u: f64) -> bool {
        self.excess(u) == 0.0
    }
}

/// Rows of logits handled at once by [`token_windows`] (bounds its memory on a large
/// vocabulary: a few f64 copies of this many rows).
const WINDOW_CHUNK_ROWS: usize = 32;
/// Bisection steps for a nucleus bound: brackets of `max p · 2⁻³⁹`, taken on the
/// conservative side (see [`token_windows`]).
const BISECTION_STEPS: usize = 40;

/// The admissible-uniform window of token `targets[i]` at each row `i` of `logits` (`[N, V]`,
/// any float dtype, any device): the learner's side of the rule, in tensor operations on the
/// device that ran the forward, so only six numbers per token reach the host. See the module
/// doc for the bounds; the nucleus bounds are found by bisection in f64, and each bracket is
/// taken on the side that makes `K_small` smaller and `K_big` larger (looser, never tighter,
/// than the exact bound).
pub fn token_windows(
    logits: &Tensor,
    targets: &[u32],
    rule: RuleParams,
    margins: Margins,
) -> Result<Vec<TokenWindow>> {
    let (n, v) = logits.dims2()?;
    if targets.len() != n {
        return Err(PolicyError::Sampling(format!(
            "{} targets for {n} rows of logits",
            targets.len()
        )));
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= v) {
        return Err(PolicyError::Sampling(format!(
            "token {t} is outside the vocabulary ({v})"
        )));
    }
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    while start < n {
        let rows = WINDOW_CHUNK_ROWS.min(n - start);
        let chunk = logits.narrow(0, start, rows)?;
        out.extend(windows_of(
            &chunk,
            &targets[start..start + rows],
            rule,
            margins,
        )?);
        start += rows;
    }
    Ok(out)
}

fn windows_of(
    logits: &Tensor,
    targets: &[u32],
    rule: RuleParams,
    m: Margins,
) -> Result<Vec<TokenWindow>> {
    let (n, v) = logits.dims2()?;
    let dev = logits.device();
    let t = if rule.temperature > 0.0 {
        rule.temperature
    } else {
        1.0
    };
    let s = (logits.to_dtype(DType::F64)? / f64::from(t))?;
    let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?; // [n, v]
    let tgt = Tensor::new(targets, dev)?.unsqueeze(1)?; // [n, 1]
    let p_t = p.gather(&tgt, D::Minus1)?; // [n, 1]
    let ids = Tensor::arange(0u32, v as u32, dev)?.unsqueeze(0)?; // [1, v]
    let before = ids.broadcast_lt(&tgt)?.to_dtype(DType::F64)?; // [n, v]: id < t
    let grow = (1.0 + m.relative).powi(2);
    let host = |x: &Tensor| -> Result<Vec<f64>> { Ok(x.flatten_all()?.to_vec1::<f64>()?) };
    if rule.temperature == 0.0 {
        // Greedy: an honest arg-max is within the relative margin of the learner's maximum.
        let max = host(&p.max_keepdim(D::Minus1)?)?;
        let pt = host(&p_t)?;
        return Ok(pt
            .into_iter()
            .zip(max)
            .map(|(pt, max)| TokenWindow {
                lower: 0.0,
                upper: 1.0,
                in_nucleus: pt * grow >= max,
                p: pt,
            })
            .collect());
    }
    // K_small ⊆ every honest nucleus ⊆ K_big, as 0/1 masks over the vocabulary.
    let (small, big) = if rule.top_p < 1.0 {
        let q = f64::from(rule.top_p);
        // Token c is in every honest nucleus when the tokens that could rank above it hold
        // less than q − δ: A(p_c/g) − p_c < q − δ, with A(x) = Σ_{p_i > x} p_i. The left side
        // falls as p_c grows, so this is p_c ≥ x*, bracketed by bisection (the upper end:
        // a subset).
        let (_, hi) = bisect(&p, |x| {
            let above = p.broadcast_gt(&(x / grow)?)?.to_dtype(DType::F64)?;
            Ok(((&p * above)?.sum_keepdim(D::Minus1)? - x)?.ge(q - m.delta)?)
        })?;
        let small = p.broadcast_ge(&hi)?.to_dtype(DType::F64)?;
        // Token c can be in an honest nucleus only if the tokens surely above it hold less
        // than q + δ: A(p_c·g) < q + δ; the lower end of the bracket gives a superset.
        let (lo, _) = bisect(&p, |x| {
            let above = p.broadcast_gt(&(x * grow)?)?.to_dtype(DType::F64)?;
            Ok((&p * above)?.sum_keepdim(D::Minus1)?.ge(q + m.delta)?)
        })?;
        let big = p.broadcast_gt(&lo)?.to_dtype(DType::F64)?;
        (small, big)
    } else {
        (p.ones_like()?, p.ones_like()?)
    };
    let mass = |mask: &Tensor| -> Result<Vec<f64>> { host(&(&p * mask)?.sum_keepdim(D::Minus1)?) };
    let m_small = mass(&small)?;
    let m_big = mass(&big)?;
    let below_small = mass(&(&small * &before)?)?;
    let below_big = mass(&(&big * &before)?)?;
    let in_big = host(&big.gather(&tgt, D::Minus1)?)?;
    let pt = host(&p_t)?;
    let d = m.delta;
    Ok((0..n)
        .map(|i| {
            let lower = ((below_small[i] - d) / (m_big[i] + d)).max(0.0);
            let upper = (below_big[i] + pt[i] + d) / (m_small[i] - d).max(f64::MIN_POSITIVE);
            TokenWindow {
                lower,
                upper,
                in_nucleus: in_big[i] > 0.5,
                p: pt[i],
            }
        })
        .collect())
}

/// Brackets `[lo, hi]` per row (`[n, 1]` tensors) around where the non-increasing predicate
/// `holds(x)` (`[n, 1]` u8 from `[n, 1]` thresholds) stops holding over probabilities `p`
/// (`[n, v]`): `holds(lo)` is true (or `lo = −1` when it fails at 0), `holds(hi)` false (or
/// `hi` above every probability's range). Bisection in f64.
fn bisect(p: &Tensor, holds: impl Fn(&Tensor) -> Result<Tensor>) -> Result<(Tensor, Tensor)> {
    let n = p.dim(0)?;
    let zero = Tensor::zeros((n, 1), DType::F64, p.device())?;
    // Every predicate here fails above twice the largest probability.
    let mut hi = ((p.max_keepdim(D::Minus1)? * 2.0)? + 1e-300)?;
    let mut lo = holds(&zero)?.where_cond(&zero, &(zero.ones_like()? * -1.0)?)?;
    for _ in 0..BISECTION_STEPS {
        let mid = ((&lo + &hi)? * 0.5)?;
        let ok = holds(&mid)?;
        lo = ok.where_cond(&mid, &lo)?;
        hi = ok.where_cond(&hi, &mid)?;
    }
    Ok((lo, hi))
}

#[cfg(test)]
#[path = "rule_tests.rs"]
mod tests;
