//! Hostile groups and the trainer: a token id outside the vocabulary or a sequence beyond the
//! context never reaches it (the verification pipeline refuses them, and a trainer takes
//! only `Verified` groups); a group whose numbers overflow the objective (a sampler log-prob
//! of −1e4 makes the importance ratio overflow; a pipeline whose log-prob floor lets it
//! through) is quarantined, the step trains on the good groups, and a batch of only such
//! groups takes no step and reports them.

use learner::{AdamWConfig, LossConfig, Objective, Pipeline, Trainer, TrainerConfig, Verified};
use storage::record::GroupLimits;
use storage::TrajectoryGroup;

#[path = "../src/test_util.rs"]
mod test_util;
use test_util::{sampled_group, small_policy, T};

/// A trainer whose passes hold at most `budget` padded tokens (0 = one pass; 8 splits every
/// group of this file into single rows).
fn trainer(objective: Objective, budget: usize) -> Trainer {
    let cfg = TrainerConfig {
        loss: LossConfig {
            objective,
            ..LossConfig::default()
        },
        optim: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        temperature: T,
        staleness: 3,
        kappa: None,
        groups_per_step: 4,
        group_size: 4,
        micro_batch_tokens: budget,
        ..TrainerConfig::default()
    };
    Trainer::new(small_policy(1), cfg).unwrap()
}

fn weights_finite(t: &Trainer) -> bool {
    t.policy().named_vars().unwrap().iter().all(|(_, v)| {
        v.as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite())
    })
}

/// A pipeline for `t`'s model whose log-prob floor lets the overflow through to the trainer.
fn lax_pipeline(t: &Trainer) -> Pipeline {
    Pipeline::new(GroupLimits {
        logprob_floor: f32::MIN,
        ..learner::pipeline::limits_of(t.policy().config(), 4)
    })
}

fn verified(t: &Trainer, g: TrajectoryGroup) -> Verified<TrajectoryGroup> {
    lax_pipeline(t)
        .verify(&g.producer.clone(), 0, g)
        .expect("verified")
}

/// One kind of poison applied to group `seed`.
fn poisoned(t: &Trainer, kind: &str, seed: u64) -> TrajectoryGroup {
    let mut g = sampled_group(t.policy(), 0, seed, 5, &format!("worker-{seed}"), false);
    let s = &mut g.samples[0];
    match kind {
        "logprob" => s.sampler_logprobs[0] = -1e4,
        "vocab" => s.response_tokens[0] = t.policy().config().vocab_size as u32,
        "context" => {
            let extra = t.policy().config().max_position_embeddings;
            s.response_tokens.extend(std::iter::repeat_n(65, extra));
            s.sampler_logprobs.extend(std::iter::repeat_n(-1.0, extra));
            s.loss_mask.extend(std::iter::repeat_n(1, extra));
        }
        _ => unreachable!(),
    }
    g
}

#[test]
fn groups_the_model_cannot_take_never_reach_the_trainer() {
    let t = trainer(Objective::Grpo, 0);
    let strict = Pipeline::new(learner::pipeline::limits_of(t.policy().config(), 4));
    for (kind, reason) in [
        ("vocab", "token_out_of_vocab"),
        ("context", "too_long"),
        ("logprob", "logprob_out_of_range"),
    ] {
        let g = poisoned(&t, kind, 9);
        let e = strict.verify("worker-9", 0, g).unwrap_err();
        assert_eq!(e.as_str(), reason, "{kind}");
    }
}

#[test]
fn an_overflowing_group_is_quarantined_and_the_good_ones_train() {
    let mut t = trainer(Objective::Grpo, 0);
    let mut batch: Vec<_> = (1..=3)
        .map(|s| {
            verified(
                &t,
                sampled_group(t.policy(), 0, s, 5, &format!("worker-{s}"), false),
            )
        })
        .collect();
    let bad = verified(&t, poisoned(&t, "logprob", 9));
    batch.insert(1, bad.clone());
    let st = t
        .train_step(&batch)
        .unwrap_or_else(|e| panic!("a bad group failed the step: {e}"));
    assert!(st.stepped, "the good groups train");
    assert_eq!(st.version, 1);
    assert_eq!(st.groups_used, 3);
    assert_eq!(st.quarantined.len(), 1, "{:?}", st.quarantined);
    assert_eq!(st.quarantined[0].group_id, bad.group_id);
    assert_eq!(st.quarantined[0].producer, "worker-9");
    assert!(st.loss.is_finite() && weights_finite(&t));
    assert!(
        !t.has_consumed(&bad.samples[0].trajectory_id),
        "a quarantined group is not consumed"
    );
    assert!(t.has_consumed(&batch[0].samples[0].trajectory_id));
}

#[test]
fn an_overflowing_ratio_never_reaches_the_weights_under_any_objective() {
    for objective in [
        Objective::Grpo,
        Objective::DrGrpo,
        Objective::Gspo,
        Objective::Gepo,
    ] {
        for budget in [0, 8] {
            let mut t = trainer(objective, budget);
            let batch = vec![
                verified(&t, sampled_group(t.policy(), 0, 1, 5, "worker-1", false)),
                verified(&t, poisoned(&t, "logprob", 2)),
            ];
            let st = t
                .train_step(&batch)
                .unwrap_or_else(|e| panic!("{objective:?}: {e}"));
            assert!(st.stepped, "{objective:?}");
            assert!(
                st.loss.is_finite() && st.grad_norm.is_finite() && weights_finite(&t),
                "{objective:?}, budget {budget}: {st:?}"
            );
        }
    }
}

#[test]
fn a_batch_of_only_bad_groups_takes_no_step_and_reports_them() {
    let mut t = trainer(Objective::Grpo, 8);
    let batch: Vec<_> = (1..=3)
        .map(|s| verified(&t, poisoned(&t, "logprob", s)))
        .collect();
    let st = t.train_step(&batch).expect("no error for bad data");
    assert!(!st.stepped);
    assert_eq!(t.version(), 0);
    let mut ids: Vec<[u8; 16]> = st.quarantined.iter().map(|q| q.group_id).collect();
    ids.sort_unstable();
    let mut want: Vec<[u8; 16]> = batch.iter().map(|g| g.group_id).collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    assert_eq!(t.consumed_len(), 0);
    // The trainer is still fine: a good batch trains afterwards.
    let st = t
        .train_step(&[verified(
            &t,
            sampled_group(t.policy(), 0, 4, 5, "worker-4", false),
        )])
        .unwrap();
    assert!(st.stepped && weights_finite(&t));
}
