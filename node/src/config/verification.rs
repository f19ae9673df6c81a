//! `[verification]`: what the learner checks of every pulled group beyond its schema and limits
//! (`docs/security.md`, "Verified rollouts"). Every layer is on by default; an operator of a
//! closed swarm of trusted machines may switch the costlier ones off.

use serde::{Deserialize, Serialize};

/// `[verification]` (read by the learner).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VerificationConfig {
    /// Refuse a group whose producer signature does not verify under the key of the peer it
    /// was pulled from.
    pub signatures: bool,
    /// Refuse a group whose prompt is not the one assigned to its (worker, sequence number),
    /// or whose sequence number the worker used before.
    pub assigned_prompts: bool,
    /// Recompute every sample's reward from the prompt and the decoded response; refuse the
    /// group when one differs by more than 1e-6.
    pub recompute_rewards: bool,
    /// The lowest fraction of a worker's groups whose sampled tokens and log-probs are
    /// recomputed under the claimed version, reached after a long verified history (0 = none
    /// past probation, 1 = every group).
    pub spot_check_fraction: f64,
    /// Probation: a newly seen worker's first groups are all spot-checked (and held until
    /// checked), and the probation share of a batch applies to it until it has this many
    /// accepted groups.
    pub spot_check_first_groups: u64,
    /// Probation also lasts until the worker's accepted groups span this many distinct
    /// versions.
    pub probation_versions: u64,
    /// … and this many seconds from its first accepted group.
    pub probation_secs: u64,
    /// After probation the check rate is `max(spot_check_fraction, c / (c + h))` with `h`
    /// the worker's accepted groups past probation and `c` this value (the rate halves
    /// after `c` groups).
    pub spot_check_decay_groups: f64,
    /// Check in every spot check that each sampled token is the one the canonical sampling
    /// rule draws for the uniform the learner prescribes (`docs/security.md`, "Checkable
    /// sampling"). Off only for workers whose samplers do not follow the rule.
    pub check_sampling: bool,
    /// Bound on `|reported − recomputed|` sampled-token log-prob, per worker sampling dtype
    /// (its heartbeat says which): an honest worker's numeric spread stays below it.
    pub logprob_tolerance: PerDtype,
    /// Margin δ on the cumulative probabilities of the sampling check, per worker dtype.
    pub sampling_margin: PerDtype,
}

/// One value per worker sampling dtype (`f32`, `f16`, `bf16`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PerDtype {
    pub f32: f64,
    pub f16: f64,
    pub bf16: f64,
}

impl PerDtype {
    fn check(&self, key: &str, max: f64, problems: &mut Vec<(String, String)>) {
        for (d, v) in [("f32", self.f32), ("f16", self.f16), ("bf16", self.bf16)] {
            if !(v.is_finite() && v > 0.0 && v <= max) {
                problems.push((format!("{key}.{d}"), format!("{v} is outside (0, {max}]")));
            }
        }
    }
}

impl Default for VerificationConfig {
    fn default() -> Self {
        VerificationConfig {
            signatures: true,
            assigned_prompts: true,
            recompute_rewards: true,
            spot_check_fraction: control::admission::DEFAULT_FLOOR_RATE,
            spot_check_first_groups: control::admission::DEFAULT_PROBATION_GROUPS,
            probation_versions: control::admission::DEFAULT_PROBATION_VERSIONS,
            probation_secs: control::admission::DEFAULT_PROBATION_SECS,
            spot_check_decay_groups: control::admission::DEFAULT_DECAY_GROUPS,
            check_sampling: true,
            logprob_tolerance: PerDtype {
                f32: f64::from(learner::verdict::DEFAULT_TOLERANCE.f32),
                f16: f64::from(learner::verdict::DEFAULT_TOLERANCE.f16),
                bf16: f64::from(learner::verdict::DEFAULT_TOLERANCE.bf16),
            },
            sampling_margin: PerDtype {
                f32: learner::verdict::DEFAULT_MARGIN.f32,
                f16: learner::verdict::DEFAULT_MARGIN.f16,
                bf16: learner::verdict::DEFAULT_MARGIN.bf16,
            },
        }
    }
}

impl VerificationConfig {
    /// Problems as (key, what is wrong), keys relative to the section.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if !(self.spot_check_fraction.is_finite()
            && (0.0..=1.0).contains(&self.spot_check_fraction))
        {
            problems.push((
                "spot_check_fraction".into(),
                format!(
                    "{} is outside [0, 1] (the fraction of groups whose log-probs are recomputed)",
                    self.spot_check_fraction
                ),
            ));
        }
        if self.spot_check_first_groups > 1_000_000 {
            problems.push((
                "spot_check_first_groups".into(),
                format!("{} is above 1000000", self.spot_check_first_groups),
            ));
        }
        if self.probation_secs > 86_400 {
            problems.push((
                "probation_secs".into(),
                format!("{} is above 86400 (a day)", self.probation_secs),
            ));
        }
        // Wider than these, the checks prove nothing: a log-prob off by 1 is a factor e, and a
        // margin of 0.5 admits almost any token.
        self.logprob_tolerance
            .check("logprob_tolerance", 1.0, &mut problems);
        self.sampling_margin
            .check("sampling_margin", 0.5, &mut problems);
        if !(self.spot_check_decay_groups.is_finite() && self.spot_check_decay_groups >= 0.0) {
            problems.push((
                "spot_check_decay_groups".into(),
                format!("{} must be a number >= 0", self.spot_check_decay_groups),
            ));
        }
        problems
    }

    /// The probation and check-rate rule these keys describe.
    pub fn probation(&self) -> control::admission::ProbationParams {
        control::admission::ProbationParams {
            probation_groups: self.spot_check_first_groups,
            floor_rate: self.spot_check_fraction,
            decay_groups: self.spot_check_decay_groups,
            probation_versions: self.probation_versions,
            probation_secs: self.probation_secs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::NodeConfig;
    use super::*;
    use std::path::Path;

    const HEAD: &str = "role = \"learner\"\nswarm_id = \"x\"\ndata_dir = \"d\"\n";

    fn problems(text: &str) -> Vec<(String, String)> {
        match NodeConfig::parse(text) {
            Err(p) => p,
            Ok(c) => c
                .validate(Path::new("t.toml"))
                .err()
                .map(|e| e.problems)
                .unwrap_or_default(),
        }
        .into_iter()
        .map(|p| (p.key, p.message))
        .collect()
    }

    #[test]
    fn verification_is_on_by_default_and_parses() {
        let c = NodeConfig::parse(HEAD).unwrap();
        assert_eq!(c.verification, VerificationConfig::default());
        assert!(c.verification.signatures && c.verification.assigned_prompts);
        assert!(c.verification.recompute_rewards);
        assert_eq!(c.verification.spot_check_fraction, 0.05);
        assert_eq!(c.verification.spot_check_first_groups, 16);
        let c = NodeConfig::parse(&format!(
            "{HEAD}[verification]\nsignatures = false\nspot_check_fraction = 1.0\n"
        ))
        .unwrap();
        assert!(!c.verification.signatures && c.verification.recompute_rewards);
        assert!(problems(&format!("{HEAD}[verification]\nspot_check_fraction = 0\n")).is_empty());
    }

    #[test]
    fn bad_verification_values_are_named() {
        let p = problems(&format!("{HEAD}[verification]\nsignature = true\n"));
        assert_eq!(p[0].0, "verification.signature");
        assert!(p[0].1.contains("unknown field `signature`"), "{p:?}");
        let p = problems(&format!(
            "{HEAD}[verification]\nspot_check_fraction = 1.5\n"
        ));
        assert_eq!(p[0].0, "verification.spot_check_fraction");
        assert!(p[0].1.contains("[0, 1]"), "{p:?}");
        let p = problems(&format!(
            "{HEAD}[verification]\nspot_check_fraction = nan\n"
        ));
        assert_eq!(p[0].0, "verification.spot_check_fraction");
        let p = problems(&format!(
            "{HEAD}[verification]\nspot_check_first_groups = -1\n"
        ));
        assert_eq!(p[0].0, "verification.spot_check_first_groups");
        let p = problems(&format!(
            "{HEAD}[verification]\nrecompute_rewards = \"yes\"\n"
        ));
        assert_eq!(p[0].0, "verification.recompute_rewards");
    }

    #[test]
    fn per_dtype_margins_and_the_sampling_rule_parse_and_are_checked() {
        let c = NodeConfig::parse(&format!(
            "{HEAD}[learner]\ntop_p = 0.9\n[verification]\ncheck_sampling = false\n\
             logprob_tolerance = {{ f32 = 1e-4, f16 = 0.02, bf16 = 0.3 }}\n"
        ))
        .unwrap();
        assert!(!c.verification.check_sampling);
        assert_eq!(c.verification.logprob_tolerance.bf16, 0.3);
        assert_eq!(
            c.verification.sampling_margin,
            VerificationConfig::default().sampling_margin
        );
        assert_eq!(c.learner.top_p, 0.9);
        let p = problems(&format!(
            "{HEAD}[verification]\nsampling_margin = {{ f32 = 1e-3, f16 = 0.0, bf16 = 0.9 }}\n"
        ));
        let keys: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "verification.sampling_margin.f16",
                "verification.sampling_margin.bf16"
            ]
        );
        let p = problems(&format!(
            "{HEAD}[verification]\nlogprob_tolerance = {{ f32 = 1e-3 }}\n"
        ));
        assert!(p[0].1.contains("missing field"), "{p:?}");
        let p = problems(&format!("{HEAD}[learner]\ntop_p = 0\n"));
        assert_eq!(p[0].0, "learner.top_p");
        let p = problems(&format!(
            "{HEAD}[model]\ndevice = \"cpu\"\n[rollout]\ndtype = \"bf16\"\n"
        ));
        assert_eq!(p[0].0, "rollout.dtype", "{p:?}");
        assert!(problems(&format!("{HEAD}[rollout]\ndtype = \"f16\"\n")).is_empty());
    }

    #[test]
    fn the_spot_check_needs_every_admissible_version_kept() {
        // S = 6, κ = 2: versions v−6..v are admissible, ⌊6/2⌋ + 1 = 4 snapshots.
        let learner = |keep: usize, extra: &str| {
            problems(&format!(
                "{HEAD}[learner]\nstaleness = 6\nkappa = 2\n[storage]\nkeep_snapshots = {keep}\n{extra}"
            ))
        };
        let p = learner(3, "");
        assert_eq!(p[0].0, "storage.keep_snapshots", "{p:?}");
        assert!(p[0].1.contains("= 4"), "{p:?}");
        assert!(learner(4, "").is_empty());
        let off = "[verification]\nspot_check_fraction = 0.0\nspot_check_first_groups = 0\n";
        assert!(learner(1, off).is_empty());
    }
}
