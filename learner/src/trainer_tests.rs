use std::path::Path;

use candle_core::Device;

use super::*;
use crate::loss::Objective;
use crate::pipeline::Pipeline;
use crate::test_util::{sampled_group, small_policy, T};
use crate::{AdamWConfig, LossConfig};
use control::Window;
use storage::record::GroupLimits;

fn cfg(objective: Objective, staleness: u64) -> TrainerConfig {
    TrainerConfig {
        loss: LossConfig {
            objective,
            ..LossConfig::default()
        },
        optim: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        temperature: T,
        staleness,
        kappa: None,
        groups_per_step: 2,
        group_size: 4,
        micro_batch_tokens: 0,
        ..TrainerConfig::default()
    }
}

/// The pipeline's limits for `policy` (what a learner verifies its groups against).
fn limits(policy: &Policy) -> GroupLimits {
    GroupLimits {
        vocab_size: policy.config().vocab_size,
        max_context: policy.config().max_position_embeddings,
        logprob_floor: -50.0,
        group_size: 4,
    }
}

/// [`raw_group`] through the structure stage of the verification pipeline.
fn group(policy: &Policy, version: u64, seed: u64, flat: bool) -> Verified<TrajectoryGroup> {
    let g = raw_group(policy, version, seed, flat);
    Pipeline::new(limits(policy))
        .verify("test", 0, g)
        .expect("a sampled group passes the structure checks")
}

/// A sampled group of 4 ([`sampled_group`]), at most 5 tokens each, from producer `test`.
fn raw_group(policy: &Policy, version: u64, seed: u64, flat: bool) -> TrajectoryGroup {
    sampled_group(policy, version, seed, 5, "test", flat)
}

#[test]
fn admission_and_publication_rules() {
    // v_τ ≥ v − S, saturating at 0.
    let w = |s| Window::new(s);
    assert!(w(0).admissible(0, 0));
    assert!(w(0).admissible(5, 5));
    assert!(!w(0).admissible(4, 5));
    assert!(w(3).admissible(2, 5));
    assert!(!w(3).admissible(1, 5));
    assert!(
        w(3).admissible(0, 2),
        "saturating: early versions are all admissible"
    );
    assert!(w(u64::MAX).admissible(0, u64::MAX));
    assert!(!w(u64::MAX - 1).admissible(0, u64::MAX));
    assert_eq!(w(3).floor(2), 0);
    assert_eq!(w(3).floor(10), 7);
    // κ = max(S − 1, 1)
    assert_eq!(
        [0, 1, 2, 3, 11].map(|s| w(s).default_kappa()),
        [1, 1, 1, 2, 10]
    );
    let c = cfg(Objective::Grpo, 3);
    assert_eq!(c.batch_trajectories(), 8);
    assert_eq!(c.kappa(), 2);
}

#[test]
fn a_stale_group_never_enters_a_batch_across_a_version_change() {
    let p = small_policy(1);
    let old = group(&p, 0, 100, false);
    let mut tr = Trainer::new(p, cfg(Objective::Grpo, 1)).unwrap();
    assert_eq!(tr.classify(&old), Verdict::Admitted);
    // Two steps on other groups: v 0 → 2. `old` (v_τ = 0) now has Δ = 2 > S = 1.
    for (i, v) in [0u64, 1].iter().enumerate() {
        let g = group(tr.policy(), *v, 200 + i as u64, false);
        let st = tr.train_step(&[g]).unwrap();
        assert!(st.stepped);
        assert_eq!(st.groups_used, 1);
    }
    assert_eq!(tr.version(), 2);
    assert_eq!(tr.classify(&old), Verdict::Stale);
    let before = tr.snapshot_bytes().unwrap();
    let st = tr.train_step(std::slice::from_ref(&old)).unwrap();
    assert_eq!(
        (st.stepped, st.groups_stale, st.groups_used, st.version),
        (false, 1, 0, 2)
    );
    assert_eq!(
        tr.snapshot_bytes().unwrap(),
        before,
        "a refused group must not move the weights"
    );
    assert!(!tr.has_consumed(&old.samples[0].trajectory_id));
    // Mixed batch: the stale group is refused, the fresh one trains; Δ is recorded.
    let fresh = group(tr.policy(), 1, 300, false);
    let st = tr.train_step(&[old.clone(), fresh]).unwrap();
    assert_eq!(
        (st.groups_stale, st.groups_used, st.staleness_max),
        (1, 1, 1)
    );
    assert_eq!(st.staleness_histogram.get(&1), Some(&1));
    // A group from a version the learner has not reached is refused too.
    let future = group(tr.policy(), 99, 301, false);
    assert_eq!(tr.classify(&future), Verdict::Future);
}

#[test]
fn every_objective_trains_on_a_tiny_config() {
    for (objective, kl_beta) in [
        (Objective::Grpo, 0.0),
        (Objective::DrGrpo, 0.0),
        (Objective::Gspo, 0.0),
        (Objective::Gepo, 0.0),
        (Objective::Grpo, 0.05),
    ] {
        let p = small_policy(2);
        let gs = [group(&p, 0, 1, false), group(&p, 0, 2, false)];
        let mut c = cfg(objective, 0);
        c.loss.kl_beta = kl_beta;
        let mut tr = Trainer::new(p, c).unwrap();
        let before = tr.snapshot_bytes().unwrap();
        let st = tr.train_step(&gs).unwrap();
        assert!(
            st.stepped && st.loss.is_finite() && st.grad_norm > 0.0,
            "{objective:?}: {st:?}"
        );
        assert_eq!(
            (st.version, st.groups_used, st.trajectories_used),
            (1, 2, 8)
        );
        assert_ne!(
            tr.snapshot_bytes().unwrap(),
            before,
            "{objective:?}: weights did not change"
        );
        // On-policy data: sampler and learner log-probs agree (same temperature), so the KL
        // estimate is ~0 and token/sequence ratios are ~1 (GEPO's group weight is not 1).
        assert!(
            st.kl_sampler_learner.abs() < 1e-4,
            "{objective:?}: {}",
            st.kl_sampler_learner
        );
        if objective != Objective::Gepo {
            assert!(
                st.importance_weight_variance < 1e-8,
                "{objective:?}: {st:?}"
            );
        }
        // A second step on newer data keeps training.
        let g = group(tr.policy(), 1, 3, false);
        assert!(tr.train_step(&[g]).unwrap().stepped);
    }
}

#[test]
fn zero_advantage_duplicate_and_foreign_groups_are_dropped_and_counted() {
    let p = small_policy(3);
    let flat = group(&p, 0, 10, true);
    let good = group(&p, 0, 11, false);
    // Verified for a model with a larger context than this trainer's: refused, quarantined.
    let larger = GroupLimits {
        max_context: 1 << 20,
        ..limits(&p)
    };
    let broken = Pipeline::new(larger)
        .verify("test", 0, raw_group(&p, 0, 12, false))
        .unwrap();
    let mut tr = Trainer::new(p, cfg(Objective::Gepo, 2)).unwrap();
    let st = tr
        .train_step(&[flat.clone(), good.clone(), good.clone(), broken])
        .unwrap();
    assert_eq!(
        (
            st.groups_used,
            st.groups_zero_advantage,
            st.groups_duplicate,
            st.groups_invalid
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(st.groups_dropped(), 3);
    assert!((st.zero_advantage_fraction - 0.5).abs() < 1e-12);
    // Both admitted groups were consumed: neither trains again.
    let st = tr.train_step(&[flat, good]).unwrap();
    assert_eq!((st.stepped, st.groups_duplicate), (false, 2));
    assert_eq!(tr.version(), 1);
}

#[test]
fn a_restored_trainer_continues_bit_identically_and_remembers_consumed_ids() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_policy(4);
    let b1 = [group(&p, 0, 20, false), group(&p, 0, 21, false)];
    let mut c = cfg(Objective::Grpo, 3);
    c.loss.kl_beta = 0.02; // the reference copy is checkpointed too
    let mut a = Trainer::new(p, c).unwrap();
    a.train_step(&b1).unwrap();
    a.train_step(&[group(a.policy(), 1, 22, false)]).unwrap();
    let first = a.save(dir.path()).unwrap();
    // Saving again at a later version replaces the old folder; LATEST follows.
    let b2 = [
        group(a.policy(), 2, 23, false),
        group(a.policy(), 1, 24, false),
    ];
    let mut b = Trainer::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(b.version(), a.version());
    assert_eq!(b.config(), a.config());
    assert_eq!(b.consumed_len(), 12);
    assert_eq!(b.snapshot_bytes().unwrap(), a.snapshot_bytes().unwrap());
    let sa = a.train_step(&b2).unwrap();
    let sb = b.train_step(&b2).unwrap();
    assert_eq!(
        sa.loss.to_bits(),
        sb.loss.to_bits(),
        "{} vs {}",
        sa.loss,
        sb.loss
    );
    assert_eq!(sa.grad_norm.to_bits(), sb.grad_norm.to_bits());
    assert_eq!(a.snapshot_bytes().unwrap(), b.snapshot_bytes().unwrap());
    // The restored trainer refuses what it trained before the checkpoint.
    let st = b.train_step(&b1).unwrap();
    assert_eq!((st.stepped, st.groups_duplicate), (false, 2));
    let second = b.save(dir.path()).unwrap();
    assert_ne!(first, second);
    assert!(
        first.exists(),
        "the default keeps older checkpoints to fall back to"
    );
    let third = b.save_keeping(dir.path(), 1).unwrap();
    assert!(
        !first.exists() && !second.exists() && third.exists(),
        "keeping one removes the older checkpoint folders"
    );
    let c = Trainer::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(c.version(), 3);
}

#[test]
fn bad_configs_are_refused() {
    let mut c = cfg(Objective::Grpo, 1);
    c.temperature = 0.0;
    assert!(Trainer::new(small_policy(5), c).is_err());
    let mut c = cfg(Objective::Grpo, 1);
    c.kappa = Some(0);
    assert!(c.validate().is_err());
    assert!(Trainer::load(Path::new("/nonexistent/echo-swarm-ckpt"), &Device::Cpu).is_err());
}

/// The learner owns the loss mask: the masks a group carries are never used, so poisoned
/// ones train exactly what honest ones train; a turn-aware rule set on the trainer does
/// change what is trained.
#[test]
fn sent_loss_masks_are_ignored_and_the_rule_decides() {
    let source = small_policy(21);
    let raw = [
        raw_group(&source, 0, 1, false),
        raw_group(&source, 0, 2, false),
    ];
    let mut bad = raw.clone();
    for g in &mut bad {
        for s in &mut g.samples {
            s.loss_mask.iter_mut().step_by(2).for_each(|m| *m = 0);
        }
    }
    // Through the structure stage only (the mask stage would refuse the poisoned masks).
    let verify = |gs: [TrajectoryGroup; 2]| {
        gs.map(|g| {
            Pipeline::new(limits(&source))
                .verify("test", 0, g)
                .expect("valid structure")
        })
    };
    let (groups, poisoned) = (verify(raw), verify(bad));
    let weights = |gs: &[Verified<TrajectoryGroup>], rule: Option<Arc<dyn MaskRule>>| {
        let mut t = Trainer::new(small_policy(22), cfg(Objective::Grpo, 3)).unwrap();
        if let Some(r) = rule {
            t.set_mask_rule(r);
        }
        assert!(t.train_step(gs).unwrap().stepped);
        t.snapshot_bytes().unwrap()
    };
    let honest = weights(&groups, None);
    assert_eq!(honest, weights(&poisoned, None));
    struct FirstTokenOnly;
    impl MaskRule for FirstTokenOnly {
        fn name(&self) -> &'static str {
            "first_token_only"
        }
        fn mask(&self, g: &TrajectoryGroup, i: usize) -> std::result::Result<Vec<u8>, String> {
            let n = g.samples[i].response_tokens.len();
            Ok((0..n).map(|j| u8::from(j == 0)).collect())
        }
    }
    assert_ne!(honest, weights(&groups, Some(Arc::new(FirstTokenOnly))));
}

/// A LoRA trainer over [`small_policy`]`(1)` with a KL penalty.
fn lora_trainer() -> Trainer {
    let lora = policy::LoraConfig::new(2, 4.0);
    let p = small_policy(1).with_lora(&lora, 7).unwrap();
    let mut c = cfg(Objective::Grpo, 0);
    c.loss.kl_beta = 0.05;
    Trainer::new(p, c).unwrap()
}

/// LoRA: the optimiser holds state for the adapters alone, a step moves them and never the
/// base, and the KL reference is the base itself (the same storage, no copy).
#[test]
fn a_lora_trainer_steps_only_the_adapters_against_the_base() {
    let mut tr = lora_trainer();
    let base = tr.policy().base_hash_hex().unwrap();
    assert_eq!(base, small_policy(1).base_hash_hex().unwrap());
    let ids = |p: &Policy| -> Vec<candle_core::TensorId> {
        p.named_vars()
            .unwrap()
            .iter()
            .map(|(_, v)| v.as_tensor().id())
            .collect()
    };
    let reference = tr.reference.as_ref().expect("kl_beta > 0 has a reference");
    assert_eq!(
        ids(reference),
        ids(tr.policy()),
        "the reference shares the base"
    );
    assert!(
        reference.lora().is_none(),
        "the reference is the base alone"
    );
    let before = tr
        .policy()
        .lora()
        .unwrap()
        .to_safetensors_bytes(tr.policy().config());
    let before = before.unwrap();
    let merged_before = tr.snapshot_bytes().unwrap();
    for (v, seed) in [(0, 1), (1, 2)] {
        let g = [
            group(tr.policy(), v, seed, false),
            group(tr.policy(), v, seed + 10, false),
        ];
        let st = tr.train_step(&g).unwrap();
        assert!(st.stepped && st.grad_norm > 0.0, "{st:?}");
    }
    assert_eq!(tr.policy().base_hash_hex().unwrap(), base, "the base moved");
    let cfg = tr.policy().config().clone();
    let after = tr.policy().lora().unwrap().to_safetensors_bytes(&cfg);
    assert_ne!(after.unwrap(), before, "the adapters did not train");
    assert_ne!(tr.snapshot_bytes().unwrap(), merged_before);
    let state = tr.opt.state_to_bytes().unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&state).unwrap();
    let names: Vec<String> = meta.tensors().keys().cloned().collect();
    let lora = policy::LoraConfig::new(2, 4.0);
    assert_eq!(
        names.len(),
        2 * policy::lora::adapter_shapes(&cfg, &lora).len()
    );
    assert!(names.iter().all(|n| n.contains(".lora_")), "{names:?}");
}

/// A LoRA checkpoint holds adapters, their optimiser state and the base's identity; it is
/// restored only onto that base, and a different base is refused naming both hashes.
#[test]
fn a_lora_checkpoint_round_trips_onto_its_base_only() {
    let mut tr = lora_trainer();
    let g = [
        group(tr.policy(), 0, 1, false),
        group(tr.policy(), 0, 2, false),
    ];
    assert!(tr.train_step(&g).unwrap().stepped);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tr.save(tmp.path()).unwrap();
    assert!(ck.join("adapters.safetensors").exists());
    assert!(!ck.join("weights.safetensors").exists() && !ck.join("reference.safetensors").exists());

    let err = Trainer::load(tmp.path(), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("LoRA") && err.contains(&tr.policy().base_hash_hex().unwrap()),
        "{err}"
    );
    let err = Trainer::load_with_base(tmp.path(), small_policy(2))
        .unwrap_err()
        .to_string();
    let (want, have) = (
        tr.policy().base_hash_hex().unwrap(),
        small_policy(2).base_hash_hex().unwrap(),
    );
    assert!(err.contains(&want) && err.contains(&have), "{err}");

    let back = Trainer::load_with_base(tmp.path(), small_policy(1)).unwrap();
    let cfg = tr.policy().config().clone();
    let adapters = |t: &Trainer| {
        t.policy()
            .lora()
            .unwrap()
            .to_safetensors_bytes(&cfg)
            .unwrap()
    };
    assert_eq!(adapters(&back), adapters(&tr));
    assert_eq!(
        back.opt.state_to_bytes().unwrap(),
        tr.opt.state_to_bytes().unwrap()
    );
    assert_eq!(back.snapshot_bytes().unwrap(), tr.snapshot_bytes().unwrap());
    assert_eq!(back.version(), 1);
    assert!(back.reference.as_ref().is_some_and(|r| r.lora().is_none()));
    // Both continue identically.
    let (mut a, mut b) = (tr, back);
    let g = [
        group(a.policy(), 1, 5, false),
        group(a.policy(), 1, 6, false),
    ];
    a.train_step(&g).unwrap();
    b.train_step(&g).unwrap();
    assert_eq!(adapters(&a), adapters(&b));
}

/// The bytes of a trainer's adapters in `dtype`.
fn adapter_bytes(t: &Trainer, dtype: policy::DType) -> Vec<u8> {
    let cfg = t.policy().config().clone();
    let a = t.policy().lora().unwrap();
    a.to_safetensors_bytes_as(&cfg, dtype).unwrap()
}

/// A LoRA learner restarted from a checkpoint older than adapter versions it published
/// continues from the newest: its adapters (a bf16 payload: rounded as the workers hold
/// them) and number, on the same base; the optimiser's state stays the checkpoint's and still
/// drives the same variables. Another base (both hashes named), an older version, another
/// LoRA configuration or a full payload is refused and changes nothing.
#[test]
fn a_lora_learner_resumes_from_a_newer_adapter_version() {
    let mut tr = lora_trainer();
    let tmp = tempfile::tempdir().unwrap();
    tr.save(tmp.path()).unwrap();
    for (v, seed) in [(0, 1), (1, 2)] {
        let g = [
            group(tr.policy(), v, seed, false),
            group(tr.policy(), v, seed + 10, false),
        ];
        assert!(tr.train_step(&g).unwrap().stepped);
    }
    let published = adapter_bytes(&tr, policy::DType::BF16);
    let base = tr.policy().base_hash_hex().unwrap();

    let mut back = Trainer::load_with_base(tmp.path(), small_policy(1)).unwrap();
    let (before, opt) = (
        adapter_bytes(&back, policy::DType::F32),
        back.opt.state_to_bytes().unwrap(),
    );
    let other = small_policy(2).base_hash_hex().unwrap();
    let err = back
        .resume_from_adapters(&published, 2, &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&other) && err.contains(&base), "{err}");
    assert!(back.resume_from_adapters(&published, 0, &base).is_err());
    let rank3 = small_policy(1)
        .with_lora(&policy::LoraConfig::new(3, 4.0), 7)
        .unwrap();
    let rank3 = rank3
        .lora()
        .unwrap()
        .to_safetensors_bytes(rank3.config())
        .unwrap();
    assert!(back.resume_from_adapters(&rank3, 2, &base).is_err());
    let full = tr.snapshot_bytes().unwrap();
    assert!(back.resume_from_adapters(&full, 2, &base).is_err());
    assert!(back.resume_from_snapshot(&published, 2).is_err());
    assert_eq!(back.version(), 0);
    assert_eq!(adapter_bytes(&back, policy::DType::F32), before);

    let vars = |t: &Trainer| -> Vec<candle_core::TensorId> {
        t.policy()
            .vars()
            .unwrap()
            .iter()
            .map(|v| v.as_tensor().id())
            .collect()
    };
    let held = vars(&back);
    back.resume_from_adapters(&published, 2, &base).unwrap();
    assert_eq!(back.version(), 2);
    assert_eq!(adapter_bytes(&back, policy::DType::BF16), published);
    assert_eq!(
        back.opt.state_to_bytes().unwrap(),
        opt,
        "the checkpoint's moments"
    );
    assert_eq!(
        vars(&back),
        held,
        "the optimiser's variables were set in place"
    );
    assert_eq!(back.policy().base_hash_hex().unwrap(), base);
    let g = [
        group(back.policy(), 2, 5, false),
        group(back.policy(), 2, 6, false),
    ];
    assert!(back.train_step(&g).unwrap().stepped);
    assert_ne!(adapter_bytes(&back, policy::DType::BF16), published);
    // A full fine-tuning trainer takes no adapters.
    let mut full = Trainer::new(small_policy(1), cfg(Objective::Grpo, 0)).unwrap();
    assert!(full.resume_from_adapters(&published, 2, &base).is_err());
}

/// A frozen base held in bf16 (a GPU learner's, run here on the CPU) trains its adapters;
/// full fine-tuning of bf16 weights is refused.
#[test]
fn adapters_train_on_a_bf16_base_and_a_bf16_model_is_not_fully_trained() {
    let bf16 = || {
        let p = small_policy(1);
        p.round_weights_to(policy::DType::BF16).unwrap();
        p.with_base_dtype(policy::DType::BF16).unwrap()
    };
    let err = Trainer::new(bf16(), cfg(Objective::Grpo, 0)).unwrap_err();
    assert!(err.to_string().contains("BF16"), "{err}");
    let p = bf16()
        .with_lora(&policy::LoraConfig::new(2, 4.0), 7)
        .unwrap();
    let mut c = cfg(Objective::Grpo, 0);
    c.loss.kl_beta = 0.05;
    let mut tr = Trainer::new(p, c).unwrap();
    let before = adapter_bytes(&tr, policy::DType::F32);
    let g = [
        group(tr.policy(), 0, 1, false),
        group(tr.policy(), 0, 11, false),
    ];
    let st = tr.train_step(&g).unwrap();
    assert!(
        st.stepped && st.grad_norm.is_finite() && st.grad_norm > 0.0,
        "{st:?}"
    );
    assert_ne!(adapter_bytes(&tr, policy::DType::F32), before);
    assert_eq!(tr.policy().weights_dtype().unwrap(), policy::DType::BF16);
}

/// A restarted LoRA learner rebuilds its base from the config and the warm start, and its
/// checkpoint is accepted only if that base hashes alike: the warm start must be
/// reproducible bit for bit.
#[test]
fn the_warm_started_base_is_reproducible() {
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let base = || {
        let p = small_policy(1);
        crate::warm::warm_start_on_task(&p, &policy::Tokenizer::byte(), task.as_ref(), 3, 9)
            .unwrap();
        p.base_hash_hex().unwrap()
    };
    let first = base();
    assert_ne!(
        first,
        small_policy(1).base_hash_hex().unwrap(),
        "the warm start trained"
    );
    assert_eq!(first, base());
}
