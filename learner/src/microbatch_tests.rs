//! Micro-batching: the pass plan, and gradients against one single batch.

use candle_core::{Device, Tensor};
use policy::{GenerationPath, ModelConfig, Policy, SamplingParams};
use rand::SeedableRng;
use storage::{Sample, TrajectoryGroup};

use super::*;
use crate::loss::{group_advantages, LossConfig, Objective};
use crate::trainer::TrainerConfig;
use crate::AdamWConfig;

#[test]
fn plan_packs_groups_in_order_within_the_budget() {
    use Pass::*;
    // (rows, padded length): 40, 40, 80, 20 tokens.
    let shapes = [(4, 10), (4, 10), (8, 10), (2, 10)];
    assert_eq!(plan(&shapes, 0), vec![Groups(0..4)]);
    assert_eq!(plan(&shapes, 180), vec![Groups(0..4)]);
    assert_eq!(
        plan(&shapes, 80),
        vec![Groups(0..2), Groups(2..3), Groups(3..4)]
    );
    // Over the budget alone: split into chunks of budget / length rows.
    assert_eq!(
        plan(&shapes, 48),
        vec![
            Groups(0..1),
            Groups(1..2),
            Split { group: 2, rows: 4 },
            Groups(3..4)
        ]
    );
    // A single row longer than the budget still goes, one row at a time.
    assert_eq!(plan(&[(3, 50)], 20), vec![Split { group: 0, rows: 1 }]);
    // The pass is as long as its longest group: 2·10 + 2·30 would be 80, but 4 rows × 30 = 120.
    assert_eq!(
        plan(&[(2, 10), (2, 30)], 100),
        vec![Groups(0..1), Groups(1..2)]
    );
    assert_eq!(plan(&[], 10), vec![Groups(0..0)]);
}

#[test]
fn the_largest_pass_is_the_plans_biggest_in_padded_tokens() {
    // Groups of rows × (prompt + response − 1): 4 × 9 and 8 × 9 padded tokens.
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut group =
        |rows: usize| crate::test_util::synthetic_groups(&mut rng, 1, rows, 4, 6, 300, 0);
    let groups = [group(4), group(8)].concat();
    assert_eq!(largest_pass(&groups, 0), (108, 9), "one pass of 12 rows");
    assert_eq!(largest_pass(&groups, 80), (72, 9), "the 8-row group alone");
    assert_eq!(
        largest_pass(&groups, 40),
        (36, 9),
        "4-row passes, the second split"
    );
    assert_eq!(largest_pass(&[], 40), (0, 0));
}

const T: f32 = 0.9;

fn policy() -> Policy {
    let cfg = ModelConfig {
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        max_position_embeddings: 64,
        ..ModelConfig::tiny()
    };
    Policy::new_random(&cfg, 11, &Device::Cpu).unwrap()
}

/// `n` real samples of `p` (responses of different lengths, some stopped early), rewards
/// spread over [0, 1], sampler log-probs shifted so that ratios are not 1.
fn group(p: &Policy, seed: u64, n: usize) -> TrajectoryGroup {
    let prompt: Vec<u32> = vec![257, 49 + (seed % 9) as u32, 43, 50 + seed as u32 % 3, 259];
    let mut params = SamplingParams::new(6, vec![258, 50]);
    params.temperature = T;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let outs = policy::generate(p, &prompt, n, &params, GenerationPath::Batched, &mut rng).unwrap();
    let samples = outs
        .into_iter()
        .enumerate()
        .map(|(k, c)| Sample {
            trajectory_id: [
                seed as u8, k as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
            ],
            loss_mask: vec![1; c.tokens.len()],
            response_text: String::new(),
            reward: ((k * 7 + seed as usize) % 5) as f32 / 4.0,
            sampler_logprobs: c.logprobs.iter().map(|l| l - 0.05 * k as f32).collect(),
            response_tokens: c.tokens,
            finished_unix_ms: 0,
        })
        .collect();
    TrajectoryGroup {
        group_id: [seed as u8; 16],
        task_id: "test".into(),
        prompt_id: format!("p{seed}"),
        version: 0,
        seq: seed,
        producer: "test".into(),
        prompt_text: String::new(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples,
        signature: None,
    }
}

fn trainer(budget: usize) -> Trainer {
    let cfg = TrainerConfig {
        loss: LossConfig {
            objective: Objective::Gepo,
            kl_beta: 0.05,
            ..LossConfig::default()
        },
        optim: AdamWConfig::default(),
        temperature: T,
        staleness: 0,
        kappa: None,
        groups_per_step: 4,
        group_size: 4,
        micro_batch_tokens: budget,
        ..TrainerConfig::default()
    };
    Trainer::new(policy(), cfg).unwrap()
}

/// The pre-micro-batching computation, written out: every group's log-probs in one forward,
/// the mean of the group objectives, one backward.
fn single_batch_reference(t: &Trainer, used: &[Used<'_>]) -> candle_core::backprop::GradStore {
    let pairs: Vec<(&[u32], &[u32])> = used
        .iter()
        .flat_map(|(g, _)| g.samples.iter().map(|s| pair(g, s)))
        .collect();
    let (lp, _) = policy::batch_response_logprobs(&t.policy, &pairs, T).unwrap();
    let reference = t.reference.as_ref().unwrap();
    let (rl, _) = policy::batch_response_logprobs(reference, &pairs, T).unwrap();
    let mut losses = Vec::new();
    let mut row = 0;
    for (g, adv) in used {
        let n = g.samples.len();
        let r = rl.narrow(0, row, n).unwrap().detach();
        let p = lp.narrow(0, row, n).unwrap();
        losses.push(t.group_objective(g, adv, &p, Some(&r)).unwrap().0);
        row += n;
    }
    Tensor::stack(&losses, 0)
        .unwrap()
        .mean_all()
        .unwrap()
        .backward()
        .unwrap()
}

fn grads_of(t: &Trainer, g: &candle_core::backprop::GradStore) -> Vec<(String, Vec<f32>)> {
    t.policy
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(name, v)| {
            let x = g.get(v.as_tensor()).expect("every variable has a gradient");
            (name, x.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        })
        .collect()
}

/// One pass is the single batch bit for bit. Passes of whole groups, and groups split by
/// rows (through the log-prob chain rule), give the same gradient up to summation order:
/// every component within 1e-5 of the largest (observed: ≤ 9e-7).
#[test]
fn micro_batched_gradients_match_the_single_batch() {
    let p = policy();
    // 4-row groups of ~10 padded tokens each and one 8-row group.
    let groups = [
        group(&p, 1, 4),
        group(&p, 2, 4),
        group(&p, 3, 8),
        group(&p, 4, 4),
    ];
    let used: Vec<Used<'_>> = groups
        .iter()
        .map(|g| {
            let r: Vec<f32> = g.samples.iter().map(|s| s.reward).collect();
            (g, group_advantages(&r, true))
        })
        .collect();
    let all: Vec<usize> = (0..used.len()).collect();
    let single = trainer(0);
    let want = grads_of(&single, &single_batch_reference(&single, &used));
    let got = single.batch_gradient(&used, &all, all.len()).unwrap();
    assert_eq!(
        grads_of(&single, got.grads.as_ref().unwrap()),
        want,
        "one pass must be the single batch, bit for bit"
    );
    let shapes: Vec<(usize, usize)> = used.iter().map(|(g, _)| group_shape(g)).collect();
    for budget in [48, 30, 9] {
        let t = trainer(budget);
        let passes = plan(&shapes, budget);
        assert!(passes.len() > 1, "{budget}: {passes:?}");
        assert!(
            passes.iter().any(|p| matches!(p, Pass::Split { .. })),
            "{budget}: {passes:?}"
        );
        let b = t.batch_gradient(&used, &all, all.len()).unwrap();
        for (j, term) in b.terms.iter().enumerate() {
            assert!((term.loss - got.terms[j].loss).abs() < 1e-6, "{budget}");
        }
        let mut worst = 0f32;
        for ((name, a), (_, w)) in grads_of(&t, b.grads.as_ref().unwrap()).iter().zip(&want) {
            let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
            let diff = a.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            worst = worst.max(diff / scale);
            assert!(diff <= 1e-5 * scale, "{budget} {name}: {diff} vs {scale}");
        }
        eprintln!("budget {budget}: {passes:?}: worst relative difference {worst:e}");
    }
}

/// A whole step with a small budget trains like one pass: same groups used, same loss.
#[test]
fn a_micro_batched_step_trains_like_one_pass() {
    let p = policy();
    // Re-wrapped as verified (the pipeline's checks are not what this test is about).
    let pipe = crate::Pipeline::new(crate::pipeline::limits_of(p.config(), 0));
    let groups: Vec<_> = [group(&p, 5, 4), group(&p, 6, 8), group(&p, 7, 4)]
        .into_iter()
        .map(|g| pipe.from_own_buffer(g))
        .collect();
    let (mut one, mut many) = (trainer(0), trainer(12));
    let a = one.train_step(&groups).unwrap();
    let b = many.train_step(&groups).unwrap();
    assert!(a.stepped && b.stepped);
    assert_eq!(
        (a.groups_used, a.trajectories_used),
        (b.groups_used, b.trajectories_used)
    );
    assert!((a.loss - b.loss).abs() < 1e-6, "{} vs {}", a.loss, b.loss);
    assert!((a.grad_norm - b.grad_norm).abs() < 1e-5 * a.grad_norm);
    assert!((a.kl_sampler_learner - b.kl_sampler_learner).abs() < 1e-6);
}

/// With recomputed activations (`recompute`, attention in chunks of 3 queries) the step's
/// gradient is the stored path's up to summation order, in one pass and in split passes:
/// every component within 1e-4 of the variable's largest.
#[test]
fn recomputed_gradients_match_the_single_batch() {
    let p = policy();
    let groups = [group(&p, 1, 4), group(&p, 2, 8), group(&p, 3, 4)];
    let used: Vec<Used<'_>> = groups
        .iter()
        .map(|g| {
            let r: Vec<f32> = g.samples.iter().map(|s| s.reward).collect();
            (g, group_advantages(&r, true))
        })
        .collect();
    let all: Vec<usize> = (0..used.len()).collect();
    let single = trainer(0);
    let want = grads_of(&single, &single_batch_reference(&single, &used));
    for budget in [0, 30, 9] {
        let mut t = trainer(budget);
        t.set_compute(crate::Precision::F32, true, 3).unwrap();
        let b = t.batch_gradient(&used, &all, all.len()).unwrap();
        for ((name, a), (_, w)) in grads_of(&t, b.grads.as_ref().unwrap()).iter().zip(&want) {
            let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
            let diff = a.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= 1e-4 * scale, "{budget} {name}: {diff} vs {scale}");
        }
    }
}

/// Mixed precision on the CPU (f16 compute, f32 master weights and moments): one step's
/// loss within 1e-2 of the f32 step's, gradient norm within 5 %, and the weights after the
/// AdamW step within 10 % of the f32 step's update (largest |Δθ| over every variable).
#[test]
fn an_f16_step_matches_the_f32_step() {
    let p = policy();
    let pipe = crate::Pipeline::new(crate::pipeline::limits_of(p.config(), 0));
    let groups: Vec<_> = [group(&p, 5, 4), group(&p, 6, 8)]
        .into_iter()
        .map(|g| pipe.from_own_buffer(g))
        .collect();
    let (mut a, mut b) = (trainer(0), trainer(0));
    b.set_compute(crate::Precision::F16, false, 0).unwrap();
    assert_eq!(b.policy().compute_dtype(), candle_core::DType::F16);
    let before: Vec<Vec<f32>> = a
        .policy
        .named_vars()
        .unwrap()
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let sa = a.train_step(&groups).unwrap();
    let sb = b.train_step(&groups).unwrap();
    assert!(sa.stepped && sb.stepped);
    assert!(
        (sa.loss - sb.loss).abs() < 1e-2,
        "{} vs {}",
        sa.loss,
        sb.loss
    );
    assert!((sa.grad_norm - sb.grad_norm).abs() < 0.05 * sa.grad_norm);
    let after = |t: &Trainer| -> Vec<Vec<f32>> {
        t.policy
            .named_vars()
            .unwrap()
            .iter()
            .map(|(_, v)| {
                assert_eq!(
                    v.dtype(),
                    candle_core::DType::F32,
                    "master weights stay f32"
                );
                v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect()
    };
    let (wa, wb) = (after(&a), after(&b));
    // AdamW's first step is ≈ lr·sign(g) per entry, so entries whose gradient is within f16's
    // rounding of 0 may flip: compare the update vectors by cosine and norm.
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for ((x0, xa), xb) in before.iter().zip(&wa).zip(&wb) {
        for ((v0, va), vb) in x0.iter().zip(xa).zip(xb) {
            let (da, db) = (f64::from(va - v0), f64::from(vb - v0));
            dot += da * db;
            na += da * da;
            nb += db * db;
        }
    }
    assert!(na > 0.0);
    let cosine = dot / (na.sqrt() * nb.sqrt());
    assert!(cosine >= 0.8, "cosine of the f16 and f32 updates {cosine}");
    assert!((na.sqrt() - nb.sqrt()).abs() <= 0.1 * na.sqrt());
}
