//! Shared by this crate's integration tests: groups sampled from a real policy.

use policy::{GenerationPath, Policy, SamplingParams};
use rand::SeedableRng;
use storage::{Sample, TrajectoryGroup};

/// Sampling temperature of these tests (the trainers' `temperature` must match).
pub const T: f32 = 0.9;

/// A group of 4 real samples of `policy` (its sampler log-probs; at most `max_new` tokens each)
/// with rewards 0, 1/3, 2/3, 1, for `version`, produced by `worker-{seed}`.
pub fn group(policy: &Policy, version: u64, seed: u64, max_new: usize) -> TrajectoryGroup {
    let prompt: Vec<u32> = vec![257, 49 + (seed % 9) as u32, 43, 50, 61, 259];
    let mut params = SamplingParams::new(max_new, vec![258]);
    params.temperature = T;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let outs = policy::generate(
        policy,
        &prompt,
        4,
        &params,
        GenerationPath::Batched,
        &mut rng,
    )
    .unwrap();
    let samples = outs
        .into_iter()
        .enumerate()
        .map(|(k, c)| {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&seed.to_le_bytes());
            id[8] = k as u8;
            Sample {
                trajectory_id: id,
                loss_mask: vec![1; c.tokens.len()],
                response_text: String::new(),
                reward: k as f32 / 3.0,
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: 0,
            }
        })
        .collect();
    let mut gid = [0u8; 16];
    gid[..8].copy_from_slice(&seed.to_le_bytes());
    gid[15] = 0xff;
    TrajectoryGroup {
        group_id: gid,
        task_id: "test".into(),
        prompt_id: format!("p{seed}"),
        version,
        seq: 0,
        producer: format!("worker-{seed}"),
        prompt_text: String::new(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples,
        signature: None,
    }
}
