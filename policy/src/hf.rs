//! Loading a Qwen2 / Qwen3 checkpoint from a local Hugging Face folder (`config.json`,
//! `tokenizer.json`, `*.safetensors`) into the trainable module, and writing one back: the
//! model ([`save_hf_dir`]), its tokenizer ([`save_byte_tokenizer`], [`copy_tokenizer_files`])
//! so that the folder loads again, and LoRA adapters as a PEFT folder ([`save_peft_dir`]).
//!
//! Nothing is downloaded: the folder must already hold the files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};
use crate::lora::Adapters;
use crate::tokenizer::{ByteTokenizer, Tokenizer};
use crate::weights::Policy;

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| PolicyError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `eos_token_id` of a config (an integer or a list of integers), if any.
fn eos_ids(json: &serde_json::Value) -> Vec<u32> {
    match json.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// The `*.safetensors` files of a folder, sorted by name.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| PolicyError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(PolicyError::Io {
            path: dir.join("*.safetensors"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no .safetensors file"),
        });
    }
    Ok(files)
}

/// The stop ids of a folder: `eos_token_id` of its `config.json` (parsed as `cfg_json`),
/// then of its `generation_config.json` when there is one.
fn stop_ids(dir: &Path, cfg_json: &serde_json::Value) -> Vec<u32> {
    let mut eos = eos_ids(cfg_json);
    if let Ok(bytes) = std::fs::read(dir.join("generation_config.json")) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            for id in eos_ids(&v) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
    }
    eos
}

/// The first stop id a Hugging Face folder names (`config.json`, then
/// `generation_config.json`), for the `config.json` of a model exported from it.
pub fn first_stop_id(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join("config.json");
    let cfg: serde_json::Value =
        serde_json::from_slice(&read(&path)?).map_err(|e| PolicyError::CorruptFile {
            path,
            reason: e.to_string(),
        })?;
    Ok(stop_ids(dir, &cfg).first().copied())
}

/// `dir/config.json`: the model configuration and the stop ids the folder names.
fn read_config(dir: &Path) -> Result<(ModelConfig, Vec<u32>)> {
    let cfg_path = dir.join("config.json");
    let cfg_text = String::from_utf8(read(&cfg_path)?).map_err(|_| PolicyError::CorruptFile {
        path: cfg_path.clone(),
        reason: "not UTF-8".into(),
    })?;
    let cfg_json: serde_json::Value =
        serde_json::from_str(&cfg_text).map_err(|e| PolicyError::CorruptFile {
            path: cfg_path.clone(),
            reason: e.to_string(),
        })?;
    let cfg = ModelConfig::from_hf_json(&cfg_text).map_err(|e| PolicyError::CorruptFile {
        path: cfg_path.clone(),
        reason: e.to_string(),
    })?;
    Ok((cfg, stop_ids(dir, &cfg_json)))
}

/// The tokenizer of a Hugging Face folder, with the stop ids its `config.json` and
/// `generation_config.json` name, exactly as [`load_hf_dir`] builds it — without reading the
/// weights. A learner checking what workers sampled needs the workers' stop tokens.
pub fn load_tokenizer(dir: &Path) -> Result<Tokenizer> {
    let (_, eos) = read_config(dir)?;
    Tokenizer::from_file(&dir.join("tokenizer.json"), &eos)
}

/// Loads `dir/config.json`, `dir/tokenizer.json` and every `dir/*.safetensors` (weights are
/// converted to f32). Tensors the architecture does not use (e.g. `rotary_emb.inv_freq`, or
/// `lm_head.weight` of a tied model) are ignored; a missing or mis-shaped one is an error.
pub fn load_hf_dir(dir: &Path, device: &Device) -> Result<(Policy, Tokenizer)> {
    let (cfg, eos) = read_config(dir)?;
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"), &eos)?;

    let wanted: HashMap<String, Vec<usize>> =
        crate::model::param_shapes(&cfg).into_iter().collect();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for file in safetensors_files(dir)? {
        let bytes = read(&file)?;
        let loaded = candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| {
            PolicyError::CorruptFile {
                path: file.clone(),
                reason: format!("not a valid safetensors file: {e}"),
            }
        })?;
        for (name, t) in loaded {
            if wanted.contains_key(&name) {
                tensors.insert(name, t);
            } else {
                tracing::debug!(tensor = %name, file = %file.display(), "ignoring unused tensor");
            }
        }
    }
    let policy = Policy::from_tensors(&cfg, tensors, device)?;
    Ok((policy, tokenizer))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PolicyError {
    let path = path.to_path_buf();
    move |source| PolicyError::Io { path, source }
}

/// Writes `config.json` and `model.safetensors` for `policy` into `dir` (created if needed),
/// loadable by Hugging Face tools and by [`load_hf_dir`] (with a tokenizer.json beside them).
/// A LoRA policy writes its merged weights.
pub fn save_hf_dir(policy: &Policy, dir: &Path, eos_token_id: Option<u32>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, policy.config().to_hf_json(eos_token_id)).map_err(io(&cfg))?;
    let st = dir.join("model.safetensors");
    std::fs::write(&st, policy.to_safetensors_bytes()?).map_err(io(&st))?;
    Ok(())
}

/// Writes the embedded byte tokenizer into `dir` as `tokenizer.json`
/// ([`ByteTokenizer::to_hf_json`], read back by [`load_hf_dir`] as the byte tokenizer),
/// `tokenizer_config.json` (for `transformers.AutoTokenizer`, with the built-in chat template
/// [`ByteTokenizer::CHAT_TEMPLATE`]) and `generation_config.json` ([`GenerationIds::byte`]).
pub fn save_byte_tokenizer(dir: &Path, model_max_length: usize) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let files = [
        ("tokenizer.json", ByteTokenizer.to_hf_json()),
        (
            "tokenizer_config.json",
            ByteTokenizer::hf_tokenizer_config_json(model_max_length),
        ),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    save_generation_config(dir, &GenerationIds::byte())
}

/// The token ids of a `generation_config.json`: what `transformers`' `generate` stops at and
/// pads with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationIds {
    pub bos: Option<u32>,
    /// Every stop id, the first being the one a model writes to end its turn.
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

impl GenerationIds {
    /// The embedded byte tokenizer's: `<|bos|>`, `<|eos|>`, `<|pad|>`.
    pub fn byte() -> Self {
        GenerationIds {
            bos: Some(ByteTokenizer::BOS),
            eos: vec![ByteTokenizer::EOS],
            pad: Some(ByteTokenizer::PAD),
        }
    }

    /// A tokenizer's stop and pad ids (no BOS: Qwen tokenizers have none).
    pub fn of(tokenizer: &Tokenizer) -> Self {
        match tokenizer {
            Tokenizer::Byte(_) => Self::byte(),
            Tokenizer::Hf(_) => GenerationIds {
                bos: None,
                eos: tokenizer.eos_ids(),
                pad: Some(tokenizer.pad_id()),
            },
        }
    }
}

/// Writes `dir/generation_config.json` with `ids` (`eos_token_id` as a list, read back by
/// [`load_hf_dir`] as stop ids).
pub fn save_generation_config(dir: &Path, ids: &GenerationIds) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut v = serde_json::json!({ "eos_token_id": ids.eos });
    if let Some(obj) = v.as_object_mut() {
        if let Some(b) = ids.bos {
            obj.insert("bos_token_id".into(), b.into());
        }
        if let Some(p) = ids.pad {
            obj.insert("pad_token_id".into(), p.into());
        }
    }
    let path = dir.join("generation_config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(io(&path))
}

/// Puts `template` as `chat_template` into `dir/tokenizer_config.json` (created as a
/// `PreTrainedTokenizerFast` config when missing) unless it has one; returns whether it
/// wrote. A config that is not a JSON object is an error naming the file.
pub fn add_chat_template(dir: &Path, template: &str) -> Result<bool> {
    let path = dir.join("tokenizer_config.json");
    let mut v = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
            PolicyError::CorruptFile {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            serde_json::json!({ "tokenizer_class": "PreTrainedTokenizerFast" })
        }
        Err(source) => return Err(PolicyError::Io { path, source }),
    };
    let Some(obj) = v.as_object_mut() else {
        return Err(PolicyError::CorruptFile {
            path,
            reason: "not a JSON object".into(),
        });
    };
    if obj.get("chat_template").is_some_and(|t| !t.is_null()) {
        return Ok(false);
    }
    obj.insert("chat_template".into(), template.into());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap_or_default())
        .map_err(io(&path))?;
    Ok(true)
}

/// The tokenizer files of a Hugging Face folder that [`copy_tokenizer_files`] carries over
/// (`tokenizer.json` must be there; the others are copied when present).
pub const TOKENIZER_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

/// Copies the tokenizer of the Hugging Face folder `src` into `dst` ([`TOKENIZER_FILES`]),
/// so that a model exported from one loads with the same tokenizer. A missing
/// `src/tokenizer.json` is an error; the file names copied are returned.
pub fn copy_tokenizer_files(src: &Path, dst: &Path) -> Result<Vec<&'static str>> {
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        let from = src.join(name);
        if !from.exists() && name != "tokenizer.json" {
            continue;
        }
        std::fs::copy(&from, dst.join(name)).map_err(io(&from))?;
        copied.push(name);
    }
    Ok(copied)
}

/// Writes `adapters` as a PEFT adapter folder (`adapter_config.json`,
/// `adapter_model.safetensors`; [`Adapters::to_peft_files`]) into `dir`, for
/// `peft.PeftModel.from_pretrained(base, dir)` over the base model (`base` names it in the
/// config's `base_model_name_or_path`).
pub fn save_peft_dir(
    adapters: &Adapters,
    model: &ModelConfig,
    dir: &Path,
    base: Option<&str>,
) -> Result<()> {
    let (config, weights) = adapters.to_peft_files(model, base)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join("adapter_config.json");
    std::fs::write(&path, config).map_err(io(&path))?;
    let path = dir.join("adapter_model.safetensors");
    std::fs::write(&path, weights).map_err(io(&path))?;
    Ok(())
}
