//! Where the learner's trainer comes from at start: the last checkpoint, or a fresh model
//! (warm-started on the task when configured; for a LoRA run, the frozen base in its dtype),
//! then moved on to the newest version it published after that checkpoint, so a restarted
//! learner never publishes a version number twice.

use std::time::Instant;

use anyhow::Context;
use learner::Trainer;
use storage::ChunkStore;

use crate::roles::build_model;
use crate::state::NodeState;

/// The last checkpoint, or a fresh model (warm-started on the task when configured), moved
/// on to the newest snapshot published after it ([`resume_at_published`]). Also returns the
/// version the weights stand at, for the journal. With `[learner] lora` the model is the
/// frozen base of adapters; a LoRA checkpoint is restored onto the base rebuilt the same way,
/// and refused (naming both hashes) when that base is not the one it was trained on.
pub(super) fn restore_or_init(state: &NodeState) -> anyhow::Result<(Trainer, u64)> {
    let config = &state.config;
    let ckpt = config.checkpoint_dir();
    let wanted = config.learner.trainer_config()?;
    let lora = config.learner.lora.as_ref();
    let mut trainer = if ckpt.join("LATEST").exists() {
        let restored = match lora {
            Some(_) => Trainer::load_with_base(&ckpt, lora_base(state, &wanted)?),
            None => Trainer::load(&ckpt, &state.device),
        };
        let mut t =
            restored.with_context(|| format!("restoring the checkpoint in {}", ckpt.display()))?;
        tracing::info!(version = t.version(), dir = %ckpt.display(), "resumed from checkpoint");
        warn_ignored_settings(&wanted, t.config());
        // How a step is cut into passes depends on this run's device, not the checkpoint's.
        t.set_micro_batch_tokens(wanted.micro_batch_tokens);
        t.set_compute(wanted.precision, wanted.recompute, wanted.query_chunk)?;
        t
    } else {
        let policy = match lora {
            Some(_) => lora_base(state, &wanted)?,
            None => fresh_model(state, &wanted)?,
        };
        let policy = match lora {
            Some(l) => {
                let p = policy
                    .with_lora(l, config.model.seed)
                    .context("adding LoRA adapters")?;
                tracing::info!(
                    rank = l.rank,
                    alpha = l.alpha,
                    adapter_params = policy::lora::adapter_params(p.config(), l),
                    base = %p.base_hash_hex()?,
                    "training LoRA adapters on a frozen base"
                );
                p
            }
            None => policy,
        };
        Trainer::new(policy, wanted).context("creating the trainer")?
    };
    trainer.set_mask_rule(crate::roles::mask_rule(config)?);
    let weights = resume_at_published(&mut trainer, &state.chunks)?;
    // Buffer leases of a previous run are void (only this thread leases the buffer).
    for l in state.trajectories.leases()? {
        state.trajectories.release(l.id)?;
    }
    Ok((trainer, weights))
}

/// The model of `[model]` on this node's device, checked against the device's memory for the
/// learner's footprint (full or LoRA, `policy::memory::Training`), then warm-started on the
/// task when configured.
fn fresh_model(
    state: &NodeState,
    wanted: &learner::TrainerConfig,
) -> anyhow::Result<policy::Policy> {
    let config = &state.config;
    let (policy, tokenizer) = build_model(config, &state.device)?;
    // Gradients, AdamW's moments, the KL reference and the activations of one pass come
    // on top of the weights just loaded; refuse now, with the numbers, rather than fail
    // mid-run.
    let weights = 4 * policy.config().num_params();
    let kl = wanted.loss.kl_beta > 0.0;
    let tokens = wanted.tokens_per_pass(policy.config());
    let training = match &config.learner.lora {
        Some(lora) => policy::memory::Training::Lora {
            lora,
            base_dtype: lora_base_dtype(state),
        },
        None => kl.into(),
    };
    let compute = wanted.compute(&state.device);
    let need = policy::memory::learner_bytes_with(policy.config(), training, compute, tokens);
    let free = policy::device::describe(&state.device).memory_free_bytes;
    if free > 0 {
        policy::memory::check_learner_fit_with(
            policy.config(),
            training,
            compute,
            tokens,
            free,
            weights,
        )?;
    }
    crate::roles::check_memory("the learner", need.saturating_sub(weights), &state.device)?;
    warm_start(config, &policy, &tokenizer)?;
    Ok(policy)
}

/// The dtype this node's LoRA learner holds its frozen base in
/// ([`policy::lora::frozen_base_dtype`]: bf16 on a GPU when the base is rounded to bf16
/// snapshots, f32 otherwise).
fn lora_base_dtype(state: &NodeState) -> policy::DType {
    policy::lora::frozen_base_dtype(&state.device, state.config.broadcast.dtype.dtype())
}

/// The frozen base of a LoRA learner: [`fresh_model`] (rounded to the snapshot dtype), held
/// in [`lora_base_dtype`]. Its identity is that of the rounded f32 weights either way.
fn lora_base(state: &NodeState, wanted: &learner::TrainerConfig) -> anyhow::Result<policy::Policy> {
    let dtype = lora_base_dtype(state);
    let base = fresh_model(state, wanted)?
        .with_base_dtype(dtype)
        .context("holding the LoRA base in its dtype")?;
    tracing::info!(?dtype, "the frozen LoRA base's dtype");
    Ok(base)
}

/// Warm-starts `policy` on the configured task when `learner.warm_start_steps` > 0 (the
/// supervised start of a fresh learner), and rounds a LoRA run's base to the snapshot dtype;
/// deterministic in the config, so `echo-node export` rebuilds the same LoRA base.
pub(crate) fn warm_start(
    config: &crate::config::NodeConfig,
    policy: &policy::Policy,
    tokenizer: &policy::Tokenizer,
) -> anyhow::Result<()> {
    if config.learner.warm_start_steps > 0 {
        let env = crate::roles::build_env(config)?;
        let t0 = Instant::now();
        let w = match env.as_task() {
            Some(task) => learner::warm_start_on_task(
                policy,
                tokenizer,
                task.as_ref(),
                config.learner.warm_start_steps,
                config.model.seed,
            )
            .context("supervised warm start")?,
            None => super::envs::warm_start(config, policy, tokenizer, env.as_ref())
                .context("supervised warm start on scripted play")?,
        };
        tracing::info!(
            steps = w.steps,
            examples = w.examples,
            loss_first = w.loss_first,
            loss_last = w.loss_last,
            secs = t0.elapsed().as_secs_f64(),
            "warm start done"
        );
    }
    // A LoRA run's frozen base is what the workers hold: its snapshot-dtype rounding (a bf16
    // base on every node, one identity; `docs/broadcast.md`, "Adapter snapshots").
    if config.learner.lora.is_some() {
        policy
            .round_weights_to(config.broadcast.dtype.dtype())
            .context("rounding the LoRA base to the snapshot dtype")?;
    }
    Ok(())
}

/// A crash between checkpoints leaves snapshots this learner published after its checkpoint
/// in its snapshot store; workers hold them and sample under them. A version number must
/// name one set of weights for the whole run — workers refuse a version they have moved
/// past (replay marks), and spot checks recompute a group's log-probs under the claimed
/// version's stored weights — so the learner continues from the newest of those snapshots
/// that is complete (weights and version — for LoRA the adapters of an adapter version on
/// the same base, [`Trainer::resume_from_adapters`]; the optimiser moments stay the
/// checkpoint's),
/// losing only the steps after it. If none is complete (its chunks were still in the
/// memory tier at the kill), the weights stay the checkpoint's and the numbering continues
/// after the newest published version, never reusing one. Returns the version the weights
/// stand at (`docs/learner.md`, "Crash semantics").
fn resume_at_published(trainer: &mut Trainer, chunks: &ChunkStore) -> anyhow::Result<u64> {
    let checkpoint = trainer.version();
    let published = chunks.versions().context("reading the snapshot index")?;
    for &v in published.iter().rev().filter(|&&v| v > checkpoint) {
        let resumed = chunks
            .assemble(v)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| resume_to(trainer, chunks, v, &bytes));
        match resumed {
            Ok(()) => {
                tracing::warn!(
                    checkpoint,
                    version = v,
                    "resumed from the newest published snapshot, which is newer than the checkpoint"
                );
                return Ok(v);
            }
            Err(e) => tracing::warn!(
                version = v, error = %format!("{e:#}"),
                "a snapshot published after the checkpoint cannot be resumed from"
            ),
        }
    }
    if let Some(&newest) = published.last().filter(|&&p| p > checkpoint) {
        tracing::warn!(
            checkpoint,
            published = newest,
            next = newest + 1,
            "no published snapshot newer than the checkpoint is complete: continuing with the \
             checkpoint's weights, numbered after the newest published version"
        );
        trainer.advance_version_to(newest + 1);
    }
    Ok(checkpoint)
}

/// Moves `trainer` to published version `v` (payload `bytes`): a full snapshot's weights for
/// full fine-tuning; for LoRA the adapters of an adapter version, on the base its signed
/// manifest names (refused, naming both identities, when that is not this learner's base).
fn resume_to(
    trainer: &mut Trainer,
    chunks: &ChunkStore,
    v: u64,
    bytes: &[u8],
) -> anyhow::Result<()> {
    if trainer.policy().lora().is_none() {
        return Ok(trainer.resume_from_snapshot(bytes, v)?);
    }
    let signed = chunks.manifest(v)?.context("the version has no manifest")?;
    match signed.manifest.payload {
        storage::PayloadKind::Adapter { base_hash, .. } => {
            Ok(trainer.resume_from_adapters(bytes, v, &hex::encode(base_hash))?)
        }
        other => anyhow::bail!(
            "version {v} is a {other:?} payload; a LoRA learner resumes from adapter versions"
        ),
    }
}

/// A resumed run keeps its checkpointed training settings; say so for every `[learner]` value
/// of the config file that differs and is therefore not applied.
fn warn_ignored_settings(config: &learner::TrainerConfig, running: &learner::TrainerConfig) {
    let pairs = [
        (
            "learner.staleness",
            config.staleness.to_string(),
            running.staleness.to_string(),
        ),
        (
            "learner.kappa",
            config.kappa().to_string(),
            running.kappa().to_string(),
        ),
        (
            "learner.objective",
            config.loss.objective.to_string(),
            running.loss.objective.to_string(),
        ),
        (
            "learner.groups_per_step",
            config.groups_per_step.to_string(),
            running.groups_per_step.to_string(),
        ),
        (
            "learner.lr",
            config.optim.lr.to_string(),
            running.optim.lr.to_string(),
        ),
    ];
    for (key, in_config, in_checkpoint) in pairs {
        if in_config != in_checkpoint {
            tracing::warn!(
                key,
                config = %in_config,
                checkpoint = %in_checkpoint,
                "the config differs from the checkpoint: the resumed run keeps the checkpoint's value \
                 (start from a fresh data_dir to change it)"
            );
        }
    }
}
