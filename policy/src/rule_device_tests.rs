use rand::{Rng, SeedableRng};

use super::*;
use crate::rule::{draw, threshold_of};

/// A bf16 value widened (what a bf16 `lm_head` puts in a row).
fn bf16(x: f32) -> f32 {
    f32::from(half::bf16::from_f32(x))
}

fn gaussian(rng: &mut impl Rng) -> f32 {
    let (a, b): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
    ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
}

/// Compares the emulation with the rule on one row; returns whether they disagreed (within
/// the tolerance, else it panics).
fn compare(row: &[f32], rule: RuleParams, u: f64, what: &str) -> bool {
    let want = draw(row, rule, u).unwrap();
    let got = emulate(row, rule, u).unwrap();
    if want == got {
        return false;
    }
    let (t_rule, t_emu) = (threshold_of(row, rule), emulated_threshold(row, rule));
    assert!(
        is_boundary_row(row, rule),
        "{what}: rule {want:?}, emulated kernel {got:?} (thresholds {t_rule} / {t_emu}), rule \
         {rule:?}, u {u}"
    );
    true
}

/// ≥ 100,000 random bf16 rows: vocabularies of 1 to 1,200 tokens (one to five walk blocks,
/// lengths that are not multiples of the 8 lanes), logits of spreads from flat to peaked,
/// temperatures and nuclei of every kind, and a few rows of the full 151,936 tokens.
#[test]
fn the_emulated_kernel_draws_the_rules_token_on_100k_random_bf16_rows() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(46);
    let temps = [1.0f32, 0.7, 1.3, 0.0, 0.25];
    let nuclei = [1.0f32, 0.95, 0.9, 0.5, 0.1];
    let (mut rows, mut disagree, mut truncated) = (0usize, 0usize, 0usize);
    for i in 0..100_000usize {
        let vocab = rng.gen_range(1..=1200usize);
        let sigma = [0.3f32, 1.0, 3.0, 8.0][i % 4];
        let row: Vec<f32> = (0..vocab)
            .map(|_| bf16(sigma * gaussian(&mut rng)))
            .collect();
        let top_p = if i % 7 == 6 {
            rng.gen_range(0.01f32..1.0)
        } else {
            nuclei[i % nuclei.len()]
        };
        let rule = RuleParams {
            temperature: temps[(i / 5) % temps.len()],
            top_p,
        };
        truncated += usize::from(top_p < 1.0 && rule.temperature > 0.0);
        disagree += usize::from(compare(&row, rule, rng.gen(), "random row"));
        rows += 1;
    }
    for k in 0..12 {
        let row: Vec<f32> = (0..151_936)
            .map(|_| bf16(3.0 * gaussian(&mut rng)))
            .collect();
        let rule = RuleParams {
            temperature: 1.0,
            top_p: [1.0, 0.95, 0.9][k % 3],
        };
        disagree += usize::from(compare(&row, rule, rng.gen(), "full vocabulary"));
        rows += 1;
    }
    assert!(
        rows >= 100_000 && truncated > 50_000,
        "{rows} rows, {truncated} truncated"
    );
    // Boundary rows are rare: at most one in ten thousand.
    assert!(
        disagree * 10_000 <= rows,
        "{disagree} of {rows} rows disagree"
    );
}

#[test]
fn edge_cases_ties_full_nucleus_mass_at_the_threshold_and_a_one_token_nucleus() {
    let t1 = |top_p| RuleParams {
        temperature: 1.0,
        top_p,
    };
    let us: Vec<f64> = (0..200)
        .map(|k| k as f64 / 200.0)
        .chain([0.999_999_999])
        .collect();
    // Ties: equal maxima and equal weights at the threshold; greedy takes the lowest id.
    let ties = vec![2.0f32, 5.0, 5.0, 1.0, 5.0, 5.0, -3.0, 2.0, 2.0];
    for top_p in [1.0, 0.5, 0.3, 0.6, 0.75, 0.9, 0.999] {
        for &u in &us {
            assert!(!compare(&ties, t1(top_p), u, "ties"));
        }
    }
    let greedy = RuleParams {
        temperature: 0.0,
        top_p: 1.0,
    };
    assert_eq!(emulate(&ties, greedy, 0.3).unwrap().token, 1);
    assert!(!compare(&ties, greedy, 0.3, "greedy ties"));
    // Mass exactly at the threshold: weights 1, 1/2, 1/4, 1/4 (ln 2 apart, exact in f32 when
    // the logits are 0, -ln 2, -2 ln 2: the rounding of exp decides, as on the CPU).
    let ln2 = std::f32::consts::LN_2;
    let at = vec![0.0f32, -ln2, -2.0 * ln2, -2.0 * ln2];
    for top_p in [0.5, 0.75, 0.8, 1.0] {
        for &u in &us {
            assert!(!compare(&at, t1(top_p), u, "mass at the threshold"));
        }
    }
    // A one-token nucleus: a peaked row and a tiny top-p keep only the arg-max.
    let mut peaked = vec![0.0f32; 1000];
    peaked[617] = 9.0;
    for &u in &us {
        assert_eq!(emulate(&peaked, t1(0.01), u).unwrap().token, 617);
        assert!(!compare(&peaked, t1(0.01), u, "one-token nucleus"));
    }
    // -inf logits take no mass; a single token; rows of one value.
    let masked = vec![f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 0.5];
    let flat = vec![0.25f32; 777];
    for &u in &us {
        assert!(!compare(&masked, t1(0.9), u, "masked"));
        assert!(!compare(&[3.0], t1(0.5), u, "single"));
        assert!(!compare(&flat, t1(0.37), u, "flat"));
        assert!(!compare(&flat, t1(1.0), u, "flat"));
    }
    // Bad rows are refused as the rule refuses them.
    assert!(emulate(&[0.0, f32::NAN], t1(1.0), 0.5).is_err());
    assert!(emulate(&[0.0, f32::INFINITY], t1(1.0), 0.5).is_err());
    assert!(emulate(&[f32::NEG_INFINITY; 3], t1(1.0), 0.5).is_err());
}

#[test]
fn the_bisection_finds_the_largest_weight_holding_the_target() {
    let e = [0.5f32, 1.0, 0.25, 0.25, 0.0, 0.125];
    let mut bs = Vec::new();
    // Σ = 2.125; holding 1.0 needs only the 1.0; holding 1.1 needs 0.5 too; 1.9 needs 0.25s.
    assert_eq!(bisect_threshold(&e, 1.0, &mut bs), 1.0);
    assert_eq!(bisect_threshold(&e, 1.1, &mut bs), 0.5);
    assert_eq!(bisect_threshold(&e, 1.9, &mut bs), 0.25);
    assert_eq!(bisect_threshold(&e, 2.1, &mut bs), 0.125);
}

#[test]
fn the_kernel_source_defines_the_three_entry_points() {
    for f in ["rule_rows_f32", "rule_rows_bf16", "rule_rows_f16"] {
        assert!(KERNEL_SRC.contains(&format!("RULE_KERNEL({f},")), "{f}");
    }
    assert!(decode_output(TOKEN_BAD, 0).is_err());
    assert!(decode_output(TOKEN_NO_FINITE, 0).is_err());
    let d = decode_output(7, (-1.5f32).to_bits()).unwrap();
    assert_eq!((d.token, d.logprob), (7, -1.5));
}

/// The shared check (what `gen_bench --rule-check` runs in `scripts/gpu-smoke.sh`) on the CPU:
/// the emulation (20,000 rows of 1,000 tokens and 64 of the full vocabulary here; the random
/// rows above are the 100,000).
#[test]
fn the_rule_check_passes_on_the_cpu() {
    let c = check_against_rule(&candle_core::Device::Cpu, 20_000, 46).unwrap();
    assert!(c.rows >= 20_000 && !c.on_device, "{c:?}");
    assert!(c.ok(), "{c:?}");
    assert_eq!(c.max_logprob_diff, 0.0, "{c:?}");
}

/// The kernel itself against the CPU rule (a CUDA build on a GPU host; skipped without a
/// device): ≥ 100,000 random bf16 rows within the stated tolerance.
#[cfg(feature = "cuda-rule")]
#[test]
fn rule_device_matches_the_rule_on_the_device() {
    let device = match candle_core::Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let c = check_against_rule(&device, 100_000, 4646).unwrap();
    assert!(c.rows >= 100_000 && c.on_device, "{c:?}");
    assert!(c.ok(), "{c:?}");
}
