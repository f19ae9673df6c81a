//! `echo-node export --checkpoint DIR | --config FILE --out DIR`: a learner checkpoint as a
//! Hugging Face folder (`config.json` + `model.safetensors`) plus `echo-export.json` naming
//! the version and where it came from. The embedded model's byte tokenizer has no
//! `tokenizer.json`; a model loaded from a Hugging Face folder keeps using that folder's.

use anyhow::{bail, Context};
use serde_json::json;

use crate::cli::ExportArgs;
use crate::config::NodeConfig;

pub fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let ckpt = match (&args.checkpoint, &args.config) {
        (Some(dir), _) => dir.clone(),
        (None, Some(c)) => NodeConfig::load(c)?.checkpoint_dir(),
        (None, None) => bail!("give --checkpoint DIR or --config FILE"),
    };
    if !ckpt.join("LATEST").exists() {
        bail!(
            "{} holds no learner checkpoint (no LATEST file; a learner writes one every \
             learner.checkpoint_every steps and at shutdown)",
            ckpt.display()
        );
    }
    for f in ["config.json", "model.safetensors", "echo-export.json"] {
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
    let trainer = learner::Trainer::load(&ckpt, &policy::Device::Cpu)
        .with_context(|| format!("reading the checkpoint in {}", ckpt.display()))?;
    spinner.set_message(format!("writing {}", args.out.display()));
    let eos = policy::Tokenizer::byte().eos_ids().first().copied();
    policy::hf::save_hf_dir(trainer.policy(), &args.out, eos)
        .with_context(|| format!("writing {}", args.out.display()))?;
    spinner.finish_and_clear();
    let meta = json!({
        "format": 1,
        "version": trainer.version(),
        "checkpoint": ckpt.display().to_string(),
        "model_config_hash": trainer.policy().config().hash_hex(),
        "num_params": trainer.policy().config().num_params(),
    });
    std::fs::write(
        args.out.join("echo-export.json"),
        serde_json::to_vec_pretty(&meta)?,
    )?;
    if args.json {
        println!("{meta}");
    } else {
        println!(
            "exported version {} ({} parameters) to {}",
            trainer.version(),
            trainer.policy().config().num_params(),
            args.out.display()
        );
    }
    Ok(())
}
