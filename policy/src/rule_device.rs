//! The canonical sampling rule ([`crate::rule`]) as a device kernel: one thread block per row
//! of logits turns the row and its prescribed uniform into (token, log-prob), so that only 8
//! bytes per row cross the bus instead of the row (`docs/gpu.md`, "The rule on the device").
//!
//! Owns: the kernel's CUDA source ([`KERNEL_SRC`], `rule_kernel.cu`, compiled at run time by
//! NVRTC behind the `cuda` feature: [`cuda::DeviceRule`]) and [`emulate`], the kernel's
//! algorithm step for step on the CPU — the same weights (the CPU's libm-free `exp`, rounded
//! the same way: NVRTC runs with `--fmad=false`), the same f64 sums in the same order (a
//! 256-token block in 8 interleaved lanes, the blocks one after another), the same walk. The
//! one step that differs from [`crate::rule::draw`] is the nucleus threshold: a bisection over
//! the weights' bit patterns (31 masked sums of the row; every thread of the block takes part,
//! nothing is sorted or partitioned) instead of the CPU's quickselect. Both find the largest
//! weight `τ` whose mass at or above it reaches `top_p · Z`; they can disagree only when that
//! mass lies within the rounding of its sums' order of `top_p · Z` (the stated tolerance of
//! the tests: a relative 1e-9 of `Z`), and for every other row the two give the same token and
//! the same log-prob bits.
//!
//! Must not touch: the rule's definition (that is [`crate::rule`]'s module doc); nothing here
//! may change which token a row and a uniform yield beyond that tolerance.

use crate::error::{PolicyError, Result};
use crate::rule::{exp_nonpos, masked_sum, Drawn, RuleParams, WALK_BLOCK};

/// The kernel's CUDA source: `rule_rows_{f32,bf16,f16}` (see the file's header).
pub const KERNEL_SRC: &str = include_str!("rule_kernel.cu");

/// Threads per row of the kernel (a block per row).
pub const THREADS: usize = 256;

/// What the kernel reports in place of a token for a row with a NaN or +∞ logit.
pub const TOKEN_BAD: u32 = 0xFFFF_FFFF;
/// What the kernel reports in place of a token for a row without a finite logit.
pub const TOKEN_NO_FINITE: u32 = 0xFFFF_FFFE;

/// The host's view of one output row of the kernel (`[token u32, log-prob f32 bits]`).
pub fn decode_output(token: u32, logprob_bits: u32) -> Result<Drawn> {
    match token {
        TOKEN_BAD => Err(PolicyError::Sampling(
            "a logit is NaN or +inf (device rule)".into(),
        )),
        TOKEN_NO_FINITE => Err(PolicyError::Sampling(
            "no finite logit (device rule)".into(),
        )),
        token => Ok(Drawn {
            token,
            logprob: f32::from_bits(logprob_bits),
        }),
    }
}

/// The block sums of `e` at `floor` and their sum in block order: `total_at` of the kernel.
fn total_at(e: &[f32], floor: f32, bs: &mut Vec<f64>) -> f64 {
    bs.clear();
    bs.extend(e.chunks(WALK_BLOCK).map(|b| masked_sum(b, floor)));
    bs.iter().fold(0.0, |z, &s| z + s)
}

/// The kernel's nucleus threshold for weights `e` and `target = top_p · Z`: the largest bit
/// pattern `b` (weights are ≥ 0, so bit order is value order) with `S(b) ≥ target`, where
/// `S(b)` is the kernel's fixed-order mass of the weights `≥ b`. `S` falls as `b` grows, and
/// the largest such `b` is always one of the weights (or 0).
pub(crate) fn bisect_threshold(e: &[f32], target: f64, bs: &mut Vec<f64>) -> f32 {
    let (mut lo, mut hi) = (0u32, 0x7F80_0000u32);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if total_at(e, f32::from_bits(mid), bs) >= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    f32::from_bits(lo)
}

/// The kernel's algorithm for one row on the CPU (see the module doc): what the device
/// computes for `logits` (widened from the model's dtype, which is lossless) and `u`.
pub fn emulate(logits: &[f32], rule: RuleParams, u: f64) -> Result<Drawn> {
    // 1. The maximum and the NaN / +∞ check (a tree on the device; the order does not matter).
    let mut max = f32::NEG_INFINITY;
    let mut bad = false;
    for &x in logits {
        bad |= x.is_nan() | (x == f32::INFINITY);
        max = if x > max { x } else { max };
    }
    if bad {
        return decode_output(TOKEN_BAD, 0);
    }
    if max == f32::NEG_INFINITY {
        return decode_output(TOKEN_NO_FINITE, 0);
    }
    let inv_t = crate::rule::inv_temperature(rule);
    // 2. The weights and Z in block order.
    let e: Vec<f32> = logits
        .iter()
        .map(|&x| exp_nonpos((x - max) * inv_t))
        .collect();
    let mut bs = Vec::with_capacity(logits.len().div_ceil(WALK_BLOCK));
    let z = total_at(&e, f32::NEG_INFINITY, &mut bs);
    let log_z = z.ln();
    let logprob = |tok: usize| (f64::from((logits[tok] - max) * inv_t) - log_z) as f32;
    if rule.temperature == 0.0 {
        let arg = logits.iter().position(|&x| x == max).unwrap_or(0);
        return Ok(Drawn {
            token: arg as u32,
            logprob: logprob(arg),
        });
    }
    // 3. The threshold by bisection.
    let (tau, mass) = if rule.top_p < 1.0 {
        let tau = bisect_threshold(&e, f64::from(rule.top_p) * z, &mut bs);
        let mass = if tau > 0.0 {
            total_at(&e, tau, &mut bs)
        } else {
            total_at(&e, f32::NEG_INFINITY, &mut bs);
            z
        };
        (tau, mass)
    } else {
        (0.0, z)
    };
    // 4. The walk (thread 0 on the device).
    let tok = crate::rule::walk(&e, &bs, tau, u * mass);
    Ok(Drawn {
        token: tok as u32,
        logprob: logprob(tok),
    })
}

/// The fixed-order mass of the weights of `logits` at or above `tau`, and `Z`: what the
/// tolerance is stated in (a disagreement with [`crate::rule::draw`] is allowed only where the
/// mass at the larger of the two thresholds is within rounding of `top_p · Z`).
pub(crate) fn mass_at(logits: &[f32], rule: RuleParams, tau: f32) -> (f64, f64) {
    let e = crate::rule::weights(logits, rule);
    let mut bs = Vec::new();
    let z = total_at(&e, f32::NEG_INFINITY, &mut bs);
    (total_at(&e, tau, &mut bs), z)
}

/// The emulated kernel's threshold for `logits` (0 without truncation).
pub(crate) fn emulated_threshold(logits: &[f32], rule: RuleParams) -> f32 {
    if rule.temperature == 0.0 || rule.top_p >= 1.0 {
        return 0.0;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits
        .iter()
        .map(|&x| exp_nonpos((x - max) * (1.0 / rule.temperature)))
        .collect();
    let mut bs = Vec::new();
    let z = total_at(&e, f32::NEG_INFINITY, &mut bs);
    bisect_threshold(&e, f64::from(rule.top_p) * z, &mut bs)
}

/// The stated tolerance: the kernel may pick another token than [`crate::rule::draw`] only
/// where the two thresholds differ and the fixed-order mass at the larger one lies within a
/// relative `MASS_TOLERANCE` of `Z` from `top_p · Z` (the mass at the threshold is on the
/// boundary, within the rounding of the sums' order).
pub const MASS_TOLERANCE: f64 = 1e-9;

/// The largest |Δ log-prob| allowed where the kernel and the rule pick the same token: the
/// device's f64 `log` may differ from the host's by an ulp before the rounding to f32.
pub const LOGPROB_TOLERANCE: f32 = 1e-6;

/// Whether `row` is a boundary row for `rule` (see [`MASS_TOLERANCE`]).
pub fn is_boundary_row(row: &[f32], rule: RuleParams) -> bool {
    let (t_rule, t_emu) = (
        crate::rule::threshold_of(row, rule),
        emulated_threshold(row, rule),
    );
    if t_rule == t_emu {
        return false;
    }
    let (mass, z) = mass_at(row, rule, t_rule.max(t_emu));
    (mass - f64::from(rule.top_p) * z).abs() <= MASS_TOLERANCE * z
}

/// What [`check_against_rule`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleCheck {
    /// Rows compared.
    pub rows: usize,
    /// Rows whose token differed within the tolerance (a boundary row).
    pub boundary_rows: usize,
    /// Rows whose token differed outside it: 0 when the kernel is the rule.
    pub mismatched_rows: usize,
    /// The largest |Δ log-prob| where the tokens agreed.
    pub max_logprob_diff: f32,
    /// Whether the kernel ran on a CUDA device (else its CPU emulation).
    pub on_device: bool,
}

impl RuleCheck {
    /// No row outside the tolerance, boundary rows at most 1 in 10,000, log-probs within
    /// [`LOGPROB_TOLERANCE`].
    pub fn ok(&self) -> bool {
        self.mismatched_rows == 0
            && self.boundary_rows * 10_000 <= self.rows
            && self.max_logprob_diff <= LOGPROB_TOLERANCE
    }
}

fn gaussian(rng: &mut impl rand::Rng) -> f32 {
    let (a, b): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
    ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
}

/// The kernel on `device` (its CPU emulation on a CPU device, or in a build without `cuda`)
/// against [`crate::rule::draw`] on at least `rows` random bf16 rows: launches of 1,024 rows
/// of 1,000 tokens (logits of σ 0.5, 3 and 8; temperatures 1, 0.7 and 0 (greedy); top-p 1,
/// 0.9, 0.5 and 0.95), then 64 rows of the full 151,936-token vocabulary.
pub fn check_against_rule(
    device: &candle_core::Device,
    rows: usize,
    seed: u64,
) -> Result<RuleCheck> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut check = RuleCheck {
        rows: 0,
        boundary_rows: 0,
        mismatched_rows: 0,
        max_logprob_diff: 0.0,
        on_device: device.is_cuda(),
    };
    let launches = rows.div_ceil(1024).max(1);
    // A unit struct without `cuda-rule`, the compiled kernels with it.
    #[allow(clippy::default_constructed_unit_structs)]
    let mut kernels = Kernels::default();
    for (k, (batch, vocab)) in std::iter::repeat_n((1024usize, 1000usize), launches)
        .chain([(64, 151_936)])
        .enumerate()
    {
        let host: Vec<f32> = (0..batch * vocab)
            .map(|_| {
                f32::from(half::bf16::from_f32(
                    [0.5f32, 3.0, 8.0][k % 3] * gaussian(&mut rng),
                ))
            })
            .collect();
        let rule = RuleParams {
            temperature: [1.0, 0.7, 0.0][k % 3],
            top_p: [1.0, 0.9, 0.5, 0.95][k % 4],
        };
        let us: Vec<f64> = (0..batch).map(|_| rng.gen()).collect();
        let got: Vec<Drawn> = if device.is_cuda() {
            on_device(&mut kernels, device, &host, (batch, vocab), rule, &us)?
        } else {
            host.chunks_exact(vocab)
                .zip(&us)
                .map(|(row, &u)| emulate(row, rule, u))
                .collect::<Result<_>>()?
        };
        for ((row, &u), g) in host.chunks_exact(vocab).zip(&us).zip(&got) {
            let want = crate::rule::draw(row, rule, u)?;
            if want.token == g.token {
                check.max_logprob_diff =
                    check.max_logprob_diff.max((want.logprob - g.logprob).abs());
            } else if is_boundary_row(row, rule) {
                check.boundary_rows += 1;
            } else {
                check.mismatched_rows += 1;
            }
            check.rows += 1;
        }
    }
    Ok(check)
}

/// The compiled kernels of [`check_against_rule`], one per bucket shape.
#[cfg(feature = "cuda-rule")]
type Kernels = Vec<cuda::DeviceRule>;
#[cfg(not(feature = "cuda-rule"))]
#[derive(Default)]
struct Kernels;

#[cfg(feature = "cuda-rule")]
fn on_device(
    kernels: &mut Kernels,
    device: &candle_core::Device,
    host: &[f32],
    (batch, vocab): (usize, usize),
    rule: RuleParams,
    us: &[f64],
) -> Result<Vec<Drawn>> {
    if kernels.last().is_none_or(|d| !d.fits(batch, vocab)) {
        kernels.push(cuda::DeviceRule::new(device, batch, vocab)?);
    }
    let logits = candle_core::Tensor::from_slice(host, (batch, vocab), device)?
        .to_dtype(candle_core::DType::BF16)?;
    kernels.last_mut().expect("pushed").draw(&logits, rule, us)
}

#[cfg(not(feature = "cuda-rule"))]
fn on_device(
    _: &mut Kernels,
    _: &candle_core::Device,
    _: &[f32],
    _: (usize, usize),
    _: RuleParams,
    _: &[f64],
) -> Result<Vec<Drawn>> {
    Err(PolicyError::Sampling(
        "the device rule needs a build with the cuda feature".into(),
    ))
}

#[cfg(feature = "cuda-rule")]
pub mod cuda;

#[cfg(test)]
#[path = "rule_device_tests.rs"]
mod tests;
