//! How a worker should apply an adapter version: merged into its working copy (the inference
//! path built from `W + (α/r)·B·A`) or unmerged in the forward (`W·x + (α/r)·B·(A·x)` per
//! projection). Measures, on random weights with random non-zero adapters:
//!
//! - the install: decoding the adapter payload and building the inference path from the
//!   merged weights (what a worker does per version), against building it for the base alone;
//! - decode tokens/s of the merged inference path, and of the training-forward decoder with
//!   the adapters unmerged against the same decoder on plain weights (the cost an unmerged
//!   forward adds, on one code path);
//! - memory: the adapter payload, the merged projections a worker holds beside its base, and
//!   the copies the inference path makes anyway (fused q/k/v and gate/up).
//!
//! ```text
//! cargo run -p policy --example adapter_install -- --shape tiny --rank 8
//! cargo run -p policy --example adapter_install -- --shape qwen3-0.6b --rank 8 \
//!     --new-tokens 8 --batch 1
//! ```
//! Prints one JSON line.

use std::time::Instant;

use policy::lora::{self, Adapters, LoraConfig};
use policy::{
    infer, DType, Device, GenerationPath, InferModel, ModelConfig, Policy, SamplingParams, Tensor,
};
use rand::SeedableRng;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn main() -> Res<()> {
    let cfg = match arg("--shape", "tiny").as_str() {
        "qwen3-0.6b" => ModelConfig::qwen3_0_6b(),
        _ => ModelConfig::tiny(),
    };
    let rank: usize = arg("--rank", "8").parse()?;
    let new_tokens: usize = arg("--new-tokens", "32").parse()?;
    let batch: usize = arg("--batch", "4").parse()?;
    let lora = LoraConfig::new(rank, 2.0 * rank as f64);
    let dev = Device::Cpu;

    let base = Policy::new_random(&cfg, 0, &dev)?;
    let trained = Adapters::new_random(&cfg, &lora, 1, &dev)?;
    for (name, var) in trained.named_vars()? {
        if name.ends_with("lora_B.weight") {
            var.set(&Tensor::randn(0f32, 0.02, var.dims(), &dev)?)?;
        }
    }
    let payload = trained.to_safetensors_bytes_as(&cfg, DType::BF16)?;

    // The install a worker does per version (merged).
    let t = Instant::now();
    let adapters = Adapters::from_safetensors_bytes(&cfg, &payload, &dev)?;
    let adapted = base.adapted(adapters)?;
    let decode_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let merged = InferModel::from_policy(&adapted)?;
    let build_merged_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let plain = InferModel::from_policy(&base)?;
    let build_base_s = t.elapsed().as_secs_f64();
    drop(plain);

    let params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
    };
    let prompt: Vec<u32> = (0..16).map(|i| (i * 7 + 3) % 250).collect();
    let rate = |f: &mut dyn FnMut() -> Res<()>| -> Res<f64> {
        f()?; // warm-up
        let t = Instant::now();
        f()?;
        Ok((batch * new_tokens) as f64 / t.elapsed().as_secs_f64())
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let infer_merged = rate(&mut || {
        infer::generate(&merged, &prompt, batch, &params, &mut rng)?;
        Ok(())
    })?;
    let train_path = |p: &Policy| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let view = p.no_grad()?;
        rate(&mut || {
            policy::sampling::generate(
                &view,
                &prompt,
                batch,
                &params,
                GenerationPath::Batched,
                &mut rng,
            )?;
            Ok(())
        })
    };
    let train_unmerged = train_path(&adapted)?;
    let train_plain = train_path(&base)?;

    // Memory: the merged projections (new tensors beside the shared base) and the copies the
    // inference path makes in any case (q/k/v and gate/up stacked).
    let mut targeted = 0u64;
    let mut fused = 0u64;
    for (prefix, out, inp) in lora::targeted_projections(&cfg, &lora) {
        let bytes = 4 * (out * inp) as u64;
        targeted += bytes;
        if !(prefix.ends_with("o_proj") || prefix.ends_with("down_proj")) {
            fused += bytes;
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "shape": arg("--shape", "tiny"),
            "rank": rank,
            "params": cfg.num_params(),
            "adapter_params": lora::adapter_params(&cfg, &lora),
            "adapter_payload_bytes_bf16": payload.len(),
            "full_payload_bytes_bf16": 2 * cfg.num_params(),
            "install_decode_s": decode_s,
            "infer_build_merged_s": build_merged_s,
            "infer_build_base_s": build_base_s,
            "tokens_per_s_infer_merged": infer_merged,
            "tokens_per_s_train_path_unmerged": train_unmerged,
            "tokens_per_s_train_path_plain": train_plain,
            "merged_projection_bytes_f32": targeted,
            "of_which_copied_by_the_fused_path_anyway": fused,
            "extra_bytes_of_merging_f32": targeted - fused,
            "batch": batch,
            "new_tokens": new_tokens,
        })
    );
    Ok(())
}
