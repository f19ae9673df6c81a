//! LoRA acceptance tests: the adapted forward equals the merged model's on every path, a
//! fresh adapter is the base exactly, gradients reach the adapters and never the base, and
//! adapters round-trip through safetensors.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::config::{Arch, ModelConfig};
use crate::infer::InferModel;
use crate::model::fused_tests::max_abs_diff;
use crate::weights::Policy;

/// The crate tests' small shape, untied (so `lm_head` is its own weight).
pub(super) fn small(arch: Arch) -> ModelConfig {
    crate::tests::small(arch, false)
}

pub(super) fn ids() -> Tensor {
    Tensor::new(
        &[[257u32, 5, 9, 200, 3, 77], [257, 1, 2, 3, 4, 5]],
        &Device::Cpu,
    )
    .unwrap()
}

/// A LoRA policy whose `B`s are non-zero (as after training), so the adapters matter.
fn trained_lora(cfg: &ModelConfig, lora: &LoraConfig) -> Policy {
    let p = Policy::new_random(cfg, 1, &Device::Cpu)
        .unwrap()
        .with_lora(lora, 2)
        .unwrap();
    for (name, var) in p.trainable_named_vars().unwrap() {
        if name.ends_with("lora_B.weight") {
            let t = Tensor::randn(0f32, 0.05, var.dims(), &Device::Cpu).unwrap();
            var.set(&t).unwrap();
        }
    }
    p
}

#[test]
fn a_zero_b_adapter_is_the_base_exactly() {
    let cfg = small(Arch::Qwen3);
    let base = Policy::new_random(&cfg, 1, &Device::Cpu).unwrap();
    let want = base.forward(&ids()).unwrap().to_vec3::<f32>().unwrap();
    let p = base.with_lora(&LoraConfig::new(4, 8.0), 2).unwrap();
    let a_nonzero = p.trainable_named_vars().unwrap().iter().any(|(n, v)| {
        n.ends_with("lora_A.weight")
            && v.as_tensor()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                > 0.0
    });
    assert!(a_nonzero, "A starts random");
    assert_eq!(p.forward(&ids()).unwrap().to_vec3::<f32>().unwrap(), want);
}

#[test]
fn lora_forward_equals_the_merged_models_forward() {
    for (arch, lora) in [
        (Arch::Qwen3, LoraConfig::new(4, 8.0)),
        (Arch::Qwen2, LoraConfig::new(1, 16.0)),
        (
            Arch::Qwen3,
            LoraConfig {
                rank: 3,
                alpha: 3.0,
                targets: vec!["v_proj".into(), "down_proj".into()],
            },
        ),
    ] {
        let cfg = small(arch);
        let p = trained_lora(&cfg, &lora);
        let merged =
            Policy::from_tensors(&cfg, p.effective_tensors().unwrap(), &Device::Cpu).unwrap();
        let base = p.base_view().unwrap().forward(&ids()).unwrap();
        let got = p.forward(&ids()).unwrap();
        let want = merged.forward(&ids()).unwrap();
        let d = max_abs_diff(&got, &want);
        assert!(d <= 1e-5, "{arch:?} {lora:?}: LoRA vs merged differ by {d}");
        assert!(
            max_abs_diff(&got, &base) > 1e-3,
            "the adapters change the model"
        );
        // The snapshot of a LoRA policy is the merged model, loadable as a plain policy.
        let snap =
            Policy::from_safetensors_bytes(&cfg, &p.to_safetensors_bytes().unwrap(), &Device::Cpu)
                .unwrap();
        assert!(max_abs_diff(&snap.forward(&ids()).unwrap(), &want) <= 1e-5);
    }
}

/// The training module's KV-cache decode and the inference path both compute the adapted
/// model.
#[test]
fn cached_decode_and_inference_path_apply_the_adapters() {
    let cfg = small(Arch::Qwen3);
    let p = trained_lora(&cfg, &LoraConfig::new(4, 8.0));
    let full = p.forward(&ids()).unwrap();
    let mut cache = p.new_cache();
    let x = ids();
    let first = p
        .model()
        .forward_cached(&x.narrow(1, 0, 4).unwrap(), &mut cache)
        .unwrap();
    let rest = p
        .model()
        .forward_cached(&x.narrow(1, 4, 2).unwrap(), &mut cache)
        .unwrap();
    let cached = Tensor::cat(&[first, rest], 1).unwrap();
    assert!(max_abs_diff(&cached, &full) <= 1e-5);

    let infer = InferModel::new(&p, DType::F32).unwrap();
    let mut ic = infer.new_cache(2, 16).unwrap();
    let last = infer.forward_last(&x, &mut ic).unwrap();
    let want = full.narrow(1, 5, 1).unwrap().squeeze(1).unwrap();
    let d = max_abs_diff(&last.reshape(want.dims()).unwrap(), &want);
    assert!(d <= 1e-4, "inference path vs LoRA forward: {d}");
}

#[test]
fn gradients_reach_every_adapter_and_no_base_weight() {
    for arch in [Arch::Qwen3, Arch::Qwen2] {
        let cfg = small(arch);
        let lora = LoraConfig::new(2, 4.0);
        let p = trained_lora(&cfg, &lora);
        let grads = adapter_gradients(&p);
        assert_eq!(grads.len(), adapter_shapes(&cfg, &lora).len());
        assert_eq!(grads.len(), 2 * 7 * cfg.num_hidden_layers);
    }
}

/// The gradient of every adapter of `p` (by name, sorted) for a log-prob loss on [`ids`],
/// asserting that each is non-zero and finite, that no base weight gets one, and that no
/// weight-shaped gradient is computed at all.
pub(super) fn adapter_gradients(p: &Policy) -> Vec<(String, Tensor)> {
    let targets = Tensor::new(
        &[[5u32, 9, 200, 3, 77, 258], [1, 2, 3, 4, 5, 258]],
        &Device::Cpu,
    )
    .unwrap();
    let logits = p.forward(&ids()).unwrap();
    let lp = crate::sampling::token_logprobs(&logits, &targets, 1.0).unwrap();
    let grads = lp.sum_all().unwrap().neg().unwrap().backward().unwrap();
    let trainable = p.trainable_named_vars().unwrap();
    let mut out = Vec::new();
    for (name, var) in &trainable {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        let n = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(n > 0.0 && n.is_finite(), "{name}: gradient norm² {n}");
        out.push((name.clone(), g.clone()));
    }
    for (name, var) in p.named_vars().unwrap() {
        assert!(
            grads.get(var.as_tensor()).is_none(),
            "base weight {name} got a gradient"
        );
    }
    // Nor a detached view of one: no weight-shaped gradient is computed at all (candle's
    // matmul backward would compute one for a detached weight; the frozen linear does not).
    let weight_shapes: Vec<Vec<usize>> = p
        .named_vars()
        .unwrap()
        .iter()
        .filter(|(n, _)| n.ends_with("proj.weight") || n.contains("embed") || n.contains("lm_head"))
        .flat_map(|(_, v)| [v.dims().to_vec(), v.dims().iter().rev().copied().collect()])
        .collect();
    for id in grads.get_ids() {
        let dims = grads.get_id(*id).unwrap().dims().to_vec();
        assert!(
            !weight_shapes.contains(&dims),
            "a weight-shaped gradient {dims:?}"
        );
    }
    let vars = p.vars().unwrap();
    assert_eq!(vars.len(), trainable.len(), "vars() are the adapters");
    out
}

#[test]
fn adapters_round_trip_through_safetensors() {
    let cfg = small(Arch::Qwen3);
    let lora = LoraConfig {
        rank: 2,
        alpha: 5.0,
        targets: vec!["q_proj".into(), "up_proj".into()],
    };
    let p = trained_lora(&cfg, &lora);
    let a = p.lora().unwrap();
    let bytes = a.to_safetensors_bytes(&cfg).unwrap();
    let back = Adapters::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu).unwrap();
    assert_eq!(back.config(), &lora);
    assert_eq!(back.to_safetensors_bytes(&cfg).unwrap(), bytes);
    let base = Policy::new_random(&cfg, 1, &Device::Cpu).unwrap();
    let base_bytes = base.to_safetensors_bytes().unwrap();
    let q = base.with_adapters(back).unwrap();
    assert_eq!(
        q.forward(&ids()).unwrap().to_vec3::<f32>().unwrap(),
        p.forward(&ids()).unwrap().to_vec3::<f32>().unwrap()
    );
    // Another model's config is refused, naming both hashes.
    let other = ModelConfig {
        hidden_size: 16,
        ..cfg.clone()
    };
    let err = Adapters::from_safetensors_bytes(&other, &bytes, &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, crate::error::PolicyError::ConfigMismatch { .. }),
        "{err}"
    );
    // A base snapshot is not an adapter file.
    assert!(Adapters::from_safetensors_bytes(&cfg, &base_bytes, &Device::Cpu).is_err());
}

#[test]
fn bad_configs_are_clear_errors() {
    for (lora, needle) in [
        (LoraConfig::new(0, 1.0), "rank"),
        (LoraConfig::new(4, 0.0), "alpha"),
        (LoraConfig::new(4, f64::NAN), "alpha"),
        (
            LoraConfig {
                targets: vec!["lm_head".into()],
                ..LoraConfig::new(4, 8.0)
            },
            "unknown target \"lm_head\"",
        ),
        (
            LoraConfig {
                targets: vec![],
                ..LoraConfig::new(4, 8.0)
            },
            "empty",
        ),
        (
            LoraConfig {
                targets: vec!["q_proj".into(), "q_proj".into()],
                ..LoraConfig::new(4, 8.0)
            },
            "twice",
        ),
    ] {
        let err = lora.validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{err} lacks {needle}");
    }
    let toml_like: LoraConfig = serde_json::from_str(r#"{"rank": 8, "alpha": 16}"#).unwrap();
    assert_eq!(toml_like, LoraConfig::new(8, 16.0));
    assert!(serde_json::from_str::<LoraConfig>(r#"{"rank": 8, "alpha": 16, "rnak": 1}"#).is_err());
}

#[test]
fn merge_is_pure_and_checks_its_inputs() {
    let cfg = small(Arch::Qwen3);
    let lora = LoraConfig::new(2, 4.0);
    let p = trained_lora(&cfg, &lora);
    let base: HashMap<String, Tensor> = p
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let mut adapters: HashMap<String, Tensor> = p
        .trainable_named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let before = base["model.layers.0.self_attn.q_proj.weight"]
        .to_vec2::<f32>()
        .unwrap();
    let merged = merge(&base, &adapters, &lora).unwrap();
    assert_eq!(
        base["model.layers.0.self_attn.q_proj.weight"]
            .to_vec2::<f32>()
            .unwrap(),
        before,
        "the base is not modified"
    );
    // W + (α/r)·B·A, element by element, for one projection.
    let pre = "model.layers.1.mlp.down_proj";
    let want = (&base[&format!("{pre}.weight")]
        + adapters[&format!("{pre}.lora_B.weight")]
            .matmul(&adapters[&format!("{pre}.lora_A.weight")])
            .unwrap()
            .affine(2.0, 0.0)
            .unwrap())
    .unwrap();
    assert!(max_abs_diff(&merged[&format!("{pre}.weight")], &want) <= 1e-7);
    assert_eq!(
        merged["model.norm.weight"].to_vec1::<f32>().unwrap(),
        base["model.norm.weight"].to_vec1::<f32>().unwrap()
    );
    adapters.remove(&format!("{pre}.lora_B.weight"));
    assert!(merge(&base, &adapters, &lora).is_err(), "half an adapter");
    adapters.insert(
        "model.layers.9.mlp.down_proj.lora_A.weight".into(),
        Tensor::zeros((2, 48), DType::F32, &Device::Cpu).unwrap(),
    );
    adapters.insert(
        "model.layers.9.mlp.down_proj.lora_B.weight".into(),
        Tensor::zeros((32, 2), DType::F32, &Device::Cpu).unwrap(),
    );
    adapters.insert(
        format!("{pre}.lora_B.weight"),
        Tensor::zeros((32, 2), DType::F32, &Device::Cpu).unwrap(),
    );
    let err = merge(&base, &adapters, &lora).unwrap_err().to_string();
    assert!(err.contains("match no base weight"), "{err}");
}

#[test]
fn the_base_hash_names_the_weights() {
    let cfg = small(Arch::Qwen3);
    let a = Policy::new_random(&cfg, 1, &Device::Cpu).unwrap();
    let b = Policy::new_random(&cfg, 1, &Device::Cpu).unwrap();
    let c = Policy::new_random(&cfg, 2, &Device::Cpu).unwrap();
    let h = a.base_hash_hex().unwrap();
    assert_eq!(h.len(), 64);
    assert_eq!(h, b.base_hash_hex().unwrap());
    assert_ne!(h, c.base_hash_hex().unwrap());
    // Training adapters does not change the base's identity.
    let l = trained_lora(&cfg, &LoraConfig::new(2, 4.0));
    assert_eq!(l.base_hash_hex().unwrap(), h);
    // A bf16 container of the same values hashes alike (the values are hashed as f32).
    let t = Tensor::new(&[1.5f32, -2.0, 0.25], &Device::Cpu).unwrap();
    let t16 = t.to_dtype(DType::BF16).unwrap();
    assert_eq!(
        base_hash([("x", &t)]).unwrap(),
        base_hash([("x", &t16)]).unwrap()
    );
    assert_ne!(
        base_hash([("x", &t)]).unwrap(),
        base_hash([("y", &t)]).unwrap()
    );
}

#[test]
fn a_lora_policy_refuses_a_full_snapshot_into_its_base() {
    let cfg = small(Arch::Qwen3);
    let p = trained_lora(&cfg, &LoraConfig::new(2, 4.0));
    let snap = Policy::new_random(&cfg, 5, &Device::Cpu)
        .unwrap()
        .to_safetensors_bytes()
        .unwrap();
    let h = p.base_hash_hex().unwrap();
    assert!(p.load_safetensors_bytes(&snap).is_err());
    assert_eq!(p.base_hash_hex().unwrap(), h);
}

#[test]
fn peft_files_name_the_config_and_the_tensors_as_peft_does() {
    let cfg = small(Arch::Qwen3);
    let lora = LoraConfig::new(2, 5.0);
    let p = trained_lora(&cfg, &lora);
    let (json, weights) = p
        .lora()
        .unwrap()
        .to_peft_files(&cfg, Some("../base"))
        .unwrap();
    let c: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(c["peft_type"], "LORA");
    assert_eq!(c["task_type"], "CAUSAL_LM");
    assert_eq!(c["r"], 2);
    assert_eq!(c["lora_alpha"], 5.0);
    assert_eq!(c["fan_in_fan_out"], false);
    assert_eq!(c["bias"], "none");
    assert_eq!(
        c["use_rslora"], false,
        "PEFT scales by alpha/r only without rsLoRA"
    );
    assert_eq!(c["base_model_name_or_path"], "../base");
    let targets: Vec<&str> = c["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(targets, TARGETS);
    // Only fields of PEFT's LoraConfig: older releases refuse unknown keys.
    let known = [
        "peft_type",
        "task_type",
        "r",
        "lora_alpha",
        "target_modules",
        "lora_dropout",
        "bias",
        "fan_in_fan_out",
        "use_rslora",
        "use_dora",
        "init_lora_weights",
        "modules_to_save",
        "inference_mode",
        "base_model_name_or_path",
    ];
    for k in c.as_object().unwrap().keys() {
        assert!(
            known.contains(&k.as_str()),
            "unknown adapter_config key {k}"
        );
    }
    let t = candle_core::safetensors::load_buffer(&weights, &Device::Cpu).unwrap();
    assert_eq!(t.len(), adapter_shapes(&cfg, &lora).len());
    // PEFT's layout: lora_A is [r, in], lora_B is [out, r], under base_model.model.
    let q = cfg.num_attention_heads * cfg.head_dim;
    let a = &t["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    let b = &t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"];
    assert_eq!(a.dims(), &[2, cfg.hidden_size]);
    assert_eq!(b.dims(), &[q, 2]);
    let down = &t["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"];
    assert_eq!(down.dims(), &[2, cfg.intermediate_size]);
    let meta = crate::safetensors_io::snapshot_config_hash(&weights).unwrap();
    assert_eq!(meta, Some(cfg.hash_hex()));
    for (name, var) in p.trainable_named_vars().unwrap() {
        let got = &t[&format!("base_model.model.{name}")];
        assert_eq!(max_abs_diff(got, var.as_tensor()), 0.0, "{name}");
    }
}

/// A worker's adapter install: the base from a full snapshot of it, the adapters from their
/// payload, merged into the inference path. Its sampled log-probs equal the learner's
/// (the LoRA training forward) within 1e-4 in f32.
#[test]
fn an_installed_adapter_version_samples_with_the_learners_logprobs() {
    let cfg = ModelConfig::tiny();
    let lora = LoraConfig::new(4, 8.0);
    let learner = trained_lora(&cfg, &lora);
    let base_payload = learner.base_view().unwrap().to_safetensors_bytes().unwrap();
    let adapter_payload = learner.lora().unwrap().to_safetensors_bytes(&cfg).unwrap();
    assert_eq!(
        Adapters::stored_dtype(&adapter_payload).unwrap(),
        DType::F32
    );
    let base = Policy::from_safetensors_bytes(&cfg, &base_payload, &Device::Cpu).unwrap();
    assert_eq!(
        base.base_hash_hex().unwrap(),
        learner.base_hash_hex().unwrap()
    );
    let adapters = Adapters::from_safetensors_bytes(&cfg, &adapter_payload, &Device::Cpu).unwrap();
    let installed = base.adapted(adapters).unwrap();
    // The install shares the base's storage: no copy of the model.
    let (b, i) = (base.named_vars().unwrap(), installed.named_vars().unwrap());
    assert!(b
        .iter()
        .zip(&i)
        .all(|(x, y)| x.1.as_tensor().id() == y.1.as_tensor().id()));
    let model = InferModel::from_policy(&installed).unwrap();
    let params = crate::sampling::SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 16,
        stop_tokens: vec![],
    };
    let mut worst = 0f32;
    for (k, prompt) in [&[257u32, 5, 9][..], &[257, 200, 3, 77, 1]]
        .iter()
        .enumerate()
    {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(k as u64);
        let out = crate::infer::generate(&model, prompt, 3, &params, &mut rng).unwrap();
        for c in &out {
            let reference =
                crate::sampling::response_logprobs(&learner, prompt, &c.tokens, 1.0).unwrap();
            assert_eq!(reference.len(), c.logprobs.len());
            for (a, b) in c.logprobs.iter().zip(&reference) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    assert!(worst < 1e-4, "max |Δ log-prob| = {worst}");
}

/// bf16 adapter payloads: the base rounded to bf16 hashes as its bf16 snapshot does, the
/// adapters come back as their bf16 roundings, and the payload says its dtype.
#[test]
fn bf16_adapter_payloads_and_a_rounded_base_agree_with_the_workers_copy() {
    let cfg = ModelConfig::tiny();
    let learner = trained_lora(&cfg, &LoraConfig::new(2, 4.0));
    let base = Policy::new_random(&cfg, 1, &Device::Cpu).unwrap();
    let unrounded = base.base_hash_hex().unwrap();
    base.round_weights_to(DType::BF16).unwrap();
    assert_ne!(base.base_hash_hex().unwrap(), unrounded);
    let shipped = base.to_safetensors_bytes_as(DType::BF16).unwrap();
    let held = Policy::from_safetensors_bytes(&cfg, &shipped, &Device::Cpu).unwrap();
    assert_eq!(held.base_hash_hex().unwrap(), base.base_hash_hex().unwrap());

    let a = learner.lora().unwrap();
    let bytes = a.to_safetensors_bytes_as(&cfg, DType::BF16).unwrap();
    assert_eq!(Adapters::stored_dtype(&bytes).unwrap(), DType::BF16);
    assert!(bytes.len() < a.to_safetensors_bytes(&cfg).unwrap().len() * 6 / 10);
    let back = Adapters::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu).unwrap();
    assert_eq!(back.config(), a.config());
    for ((n1, v1), (n2, v2)) in a
        .named_vars()
        .unwrap()
        .iter()
        .zip(back.named_vars().unwrap())
    {
        assert_eq!(n1, &n2);
        let want = v1
            .as_tensor()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert_eq!(max_abs_diff(&want, v2.as_tensor()), 0.0, "{n1}");
    }
    assert!(Adapters::stored_dtype(b"not safetensors").is_err());
}
