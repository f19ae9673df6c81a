//! Gossip messages: heartbeats and the learner's score table.
//!
//! Encoding: UTF-8 JSON objects carrying an explicit protocol version field `v`; the topic name
//! carries the same version (`echo/<swarm>/heartbeat/1`). Decoding checks the byte size first,
//! then the schema (all required fields present with the right types; unknown fields are
//! tolerated so that minor additions stay compatible), then the values (finite, in range, the
//! right swarm). See `docs/protocol.md`.

use serde::{Deserialize, Serialize};

use crate::error::MessageError;
use crate::role::Role;

/// Version of the heartbeat message and topic.
pub const HEARTBEAT_VERSION: u32 = 1;
/// Largest accepted heartbeat, in bytes.
pub const MAX_HEARTBEAT_BYTES: usize = 3 * 1024;
/// Most dial hints ([`Heartbeat::addrs`]) in one heartbeat.
pub const MAX_HEARTBEAT_ADDRS: usize = 4;
/// Longest dial hint, in bytes (a relay circuit address with two peer ids is ~130).
pub const MAX_HEARTBEAT_ADDR_BYTES: usize = 192;
/// Version of the score-table message and topic.
pub const SCORE_TABLE_VERSION: u32 = 1;
/// Largest accepted score table, in bytes.
pub const MAX_SCORE_TABLE_BYTES: usize = 256 * 1024;
/// Most entries in one score table.
pub const MAX_SCORE_TABLE_ENTRIES: usize = 2048;

/// What a node says about itself every heartbeat interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Message version ([`HEARTBEAT_VERSION`]).
    pub v: u32,
    pub swarm_id: String,
    /// The sender's role; serialised lowercase (`"role":"rollout"`). A name that is not a
    /// [`Role`] fails the schema check, so such a heartbeat is rejected at decode.
    pub role: Role,
    /// Software version of the sender (`echo-node` crate version).
    pub node_version: String,
    /// Snapshot version installed and used for sampling (none yet: `null`).
    pub installed_version: Option<u64>,
    /// Measured rollout throughput μ_i in groups per second.
    pub mu: f64,
    /// Declared cost c_i in $/h.
    pub cost_per_hour: f64,
    /// Availability in [0, 1] (1 = ready to work).
    pub availability: f64,
    /// Trajectory groups waiting to be pulled.
    pub pending: u64,
    /// Recent snapshot forwarding rate in bit/s.
    pub forward_rate_bps: f64,
    /// Recent snapshot receive rate in bit/s.
    pub receive_rate_bps: f64,
    /// When the sender's process started (ms since the Unix epoch): tells restarts apart.
    pub started_unix_ms: u64,
    /// Send time (ms since the Unix epoch, sender's clock).
    pub sent_unix_ms: u64,
    /// Per-process sequence number.
    pub seq: u64,
    /// The device the node runs its model on (absent in heartbeats of older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceReport>,
    /// How peers can reach the sender (`"public"`, `"holepunch"`, `"relayed"`, `"unknown"`;
    /// absent in heartbeats of older nodes). Self-reported: planners use it only to keep a
    /// node *out* of forwarding, never to give it more work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachability: Option<crate::reachability::Reachability>,
    /// Dial hints: addresses the sender can be reached at (confirmed external addresses
    /// first, then its listen addresses, relay circuits last; at most
    /// [`MAX_HEARTBEAT_ADDRS`], each a multiaddr of at most [`MAX_HEARTBEAT_ADDR_BYTES`]
    /// without a `/p2p` suffix; absent in heartbeats of older nodes). A forwarder must reach
    /// the children its chain names, which it may never have met: without hints it learns
    /// their addresses only through Kademlia or identify, round trips that cost a whole
    /// stall timeout on a WAN. Self-reported and never trusted: a dial authenticates the
    /// peer id, so a wrong hint costs one failed dial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<String>,
    /// Signed delivery receipts of a chain child: what its planned parent delivered of its
    /// newest versions (at most [`crate::receipt::MAX_HEARTBEAT_RECEIPTS`]; absent in
    /// heartbeats of older nodes and of nodes fed by the learner itself). The learner judges
    /// forwarders by them (`docs/broadcast.md`, "Accountable forwarding").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receipts: Vec<crate::receipt::DeliveryReceipt>,
    /// The sender's admission credential (hex, at most [`MAX_HEARTBEAT_ADMISSION_BYTES`]):
    /// an expiring learner-signed ticket for its peer id and/or a proof of work on it, which
    /// a learner admitting only such workers checks before it pulls from the sender
    /// (`docs/protocol.md`, "Admission"). Opaque to this crate; absent when the node has none
    /// (and in heartbeats of older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<String>,
    /// Milliseconds between the sender's install of `installed_version` and this heartbeat
    /// (its own clock, so no clock skew enters). Install reports can be held back by up to
    /// half an interval (`hbgate`, sender pacing); the learner subtracts this age to time
    /// T_bcast from the install itself. Absent from older nodes; used at most
    /// [`MAX_INSTALL_AGE_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_age_ms: Option<u64>,
}

/// The largest install age a receiver takes into account (a larger one counts as this).
pub const MAX_INSTALL_AGE_MS: u64 = 60_000;

/// Longest `admission` field of a heartbeat.
pub const MAX_HEARTBEAT_ADMISSION_BYTES: usize = 1024;

/// The compute device a node runs its model on, as its heartbeats report it. Self-reported:
/// shown in `status` and usable as a scheduling filter, never trusted for correctness.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// `cpu` or `cuda`.
    pub kind: String,
    /// The CPU model or the GPU's name.
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
    /// CUDA compute capability (`"9.0"`), absent on a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// The dtype a rollout worker samples in (`f32`, `f16`, `bf16`; absent for other roles and
    /// in heartbeats of older nodes). The learner judges the worker's groups with that dtype's
    /// numeric tolerance; claiming a wider one buys a worker only that wider (still bounded)
    /// margin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The rule a rollout worker samples with (absent for other roles and in heartbeats of
    /// older nodes). The learner checks every sampled token against its own rule, so a worker
    /// configured with another one would only produce refused groups and strikes; it does not
    /// pull from such a worker, and says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingReport>,
}

/// How a rollout worker samples: `rollout.temperature`, `rollout.top_p`,
/// `rollout.max_new_tokens`. Self-reported: it only keeps an honest worker whose
/// configuration differs from the learner's out of pulls (and so out of strikes); a worker that
/// reports the learner's rule and samples with another is caught token by token by the
/// learner's checks as before. The learner's comparison is its own (the node's
/// `SamplingCheck`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingReport {
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass, in (0, 1].
    pub top_p: f32,
    /// The most tokens a response may have.
    pub max_new_tokens: u32,
    /// The pin of the external environment the worker plays (`tasks::external::pin`; absent
    /// for built-in tasks and in heartbeats of older nodes). A worker whose program differs
    /// from the learner's would only see its episodes refused in replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_pin: Option<EnvPin>,
}

/// A 32-byte environment pin, hex in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvPin(pub [u8; 32]);

impl Serialize for EnvPin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for EnvPin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.as_bytes(), &mut out)
            .map_err(|e| serde::de::Error::custom(format!("env_pin: {e}")))?;
        Ok(EnvPin(out))
    }
}

impl SamplingReport {
    /// Highest temperature a heartbeat may name.
    pub const MAX_TEMPERATURE: f32 = 100.0;

    fn check(&self) -> Result<(), MessageError> {
        let ok = self.temperature.is_finite()
            && (0.0..=Self::MAX_TEMPERATURE).contains(&self.temperature)
            && self.top_p > 0.0
            && self.top_p <= 1.0
            && self.max_new_tokens >= 1
            && self.max_new_tokens as usize <= MAX_SAMPLING_TOKENS;
        if ok {
            Ok(())
        } else {
            Err(MessageError::Invalid(format!(
                "sampling {self:?}: temperature outside 0..={}, top_p outside (0, 1] or \
                 max_new_tokens outside 1..={MAX_SAMPLING_TOKENS}",
                Self::MAX_TEMPERATURE
            )))
        }
    }
}

/// Most new tokens a [`SamplingReport`] may name (a response's token bound of the trajectory
/// records).
pub const MAX_SAMPLING_TOKENS: usize = 1 << 18;

impl DeviceReport {
    /// Device kinds a heartbeat may name.
    pub const KINDS: [&'static str; 2] = ["cpu", "cuda"];
    /// Sampling dtypes a heartbeat may name.
    pub const DTYPES: [&'static str; 3] = ["f32", "f16", "bf16"];

    fn check(&self) -> Result<(), MessageError> {
        if !Self::KINDS.contains(&self.kind.as_str()) {
            return Err(MessageError::Invalid(format!(
                "device kind `{}` is not cpu or cuda",
                self.kind
            )));
        }
        check_str("device.name", &self.name, 128)?;
        if let Some(cc) = &self.compute_capability {
            check_str("device.compute_capability", cc, 16)?;
        }
        if let Some(d) = &self.dtype {
            if !Self::DTYPES.contains(&d.as_str()) {
                return Err(MessageError::Invalid(format!(
                    "device dtype `{d}` is not f32, f16 or bf16"
                )));
            }
            // No node samples in bf16 on a CPU (candle's CPU backend has no bf16 matmul, and
            // the node refuses the configuration): such a claim only asks for bf16's wider
            // margins.
            if d == "bf16" && self.kind == "cpu" {
                return Err(MessageError::Invalid(
                    "device dtype bf16 on a cpu: no node samples so".into(),
                ));
            }
        }
        if let Some(r) = &self.sampling {
            r.check()?;
        }
        if self.memory_free_bytes > self.memory_total_bytes {
            return Err(MessageError::Invalid(
                "device free memory exceeds its total".into(),
            ));
        }
        Ok(())
    }
}

/// The fields a role fills in its heartbeats (the rest comes from the service).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalStatus {
    pub installed_version: Option<u64>,
    pub mu: f64,
    pub availability: f64,
    pub pending: u64,
    pub forward_rate_bps: f64,
    pub receive_rate_bps: f64,
    #[serde(default)]
    pub device: Option<DeviceReport>,
    /// Signed delivery receipts to carry (the newest first; trimmed to
    /// [`crate::receipt::MAX_HEARTBEAT_RECEIPTS`]).
    #[serde(default)]
    pub receipts: Vec<crate::receipt::DeliveryReceipt>,
    /// The admission credential gossiped in heartbeats ([`Heartbeat::admission`]).
    #[serde(default)]
    pub admission: Option<String>,
}

fn check_num(field: &'static str, x: f64, max: f64) -> Result<(), MessageError> {
    if x.is_finite() && (0.0..=max).contains(&x) {
        Ok(())
    } else {
        Err(MessageError::Invalid(format!(
            "{field} = {x} is outside 0..={max}"
        )))
    }
}

fn check_str(field: &'static str, s: &str, max: usize) -> Result<(), MessageError> {
    if s.len() <= max && s.chars().all(|c| !c.is_control()) {
        Ok(())
    } else {
        Err(MessageError::Invalid(format!(
            "{field} is longer than {max} bytes or has control characters"
        )))
    }
}

/// The most groups a heartbeat may claim to hold (`pending`): the bound of the workers'
/// `storage.max_pending_groups`, so a larger claim can only be a lie (a message rejected, a
/// strike). A smaller lie buys nothing either: pulls follow what the learner saw a worker
/// deliver, bounded by the claim (`control::pulls::PullLedger`).
pub const MAX_PENDING_CLAIM: u64 = 1 << 20;

impl Heartbeat {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a heartbeat always serialises")
    }

    /// Size check, schema check, value check.
    pub fn decode(bytes: &[u8], swarm_id: &str) -> Result<Self, MessageError> {
        if bytes.len() > MAX_HEARTBEAT_BYTES {
            return Err(MessageError::TooLarge {
                len: bytes.len(),
                max: MAX_HEARTBEAT_BYTES,
            });
        }
        let mut hb: Heartbeat =
            serde_json::from_slice(bytes).map_err(|e| MessageError::Schema(e.to_string()))?;
        if hb.v != HEARTBEAT_VERSION {
            return Err(MessageError::Version {
                got: hb.v,
                supported: HEARTBEAT_VERSION,
            });
        }
        if hb.swarm_id != swarm_id {
            return Err(MessageError::Invalid(format!(
                "swarm_id `{}` is not `{swarm_id}`",
                hb.swarm_id
            )));
        }
        check_str("node_version", &hb.node_version, 64)?;
        if hb.pending > MAX_PENDING_CLAIM {
            return Err(MessageError::Invalid(format!(
                "pending {} exceeds {MAX_PENDING_CLAIM}",
                hb.pending
            )));
        }
        check_num("mu", hb.mu, 1e9)?;
        check_num("cost_per_hour", hb.cost_per_hour, 1e6)?;
        check_num("availability", hb.availability, 1.0)?;
        check_num("forward_rate_bps", hb.forward_rate_bps, 1e15)?;
        check_num("receive_rate_bps", hb.receive_rate_bps, 1e15)?;
        if let Some(d) = &hb.device {
            d.check()?;
        }
        if let Some(a) = &hb.admission {
            if a.len() > MAX_HEARTBEAT_ADMISSION_BYTES || !a.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(MessageError::Invalid(format!(
                    "admission: not hex of at most {MAX_HEARTBEAT_ADMISSION_BYTES} characters"
                )));
            }
        }
        if hb.addrs.len() > MAX_HEARTBEAT_ADDRS {
            return Err(MessageError::Invalid(format!(
                "{} addresses, at most {MAX_HEARTBEAT_ADDRS}",
                hb.addrs.len()
            )));
        }
        if hb.receipts.len() > crate::receipt::MAX_HEARTBEAT_RECEIPTS {
            return Err(MessageError::Invalid(format!(
                "{} receipts, at most {}",
                hb.receipts.len(),
                crate::receipt::MAX_HEARTBEAT_RECEIPTS
            )));
        }
        // A receipt of another version is skipped, and one that cannot be read is dropped:
        // neither makes the heartbeat invalid (`crate::receipt`).
        hb.receipts.retain(|r| {
            if r.v != crate::receipt::RECEIPT_VERSION {
                return false;
            }
            match r.defect() {
                None => true,
                Some(defect) => {
                    tracing::warn!(
                        version = r.version,
                        defect,
                        "unreadable delivery receipt dropped; the heartbeat is kept"
                    );
                    false
                }
            }
        });
        for a in &hb.addrs {
            check_str("addrs", a, MAX_HEARTBEAT_ADDR_BYTES)?;
            let m: libp2p::Multiaddr = a
                .parse()
                .map_err(|e| MessageError::Invalid(format!("address `{a}`: {e}")))?;
            if m.iter()
                .last()
                .is_some_and(|p| matches!(p, libp2p::multiaddr::Protocol::P2p(_)))
            {
                return Err(MessageError::Invalid(format!(
                    "address `{a}` ends in /p2p (the sender's id is implied)"
                )));
            }
        }
        Ok(hb)
    }
}

/// One row of the learner's score table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreEntry {
    pub peer_id: String,
    pub score: f64,
    pub speed: f64,
    pub success: f64,
    pub stability: f64,
    pub decay: f64,
    /// What the learner did with this worker's groups (absent from an older learner, and for
    /// a peer the learner never pulled from): how a worker's operator sees their contribution
    /// from the learner's own (signed, learner-authored) message rather than their counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contribution: Option<Contribution>,
}

/// The learner's account of one worker's groups since the learner started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Contribution {
    /// Groups pulled from the worker and judged by the learner's verification.
    pub pulled: u64,
    /// Of those, groups that passed every check.
    pub accepted: u64,
    /// Groups refused by a check.
    pub rejected: u64,
    /// Groups trained on.
    pub trained: u64,
    /// Strikes the learner counted against the worker.
    pub strikes: u64,
    /// Why the learner does not pull from the worker now (not admitted, a sampling rule that
    /// differs from the learner's), at most [`MAX_REFUSED_CHARS`] characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The longest [`Contribution::refused`] a receiver accepts.
pub const MAX_REFUSED_CHARS: usize = 240;

/// The learner's view of every worker's score, gossiped periodically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreTable {
    /// Message version ([`SCORE_TABLE_VERSION`]).
    pub v: u32,
    pub swarm_id: String,
    pub sent_unix_ms: u64,
    pub entries: Vec<ScoreEntry>,
}

impl ScoreTable {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a score table always serialises")
    }

    /// The table the learner publishes: the best-scored `entries` (score descending, ties by
    /// peer id) up to what every receiver's [`ScoreTable::decode`] accepts —
    /// [`MAX_SCORE_TABLE_ENTRIES`] rows and [`MAX_SCORE_TABLE_BYTES`] encoded — so that a large
    /// swarm never makes receivers reject (and penalise) the learner's table. The size is
    /// exact, not estimated: compact JSON encodes the table as its header plus each row's own
    /// encoding, separated by commas.
    pub fn capped(swarm_id: &str, sent_unix_ms: u64, mut entries: Vec<ScoreEntry>) -> Self {
        entries.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.peer_id.cmp(&b.peer_id))
        });
        entries.truncate(MAX_SCORE_TABLE_ENTRIES);
        let mut table = ScoreTable {
            v: SCORE_TABLE_VERSION,
            swarm_id: swarm_id.to_string(),
            sent_unix_ms,
            entries: Vec::new(),
        };
        let mut len = table.encode().len();
        let keep = entries
            .iter()
            .enumerate()
            .take_while(|(i, e)| {
                let row = serde_json::to_vec(e).map_or(usize::MAX, |r| r.len());
                len = len.saturating_add(row + usize::from(*i > 0));
                len <= MAX_SCORE_TABLE_BYTES
            })
            .count();
        entries.truncate(keep);
        table.entries = entries;
        table
    }

    pub fn decode(bytes: &[u8], swarm_id: &str) -> Result<Self, MessageError> {
        if bytes.len() > MAX_SCORE_TABLE_BYTES {
            return Err(MessageError::TooLarge {
                len: bytes.len(),
                max: MAX_SCORE_TABLE_BYTES,
            });
        }
        let t: ScoreTable =
            serde_json::from_slice(bytes).map_err(|e| MessageError::Schema(e.to_string()))?;
        if t.v != SCORE_TABLE_VERSION {
            return Err(MessageError::Version {
                got: t.v,
                supported: SCORE_TABLE_VERSION,
            });
        }
        if t.swarm_id != swarm_id {
            return Err(MessageError::Invalid(format!(
                "swarm_id `{}` is not `{swarm_id}`",
                t.swarm_id
            )));
        }
        if t.entries.len() > MAX_SCORE_TABLE_ENTRIES {
            return Err(MessageError::Invalid(format!(
                "{} entries (max {MAX_SCORE_TABLE_ENTRIES})",
                t.entries.len()
            )));
        }
        for e in &t.entries {
            if e.peer_id.parse::<libp2p::PeerId>().is_err() {
                return Err(MessageError::Invalid(format!(
                    "`{}` is not a peer id",
                    e.peer_id
                )));
            }
            for (f, x) in [
                ("score", e.score),
                ("speed", e.speed),
                ("success", e.success),
                ("stability", e.stability),
            ] {
                check_num(f, x, 100.0)?;
            }
            check_num("decay", e.decay, 1.0)?;
            if let Some(r) = e.contribution.as_ref().and_then(|c| c.refused.as_deref()) {
                if r.chars().count() > MAX_REFUSED_CHARS {
                    return Err(MessageError::Invalid(format!(
                        "a refusal reason of {} characters (max {MAX_REFUSED_CHARS})",
                        r.chars().count()
                    )));
                }
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receipt never makes its heartbeat invalid: one whose counts are far out of range (a
    /// parent that pushed everything three times) is kept as signed, one that cannot be read
    /// is dropped, and the rest of the heartbeat decodes.
    #[test]
    fn a_receipt_never_makes_its_heartbeat_invalid() {
        let parent = crate::peer_id_from_seed([2; 32]).to_string();
        let receipt = |parent: &str, bytes: u64, end_ms: u64| {
            crate::receipt::DeliveryReceipt {
                v: crate::receipt::RECEIPT_VERSION,
                version: 3,
                parent: parent.into(),
                wanted: 1000,
                bytes,
                duplicates: 2 * bytes,
                spoke: true,
                hello_ms: Some(1),
                first_ms: Some(2),
                last_ms: Some(3),
                end_ms,
                installed: true,
                sig: String::new(),
            }
            .sign([9; 32], "s")
        };
        let inflated = receipt(&parent, 3000, u64::MAX);
        let h = Heartbeat {
            receipts: vec![inflated.clone(), receipt("nobody", 10, 4)],
            pending: 7,
            ..hb()
        };
        let back = Heartbeat::decode(&h.encode(), "s").unwrap();
        assert_eq!(back.receipts, vec![inflated]);
        assert_eq!(back.pending, 7);
    }

    /// Dial hints: up to four multiaddrs without a `/p2p` suffix, the largest realistic set
    /// (a relay circuit among them, a device report beside them) fits the size bound, and
    /// anything else is refused; an older node's heartbeat has none.
    #[test]
    fn dial_hints_are_bounded_multiaddrs() {
        let relay = "12D3KooWJQvBQoBq1N2VCxMnXkEKidV2rudvC2MbSUhjJZtUUdto";
        let full = vec![
            "/ip4/203.0.113.7/tcp/4001".to_string(),
            "/ip4/203.0.113.7/udp/4001/quic-v1".to_string(),
            "/ip6/2001:db8::7/udp/4001/quic-v1".to_string(),
            format!("/ip4/198.51.100.1/udp/4001/quic-v1/p2p/{relay}/p2p-circuit"),
        ];
        let h = Heartbeat {
            addrs: full.clone(),
            device: Some(DeviceReport {
                kind: "cuda".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: 85_000_000_000,
                memory_free_bytes: 80_000_000_000,
                compute_capability: Some("9.0".into()),
                dtype: Some("bf16".into()),
                sampling: None,
            }),
            receipts: (0..crate::receipt::MAX_HEARTBEAT_RECEIPTS as u64)
                .map(|v| {
                    crate::receipt::DeliveryReceipt {
                        v: crate::receipt::RECEIPT_VERSION,
                        version: u64::MAX - v,
                        parent: relay.into(),
                        wanted: u64::MAX / 2,
                        bytes: u64::MAX / 2,
                        duplicates: u64::MAX / 2,
                        spoke: true,
                        hello_ms: Some(86_400_000),
                        first_ms: Some(86_400_000),
                        last_ms: Some(86_400_000),
                        end_ms: 86_400_000,
                        installed: true,
                        sig: String::new(),
                    }
                    .sign([9; 32], "s")
                })
                .collect(),
            ..hb()
        };
        let bytes = h.encode();
        assert!(bytes.len() < MAX_HEARTBEAT_BYTES, "{}", bytes.len());
        assert_eq!(Heartbeat::decode(&bytes, "s").unwrap().receipts, h.receipts);
        assert_eq!(Heartbeat::decode(&bytes, "s").unwrap().addrs, full);
        assert!(!String::from_utf8_lossy(&hb().encode()).contains("addrs"));
        let long = format!("/dns4/{}/tcp/1", "a".repeat(MAX_HEARTBEAT_ADDR_BYTES));
        for bad in [
            vec!["/ip4/1.2.3.4/tcp/1".to_string(); MAX_HEARTBEAT_ADDRS + 1],
            vec![format!("/ip4/1.2.3.4/tcp/1/p2p/{relay}")],
            vec!["not a multiaddr".to_string()],
            vec![long],
        ] {
            let h = Heartbeat {
                addrs: bad.clone(),
                ..hb()
            };
            assert!(
                matches!(
                    Heartbeat::decode(&h.encode(), "s"),
                    Err(MessageError::Invalid(_))
                ),
                "{bad:?}"
            );
        }
    }

    fn hb() -> Heartbeat {
        Heartbeat {
            v: 1,
            swarm_id: "s".into(),
            role: Role::Rollout,
            node_version: "0.1.0".into(),
            installed_version: Some(3),
            mu: 1.5,
            cost_per_hour: 0.35,
            availability: 1.0,
            pending: 7,
            forward_rate_bps: 0.0,
            receive_rate_bps: 1e6,
            started_unix_ms: 1,
            sent_unix_ms: 2,
            seq: 3,
            device: None,
            reachability: None,
            addrs: Vec::new(),
            receipts: Vec::new(),
            admission: None,
            install_age_ms: None,
        }
    }

    #[test]
    fn a_workers_sampling_rule_travels_bounded() {
        let rule = SamplingReport {
            temperature: 1.2,
            top_p: 1.0,
            max_new_tokens: 6,
            env_pin: Some(EnvPin([7; 32])),
        };
        let with = |sampling| Heartbeat {
            device: Some(DeviceReport {
                kind: "cpu".into(),
                sampling,
                ..DeviceReport::default()
            }),
            ..hb()
        };
        let back = Heartbeat::decode(&with(Some(rule)).encode(), "s").unwrap();
        assert_eq!(back.device.unwrap().sampling, Some(rule));
        // Older nodes send none, and a heartbeat without one does not name the field.
        let none = with(None).encode();
        assert!(!String::from_utf8(none.clone())
            .unwrap()
            .contains("sampling"));
        assert_eq!(
            Heartbeat::decode(&none, "s")
                .unwrap()
                .device
                .unwrap()
                .sampling,
            None
        );
        for bad in [
            SamplingReport {
                temperature: f32::NAN,
                ..rule
            },
            SamplingReport {
                temperature: -1.0,
                ..rule
            },
            SamplingReport { top_p: 0.0, ..rule },
            SamplingReport { top_p: 1.5, ..rule },
            SamplingReport {
                max_new_tokens: 0,
                ..rule
            },
            SamplingReport {
                max_new_tokens: MAX_SAMPLING_TOKENS as u32 + 1,
                ..rule
            },
        ] {
            assert!(
                matches!(
                    Heartbeat::decode(&with(Some(bad)).encode(), "s"),
                    Err(MessageError::Invalid(_)) | Err(MessageError::Schema(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn admission_credentials_travel_as_bounded_hex() {
        let ok = Heartbeat {
            admission: Some("45ac".repeat(100)),
            ..hb()
        };
        let back = Heartbeat::decode(&ok.encode(), "s").unwrap();
        assert_eq!(back.admission, ok.admission);
        assert!(!String::from_utf8(hb().encode())
            .unwrap()
            .contains("admission"));
        for bad in [
            "zz".to_string(),
            "a".repeat(MAX_HEARTBEAT_ADMISSION_BYTES + 1),
        ] {
            let h = Heartbeat {
                admission: Some(bad),
                ..hb()
            };
            assert!(matches!(
                Heartbeat::decode(&h.encode(), "s"),
                Err(MessageError::Invalid(_))
            ));
        }
    }

    #[test]
    fn reachability_travels_in_heartbeats_and_older_heartbeats_still_decode() {
        use crate::reachability::Reachability;
        for &r in Reachability::ALL {
            let h = Heartbeat {
                reachability: Some(r),
                ..hb()
            };
            let bytes = h.encode();
            let text = String::from_utf8_lossy(&bytes).to_string();
            assert!(
                text.contains(&format!("\"reachability\":\"{r}\"")),
                "{text}"
            );
            assert_eq!(Heartbeat::decode(&bytes, "s").unwrap(), h);
        }
        let old = hb().encode();
        assert!(!String::from_utf8_lossy(&old).contains("reachability"));
        assert_eq!(Heartbeat::decode(&old, "s").unwrap().reachability, None);
        // A class this node does not know fails the schema check.
        let bad =
            String::from_utf8(old)
                .unwrap()
                .replacen('{', "{\"reachability\":\"teleport\",", 1);
        assert!(Heartbeat::decode(bad.as_bytes(), "s").is_err());
    }

    #[test]
    fn devices_travel_in_heartbeats_and_are_checked() {
        let gpu = DeviceReport {
            kind: "cuda".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 85_000_000_000,
            memory_free_bytes: 80_000_000_000,
            compute_capability: Some("9.0".into()),
            dtype: Some("bf16".into()),
            sampling: None,
        };
        let h = Heartbeat {
            device: Some(gpu.clone()),
            ..hb()
        };
        let bytes = h.encode();
        assert!(bytes.len() < MAX_HEARTBEAT_BYTES);
        assert_eq!(Heartbeat::decode(&bytes, "s").unwrap(), h);
        // An older node's heartbeat has no device: still valid.
        let old = hb().encode();
        assert!(!String::from_utf8_lossy(&old).contains("device"));
        assert_eq!(Heartbeat::decode(&old, "s").unwrap().device, None);
        for bad in [
            DeviceReport {
                kind: "tpu".into(),
                ..gpu.clone()
            },
            DeviceReport {
                memory_free_bytes: gpu.memory_total_bytes + 1,
                ..gpu.clone()
            },
            DeviceReport {
                name: "x".repeat(200),
                ..gpu.clone()
            },
            DeviceReport {
                name: "bad\u{7}name".into(),
                ..gpu.clone()
            },
            DeviceReport {
                dtype: Some("f8".into()),
                ..gpu.clone()
            },
            // bf16 sampling on a CPU: no node does it, a claim only widens the margins.
            DeviceReport {
                kind: "cpu".into(),
                compute_capability: None,
                ..gpu.clone()
            },
        ] {
            let h = Heartbeat {
                device: Some(bad),
                ..hb()
            };
            assert!(
                matches!(
                    Heartbeat::decode(&h.encode(), "s"),
                    Err(MessageError::Invalid(_))
                ),
                "{h:?}"
            );
        }
    }

    #[test]
    fn heartbeat_roundtrip_and_checks() {
        let h = hb();
        let bytes = h.encode();
        assert!(bytes.len() < MAX_HEARTBEAT_BYTES);
        assert_eq!(Heartbeat::decode(&bytes, "s").unwrap(), h);
        assert!(matches!(
            Heartbeat::decode(&bytes, "other"),
            Err(MessageError::Invalid(_))
        ));
        assert!(matches!(
            Heartbeat::decode(b"garbage", "s"),
            Err(MessageError::Schema(_))
        ));
        assert!(matches!(
            Heartbeat::decode(&vec![b' '; 5000], "s"),
            Err(MessageError::TooLarge { .. })
        ));
        let mut bad = hb();
        bad.v = 2;
        assert!(matches!(
            Heartbeat::decode(&bad.encode(), "s"),
            Err(MessageError::Version { .. })
        ));
        let mut bad = hb();
        bad.availability = 2.0;
        assert!(Heartbeat::decode(&bad.encode(), "s").is_err());
        // A holding no worker can have (the `pending_inflation` attack) is a lie.
        let mut bad = hb();
        bad.pending = MAX_PENDING_CLAIM;
        assert!(Heartbeat::decode(&bad.encode(), "s").is_ok());
        bad.pending = u64::MAX;
        assert!(matches!(
            Heartbeat::decode(&bad.encode(), "s"),
            Err(MessageError::Invalid(m)) if m.contains("pending")
        ));
        // A missing field is a schema error; an extra field is tolerated.
        let mut v: serde_json::Value = serde_json::from_slice(&hb().encode()).unwrap();
        v.as_object_mut().unwrap().insert("extra".into(), 1.into());
        assert!(Heartbeat::decode(&serde_json::to_vec(&v).unwrap(), "s").is_ok());
        v.as_object_mut().unwrap().remove("pending");
        assert!(matches!(
            Heartbeat::decode(&serde_json::to_vec(&v).unwrap(), "s"),
            Err(MessageError::Schema(_))
        ));
    }

    #[test]
    fn heartbeat_wire_format_names_the_role_in_lowercase() {
        for &role in Role::ALL {
            let h = Heartbeat { role, ..hb() };
            let json = String::from_utf8(h.encode()).unwrap();
            assert!(json.contains(&format!("\"role\":\"{role}\"")), "{json}");
            assert_eq!(Heartbeat::decode(json.as_bytes(), "s").unwrap().role, role);
        }
        // Byte for byte what the format was with a string role.
        let json = String::from_utf8(hb().encode()).unwrap();
        assert!(
            json.starts_with(r#"{"v":1,"swarm_id":"s","role":"rollout","node_version":"0.1.0","#),
            "{json}"
        );
    }

    #[test]
    fn heartbeat_with_an_unknown_role_is_rejected_at_decode() {
        for bad in ["king", "Rollout", "", "validator"] {
            let mut v: serde_json::Value = serde_json::from_slice(&hb().encode()).unwrap();
            v["role"] = bad.into();
            let bytes = serde_json::to_vec(&v).unwrap();
            assert!(
                matches!(Heartbeat::decode(&bytes, "s"), Err(MessageError::Schema(_))),
                "role {bad:?} was accepted"
            );
        }
        let mut v: serde_json::Value = serde_json::from_slice(&hb().encode()).unwrap();
        v["role"] = 7.into();
        let bytes = serde_json::to_vec(&v).unwrap();
        assert!(matches!(
            Heartbeat::decode(&bytes, "s"),
            Err(MessageError::Schema(_))
        ));
    }

    #[test]
    fn score_table_checks() {
        let t = ScoreTable {
            v: 1,
            swarm_id: "s".into(),
            sent_unix_ms: 1,
            entries: vec![ScoreEntry {
                peer_id: libp2p::PeerId::random().to_string(),
                score: 50.0,
                speed: 60.0,
                success: 100.0,
                stability: 30.0,
                decay: 1.0,
                contribution: None,
            }],
        };
        assert_eq!(ScoreTable::decode(&t.encode(), "s").unwrap(), t);
        // A contribution round-trips; an over-long refusal reason is refused.
        let mut with = t.clone();
        with.entries[0].contribution = Some(Contribution {
            pulled: 20,
            accepted: 18,
            rejected: 2,
            trained: 16,
            strikes: 1,
            refused: Some("sampling rule: temperature 1 is not 1.2".into()),
        });
        assert_eq!(ScoreTable::decode(&with.encode(), "s").unwrap(), with);
        with.entries[0].contribution.as_mut().unwrap().refused =
            Some("x".repeat(MAX_REFUSED_CHARS + 1));
        assert!(ScoreTable::decode(&with.encode(), "s").is_err());
        let mut bad = t.clone();
        bad.entries[0].peer_id = "x".into();
        assert!(ScoreTable::decode(&bad.encode(), "s").is_err());
    }

    fn entry(score: f64) -> ScoreEntry {
        // Long decimals: the byte limit binds before the entry limit.
        ScoreEntry {
            peer_id: libp2p::PeerId::random().to_string(),
            score,
            speed: 100.0 / 3.0,
            success: 200.0 / 3.0,
            stability: 100.0 / 7.0,
            decay: 1.0 / 3.0,
            contribution: None,
        }
    }

    #[test]
    fn the_learners_table_is_capped_to_what_receivers_accept() {
        // More peers than either limit admits.
        let n = MAX_SCORE_TABLE_ENTRIES + 500;
        let entries: Vec<ScoreEntry> = (0..n)
            .map(|i| entry((i % 1000) as f64 / 10.0 + 0.01))
            .collect();
        let uncapped = ScoreTable {
            v: SCORE_TABLE_VERSION,
            swarm_id: "s".into(),
            sent_unix_ms: 1,
            entries: entries.clone(),
        };
        assert!(ScoreTable::decode(&uncapped.encode(), "s").is_err());
        let t = ScoreTable::capped("s", 1, entries.clone());
        let bytes = t.encode();
        assert!(bytes.len() <= MAX_SCORE_TABLE_BYTES);
        assert!(!t.entries.is_empty() && t.entries.len() <= MAX_SCORE_TABLE_ENTRIES);
        assert_eq!(ScoreTable::decode(&bytes, "s").unwrap(), t);
        // The best ones, best first; the next row would not have fit.
        assert!(t.entries.windows(2).all(|w| w[0].score >= w[1].score));
        let mut sorted = entries;
        sorted.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.peer_id.cmp(&b.peer_id)));
        assert_eq!(t.entries[..], sorted[..t.entries.len()]);
        let mut one_more = t.clone();
        one_more.entries.push(sorted[t.entries.len()].clone());
        assert!(one_more.encode().len() > MAX_SCORE_TABLE_BYTES);
    }

    #[test]
    fn the_entry_limit_binds_for_short_rows_and_ties_go_by_peer_id() {
        let short = |_| ScoreEntry {
            peer_id: libp2p::PeerId::random().to_string(),
            score: 1.0,
            speed: 0.0,
            success: 0.0,
            stability: 0.0,
            decay: 1.0,
            contribution: None,
        };
        let entries: Vec<ScoreEntry> = (0..MAX_SCORE_TABLE_ENTRIES + 10).map(short).collect();
        let t = ScoreTable::capped("s", 1, entries);
        let bytes = t.encode();
        if bytes.len() <= MAX_SCORE_TABLE_BYTES {
            assert_eq!(t.entries.len(), MAX_SCORE_TABLE_ENTRIES);
        }
        assert!(ScoreTable::decode(&bytes, "s").is_ok());
        assert!(t.entries.windows(2).all(|w| w[0].peer_id < w[1].peer_id));
        // Few peers: all of them.
        assert_eq!(
            ScoreTable::capped("s", 1, vec![entry(5.0)]).entries.len(),
            1
        );
        assert!(ScoreTable::capped("s", 1, vec![]).entries.is_empty());
    }
}
