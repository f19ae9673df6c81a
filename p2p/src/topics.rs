//! The gossip topics of a swarm and their names (after Lighthouse's `types/topics.rs`).
//!
//! Owns: [`TopicKind`], the one place that spells a topic name
//! (`echo/<swarm_id>/<kind>/<version>`, see `docs/protocol.md`) and the one place that parses
//! it back ([`parse_topic`]). The version in a name is the version of the message format on
//! that topic ([`HEARTBEAT_VERSION`], [`SCORE_TABLE_VERSION`]; the snapshot and plan formats
//! are at 1), so nodes speaking different formats never share a mesh. Must not touch: gossipsub
//! itself (subscriptions and publishing are the service's) or message contents.

use serde::Serialize;

use crate::error::TopicError;
use crate::messages::{HEARTBEAT_VERSION, SCORE_TABLE_VERSION};

/// First segment of every topic name: tells this protocol's topics apart from others.
const PREFIX: &str = "echo";

/// The gossip topics of a swarm. Names: `echo/<swarm_id>/<kind>/<version>`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum TopicKind {
    /// Every node's [`crate::Heartbeat`], validated by the service.
    Heartbeat,
    /// The learner's [`crate::ScoreTable`], validated by the service (only the learner may
    /// publish).
    Scores,
    /// Signed snapshot announcements: delivered to the role as [`crate::Event::Gossip`].
    Snapshots,
    /// Signed chain plans / activation orders: delivered as [`crate::Event::Gossip`].
    Plans,
}

impl TopicKind {
    /// Every topic, in declaration order.
    pub const ALL: &[TopicKind] = <TopicKind as strum::VariantArray>::VARIANTS;

    /// The `<kind>` segment of the topic name (also the serde spelling).
    pub fn kind_name(self) -> &'static str {
        self.into()
    }

    /// The `<version>` segment: the version of the message format carried on the topic.
    pub const fn version(self) -> u32 {
        match self {
            TopicKind::Heartbeat => HEARTBEAT_VERSION,
            TopicKind::Scores => SCORE_TABLE_VERSION,
            TopicKind::Snapshots | TopicKind::Plans => 1,
        }
    }

    /// The gossipsub topic name within `swarm_id`.
    pub fn topic_name(self, swarm_id: &str) -> String {
        format!(
            "{PREFIX}/{swarm_id}/{}/{}",
            self.kind_name(),
            self.version()
        )
    }
}

/// Parses a topic name back into `(swarm_id, kind)`; the inverse of [`TopicKind::topic_name`].
///
/// The name is split from the right (`<version>`, then `<kind>`), so whatever lies between
/// `echo/` and the kind is the swarm id. A kind this node does not know, or a version other
/// than the one it speaks, is an error: such messages are not ours to interpret.
pub fn parse_topic(topic: &str) -> Result<(&str, TopicKind), TopicError> {
    let malformed = || TopicError::Malformed(topic.to_string());
    let mut parts = topic.rsplitn(3, '/');
    let (Some(version), Some(kind), Some(head)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(malformed());
    };
    let swarm_id = head
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|s| !s.is_empty())
        .ok_or_else(malformed)?;
    let kind: TopicKind = kind
        .parse()
        .map_err(|_| TopicError::UnknownKind(kind.to_string()))?;
    if version != kind.version().to_string() {
        return Err(TopicError::Version {
            kind: kind.kind_name().to_string(),
            got: version.to_string(),
            supported: kind.version(),
        });
    }
    Ok((swarm_id, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        for swarm in ["demo", "a-b_c.1", "x"] {
            for &k in TopicKind::ALL {
                let name = k.topic_name(swarm);
                assert_eq!(parse_topic(&name), Ok((swarm, k)), "{name}");
            }
        }
        assert_eq!(TopicKind::Heartbeat.topic_name("s"), "echo/s/heartbeat/1");
        assert_eq!(TopicKind::Scores.topic_name("s"), "echo/s/scores/1");
        assert_eq!(TopicKind::Snapshots.topic_name("s"), "echo/s/snapshots/1");
        assert_eq!(TopicKind::Plans.topic_name("s"), "echo/s/plans/1");
    }

    #[test]
    fn bad_names_are_rejected() {
        for bad in [
            "",
            "echo",
            "echo/heartbeat/1",
            "echo//heartbeat/1",
            "other/s/heartbeat/1",
            "echoes/s/heartbeat/1",
            "heartbeat/1",
        ] {
            assert!(
                matches!(parse_topic(bad), Err(TopicError::Malformed(_))),
                "{bad}: {:?}",
                parse_topic(bad)
            );
        }
        assert_eq!(
            parse_topic("echo/s/gossip/1"),
            Err(TopicError::UnknownKind("gossip".into()))
        );
        assert_eq!(
            parse_topic("echo/s/Heartbeat/1"),
            Err(TopicError::UnknownKind("Heartbeat".into()))
        );
        for v in ["2", "0", "", "01", "v1"] {
            assert!(
                matches!(
                    parse_topic(&format!("echo/s/heartbeat/{v}")),
                    Err(TopicError::Version { supported: 1, .. })
                ),
                "version {v:?}"
            );
        }
    }
}
