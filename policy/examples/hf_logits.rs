//! `cargo run -p policy --example hf_logits -- DIR ID,ID,...`: this crate's forward of the
//! Hugging Face folder DIR (`policy::hf::load_hf_dir`) on one token sequence, printed as one
//! JSON object `{"ids": [...], "logits": [[...], ...]}` (one row of vocabulary logits per
//! position). `scripts/peft-check.py --ours` compares it with `transformers`' logits.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(ids)) = (args.next(), args.next()) else {
        return Err("usage: hf_logits DIR ID,ID,...".into());
    };
    let ids: Vec<u32> = ids
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let device = policy::Device::Cpu;
    let (p, _) = policy::hf::load_hf_dir(&PathBuf::from(dir), &device)?;
    let t = policy::Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
    let logits = p.forward(&t)?.squeeze(0)?.to_vec2::<f32>()?;
    println!("{}", serde_json::json!({ "ids": ids, "logits": logits }));
    Ok(())
}
