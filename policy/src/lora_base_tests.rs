//! The frozen base held in bf16 (what a LoRA learner holds on a GPU,
//! [`frozen_base_dtype`]), run on the CPU through the same module and the same frozen-linear
//! op: the same model as the f32 base within bf16 rounding, the same identity, gradients for
//! every adapter and none for the base.

use candle_core::{DType, Device, Tensor};

use super::tests::{adapter_gradients, ids, small};
use super::*;
use crate::config::Arch;
use crate::model::fused_tests::{max_abs_diff, randn};
use crate::weights::Policy;

/// bf16's unit roundoff: 8 significant bits, round to nearest.
const U_BF16: f32 = 1.0 / 256.0;

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// A LoRA policy on a bf16-rounded base (the run's base is rounded to the snapshot dtype
/// first), with non-zero `B`s, in f32; and the same policy with its base held in bf16.
fn pair(cfg: &ModelConfig, lora: &LoraConfig) -> (Policy, Policy) {
    let base = Policy::new_random(cfg, 1, &Device::Cpu).unwrap();
    base.round_weights_to(DType::BF16).unwrap();
    let p32 = base.with_lora(lora, 2).unwrap();
    for (i, (name, var)) in p32.trainable_named_vars().unwrap().iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            var.set(&(randn(var.dims(), i as u64) * 0.02).unwrap())
                .unwrap();
        }
    }
    let p16 = p32
        .to_device(&Device::Cpu)
        .unwrap()
        .with_base_dtype(DType::BF16)
        .unwrap();
    (p32, p16)
}

#[test]
fn the_base_dtype_is_bf16_only_on_cuda_for_a_bf16_rounded_base() {
    assert_eq!(frozen_base_dtype(&Device::Cpu, DType::BF16), DType::F32);
    assert_eq!(frozen_base_dtype(&Device::Cpu, DType::F32), DType::F32);
    // The device half of the rule, without a GPU.
    assert_eq!(base_dtype_rule(true, DType::BF16), DType::BF16);
    assert_eq!(base_dtype_rule(true, DType::F32), DType::F32);
    assert_eq!(base_dtype_rule(false, DType::BF16), DType::F32);
    // What the learner's memory check counts for it: 2 bytes a base parameter on CUDA.
    let cfg = small(Arch::Qwen3);
    let lora = LoraConfig::new(8, 16.0);
    let bytes = |base_dtype| {
        crate::memory::training_state_bytes(
            &cfg,
            crate::memory::Training::Lora {
                lora: &lora,
                base_dtype,
            },
        )
    };
    let a = adapter_params(&cfg, &lora);
    let p = cfg.num_params();
    assert_eq!(bytes(base_dtype_rule(true, DType::BF16)), 2 * p + 20 * a);
    assert_eq!(bytes(base_dtype_rule(false, DType::BF16)), 4 * p + 20 * a);
}

/// Tolerance: each bf16 base projection rounds its input and its output to bf16 (relative
/// error ≤ u = 2⁻⁸ each), so a projection's output is off by ≈ 2u of its magnitude; through
/// two layers of 7 projections plus the head, with residual sums in f32, the logits stay
/// within 8u (3 %) of their largest magnitude — measured: 0.4–0.6 % here, and log-probs
/// within 0.02 nats. A broken conversion (a base left unrounded in f32 against a bf16
/// one, a transposed weight, a missing LoRA branch) is off by far more than that.
#[test]
fn a_bf16_base_computes_the_f32_bases_model_within_bf16_rounding() {
    for arch in [Arch::Qwen3, Arch::Qwen2] {
        let cfg = small(arch);
        let (p32, p16) = pair(&cfg, &LoraConfig::new(4, 8.0));
        assert_eq!(p16.weights_dtype().unwrap(), DType::BF16);
        assert!(p16
            .named_vars()
            .unwrap()
            .iter()
            .all(|(_, v)| v.dtype() == DType::BF16));
        assert!(p16
            .trainable_named_vars()
            .unwrap()
            .iter()
            .all(|(_, v)| v.dtype() == DType::F32));
        // The identity is over the f32 widening: a bf16-rounded base hashes alike in both.
        assert_eq!(p16.base_hash_hex().unwrap(), p32.base_hash_hex().unwrap());

        let (l32, l16) = (p32.forward(&ids()).unwrap(), p16.forward(&ids()).unwrap());
        assert_eq!(l16.dtype(), DType::F32, "activations stay f32");
        let (d, scale) = (max_abs_diff(&l16, &l32), max_abs(&l32));
        eprintln!(
            "{arch:?}: max |Δ logit| {d:.3e} of max |logit| {scale:.3e} ({:.2} %)",
            100.0 * d / scale
        );
        assert!(d > 0.0, "the bf16 path rounds");
        assert!(
            d <= 8.0 * U_BF16 * scale,
            "{arch:?}: logits differ by {d} (scale {scale})"
        );
        let lp = |l: &Tensor| crate::model::log_softmax_last(l).unwrap();
        let dl = max_abs_diff(&lp(&l16), &lp(&l32));
        assert!(dl <= 0.05, "{arch:?}: log-probs differ by {dl}");
        // The KL reference (base alone) and the cached decode run on the bf16 base too.
        let (b32, b16) = (p32.base_view().unwrap(), p16.base_view().unwrap());
        let d = max_abs_diff(&b16.forward(&ids()).unwrap(), &b32.forward(&ids()).unwrap());
        assert!(
            d <= 8.0 * U_BF16 * scale,
            "{arch:?}: base views differ by {d}"
        );
        let mut cache = p16.new_cache();
        let x = ids();
        let first = p16
            .model()
            .forward_cached(&x.narrow(1, 0, 4).unwrap(), &mut cache)
            .unwrap();
        let rest = p16
            .model()
            .forward_cached(&x.narrow(1, 4, 2).unwrap(), &mut cache)
            .unwrap();
        let cached = Tensor::cat(&[first, rest], 1).unwrap();
        assert!(max_abs_diff(&cached, &l16) <= 1e-4);
    }
}

/// Gradients with a bf16 base: every adapter gets one and they are the f32 base's within
/// bf16 rounding (relative ‖Δg‖/‖g‖ ≤ 5 %: the backward rounds `dy` and `dy·W` to bf16 at
/// each frozen projection on top of the forward's roundings); no base weight gets one and no
/// weight-shaped gradient is computed.
#[test]
fn a_bf16_base_gives_every_adapter_its_gradient_and_the_base_none() {
    for arch in [Arch::Qwen3, Arch::Qwen2] {
        let cfg = small(arch);
        let (p32, p16) = pair(&cfg, &LoraConfig::new(2, 4.0));
        let (g32, g16) = (adapter_gradients(&p32), adapter_gradients(&p16));
        assert_eq!(g16.len(), 2 * 7 * cfg.num_hidden_layers);
        let norm = |t: &Tensor| {
            t.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                .sqrt()
        };
        let mut worst = 0f32;
        for ((n32, a), (n16, b)) in g32.iter().zip(&g16) {
            assert_eq!(n32, n16);
            worst = worst.max(norm(&(b - a).unwrap()) / norm(a));
        }
        eprintln!("{arch:?}: worst relative adapter-gradient difference {worst:.3e}");
        assert!(
            worst <= 0.05,
            "{arch:?}: adapter gradients differ by {worst} (relative)"
        );
    }
}

#[test]
fn with_base_dtype_keeps_the_adapters_and_refuses_other_dtypes() {
    let cfg = small(Arch::Qwen3);
    let (p32, p16) = pair(&cfg, &LoraConfig::new(2, 4.0));
    let back = p16.with_base_dtype(DType::F32).unwrap();
    assert_eq!(back.weights_dtype().unwrap(), DType::F32);
    // Widening the bf16 base back is exact: the f32 policy's model again.
    assert_eq!(
        back.forward(&ids()).unwrap().to_vec3::<f32>().unwrap(),
        p32.forward(&ids()).unwrap().to_vec3::<f32>().unwrap()
    );
    assert!(p32.with_base_dtype(DType::F16).is_err());
}
