//! The roles a node of a swarm can play, as far as the network layer knows them.
//!
//! Owns: the [`Role`] type — its wire spelling (lowercase in heartbeats, in the status JSON
//! and in config files), `Display` and `FromStr` (derived: serde and strum spell it alike). p2p only *gossips* a node's role in its
//! heartbeats and shows peers' roles in the status view; it never runs a role. Must not
//! touch: what a role does (the `node` crate), command-line parsing (no `clap` here: callers
//! wrap [`Role`] in their own CLI types if they need to).

use serde::{Deserialize, Serialize};

use crate::error::RoleError;

/// What a node does in the swarm (the `role` of its heartbeats). The serde spelling is the
/// lowercase name, so a heartbeat reads `"role":"rollout"`; an unknown name fails to
/// deserialize, which is how a heartbeat naming an unknown role is rejected at decode.
/// `FromStr` is an exact, case-sensitive match on the same spelling (as serde does), so that a
/// role that parses also decodes in a heartbeat and vice versa.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_ty = RoleError,
    parse_err_fn = RoleError::unknown
)]
pub enum Role {
    /// Trains the policy, publishes snapshots and score tables (one per swarm).
    Learner,
    /// Generates rollouts with the latest installed snapshot and forwards snapshots.
    Rollout,
    /// Only relays traffic (circuit relay, gossip); neither trains nor samples.
    Relay,
}

impl Role {
    /// Every role, in declaration order (for messages and tests).
    pub const ALL: &[Role] = <Role as strum::VariantArray>::VARIANTS;

    /// The wire spelling (`learner`, `rollout`, `relay`); the same as the serde name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_from_str_and_serde_agree() {
        for &r in Role::ALL {
            assert_eq!(r.to_string().parse::<Role>().unwrap(), r);
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
            assert_eq!(
                serde_json::from_str::<Role>(&format!("\"{r}\"")).unwrap(),
                r
            );
        }
        assert_eq!(Role::Rollout.to_string(), "rollout");
    }

    #[test]
    fn unknown_roles_are_errors() {
        for bad in ["king", "", "Rollout", " rollout", "rollouts"] {
            let err = bad.parse::<Role>().unwrap_err();
            assert_eq!(err, RoleError::Unknown(bad.to_string()));
            assert!(
                err.to_string().contains("learner, rollout or relay"),
                "{err}"
            );
            assert!(serde_json::from_str::<Role>(&format!("\"{bad}\"")).is_err());
        }
    }
}
