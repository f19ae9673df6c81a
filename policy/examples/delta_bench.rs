//! Encode and apply time and size of a bf16 snapshot delta (`policy::delta`) at a model's
//! shape (`docs/broadcast.md`, "Encode and apply time"):
//!
//! ```text
//! cargo run --release -p policy --example delta_bench -- \
//!     [--shape tiny|qwen3-0.6b] [--changed-pct 1.0] [--threads 2] [--reps 3]
//! ```
//!
//! The base is the shape's random model as its bf16 payload; the new version moves a random
//! `--changed-pct` % of the values one ulp up or down at random (what an optimiser step at a
//! small learning rate does to the values it moves at all). Times, on a rayon pool of
//! `--threads` threads: one payload's BLAKE3 (`hash_s`); the publisher's `encode_hashed` (it
//! hashed both payloads for their manifests) and `encode` (which hashes them itself); the
//! worker's `apply` (a new buffer; what a live install runs) and `apply_in_place` (what a
//! catch-up runs), both checking the base's and the result's hash; `encode_plus_apply_s` is
//! `encode_hashed` + `apply`. Formats 2 and 1 for comparison (format 1 timed single-threaded,
//! as it was). The round trips are checked bit for bit. Prints one JSON line (medians of
//! `--reps` runs).

use std::time::Instant;

use policy::{delta, DType, Device, ModelConfig, Policy};
use rand::{Rng, SeedableRng};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn ensure(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..reps {
        let t0 = Instant::now();
        last = Some(f());
        times.push(t0.elapsed().as_secs_f64());
    }
    (median(times), last.expect("reps ≥ 1"))
}

fn main() -> Result<()> {
    let (mut shape, mut pct, mut threads, mut reps) = ("tiny".to_string(), 1.0f64, 2usize, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut val = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => shape = val()?,
            "--changed-pct" => pct = val()?.parse()?,
            "--threads" => threads = val()?.parse()?,
            "--reps" => reps = val()?.parse::<usize>()?.max(1),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let cfg = match shape.as_str() {
        "tiny" => ModelConfig::tiny(),
        "qwen3-0.6b" => ModelConfig::qwen3_0_6b(),
        other => return Err(format!("unknown --shape {other} (tiny, qwen3-0.6b)").into()),
    };
    let base = {
        let p = Policy::new_random(&cfg, 0, &Device::Cpu)?;
        p.to_safetensors_bytes_as(DType::BF16)?
    };
    let start = 8 + u64::from_le_bytes(base[..8].try_into()?) as usize;
    let mut new = base.clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut changed = 0usize;
    for v in new[start..].chunks_exact_mut(2) {
        if rng.gen_bool(pct / 100.0) {
            let b = u16::from_le_bytes([v[0], v[1]]);
            let b = if rng.gen() {
                b.wrapping_add(1)
            } else {
                b.wrapping_sub(1)
            };
            v.copy_from_slice(&b.to_le_bytes());
            changed += 1;
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    // The publisher hashed both payloads for their manifests: it calls `encode_hashed`.
    let hash = |bytes: &[u8]| {
        *blake3::Hasher::new()
            .update_rayon(bytes)
            .finalize()
            .as_bytes()
    };
    let (hash_s, base_root) = pool.install(|| time(reps, || hash(&base)));
    let new_root = hash(&new);
    let (encode_hashed_s, d) = pool.install(|| {
        time(reps, || {
            delta::encode_hashed(&base, base_root, &new, new_root)
        })
    });
    let d = d?;
    let (encode_s, d_again) = pool.install(|| time(reps, || delta::encode(&base, &new)));
    ensure(d_again? == d, "encode and encode_hashed differ")?;
    // A worker's live install (`apply`: a new buffer, the held base kept) and a catch-up's
    // (`apply_in_place`); each checks the base's and the result's hash.
    let (apply_s, out) = pool.install(|| time(reps, || delta::apply(&base, &d)));
    ensure(out? == new, "apply is not bit-exact")?;
    let mut held = base.clone();
    let mut in_place = Vec::new();
    for _ in 0..reps {
        held.copy_from_slice(&base);
        let t0 = Instant::now();
        pool.install(|| delta::apply_in_place(&mut held, &d))?;
        in_place.push(t0.elapsed().as_secs_f64());
    }
    let apply_in_place_s = median(in_place);
    ensure(held == new, "the in-place round trip is not bit-exact")?;
    let d2 = pool.install(|| delta::encode_v2(&base, &new))?;
    ensure(
        delta::apply(&base, &d2)? == new,
        "format 2 round trip is not bit-exact",
    )?;
    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let (v1_encode_s, d1) = single.install(|| time(1, || delta::encode_v1(&base, &new)));
    let d1 = d1?;
    let (v1_apply_s, out1) = single.install(|| time(1, || delta::apply(&base, &d1)));
    ensure(out1? == new, "format 1 round trip is not bit-exact")?;
    println!(
        "{}",
        serde_json::json!({
            "shape": shape, "params": cfg.num_params(), "threads": threads, "reps": reps,
            "full_bytes": new.len(),
            "changed_frac": changed as f64 / ((new.len() - start) / 2) as f64,
            "format": delta::DELTA_VERSION,
            "delta_bytes": d.len(), "delta_ratio": d.len() as f64 / new.len() as f64,
            "v2_bytes": d2.len(), "v2_ratio": d2.len() as f64 / new.len() as f64,
            "v1_bytes": d1.len(), "v1_ratio": d1.len() as f64 / new.len() as f64,
            "hash_s": hash_s, "encode_hashed_s": encode_hashed_s, "encode_s": encode_s,
            "apply_s": apply_s, "apply_in_place_s": apply_in_place_s,
            "encode_plus_apply_s": encode_hashed_s + apply_s,
            "v1_encode_s_1thread": v1_encode_s, "v1_apply_s_1thread": v1_apply_s,
        })
    );
    Ok(())
}
