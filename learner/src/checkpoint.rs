//! Learner checkpoints: the trainer's complete state on disk (weights, optimiser moments, the
//! KL reference, every consumed trajectory id, the version and the training settings), written
//! atomically so that a crash at any point leaves `LATEST` naming a complete checkpoint. The
//! format is specified in `docs/learner.md`, "Checkpoints".

use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::Device;
use policy::{ModelConfig, Policy};
use serde::{Deserialize, Serialize};

use crate::optim::AdamW;
use crate::trainer::{Trainer, TrainerConfig};
use crate::{LearnerError, Result};

impl Trainer {
    /// Writes a checkpoint under `dir` atomically and returns its folder: everything goes to a
    /// temporary folder that is fsynced and renamed to `dir/ckpt-<version>`, then the pointer
    /// file `dir/LATEST` is replaced (write temp + fsync + rename). Older `ckpt-*` folders are
    /// removed afterwards. A crash at any point leaves `LATEST` naming a complete checkpoint
    /// (or no checkpoint at all).
    ///
    /// Contents: `weights.safetensors` (the snapshot payload), `optimizer.safetensors`
    /// ([`AdamW::state_to_bytes`]), `reference.safetensors` (when KL is on),
    /// `consumed_ids.bin` (16-byte trajectory ids, sorted), `trainer.json` (format, version,
    /// [`TrainerConfig`], [`ModelConfig`]).
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let name = format!("ckpt-{:016}", self.version);
        let tmp = dir.join(format!(".tmp-{name}-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir(&tmp)?;
        write_synced(
            &tmp.join("weights.safetensors"),
            &self.policy.to_safetensors_bytes()?,
        )?;
        write_synced(
            &tmp.join("optimizer.safetensors"),
            &self.opt.state_to_bytes()?,
        )?;
        if let Some(r) = &self.reference {
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
            has_reference: self.reference.is_some(),
        };
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| LearnerError::Checkpoint(e.to_string()))?;
        write_synced(&tmp.join("trainer.json"), &json)?;
        sync_dir(&tmp)?;
        let final_dir = dir.join(&name);
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir)?;
        }
        std::fs::rename(&tmp, &final_dir)?;
        let latest_tmp = dir.join(".LATEST.tmp");
        write_synced(&latest_tmp, name.as_bytes())?;
        std::fs::rename(&latest_tmp, dir.join("LATEST"))?;
        sync_dir(dir)?;
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("ckpt-") && n != name {
                std::fs::remove_dir_all(e.path())?;
            }
        }
        Ok(final_dir)
    }

    /// Restores the checkpoint `dir/LATEST` points to, on `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
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
        if meta.format != CHECKPOINT_FORMAT {
            return Err(LearnerError::Checkpoint(format!(
                "unknown checkpoint format {}",
                meta.format
            )));
        }
        meta.trainer.validate()?;
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
        let mut opt = AdamW::new(policy.named_vars()?, meta.trainer.optim)?;
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
        Ok(Trainer {
            cfg: meta.trainer,
            policy,
            reference,
            opt,
            version: meta.version,
            consumed,
        })
    }
}

const CHECKPOINT_FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct CheckpointMeta {
    format: u32,
    version: u64,
    trainer: TrainerConfig,
    model: ModelConfig,
    has_reference: bool,
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}
