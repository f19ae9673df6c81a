//! Mixed precision (`Qwen3::with_compute_dtype`): the f16 path against the f32 one on the CPU
//! (candle's CPU has an f16 matmul, not a bf16 one), and what stays f32.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::sampling::batch_response_logprobs;
use crate::weights::Policy;

/// A small Qwen3 shape (grouped-query attention, q/k-norm, tied embeddings).
pub(crate) fn small() -> ModelConfig {
    ModelConfig {
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 160,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        max_position_embeddings: 128,
        ..ModelConfig::tiny()
    }
}

/// Three (prompt, response) pairs of different lengths.
pub(crate) fn batch() -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..3u32)
        .map(|r| {
            let prompt: Vec<u32> = (0..5 + r).map(|i| (i * 37 + r * 11) % 300).collect();
            let response: Vec<u32> = (0..9 + 3 * r).map(|i| (i * 53 + r * 7 + 1) % 300).collect();
            (prompt, response)
        })
        .collect()
}

pub(crate) fn pairs(b: &[(Vec<u32>, Vec<u32>)]) -> Vec<(&[u32], &[u32])> {
    b.iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect()
}

/// Log-probs and the gradient of `−Σ mask ⊙ log-probs · w` by variable name, where `w` is a
/// fixed per-position weight (so every position's gradient matters).
fn loss_and_grads(p: &Policy) -> (Vec<f32>, HashMap<String, Tensor>) {
    let b = batch();
    let (lp, mask) = batch_response_logprobs(p, &pairs(&b), 0.9).unwrap();
    let w = Tensor::arange(0f32, mask.elem_count() as f32, &Device::Cpu)
        .unwrap()
        .reshape(mask.shape())
        .unwrap()
        .affine(0.01, 0.5)
        .unwrap();
    let loss = (lp.clone() * (mask * w).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .neg()
        .unwrap();
    let grads = loss.backward().unwrap();
    let by_name = p
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, grads.get(v.as_tensor()).expect("a gradient").clone()))
        .collect();
    (lp.flatten_all().unwrap().to_vec1().unwrap(), by_name)
}

fn norm(t: &Tensor) -> f32 {
    t.to_dtype(DType::F32)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .sqrt()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// The f16 path's log-probs are within 0.02 of the f32 path's (f16 keeps 11 bits: a relative
/// error of 5e-4 a value, compounded over two layers), and each variable's gradient within 3 %
/// (relative L2) of the f32 gradient; the gradients arrive in f32 (the master weights').
#[test]
fn f16_compute_matches_f32() {
    let cfg = small();
    let p32 = Policy::new_random(&cfg, 3, &Device::Cpu).unwrap();
    let p16 = Policy::new_random(&cfg, 3, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::F16)
        .unwrap();
    assert_eq!(p16.compute_dtype(), DType::F16);
    assert_eq!(p16.weights_dtype().unwrap(), DType::F32);
    let (lp32, g32) = loss_and_grads(&p32);
    let (lp16, g16) = loss_and_grads(&p16);
    let worst = lp32
        .iter()
        .zip(&lp16)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.02, "max |Δ log-prob| {worst}");
    assert!(worst > 0.0, "the f16 path computed in f32");
    for (name, a) in &g32 {
        let b = &g16[name];
        assert_eq!(b.dtype(), DType::F32, "{name}");
        let rel = norm(&(a - b).unwrap()) / norm(a);
        assert!(norm(a) > 0.0, "{name} got no gradient");
        assert!(rel < 0.03, "{name}: relative gradient error {rel}");
    }
}

/// The logits are f32 whatever the compute dtype (log-softmax, loss and ratios in f32), and
/// the f16 views (no-grad, LoRA) keep the compute dtype.
#[test]
fn logits_are_f32_and_views_keep_the_dtype() {
    let cfg = small();
    let p = Policy::new_random(&cfg, 3, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::F16)
        .unwrap();
    let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
    assert_eq!(p.forward(&ids).unwrap().dtype(), DType::F32);
    assert_eq!(p.no_grad().unwrap().compute_dtype(), DType::F16);
    let lora = crate::lora::LoraConfig::new(4, 8.0);
    let l = p.with_lora(&lora, 1).unwrap();
    assert_eq!(l.compute_dtype(), DType::F16);
    assert_eq!(l.forward(&ids).unwrap().dtype(), DType::F32);
    assert_eq!(l.base_view().unwrap().compute_dtype(), DType::F16);
}

#[test]
fn bf16_compute_is_refused_on_the_cpu() {
    let p = Policy::new_random(&small(), 3, &Device::Cpu).unwrap();
    let e = p.with_compute_dtype(DType::BF16).unwrap_err().to_string();
    assert!(e.contains("bf16 compute needs a GPU"), "{e}");
    let p = Policy::new_random(&small(), 3, &Device::Cpu).unwrap();
    assert!(p.with_compute_dtype(DType::U32).is_err());
}
