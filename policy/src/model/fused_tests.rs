//! The fused CPU kernels against the elementary-op reference: same values and same gradients
//! (a wrong backward would train silently wrong, so every input's gradient is compared).

use candle_core::{DType, Device, Tensor, Var, D};

use super::cpu_ops::{self, RopeTables};
use super::positions::apply_rope;
use super::softmax_last;

pub(crate) fn randn(shape: &[usize], seed: u64) -> Tensor {
    // Deterministic pseudo-random values in [-2, 2) without an RNG dependency.
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| {
            let h = (i + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(seed.wrapping_mul(0xBF58_476D_1CE4_E5B9));
            let h = (h ^ (h >> 29)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Runs `f` on fresh variables built from `inputs`, backpropagates `Σ out·r` and returns the
/// output and each input's gradient.
pub(crate) fn value_and_grads(
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Tensor,
) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let out = f(&ts);
    let r = randn(out.dims(), 99);
    let grads = (&out * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let gs = ts
        .iter()
        .map(|t| grads.get(t).expect("gradient").clone())
        .collect();
    (out.detach(), gs)
}

fn assert_same(fused: (Tensor, Vec<Tensor>), reference: (Tensor, Vec<Tensor>), what: &str) {
    let d = max_abs_diff(&fused.0, &reference.0);
    assert!(d < 1e-4, "{what}: values differ by {d}");
    for (i, (a, b)) in fused.1.iter().zip(&reference.1).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(d < 1e-3, "{what}: gradient of input {i} differs by {d}");
    }
}

#[test]
fn fused_rms_norm_matches_reference() {
    let inputs = [randn(&[3, 5, 16], 1), randn(&[16], 2)];
    let fused = value_and_grads(&inputs, |t| cpu_ops::rms_norm(&t[0], &t[1], 1e-6).unwrap());
    let reference = value_and_grads(&inputs, |t| {
        let ms = t[0].sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let x = t[0]
            .broadcast_div(&(ms + 1e-6).unwrap().sqrt().unwrap())
            .unwrap();
        x.broadcast_mul(&t[1]).unwrap()
    });
    assert_same(fused, reference, "rms_norm");
}

#[test]
fn fused_rope_matches_reference() {
    let (b, t, h, d, offset) = (2, 5, 3, 8, 4);
    let half = d / 2;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in offset..offset + t {
        for i in 0..half {
            let a = p as f32 / 100f32.powf(i as f32 / half as f32);
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let full = |v: &[f32]| -> Tensor {
        let v: Vec<f32> = v
            .chunks_exact(half)
            .flat_map(|r| r.iter().chain(r).copied())
            .collect();
        Tensor::from_vec(v, (t, d), &Device::Cpu).unwrap()
    };
    let (cos_full, sin_full) = (full(&cos), full(&sin));
    let tab = RopeTables {
        cos: cos.into(),
        sin: sin.into(),
        t,
        half,
    };
    let inputs = [randn(&[b, t, h, d], 3)];
    let fused = value_and_grads(&inputs, |x| {
        cpu_ops::rope_to_heads(&x[0], &tab, 0.5).unwrap()
    });
    let reference = value_and_grads(&inputs, |x| {
        let x = x[0].transpose(1, 2).unwrap().contiguous().unwrap();
        (apply_rope(&x, &cos_full, &sin_full).unwrap() * 0.5).unwrap()
    });
    assert_same(fused, reference, "rope");
}

#[test]
fn fused_causal_softmax_matches_masked_reference() {
    for (t, offset) in [(6usize, 0usize), (3, 4), (1, 7)] {
        let s = offset + t;
        let inputs = [randn(&[2, 3, t, s], 4)];
        let mask = super::positions::causal_mask(t, offset);
        let mask = Tensor::from_vec(mask, (t, s), &Device::Cpu).unwrap();
        let fused = value_and_grads(&inputs, |x| cpu_ops::causal_softmax(&x[0], offset).unwrap());
        let reference = value_and_grads(&inputs, |x| {
            softmax_last(&x[0].broadcast_add(&mask).unwrap()).unwrap()
        });
        assert_same(fused, reference, "causal softmax");
    }
}

#[test]
fn fused_log_softmax_matches_reference() {
    let inputs = [(randn(&[4, 3, 50], 5) * 8.0).unwrap()];
    let fused = value_and_grads(&inputs, |x| cpu_ops::log_softmax(&x[0]).unwrap());
    let reference = value_and_grads(&inputs, |x| {
        let max = x[0].max_keepdim(D::Minus1).unwrap().detach();
        let shifted = x[0].broadcast_sub(&max).unwrap();
        let lse = shifted
            .exp()
            .unwrap()
            .sum_keepdim(D::Minus1)
            .unwrap()
            .log()
            .unwrap();
        shifted.broadcast_sub(&lse).unwrap()
    });
    assert_same(fused, reference, "log_softmax");
}

#[test]
fn fused_path_applies_only_to_f32_on_the_cpu() {
    let x = randn(&[2, 2], 6);
    assert!(cpu_ops::applies(&x));
    assert!(!cpu_ops::applies(&x.to_dtype(DType::F64).unwrap()));
}

/// Logits and the gradient of every variable of a whole model, on the fused or the
/// elementary path.
fn model_logits_and_grads(
    cfg: &crate::ModelConfig,
    elementary: bool,
) -> (Tensor, Vec<(String, Tensor)>) {
    super::use_elementary_ops(elementary);
    let p = crate::Policy::new_random(cfg, 7, &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..3 * 9)
        .map(|i| (i * 37 % cfg.vocab_size) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (3, 9), &Device::Cpu).unwrap();
    let logits = p.forward(&ids).unwrap();
    let lp = crate::token_logprobs(&logits, &ids, 1.0).unwrap();
    let grads = lp.mean_all().unwrap().neg().unwrap().backward().unwrap();
    let g = p
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| {
            let g = grads.get(v.as_tensor()).expect("gradient").clone();
            (n, g)
        })
        .collect();
    super::use_elementary_ops(false);
    (logits, g)
}

#[test]
fn fused_model_matches_elementary_model_values_and_gradients() {
    for cfg in [crate::ModelConfig::tiny(), {
        let mut c = crate::ModelConfig::tiny();
        c.arch = crate::Arch::Qwen2;
        c.attention_bias = true;
        c.tie_word_embeddings = false;
        c.num_key_value_heads = 4;
        c
    }] {
        let (lf, gf) = model_logits_and_grads(&cfg, false);
        let (le, ge) = model_logits_and_grads(&cfg, true);
        let d = max_abs_diff(&lf, &le);
        assert!(d < 1e-4, "logits differ by {d}");
        assert_eq!(gf.len(), ge.len());
        for ((n, a), (_, b)) in gf.iter().zip(&ge) {
            let scale = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
            let scale = scale.to_scalar::<f32>().unwrap().max(1e-6);
            let d = max_abs_diff(a, b);
            assert!(
                d <= 1e-3 * scale + 1e-6,
                "{n}: gradients differ by {d} (scale {scale})"
            );
        }
    }
}

#[test]
fn fused_swiglu_matches_reference() {
    let inputs = [randn(&[3, 4, 10], 8), randn(&[3, 4, 10], 9)];
    let fused = value_and_grads(&inputs, |t| cpu_ops::swiglu(&t[0], &t[1]).unwrap());
    let reference = value_and_grads(&inputs, |t| (t[0].silu().unwrap() * &t[1]).unwrap());
    assert_same(fused, reference, "swiglu");
}
