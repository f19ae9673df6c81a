//! Recomputed activations and chunked attention against the stored path.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

use super::super::precision_tests::{batch, pairs, small};
use super::super::use_elementary_ops;
use crate::sampling::{batch_response_logprobs, recomputed_response_logprobs};
use crate::weights::Policy;

/// The per-position weight of the surrogate `Σ log-probs ⊙ w` (a stand-in for `∂L/∂ℓ`).
fn weight(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::arange(0f32, n as f32, &Device::Cpu)
        .unwrap()
        .reshape(shape)
        .unwrap()
        .affine(-0.013, 0.4)
        .unwrap()
}

fn by_name(p: &Policy, grads: &GradStore) -> HashMap<String, Tensor> {
    p.trainable_named_vars()
        .unwrap()
        .into_iter()
        .filter_map(|(n, v)| grads.get(v.as_tensor()).map(|g| (n, g.clone())))
        .collect()
}

/// Log-probs and gradients of the stored path.
fn stored(p: &Policy) -> (Tensor, HashMap<String, Tensor>) {
    let b = batch();
    let (lp, _) = batch_response_logprobs(p, &pairs(&b), 0.9).unwrap();
    let w = weight(lp.dims());
    let g = (lp.clone() * w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    (lp.detach(), by_name(p, &g))
}

/// Log-probs and gradients of the recomputed path with attention in chunks of `chunk`.
fn recomputed(p: &Policy, chunk: usize) -> (Tensor, HashMap<String, Tensor>) {
    let b = batch();
    let (lp, pass) = recomputed_response_logprobs(p, &pairs(&b), 0.9, chunk).unwrap();
    assert!(!lp.track_op());
    let w = weight(lp.dims());
    let vars = p.trainable_named_vars().unwrap();
    let mut sum: HashMap<String, Tensor> = HashMap::new();
    pass.backward(&w, &mut |store| {
        for (n, v) in &vars {
            if let Some(g) = store.get(v.as_tensor()) {
                let g = g.detach();
                let total = match sum.remove(n) {
                    Some(prev) => (prev + g)?,
                    None => g,
                };
                sum.insert(n.clone(), total);
            }
        }
        Ok(())
    })
    .unwrap();
    (lp, sum)
}

fn max_abs(t: &Tensor) -> f32 {
    t.to_dtype(DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Every variable's gradient equal within `tol` of the largest entry of the stored one.
fn assert_close(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>, tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: variables with a gradient");
    for (name, ga) in a {
        let gb = b
            .get(name)
            .unwrap_or_else(|| panic!("{what}: {name} got no gradient"));
        let scale = max_abs(ga);
        assert!(scale > 0.0, "{what}: {name} has a zero gradient");
        let d = max_abs(&(ga - gb).unwrap()) / scale;
        assert!(
            d <= tol,
            "{what}: {name} differs by {d} of its largest entry"
        );
    }
}

fn check_against_stored(p: &Policy, lp_tol: f32, grad_tol: f32, what: &str) {
    let (lp, g) = stored(p);
    for chunk in [1, 4, 1000] {
        let (lp_r, g_r) = recomputed(p, chunk);
        let d = max_abs(&(&lp - &lp_r).unwrap());
        assert!(
            d <= lp_tol,
            "{what}, chunk {chunk}: log-probs differ by {d}"
        );
        assert_close(&g, &g_r, grad_tol, &format!("{what}, chunk {chunk}"));
    }
}

/// Recomputed = stored, attention chunked = whole, on the CPU's fused kernels (f32): the
/// same functions in the same order except the chunk's shorter key range, so log-probs
/// within 1e-5 and every variable's gradient within 1e-4 of its largest entry.
#[test]
fn recomputed_equals_stored_fused_f32() {
    let p = Policy::new_random(&small(), 5, &Device::Cpu).unwrap();
    check_against_stored(&p, 1e-5, 1e-4, "fused f32");
}

/// The same on the elementary-op path a GPU runs (mask added to the scores, spelled-out
/// softmax and RoPE).
#[test]
fn recomputed_equals_stored_elementary_f32() {
    let p = Policy::new_random(&small(), 5, &Device::Cpu).unwrap();
    use_elementary_ops(true);
    check_against_stored(&p, 1e-5, 1e-4, "elementary f32");
    use_elementary_ops(false);
}

/// In f16 the recomputed pass rounds the same values at the same places, save the kept
/// inputs' detach and the chunk's reduction: within f16's resolution of the stored f16 path.
#[test]
fn recomputed_equals_stored_f16() {
    let p = Policy::new_random(&small(), 5, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::F16)
        .unwrap();
    check_against_stored(&p, 1e-2, 2e-2, "f16");
}

/// A LoRA policy: the adapters' gradients, the frozen base's none.
#[test]
fn recomputed_equals_stored_lora() {
    let lora = crate::lora::LoraConfig::new(4, 8.0);
    let p = Policy::new_random(&small(), 5, &Device::Cpu)
        .unwrap()
        .with_lora(&lora, 2)
        .unwrap();
    let b = batch();
    let (lp, _) = batch_response_logprobs(&p, &pairs(&b), 0.9).unwrap();
    let w = weight(lp.dims());
    // B starts at zero: a step of the adapters first, so that A gets a gradient as well.
    let g = (lp * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for v in p.vars().unwrap() {
        if let Some(g) = g.get(v.as_tensor()) {
            v.set(&(v.as_tensor() + (g * 0.5).unwrap()).unwrap())
                .unwrap();
        }
    }
    let (lp, g) = stored(&p);
    let (lp_r, g_r) = recomputed(&p, 3);
    assert!(max_abs(&(&lp - &lp_r).unwrap()) <= 1e-5);
    let trainable: HashMap<String, Tensor> = p
        .trainable_named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, _)| (n.clone(), g[&n].clone()))
        .collect();
    assert_close(&trainable, &g_r, 1e-4, "lora");
}

/// What the forward keeps: the embedding and each layer's output, `[b, t, hidden]` each.
#[test]
fn the_forward_keeps_one_tensor_per_layer() {
    let cfg = small();
    let p = Policy::new_random(&cfg, 5, &Device::Cpu).unwrap();
    let b = batch();
    let (_, pass) = recomputed_response_logprobs(&p, &pairs(&b), 1.0, 4).unwrap();
    let t = b.iter().map(|(p, r)| p.len() + r.len() - 1).max().unwrap();
    let per = b.len() * t * cfg.hidden_size * 4;
    assert_eq!(pass.kept_bytes(), (cfg.num_hidden_layers + 1) * per);
}
