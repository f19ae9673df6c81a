use candle_core::{Device, Var};

use super::*;

fn t2(rows: &[&[f64]]) -> Tensor {
    let g = rows.len();
    let t = rows[0].len();
    let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (g, t), &Device::Cpu).unwrap()
}

fn t1(xs: &[f64]) -> Tensor {
    Tensor::from_vec(xs.to_vec(), xs.len(), &Device::Cpu).unwrap()
}

fn cfg(objective: Objective) -> LossConfig {
    LossConfig {
        objective,
        clip_eps: 0.2,
        gepo_defensive_eps: None,
        kl_beta: 0.0,
    }
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn advantages_are_group_normalised() {
    // mean 0.5, unbiased std sqrt(1/3) = 0.57735 → ±0.5/0.57745 = ±0.86588
    let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], true);
    for (x, s) in a.iter().zip([1.0, -1.0, -1.0, 1.0]) {
        assert!(
            close(
                f64::from(*x),
                s * 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-4),
                1e-5
            ),
            "{a:?}"
        );
    }
    assert_eq!(
        group_advantages(&[1.0, 0.0, 0.0, 1.0], false),
        [0.5, -0.5, -0.5, 0.5]
    );
    // Equal rewards: exactly zero, flagged for dropping.
    let z = group_advantages(&[0.1, 0.1, 0.1], true);
    assert!(is_zero_advantage(&z));
    assert!(!is_zero_advantage(&a));
    assert!(group_advantages(&[], true).is_empty());
}

#[test]
fn grpo_matches_a_hand_computed_value_including_a_clipped_token() {
    // Token ratios: [[e^0.1, e^0.5], [1, e^-0.1]]; A = [1, -1]; ε = 0.2.
    // seq 0 (A=1): min(c, clip(c)) = [1.105171, 1.2] → loss tokens [-1.105171, -1.2] → mean -1.1525855
    // seq 1 (A=-1): min(-c, -clip(c)) = [-1, -0.904837] → loss [1, 0.904837] → mean 0.9524185
    // group: (-1.1525855 + 0.9524185) / 2 = -0.1000835
    let lp = t2(&[&[-1.0, -1.5], &[-0.5, -1.0]]);
    let sp = t2(&[&[-1.1, -2.0], &[-0.5, -0.9]]);
    let mask = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let adv = t1(&[1.0, -1.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    let out = group_loss(&cfg(Objective::Grpo), &g).unwrap();
    assert!(
        close(scalar(&out.loss), -0.1000835, 1e-6),
        "{}",
        scalar(&out.loss)
    );
    assert!(
        close(out.clip_fraction, 0.25, 1e-12),
        "one token of four clipped"
    );
    // Dr.GRPO: token sum / (G·T) = (-1.105171 - 1.2 + 1 + 0.904837) / 4 = -0.1000835 here too
    // (equal lengths); with a padded token the two differ:
    let mask2 = t2(&[&[1.0, 0.0], &[1.0, 1.0]]);
    let g2 = GroupInput { mask: &mask2, ..g };
    let grpo = scalar(&group_loss(&cfg(Objective::Grpo), &g2).unwrap().loss);
    let dr = scalar(&group_loss(&cfg(Objective::DrGrpo), &g2).unwrap().loss);
    // GRPO: (-1.105171 + 0.9524185) / 2 = -0.07637625; Dr.GRPO: (-1.105171 + 1.904837) / 4 = 0.1999165
    assert!(close(grpo, -0.07637625, 1e-6), "{grpo}");
    assert!(close(dr, 0.1999165, 1e-6), "{dr}");
}

#[test]
fn gspo_uses_the_geometric_mean_ratio() {
    // seq 0: mean delta = (0.1 + 0.5)/2 = 0.3 → c = e^0.3 = 1.349859 → clipped to 1.2 (A=1) → -1.2
    // seq 1: mean delta = (0 − 0.1)/2 = −0.05 → c = 0.951229 (A=-1) → +0.951229
    let lp = t2(&[&[-1.0, -1.5], &[-0.5, -1.0]]);
    let sp = t2(&[&[-1.1, -2.0], &[-0.5, -0.9]]);
    let mask = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let adv = t1(&[1.0, -1.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    let out = group_loss(&cfg(Objective::Gspo), &g).unwrap();
    assert!(
        close(scalar(&out.loss), (-1.2 + 0.951229) / 2.0, 1e-6),
        "{}",
        scalar(&out.loss)
    );
    assert!(close(out.coefficients[0], 0.3f64.exp(), 1e-9));
}

/// GEPO's coefficient computed exactly as Listing 1 of `002_…` (in plain f64).
fn listing_1(learner_seq_p: &[f64], sampler_seq_p: &[f64]) -> Vec<f64> {
    let sum: f64 = sampler_seq_p.iter().sum();
    let normalized_q: Vec<f64> = sampler_seq_p.iter().map(|q| q / sum).collect();
    let denom: f64 = normalized_q
        .iter()
        .zip(sampler_seq_p)
        .map(|(n, q)| n * q)
        .sum();
    learner_seq_p.iter().map(|p| p / denom).collect()
}

#[test]
fn gepo_coefficient_equals_listing_1_and_is_not_one_on_policy() {
    let lp = t2(&[&[-0.2, -0.4, 0.0], &[-1.0, -0.6, -0.8], &[-0.1, -0.3, -0.5]]);
    let sp = t2(&[&[-0.3, -0.4, 0.0], &[-0.9, -0.7, -0.8], &[-0.1, -0.2, -0.6]]);
    let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0]]);
    let adv = t1(&[1.0, -0.5, -0.5]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    // eq. 35: length-normalised sequence probabilities
    let seq_p = |rows: &[&[f64]], lens: &[f64]| -> Vec<f64> {
        rows.iter()
            .zip(lens)
            .map(|(r, n)| (r.iter().take(*n as usize).sum::<f64>() / n).exp())
            .collect()
    };
    let lens = [2.0, 3.0, 3.0];
    let p = seq_p(
        &[&[-0.2, -0.4], &[-1.0, -0.6, -0.8], &[-0.1, -0.3, -0.5]],
        &lens,
    );
    let q = seq_p(
        &[&[-0.3, -0.4], &[-0.9, -0.7, -0.8], &[-0.1, -0.2, -0.6]],
        &lens,
    );
    let want = listing_1(&p, &q);
    let c = importance_coefficients(&cfg(Objective::Gepo), &g).unwrap();
    let got: Vec<f64> = c.flatten_all().unwrap().to_vec1().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!(close(*a, *b, 1e-12), "{got:?} vs {want:?}");
    }
    // On-policy (p = q) the weight is p_i / Ê_q[q], not 1.
    let on = GroupInput {
        learner_logp: &sp,
        ..g
    };
    let c: Vec<f64> = importance_coefficients(&cfg(Objective::Gepo), &on)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let want_on = listing_1(&q, &q);
    assert!(c.iter().zip(&want_on).all(|(a, b)| close(*a, *b, 1e-12)));
    assert!(c.iter().any(|x| (x - 1.0).abs() > 1e-3), "{c:?}");
    // Defensive sampling, eq. 37: c = p / (ε p + (1−ε) Ê_q)
    let mut d = cfg(Objective::Gepo);
    d.gepo_defensive_eps = Some(0.25);
    let c: Vec<f64> = importance_coefficients(&d, &g)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let e_q = q.iter().map(|x| x * x).sum::<f64>() / q.iter().sum::<f64>();
    for (i, ci) in c.iter().enumerate() {
        assert!(close(*ci, p[i] / (0.25 * p[i] + 0.75 * e_q), 1e-12));
    }
}

/// Gradients from candle's autograd against central finite differences, for every objective,
/// with the KL term on, at points away from the clip boundaries.
#[test]
fn gradients_match_finite_differences() {
    let lp0 = [[-0.7, -1.2, -0.4], [-0.9, -0.3, -1.1], [-0.5, -0.8, -0.6]];
    let sp = t2(&[
        &[-0.75, -1.15, -0.45],
        &[-0.85, -0.33, -1.05],
        &[-0.52, -0.79, -0.58],
    ]);
    let rp = t2(&[
        &[-0.6, -1.3, -0.5],
        &[-1.0, -0.2, -1.0],
        &[-0.4, -0.9, -0.7],
    ]);
    let mask = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0]]);
    let adv = t1(&[0.9, -1.1, 0.2]);
    for objective in [
        Objective::Grpo,
        Objective::DrGrpo,
        Objective::Gspo,
        Objective::Gepo,
    ] {
        // Defensive GEPO stops the gradient through part of its denominator, so finite
        // differences do not apply to it; see `defensive_gepo_at_eps_one_is_the_policy_gradient`.
        for defensive in [None] {
            let c = LossConfig {
                objective,
                clip_eps: 0.2,
                gepo_defensive_eps: defensive,
                kl_beta: 0.05,
            };
            let loss_at = |vals: &[[f64; 3]; 3]| -> f64 {
                let lp = t2(&[&vals[0], &vals[1], &vals[2]]);
                let g = GroupInput {
                    learner_logp: &lp,
                    sampler_logp: &sp,
                    mask: &mask,
                    advantages: &adv,
                    ref_logp: Some(&rp),
                };
                scalar(&group_loss(&c, &g).unwrap().loss)
            };
            let var = Var::from_tensor(&t2(&[&lp0[0], &lp0[1], &lp0[2]])).unwrap();
            let g = GroupInput {
                learner_logp: var.as_tensor(),
                sampler_logp: &sp,
                mask: &mask,
                advantages: &adv,
                ref_logp: Some(&rp),
            };
            let out = group_loss(&c, &g).unwrap();
            assert_eq!(
                out.clip_fraction, 0.0,
                "{objective:?}: test point must avoid clipping"
            );
            let grads = out.loss.backward().unwrap();
            let grad: Vec<Vec<f64>> = grads.get(var.as_tensor()).unwrap().to_vec2().unwrap();
            let h = 1e-6;
            for i in 0..3 {
                for t in 0..3 {
                    let mut up = lp0;
                    up[i][t] += h;
                    let mut down = lp0;
                    down[i][t] -= h;
                    let fd = (loss_at(&up) - loss_at(&down)) / (2.0 * h);
                    assert!(
                        (grad[i][t] - fd).abs() < 1e-6,
                        "{objective:?} {defensive:?} d/dlp[{i}][{t}]: autograd {} vs fd {fd}",
                        grad[i][t]
                    );
                }
            }
            // Masked positions get no gradient.
            assert_eq!(grad[1][2], 0.0);
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let lp = t2(&[&[-1.0, -1.0]]);
    let sp = t2(&[&[-1.0, -1.0, -1.0]]);
    let mask = t2(&[&[1.0, 1.0]]);
    let adv = t1(&[1.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    assert!(group_loss(&cfg(Objective::Grpo), &g).is_err());
    let sp = t2(&[&[-1.0, -1.0]]);
    let adv2 = t1(&[1.0, 2.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv2,
        ref_logp: None,
    };
    assert!(group_loss(&cfg(Objective::Grpo), &g).is_err());
    let mut k = cfg(Objective::Grpo);
    k.kl_beta = 0.1;
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    assert!(
        group_loss(&k, &g).is_err(),
        "KL without reference log-probs"
    );
    assert!("ppo".parse::<Objective>().is_err());
    assert_eq!("dr_grpo".parse::<Objective>().unwrap(), Objective::DrGrpo);
}

/// GEPO App. F: with ε = 1 the defensive weight is p / sg(p) = 1 and its gradient is the plain
/// policy gradient: ∂ℓ/∂log p_{i,t} = −A_i / (G·|y_i|) for the sequence-mean aggregation.
#[test]
fn defensive_gepo_at_eps_one_is_the_policy_gradient() {
    let lp = Var::from_tensor(&t2(&[&[-0.7, -1.2, -0.4], &[-0.9, -0.3, -1.1]])).unwrap();
    let sp = t2(&[&[-0.2, -2.2, -0.1], &[-1.9, -0.1, -3.1]]);
    let mask = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
    let adv = t1(&[0.8, -1.3]);
    let c = LossConfig {
        objective: Objective::Gepo,
        clip_eps: 0.2,
        gepo_defensive_eps: Some(1.0),
        kl_beta: 0.0,
    };
    let g = GroupInput {
        learner_logp: lp.as_tensor(),
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    let out = group_loss(&c, &g).unwrap();
    assert!(
        out.coefficients.iter().all(|c| close(*c, 1.0, 1e-12)),
        "{:?}",
        out.coefficients
    );
    let grad: Vec<Vec<f64>> = out
        .loss
        .backward()
        .unwrap()
        .get(lp.as_tensor())
        .unwrap()
        .to_vec2()
        .unwrap();
    let want = [
        [-0.8 / (2.0 * 3.0); 3],
        [1.3 / (2.0 * 2.0), 1.3 / (2.0 * 2.0), 0.0],
    ];
    for i in 0..2 {
        for t in 0..3 {
            assert!(
                close(grad[i][t], want[i][t], 1e-9),
                "[{i}][{t}] {} vs {}",
                grad[i][t],
                want[i][t]
            );
        }
    }
}
