//! Learner checkpoints: the trainer's complete state on disk (weights, optimiser moments, the
//! KL reference, every consumed trajectory id, the version and the training settings), written
//! atomically so that a crash at any point leaves `LATEST` naming a complete checkpoint. The
//! format is specified in `docs/learner.md`, "Checkpoints".

use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::Device;
use policy::{Adapters, LoraConfig, ModelConfig, Policy};
use serde::{Deserialize, Serialize};

use crate::optim::AdamW;
use crate::trainer::{Trainer, TrainerConfig};
use crate::{LearnerError, Result};

impl Trainer {
    /// Writes a checkpoint under `dir` atomically and returns its folder: everything goes to a
    /// temporary folder that is fsynced and renamed to a folder no checkpoint uses yet
    /// (`dir/ckpt-<version>`, or `dir/ckpt-<version>.<k>` when a checkpoint of that version
    /// exists — the live one is never removed or overwritten before `LATEST` moves), then the
    /// pointer file `dir/LATEST` is replaced (write temp + fsync + rename). Every other `ckpt-*`
    /// folder is removed only afterwards. A crash at any point leaves `LATEST` naming a
    /// complete checkpoint (or no checkpoint at all).
    ///
    /// Contents: `weights.safetensors` (the snapshot payload), `optimizer.safetensors`
    /// ([`AdamW::state_to_bytes`]), `reference.safetensors` (when KL is on),
    /// `consumed_ids.bin` (16-byte trajectory ids, sorted), `trainer.json` (format, version,
    /// [`TrainerConfig`], [`ModelConfig`]). A LoRA trainer writes `adapters.safetensors`
    /// ([`Adapters::to_safetensors_bytes`]) instead of the weights and no reference (it is the
    /// base), and `trainer.json` adds the [`LoraConfig`] and the base's identity
    /// ([`Policy::base_hash_hex`]); it is restored with [`Trainer::load_with_base`].
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        self.save_observed(dir, &mut |_| Ok(()))
    }

    /// [`Trainer::save`], calling `at(point)` after each step that changes `dir` (`"written"`,
    /// `"renamed"`, `"switched"`, `"removed"`); an error from `at` stops the save there, as a
    /// crash would (the tests use it to check every intermediate state).
    fn save_observed(
        &self,
        dir: &Path,
        at: &mut dyn FnMut(&'static str) -> Result<()>,
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let base = format!("ckpt-{:016}", self.version);
        let name = std::iter::once(base.clone())
            .chain((1u32..).map(|k| format!("{base}.{k}")))
            .find(|n| !dir.join(n).exists())
            .expect("an unbounded sequence of names has a free one");
        let tmp = dir.join(format!(".tmp-{name}-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir(&tmp)?;
        let (lora, base_hash) = match self.policy.lora() {
            Some(a) => {
                write_synced(
                    &tmp.join("adapters.safetensors"),
                    &a.to_safetensors_bytes(self.policy.config())?,
                )?;
                (Some(a.config().clone()), Some(self.policy.base_hash_hex()?))
            }
            None => {
                write_synced(
                    &tmp.join("weights.safetensors"),
                    &self.policy.to_safetensors_bytes()?,
                )?;
                (None, None)
            }
        };
        write_synced(
            &tmp.join("optimizer.safetensors"),
            &self.opt.state_to_bytes()?,
        )?;
        if let Some(r) = self.reference.as_ref().filter(|_| lora.is_none()) {
            write_synced(
                &tmp.join("reference.safetensors"),
                &r.to_safetensors_bytes()?,
            )?;
        }
        let mut ids: Vec<[u8; 16]> = self.consumed.iter().copied().collect();
        ids.sort_unstable();
        write_synced(&tmp.join("consumed_ids.bin"), &ids.concat())?;
        let meta = CheckpointMeta {
            format: CHECKPOINT_FORMAT,
            version: self.version,
            trainer: self.cfg.clone(),
            model: self.policy.config().clone(),
            has_reference: self.reference.is_some() && lora.is_none(),
            lora,
            base_hash,
        };
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| LearnerError::Checkpoint(e.to_string()))?;
        write_synced(&tmp.join("trainer.json"), &json)?;
        sync_dir(&tmp)?;
        at("written")?;
        let final_dir = dir.join(&name);
        std::fs::rename(&tmp, &final_dir)?;
        sync_dir(dir)?;
        at("renamed")?;
        storage::write_atomic(&dir.join("LATEST"), name.as_bytes())?;
        at("switched")?;
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let n = e.file_name().to_string_lossy().into_owned();
            // Leftovers of saves that crashed before their switch go too.
            if (n.starts_with("ckpt-") && n != name) || n.starts_with(".tmp-ckpt-") {
                std::fs::remove_dir_all(e.path())?;
                at("removed")?;
            }
        }
        Ok(final_dir)
    }

    /// The adapters' configuration and the base's identity (hex) of the checkpoint
    /// `dir/LATEST` points to; `None` for a full fine-tuning checkpoint. Reads `trainer.json`
    /// only: how a caller learns that it needs the base ([`Trainer::load_with_base`]).
    pub fn checkpoint_lora(dir: &Path) -> Result<Option<(LoraConfig, String)>> {
        let (_, meta) = read_latest(dir)?;
        Ok(meta
            .lora
            .map(|l| (l, meta.base_hash.unwrap_or_else(|| "<unknown>".into()))))
    }

    /// Restores the checkpoint `dir/LATEST` points to, on `device`. A LoRA checkpoint holds
    /// no base and is refused here: restore it with [`Trainer::load_with_base`].
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let (ck, meta) = read_latest(dir)?;
        if meta.lora.is_some() {
            return Err(LearnerError::Checkpoint(format!(
                "{} trains LoRA adapters on base {}: it is restored with that base",
                ck.display(),
                meta.base_hash.as_deref().unwrap_or("<unknown>")
            )));
        }
        let policy = Policy::from_safetensors_bytes(
            &meta.model,
            &std::fs::read(ck.join("weights.safetensors"))?,
            device,
        )?;
        let reference = if meta.has_reference {
            Some(Policy::from_safetensors_bytes(
                &meta.model,
                &std::fs::read(ck.join("reference.safetensors"))?,
                device,
            )?)
        } else {
            None
        };
        Self::restore(&ck, meta, policy, reference)
    }

    /// Restores the checkpoint `dir/LATEST` points to with `base` as the frozen base of a LoRA
    /// checkpoint's adapters, on `base`'s device (a full checkpoint loads as in
    /// [`Trainer::load`]). Refused, naming both hashes, when `base` is not the base the
    /// adapters were trained on ([`Policy::base_hash_hex`]), or is of another model.
    pub fn load_with_base(dir: &Path, base: Policy) -> Result<Self> {
        let (ck, meta) = read_latest(dir)?;
        let Some(lora) = meta.lora.clone() else {
            return Self::load(dir, base.device());
        };
        if base.config() != &meta.model {
            return Err(LearnerError::Checkpoint(format!(
                "{} was trained on a model with config {}, the base has config {}",
                ck.display(),
                meta.model.hash_hex(),
                base.config().hash_hex()
            )));
        }
        let want = meta.base_hash.clone().unwrap_or_default();
        let have = base.base_hash_hex()?;
        if want != have {
            return Err(LearnerError::Checkpoint(format!(
                "{}: the adapters were trained on base {want}, this base is {have}",
                ck.display()
            )));
        }
        let adapters = Adapters::from_safetensors_bytes(
            &meta.model,
            &std::fs::read(ck.join("adapters.safetensors"))?,
            base.device(),
        )?;
        if adapters.config() != &lora {
            return Err(LearnerError::Checkpoint(format!(
                "adapters.safetensors holds {:?}, trainer.json says {lora:?}",
                adapters.config()
            )));
        }
        let policy = base.with_adapters(adapters)?;
        let reference = crate::trainer::reference_of(&policy, meta.trainer.loss.kl_beta)?;
        Self::restore(&ck, meta, policy, reference)
    }

    /// The optimiser state, consumed ids and bookkeeping of checkpoint `ck` around `policy`.
    fn restore(
        ck: &Path,
        meta: CheckpointMeta,
        policy: Policy,
        reference: Option<Policy>,
    ) -> Result<Self> {
        let mut opt = AdamW::new(policy.trainable_named_vars()?, meta.trainer.optim)?;
        opt.load_state_bytes(&std::fs::read(ck.join("optimizer.safetensors"))?)?;
        let raw = std::fs::read(ck.join("consumed_ids.bin"))?;
        let chunks = raw.chunks_exact(16);
        if !chunks.remainder().is_empty() {
            return Err(LearnerError::Checkpoint(
                "consumed_ids.bin is not a multiple of 16 bytes".into(),
            ));
        }
        let consumed = chunks
            .map(|c| {
                let mut id = [0u8; 16];
                id.copy_from_slice(c);
                id
            })
            .collect();
        let (precision, recompute, chunk) = (
            meta.trainer.precision,
            meta.trainer.recompute,
            meta.trainer.query_chunk,
        );
        let mut trainer = Trainer {
            cfg: meta.trainer,
            policy,
            reference,
            opt,
            version: meta.version,
            consumed,
            masks: std::sync::Arc::new(crate::mask::ResponseTokens),
        };
        // The precision recorded (an `auto` resolves on this device).
        trainer.set_compute(precision, recompute, chunk)?;
        Ok(trainer)
    }
}

/// 2 adds `lora` and `base_hash` (absent in a full fine-tuning checkpoint, so format 1
/// checkpoints still load).
const CHECKPOINT_FORMAT: u32 = 2;

/// `dir/LATEST`'s checkpoint folder and its validated `trainer.json`.
fn read_latest(dir: &Path) -> Result<(PathBuf, CheckpointMeta)> {
    let name = std::fs::read_to_string(dir.join("LATEST"))?;
    let name = name.trim();
    if !name.starts_with("ckpt-") || name.contains(['/', '\\']) {
        return Err(LearnerError::Checkpoint(format!(
            "bad LATEST pointer {name:?}"
        )));
    }
    let ck = dir.join(name);
    let meta: CheckpointMeta = serde_json::from_slice(&std::fs::read(ck.join("trainer.json"))?)
        .map_err(|e| LearnerError::Checkpoint(format!("trainer.json: {e}")))?;
    if !(1..=CHECKPOINT_FORMAT).contains(&meta.format) {
        return Err(LearnerError::Checkpoint(format!(
            "unknown checkpoint format {}",
            meta.format
        )));
    }
    meta.trainer.validate()?;
    if let Some(l) = &meta.lora {
        l.validate()?;
    }
    Ok((ck, meta))
}

#[derive(Serialize, Deserialize)]
struct CheckpointMeta {
    format: u32,
    version: u64,
    trainer: TrainerConfig,
    model: ModelConfig,
    has_reference: bool,
    /// The adapters' configuration of a LoRA trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lora: Option<LoraConfig>,
    /// The BLAKE3 identity of a LoRA trainer's frozen base (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_hash: Option<String>,
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    Ok(storage::fs::sync_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer() -> Trainer {
        let cfg = ModelConfig {
            hidden_size: 16,
            intermediate_size: 32,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 8,
            max_position_embeddings: 32,
            ..ModelConfig::tiny()
        };
        let policy = Policy::new_random(&cfg, 3, &Device::Cpu).unwrap();
        Trainer::new(policy, TrainerConfig::default()).unwrap()
    }

    /// `LATEST` names a folder holding every file of a checkpoint, and it loads.
    fn latest_is_complete(dir: &Path) -> bool {
        Trainer::load(dir, &Device::Cpu).is_ok()
    }

    #[test]
    fn latest_names_a_complete_checkpoint_at_every_instant_of_a_resave() {
        let t = trainer();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        t.save(dir).unwrap();
        // Saving again at the same version (a periodic checkpoint, then the one at shutdown):
        // observe the directory after every change.
        let mut points = Vec::new();
        let out = t
            .save_observed(dir, &mut |p| {
                assert!(latest_is_complete(dir), "LATEST dangling after {p:?}");
                points.push(p);
                Ok(())
            })
            .unwrap();
        assert_eq!(points, ["written", "renamed", "switched", "removed"]);
        assert!(latest_is_complete(dir));
        let live = std::fs::read_to_string(dir.join("LATEST")).unwrap();
        assert_eq!(dir.join(live.trim()), out);
        let ckpts = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                let e = e.as_ref().unwrap();
                e.file_name().to_string_lossy().starts_with("ckpt-")
            })
            .count();
        assert_eq!(ckpts, 1, "the old checkpoint is removed once LATEST moved");
    }

    #[test]
    fn a_crash_at_any_point_of_a_resave_leaves_a_loadable_checkpoint() {
        let t = trainer();
        for crash_at in 0..4 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            t.save(dir).unwrap();
            let mut seen = 0;
            let r = t.save_observed(dir, &mut |p| {
                if seen == crash_at {
                    return Err(LearnerError::Checkpoint(format!("crash after {p}")));
                }
                seen += 1;
                Ok(())
            });
            assert!(r.is_err(), "crash point {crash_at} was reached");
            assert!(latest_is_complete(dir), "crash after point {crash_at}");
            // The next save after the restart succeeds and cleans up.
            t.save(dir).unwrap();
            assert!(latest_is_complete(dir));
        }
    }

    /// The restart of a learner that published version 5 after its checkpoint at 0: it takes
    /// the snapshot's weights and number; an older or equal version, or a payload of another
    /// model, is refused and changes nothing.
    #[test]
    fn resuming_from_a_newer_published_snapshot_takes_its_weights_and_version() {
        let mut t = trainer();
        let other = Policy::new_random(t.policy().config(), 99, &Device::Cpu).unwrap();
        let snapshot = other.to_safetensors_bytes().unwrap();
        let before = t.snapshot_bytes().unwrap();
        assert_ne!(before, snapshot);
        let wrong = Policy::new_random(&ModelConfig::tiny(), 1, &Device::Cpu)
            .unwrap()
            .to_safetensors_bytes()
            .unwrap();
        assert!(t.resume_from_snapshot(&wrong, 5).is_err());
        assert!(t.resume_from_snapshot(&snapshot, 0).is_err());
        assert_eq!((t.version(), t.snapshot_bytes().unwrap()), (0, before));
        t.resume_from_snapshot(&snapshot, 5).unwrap();
        assert_eq!(t.version(), 5);
        assert_eq!(t.snapshot_bytes().unwrap(), snapshot);
        t.mark_consumed([[7u8; 16]]);
        assert!(t.has_consumed(&[7u8; 16]));
    }
}
