//! Model configuration (a subset of Hugging Face's `config.json` for Qwen2 / Qwen3) and its
//! canonical hash.

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// Which member of the Qwen family the weights follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Qwen3: RMS-normalised queries and keys (`q_norm`, `k_norm`), no q/k/v bias by default.
    Qwen3,
    /// Qwen2 / Qwen2.5: no q/k norm, bias on the q/k/v projections.
    Qwen2,
}

impl Arch {
    fn as_str(self) -> &'static str {
        match self {
            Arch::Qwen3 => "qwen3",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Architecture hyper-parameters of the policy model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Qwen2 or Qwen3 layout.
    pub arch: Arch,
    /// Number of token embeddings (rows of `embed_tokens` / `lm_head`).
    pub vocab_size: usize,
    /// Residual stream width (d_model).
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention; divides `num_attention_heads`).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Longest sequence (prompt + response) the model accepts.
    pub max_position_embeddings: usize,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Share `embed_tokens.weight` with the output projection (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (Qwen2: true; Qwen3: false).
    pub attention_bias: bool,
}

impl ModelConfig {
    /// The embedded default: a tiny Qwen3 over the byte tokenizer (vocab 260), small enough to
    /// train and sample on two CPU cores in minutes (~0.62 M parameters).
    pub fn tiny() -> Self {
        ModelConfig {
            arch: Arch::Qwen3,
            vocab_size: crate::tokenizer::ByteTokenizer::VOCAB_SIZE,
            hidden_size: 128,
            intermediate_size: 384,
            num_hidden_layers: 3,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            max_position_embeddings: 256,
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            attention_bias: false,
        }
    }

    /// The shape of Qwen3-0.6B (Hugging Face `Qwen/Qwen3-0.6B`, 596 M parameters with tied
    /// embeddings): for memory planning and benchmarks with random weights.
    pub fn qwen3_0_6b() -> Self {
        ModelConfig {
            arch: Arch::Qwen3,
            vocab_size: 151_936,
            hidden_size: 1024,
            intermediate_size: 3072,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 128,
            max_position_embeddings: 40_960,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            attention_bias: false,
        }
    }

    /// The Qwen3-4B shape (Hugging Face config): hidden 2,560, 36 layers, 32 heads, 8 KV
    /// heads, intermediate 9,728, tied embeddings.
    pub fn qwen3_4b() -> Self {
        ModelConfig {
            hidden_size: 2560,
            intermediate_size: 9728,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            ..Self::qwen3_0_6b()
        }
    }

    /// The Qwen3-8B shape: hidden 4,096, 36 layers, 32 heads, 8 KV heads, intermediate
    /// 12,288, untied output projection.
    pub fn qwen3_8b() -> Self {
        ModelConfig {
            hidden_size: 4096,
            intermediate_size: 12288,
            tie_word_embeddings: false,
            ..Self::qwen3_4b()
        }
    }

    /// The Qwen3-32B shape: hidden 5,120, 64 layers, 64 heads, 8 KV heads, intermediate
    /// 25,600, untied output projection.
    pub fn qwen3_32b() -> Self {
        ModelConfig {
            hidden_size: 5120,
            intermediate_size: 25600,
            num_hidden_layers: 64,
            num_attention_heads: 64,
            ..Self::qwen3_8b()
        }
    }

    /// Whether the attention block has `q_norm` / `k_norm` (Qwen3 only).
    pub fn qk_norm(&self) -> bool {
        self.arch == Arch::Qwen3
    }

    /// Checks internal consistency; every constructor path calls this.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(PolicyError::InvalidConfig(m.to_string()));
        if self.vocab_size == 0 {
            return bad("vocab_size must be > 0");
        }
        if self.hidden_size == 0 || self.intermediate_size == 0 || self.head_dim == 0 {
            return bad("hidden_size, intermediate_size and head_dim must be > 0");
        }
        if self.num_hidden_layers == 0 {
            return bad("num_hidden_layers must be > 0");
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return bad("num_attention_heads and num_key_value_heads must be > 0");
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad("num_attention_heads must be a multiple of num_key_value_heads");
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("head_dim must be even (RoPE rotates pairs)");
        }
        if self.max_position_embeddings == 0 {
            return bad("max_position_embeddings must be > 0");
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad("rope_theta must be a positive finite number");
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps must be a positive finite number");
        }
        // Guard against absurd sizes from a hostile config.json before allocating anything.
        let params = self.num_params() as u128;
        if params > 200_000_000_000 {
            return bad("model is implausibly large (> 200 B parameters)");
        }
        Ok(())
    }

    /// Number of trainable parameters.
    pub fn num_params(&self) -> u64 {
        let (h, i, v) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
        );
        let q = (self.num_attention_heads * self.head_dim) as u64;
        let kv = (self.num_key_value_heads * self.head_dim) as u64;
        let mut layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
        if self.attention_bias {
            layer += q + 2 * kv;
        }
        if self.qk_norm() {
            layer += 2 * self.head_dim as u64;
        }
        let mut total = v * h + h + layer * self.num_hidden_layers as u64;
        if !self.tie_word_embeddings {
            total += v * h;
        }
        total
    }

    /// Canonical, versioned text encoding of the config: one `key=value` line per field in a
    /// fixed order, floats as their IEEE-754 bit patterns. Stable across serde versions.
    pub fn canonical_encoding(&self) -> String {
        format!(
            "echo-swarm/policy-config/v1\narch={}\nvocab_size={}\nhidden_size={}\n\
             intermediate_size={}\nnum_hidden_layers={}\nnum_attention_heads={}\n\
             num_key_value_heads={}\nhead_dim={}\nmax_position_embeddings={}\n\
             rope_theta={:016x}\nrms_norm_eps={:016x}\ntie_word_embeddings={}\nattention_bias={}\n",
            self.arch.as_str(),
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.max_position_embeddings,
            self.rope_theta.to_bits(),
            self.rms_norm_eps.to_bits(),
            self.tie_word_embeddings,
            self.attention_bias,
        )
    }

    /// BLAKE3 of [`Self::canonical_encoding`]: the "model config hash" of snapshot manifests.
    pub fn hash(&self) -> [u8; 32] {
        *blake3::hash(self.canonical_encoding().as_bytes()).as_bytes()
    }

    /// Hex form of [`Self::hash`].
    pub fn hash_hex(&self) -> String {
        blake3::Hash::from(self.hash()).to_hex().to_string()
    }

    /// Parses a Hugging Face `config.json` of a Qwen2 / Qwen3 model.
    pub fn from_hf_json(json: &str) -> Result<Self> {
        let raw: HfConfig = serde_json::from_str(json)
            .map_err(|e| PolicyError::InvalidConfig(format!("config.json: {e}")))?;
        let model_type = raw.model_type.as_deref().unwrap_or("");
        let arch = match model_type {
            "qwen3" => Arch::Qwen3,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(PolicyError::InvalidConfig(format!(
                    "config.json: model_type {other:?} is not supported (expected \"qwen3\" or \"qwen2\")"
                )))
            }
        };
        let rope_theta = rope_theta(&raw)?;
        if raw.use_sliding_window == Some(true) {
            return Err(PolicyError::InvalidConfig(
                "config.json: use_sliding_window = true is not supported".into(),
            ));
        }
        if raw.num_attention_heads == 0 {
            return Err(PolicyError::InvalidConfig(
                "config.json: num_attention_heads must be > 0".into(),
            ));
        }
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads);
        let cfg = ModelConfig {
            arch,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
            head_dim,
            max_position_embeddings: raw.max_position_embeddings,
            rope_theta,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(arch == Arch::Qwen2),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Writes the config as a Hugging Face `config.json` (so exported checkpoints load in HF
    /// tools). `eos_token_id` is included when given.
    pub fn to_hf_json(&self, eos_token_id: Option<u32>) -> String {
        let (model_type, archi) = match self.arch {
            Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
            Arch::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        };
        let mut v = serde_json::json!({
            "architectures": [archi],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            // transformers 5 reads this; 4.x reads the top-level field above.
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if let (Some(eos), Some(obj)) = (eos_token_id, v.as_object_mut()) {
            obj.insert("eos_token_id".into(), eos.into());
        }
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
}

/// RoPE's base when `config.json` does not name one (transformers' default).
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// The RoPE base of a `config.json`, in either layout: transformers 5 writes it only inside
/// `rope_parameters` (`{"rope_type": "default", "rope_theta": θ}`), 4.x at the top level with
/// an optional `rope_scaling`. Only plain RoPE is supported: any other `rope_type` (`yarn`,
/// `linear`, `dynamic`, `llama3`, `longrope`, …), any scaling key, and a `rope_theta` that
/// the two places disagree on are refused with the field named.
fn rope_theta(raw: &HfConfig) -> Result<f64> {
    let bad = |m: String| Err(PolicyError::InvalidConfig(format!("config.json: {m}")));
    let plain = |t: &str| t == "default";
    match raw.rope_scaling.as_ref() {
        None | Some(serde_json::Value::Null) => {}
        Some(v) => {
            let kind = v.get("rope_type").or_else(|| v.get("type"));
            match kind.and_then(|k| k.as_str()) {
                // Plain RoPE by name (transformers 5 may mirror `rope_parameters` here).
                Some(t) if plain(t) => {}
                Some(t) => {
                    return bad(format!(
                        "rope_scaling.rope_type = {t:?} is not supported (plain RoPE only)"
                    ))
                }
                None => return bad("rope_scaling is not supported (plain RoPE only)".into()),
            }
        }
    }
    let Some(params) = raw.rope_parameters.as_ref().filter(|v| !v.is_null()) else {
        return Ok(raw.rope_theta.unwrap_or(DEFAULT_ROPE_THETA));
    };
    let Some(obj) = params.as_object() else {
        return bad("rope_parameters must be an object".into());
    };
    // The type first: a scaling's own keys are reported as its type.
    match obj.get("rope_type").map(|v| v.as_str()) {
        None | Some(Some("default")) => {}
        Some(Some(t)) => {
            return bad(format!(
                "rope_parameters.rope_type = {t:?} is not supported (plain RoPE only: \"default\")"
            ))
        }
        Some(None) => return bad("rope_parameters.rope_type must be a string".into()),
    }
    if let Some(other) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "rope_type" | "rope_theta"))
    {
        return bad(format!(
            "rope_parameters.{other} is not supported (plain RoPE only: rope_type \"default\" and rope_theta)"
        ));
    }
    let theta = match obj.get("rope_theta") {
        None => raw.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
        Some(v) => match v.as_f64() {
            Some(t) => t,
            None => return bad("rope_parameters.rope_theta must be a number".into()),
        },
    };
    if raw.rope_theta.is_some_and(|top| top != theta) {
        return bad(format!(
            "rope_theta = {} and rope_parameters.rope_theta = {theta} disagree",
            raw.rope_theta.unwrap_or_default()
        ));
    }
    Ok(theta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_config_is_valid_and_small() {
        let c = ModelConfig::tiny();
        c.validate().unwrap();
        assert!(c.num_params() < 1_000_000, "{}", c.num_params());
    }

    #[test]
    fn hash_changes_with_any_field() {
        let a = ModelConfig::tiny();
        let mut b = a.clone();
        b.rms_norm_eps = 1e-5;
        assert_ne!(a.hash(), b.hash());
        let mut c = a.clone();
        c.arch = Arch::Qwen2;
        assert_ne!(a.hash(), c.hash());
        assert_eq!(a.hash(), ModelConfig::tiny().hash());
    }

    #[test]
    fn hf_json_round_trip() {
        let a = ModelConfig::tiny();
        let b = ModelConfig::from_hf_json(&a.to_hf_json(Some(258))).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn hf_json_rejects_bad_input() {
        assert!(ModelConfig::from_hf_json("not json").is_err());
        assert!(ModelConfig::from_hf_json(r#"{"model_type":"llama"}"#).is_err());
        let mut v: serde_json::Value =
            serde_json::from_str(&ModelConfig::tiny().to_hf_json(None)).unwrap();
        v["num_key_value_heads"] = 3.into();
        assert!(ModelConfig::from_hf_json(&v.to_string()).is_err());
        v["num_key_value_heads"] = 2.into();
        v["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
        assert!(ModelConfig::from_hf_json(&v.to_string()).is_err());
        v["rope_scaling"] = serde_json::Value::Null;
        assert!(ModelConfig::from_hf_json(&v.to_string()).is_ok());
    }

    /// The config with `rope_theta` removed and `rope_parameters` set to `params`.
    fn tf5(params: serde_json::Value) -> Result<ModelConfig> {
        let mut v: serde_json::Value =
            serde_json::from_str(&ModelConfig::tiny().to_hf_json(None)).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("rope_theta");
        obj.insert("rope_parameters".into(), params);
        ModelConfig::from_hf_json(&v.to_string())
    }

    fn refusal(r: Result<ModelConfig>) -> String {
        match r {
            Err(PolicyError::InvalidConfig(m)) => m,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn rope_parameters_of_transformers_5_are_read() {
        let c = tf5(serde_json::json!({"rope_type": "default", "rope_theta": 1e6})).unwrap();
        assert_eq!(c.rope_theta, 1e6);
        // Without a θ anywhere: transformers' default.
        assert_eq!(
            tf5(serde_json::json!({"rope_type": "default"}))
                .unwrap()
                .rope_theta,
            1e4
        );
        // Both layouts at once (what to_hf_json writes) agree.
        let a = ModelConfig::qwen3_0_6b();
        let v: serde_json::Value = serde_json::from_str(&a.to_hf_json(None)).unwrap();
        assert_eq!(v["rope_parameters"]["rope_theta"], 1e6);
        assert_eq!(ModelConfig::from_hf_json(&v.to_string()).unwrap(), a);
        // transformers 5 may mirror plain parameters into rope_scaling.
        let mut v = v;
        v["rope_scaling"] = serde_json::json!({"rope_type": "default", "rope_theta": 1e6});
        assert_eq!(ModelConfig::from_hf_json(&v.to_string()).unwrap(), a);
    }

    #[test]
    fn unsupported_rope_types_and_scalings_are_refused_with_the_field_named() {
        let yarn = serde_json::json!({
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
            "original_max_position_embeddings": 32768,
        });
        let m = refusal(tf5(yarn));
        assert!(
            m.contains("rope_parameters.rope_type") && m.contains("yarn"),
            "{m}"
        );
        let m = refusal(tf5(serde_json::json!({"rope_theta": 1e6, "factor": 2.0})));
        assert!(m.contains("rope_parameters.factor"), "{m}");
        let m = refusal(tf5(serde_json::json!({"rope_type": 3})));
        assert!(m.contains("rope_parameters.rope_type"), "{m}");
        let m = refusal(tf5(serde_json::json!({"rope_theta": "big"})));
        assert!(m.contains("rope_parameters.rope_theta"), "{m}");
        let m = refusal(tf5(serde_json::json!(1e6)));
        assert!(m.contains("rope_parameters"), "{m}");
        // 4.x layout: rope_scaling with a type names it.
        let mut v: serde_json::Value =
            serde_json::from_str(&ModelConfig::tiny().to_hf_json(None)).unwrap();
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0});
        let m = refusal(ModelConfig::from_hf_json(&v.to_string()));
        assert!(
            m.contains("rope_scaling.rope_type") && m.contains("linear"),
            "{m}"
        );
        // The two places disagreeing.
        v["rope_scaling"] = serde_json::Value::Null;
        v["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 1e6});
        let m = refusal(ModelConfig::from_hf_json(&v.to_string()));
        assert!(m.contains("disagree"), "{m}");
    }
}
