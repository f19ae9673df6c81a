//! `echo-node export` on checkpoints made in-process: a full one becomes a folder that loads
//! back as a `model.source` (byte tokenizer included); a LoRA one adds the PEFT folder, whose
//! adapters over the base compute the merged model; a wrong base is refused with both hashes.

use std::path::Path;

use policy::{Device, LoraConfig, ModelConfig, Policy, Tensor, Tokenizer};

use super::*;
use crate::test_util::max_diff;

fn args(ckpt: &Path, base: Option<&Path>, out: &Path) -> ExportArgs {
    ExportArgs {
        checkpoint: Some(ckpt.to_path_buf()),
        config: None,
        base: base.map(Path::to_path_buf),
        out: out.to_path_buf(),
        json: true,
    }
}

fn ids() -> Tensor {
    let p = policy::ByteTokenizer.encode_prompt("3+4=");
    Tensor::new(p.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
}

fn logits(p: &Policy) -> Tensor {
    p.forward(&ids()).unwrap()
}

#[test]
fn a_full_checkpoint_exports_to_a_folder_that_loads_as_model_source() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out) = (tmp.path().join("ckpt"), tmp.path().join("out"));
    let policy = Policy::new_random(&ModelConfig::tiny(), 4, &Device::Cpu).unwrap();
    let want = logits(&policy);
    let t = learner::Trainer::new(policy, learner::TrainerConfig::default()).unwrap();
    t.save(&ckpt).unwrap();
    export(&args(&ckpt, None, &out)).unwrap();
    assert!(!out.join("peft").exists());
    let (p, tok) = policy::hf::load_hf_dir(&out, &Device::Cpu).unwrap();
    assert!(matches!(tok, Tokenizer::Byte(_)), "{tok:?}");
    assert_eq!(max_diff(&logits(&p), &want), 0.0);
    // The chat template the model was trained with, and its stop ids for `generate`.
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(out.join(f)).unwrap()).unwrap()
    };
    assert_eq!(
        read("tokenizer_config.json")["chat_template"],
        policy::ByteTokenizer::CHAT_TEMPLATE
    );
    let generation = read("generation_config.json");
    assert_eq!(generation["eos_token_id"], serde_json::json!([258]));
    assert_eq!(generation["pad_token_id"], 256);
    let template = policy::chat::hf_chat_template(&out).unwrap().unwrap();
    let chat = policy::chat::Chat::for_model(tok, Some(template), true).unwrap();
    assert!(matches!(chat.template(), policy::chat::Template::Builtin));
    // A second export into the same folder is refused, and changes nothing.
    let before = std::fs::read(out.join("model.safetensors")).unwrap();
    let e = export(&args(&ckpt, None, &out)).unwrap_err().to_string();
    assert!(e.contains("export into an empty folder"), "{e}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        before
    );
}

#[test]
fn a_lora_checkpoint_exports_merged_model_and_peft_folder_over_its_base() {
    let tmp = tempfile::tempdir().unwrap();
    let (ckpt, out, base_dir) = (
        tmp.path().join("ckpt"),
        tmp.path().join("out"),
        tmp.path().join("base"),
    );
    let cfg = ModelConfig::tiny();
    let base = Policy::new_random(&cfg, 4, &Device::Cpu).unwrap();
    policy::hf::save_hf_dir(&base, &base_dir, Some(policy::ByteTokenizer::EOS)).unwrap();
    policy::hf::save_byte_tokenizer(&base_dir, cfg.max_position_embeddings).unwrap();
    let lora = LoraConfig::new(2, 32.0);
    let p = base.with_lora(&lora, 7).unwrap();
    for (name, var) in p.trainable_named_vars().unwrap() {
        if name.ends_with("lora_B.weight") {
            var.set(&Tensor::randn(0f32, 0.05, var.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    let want = logits(&p);
    let t = learner::Trainer::new(p, learner::TrainerConfig::default()).unwrap();
    t.save(&ckpt).unwrap();

    // Without a base it cannot be exported.
    let e = export(&args(&ckpt, None, &out)).unwrap_err().to_string();
    assert!(e.contains("--base"), "{e}");

    export(&args(&ckpt, Some(&base_dir), &out)).unwrap();
    let (merged, tok) = policy::hf::load_hf_dir(&out, &Device::Cpu).unwrap();
    assert!(matches!(tok, Tokenizer::Byte(_)));
    assert!(max_diff(&logits(&merged), &want) <= 1e-5);
    assert!(
        !out.join("base").exists(),
        "--base names the base: not copied"
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("echo-export.json")).unwrap()).unwrap();
    assert_eq!(meta["lora"]["rank"], 2);
    let peft = Path::new(meta["peft"].as_str().unwrap());
    let cfg_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(peft.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg_json["r"], 2);
    // The PEFT tensors over the base compute the merged model (PEFT's arithmetic:
    // W + (lora_alpha / r)·B·A on every targeted projection).
    let bytes = std::fs::read(peft.join("adapter_model.safetensors")).unwrap();
    let tensors = policy::candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).unwrap();
    let adapters: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, v)| (k.strip_prefix("base_model.model.").unwrap().to_string(), v))
        .collect();
    let (base, _) = policy::hf::load_hf_dir(&base_dir, &Device::Cpu).unwrap();
    let adapted = base
        .with_adapters(policy::Adapters::from_tensors(&cfg, &lora, adapters, &Device::Cpu).unwrap())
        .unwrap();
    assert!(max_diff(&logits(&adapted), &want) <= 1e-5);

    // Another base is refused, naming both hashes.
    let other = tmp.path().join("other");
    let wrong = Policy::new_random(&cfg, 5, &Device::Cpu).unwrap();
    policy::hf::save_hf_dir(&wrong, &other, Some(policy::ByteTokenizer::EOS)).unwrap();
    policy::hf::save_byte_tokenizer(&other, cfg.max_position_embeddings).unwrap();
    let e = format!(
        "{:#}",
        export(&args(&ckpt, Some(&other), &tmp.path().join("out2"))).unwrap_err()
    );
    let (want_hash, have_hash) = (
        t.policy().base_hash_hex().unwrap(),
        wrong.base_hash_hex().unwrap(),
    );
    assert!(e.contains(&want_hash) && e.contains(&have_hash), "{e}");
    assert!(
        !tmp.path().join("out2").exists(),
        "nothing written on refusal"
    );
}
