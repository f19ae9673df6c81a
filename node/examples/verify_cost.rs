//! What the learner's verification of one pulled group costs (signature check, assigned-prompt
//! check, reward recomputation), on the embedded model's byte tokenizer and the default
//! `arith` task, for the demo's group shape (16 samples × 6 response tokens) and a long one
//! (16 × 512). Not a test: run it to measure.
//!
//! ```text
//! cargo run -p echo-node --example verify_cost
//! ```
//!
//! Prints one JSON line per shape: milliseconds per group for each layer alone and for all
//! of them (medians over repeated passes).

use std::sync::Arc;
use std::time::Instant;

use echo_node::roles::learner::verify::{PromptLayer, RewardLayer, SignatureLayer};
use learner::Pipeline;
use policy::Tokenizer;
use storage::record::GroupLimits;
use storage::{NodeKey, Sample, TrajectoryGroup};

const SWARM: &str = "bench";

fn group(key: &NodeKey, producer: &str, seq: u64, n: usize, len: usize) -> TrajectoryGroup {
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let tok = Tokenizer::byte();
    let seed = tasks::assign::assignment_seed(SWARM, &[9; 32]);
    let prompt = task
        .prompt(tasks::assign::assigned_index(
            task.as_ref(),
            &seed,
            producer,
            seq,
        ))
        .unwrap();
    let answer = task.reference_completion(&prompt).unwrap();
    let samples = (0..n)
        .map(|k| {
            // The answer, padded with spaces to `len` tokens.
            let mut tokens = tok.encode(&answer).unwrap();
            tokens.resize(len.max(tokens.len()), u32::from(b' '));
            let text = tok.decode(&tokens).unwrap();
            Sample {
                trajectory_id: [k as u8; 16],
                reward: task.reward(&prompt, &text).value,
                sampler_logprobs: vec![-1.0; tokens.len()],
                loss_mask: vec![1; tokens.len()],
                response_tokens: tokens,
                response_text: text,
                finished_unix_ms: 0,
            }
        })
        .collect();
    let mut g = TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: task.name().into(),
        prompt_id: prompt.id,
        version: 1,
        seq,
        producer: producer.into(),
        prompt_tokens: tok.encode_prompt(&prompt.text).unwrap(),
        prompt_text: prompt.text,
        created_unix_ms: 0,
        samples,
        signature: None,
    };
    g.sign(key.signing_key());
    g
}

/// Median milliseconds per group of `v` over `groups` (each pass verifies every group once).
fn ms_per_group(v: &Pipeline, peer: &p2p::PeerId, groups: &[TrajectoryGroup]) -> f64 {
    let peer = peer.to_base58();
    let mut passes: Vec<f64> = (0..7)
        .map(|_| {
            let t0 = Instant::now();
            for g in groups {
                v.check(&peer, 0, g).expect("an honest group verifies");
            }
            t0.elapsed().as_secs_f64() * 1e3 / groups.len() as f64
        })
        .collect();
    passes.sort_by(f64::total_cmp);
    passes[passes.len() / 2]
}

fn main() {
    let key = NodeKey::from_seed([1; 32]);
    let peer = p2p::peer_id_from_seed(key.seed());
    let producer = peer.to_base58();
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let tok = Arc::new(Tokenizer::byte());
    let seed = tasks::assign::assignment_seed(SWARM, &[9; 32]);
    for (n, len) in [(16usize, 6usize), (16, 512)] {
        let groups: Vec<TrajectoryGroup> = (0..200)
            .map(|s| group(&key, &producer, s, n, len))
            .collect();
        // A fresh prompt layer per pass would re-admit; a repeated group is admitted as a
        // repeat (same seq, same group id), which costs the same lookup.
        // Each stage behind the pipeline's own structure stage; `structure_ms` is that alone.
        let pipe = || Pipeline::new(GroupLimits::PERMISSIVE);
        let structure = pipe();
        let sig = pipe().with_stage(SignatureLayer);
        let prompt = pipe().with_stage(PromptLayer::new(task.clone(), tok.clone(), seed));
        let reward = pipe().with_stage(RewardLayer {
            task: task.clone(),
            tokenizer: tok.clone(),
        });
        let all = pipe()
            .with_stage(SignatureLayer)
            .with_stage(PromptLayer::new(task.clone(), tok.clone(), seed))
            .with_stage(RewardLayer {
                task: task.clone(),
                tokenizer: tok.clone(),
            });
        println!(
            "{}",
            serde_json::json!({
                "samples": n,
                "response_tokens": len,
                "bytes": groups[0].encode().len(),
                "structure_ms": ms_per_group(&structure, &peer, &groups),
                "signature_ms": ms_per_group(&sig, &peer, &groups),
                "prompt_ms": ms_per_group(&prompt, &peer, &groups),
                "reward_ms": ms_per_group(&reward, &peer, &groups),
                "all_ms": ms_per_group(&all, &peer, &groups),
            })
        );
    }
    // The admission proof of work: hashes per second on one core, and the expected cost of
    // one identity (2^bits hashes) at a few difficulties.
    let n = 1u64 << 20;
    let t0 = Instant::now();
    let found = (0..n)
        .filter(|&k| storage::admission::check_work(SWARM, &producer, k, 16))
        .count();
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    let cost: serde_json::Map<String, serde_json::Value> = [16u32, 20, 24, 28]
        .iter()
        .map(|b| (format!("{b}_bits_s"), ((1u64 << b) as f64 / rate).into()))
        .collect();
    println!(
        "{}",
        serde_json::json!({"pow_hashes_per_s": rate, "pow_found_16_bits": found, "identity_cost": cost})
    );
}
