//! The cost of an external environment per call against a built-in one (docs/environments.md,
//! "What a process round trip costs"): episodes of the built-in `kuhn-poker` and of the
//! repository's `envs/testenv.py` (stdlib Python, three turns) through the same
//! `Environment` trait, timing every `reset` and `step`; then the start of the external one
//! (a process and its `hello`, the determinism check). Prints one JSON object.
//!
//! `cargo run --release -p tasks --example external_cost [episodes]`

use std::time::{Duration, Instant};

use tasks::env::{Environment, Step};

struct Timing {
    resets: Vec<Duration>,
    steps: Vec<Duration>,
}

fn play(env: &dyn Environment, episodes: u64, actions: &[&str]) -> Timing {
    let mut t = Timing {
        resets: Vec::new(),
        steps: Vec::new(),
    };
    for seed in 0..episodes {
        let t0 = Instant::now();
        let mut ep = env.reset(seed).expect("reset").episode;
        t.resets.push(t0.elapsed());
        for k in 0.. {
            let a = actions[k % actions.len()];
            let t0 = Instant::now();
            let s = ep.try_step(a).expect("step");
            t.steps.push(t0.elapsed());
            if matches!(s, Step::Done { .. }) {
                break;
            }
        }
    }
    t
}

fn us(mut d: Vec<Duration>) -> serde_json::Value {
    d.sort();
    let q = |p: f64| d[((d.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    let mean = d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len() as f64 * 1e6;
    serde_json::json!({"n": d.len(), "mean_us": mean, "p50_us": q(0.5), "p99_us": q(0.99)})
}

fn main() {
    let episodes: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let kuhn = tasks::build_env("kuhn-poker", &serde_json::json!({"opponent": "always-bet"}))
        .expect("kuhn-poker");
    let builtin = play(kuhn.as_ref(), episodes, &["check", "call", "bet"]);
    let spec = tasks::external::ExternalSpec {
        command: vec![
            "python3".into(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../envs/testenv.py").into(),
        ],
        ..Default::default()
    };
    let t0 = Instant::now();
    let ext = tasks::external::start("testenv", &serde_json::json!({"turns": 3}), &spec)
        .expect("testenv");
    let start_ms = t0.elapsed().as_secs_f64() * 1e3;
    let external = play(ext.as_ref(), episodes, &["1", "2", "3"]);
    let c = ext.counters();
    let out = serde_json::json!({
        "episodes": episodes,
        "builtin_kuhn": {"reset": us(builtin.resets), "step": us(builtin.steps)},
        "external_testenv": {
            "reset": us(external.resets), "step": us(external.steps),
            "start_ms": start_ms,
            "determinism_seeds": spec.determinism_seeds,
            "processes_started": c.spawned.load(std::sync::atomic::Ordering::Relaxed),
        },
        "memory_mib": spec.memory_mib,
        "network": spec.network,
    });
    println!("{out}");
}
