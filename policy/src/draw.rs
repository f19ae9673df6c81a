//! Prescribed sampling randomness: the uniform that decides each sampled token.
//!
//! A worker does not choose its randomness. Token `position` of sample `sample` of group
//! `group` produced by `producer` is decided by the uniform
//! [`token_uniform`]`(seed, producer, group, sample, position)`, where `seed` is the run's
//! assignment seed (derived from the swarm id and the learner's public key, the seed that
//! assigns prompts). The learner recomputes the same uniform and checks, in the forward pass of
//! its spot check, that the token is the one the canonical rule ([`crate::rule`]) picks for it
//! (`docs/security.md`, "Checkable sampling").
//!
//! **Position** is the index of the token among the *sampled* tokens of the trajectory: the
//! response tokens of a single-turn task; for a multi-turn episode, the assistant tokens of
//! all turns counted in order, so a turn continues the counter where the previous one ended
//! (tokens the environment inserts are not sampled and take no position). [`Draws`] carries a
//! start position per sample for that.
//!
//! The derivation is specified byte for byte (BLAKE3, no RNG crate whose stream could change
//! between releases), so a worker and a learner built from different releases agree:
//! - stream key = BLAKE3 `derive_key`([`STREAM_CONTEXT`], seed ‖ len(producer) as u64 LE ‖
//!   producer ‖ group u64 LE ‖ sample u64 LE);
//! - uniform = the first 8 bytes (LE) of BLAKE3-keyed(stream key, position u64 LE), shifted
//!   right by 11 and multiplied by 2⁻⁵³: a multiple of 2⁻⁵³ in [0, 1).
//!
//! The uniforms are public (anyone knowing the seed computes them); what matters is that the
//! worker cannot choose them. One keyed hash per token (~0.1 µs), negligible next to a forward.

use rand::Rng;

/// The `derive_key` context of a sample's uniform stream.
pub const STREAM_CONTEXT: &str = "echo-swarm 2026-11 sampling uniforms v1";

/// The key of one sample's stream of uniforms (one per token position).
#[derive(Clone, PartialEq, Eq)]
pub struct SampleStream([u8; 32]);

impl std::fmt::Debug for SampleStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SampleStream({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

impl SampleStream {
    /// The stream of sample `sample` of group number `group` of `producer` (its peer id, as
    /// the group records it) under the run's assignment `seed`.
    pub fn prescribed(seed: &[u8; 32], producer: &str, group: u64, sample: u64) -> Self {
        let mut h = blake3::Hasher::new_derive_key(STREAM_CONTEXT);
        h.update(seed);
        h.update(&(producer.len() as u64).to_le_bytes());
        h.update(producer.as_bytes());
        h.update(&group.to_le_bytes());
        h.update(&sample.to_le_bytes());
        SampleStream(*h.finalize().as_bytes())
    }

    /// A stream from a raw 32-byte key (local generation without an assignment, tests).
    pub fn from_key(key: [u8; 32]) -> Self {
        SampleStream(key)
    }

    /// The uniform of token `position` (see the module doc).
    pub fn uniform(&self, position: u64) -> f64 {
        let h = blake3::keyed_hash(&self.0, &position.to_le_bytes());
        let mut x = [0u8; 8];
        x.copy_from_slice(&h.as_bytes()[..8]);
        (u64::from_le_bytes(x) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The uniform of sampled token `position` of sample `sample` of group `group` of `producer`
/// under the assignment `seed` (see the module doc). Callers drawing many tokens of one sample
/// should build its [`SampleStream`] once.
pub fn token_uniform(
    seed: &[u8; 32],
    producer: &str,
    group: u64,
    sample: u64,
    position: u64,
) -> f64 {
    SampleStream::prescribed(seed, producer, group, sample).uniform(position)
}

/// The uniforms of the rows of one generation call: row `r` (sample `r` of the group) draws
/// its `k`-th token of this call with the uniform at position `start[r] + k` of its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draws {
    rows: Vec<(SampleStream, u64)>,
    /// Test-only (`false_dtype` attack): positions below `.0` read their uniform moved by
    /// `f64::from_bits(.1)` ([`Draws::nudged`]).
    nudge: Option<(u64, u64)>,
}

impl Draws {
    /// The prescribed draws of the `n` samples of group `group` of `producer` (see
    /// [`SampleStream::prescribed`]), every sample starting at position 0.
    pub fn prescribed(seed: &[u8; 32], producer: &str, group: u64, n: usize) -> Self {
        Draws {
            rows: (0..n as u64)
                .map(|s| (SampleStream::prescribed(seed, producer, group, s), 0))
                .collect(),
            nudge: None,
        }
    }

    /// `n` rows with stream keys drawn from `rng` (generation nobody checks: local use, tests,
    /// benchmarks). The same rng state gives the same draws on every generation path.
    pub fn from_rng(rng: &mut impl Rng, n: usize) -> Self {
        Draws {
            rows: (0..n).map(|_| (SampleStream(rng.gen()), 0)).collect(),
            nudge: None,
        }
    }

    /// Rows from explicit streams and start positions (a multi-turn episode continues each
    /// sample's counter: the start is the number of tokens it sampled in earlier turns).
    pub fn from_streams(rows: Vec<(SampleStream, u64)>) -> Self {
        Draws { rows, nudge: None }
    }

    /// These draws with the uniform of every position below `positions` moved by `by`
    /// (down instead when that would leave [0, 1)). Not what any honest sampler does: the
    /// adversarial tests' worker that chooses tokens inside a sampling margin.
    #[doc(hidden)]
    pub fn nudged(mut self, positions: u64, by: f64) -> Self {
        self.nudge = Some((positions, by.to_bits()));
        self
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True without rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Row `row` alone (a sample decoded on its own).
    pub fn row(&self, row: usize) -> Draws {
        Draws {
            rows: vec![self.rows[row].clone()],
            nudge: self.nudge,
        }
    }

    /// Row `row` alone, `offset` positions further along its stream (a later turn of a
    /// multi-turn episode: `offset` is the number of tokens the sample drew before).
    pub fn row_from(&self, row: usize, offset: u64) -> Draws {
        let (stream, start) = &self.rows[row];
        Draws {
            rows: vec![(stream.clone(), start + offset)],
            nudge: self.nudge,
        }
    }

    /// The uniform of row `row`'s `step`-th token of this call.
    pub fn uniform(&self, row: usize, step: usize) -> f64 {
        let (stream, start) = &self.rows[row];
        let at = start + step as u64;
        let u = stream.uniform(at);
        match self.nudge {
            Some((n, by)) if at < n => {
                let by = f64::from_bits(by);
                if u + by < 1.0 {
                    u + by
                } else {
                    (u - by).max(0.0)
                }
            }
            _ => u,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_deterministic_in_range_and_depend_on_every_input() {
        let seed = [3u8; 32];
        let u = token_uniform(&seed, "peer", 5, 2, 7);
        assert_eq!(u, token_uniform(&seed, "peer", 5, 2, 7));
        assert!((0.0..1.0).contains(&u));
        for other in [
            token_uniform(&[4u8; 32], "peer", 5, 2, 7),
            token_uniform(&seed, "peer2", 5, 2, 7),
            token_uniform(&seed, "peer", 6, 2, 7),
            token_uniform(&seed, "peer", 5, 3, 7),
            token_uniform(&seed, "peer", 5, 2, 8),
        ] {
            assert_ne!(u, other);
        }
        // Length-prefixed producer: ("ab", group) and ("a", …) cannot collide by concatenation.
        assert_ne!(
            SampleStream::prescribed(&seed, "ab", 0, 0),
            SampleStream::prescribed(&seed, "a", 0, 0)
        );
    }

    /// The byte-level specification, pinned: a change of the derivation is a protocol change.
    #[test]
    fn the_derivation_is_pinned() {
        let u = token_uniform(&[0u8; 32], "", 0, 0, 0);
        let mut h = blake3::Hasher::new_derive_key(STREAM_CONTEXT);
        h.update(&[0u8; 32]);
        h.update(&[0u8; 24]);
        let key = *h.finalize().as_bytes();
        let b = blake3::keyed_hash(&key, &0u64.to_le_bytes());
        let x = u64::from_le_bytes(b.as_bytes()[..8].try_into().unwrap());
        assert_eq!(u, (x >> 11) as f64 / 9_007_199_254_740_992.0);
    }

    #[test]
    fn draws_continue_a_counter_from_the_start_position() {
        let seed = [9u8; 32];
        let d = Draws::prescribed(&seed, "w", 4, 3);
        assert_eq!(d.len(), 3);
        assert_eq!(d.uniform(2, 5), token_uniform(&seed, "w", 4, 2, 5));
        let later = Draws::from_streams(vec![(SampleStream::prescribed(&seed, "w", 4, 2), 5)]);
        assert_eq!(later.uniform(0, 0), d.uniform(2, 5));
        // Uniform on [0, 1): the mean of many is near 1/2.
        let mean = (0..4000).map(|k| d.uniform(0, k)).sum::<f64>() / 4000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
