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
        is_cap: None,
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

/// GEPO's coefficient computed exactly as Listing 1 of the GEPO paper (in plain f64).
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
                is_cap: None,
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
        is_cap: None,
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

fn capped(objective: Objective, cap: f64) -> LossConfig {
    LossConfig {
        is_cap: Some(cap),
        ..cfg(objective)
    }
}

/// Loss and its gradient with respect to the learner log-probs.
fn loss_and_grad(c: &LossConfig, lp: &Tensor, g: &GroupInput<'_>) -> (f64, Vec<Vec<f64>>) {
    let var = Var::from_tensor(lp).unwrap();
    let g = GroupInput {
        learner_logp: var.as_tensor(),
        ..*g
    };
    let out = group_loss(c, &g).unwrap();
    let grad = out
        .loss
        .backward()
        .unwrap()
        .get(var.as_tensor())
        .unwrap()
        .to_vec2()
        .unwrap();
    (scalar(&out.loss), grad)
}

/// ECHO-2 eq. 24 where the cap binds: the coefficient's value is C and its gradient
/// `C · ∇ log c` (the truncated ratio is a constant, so the gradient does not vanish).
#[test]
fn truncated_ratio_matches_hand_computed_values_where_the_cap_binds() {
    // Token ratios [[e^0.1, e^0.5], [1, e^-0.1]] = [[1.105171, 1.648721], [1, 0.904837]];
    // A = [-1, 1]; ε = 0.2; C = 1.5 binds on token [0][1] only.
    let lp = t2(&[&[-1.0, -1.5], &[-0.5, -1.0]]);
    let sp = t2(&[&[-1.1, -2.0], &[-0.5, -0.9]]);
    let mask = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let adv = t1(&[-1.0, 1.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    // GRPO. seq 0 (A=-1): ℓ = max(c̃, clip(c̃)) = [1.105171, max(1.5, 1.2) = 1.5] → mean 1.3025855
    // seq 1 (A=1): ℓ = -min(c, clip(c)) = [-1, -0.904837] → mean -0.9524185
    // group: (1.3025855 - 0.9524185) / 2 = 0.1750835 (uncapped: token [0][1] gives 1.648721 and
    // the loss is 0.21226375).
    let (loss, grad) = loss_and_grad(&capped(Objective::Grpo, 1.5), &lp, &g);
    assert!(close(loss, 0.1750835, 1e-6), "{loss}");
    let (uncapped, _) = loss_and_grad(&cfg(Objective::Grpo), &lp, &g);
    assert!(close(uncapped, 0.21226375, 1e-6), "{uncapped}");
    // loss = ¼(c̃00 + c̃01 − c̃10 − c̃11); ∂c̃/∂log p = c̃ (= C where capped).
    let want = [
        [0.1f64.exp() / 4.0, 1.5 / 4.0],
        [-0.25, -(-0.1f64).exp() / 4.0],
    ];
    for i in 0..2 {
        for t in 0..2 {
            assert!(
                close(grad[i][t], want[i][t], 1e-9),
                "GRPO [{i}][{t}] {} vs {}",
                grad[i][t],
                want[i][t]
            );
        }
    }
    // The reported coefficients are the untruncated ones (drift metric), the clip fraction
    // counts the truncated coefficient: 1.5 is outside [0.8, 1.2].
    let out = group_loss(&capped(Objective::Grpo, 1.5), &g).unwrap();
    assert!(close(
        out.coefficients[0],
        (0.1f64.exp() + 0.5f64.exp()) / 2.0,
        1e-9
    ));
    assert!(close(out.clip_fraction, 0.25, 1e-12));

    // GSPO, C = 1.25: seq 0 c = e^0.3 = 1.349859 → c̃ = 1.25, ℓ = max(1.25, 1.2) = 1.25;
    // seq 1 c = e^-0.05 = 0.951229 (A=1) → ℓ = -0.951229; loss (1.25 - 0.951229)/2 = 0.1493855.
    // ∂loss/∂log p_{0,t} = ½ · C · 1/|y_0| = 0.3125; ∂loss/∂log p_{1,t} = -½ · c_1 / 2.
    let (loss, grad) = loss_and_grad(&capped(Objective::Gspo, 1.25), &lp, &g);
    assert!(close(loss, 0.1493855, 1e-6), "{loss}");
    let c1 = (-0.05f64).exp();
    let want = [[0.3125, 0.3125], [-c1 / 4.0, -c1 / 4.0]];
    for i in 0..2 {
        for t in 0..2 {
            assert!(
                close(grad[i][t], want[i][t], 1e-9),
                "GSPO [{i}][{t}] {} vs {}",
                grad[i][t],
                want[i][t]
            );
        }
    }
}

/// Where no coefficient exceeds C the truncation changes nothing: same loss, same gradient.
#[test]
fn truncated_ratio_is_the_uncapped_loss_where_the_cap_does_not_bind() {
    let lp = t2(&[&[-1.0, -1.5], &[-0.5, -1.0]]);
    let sp = t2(&[&[-1.1, -2.0], &[-0.5, -0.9]]);
    let mask = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let adv = t1(&[-1.0, 1.0]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    // Hand value (GRPO, largest ratio e^0.5 = 1.648721 < C = 1.7): 0.21226375, as uncapped.
    let (loss, grad) = loss_and_grad(&capped(Objective::Grpo, 1.7), &lp, &g);
    assert!(close(loss, 0.21226375, 1e-6), "{loss}");
    let want = [
        [0.1f64.exp() / 4.0, 0.5f64.exp() / 4.0],
        [-0.25, -(-0.1f64).exp() / 4.0],
    ];
    for i in 0..2 {
        for t in 0..2 {
            assert!(close(grad[i][t], want[i][t], 1e-9), "[{i}][{t}]");
        }
    }
    for objective in [
        Objective::Grpo,
        Objective::DrGrpo,
        Objective::Gspo,
        Objective::Gepo,
    ] {
        let (l0, g0) = loss_and_grad(&cfg(objective), &lp, &g);
        let (l1, g1) = loss_and_grad(&capped(objective, 1.7), &lp, &g);
        assert!(close(l1, l0, 1e-12), "{objective:?}: {l1} vs {l0}");
        for (r0, r1) in g0.iter().zip(&g1) {
            for (a, b) in r0.iter().zip(r1) {
                assert!(close(*b, *a, 1e-12), "{objective:?}: {g1:?} vs {g0:?}");
            }
        }
    }
}

/// Plain-f64 reference of the capped objective with the truncated ratio frozen at `lp0`
/// (eq. 24: `min(c(θ_old), C) · c(θ)/c(θ_old)`), ε = 0.2, no KL.
fn reference_capped_loss(
    objective: Objective,
    lp: &[[f64; 3]; 3],
    lp0: &[[f64; 3]; 3],
    sp: &[[f64; 3]; 3],
    mask: &[[f64; 3]; 3],
    adv: &[f64; 3],
    cap: f64,
) -> f64 {
    let eps = 0.2;
    let lens: Vec<f64> = mask
        .iter()
        .map(|m| m.iter().sum::<f64>().max(1.0))
        .collect();
    let seq_p = |x: &[[f64; 3]; 3]| -> Vec<f64> {
        (0..3)
            .map(|i| ((0..3).map(|t| x[i][t] * mask[i][t]).sum::<f64>() / lens[i]).exp())
            .collect()
    };
    let coef = |x: &[[f64; 3]; 3]| -> [[f64; 3]; 3] {
        let mut c = [[0.0; 3]; 3];
        match objective {
            Objective::Grpo | Objective::DrGrpo => {
                for i in 0..3 {
                    for t in 0..3 {
                        c[i][t] = (x[i][t] - sp[i][t]).exp();
                    }
                }
            }
            Objective::Gspo => {
                let (p, q) = (seq_p(x), seq_p(sp));
                for i in 0..3 {
                    c[i] = [p[i] / q[i]; 3];
                }
            }
            Objective::Gepo => {
                let w = listing_1(&seq_p(x), &seq_p(sp));
                for i in 0..3 {
                    c[i] = [w[i]; 3];
                }
            }
        }
        c
    };
    let (c, c0) = (coef(lp), coef(lp0));
    let mut loss = 0.0;
    for i in 0..3 {
        let mut sum = 0.0;
        for t in 0..3 {
            let ct = c0[i][t].min(cap) * c[i][t] / c0[i][t];
            let l = -(ct * adv[i]).min(ct.clamp(1.0 - eps, 1.0 + eps) * adv[i]);
            sum += l * mask[i][t];
        }
        loss += match objective {
            Objective::DrGrpo => sum / 9.0,
            _ => sum / lens[i] / 3.0,
        };
    }
    loss
}

/// With the cap binding on some coefficients of every objective, the loss equals the plain
/// reference and autograd equals central finite differences of the reference with the
/// truncated ratio held constant (it is evaluated at θ_old, eq. 24).
#[test]
fn truncated_ratio_gradients_match_finite_differences() {
    let lp0 = [[-0.7, -1.2, -0.4], [-0.9, -0.3, -1.1], [-0.5, -0.8, -0.6]];
    let sp0 = [
        [-0.95, -1.15, -0.45],
        [-0.85, -0.63, -1.05],
        [-0.72, -0.79, -0.58],
    ];
    let mask0 = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]];
    let adv0 = [0.9, -1.1, 0.2];
    let cap = 1.1;
    let sp = t2(&[&sp0[0], &sp0[1], &sp0[2]]);
    let mask = t2(&[&mask0[0], &mask0[1], &mask0[2]]);
    let adv = t1(&adv0);
    let lp = t2(&[&lp0[0], &lp0[1], &lp0[2]]);
    let g = GroupInput {
        learner_logp: &lp,
        sampler_logp: &sp,
        mask: &mask,
        advantages: &adv,
        ref_logp: None,
    };
    for objective in [
        Objective::Grpo,
        Objective::DrGrpo,
        Objective::Gspo,
        Objective::Gepo,
    ] {
        let c = capped(objective, cap);
        // The test point: the cap binds somewhere, no coefficient sits at the cap, and after
        // truncation nothing is clipped.
        let raw: Vec<f64> = importance_coefficients(&cfg(objective), &g)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(
            raw.iter().any(|x| *x > cap + 1e-2),
            "{objective:?}: {raw:?}"
        );
        assert!(raw.iter().all(|x| (x - cap).abs() > 1e-2), "{raw:?}");
        let trunc: Vec<f64> = importance_coefficients(&c, &g)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (r, t) in raw.iter().zip(&trunc) {
            assert!(close(*t, r.min(cap), 1e-12), "{objective:?}: {trunc:?}");
        }
        assert_eq!(group_loss(&c, &g).unwrap().clip_fraction, 0.0);

        let (loss, grad) = loss_and_grad(&c, &lp, &g);
        let reference =
            |x: &[[f64; 3]; 3]| reference_capped_loss(objective, x, &lp0, &sp0, &mask0, &adv0, cap);
        assert!(
            close(loss, reference(&lp0), 1e-12),
            "{objective:?}: {loss} vs {}",
            reference(&lp0)
        );
        let (uncapped, _) = loss_and_grad(&cfg(objective), &lp, &g);
        assert!(
            (loss - uncapped).abs() > 1e-3,
            "{objective:?}: cap must bind"
        );
        let h = 1e-6;
        for i in 0..3 {
            for t in 0..3 {
                let mut up = lp0;
                up[i][t] += h;
                let mut down = lp0;
                down[i][t] -= h;
                let fd = (reference(&up) - reference(&down)) / (2.0 * h);
                assert!(
                    (grad[i][t] - fd).abs() < 1e-6,
                    "{objective:?} d/dlp[{i}][{t}]: autograd {} vs fd {fd}",
                    grad[i][t]
                );
            }
        }
        assert_eq!(grad[1][2], 0.0, "masked positions get no gradient");
    }
}

#[test]
fn truncated_ratio_cap_is_validated_and_old_configs_load() {
    let mut tc = crate::TrainerConfig::default();
    assert!(tc.validate().is_ok());
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        tc.loss.is_cap = Some(bad);
        assert!(tc.validate().is_err(), "is_cap = {bad} accepted");
    }
    tc.loss.is_cap = Some(2.0);
    assert!(tc.validate().is_ok());
    // A LossConfig serialised before `is_cap` existed (e.g. in an old trainer.json) loads as
    // `None`; a set cap round-trips.
    let old = r#"{"objective":"grpo","clip_eps":0.2,"gepo_defensive_eps":null,"kl_beta":0.0}"#;
    let c: LossConfig = serde_json::from_str(old).unwrap();
    assert_eq!(c.is_cap, None);
    let c = capped(Objective::Gepo, 2.0);
    let back: LossConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}
