//! Sampling alone at a 151,936-token vocabulary (Qwen3's): milliseconds per decode step and
//! per token at batch 1, 16 and 64, for the canonical rule (`policy::rule::draw_rows`: f32
//! weights, partial selection for top-p, rows in parallel) and, for the before/after
//! comparison in `docs/gpu.md`, the implementation it replaced (kept below as
//! [`previous_rule`]: f64 softmax computed twice, a full sort of the vocabulary for top-p, one
//! row after another). Both run in the same process on the same logits, so the comparison
//! holds under whatever else the machine is doing.
//!
//! ```text
//! cargo run -j2 -p policy --example sampling_bench -- [--reps 5] [--vocab 151936]
//! ```
//!
//! Logits: Gaussian with standard deviation 3 (a long-tailed distribution like a language
//! model's: the 0.95 nucleus holds a few thousand tokens). Prints one JSON line per setting.

use std::time::Instant;

use policy::rule::{draw_rows, RuleParams};
use rand::{Rng, SeedableRng};

/// The sampler before the canonical rule, verbatim in substance: f64 softmax, full sort for
/// top-p, inverse CDF in probability order.
fn previous_rule(logits: &[f32], t: f64, top_p: f64, u: f64) -> usize {
    let scaled: Vec<f64> = logits.iter().map(|&x| f64::from(x) / t).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scaled.iter().map(|x| (x - max).exp()).sum();
    let lse = max + sum.ln();
    let probs: Vec<f64> = scaled.iter().map(|x| (x - lse).exp()).collect();
    if top_p < 1.0 {
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let mut cum = 0.0;
        let mut cut = order.len();
        for (k, &i) in order.iter().enumerate() {
            cum += probs[i];
            if cum >= top_p {
                cut = k + 1;
                break;
            }
        }
        let kept = &order[..cut];
        let mass: f64 = kept.iter().map(|&i| probs[i]).sum();
        let mut x = u * mass;
        for &i in kept {
            x -= probs[i];
            if x <= 0.0 {
                return i;
            }
        }
        kept[kept.len() - 1]
    } else {
        let mut x = u;
        for (i, p) in probs.iter().enumerate() {
            x -= p;
            if x <= 0.0 {
                return i;
            }
        }
        probs.len() - 1
    }
}

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut reps, mut vocab) = (5usize, 151_936usize);
    while let Some(a) = args.next() {
        let val = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--reps" => reps = val.parse()?,
            "--vocab" => vocab = val.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let threads = rayon::current_num_threads();
    for top_p in [1.0f32, 0.95] {
        for batch in [1usize, 16, 64] {
            let logits: Vec<f32> = (0..batch * vocab)
                .map(|_| {
                    let (a, b): (f32, f32) = (rng.gen::<f32>().max(1e-9), rng.gen());
                    3.0 * (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
                })
                .collect();
            let us: Vec<f64> = (0..batch).map(|_| rng.gen()).collect();
            let rule = RuleParams {
                temperature: 1.0,
                top_p,
            };
            let new = best_of(reps, || {
                std::hint::black_box(draw_rows(&logits, vocab, rule, &us).expect("draw"));
            });
            let old = best_of(reps.min(3), || {
                for (row, &u) in logits.chunks_exact(vocab).zip(&us) {
                    std::hint::black_box(previous_rule(row, 1.0, f64::from(top_p), u));
                }
            });
            println!(
                "{}",
                serde_json::json!({
                    "vocab": vocab, "batch": batch, "top_p": top_p, "threads": threads,
                    "before_ms_per_step": old * 1e3, "before_ms_per_token": old * 1e3 / batch as f64,
                    "after_ms_per_step": new * 1e3, "after_ms_per_token": new * 1e3 / batch as f64,
                    "speedup": old / new,
                })
            );
        }
    }
    Ok(())
}
