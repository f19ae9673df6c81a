//! Assigned prompts: which prompt a rollout worker must answer for each of its groups.
//!
//! A worker that chose its own prompts could answer only the ones it does well on (or that
//! push the policy where it wants). Instead, group number `seq` of worker `w` must answer the
//! prompt with index [`assigned_index`]`(task, seed, w, seq)`, where the seed derives from
//! what both the worker and the learner already know and the worker cannot choose: the swarm
//! id and the learner's public key ([`assignment_seed`]). The learner recomputes the index
//! for every pulled group and refuses a group whose prompt differs.
//!
//! The derivation is specified here byte for byte (BLAKE3 and a fixed reduction, no RNG
//! crate whose stream may change between versions), so that a worker and a learner built
//! from different releases agree.
//!
//! What it does not prevent: the stream is public, so a worker can look ahead and *withhold*
//! the groups of prompts it dislikes (skipping sequence numbers). That costs it throughput and
//! shows as gaps in its sequence numbers; it cannot make the learner train on a prompt of its
//! choosing.

use crate::Task;

/// Domain-separation prefix of the seed derivation.
const SEED_CONTEXT: &[u8] = b"echo-swarm/assigned-prompts/seed/v1";
/// Domain-separation prefix of the per-group derivation.
const INDEX_CONTEXT: &[u8] = b"echo-swarm/assigned-prompts/index/v1";

/// The run's assignment seed: BLAKE3(context ‖ len(swarm_id) ‖ swarm_id ‖ learner public key).
/// Both sides know the swarm id and the learner's key from their configuration (the learner
/// from its own key), and neither can be chosen by a worker.
pub fn assignment_seed(swarm_id: &str, learner_public_key: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(SEED_CONTEXT);
    h.update(&(swarm_id.len() as u64).to_le_bytes());
    h.update(swarm_id.as_bytes());
    h.update(learner_public_key);
    *h.finalize().as_bytes()
}

/// The prompt index assigned to group `seq` of `worker` (its peer id, base58): the first 8
/// bytes (LE) `x` of BLAKE3(context ‖ seed ‖ len(worker) ‖ worker ‖ seq LE), reduced to the
/// task's prompt count `n` as `⌊x·n / 2⁶⁴⌋` (uniform up to 2⁻⁶⁴·n), or `x` itself for a
/// generator task without a count. Pure and cheap (one hash).
pub fn assigned_index(task: &dyn Task, seed: &[u8; 32], worker: &str, seq: u64) -> u64 {
    index_for(task.metadata().num_prompts, seed, worker, seq)
}

/// [`assigned_index`] for a task with `num_prompts` prompts (`None`: a generator).
pub fn index_for(num_prompts: Option<u64>, seed: &[u8; 32], worker: &str, seq: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(INDEX_CONTEXT);
    h.update(seed);
    h.update(&(worker.len() as u64).to_le_bytes());
    h.update(worker.as_bytes());
    h.update(&seq.to_le_bytes());
    let mut x = [0u8; 8];
    x.copy_from_slice(&h.finalize().as_bytes()[..8]);
    let x = u64::from_le_bytes(x);
    match num_prompts {
        None => x,
        Some(0) => 0,
        Some(n) => ((u128::from(x) * u128::from(n)) >> 64) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_is_deterministic_and_depends_on_every_input() {
        let task = crate::build_task("arith", &serde_json::Value::Null).unwrap();
        let seed = assignment_seed("demo", &[1; 32]);
        assert_eq!(seed, assignment_seed("demo", &[1; 32]));
        assert_ne!(seed, assignment_seed("demo2", &[1; 32]));
        assert_ne!(seed, assignment_seed("demo", &[2; 32]));
        let n = task.metadata().num_prompts.unwrap();
        let stream = |seed: &[u8; 32], w: &str| -> Vec<u64> {
            (0..64)
                .map(|s| assigned_index(task.as_ref(), seed, w, s))
                .collect()
        };
        let a = stream(&seed, "12D3KooWa");
        assert_eq!(a, stream(&seed, "12D3KooWa"), "same inputs, same prompts");
        assert!(a.iter().all(|&i| i < n), "indices within the task");
        assert_ne!(
            a,
            stream(&seed, "12D3KooWb"),
            "another worker, other prompts"
        );
        assert_ne!(a, stream(&assignment_seed("x", &[1; 32]), "12D3KooWa"));
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() > 32, "spread over the task: {distinct:?}");
        // Every index is a prompt the task has.
        for &i in &a {
            assert!(task.prompt(i).is_ok());
        }
    }

    #[test]
    fn reduction_is_uniform_enough_and_bounded() {
        let seed = [9; 32];
        assert_eq!(index_for(Some(0), &seed, "w", 3), 0);
        assert_eq!(index_for(Some(1), &seed, "w", 3), 0);
        let mut counts = [0u32; 10];
        for s in 0..10_000 {
            counts[index_for(Some(10), &seed, "w", s) as usize] += 1;
        }
        // 1000 expected per bucket; 6 σ ≈ 180.
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
        // Generators get the full 64-bit value.
        assert!((0..100).any(|s| index_for(None, &seed, "w", s) > u64::from(u32::MAX)));
    }
}
