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
        self.save_keeping(dir, DEFAULT_KEEP_CHECKPOINTS)
    }

    /// [`Trainer::save`], keeping the newest `keep` checkpoints (this one included, at least
    /// 1): the ones a restart falls back to when the newest cannot be read
    /// ([`Trainer::load`]).
    pub fn save_keeping(&self, dir: &Path, keep: usize) -> Result<PathBuf> {
        self.save_observed(dir, keep, &mut |_| Ok(()))
    }

    /// [`Trainer::save`], calling `at(point)` after each step that changes `dir` (`"written"`,
    /// `"renamed"`, `"switched"`, `"removed"`); an error from `at` stops the save there, as a
    /// crash would (the tests use it to check every intermediate state).
    fn save_observed(
        &self,
        dir: &Path,
        keep: usize,
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
        // The newest `keep` stay (this one first); older ones and the leftovers of saves that
        // crashed before their switch go.
        let kept: Vec<PathBuf> = std::iter::once(final_dir.clone())
            .chain(
                checkpoints_newest_first(dir)?
                    .into_iter()
                    .filter(|p| *p != final_dir),
            )
            .take(keep.max(1))
            .collect();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let n = e.file_name().to_string_lossy().into_owned();
            if (n.starts_with("ckpt-") && !kept.contains(&e.path())) || n.starts_with(".tmp-ckpt-")
            {
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
        let (_, meta) = read_newest_readable(dir)?;
        Ok(meta
            .lora
            .map(|l| (l, meta.base_hash.unwrap_or_else(|| "<unknown>".into()))))
    }

    /// Restores the checkpoint `dir/LATEST` points to, on `device`; when that one cannot be
    /// read (a file missing, cut short, or not what `trainer.json` says), the newest readable
    /// one kept beside it, with a WARN naming the broken file. A LoRA checkpoint holds no base
    /// and is refused here: restore it with [`Trainer::load_with_base`].
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let (ck, meta) = read_newest_readable(dir)?;
        if meta.lora.is_some() {
            return Err(LearnerError::Checkpoint(format!(
                "{} trains LoRA adapters on base {}: it is restored with that base",
                ck.display(),
                meta.base_hash.as_deref().unwrap_or("<unknown>")
            )));
        }
        let policy = part(&ck, "weights.safetensors", |b| {
            Ok(Policy::from_safetensors_bytes(&meta.model, b, device)?)
        })?;
        let reference = if meta.has_reference {
            Some(part(&ck, "reference.safetensors", |b| {
                Ok(Policy::from_safetensors_bytes(&meta.model, b, device)?)
            })?)
        } else {
            None
        };
        Self::restore(&ck, meta, policy, reference)
    }

    /// Restores the checkpoint `dir/LATEST` points to with `base` as the frozen base of a LoRA
    /// checkpoint's adapters, on `base`'s device (a full checkpoint loads as in
    /// [`Trainer::load`]). Refused, naming both hashes, when `base` is not the base the
    /// adapters were trained on ([`Policy::base_hash_hex`]), or is of another model.
    /// Falls back like [`Trainer::load`].
    pub fn load_with_base(dir: &Path, base: Policy) -> Result<Self> {
        let (ck, meta) = read_newest_readable(dir)?;
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
        let adapters = part(&ck, "adapters.safetensors", |b| {
            Ok(Adapters::from_safetensors_bytes(
                &meta.model,
                b,
                base.device(),
            )?)
        })?;
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
        part(ck, "optimizer.safetensors", |b| opt.load_state_bytes(b))?;
        let raw = part(ck, "consumed_ids.bin", |b| Ok(b.to_vec()))?;
        let chunks = raw.chunks_exact(16);
        if !chunks.remainder().is_empty() {
            return Err(LearnerError::Checkpoint(format!(
                "{}: not a multiple of 16 bytes",
                ck.join("consumed_ids.bin").display()
            )));
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

/// Checkpoints kept by [`Trainer::save`] (the config's `learner.keep_checkpoints` default).
pub const DEFAULT_KEEP_CHECKPOINTS: usize = 3;

/// Reads `ck/name` and hands its bytes to `parse`; an error names the file.
fn part<T>(ck: &Path, name: &str, parse: impl FnOnce(&[u8]) -> Result<T>) -> Result<T> {
    let path = ck.join(name);
    let named = |e: String| LearnerError::Checkpoint(format!("{}: {e}", path.display()));
    let bytes = std::fs::read(&path).map_err(|e| named(e.to_string()))?;
    parse(&bytes).map_err(|e| named(e.to_string()))
}

/// The `ckpt-*` folders of `dir`, newest first (by version, then by the `.k` of a re-save).
fn checkpoints_newest_first(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<((u64, u32), PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = n.strip_prefix("ckpt-") else {
            continue;
        };
        let (v, k) = rest.split_once('.').unwrap_or((rest, "0"));
        if let (Ok(v), Ok(k)) = (v.parse::<u64>(), k.parse::<u32>()) {
            found.push(((v, k), e.path()));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// The checkpoint `dir/LATEST` names when it is readable ([`check_readable`]), else the newest
/// readable one kept beside it, each broken one logged at WARN with its file; an error naming
/// every broken file when none is readable.
fn read_newest_readable(dir: &Path) -> Result<(PathBuf, CheckpointMeta)> {
    let latest = dir.join("LATEST");
    let mut broken: Vec<String> = Vec::new();
    let named = match std::fs::read_to_string(&latest) {
        Ok(name) => {
            let name = name.trim();
            if name.starts_with("ckpt-") && !name.contains(['/', '\\']) {
                Some(dir.join(name))
            } else {
                broken.push(format!("{}: bad pointer {name:?}", latest.display()));
                None
            }
        }
        Err(e) => {
            broken.push(format!("{}: {e}", latest.display()));
            None
        }
    };
    let others = checkpoints_newest_first(dir).unwrap_or_default();
    let candidates = named
        .iter()
        .cloned()
        .chain(others.into_iter().filter(|p| Some(p) != named.as_ref()));
    for ck in candidates {
        match check_readable(&ck) {
            Ok(meta) => {
                if !broken.is_empty() {
                    tracing::warn!(
                        broken = %broken.join("; "),
                        using = %ck.display(),
                        "the newest checkpoint cannot be read: falling back to the newest readable one"
                    );
                }
                return Ok((ck, meta));
            }
            Err(e) => broken.push(e.to_string()),
        }
    }
    Err(LearnerError::Checkpoint(format!(
        "no readable checkpoint in {}: {}",
        dir.display(),
        broken.join("; ")
    )))
}

/// A checkpoint folder's validated `trainer.json`, once every file it names is present and
/// whole: each safetensors file's header parses and its data is exactly as long as the header
/// says (a file cut short is found here, by name), `consumed_ids.bin` is whole ids.
fn check_readable(ck: &Path) -> Result<CheckpointMeta> {
    let meta = read_meta(ck)?;
    let mut files = vec![match meta.lora {
        Some(_) => "adapters.safetensors",
        None => "weights.safetensors",
    }];
    files.push("optimizer.safetensors");
    if meta.has_reference {
        files.push("reference.safetensors");
    }
    for f in files {
        check_safetensors(&ck.join(f))?;
    }
    let ids = ck.join("consumed_ids.bin");
    let len = std::fs::metadata(&ids)
        .map_err(|e| LearnerError::Checkpoint(format!("{}: {e}", ids.display())))?
        .len();
    if len % 16 != 0 {
        return Err(LearnerError::Checkpoint(format!(
            "{}: {len} bytes, not a multiple of 16",
            ids.display()
        )));
    }
    Ok(meta)
}

/// Whether `path` is a whole safetensors file: 8-byte little-endian header length, a JSON
/// header, and exactly the data its tensors' offsets end at. Reads the header only.
fn check_safetensors(path: &Path) -> Result<()> {
    use std::io::Read;
    let bad = |why: String| LearnerError::Checkpoint(format!("{}: {why}", path.display()));
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let size = f.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| bad(format!("{size} bytes: cut short before its header")))?;
    let n = u64::from_le_bytes(n);
    if n > (100 << 20) || 8 + n > size {
        return Err(bad(format!(
            "{size} bytes: cut short (its header alone is {n} bytes)"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| bad(e.to_string()))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let end = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let want = 8 + n + end;
    if size != want {
        return Err(bad(format!(
            "{size} bytes, its header describes {want}: the file was cut short or overwritten"
        )));
    }
    Ok(())
}

/// `ck/trainer.json`, validated.
fn read_meta(ck: &Path) -> Result<CheckpointMeta> {
    let path = ck.join("trainer.json");
    let bad = |why: String| LearnerError::Checkpoint(format!("{}: {why}", path.display()));
    let meta: CheckpointMeta =
        serde_json::from_slice(&std::fs::read(&path).map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    if !(1..=CHECKPOINT_FORMAT).contains(&meta.format) {
        return Err(bad(format!("unknown checkpoint format {}", meta.format)));
    }
    meta.trainer.validate().map_err(|e| bad(e.to_string()))?;
    if let Some(l) = &meta.lora {
        l.validate().map_err(|e| bad(e.to_string()))?;
    }
    Ok(meta)
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
            .save_observed(dir, 1, &mut |p| {
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
        assert_eq!(
            ckpts, 1,
            "keeping 1: the old checkpoint is removed once LATEST moved"
        );
    }

    fn checkpoint_names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ckpt-"))
            .collect();
        n.sort();
        n
    }

    /// The last K checkpoints are kept; a truncated newest one is fallen back from to the
    /// newest readable one (its version), and when none is readable the error names each
    /// broken file.
    #[test]
    fn the_last_k_are_kept_and_a_truncated_newest_one_is_fallen_back_from() {
        let mut t = trainer();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for v in 1..=5 {
            t.version = v;
            t.save_keeping(dir, 3).unwrap();
        }
        assert_eq!(
            checkpoint_names(dir),
            [
                "ckpt-0000000000000003",
                "ckpt-0000000000000004",
                "ckpt-0000000000000005"
            ]
        );
        let weights = dir
            .join("ckpt-0000000000000005")
            .join("weights.safetensors");
        let whole = std::fs::read(&weights).unwrap();
        std::fs::write(&weights, &whole[..whole.len() / 2]).unwrap();
        let err = check_readable(&dir.join("ckpt-0000000000000005"))
            .err()
            .expect("a truncated file is found");
        assert!(err.to_string().contains("weights.safetensors"), "{err}");
        let back = Trainer::load(dir, &Device::Cpu).unwrap();
        assert_eq!(back.version(), 4, "the newest readable checkpoint");
        // Nothing was removed or rewritten by the fallback.
        assert_eq!(checkpoint_names(dir).len(), 3);
        assert_eq!(std::fs::read(&weights).unwrap().len(), whole.len() / 2);
        // None readable: every broken file is named.
        for v in [3, 4] {
            let opt = dir
                .join(format!("ckpt-{v:016}"))
                .join("optimizer.safetensors");
            std::fs::write(&opt, b"short").unwrap();
        }
        let err = Trainer::load(dir, &Device::Cpu).err().unwrap().to_string();
        assert!(
            err.contains("ckpt-0000000000000005/weights.safetensors")
                && err.contains("ckpt-0000000000000004/optimizer.safetensors")
                && err.contains("ckpt-0000000000000003/optimizer.safetensors"),
            "{err}"
        );
    }

    #[test]
    fn a_crash_at_any_point_of_a_resave_leaves_a_loadable_checkpoint() {
        let t = trainer();
        for crash_at in 0..4 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            t.save(dir).unwrap();
            let mut seen = 0;
            let r = t.save_observed(dir, 1, &mut |p| {
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
