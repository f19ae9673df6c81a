//! Whether a worker samples by the rule this learner checks (`docs/security.md`, "Where a
//! response ends"): its heartbeats report the rule it samples with (`p2p::SamplingReport`),
//! and [`SamplingCheck`] compares what of it the learner's checks depend on. A pure rule; the
//! puller uses it to leave a mis-configured worker out of pulls (and so out of strikes).
//!
//! Owns: the comparison and its message. Must not touch: the pulls or the penalty table.

use crate::config::NodeConfig;

/// What of a worker's sampling rule a learner's checks depend on, so that a worker reporting
/// another one is not pulled from (`super::puller`): the log-prob temperature
/// always (the spot check recomputes log-probs at `learner.temperature`; a greedy worker's
/// are at 1), the temperature and nucleus exactly when the learner checks the draws
/// (`verification.check_sampling`), and `rollout.max_new_tokens` for a single-turn task
/// (where a response without a stop token must end: `response_end`). The rest of a report is
/// not compared: it changes nothing the learner checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingCheck {
    /// The learner's rule.
    pub learner: p2p::SamplingReport,
    /// Draws are checked: temperature and top-p must be the learner's exactly.
    pub draws: bool,
    /// Single-turn task: `max_new_tokens` must be the learner's.
    pub length: bool,
}

impl SamplingCheck {
    /// The learner's check, for a task that is single-turn or not.
    pub fn of(config: &NodeConfig, single_turn: bool) -> Self {
        SamplingCheck {
            learner: p2p::SamplingReport {
                temperature: config.learner.temperature,
                top_p: config.learner.top_p,
                max_new_tokens: config.rollout.max_new_tokens as u32,
                env_pin: config.task.env_pin().map(p2p::EnvPin),
            },
            draws: config.verification.check_sampling,
            length: single_turn,
        }
    }

    /// Why groups of a worker reporting `reported` cannot pass this learner's checks (`None`:
    /// they can).
    pub fn mismatch(&self, reported: p2p::SamplingReport) -> Option<String> {
        let l = self.learner;
        let seen = p2p::SamplingReport {
            temperature: if self.draws {
                reported.temperature
            } else {
                // The temperature its log-probs are at (1 for a greedy worker).
                policy::SamplingParams {
                    temperature: reported.temperature,
                    ..policy::SamplingParams::new(0, Vec::new())
                }
                .logprob_temperature()
            },
            top_p: if self.draws { reported.top_p } else { l.top_p },
            max_new_tokens: if self.length {
                reported.max_new_tokens
            } else {
                l.max_new_tokens
            },
            // An older worker reports no pin: its groups are judged by replay as before.
            env_pin: reported.env_pin.or(l.env_pin),
        };
        if seen.env_pin != l.env_pin {
            return Some(format!(
                "it plays another external environment (pin {}; this learner's is {}): the \
                 program's files, [task] name, params and [task.external] version must be the \
                 learner's",
                seen.env_pin.map_or("none".into(), |p| hex::encode(p.0)),
                l.env_pin.map_or("none".into(), |p| hex::encode(p.0)),
            ));
        }
        (seen != l).then(|| {
            format!(
                "it samples at temperature {}, top-p {}, at most {} new tokens; this \
                 learner checks temperature {}, top-p {}, at most {} new tokens \
                 (rollout.temperature, rollout.top_p and rollout.max_new_tokens must be the \
                 learner's learner.temperature, learner.top_p and rollout.max_new_tokens)",
                seen.temperature,
                seen.top_p,
                seen.max_new_tokens,
                l.temperature,
                l.top_p,
                l.max_new_tokens
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Role, RolloutConfig};

    #[test]
    fn a_workers_rule_is_compared_where_the_learners_checks_depend_on_it() {
        let learner = NodeConfig::new(Role::Learner, "demo", "d".into());
        let same = RolloutConfig::default().sampling_report();
        let check = SamplingCheck::of(&learner, true);
        assert_eq!(check.mismatch(same), None, "the defaults agree");
        let with = |f: fn(&mut p2p::SamplingReport)| {
            let mut r = same;
            f(&mut r);
            r
        };
        let cooler = with(|r| r.temperature = 1.0);
        let nucleus = with(|r| r.top_p = 0.9);
        let longer = with(|r| r.max_new_tokens += 1);
        let greedy = with(|r| r.temperature = 0.0);
        for r in [cooler, nucleus, longer, greedy] {
            assert!(check.mismatch(r).is_some(), "{r:?}");
        }
        // The message names both rules.
        let why = check.mismatch(cooler).unwrap();
        assert!(
            why.contains("temperature 1,") && why.contains("temperature 1.2,"),
            "{why}"
        );
        let why = check.mismatch(with(|r| r.max_new_tokens = 7)).unwrap();
        assert!(why.contains("at most 7 new tokens"), "{why}");
        // A multi-turn environment: a response's length is the environment's budget, not
        // max_new_tokens.
        assert_eq!(SamplingCheck::of(&learner, false).mismatch(longer), None);
        // Draws not checked: the nucleus changes nothing checked, and a greedy worker's
        // log-probs are at temperature 1 — which a learner at 1 expects.
        let mut lax = learner.clone();
        lax.verification.check_sampling = false;
        let check = SamplingCheck::of(&lax, true);
        assert_eq!(check.mismatch(nucleus), None);
        assert!(
            check.mismatch(greedy).is_some(),
            "log-probs at 1 against 1.2"
        );
        assert!(check.mismatch(cooler).is_some());
        lax.learner.temperature = 1.0;
        assert_eq!(SamplingCheck::of(&lax, true).mismatch(greedy), None);
    }

    #[test]
    fn a_worker_playing_another_external_program_is_named() {
        let learner = NodeConfig::new(Role::Learner, "demo", "d".into());
        let mut check = SamplingCheck::of(&learner, false);
        let pinned = |b| p2p::SamplingReport {
            env_pin: Some(p2p::EnvPin([b; 32])),
            ..RolloutConfig::default().sampling_report()
        };
        // A built-in task: a worker reporting any pin plays something else.
        assert!(check.mismatch(pinned(1)).is_some());
        check.learner.env_pin = Some(p2p::EnvPin([1; 32]));
        assert_eq!(check.mismatch(pinned(1)), None);
        // An older worker reports none: judged by replay as before.
        assert_eq!(
            check.mismatch(RolloutConfig::default().sampling_report()),
            None
        );
        let why = check.mismatch(pinned(2)).unwrap();
        assert!(
            why.contains("another external environment") && why.contains(&"02".repeat(32)),
            "{why}"
        );
    }
}
