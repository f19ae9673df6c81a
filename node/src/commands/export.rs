//! `echo-node export (--checkpoint DIR [--base DIR] | --config FILE) --out DIR`: a learner
//! checkpoint as a Hugging Face folder (`config.json` + `model.safetensors` + the tokenizer
//! with the chat template the model was trained with and a `generation_config.json` of its
//! stop ids, so that the folder is a valid `model.source` again and `transformers`'
//! `apply_chat_template` and `generate` work on it) plus `echo-export.json` naming the
//! version and where it came from. For a LoRA checkpoint the folder holds the merged model,
//! and `DIR/peft/` the adapters as a PEFT adapter folder (`adapter_config.json` +
//! `adapter_model.safetensors`) for `peft.PeftModel.from_pretrained(base, DIR/peft)`; the
//! base is `--base DIR`, or, rebuilt from `--config` as the learner builds it, written to
//! `DIR/base/` unless it is `model.source` unchanged (no warm start). Formats and how to load
//! them: `docs/model.md`, "Export".

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::json;

use crate::cli::ExportArgs;
use crate::config::NodeConfig;

/// Where the exported model's tokenizer comes from.
#[derive(Clone)]
enum TokenizerSource {
    /// The embedded byte tokenizer, written as `tokenizer.json`.
    Byte,
    /// The tokenizer files of this Hugging Face folder, copied.
    Folder(PathBuf),
    /// Unknown (a checkpoint of a Hugging Face model exported without --base or --config).
    None,
}

impl TokenizerSource {
    /// The source for a model of `cfg`: the Hugging Face folder it came from when known,
    /// the byte tokenizer for the embedded model's vocabulary.
    fn of(folder: Option<&Path>, cfg: &policy::ModelConfig) -> Self {
        match folder {
            Some(f) => TokenizerSource::Folder(f.to_path_buf()),
            None if cfg.vocab_size == policy::ByteTokenizer::VOCAB_SIZE => TokenizerSource::Byte,
            None => TokenizerSource::None,
        }
    }

    /// Writes the tokenizer into `dir`; returns the stop id for its `config.json`.
    fn write(&self, dir: &Path, cfg: &policy::ModelConfig) -> anyhow::Result<Option<u32>> {
        match self {
            TokenizerSource::Byte => {
                policy::hf::save_byte_tokenizer(dir, cfg.max_position_embeddings)?;
                Ok(Some(policy::ByteTokenizer::EOS))
            }
            TokenizerSource::Folder(src) => {
                let copied = policy::hf::copy_tokenizer_files(src, dir)?;
                let tokenizer = policy::hf::load_tokenizer(src)?;
                if !copied.contains(&"generation_config.json") {
                    let ids = policy::hf::GenerationIds::of(&tokenizer);
                    policy::hf::save_generation_config(dir, &ids)?;
                }
                // A folder without a template chats with the built-in one (byte tokenizer)
                // or in ChatML when it has the tokens (`policy::chat::Chat::for_model`): the
                // export writes it down for other tools.
                let implied = match &tokenizer {
                    policy::Tokenizer::Byte(_) => Some(policy::ByteTokenizer::CHAT_TEMPLATE),
                    t if t.token_id("<|im_start|>").is_some() => Some(policy::chat::CHATML),
                    _ => None,
                };
                if let Some(t) = implied {
                    if policy::chat::hf_chat_template(src)?.is_none() {
                        policy::hf::add_chat_template(dir, t)?;
                    }
                }
                Ok(policy::hf::first_stop_id(src)?)
            }
            TokenizerSource::None => {
                tracing::warn!(
                    dir = %dir.display(),
                    "the checkpoint's model is not the embedded one and no --base or --config \
                     names its Hugging Face folder: no tokenizer written (copy that folder's \
                     tokenizer files beside the export to use it as model.source)"
                );
                Ok(None)
            }
        }
    }
}

/// The frozen base of a LoRA checkpoint: the policy, the folder it can be loaded from (when
/// it exists as one), and where its tokenizer comes from.
struct Base {
    policy: policy::Policy,
    folder: Option<PathBuf>,
    tokenizer: TokenizerSource,
}

/// The base named by `--base DIR`, or rebuilt from `--config` as the learner builds it
/// (`[model]`, then the warm start).
fn load_base(args: &ExportArgs, config: Option<&NodeConfig>) -> anyhow::Result<Base> {
    let cpu = policy::Device::Cpu;
    if let Some(dir) = &args.base {
        let (policy, _) = policy::hf::load_hf_dir(dir, &cpu)
            .with_context(|| format!("loading the base {}", dir.display()))?;
        return Ok(Base {
            policy,
            folder: Some(dir.clone()),
            tokenizer: TokenizerSource::Folder(dir.clone()),
        });
    }
    let Some(config) = config else {
        bail!(
            "the checkpoint holds LoRA adapters only: give --base DIR (the base as a Hugging \
             Face folder) or --config FILE (the learner's config, which rebuilds the base)"
        );
    };
    let (policy, tokenizer) = crate::roles::build_model(config, &cpu)?;
    crate::roles::learner::warm_start(config, &policy, &tokenizer)
        .context("rebuilding the base: the learner's warm start")?;
    let source = (config.model.source != "embedded").then(|| PathBuf::from(&config.model.source));
    let unchanged = config.learner.warm_start_steps == 0;
    Ok(Base {
        tokenizer: TokenizerSource::of(source.as_deref(), policy.config()),
        folder: source.filter(|_| unchanged),
        policy,
    })
}

/// Files an export writes; none may exist before.
const WRITTEN: [&str; 8] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "echo-export.json",
    "peft/adapter_config.json",
    "base/config.json",
];

pub fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let config = args.config.as_deref().map(NodeConfig::load).transpose()?;
    let ckpt = match (&args.checkpoint, &config) {
        (Some(dir), _) => dir.clone(),
        (None, Some(c)) => c.checkpoint_dir(),
        (None, None) => bail!("give --checkpoint DIR or --config FILE"),
    };
    if !ckpt.join("LATEST").exists() {
        bail!(
            "{} holds no learner checkpoint (no LATEST file; a learner writes one every \
             learner.checkpoint_every steps and at shutdown)",
            ckpt.display()
        );
    }
    for f in WRITTEN {
        let p = args.out.join(f);
        if p.exists() {
            bail!("{} exists; export into an empty folder", p.display());
        }
    }
    // A spinner while a large checkpoint is read and written (hidden when stderr is not a
    // terminal, and with --json).
    let spinner = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    spinner.set_message(format!("reading the checkpoint in {}", ckpt.display()));
    let reading = || format!("reading the checkpoint in {}", ckpt.display());
    let lora = learner::Trainer::checkpoint_lora(&ckpt).with_context(reading)?;
    let (trainer, base) = match &lora {
        Some(_) => {
            let Base {
                policy,
                folder,
                tokenizer,
            } = load_base(args, config.as_ref())?;
            let t = learner::Trainer::load_with_base(&ckpt, policy).with_context(reading)?;
            (t, Some((folder, tokenizer)))
        }
        None => {
            let t = learner::Trainer::load(&ckpt, &policy::Device::Cpu).with_context(reading)?;
            (t, None)
        }
    };
    spinner.set_message(format!("writing {}", args.out.display()));
    let policy = trainer.policy();
    let cfg = policy.config();
    let source = match (&base, &args.base, &config) {
        (Some((_, t)), _, _) => t.clone(),
        (None, Some(dir), _) => TokenizerSource::Folder(dir.clone()),
        (None, None, Some(c)) if c.model.source != "embedded" => {
            TokenizerSource::Folder(PathBuf::from(&c.model.source))
        }
        (None, None, _) => TokenizerSource::of(None, cfg),
    };
    let written = || format!("writing {}", args.out.display());
    let eos = source.write(&args.out, cfg).with_context(written)?;
    policy::hf::save_hf_dir(policy, &args.out, eos).with_context(written)?;
    let mut meta = json!({
        "format": 2,
        "version": trainer.version(),
        "checkpoint": ckpt.display().to_string(),
        "model_config_hash": cfg.hash_hex(),
        "num_params": cfg.num_params(),
    });
    if let (Some((lora, base_hash)), Some((folder, tokenizer)), Some(adapters)) =
        (&lora, &base, policy.lora())
    {
        let base_dir = match folder {
            Some(f) => f.clone(),
            None => {
                let dir = args.out.join("base");
                let eos = tokenizer.write(&dir, cfg)?;
                // The base alone: the LoRA policy with its adapters off.
                policy::hf::save_hf_dir(&policy.base_view()?, &dir, eos)
                    .with_context(|| format!("writing the base to {}", dir.display()))?;
                dir
            }
        };
        // Absolute: `peft` resolves these against the working directory, not the export.
        let base_dir = std::path::absolute(&base_dir).unwrap_or(base_dir);
        let peft = args.out.join("peft");
        let peft = std::path::absolute(&peft).unwrap_or(peft);
        policy::hf::save_peft_dir(adapters, cfg, &peft, base_dir.to_str())
            .with_context(|| format!("writing the PEFT adapter folder {}", peft.display()))?;
        meta["lora"] = json!(lora);
        meta["base_hash"] = json!(base_hash);
        meta["base"] = json!(base_dir.display().to_string());
        meta["peft"] = json!(peft.display().to_string());
    }
    spinner.finish_and_clear();
    std::fs::write(
        args.out.join("echo-export.json"),
        serde_json::to_vec_pretty(&meta)?,
    )?;
    if args.json {
        println!("{meta}");
    } else {
        println!(
            "exported version {} ({} parameters) to {}{}",
            trainer.version(),
            cfg.num_params(),
            args.out.display(),
            match (&lora, meta["peft"].as_str()) {
                (Some((l, _)), Some(p)) => format!(
                    " (merged); LoRA rank {} adapters as a PEFT folder in {p} over the base {}",
                    l.rank,
                    meta["base"].as_str().unwrap_or("?")
                ),
                _ => String::new(),
            }
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
