//! Low-rank adapters (LoRA; Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
//! 2021) on the decoder's linear projections, for post-training with a frozen base.
//!
//! A targeted projection `y = W·x` becomes `y = W·x + (α/r)·B·(A·x)` with `A` `[r, in]` and
//! `B` `[out, r]`. `A` starts Kaiming-uniform (PEFT's default: `U(−1/√in, 1/√in)`), `B` at
//! zero, so a fresh adapter computes exactly the base model. Only `A` and `B` carry gradients
//! and optimiser state; the base weights are read through detached views. "LoRA Without
//! Regret" (Thinking Machines, 2025) found that adapters on every layer, MLPs included, match
//! full fine-tuning for RL even at low rank, hence the default targets: all seven projections
//! of every layer.
//!
//! Owns: [`LoraConfig`] (validated), the adapter variables ([`Adapters`]: random init,
//! safetensors round trip), the pure merge `W + (α/r)·B·A` ([`merge`]) a worker uses to
//! install an adapter into its working copy, and the identity of a base ([`base_hash`]).
//!
//! Adapter tensor names follow PEFT's module paths without its `base_model.model.` prefix:
//! `model.layers.{i}.self_attn.q_proj.lora_A.weight`, `….lora_B.weight`.
//!
//! Must not touch: the optimiser, checkpoints or I/O (those belong to the learner).

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};

/// The projections an adapter may target, by their Hugging Face module names.
pub const TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// safetensors metadata key of an adapter file holding its [`LoraConfig`] as JSON.
pub const META_LORA: &str = "echo_swarm.lora";

/// Rank, scale numerator and targeted projections of a LoRA run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank r of every adapter (≥ 1).
    pub rank: usize,
    /// α: the update is scaled by α/r (> 0).
    pub alpha: f64,
    /// Projections adapted in every layer ([`TARGETS`] names); default: all of them.
    #[serde(default = "default_targets")]
    pub targets: Vec<String>,
}

fn default_targets() -> Vec<String> {
    TARGETS.iter().map(|t| t.to_string()).collect()
}

impl LoraConfig {
    /// Rank `rank`, α = `alpha`, every projection targeted.
    pub fn new(rank: usize, alpha: f64) -> Self {
        LoraConfig {
            rank,
            alpha,
            targets: default_targets(),
        }
    }

    /// Refuses rank 0, a non-positive or non-finite α, an empty target list, unknown or
    /// repeated target names.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(PolicyError::InvalidConfig(format!("LoRA {m}")));
        if self.rank == 0 {
            return bad("rank must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad(format!("alpha must be positive, got {}", self.alpha));
        }
        if self.targets.is_empty() {
            return bad(format!("targets is empty (known: {})", TARGETS.join(", ")));
        }
        for (i, t) in self.targets.iter().enumerate() {
            if !TARGETS.contains(&t.as_str()) {
                return bad(format!(
                    "unknown target {t:?} (known: {})",
                    TARGETS.join(", ")
                ));
            }
            if self.targets[..i].contains(t) {
                return bad(format!("target {t:?} is listed twice"));
            }
        }
        Ok(())
    }

    /// The update's scale α/r.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether projection `target` (a [`TARGETS`] name) is adapted.
    pub fn targets(&self, target: &str) -> bool {
        self.targets.iter().any(|t| t == target)
    }
}

/// Every targeted projection of `cfg`: (module prefix, out dim, in dim), in layer order.
pub fn targeted_projections(cfg: &ModelConfig, lora: &LoraConfig) -> Vec<(String, usize, usize)> {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let i_sz = cfg.intermediate_size;
    let mut out = Vec::new();
    for i in 0..cfg.num_hidden_layers {
        for t in TARGETS {
            if !lora.targets(t) {
                continue;
            }
            let (module, o, n) = match t {
                "q_proj" => ("self_attn", q, h),
                "k_proj" | "v_proj" => ("self_attn", kv, h),
                "o_proj" => ("self_attn", h, q),
                "gate_proj" | "up_proj" => ("mlp", i_sz, h),
                _ => ("mlp", h, i_sz),
            };
            out.push((format!("model.layers.{i}.{module}.{t}"), o, n));
        }
    }
    out
}

/// Name and shape of every adapter tensor: `{prefix}.lora_A.weight` `[r, in]` and
/// `{prefix}.lora_B.weight` `[out, r]` per targeted projection.
pub fn adapter_shapes(cfg: &ModelConfig, lora: &LoraConfig) -> Vec<(String, Vec<usize>)> {
    let r = lora.rank;
    targeted_projections(cfg, lora)
        .into_iter()
        .flat_map(|(p, o, n)| {
            [
                (format!("{p}.lora_A.weight"), vec![r, n]),
                (format!("{p}.lora_B.weight"), vec![o, r]),
            ]
        })
        .collect()
}

/// Number of adapter parameters: `r·(in + out)` per targeted projection.
pub fn adapter_params(cfg: &ModelConfig, lora: &LoraConfig) -> u64 {
    targeted_projections(cfg, lora)
        .iter()
        .map(|(_, o, n)| (lora.rank * (o + n)) as u64)
        .sum()
}

/// The adapter variables of one model (f32, on the model's device).
#[derive(Clone)]
pub struct Adapters {
    cfg: LoraConfig,
    varmap: VarMap,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters")
            .field("config", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Adapters {
    /// Fresh adapters, deterministic in `seed`: every `A` uniform in `±1/√in` (PEFT's
    /// `kaiming_uniform_(a=√5)`), every `B` zero — the model computes exactly its base.
    pub fn new_random(
        model: &ModelConfig,
        lora: &LoraConfig,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        lora.validate()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for (name, shape) in adapter_shapes(model, lora) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("lora_A.weight") {
                let bound = 1.0 / (shape[1] as f64).sqrt();
                (0..n)
                    .map(|_| rng.gen_range(-bound..bound) as f32)
                    .collect()
            } else {
                vec![0.0; n]
            };
            tensors.insert(name, Tensor::from_vec(data, shape, device)?);
        }
        Self::from_tensors(model, lora, tensors, device)
    }

    /// Adapters from named tensors (converted to f32 on `device`): exactly the tensors of
    /// [`adapter_shapes`], with those shapes.
    pub fn from_tensors(
        model: &ModelConfig,
        lora: &LoraConfig,
        mut tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Self> {
        lora.validate()?;
        let varmap = VarMap::new();
        {
            let mut data = lock(&varmap)?;
            for (name, shape) in adapter_shapes(model, lora) {
                let t = tensors
                    .remove(&name)
                    .ok_or_else(|| PolicyError::Weights(format!("missing adapter {name}")))?;
                if t.dims() != shape.as_slice() {
                    return Err(PolicyError::Weights(format!(
                        "adapter {name} has shape {:?}, expected {shape:?}",
                        t.dims()
                    )));
                }
                let t = t.to_dtype(DType::F32)?.to_device(device)?;
                data.insert(name, Var::from_tensor(&t)?);
            }
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(PolicyError::Weights(format!(
                "unexpected adapter tensor {extra}"
            )));
        }
        Ok(Adapters {
            cfg: lora.clone(),
            varmap,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LoraConfig {
        &self.cfg
    }

    /// The variables by name (the map the module is built over).
    pub(crate) fn var_map(&self) -> Result<HashMap<String, Var>> {
        Ok(lock(&self.varmap)?.clone())
    }

    /// Every adapter variable with its name, sorted by name.
    pub fn named_vars(&self) -> Result<Vec<(String, Var)>> {
        let mut v: Vec<(String, Var)> = self.var_map()?.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }

    /// The adapters as a safetensors file: f32, sorted names, metadata carrying the model's
    /// config hash and the [`LoraConfig`] ([`META_LORA`]). Deterministic.
    pub fn to_safetensors_bytes(&self, model: &ModelConfig) -> Result<Vec<u8>> {
        self.to_safetensors_bytes_as(model, DType::F32)
    }

    /// [`Adapters::to_safetensors_bytes`] with every tensor stored as `dtype` (F32 or BF16):
    /// the payload of an adapter version, in the snapshot dtype (`docs/storage.md`).
    pub fn to_safetensors_bytes_as(&self, model: &ModelConfig, dtype: DType) -> Result<Vec<u8>> {
        let tag = crate::safetensors_io::snapshot_dtype_tag(dtype)?;
        let mut named = Vec::new();
        for (name, var) in self.named_vars()? {
            let data = crate::safetensors_io::le_bytes(var.as_tensor(), dtype)?;
            named.push((name, var.dims().to_vec(), data));
        }
        let cfg = serde_json::to_string(&self.cfg)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        let extra = BTreeMap::from([(META_LORA.to_string(), cfg)]);
        crate::safetensors_io::write_safetensors_meta(&named, tag, &model.hash_hex(), extra)
    }

    /// The dtype an adapter payload stores its tensors in (one for all; F32 or BF16): the
    /// dtype its base was rounded to. Refuses a file that is not safetensors, holds no
    /// tensor, or mixes dtypes.
    pub fn stored_dtype(bytes: &[u8]) -> Result<DType> {
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        let mut found = None;
        for (name, view) in st.tensors() {
            let d = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::BF16 => DType::BF16,
                other => {
                    return Err(PolicyError::Weights(format!(
                        "adapter {name} is {other:?}; adapter payloads hold F32 or BF16"
                    )))
                }
            };
            if found.is_some_and(|f| f != d) {
                return Err(PolicyError::Weights(
                    "an adapter payload mixes dtypes".into(),
                ));
            }
            found = Some(d);
        }
        found.ok_or_else(|| PolicyError::Weights("an adapter payload holds no tensor".into()))
    }

    /// Decodes [`Adapters::to_safetensors_bytes`]: the recorded config hash must be `model`'s
    /// ([`PolicyError::ConfigMismatch`]), the [`LoraConfig`] is read from the metadata.
    pub fn from_safetensors_bytes(
        model: &ModelConfig,
        bytes: &[u8],
        device: &Device,
    ) -> Result<Self> {
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        let expected = model.hash_hex();
        let found = meta.get(crate::safetensors_io::META_CONFIG_HASH);
        if found != Some(&expected) {
            return Err(PolicyError::ConfigMismatch {
                expected,
                found: found.cloned().unwrap_or_else(|| "<none>".into()),
            });
        }
        let lora: LoraConfig = meta
            .get(META_LORA)
            .ok_or_else(|| PolicyError::Weights(format!("no {META_LORA} in an adapter file")))
            .and_then(|s| {
                serde_json::from_str(s)
                    .map_err(|e| PolicyError::Weights(format!("{META_LORA}: {e}")))
            })?;
        let host = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        Self::from_tensors(model, &lora, host, device)
    }

    /// The two files of a PEFT adapter folder, for `peft.PeftModel.from_pretrained(base,
    /// folder)`: `adapter_config.json` (LoRA, r, `lora_alpha`, `target_modules`, no dropout,
    /// no bias, plain α/r scaling, `fan_in_fan_out` false as the weights are `[out, in]`;
    /// only keys PEFT's `LoraConfig` knows, since older PEFT releases refuse unknown ones)
    /// and `adapter_model.safetensors` (f32, PEFT's names: `base_model.model.` + this
    /// crate's, `lora_A` `[r, in]`, `lora_B` `[out, r]`; the model's config hash in the
    /// metadata). `base` names the base model (`base_model_name_or_path`). Pure; writing
    /// them is the caller's. Checked against `peft` by `scripts/peft-check.py`.
    pub fn to_peft_files(
        &self,
        model: &ModelConfig,
        base: Option<&str>,
    ) -> Result<(String, Vec<u8>)> {
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.cfg.rank,
            "lora_alpha": self.cfg.alpha,
            "target_modules": self.cfg.targets,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "modules_to_save": null,
            "inference_mode": true,
            "base_model_name_or_path": base,
        });
        let mut named = Vec::new();
        for (name, var) in self.named_vars()? {
            let data = crate::safetensors_io::le_bytes(var.as_tensor(), DType::F32)?;
            named.push((
                format!("base_model.model.{name}"),
                var.dims().to_vec(),
                data,
            ));
        }
        let weights = crate::safetensors_io::write_safetensors(&named, "F32", &model.hash_hex())?;
        let json = serde_json::to_string_pretty(&config)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        Ok((json, weights))
    }
}

fn lock(varmap: &VarMap) -> Result<std::sync::MutexGuard<'_, HashMap<String, Var>>> {
    varmap
        .data()
        .lock()
        .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))
}

/// Merges adapters into base weights: every targeted `{prefix}.weight` becomes
/// `W + (α/r)·B·A` (computed in f32, returned in `W`'s dtype), every other tensor is returned
/// as it is (shared storage). Pure: a worker installs an adapter version by merging it into
/// its working copy of the base; the merged model's forward equals the LoRA forward.
pub fn merge(
    base: &HashMap<String, Tensor>,
    adapters: &HashMap<String, Tensor>,
    lora: &LoraConfig,
) -> Result<HashMap<String, Tensor>> {
    lora.validate()?;
    let mut out = base.clone();
    let mut used = 0;
    for (name, w) in out.iter_mut() {
        let Some(prefix) = name.strip_suffix(".weight") else {
            continue;
        };
        let a = adapters.get(&format!("{prefix}.lora_A.weight"));
        let b = adapters.get(&format!("{prefix}.lora_B.weight"));
        let (a, b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (None, None) => continue,
            _ => {
                return Err(PolicyError::Weights(format!(
                    "adapter of {prefix} has only one of lora_A and lora_B"
                )))
            }
        };
        used += 2;
        let delta = b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)?;
        if delta.dims() != w.dims() {
            return Err(PolicyError::Weights(format!(
                "adapter of {prefix} gives {:?}, the weight is {:?}",
                delta.dims(),
                w.dims()
            )));
        }
        let merged = (w.to_dtype(DType::F32)? + delta.affine(lora.scale(), 0.0)?)?;
        *w = merged.to_dtype(w.dtype())?;
    }
    if used != adapters.len() {
        return Err(PolicyError::Weights(format!(
            "{} adapter tensors match no base weight",
            adapters.len() - used
        )));
    }
    Ok(out)
}

/// The dtype a LoRA run holds its frozen base in — the one place this is decided. A pure
/// function of the device and of the dtype the run's base is rounded to (`base_rounding`: the
/// snapshot dtype the workers receive it in):
///
/// - **CUDA, base rounded to bf16: bf16.** 2 bytes a parameter instead of 4 (an 8B base is
///   15.3 GiB instead of 30.5); cuBLAS multiplies bf16 with f32 accumulation. The base's
///   values are already bf16, so holding them in bf16 changes no value and not the base's
///   identity ([`base_hash`] widens to f32).
/// - **CUDA, base in f32 (f32 snapshots): f32.** Rounding it would change the model and its
///   identity, and workers holding the f32 base would refuse the adapters.
/// - **CPU: f32.** candle 0.9's CPU matmul has no bf16 kernel: a bf16 base would be widened
///   for every matmul (the CPU path exists for tests, `Policy::with_base_dtype`).
///
/// Adapters, their gradients and AdamW state stay f32 everywhere; activations are f32.
pub fn frozen_base_dtype(device: &Device, base_rounding: DType) -> DType {
    base_dtype_rule(device.is_cuda(), base_rounding)
}

/// [`frozen_base_dtype`] on a device that is CUDA (`cuda`) or not.
fn base_dtype_rule(cuda: bool, base_rounding: DType) -> DType {
    if cuda && base_rounding == DType::BF16 {
        DType::BF16
    } else {
        DType::F32
    }
}

/// The identity of a base model: BLAKE3 over its tensors in name order, each as
/// `name length (u64 LE) ‖ name ‖ rank (u64 LE) ‖ dims (u64 LE each) ‖ values as f32 LE`.
/// Independent of the storage dtype's container (a bf16 base and its exact f32 widening hash
/// alike) and streamed tensor by tensor, so an 8B base is never serialised whole.
pub fn base_hash<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>) -> Result<[u8; 32]> {
    let mut sorted: Vec<(&str, &Tensor)> = tensors.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = blake3::Hasher::new();
    for (name, t) in sorted {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(t.rank() as u64).to_le_bytes());
        for d in t.dims() {
            h.update(&(*d as u64).to_le_bytes());
        }
        let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        h.update(&bytes);
    }
    Ok(*h.finalize().as_bytes())
}

#[cfg(test)]
#[path = "lora_base_tests.rs"]
mod base_tests;
#[cfg(test)]
#[path = "lora_tests.rs"]
mod tests;
