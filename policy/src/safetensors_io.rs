//! Writing and reading the safetensors files the crate makes (snapshot payloads, adapter
//! files): a deterministic header (tensors in name order) and the config-hash metadata. Below
//! `weights` and `lora`, which both write such files; must not know about either.

use std::collections::BTreeMap;

use crate::error::{PolicyError, Result};

/// safetensors metadata key holding the hex BLAKE3 config hash.
pub const META_CONFIG_HASH: &str = "echo_swarm.config_hash";

/// Reads the config hash recorded in a snapshot payload (`None` when absent).
pub fn snapshot_config_hash(bytes: &[u8]) -> Result<Option<String>> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
    Ok(meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(META_CONFIG_HASH).cloned()))
}

/// The safetensors tag of a snapshot dtype: `F32` or `BF16` (snapshots and adapter payloads
/// are stored in one of them).
pub(crate) fn snapshot_dtype_tag(dtype: candle_core::DType) -> Result<&'static str> {
    match dtype {
        candle_core::DType::F32 => Ok("F32"),
        candle_core::DType::BF16 => Ok("BF16"),
        other => Err(PolicyError::Weights(format!(
            "snapshots are stored as f32 or bf16, not {other:?}"
        ))),
    }
}

/// `t`'s values as little-endian bytes of `dtype` (F32, or BF16 rounded to nearest-even).
pub(crate) fn le_bytes(t: &candle_core::Tensor, dtype: candle_core::DType) -> Result<Vec<u8>> {
    let flat = t.flatten_all()?;
    Ok(match dtype {
        candle_core::DType::BF16 => flat
            .to_dtype(candle_core::DType::BF16)?
            .to_vec1::<half::bf16>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        _ => flat
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    })
}

/// Serialises tensors (raw little-endian bytes of element type `dtype_tag`, e.g. `"F32"`) as a
/// safetensors file with a deterministic header (BTreeMap order).
pub(crate) fn write_safetensors(
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    dtype_tag: &str,
    config_hash: &str,
) -> Result<Vec<u8>> {
    write_safetensors_meta(tensors, dtype_tag, config_hash, BTreeMap::new())
}

/// [`write_safetensors`] with `extra` metadata entries.
pub(crate) fn write_safetensors_meta(
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    dtype_tag: &str,
    config_hash: &str,
    mut meta: BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut header = BTreeMap::new();
    meta.insert(META_CONFIG_HASH.to_string(), config_hash.to_string());
    // Hugging Face `transformers` only accepts safetensors files tagged with a framework.
    meta.insert("format".to_string(), "pt".to_string());
    header.insert(
        "__metadata__".to_string(),
        serde_json::to_value(&meta).map_err(|e| PolicyError::SafeTensors(e.to_string()))?,
    );
    let mut offset = 0usize;
    let mut sorted: Vec<&(String, Vec<usize>, Vec<u8>)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, shape, data) in &sorted {
        let len = data.len();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype_tag, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut h = serde_json::to_vec(&header).map_err(|e| PolicyError::SafeTensors(e.to_string()))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, data) in sorted {
        out.extend_from_slice(data);
    }
    Ok(out)
}
