//! [`Policy`]: the model's variables (a candle `VarMap`), its config, and the snapshot
//! payload (safetensors bytes carrying the config hash).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};
use crate::lora::{self, Adapters, LoraConfig};
use crate::model::{param_shapes, KvCache, LoraVars, Qwen3};
use crate::safetensors_io::{
    le_bytes, snapshot_config_hash, snapshot_dtype_tag, write_safetensors,
};

/// A trainable policy: config + variables + the module built over them.
///
/// The learner optimises [`Policy::vars`] (e.g. with `candle_nn::AdamW`); the forward pass sees
/// updates immediately because the module shares the variables' storage. Rollout workers build
/// one per installed snapshot with [`Policy::from_safetensors_bytes`].
///
/// With low-rank adapters ([`Policy::with_lora`]) the model's weights are a frozen base and
/// [`Policy::vars`] are the adapters only; every forward (training, cached decoding, the
/// inference path) computes the adapted model.
pub struct Policy {
    cfg: ModelConfig,
    varmap: VarMap,
    model: Qwen3,
    device: Device,
    lora: Option<Adapters>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("config", &self.cfg)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// A freshly initialised model, deterministic in `seed`: linear and embedding weights
    /// N(0, 0.02²) (output projections of each block scaled by 1/√(2·layers)), norms 1, biases 0.
    pub fn new_random(cfg: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        cfg.validate()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let resid_scale = 1.0 / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        let mut tensors = HashMap::new();
        for (name, shape) in param_shapes(cfg) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                let std = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                    0.02 * resid_scale
                } else {
                    0.02
                };
                (0..n).map(|_| (normal(&mut rng) * std) as f32).collect()
            };
            tensors.insert(name, Tensor::from_vec(data, shape, device)?);
        }
        Self::from_tensors(cfg, tensors, device)
    }

    /// Builds a policy from named tensors (converted to f32 on `device`). Every tensor of the
    /// config must be present with the right shape; unknown names are an error.
    pub fn from_tensors(
        cfg: &ModelConfig,
        mut tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Self> {
        cfg.validate()?;
        let varmap = VarMap::new();
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
            for (name, shape) in param_shapes(cfg) {
                let t = tensors
                    .remove(&name)
                    .ok_or_else(|| PolicyError::Weights(format!("missing tensor {name}")))?;
                if t.dims() != shape.as_slice() {
                    return Err(PolicyError::Weights(format!(
                        "tensor {name} has shape {:?}, expected {shape:?}",
                        t.dims()
                    )));
                }
                let t = t.to_dtype(DType::F32)?.to_device(device)?;
                data.insert(name, Var::from_tensor(&t)?);
            }
            if let Some(extra) = tensors.keys().min() {
                return Err(PolicyError::Weights(format!(
                    "unexpected tensor {extra} ({} unexpected in total)",
                    tensors.len()
                )));
            }
        }
        let model = {
            let data = varmap
                .data()
                .lock()
                .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
            Qwen3::build(cfg, &data, None, device)?
        };
        Ok(Policy {
            cfg: cfg.clone(),
            varmap,
            model,
            device: device.clone(),
            lora: None,
        })
    }

    /// This policy as the frozen base of fresh low-rank adapters (`lora`, initialised from
    /// `seed` by [`Adapters::new_random`]): it computes the same model until the adapters
    /// train, and [`Policy::vars`] become the adapters.
    pub fn with_lora(self, lora: &LoraConfig, seed: u64) -> Result<Self> {
        let adapters = Adapters::new_random(&self.cfg, lora, seed, &self.device)?;
        self.with_adapters(adapters)
    }

    /// This policy's weights as the frozen base of `adapters` (replacing any it had), in
    /// the dtype they are stored in ([`Policy::with_base_dtype`] changes it).
    pub fn with_adapters(self, adapters: Adapters) -> Result<Self> {
        let model = {
            let data = self.lock()?;
            let vars = adapters.var_map()?;
            let lv = LoraVars {
                vars: &vars,
                cfg: adapters.config(),
            };
            Qwen3::build(&self.cfg, &data, Some(lv), &self.device)?
                .with_compute_dtype(self.model.compute_dtype())?
        };
        Ok(Policy {
            model,
            lora: Some(adapters),
            ..self
        })
    }

    /// This policy with its weights — the frozen base, for a LoRA policy — stored in `dtype`
    /// (F32 or BF16) on its device: how a LoRA run holds its base in bf16 on a GPU
    /// ([`lora::frozen_base_dtype`] decides; any device is accepted, so the CPU tests run the
    /// bf16 path the GPU runs). Adapters stay f32 and are kept (the same variables). A no-op
    /// when the weights are in `dtype` already. The forward computes in the compute dtype
    /// whatever the weights' dtype ([`Policy::with_compute_dtype`], f32 by default). Weights that are not f32 are a frozen
    /// base: adapters train on them, full training does not (the learner refuses it). While
    /// converting, the old and the new copy both exist (one tensor at a time is not possible:
    /// other views may share the old variables).
    pub fn with_base_dtype(self, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(PolicyError::Weights(format!(
                "a base is held in F32 or BF16, not {dtype:?}"
            )));
        }
        if self.weights_dtype()? == dtype {
            return Ok(self);
        }
        let Policy {
            cfg,
            varmap: old,
            model,
            device,
            lora,
        } = self;
        let compute = model.compute_dtype();
        drop(model);
        let varmap = VarMap::new();
        {
            let src = old
                .data()
                .lock()
                .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
            let mut dst = varmap
                .data()
                .lock()
                .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
            for (name, var) in src.iter() {
                let t = var.as_tensor().detach().to_dtype(dtype)?;
                dst.insert(name.clone(), Var::from_tensor(&t)?);
            }
        }
        drop(old);
        let model = {
            let data = varmap
                .data()
                .lock()
                .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
            let vars = lora.as_ref().map(|a| a.var_map()).transpose()?;
            let lv = lora.as_ref().zip(vars.as_ref()).map(|(a, vars)| LoraVars {
                vars,
                cfg: a.config(),
            });
            Qwen3::build(&cfg, &data, lv, &device)?.with_compute_dtype(compute)?
        };
        Ok(Policy {
            cfg,
            varmap,
            model,
            device,
            lora,
        })
    }

    /// This policy computing its forwards in `dtype` (mixed precision for F16/BF16:
    /// [`Qwen3::with_compute_dtype`]); the weights and their storage are unchanged (the same
    /// variables). BF16 needs a GPU; F16 also runs on the CPU.
    pub fn with_compute_dtype(mut self, dtype: DType) -> Result<Self> {
        self.set_compute_dtype(dtype)?;
        Ok(self)
    }

    /// [`Policy::with_compute_dtype`] in place; unchanged when refused.
    pub fn set_compute_dtype(&mut self, dtype: DType) -> Result<()> {
        self.model = self.model.clone().with_compute_dtype(dtype)?;
        Ok(())
    }

    /// The dtype the forwards compute in (F32 unless [`Policy::with_compute_dtype`]).
    pub fn compute_dtype(&self) -> DType {
        self.model.compute_dtype()
    }

    /// The dtype the weights (a LoRA policy's base) are stored in: F32, or BF16 for a base
    /// held in bf16 ([`Policy::with_base_dtype`]).
    pub fn weights_dtype(&self) -> Result<DType> {
        let data = self.lock()?;
        let mut dtypes = data.values().map(|v| v.dtype());
        let first = dtypes
            .next()
            .ok_or_else(|| PolicyError::Weights("a policy without weights".into()))?;
        if dtypes.any(|d| d != first) {
            return Err(PolicyError::Weights("the weights mix dtypes".into()));
        }
        Ok(first)
    }

    /// The adapters, for a LoRA policy.
    pub fn lora(&self) -> Option<&Adapters> {
        self.lora.as_ref()
    }

    /// The identity of the model's weights (the frozen base of a LoRA policy):
    /// [`lora::base_hash`] of [`Policy::named_vars`], hex.
    pub fn base_hash_hex(&self) -> Result<String> {
        let vars = self.named_vars()?;
        let h = lora::base_hash(vars.iter().map(|(n, v)| (n.as_str(), v.as_tensor())))?;
        Ok(blake3::Hash::from(h).to_hex().to_string())
    }

    /// The base alone (adapters off) as a gradient-free view sharing this policy's storage:
    /// the KL reference of a LoRA run, with no second copy of the model. For a policy without
    /// adapters, the same as [`Policy::no_grad`].
    pub fn base_view(&self) -> Result<Policy> {
        let model = Qwen3::build_frozen(&self.cfg, &*self.lock()?, None, &self.device)?
            .with_compute_dtype(self.model.compute_dtype())?;
        Ok(Policy {
            cfg: self.cfg.clone(),
            varmap: self.varmap.clone(),
            model,
            device: self.device.clone(),
            lora: None,
        })
    }

    /// The weights this policy computes with, by Hugging Face name: the variables themselves
    /// (shared storage) without adapters, the base merged with the adapters
    /// ([`lora::merge`], new tensors) with them.
    pub fn effective_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let base: HashMap<String, Tensor> = self
            .named_vars()?
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().detach()))
            .collect();
        match &self.lora {
            None => Ok(base),
            Some(a) => {
                let adapters = a
                    .named_vars()?
                    .into_iter()
                    .map(|(n, v)| (n, v.as_tensor().detach()))
                    .collect();
                lora::merge(&base, &adapters, a.config())
            }
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Var>>> {
        self.varmap
            .data()
            .lock()
            .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))
    }

    /// Decodes a snapshot payload made by [`Policy::to_safetensors_bytes`] (or `_as`). The
    /// payload's recorded config hash must equal `cfg.hash()` ([`PolicyError::ConfigMismatch`]
    /// otherwise). F32, BF16 and F16 tensors are accepted and converted to f32 on `device`;
    /// any other element type is refused.
    pub fn from_safetensors_bytes(
        cfg: &ModelConfig,
        bytes: &[u8],
        device: &Device,
    ) -> Result<Self> {
        let found = snapshot_config_hash(bytes)?;
        let expected = cfg.hash_hex();
        if found.as_deref() != Some(expected.as_str()) {
            return Err(PolicyError::ConfigMismatch {
                expected,
                found: found.unwrap_or_else(|| "<none>".into()),
            });
        }
        // Decoded on the host in the stored dtype, then moved and converted once on `device`.
        let host = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
            .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
        let mut tensors = HashMap::with_capacity(host.len());
        for (name, t) in host {
            if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
                return Err(PolicyError::Weights(format!(
                    "tensor {name} is {:?}; snapshots hold F32, BF16 or F16",
                    t.dtype()
                )));
            }
            tensors.insert(name, t.to_device(device)?);
        }
        Self::from_tensors(cfg, tensors, device)
    }

    /// The snapshot payload: every variable as little-endian f32 in a safetensors file with
    /// sorted names and metadata `{format: pt, [`crate::META_CONFIG_HASH`]: hex}`. Deterministic: the same
    /// weights always give the same bytes.
    pub fn to_safetensors_bytes(&self) -> Result<Vec<u8>> {
        self.to_safetensors_bytes_as(DType::F32)
    }

    /// The snapshot payload with every tensor stored as `dtype`: `F32`, or `BF16` (half the
    /// bytes; each weight rounded to nearest-even bf16). The learner keeps f32 weights and may
    /// ship bf16 snapshots; loading ([`Policy::from_safetensors_bytes`]) accepts F32, BF16 and
    /// F16 and converts to the model's f32. Deterministic like [`Self::to_safetensors_bytes`].
    /// A LoRA policy writes its merged weights ([`Policy::effective_tensors`]): the payload is
    /// the model it computes, which loads as a plain policy.
    pub fn to_safetensors_bytes_as(&self, dtype: DType) -> Result<Vec<u8>> {
        let tag = snapshot_dtype_tag(dtype)?;
        let mut vars: Vec<(String, Tensor)> = self.effective_tensors()?.into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut named = Vec::with_capacity(vars.len());
        for (name, t) in vars {
            named.push((name, t.dims().to_vec(), le_bytes(&t, dtype)?));
        }
        write_safetensors(&named, tag, &self.cfg.hash_hex())
    }

    /// Rounds every weight to `dtype` in place (kept in f32): a LoRA run's frozen base becomes
    /// exactly what the workers hold from a `dtype` snapshot of it, so learner and workers
    /// compute with one base and agree on its identity ([`lora::base_hash`]). A no-op for f32.
    pub fn round_weights_to(&self, dtype: DType) -> Result<()> {
        if dtype == DType::F32 {
            return Ok(());
        }
        self.load_safetensors_bytes(&self.to_safetensors_bytes_as(dtype)?)
    }

    /// This policy's weights (its base, for a LoRA policy) as the frozen base of `adapters`,
    /// sharing their storage: how a worker installs an adapter version onto the base it
    /// holds, with no copy of the base.
    pub fn adapted(&self, adapters: Adapters) -> Result<Policy> {
        self.base_view()?.with_adapters(adapters)
    }

    /// Overwrites this policy's variables in place from a snapshot payload (same config).
    /// Refused for a LoRA policy, whose base is fixed (its identity is recorded with the
    /// adapters).
    pub fn load_safetensors_bytes(&self, bytes: &[u8]) -> Result<()> {
        if self.lora.is_some() {
            return Err(PolicyError::Weights(
                "a LoRA policy's base is frozen: a full snapshot cannot be loaded into it".into(),
            ));
        }
        let other = Self::from_safetensors_bytes(&self.cfg, bytes, &self.device)?;
        let theirs: HashMap<String, Var> = other.named_vars()?.into_iter().collect();
        for (name, var) in self.named_vars()? {
            let src = theirs
                .get(&name)
                .ok_or_else(|| PolicyError::Weights(format!("missing tensor {name}")))?;
            var.set(src.as_tensor())?;
        }
        Ok(())
    }

    /// Overwrites a LoRA policy's adapters in place from an adapter payload
    /// ([`Adapters::to_safetensors_bytes_as`], f32 or bf16) of the same model and
    /// [`LoraConfig`]: the variables stay the same objects (an optimiser holding them keeps
    /// its state), the base is untouched. Refused, changing nothing, for a policy without
    /// adapters, another model, another LoRA configuration or a payload that does not decode.
    /// The payload does not name its base: the caller checks that (the learner compares the
    /// identity the version's manifest names).
    pub fn load_adapter_bytes(&self, bytes: &[u8]) -> Result<()> {
        let Some(mine) = &self.lora else {
            return Err(PolicyError::Weights(
                "an adapter payload loads into a LoRA policy only".into(),
            ));
        };
        // Decoded (and checked whole) before a variable is set.
        let theirs = Adapters::from_safetensors_bytes(&self.cfg, bytes, &self.device)?;
        if theirs.config() != mine.config() {
            return Err(PolicyError::Weights(format!(
                "the payload's adapters are {:?}, this policy's are {:?}",
                theirs.config(),
                mine.config()
            )));
        }
        for ((name, var), (_, src)) in mine.named_vars()?.iter().zip(theirs.named_vars()?) {
            var.set(src.as_tensor())
                .map_err(|e| PolicyError::Weights(format!("{name}: {e}")))?;
        }
        Ok(())
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The candle variable map (for optimisers that take a `VarMap`).
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The model's weight variables with their Hugging Face names, sorted by name: every
    /// trainable variable without adapters, the frozen base with them
    /// ([`Policy::trainable_named_vars`] are what an optimiser steps).
    pub fn named_vars(&self) -> Result<Vec<(String, Var)>> {
        let data = self
            .varmap
            .data()
            .lock()
            .map_err(|_| PolicyError::Weights("variable map lock poisoned".into()))?;
        let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }

    /// The trainable variables with their names, sorted: the adapters of a LoRA policy
    /// ([`Adapters::named_vars`]), every weight otherwise.
    pub fn trainable_named_vars(&self) -> Result<Vec<(String, Var)>> {
        match &self.lora {
            Some(a) => a.named_vars(),
            None => self.named_vars(),
        }
    }

    /// All trainable variables (for `candle_nn::AdamW::new`): see
    /// [`Policy::trainable_named_vars`].
    pub fn vars(&self) -> Result<Vec<Var>> {
        Ok(self
            .trainable_named_vars()?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// The module (full-sequence and cached forward).
    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// A copy of the weights on `device`, in the dtype they are stored in: e.g. a snapshot
    /// decoded in host memory, moved to the GPU that trains or samples with the training
    /// forward.
    pub fn to_device(&self, device: &Device) -> Result<Policy> {
        let tensors = self
            .named_vars()?
            .into_iter()
            .map(|(name, var)| (name, var.as_tensor().detach()))
            .collect();
        let p = Policy::from_tensors(&self.cfg, tensors, device)?
            .with_base_dtype(self.weights_dtype()?)?;
        match &self.lora {
            None => Ok(p),
            Some(a) => {
                let t = a
                    .named_vars()?
                    .into_iter()
                    .map(|(n, v)| (n, v.as_tensor().detach()))
                    .collect();
                p.with_adapters(Adapters::from_tensors(&self.cfg, a.config(), t, device)?)
            }
        }
    }

    /// The same policy whose forward records no gradient graph: its module runs on detached
    /// views of the same variables (shared storage, so it sees every optimiser update; no
    /// copy). For forwards nobody differentiates — the KL reference, spot checks, generation —
    /// which with the trainable module would keep every activation alive until their result
    /// is dropped (candle has no global no-grad switch; a graph is recorded whenever an input
    /// is a variable). Its [`Policy::vars`] are the trainable ones: train this policy, not
    /// the view.
    pub fn no_grad(&self) -> Result<Policy> {
        let model = {
            let data = self.lock()?;
            let adapters = self.lora.as_ref().map(|a| a.var_map()).transpose()?;
            let lv = self
                .lora
                .as_ref()
                .zip(adapters.as_ref())
                .map(|(a, vars)| LoraVars {
                    vars,
                    cfg: a.config(),
                });
            Qwen3::build_frozen(&self.cfg, &data, lv, &self.device)?
                .with_compute_dtype(self.model.compute_dtype())?
        };
        Ok(Policy {
            cfg: self.cfg.clone(),
            varmap: self.varmap.clone(),
            model,
            device: self.device.clone(),
            lora: self.lora.clone(),
        })
    }

    /// Full-sequence forward: `ids` `[b, t]` u32 → logits `[b, t, vocab]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.model.forward(ids)
    }

    /// An empty KV cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.cfg.num_hidden_layers)
    }
}

/// Standard normal sample (Box–Muller), so initialisation depends only on our seeded RNG.
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}
