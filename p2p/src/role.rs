//! The roles a node of a swarm can play, as far as the network layer knows them.
//!
//! Owns: the [`Role`] type — its wire spelling (lowercase in heartbeats, in the status JSON
//! and in config files), `Display` and `FromStr`. p2p only *gossips* a node's role in its
//! heartbeats and shows peers' roles in the status view; it never runs a role. Must not
//! touch: what a role does (the `node` crate), command-line parsing (no `clap` here: callers
//! wrap [`Role`] in their own CLI types if they need to).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::RoleError;

/// What a node does in the swarm (the `role` of its heartbeats). The serde spelling is the
/// lowercase name, so a heartbeat reads `"role":"rollout"`; an unknown name fails to
/// deserialize, which is how a heartbeat naming an unknown role is rejected at decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Trains the policy, publishes snapshots and score tables (one per swarm).
    Learner,
    /// Generates rollouts with the latest installed snapshot and forwards snapshots.
    Rollout,
    /// Only relays traffic (circuit relay, gossip); neither trains nor samples.
    Relay,
}

impl Role {
    /// Every role, in a fixed order (for messages and tests).
    pub const ALL: [Role; 3] = [Role::Learner, Role::Rollout, Role::Relay];

    /// The wire spelling (`learner`, `rollout`, `relay`); the same as the serde name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Learner => "learner",
            Role::Rollout => "rollout",
            Role::Relay => "relay",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = RoleError;

    /// Exact, case-sensitive match on the wire spelling (as serde does), so that a role that
    /// parses here also decodes in a heartbeat and vice versa.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| RoleError::Unknown(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_from_str_and_serde_agree() {
        for r in Role::ALL {
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
