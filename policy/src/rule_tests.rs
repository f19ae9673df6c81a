use candle_core::Device;
use rand::{Rng, SeedableRng};

use super::*;

const T1: RuleParams = RuleParams {
    temperature: 1.0,
    top_p: 1.0,
};

fn ln(ps: &[f64]) -> Vec<f32> {
    ps.iter().map(|p| p.ln() as f32).collect()
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Logits with a realistic long tail: Gaussian with standard deviation `scale`.
fn gaussian_logits(rng: &mut impl Rng, v: usize, scale: f32) -> Vec<f32> {
    (0..v)
        .map(|_| {
            let (a, b): (f32, f32) = (rng.gen::<f32>().max(1e-9), rng.gen());
            scale * (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
        })
        .collect()
}

fn tok(logits: &[f32], rule: RuleParams, u: f64) -> u32 {
    draw(logits, rule, u).unwrap().token
}

#[test]
fn inverse_cdf_walks_token_ids_in_order() {
    let l = ln(&[0.1, 0.2, 0.3, 0.4]);
    let picks: Vec<u32> = [0.0, 0.05, 0.11, 0.29, 0.31, 0.59, 0.61, 0.999]
        .iter()
        .map(|&u| tok(&l, T1, u))
        .collect();
    assert_eq!(picks, [0, 0, 1, 1, 2, 2, 3, 3]);
    let d = draw(&l, T1, 0.5).unwrap();
    assert!((d.logprob - 0.3f32.ln()).abs() < 1e-6, "{d:?}");
}

#[test]
fn top_p_keeps_the_smallest_most_probable_set_and_all_ties() {
    let l = ln(&[0.1, 0.2, 0.3, 0.4]);
    let rule = RuleParams {
        temperature: 1.0,
        top_p: 0.6,
    };
    // Nucleus {2, 3} (0.4 + 0.3 ≥ 0.6), mass 0.7, in id order: 2 below 0.3/0.7, then 3.
    assert_eq!(tok(&l, rule, 0.0), 2);
    assert_eq!(tok(&l, rule, 0.42), 2);
    assert_eq!(tok(&l, rule, 0.43), 3);
    assert_eq!(tok(&l, rule, 0.999), 3);
    // The log-prob stays the full-vocabulary one.
    assert!((draw(&l, rule, 0.0).unwrap().logprob - 0.3f32.ln()).abs() < 1e-6);
    // Ties with the last token needed are all in: four equal tokens, top_p 0.3 → all four.
    let flat = ln(&[0.25; 4]);
    let rule = RuleParams {
        temperature: 1.0,
        top_p: 0.3,
    };
    let seen: std::collections::BTreeSet<u32> =
        (0..40).map(|k| tok(&flat, rule, k as f64 / 40.0)).collect();
    assert_eq!(seen.len(), 4);
}

#[test]
fn greedy_takes_the_first_maximum_and_temperature_scales() {
    let l = vec![1.0, 3.0, 3.0, 2.0];
    let g = RuleParams {
        temperature: 0.0,
        top_p: 1.0,
    };
    assert_eq!(tok(&l, g, 0.99), 1);
    // Low temperature concentrates the mass on the maxima.
    let cold = RuleParams {
        temperature: 0.05,
        top_p: 1.0,
    };
    assert!((0..20).all(|k| [1, 2].contains(&tok(&l, cold, (k as f64 + 0.5) / 20.0))));
}

#[test]
fn bad_logits_are_errors() {
    assert!(draw(&[0.0, f32::NAN], T1, 0.5).is_err());
    assert!(draw(&[0.0, f32::INFINITY], T1, 0.5).is_err());
    assert!(draw(&[f32::NEG_INFINITY; 3], T1, 0.5).is_err());
    assert!(draw(&[], T1, 0.5).is_err());
    // −∞ masks a token: never drawn.
    let l = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
    assert!((0..10).all(|k| tok(&l, T1, k as f64 / 10.0) == 1));
    assert!(draw_rows(&[0.0; 5], 2, T1, &[0.5, 0.5]).is_err());
}

/// The reference the quickselect must equal: a full sort.
fn threshold_by_sorting(e: &[f32], target: f64) -> f32 {
    let mut s = e.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    let mut cum = 0f64;
    for x in s {
        cum += f64::from(x);
        if cum >= target {
            return x;
        }
    }
    0.0
}

#[test]
fn quickselect_finds_the_same_threshold_as_a_full_sort() {
    let mut r = rng(1);
    let mut work = Vec::new();
    for case in 0..300 {
        let v = [3usize, 64, 65, 300, 5000, 20_000][case % 6];
        let scale = [0.5f32, 2.0, 6.0][case % 3];
        let l = gaussian_logits(&mut r, v, scale);
        let max = l.iter().copied().fold(f32::MIN, f32::max);
        let e: Vec<f32> = l.iter().map(|&x| (x - max).exp()).collect();
        let z: f64 = e.iter().map(|&x| f64::from(x)).sum();
        let top_p: f64 = r.gen_range(0.05..1.0);
        assert_eq!(
            nucleus_threshold(&e, top_p * z, &mut work),
            threshold_by_sorting(&e, top_p * z),
            "case {case}"
        );
    }
}

#[test]
fn the_libm_free_exp_is_accurate_and_zero_past_the_normal_range() {
    let mut worst = 0f64;
    for k in 0..=200_000 {
        let x = -87.0 * k as f32 / 200_000.0;
        let want = f64::from(x).exp();
        worst = worst.max((f64::from(exp_nonpos(x)) - want).abs() / want);
    }
    assert!(worst < 3e-7, "relative error {worst}");
    assert_eq!(exp_nonpos(0.0), 1.0);
    assert_eq!(exp_nonpos(-87.5), 0.0);
    assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
}

#[test]
fn rows_in_parallel_draw_exactly_what_one_row_at_a_time_draws() {
    let mut r = rng(2);
    let v = 40_000; // above the parallel threshold for 4 rows
    for top_p in [1.0, 0.9] {
        let rule = RuleParams {
            temperature: 1.2,
            top_p,
        };
        let logits: Vec<f32> = (0..4)
            .flat_map(|_| gaussian_logits(&mut r, v, 3.0))
            .collect();
        let us: Vec<f64> = (0..4).map(|_| r.gen()).collect();
        let rows = draw_rows(&logits, v, rule, &us).unwrap();
        for (i, d) in rows.iter().enumerate() {
            assert_eq!(*d, draw(&logits[i * v..(i + 1) * v], rule, us[i]).unwrap());
        }
    }
}

fn windows(
    logits: &[f32],
    v: usize,
    targets: &[u32],
    rule: RuleParams,
    m: Margins,
) -> Vec<TokenWindow> {
    let t = Tensor::from_vec(logits.to_vec(), (targets.len(), v), &Device::Cpu).unwrap();
    token_windows(&t, targets, rule, m).unwrap()
}

/// What the learner's check sees of an honest worker whose logits differ from its own by
/// `noise` (absolute, uniform per logit — another machine's rounding).
fn honest_pass_rate(rule: RuleParams, noise: f32, m: Margins, seed: u64) -> (usize, usize) {
    let mut r = rng(seed);
    let v = 300;
    let (mut passed, mut total) = (0, 0);
    for _ in 0..200 {
        let learner = gaussian_logits(&mut r, v, 2.5);
        let worker: Vec<f32> = learner
            .iter()
            .map(|&x| x + noise * (2.0 * r.gen::<f32>() - 1.0))
            .collect();
        let u: f64 = r.gen();
        let d = draw(&worker, rule, u).unwrap();
        let w = windows(&learner, v, &[d.token], rule, m)[0];
        passed += usize::from(w.admits(u));
        total += 1;
    }
    (passed, total)
}

#[test]
fn honest_tokens_pass_on_the_same_and_on_slightly_different_logits() {
    for top_p in [1.0, 0.9, 0.5] {
        let rule = RuleParams {
            temperature: 1.0,
            top_p,
        };
        // Same logits: the f32 sampler against the f64 check, a hair of margin.
        let (p, n) = honest_pass_rate(rule, 0.0, Margins::new(1e-5, 1e-6), 3);
        assert_eq!(p, n, "top_p {top_p}");
        // Logits within ±0.01 (log-prob error ≤ 0.02): margins of that size.
        let (p, n) = honest_pass_rate(rule, 0.01, Margins::new(0.025, 0.02), 4);
        assert_eq!(p, n, "top_p {top_p}");
    }
}

/// The nucleus edge: a distribution whose cumulative mass crosses `top_p` right at a token,
/// sampled on logits perturbed on either side of the edge. Every honest draw passes.
#[test]
fn honest_tokens_at_the_nucleus_edge_pass() {
    let mut r = rng(5);
    // 0.5, 0.3, 0.2 − ε, … : with top_p = 0.8 the third token is in or out by a hair.
    let rule = RuleParams {
        temperature: 1.0,
        top_p: 0.8,
    };
    let m = Margins::new(2e-3, 2e-3);
    let mut in_and_out = [0usize; 2];
    for k in 0..400 {
        let eps = 1e-4 * (k % 5) as f64;
        let ps = [0.3, 0.5, 0.1 - eps, 0.1 + eps];
        let learner = ln(&ps);
        let worker: Vec<f32> = learner
            .iter()
            .map(|&x| x + 5e-4 * (2.0 * r.gen::<f32>() - 1.0))
            .collect();
        let u: f64 = r.gen();
        let d = draw(&worker, rule, u).unwrap();
        in_and_out[usize::from(d.token >= 2)] += 1;
        let w = windows(&learner, 4, &[d.token], rule, m)[0];
        assert!(w.admits(u), "k {k}: {d:?} u {u} {w:?}");
    }
    // Both sides of the edge were exercised: tokens 2/3 drawn sometimes, not always.
    assert!(in_and_out[0] > 0 && in_and_out[1] > 0, "{in_and_out:?}");
}

#[test]
fn a_forced_token_is_refused_unless_its_uniform_happens_to_fall_on_it() {
    let mut r = rng(6);
    let v = 300;
    let m = Margins::new(1e-3, 1e-3);
    let (mut survived, mut forced, mut p_sum) = (0usize, 0usize, 0f64);
    for _ in 0..2000 {
        let l = gaussian_logits(&mut r, v, 2.5);
        let u: f64 = r.gen();
        let honest = tok(&l, T1, u);
        // The forger writes the token it wants: here the most probable one.
        let want = l
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
        if want == honest {
            continue;
        }
        forced += 1;
        let w = windows(&l, v, &[want], T1, m)[0];
        survived += usize::from(w.admits(u));
        p_sum += w.p;
    }
    // It survives only where u falls in its window widened by 2δ: about p + 2δ (never here,
    // since the honest draw with this u was another token, except within the margin).
    let bound = 2.0 * m.delta * forced as f64 + 1.0;
    assert!(
        (survived as f64) <= bound,
        "{survived} of {forced} survived (mean p {})",
        p_sum / forced as f64
    );
}

#[test]
fn a_token_outside_every_honest_nucleus_is_refused_whatever_its_uniform() {
    let l = ln(&[0.6, 0.3, 0.05, 0.05]);
    let rule = RuleParams {
        temperature: 1.0,
        top_p: 0.8,
    };
    let two = [l.clone(), l.clone()].concat();
    let w = windows(&two, 4, &[2, 0], rule, Margins::new(1e-3, 1e-3));
    assert!(!w[0].in_nucleus && !w[0].admits(0.95) && w[0].excess(0.95).is_infinite());
    // The most probable token is in; its window is [0, 0.6/0.9] widened by the margins.
    assert!(w[1].in_nucleus && w[1].admits(0.0) && w[1].admits(0.66) && !w[1].admits(0.7));
    // Greedy: only (near-)maxima pass.
    let g = RuleParams {
        temperature: 0.0,
        top_p: 1.0,
    };
    let w = windows(&two, 4, &[0, 1], g, Margins::new(1e-3, 1e-3));
    assert!(w[0].admits(0.3) && !w[1].admits(0.3));
}

#[test]
fn windows_check_their_inputs() {
    let t = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
    assert!(token_windows(&t, &[0], T1, Margins::new(0.0, 0.0)).is_err());
    assert!(token_windows(&t, &[0, 4], T1, Margins::new(0.0, 0.0)).is_err());
    // Many rows (more than one chunk) come back in order.
    let mut r = rng(7);
    let v = 50;
    let n = 3 * WINDOW_CHUNK_ROWS + 5;
    let l: Vec<f32> = (0..n)
        .flat_map(|_| gaussian_logits(&mut r, v, 2.0))
        .collect();
    let targets: Vec<u32> = (0..n).map(|i| (i % v) as u32).collect();
    let all = windows(&l, v, &targets, T1, Margins::new(0.0, 0.0));
    for i in [0, WINDOW_CHUNK_ROWS, n - 1] {
        let one = windows(
            &l[i * v..(i + 1) * v],
            v,
            &targets[i..=i],
            T1,
            Margins::new(0.0, 0.0),
        );
        assert_eq!(all[i], one[0]);
    }
}
