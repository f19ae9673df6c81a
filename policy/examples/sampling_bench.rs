//! Sampling alone at a 151,936-token vocabulary (Qwen3's): milliseconds per decode step and
//! per token at batch 1, 16 and 64, for the canonical rule (`policy::rule::draw_rows`: f32
//! weights, partial selection for top-p, rows in parallel) and, for the before/after
//! comparison in `docs/gpu.md`, the implementation it replaced (kept below as
//! [`previous_rule`]: f64 softmax computed twice, a full sort of the vocabulary for top-p, one
//! row after another). Both run in the same process on the same logits. Reported: the best
//! wall time per decode step, and the least CPU time per token (all threads; on a loaded,
//! shared machine wall time measures the load, CPU time the work).
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

/// CPU time consumed so far by all threads of this process, in seconds (Linux: the sum of
/// `/proc/self/task/*/schedstat`): on a loaded shared machine wall time measures the load.
fn process_cpu_s() -> f64 {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 * 1e-9
}

/// (best wall time, least CPU time) of `reps` runs of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    (0..reps)
        .map(|_| {
            let (t, c) = (Instant::now(), process_cpu_s());
            f();
            (t.elapsed().as_secs_f64(), process_cpu_s() - c)
        })
        .fold((f64::INFINITY, f64::INFINITY), |a, b| {
            (a.0.min(b.0), a.1.min(b.1))
        })
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
            // Every timing covers 64 rows (64/batch steps), long enough for the CPU clock.
            let steps = 64 / batch;
            let new = best_of(reps, || {
                for _ in 0..steps {
                    std::hint::black_box(draw_rows(&logits, vocab, rule, &us).expect("draw"));
                }
            });
            let old = best_of(reps.min(3), || {
                for _ in 0..steps {
                    for (row, &u) in logits.chunks_exact(vocab).zip(&us) {
                        std::hint::black_box(previous_rule(row, 1.0, f64::from(top_p), u));
                    }
                }
            });
            let (new, old) = (
                (new.0 / steps as f64, new.1 / steps as f64),
                (old.0 / steps as f64, old.1 / steps as f64),
            );
            let per_token = |s: f64| s * 1e3 / batch as f64;
            println!(
                "{}",
                serde_json::json!({
                    "vocab": vocab, "batch": batch, "top_p": top_p, "threads": threads,
                    "before_ms_per_step": old.0 * 1e3, "after_ms_per_step": new.0 * 1e3,
                    "before_cpu_ms_per_token": per_token(old.1),
                    "after_cpu_ms_per_token": per_token(new.1),
                    "wall_speedup": old.0 / new.0, "cpu_speedup": old.1 / new.1,
                })
            );
        }
    }
    Ok(())
}
