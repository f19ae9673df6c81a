//! How many bytes a pull may bring in: the per-pull memory bound, derived from the request
//! alone (never from what the worker announces).
//!
//! Owns: [`max_group_bytes`] and [`byte_budget`]. Must not touch: the wire, the store.
//!
//! A group the learner would accept under its [`GroupLimits`] has at most `group_size` samples
//! (any number up to the decoder's limit when the limits leave it open), and prompt plus
//! response of at most `max_context` tokens. Its encoding (`TrajectoryGroup::encode`) is then
//! bounded by: a fixed header (magic, ids, version, counts), the prompt tokens (a varint each,
//! ≤ 5 bytes) and text, and per sample its id, tokens (≤ 5 B), log-probs (4 B), loss mask
//! (1 B), reward, times and text. Text is bounded by the decoder's limit and by
//! [`TEXT_BYTES_PER_TOKEN`] per token: honest text is a few bytes per token (the longest
//! tokens of common BPE vocabularies are a few dozen bytes, and a whole response of them is
//! not a real output). Everything saturates, and the result never exceeds the frame maximum.

use storage::record::{limits, GroupLimits};

use crate::wire::{MAX_FRAME, MAX_GROUPS_PER_LEASE};
use crate::PullRequest;

/// Text bytes allowed per token of a prompt or response.
pub const TEXT_BYTES_PER_TOKEN: usize = 64;
/// Header of an encoded group: magic, format, group id, three id strings with their lengths,
/// version, creation time, counts.
const GROUP_HEADER_BYTES: usize = 4 + 16 + 3 * (10 + limits::MAX_ID) + 4 * 10;
/// Per sample beyond its tokens and text: trajectory id, reward, finish time, five lengths.
const SAMPLE_FIXED_BYTES: usize = 16 + 4 + 10 + 5 * 10;

/// Largest encoding of one group that `limits` could accept (≤ the frame maximum).
pub fn max_group_bytes(limits: &GroupLimits) -> usize {
    let context = limits.max_context.min(limits::MAX_TOKENS * 2);
    let tokens = context.min(limits::MAX_TOKENS);
    let text = tokens
        .saturating_mul(TEXT_BYTES_PER_TOKEN)
        .min(limits::MAX_TEXT);
    let samples = if limits.group_size == 0 {
        limits::MAX_SAMPLES
    } else {
        limits.group_size.min(limits::MAX_SAMPLES)
    };
    // Prompt: tokens (varints) and text; each sample: tokens, log-probs, mask, text.
    let prompt = tokens.saturating_mul(5).saturating_add(text);
    let sample = tokens
        .saturating_mul(5 + 4 + 1)
        .saturating_add(text)
        .saturating_add(SAMPLE_FIXED_BYTES);
    GROUP_HEADER_BYTES
        .saturating_add(prompt)
        .saturating_add(samples.saturating_mul(sample))
        .min(limits::MAX_GROUP_BYTES)
        .min(MAX_FRAME)
}

/// Bytes of group payload one pull may bring in: the groups asked (within the lease maximum)
/// × [`max_group_bytes`] of the request's limits.
pub fn byte_budget(req: &PullRequest) -> u64 {
    let asked = req.max_groups.clamp(1, MAX_GROUPS_PER_LEASE);
    asked.saturating_mul(max_group_bytes(&req.limits) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use storage::record::testing;

    const LIMITS: GroupLimits = GroupLimits {
        vocab_size: 300,
        max_context: 64,
        logprob_floor: -50.0,
        group_size: 4,
    };

    #[test]
    fn the_bound_holds_every_acceptable_group_and_is_far_below_the_frame_maximum() {
        let bound = max_group_bytes(&LIMITS);
        assert!(bound < 64 * 1024, "{bound}");
        // Groups at the limits (4 samples, 64 tokens in all) fit, however long their text.
        let mut g = testing::group(1, 1, 4, 32);
        g.prompt_tokens = vec![299; 32];
        g.prompt_text = "x".repeat(32 * TEXT_BYTES_PER_TOKEN);
        for s in &mut g.samples {
            s.response_text = "y".repeat(32 * TEXT_BYTES_PER_TOKEN);
            s.response_tokens = vec![u32::from(u16::MAX); 32];
        }
        assert!(g.encode().len() <= bound, "{} > {bound}", g.encode().len());
        // Open limits fall back to the frame maximum.
        assert_eq!(
            max_group_bytes(&GroupLimits::PERMISSIVE),
            MAX_FRAME.min(limits::MAX_GROUP_BYTES)
        );
    }

    #[test]
    fn the_budget_follows_the_request() {
        let req = |max_groups| PullRequest {
            v_min: 0,
            max_groups,
            ttl: Duration::from_secs(1),
            limits: LIMITS,
            commits_from: None,
        };
        let one = max_group_bytes(&LIMITS) as u64;
        assert_eq!(byte_budget(&req(0)), one, "a pull asks at least one group");
        assert_eq!(byte_budget(&req(8)), 8 * one);
        assert_eq!(byte_budget(&req(u64::MAX)), MAX_GROUPS_PER_LEASE * one);
        let open = PullRequest {
            limits: GroupLimits::PERMISSIVE,
            ..req(u64::MAX)
        };
        assert!(byte_budget(&open) > 0);
    }
}
