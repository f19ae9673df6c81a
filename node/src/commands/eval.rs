//! `echo-node eval --task NAME (--checkpoint DIR | --export DIR) [--opponent O] [--episodes N]
//! [--json]`: a policy against an environment's opponents, ECHO-2 Table 7 style — the mean
//! return per episode (chips per hand for poker) ± its standard error per opponent, and for a
//! game with an exact evaluator (Kuhn poker) the exact expected value, the best response's
//! value and the policy's exploitability. A progress bar on a terminal.
//!
//! JSON: `{"task", "results": [{"opponent", "mean_return", "stderr", "episodes", "exact"?}],
//! "exact"?: {"ev", "best_response", "exploitability"}}` — the top-level `exact` is the first
//! opponent's (the exploitability is the same against all).

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use policy::chat::{hf_chat_template, Chat, JinjaTemplate};
use policy::session::Model;
use policy::{Device, InferModel, Policy, SamplingParams, Tokenizer};
use rollout::episode::Spec;
use serde_json::{json, Value};
use tasks::env::{Budget, Environment};

use crate::cli::EvalArgs;

/// The opponents evaluated when none is named.
fn default_opponents(task: &str) -> Vec<String> {
    let names: Vec<&str> = match task {
        "kuhn-poker" => tasks::kuhn::OPPONENTS.iter().map(|o| o.0).collect(),
        "holdem" => tasks::holdem::RULE_BASED
            .iter()
            .copied()
            .chain(["model"])
            .collect(),
        _ => vec!["-"],
    };
    names.into_iter().map(String::from).collect()
}

/// A policy, its tokenizer and (for a Hugging Face folder) its chat template's source.
struct Loaded {
    policy: Policy,
    tokenizer: Tokenizer,
    folder: Option<std::path::PathBuf>,
}

impl Loaded {
    fn template(&self) -> anyhow::Result<Option<JinjaTemplate>> {
        match &self.folder {
            Some(dir) => Ok(hf_chat_template(dir)?),
            None => Ok(None),
        }
    }
}

/// Loads a checkpoint (the embedded model's: byte tokenizer) or a Hugging Face folder (with
/// its tokenizer.json, which exports write for the embedded model too; a folder of the
/// embedded model's vocabulary without one uses the byte tokenizer).
fn load(checkpoint: Option<&Path>, export: Option<&Path>) -> anyhow::Result<Loaded> {
    let byte_vocab = policy::ByteTokenizer::VOCAB_SIZE;
    if let Some(dir) = checkpoint {
        let t = learner::Trainer::load(dir, &Device::Cpu)
            .with_context(|| format!("reading the checkpoint in {}", dir.display()))?;
        if t.policy().config().vocab_size != byte_vocab {
            bail!("a checkpoint of a Hugging Face model has no tokenizer: export it and pass --export");
        }
        let bytes = t.policy().to_safetensors_bytes()?;
        return Ok(Loaded {
            policy: Policy::from_safetensors_bytes(t.policy().config(), &bytes, &Device::Cpu)?,
            tokenizer: Tokenizer::byte(),
            folder: None,
        });
    }
    let dir = export.context("give --checkpoint DIR or --export DIR")?;
    if dir.join("tokenizer.json").exists() {
        let (policy, tokenizer) = policy::hf::load_hf_dir(dir, &Device::Cpu)
            .with_context(|| format!("loading {}", dir.display()))?;
        return Ok(Loaded {
            policy,
            tokenizer,
            folder: Some(dir.to_path_buf()),
        });
    }
    let cfg_path = dir.join("config.json");
    let cfg = policy::ModelConfig::from_hf_json(
        &std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("reading {}", cfg_path.display()))?,
    )?;
    if cfg.vocab_size != byte_vocab {
        bail!("{} has no tokenizer.json", dir.display());
    }
    let bytes = std::fs::read(dir.join("model.safetensors"))
        .with_context(|| format!("reading {}/model.safetensors", dir.display()))?;
    Ok(Loaded {
        policy: Policy::from_safetensors_bytes(&cfg, &bytes, &Device::Cpu)?,
        tokenizer: Tokenizer::byte(),
        folder: None,
    })
}

/// The environment `task` with `params` against `opponent` (`-`: as configured); holdem's
/// `model` opponent is `frozen`.
fn env_for(
    task: &str,
    params: &Value,
    opponent: &str,
    frozen: &dyn Fn() -> anyhow::Result<Arc<dyn tasks::holdem::TextPolicy>>,
) -> anyhow::Result<Arc<dyn Environment>> {
    let mut p = params.clone();
    if opponent != "-" {
        if !p.is_object() {
            p = json!({});
        }
        p["opponent"] = json!(opponent);
    }
    if task == "holdem" && opponent == "model" {
        let hp: tasks::holdem::HoldemParams =
            tasks::parse_params("holdem", &p).context("holdem parameters")?;
        return Ok(Arc::new(tasks::holdem::Holdem::with_model_opponent(
            hp,
            frozen()?,
        )?));
    }
    Ok(crate::config::TaskConfig::from_cli(task, p)?.build_env()?)
}

pub fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    let params: Value = serde_json::from_str(&args.params).context("--params is not JSON")?;
    if args.episodes == 0 {
        bail!("--episodes must be at least 1");
    }
    let me = load(args.checkpoint.as_deref(), args.export.as_deref())?;
    let infer = InferModel::from_policy(&me.policy)?;
    let opponents = if args.opponent.is_empty() {
        default_opponents(&args.task)
    } else {
        args.opponent.clone()
    };
    let mut sampling = SamplingParams::new(64, me.tokenizer.eos_ids());
    sampling.temperature = args.temperature;
    // Holdem's `model` opponent: a frozen copy of the evaluated policy, or another one.
    let frozen = || -> anyhow::Result<Arc<dyn tasks::holdem::TextPolicy>> {
        let other = match &args.opponent_model {
            Some(p) if p.join("LATEST").exists() => Some(load(Some(p), None)?),
            Some(p) => Some(load(None, Some(p))?),
            None => None,
        };
        let who = other.as_ref().unwrap_or(&me);
        let chat = Chat::for_model(who.tokenizer.clone(), who.template()?, true)?;
        Ok(Arc::new(rollout::eval::ModelPlayer::new(
            Arc::new(InferModel::from_policy(&who.policy)?),
            Arc::new(chat),
            sampling.clone(),
            24,
        )))
    };
    let bar = if args.json || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(args.episodes * opponents.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} episodes {msg} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut results = Vec::new();
    for (k, opponent) in opponents.iter().enumerate() {
        bar.set_message(format!("vs {opponent}"));
        let env = env_for(&args.task, &params, opponent, &frozen)?;
        let meta = env.metadata();
        let templated = meta.is_multi_turn() || env.system_prompt().is_some();
        let chat = Chat::for_model(me.tokenizer.clone(), me.template()?, templated)?;
        let spec = Spec {
            env: env.as_ref(),
            chat: &chat,
            budget: Budget::of(&meta),
            context: me.policy.config().max_position_embeddings,
        };
        let done = k as u64 * args.episodes;
        let s = rollout::eval::sampled(
            spec,
            Model::Infer(&infer),
            args.seed..args.seed + args.episodes,
            &sampling,
            args.seed,
            &mut |n| bar.set_position(done + n as u64),
        )?;
        // Beside an exact figure with much illegal mass: the sampled chips of the unshaped game.
        let check = rollout::eval::SampledCheck {
            model: Model::Infer(&infer),
            budget: spec.budget,
            context: spec.context,
            params: &sampling,
            seeds: args.episodes,
            group: 1,
            seed: args.seed,
        };
        let exact = rollout::eval::exact_checked(
            &me.policy,
            &chat,
            env.as_ref(),
            args.temperature,
            Some(check),
        )?;
        let mut row = json!({
            "opponent": opponent, "mean_return": s.mean_return, "stderr": s.stderr,
            "episodes": s.episodes, "decisions_per_episode": s.turns_mean,
            "truncated": s.truncated, "context": spec.context,
        });
        if let Some(e) = exact {
            row["exact"] = json!({
                "ev": e.report.ev, "best_response": e.report.best_response,
                "exploitability": e.report.exploitability, "illegal_mass": e.illegal_mass,
            });
            if let Some(s) = e.sampled {
                row["exact"]["sampled_ev"] = json!(s.mean_return);
                row["exact"]["sampled_stderr"] = json!(s.stderr);
            }
        }
        results.push(row);
    }
    bar.finish_and_clear();
    let mut out = json!({ "task": args.task, "results": results });
    if let Some(e) = out["results"][0].get("exact").cloned() {
        out["exact"] = e;
    }
    if args.json {
        println!("{out}");
        return Ok(());
    }
    println!("{} ({} episodes per opponent):", args.task, args.episodes);
    for r in out["results"].as_array().into_iter().flatten() {
        let mut line = format!(
            "  vs {:<12} mean return {:+.3} ± {:.3}, {:.2} decisions per episode ({} cut short by the budget or the {}-token context)",
            r["opponent"].as_str().unwrap_or("-"),
            r["mean_return"].as_f64().unwrap_or(f64::NAN),
            r["stderr"].as_f64().unwrap_or(f64::NAN),
            r["decisions_per_episode"].as_f64().unwrap_or(f64::NAN),
            r["truncated"],
            r["context"],
        );
        if let Some(e) = r.get("exact") {
            line.push_str(&format!(
                "   exact EV {:+.4}, best response {:+.4}, exploitability {:.4}, illegal mass {:.3}",
                e["ev"].as_f64().unwrap_or(f64::NAN),
                e["best_response"].as_f64().unwrap_or(f64::NAN),
                e["exploitability"].as_f64().unwrap_or(f64::NAN),
                e["illegal_mass"].as_f64().unwrap_or(f64::NAN),
            ));
            if let Some(ev) = e["sampled_ev"].as_f64() {
                line.push_str(&format!(
                    " (above {}: sampled EV {:+.3} ± {:.3})",
                    rollout::eval::ILLEGAL_MASS_CHECK,
                    ev,
                    e["sampled_stderr"].as_f64().unwrap_or(f64::NAN)
                ));
            }
        }
        println!("{line}");
    }
    Ok(())
}
