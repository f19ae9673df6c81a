//! `[admission]`: which workers a learner pulls from, and how much of a batch the new ones may
//! fill (`docs/security.md`, "Probation and admission"); on a worker, the credential it
//! presents (`docs/protocol.md`, "Admission").

use serde::{Deserialize, Serialize};

/// Who may contribute groups.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// Any worker (with a proof of work on its peer id when `pow_bits > 0`).
    #[default]
    Open,
    /// Only the peers of `network.allow_list` (refused at the connection already).
    AllowList,
    /// Only workers presenting an unexpired ticket for their peer id signed by the learner
    /// (`echo-node admit PEER_ID --hours H`).
    Ticket,
}

impl AdmissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::Open => "open",
            AdmissionMode::AllowList => "allow_list",
            AdmissionMode::Ticket => "ticket",
        }
    }
}

/// `[admission]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Learner: `open`, `allow_list` or `ticket`.
    pub mode: AdmissionMode,
    /// Learner: proof of work asked of every worker's peer id, in leading zero bits of
    /// `BLAKE3(context ‖ swarm id ‖ peer id ‖ nonce)` (0 = none; about 2^bits hashes per
    /// identity). Worker: the work it does at start (must be at least the learner's).
    pub pow_bits: u32,
    /// Learner: most of a batch one worker may fill, in (0, 1].
    pub max_peer_share: f64,
    /// Learner: most of a batch the workers on probation may fill together, in [0, 1].
    pub probation_share: f64,
    /// Worker: its ticket (hex, as `echo-node admit` prints it), presented in heartbeats.
    pub ticket: Option<String>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            mode: AdmissionMode::Open,
            pow_bits: 0,
            max_peer_share: 0.5,
            probation_share: 0.25,
            ticket: None,
        }
    }
}

/// Most proof-of-work bits a config may ask (2^40 hashes is days of one core).
pub const MAX_POW_BITS: u32 = 40;

impl AdmissionConfig {
    /// The share limits of a batch.
    pub fn caps(&self) -> control::admission::ShareCaps {
        control::admission::ShareCaps {
            max_peer_share: self.max_peer_share,
            probation_share: self.probation_share,
        }
    }

    /// Problems as (key, what is wrong), keys relative to the section.
    pub fn validate(&self, allow_list: &[String]) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if self.pow_bits > MAX_POW_BITS {
            p.push((
                "pow_bits".into(),
                format!("{} is above {MAX_POW_BITS}", self.pow_bits),
            ));
        }
        if !(self.max_peer_share.is_finite()
            && self.max_peer_share > 0.0
            && self.max_peer_share <= 1.0)
        {
            p.push((
                "max_peer_share".into(),
                format!("{} is outside (0, 1]", self.max_peer_share),
            ));
        }
        if !(self.probation_share.is_finite() && (0.0..=1.0).contains(&self.probation_share)) {
            p.push((
                "probation_share".into(),
                format!("{} is outside [0, 1]", self.probation_share),
            ));
        }
        if self.mode == AdmissionMode::AllowList && allow_list.is_empty() {
            p.push((
                "mode".into(),
                "`allow_list` needs network.allow_list to name the admitted peers".into(),
            ));
        }
        if let Some(t) = &self.ticket {
            if let Err(e) = storage::admission::Ticket::from_hex(t) {
                p.push(("ticket".into(), format!("not a ticket: {e}")));
            }
        }
        p
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
    fn admission_defaults_parse_and_bad_values_are_named() {
        let c = NodeConfig::parse(HEAD).unwrap();
        assert_eq!(c.admission, AdmissionConfig::default());
        assert_eq!(c.admission.mode, AdmissionMode::Open);
        let c = NodeConfig::parse(&format!(
            "{HEAD}[admission]\nmode = \"ticket\"\npow_bits = 12\nprobation_share = 0\n"
        ))
        .unwrap();
        assert_eq!(
            (c.admission.mode, c.admission.pow_bits),
            (AdmissionMode::Ticket, 12)
        );
        assert!(problems(&format!("{HEAD}[admission]\nmode = \"ticket\"\n")).is_empty());
        for (extra, key) in [
            ("pow_bits = 41", "admission.pow_bits"),
            ("max_peer_share = 0", "admission.max_peer_share"),
            ("probation_share = 1.5", "admission.probation_share"),
            ("mode = \"allow_list\"", "admission.mode"),
            ("ticket = \"abc\"", "admission.ticket"),
            ("mode = \"closed\"", "admission.mode"),
        ] {
            let p = problems(&format!("{HEAD}[admission]\n{extra}\n"));
            assert_eq!(p[0].0, key, "{extra}: {p:?}");
        }
    }
}
