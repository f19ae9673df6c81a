//! Acceptance tests of the policy crate.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use rand::SeedableRng;

use crate::config::{Arch, ModelConfig};
use crate::error::PolicyError;
use crate::sampling::{generate, response_logprobs, GenerationPath, SamplingParams};
use crate::sft::{sft_loss, warm_start, SftExample, WarmStart};
use crate::tokenizer::{ByteTokenizer, Tokenizer};
use crate::weights::Policy;

pub(crate) fn small(arch: Arch, tied: bool) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: 260,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        max_position_embeddings: 64,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: tied,
        attention_bias: arch == Arch::Qwen2,
    }
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Random weights with non-trivial norms and biases, so that every path is exercised.
fn perturbed(cfg: &ModelConfig, seed: u64) -> Policy {
    let p = Policy::new_random(cfg, seed, &Device::Cpu).unwrap();
    for (name, var) in p.named_vars().unwrap() {
        if name.ends_with("norm.weight") || name.ends_with(".bias") {
            let noise = Tensor::randn(0f32, 0.1, var.dims(), &Device::Cpu).unwrap();
            let base = if name.ends_with(".bias") { 0.0 } else { 1.0 };
            var.set(&(noise + base).unwrap()).unwrap();
        }
    }
    p
}

fn assert_every_var_has_gradient(cfg: &ModelConfig) {
    let p = perturbed(cfg, 1);
    let ids = Tensor::new(
        &[[257u32, 5, 9, 200, 3, 77], [257, 1, 2, 3, 4, 5]],
        &Device::Cpu,
    )
    .unwrap();
    let targets = Tensor::new(
        &[[5u32, 9, 200, 3, 77, 258], [1, 2, 3, 4, 5, 258]],
        &Device::Cpu,
    )
    .unwrap();
    let logits = p.forward(&ids).unwrap();
    let lp = crate::sampling::token_logprobs(&logits, &targets, 1.0).unwrap();
    let loss = lp.sum_all().unwrap().neg().unwrap();
    let grads = loss.backward().unwrap();
    let vars = p.named_vars().unwrap();
    assert_eq!(vars.len(), crate::model::param_shapes(cfg).len());
    for (name, var) in vars {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient (detached op?)"));
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            norm > 0.0 && norm.is_finite(),
            "{name}: gradient norm {norm}"
        );
    }
}

#[test]
fn every_variable_gets_a_gradient_qwen3_tied() {
    assert_every_var_has_gradient(&small(Arch::Qwen3, true));
}

#[test]
fn every_variable_gets_a_gradient_qwen3_untied() {
    assert_every_var_has_gradient(&small(Arch::Qwen3, false));
}

#[test]
fn every_variable_gets_a_gradient_qwen2_bias() {
    assert_every_var_has_gradient(&small(Arch::Qwen2, false));
}

#[test]
fn every_variable_gets_a_gradient_embedded_default() {
    assert_every_var_has_gradient(&ModelConfig::tiny());
}

#[test]
fn cached_forward_matches_full_forward() {
    let cfg = small(Arch::Qwen3, true);
    let p = perturbed(&cfg, 2);
    let seq: Vec<u32> = vec![257, 10, 20, 30, 40, 50, 60, 70];
    let ids = Tensor::new(seq.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let full = p
        .forward(&ids)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut cache = p.new_cache();
    let mut rows = Vec::new();
    // Prefill 3, then one token at a time.
    let pre = p
        .model()
        .forward_cached(&ids.narrow(1, 0, 3).unwrap(), &mut cache)
        .unwrap();
    rows.extend(pre.squeeze(0).unwrap().to_vec2::<f32>().unwrap());
    for i in 3..seq.len() {
        let out = p
            .model()
            .forward_cached(&ids.narrow(1, i, 1).unwrap(), &mut cache)
            .unwrap();
        rows.extend(out.squeeze(0).unwrap().to_vec2::<f32>().unwrap());
    }
    assert_eq!(cache.len(), seq.len());
    for (a, b) in full.iter().flatten().zip(rows.iter().flatten()) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

/// Generation never needs gradients: a KV cache that kept the op graph of its keys and values
/// would keep every earlier copy and every step's activations alive (memory quadratic in the
/// length). After a prefill, decode steps, a batch repeat and a row selection, no cached
/// tensor records an op.
#[test]
fn kv_cache_holds_detached_tensors() {
    let cfg = small(Arch::Qwen3, true);
    let p = perturbed(&cfg, 2);
    let ids = Tensor::new(&[257u32, 10, 20, 30], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let mut cache = p.new_cache();
    let logits = p.model().forward_cached(&ids, &mut cache).unwrap();
    // The weights are variables: the step's own output does record its graph.
    assert!(logits.track_op());
    assert!(!cache.carries_graph(), "prefill left a graph in the cache");
    cache.repeat_batch(3).unwrap();
    for step in 0..4u32 {
        let next = Tensor::new(&[[40 + step], [50 + step], [60 + step]], &Device::Cpu).unwrap();
        p.model().forward_cached_last(&next, &mut cache).unwrap();
        assert!(!cache.carries_graph(), "decode step {step} left a graph");
    }
    cache.select_rows(&[2, 0]).unwrap();
    assert!(!cache.carries_graph());
    assert_eq!(cache.len(), 8);
}

fn check_logprobs(cfg: &ModelConfig, path: GenerationPath, params: &SamplingParams) {
    let p = perturbed(cfg, 3);
    let prompt = ByteTokenizer.encode_prompt("12+34=");
    let outs = generate(&p, &prompt, 4, params, path, &mut rng(7)).unwrap();
    assert_eq!(outs.len(), 4);
    let mut max_err = 0f32;
    for c in &outs {
        assert_eq!(c.tokens.len(), c.logprobs.len());
        assert!(!c.tokens.is_empty());
        let full = response_logprobs(&p, &prompt, &c.tokens, params.logprob_temperature()).unwrap();
        for (a, b) in c.logprobs.iter().zip(&full) {
            assert!(a.is_finite() && *a <= 0.0);
            max_err = max_err.max((a - b).abs());
        }
    }
    assert!(
        max_err < 1e-4,
        "{path:?}: max |sampler - full forward| = {max_err}"
    );
}

#[test]
fn sampler_logprobs_equal_full_forward_batched() {
    let mut params = SamplingParams::new(20, vec![ByteTokenizer::EOS]);
    check_logprobs(&small(Arch::Qwen3, true), GenerationPath::Batched, &params);
    params.temperature = 0.7;
    params.top_p = 0.9;
    check_logprobs(&small(Arch::Qwen2, false), GenerationPath::Batched, &params);
}

#[test]
fn sampler_logprobs_equal_full_forward_sequential() {
    let mut params = SamplingParams::new(20, vec![ByteTokenizer::EOS]);
    check_logprobs(
        &small(Arch::Qwen3, true),
        GenerationPath::Sequential,
        &params,
    );
    params.temperature = 1.3;
    check_logprobs(
        &small(Arch::Qwen3, false),
        GenerationPath::Sequential,
        &params,
    );
}

#[test]
fn batched_path_with_early_stops_matches_full_forward() {
    // Make EOS likely so that rows finish at different steps and the batch is compacted.
    let cfg = small(Arch::Qwen3, false);
    let p = perturbed(&cfg, 4);
    let vars: HashMap<String, candle_core::Var> = p.named_vars().unwrap().into_iter().collect();
    let head = &vars["lm_head.weight"];
    let mut w = head.as_tensor().to_vec2::<f32>().unwrap();
    for x in w[ByteTokenizer::EOS as usize].iter_mut() {
        *x *= 40.0;
    }
    head.set(&Tensor::new(w, &Device::Cpu).unwrap()).unwrap();
    let params = SamplingParams::new(16, vec![ByteTokenizer::EOS]);
    let prompt = ByteTokenizer.encode_prompt("7*8=");
    let outs = generate(
        &p,
        &prompt,
        8,
        &params,
        GenerationPath::Batched,
        &mut rng(3),
    )
    .unwrap();
    let lens: Vec<usize> = outs.iter().map(|c| c.tokens.len()).collect();
    assert!(outs.iter().any(|c| c.stopped), "{lens:?}");
    for c in &outs {
        if c.stopped {
            assert_eq!(c.tokens.last(), Some(&ByteTokenizer::EOS));
        }
        let full = response_logprobs(&p, &prompt, &c.tokens, 1.0).unwrap();
        for (a, b) in c.logprobs.iter().zip(&full) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}

#[test]
fn generation_is_reproducible_with_a_seed_and_respects_limits() {
    let p = perturbed(&small(Arch::Qwen3, true), 5);
    let prompt = ByteTokenizer.encode_prompt("hi");
    let params = SamplingParams::new(9, vec![ByteTokenizer::EOS]);
    let a = generate(
        &p,
        &prompt,
        3,
        &params,
        GenerationPath::Batched,
        &mut rng(1),
    )
    .unwrap();
    let b = generate(
        &p,
        &prompt,
        3,
        &params,
        GenerationPath::Batched,
        &mut rng(1),
    )
    .unwrap();
    assert_eq!(a, b);
    assert!(a.iter().all(|c| c.tokens.len() <= 9));
    // Greedy: all samples identical.
    let mut g = params.clone();
    g.temperature = 0.0;
    let c = generate(&p, &prompt, 3, &g, GenerationPath::Batched, &mut rng(2)).unwrap();
    assert!(c.windows(2).all(|w| w[0].tokens == w[1].tokens));
    // Context bound: max_new_tokens is clipped to the context.
    let long: Vec<u32> = vec![65; 60];
    let d = generate(&p, &long, 2, &params, GenerationPath::Batched, &mut rng(2)).unwrap();
    assert!(d.iter().all(|c| c.tokens.len() <= 4));
}

#[test]
fn bad_generation_inputs_are_errors() {
    let p = perturbed(&small(Arch::Qwen3, true), 6);
    let params = SamplingParams::new(4, vec![]);
    let r = &mut rng(0);
    assert!(generate(&p, &[], 1, &params, GenerationPath::Batched, r).is_err());
    assert!(generate(&p, &[999], 1, &params, GenerationPath::Batched, r).is_err());
    assert!(generate(&p, &[1; 64], 1, &params, GenerationPath::Batched, r).is_err());
    let mut bad = params.clone();
    bad.top_p = 0.0;
    assert!(generate(&p, &[1], 1, &bad, GenerationPath::Batched, r).is_err());
    bad = params.clone();
    bad.temperature = f32::NAN;
    assert!(generate(&p, &[1], 1, &bad, GenerationPath::Batched, r).is_err());
    assert!(generate(&p, &[1], 0, &params, GenerationPath::Batched, r)
        .unwrap()
        .is_empty());
}

#[test]
fn safetensors_round_trip_is_bit_exact() {
    for cfg in [small(Arch::Qwen3, true), small(Arch::Qwen2, false)] {
        let p = perturbed(&cfg, 8);
        let bytes = p.to_safetensors_bytes().unwrap();
        assert_eq!(
            bytes,
            p.to_safetensors_bytes().unwrap(),
            "deterministic bytes"
        );
        let q = Policy::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu).unwrap();
        let (a, b) = (p.named_vars().unwrap(), q.named_vars().unwrap());
        assert_eq!(a.len(), b.len());
        for ((na, va), (nb, vb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            let x: Vec<u32> = va
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|f| f.to_bits())
                .collect();
            let y: Vec<u32> = vb
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|f| f.to_bits())
                .collect();
            assert_eq!(x, y, "{na}");
        }
        assert_eq!(bytes, q.to_safetensors_bytes().unwrap());
        // In-place load.
        let r = Policy::new_random(&cfg, 99, &Device::Cpu).unwrap();
        r.load_safetensors_bytes(&bytes).unwrap();
        assert_eq!(bytes, r.to_safetensors_bytes().unwrap());
    }
}

#[test]
fn snapshot_config_mismatch_and_corruption_are_errors() {
    let cfg = small(Arch::Qwen3, true);
    let bytes = perturbed(&cfg, 9).to_safetensors_bytes().unwrap();
    let mut other = cfg.clone();
    other.rope_theta = 1e6; // same shapes, different model
    let e = Policy::from_safetensors_bytes(&other, &bytes, &Device::Cpu).unwrap_err();
    assert!(matches!(e, PolicyError::ConfigMismatch { .. }), "{e}");
    let e =
        Policy::from_safetensors_bytes(&cfg, &bytes[..bytes.len() / 2], &Device::Cpu).unwrap_err();
    assert!(matches!(e, PolicyError::SafeTensors(_)), "{e}");
    let e = Policy::from_safetensors_bytes(&cfg, b"garbage", &Device::Cpu).unwrap_err();
    assert!(matches!(e, PolicyError::SafeTensors(_)), "{e}");
    assert_eq!(
        crate::safetensors_io::snapshot_config_hash(&bytes).unwrap(),
        Some(cfg.hash_hex())
    );
}

#[test]
fn from_tensors_rejects_missing_extra_and_misshaped() {
    let cfg = small(Arch::Qwen3, true);
    let p = perturbed(&cfg, 10);
    let full: HashMap<String, Tensor> = p
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let mut missing = full.clone();
    missing.remove("model.norm.weight");
    assert!(Policy::from_tensors(&cfg, missing, &Device::Cpu).is_err());
    let mut extra = full.clone();
    extra.insert(
        "lm_head.weight".into(),
        Tensor::zeros((260, 32), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    assert!(Policy::from_tensors(&cfg, extra, &Device::Cpu).is_err());
    let mut shaped = full;
    shaped.insert(
        "model.norm.weight".into(),
        Tensor::zeros(31, candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    let e = Policy::from_tensors(&cfg, shaped, &Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("model.norm.weight"), "{e}");
}

/// A tiny WordLevel tokenizer.json with Qwen-style special tokens, written by hand.
fn tiny_tokenizer_json(words: &[&str]) -> String {
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"];
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), i.into());
        if *s != "<unk>" {
            added.push(
                serde_json::json!({"id": i, "content": s, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
        }
    }
    for (i, w) in words.iter().enumerate() {
        vocab.insert(w.to_string(), (specials.len() + i).into());
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

fn write_tiny_hf_dir(dir: &std::path::Path) -> ModelConfig {
    let words = [
        "user",
        "assistant",
        "what",
        "is",
        "two",
        "plus",
        "three",
        "five",
        "?",
        "\n",
    ];
    let mut cfg = small(Arch::Qwen3, false);
    cfg.vocab_size = 4 + words.len();
    let p = Policy::new_random(&cfg, 11, &Device::Cpu).unwrap();
    crate::hf::save_hf_dir(&p, dir, Some(2)).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json(&words)).unwrap();
    cfg
}

#[test]
fn tiny_random_qwen3_folder_loads_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_tiny_hf_dir(dir.path());
    let (p, tok) = crate::hf::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(p.config(), &cfg);
    assert!(matches!(tok, Tokenizer::Hf(_)));
    assert!(tok.eos_ids().contains(&2));
    let prompt = tok.encode_prompt("what is two plus three ?").unwrap();
    assert_eq!(prompt[0], 1, "ChatML template starts with <|im_start|>");
    let params = SamplingParams::new(8, tok.eos_ids());
    let outs = generate(
        &p,
        &prompt,
        2,
        &params,
        GenerationPath::Batched,
        &mut rng(0),
    )
    .unwrap();
    for c in &outs {
        assert!(c.tokens.iter().all(|&t| (t as usize) < cfg.vocab_size));
        let _text = tok.decode(&c.tokens).unwrap();
        let full = response_logprobs(&p, &prompt, &c.tokens, 1.0).unwrap();
        for (a, b) in c.logprobs.iter().zip(&full) {
            assert!((a - b).abs() < 1e-4);
        }
    }
}

/// An export of the embedded model (weights + the byte tokenizer's `tokenizer.json`) is a
/// valid `model.source`: it loads back to the same tokenizer and the same logits.
#[test]
fn embedded_model_export_loads_back_with_the_same_tokenizer_and_logits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::tiny();
    let p = Policy::new_random(&cfg, 21, &Device::Cpu).unwrap();
    crate::hf::save_hf_dir(&p, dir.path(), Some(crate::ByteTokenizer::EOS)).unwrap();
    crate::hf::save_byte_tokenizer(dir.path(), cfg.max_position_embeddings).unwrap();
    let (q, tok) = crate::hf::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(q.config(), &cfg);
    assert!(matches!(tok, Tokenizer::Byte(_)), "{tok:?}");
    let prompt = tok.encode_prompt("3+4=").unwrap();
    assert_eq!(prompt, Tokenizer::byte().encode_prompt("3+4=").unwrap());
    assert_eq!(tok.eos_ids(), vec![crate::ByteTokenizer::EOS]);
    let ids = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want = p.forward(&ids).unwrap().to_vec3::<f32>().unwrap();
    assert_eq!(q.forward(&ids).unwrap().to_vec3::<f32>().unwrap(), want);
}

/// An export of a model trained from a Hugging Face folder carries that folder's tokenizer
/// files and stop id, and loads back with the same tokenizer.
#[test]
fn copied_tokenizer_files_make_an_export_of_an_hf_model_load_again() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_tiny_hf_dir(src.path());
    let (p, tok) = crate::hf::load_hf_dir(src.path(), &Device::Cpu).unwrap();
    let copied = crate::hf::copy_tokenizer_files(src.path(), dst.path()).unwrap();
    assert_eq!(copied, vec!["tokenizer.json"]);
    let eos = crate::hf::first_stop_id(src.path()).unwrap();
    assert_eq!(eos, Some(2));
    crate::hf::save_hf_dir(&p, dst.path(), eos).unwrap();
    let (_, back) = crate::hf::load_hf_dir(dst.path(), &Device::Cpu).unwrap();
    let text = "what is two plus three ?";
    assert_eq!(
        back.encode_prompt(text).unwrap(),
        tok.encode_prompt(text).unwrap()
    );
    assert_eq!(back.eos_ids(), tok.eos_ids());
    // A folder without a tokenizer.json has nothing to copy: an error naming the file.
    let empty = tempfile::tempdir().unwrap();
    let e = crate::hf::copy_tokenizer_files(empty.path(), dst.path()).unwrap_err();
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}

#[test]
fn hf_folder_missing_or_corrupt_files_are_clear_errors() {
    let load = |d: &std::path::Path| {
        crate::hf::load_hf_dir(d, &Device::Cpu)
            .unwrap_err()
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let e = load(dir.path());
    assert!(e.contains("config.json"), "{e}");

    write_tiny_hf_dir(dir.path());
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let e = load(dir.path());
    assert!(e.contains("tokenizer.json"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    write_tiny_hf_dir(dir.path());
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 100]).unwrap();
    let e = load(dir.path());
    assert!(e.contains("model.safetensors"), "{e}");

    std::fs::remove_file(&st).unwrap();
    let e = load(dir.path());
    assert!(e.contains("safetensors"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    write_tiny_hf_dir(dir.path());
    std::fs::write(
        dir.path().join("config.json"),
        b"{\"model_type\": \"qwen3\"",
    )
    .unwrap();
    let e = load(dir.path());
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn warm_start_lowers_the_loss() {
    let cfg = small(Arch::Qwen3, true);
    let p = Policy::new_random(&cfg, 12, &Device::Cpu).unwrap();
    let examples: Vec<SftExample> = (0..8)
        .map(|i| SftExample {
            prompt: ByteTokenizer.encode_prompt(&format!("{i}+1=")),
            target: {
                let mut t = ByteTokenizer.encode(&format!("{}", i + 1));
                t.push(ByteTokenizer::EOS);
                t
            },
        })
        .collect();
    let before = sft_loss(&p, &examples).unwrap().to_scalar::<f32>().unwrap();
    let losses = warm_start(
        &p,
        &examples,
        &WarmStart {
            steps: 15,
            batch_size: 8,
            lr: 1e-2,
            seed: 0,
        },
    )
    .unwrap();
    let after = sft_loss(&p, &examples).unwrap().to_scalar::<f32>().unwrap();
    assert_eq!(losses.len(), 15);
    assert!(after < before * 0.7, "{before} -> {after}");
}

#[test]
fn batch_logprobs_match_single_and_carry_gradients() {
    let cfg = small(Arch::Qwen3, true);
    let p = perturbed(&cfg, 13);
    let prompts: Vec<Vec<u32>> = vec![
        ByteTokenizer.encode_prompt("1+2="),
        ByteTokenizer.encode_prompt("10+20="),
    ];
    let responses: Vec<Vec<u32>> = vec![vec![51, 258], vec![51, 48, 52, 53, 258]];
    let pairs: Vec<(&[u32], &[u32])> = prompts
        .iter()
        .zip(&responses)
        .map(|(a, b)| (a.as_slice(), b.as_slice()))
        .collect();
    let (lp, mask) = crate::sampling::batch_response_logprobs(&p, &pairs, 0.8).unwrap();
    assert_eq!(lp.dims(), &[2, 5]);
    let lpv = lp.to_vec2::<f32>().unwrap();
    let mv = mask.to_vec2::<f32>().unwrap();
    for (i, (pr, r)) in pairs.iter().enumerate() {
        let single = response_logprobs(&p, pr, r, 0.8).unwrap();
        for j in 0..5 {
            if j < r.len() {
                assert_eq!(mv[i][j], 1.0);
                assert!((lpv[i][j] - single[j]).abs() < 1e-4);
            } else {
                assert_eq!((mv[i][j], lpv[i][j]), (0.0, 0.0));
            }
        }
    }
    let loss = (lp * &mask).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    for (name, v) in p.named_vars().unwrap() {
        assert!(grads.get(v.as_tensor()).is_some(), "{name}");
    }
}

#[test]
fn bf16_snapshot_is_half_the_size_and_loads_rounded() {
    use candle_core::DType;
    let cfg = ModelConfig::tiny();
    let p = Policy::new_random(&cfg, 21, &Device::Cpu).unwrap();
    let f32_bytes = p.to_safetensors_bytes().unwrap();
    assert_eq!(f32_bytes, p.to_safetensors_bytes_as(DType::F32).unwrap());
    let bf16_bytes = p.to_safetensors_bytes_as(DType::BF16).unwrap();
    // Deterministic.
    assert_eq!(bf16_bytes, p.to_safetensors_bytes_as(DType::BF16).unwrap());
    // Half the tensor bytes; the headers differ only in the dtype tags and offsets.
    let data = 4 * cfg.num_params() as usize;
    let f32_header = f32_bytes.len() - data;
    let bf16_header = bf16_bytes.len() - data / 2;
    assert!(
        f32_header.abs_diff(bf16_header) < 4096,
        "{f32_header} vs {bf16_header}"
    );
    assert!(f32_header < 16_384);
    // Loads into an f32 model whose weights are the originals rounded to bf16.
    let q = Policy::from_safetensors_bytes(&cfg, &bf16_bytes, &Device::Cpu).unwrap();
    let theirs: HashMap<String, candle_core::Var> = q.named_vars().unwrap().into_iter().collect();
    let mut changed = false;
    for (name, var) in p.named_vars().unwrap() {
        let got = theirs[&name].as_tensor();
        assert_eq!(got.dtype(), DType::F32);
        let want = var
            .as_tensor()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let (g, w, o) = (
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            var.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
        assert_eq!(g, w, "{name}");
        changed |= g != o;
    }
    assert!(changed, "bf16 rounding changed no weight at all");
    // Loading in place also accepts bf16; f16 payloads load too.
    p.load_safetensors_bytes(&bf16_bytes).unwrap();
    assert_eq!(
        p.to_safetensors_bytes().unwrap(),
        q.to_safetensors_bytes().unwrap()
    );
    assert!(p.to_safetensors_bytes_as(DType::U8).is_err());
}

#[test]
fn f16_payloads_load_and_other_dtypes_are_refused() {
    use candle_core::DType;
    let cfg = small(Arch::Qwen3, true);
    let p = Policy::new_random(&cfg, 2, &Device::Cpu).unwrap();
    let mut f16 = Vec::new();
    let mut ints = Vec::new();
    for (name, var) in p.named_vars().unwrap() {
        let t = var.as_tensor().flatten_all().unwrap();
        let h: Vec<u8> = t
            .to_dtype(DType::F16)
            .unwrap()
            .to_vec1::<half::f16>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        f16.push((name.clone(), var.dims().to_vec(), h));
        ints.push((name, var.dims().to_vec(), vec![0u8; t.elem_count()]));
    }
    let bytes = crate::safetensors_io::write_safetensors(&f16, "F16", &cfg.hash_hex()).unwrap();
    let q = Policy::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu).unwrap();
    let (a, b) = (
        p.named_vars().unwrap()[0].1.as_tensor().clone(),
        q.named_vars().unwrap()[0].1.as_tensor().clone(),
    );
    let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() < 1e-3);
    let bytes = crate::safetensors_io::write_safetensors(&ints, "U8", &cfg.hash_hex()).unwrap();
    let e = Policy::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("F32, BF16 or F16"), "{e}");
}

/// The no-grad view computes the same logits bit for bit without recording a graph, and sees
/// later updates of the variables (shared storage).
#[test]
fn no_grad_view_shares_weights_without_a_graph() {
    let cfg = small(Arch::Qwen3, true);
    let p = perturbed(&cfg, 4);
    let view = p.no_grad().unwrap();
    let ids = Tensor::new(&[[257u32, 10, 20, 30]], &Device::Cpu).unwrap();
    let tracked = p.forward(&ids).unwrap();
    let free = view.forward(&ids).unwrap();
    assert!(tracked.track_op());
    assert!(!free.track_op());
    assert_eq!(
        tracked.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        free.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    );
    let (name, var) = p.named_vars().unwrap().remove(0);
    var.set(&(var.as_tensor() * 2.0).unwrap()).unwrap();
    let after = view.forward(&ids).unwrap();
    assert_eq!(
        after.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        p.forward(&ids)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        "{name}: the view must see the update"
    );
}

/// A config written by transformers 5.24 (`rope_parameters` only) and one in the 4.x layout
/// (top-level `rope_theta`), each with a RoPE base far from the 10 000 default: loaded by
/// `load_hf_dir`, the forward equals the logits `transformers` computed from the same folder
/// (`scripts/hf-rope-fixture.py`, recorded once, rounded to 1e-5).
#[test]
fn transformers_5_and_4_configs_load_with_their_rope_base_and_match_hf_logits() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/qwen3-rope");
    for layout in ["tf5", "tf4"] {
        let src = root.join(layout);
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        crate::hf::save_byte_tokenizer(dir.path(), 128).unwrap();
        let want: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("logits.json")).unwrap()).unwrap();
        let ids: Vec<u32> = serde_json::from_value(want["ids"].clone()).unwrap();
        let logits: Vec<Vec<f32>> = serde_json::from_value(want["logits"].clone()).unwrap();
        let (p, _) = crate::hf::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
        assert_eq!(
            p.config().rope_theta,
            want["rope_theta"].as_f64().unwrap(),
            "{layout}"
        );
        let t = Tensor::new(ids.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let max_diff = |p: &Policy| -> f32 {
            let got = p.forward(&t).unwrap().squeeze(0).unwrap();
            let got = got.to_vec2::<f32>().unwrap();
            assert_eq!((got.len(), got[0].len()), (logits.len(), logits[0].len()));
            got.iter()
                .zip(&logits)
                .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
                .fold(0.0, f32::max)
        };
        let d = max_diff(&p);
        assert!(d < 1e-4, "{layout}: max |ours - transformers| = {d}");
        // The base matters: the 10 000 default is far off on these 64 positions.
        let path = dir.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        match cfg.get_mut("rope_parameters") {
            Some(r) => r["rope_theta"] = 10_000.0.into(),
            None => cfg["rope_theta"] = 10_000.0.into(),
        }
        std::fs::write(&path, cfg.to_string()).unwrap();
        let (q, _) = crate::hf::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
        assert_eq!(q.config().rope_theta, 10_000.0);
        let d = max_diff(&q);
        assert!(d > 1.0, "{layout}: θ = 10 000 is only {d} off");
    }
}
