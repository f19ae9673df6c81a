//! The engine's settings: how the learner sends ([`BroadcastMode`]), the per-node
//! [`DisseminationConfig`] (keys, plan parameters, caps, deadlines), and the test-only
//! [`Fault`]s. Plain data; the engine reads it, nothing here does I/O.

use std::path::PathBuf;
use std::time::Duration;

use control::plan::PlanParams;
use ed25519_dalek::{SigningKey, VerifyingKey};

/// How the learner sends a snapshot: the node's `broadcast.mode` (`"chain"` or `"star"`) and
/// the testnet's `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BroadcastMode {
    /// Scored forwarding chains (ECHO-2's chain dissemination).
    Chain,
    /// The learner pushes to every worker itself (baseline).
    Star,
}

impl BroadcastMode {
    /// The config and command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            BroadcastMode::Chain => "chain",
            BroadcastMode::Star => "star",
        }
    }
}

impl std::fmt::Display for BroadcastMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BroadcastMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "chain" => Ok(BroadcastMode::Chain),
            "star" => Ok(BroadcastMode::Star),
            _ => Err(format!("`{s}` is not a broadcast mode (chain or star)")),
        }
    }
}

/// Deliberate misbehaviour, for tests of the verification and repair paths only: compiled
/// only with the `adversary` feature.
#[cfg(feature = "adversary")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Flip one byte of every chunk this node pushes or serves.
    CorruptOutgoing,
    /// Install every version but pass nothing on: no push to a child (not even a hello), and
    /// every fetch answered as if nothing were held.
    SilentForwarder,
    /// Forward honestly until this many versions are installed, then as
    /// [`Fault::SilentForwarder`].
    SilentAfterInstalls(u64),
    /// Push and serve chunks at a tenth of the planned per-worker bandwidth `B̂w`.
    SlowForwarder,
    /// Push every (valid) chunk [`OVERFEED_COPIES`] times.
    Overfeed,
}

/// Copies of each chunk a [`Fault::Overfeed`] parent pushes.
#[cfg(feature = "adversary")]
pub const OVERFEED_COPIES: usize = 3;

/// The upload cap (Mbit/s, 0 = none) a node runs with: its configured one, or a tenth of
/// `B̂w` under [`Fault::SlowForwarder`] (whichever is lower).
pub(super) fn uplink_cap(cfg: &DisseminationConfig) -> f64 {
    #[cfg(feature = "adversary")]
    let slow_forwarder = cfg.fault == Some(Fault::SlowForwarder);
    #[cfg(not(feature = "adversary"))]
    let slow_forwarder = false;
    if !slow_forwarder {
        return cfg.uplink_mbps;
    }
    let slow = cfg.plan.worker_mbps / 10.0;
    if cfg.uplink_mbps > 0.0 {
        cfg.uplink_mbps.min(slow)
    } else {
        slow
    }
}

/// Settings of one node's engine.
#[derive(Debug, Clone)]
pub struct DisseminationConfig {
    pub swarm_id: String,
    /// The swarm's learner key: the only signer of manifests and plans accepted.
    pub learner_key: VerifyingKey,
    /// The learner's signing key (learner nodes only).
    pub signing_key: Option<SigningKey>,
    pub mode: BroadcastMode,
    /// Chain-planning inputs (`B0`, `B̂w`, score thresholds).
    pub plan: PlanParams,
    /// Snapshot chunk size in bytes (default 1 MiB, `docs/broadcast.md`).
    pub chunk_size: u32,
    /// Upload cap in Mbit/s (0 = unlimited); on the learner this is `B0`.
    pub uplink_mbps: f64,
    /// Download cap in Mbit/s (0 = unlimited).
    pub downlink_mbps: f64,
    /// A child that receives no chunk for this long fetches the missing ones elsewhere.
    pub stall_timeout: Duration,
    /// A push that waits this long for its next chunk (its own parent stalled) gives up.
    pub push_idle_timeout: Duration,
    /// A child waits this long for the next version's hello on a chunk stream its parent kept
    /// open; a parent reuses a kept stream only while it has been idle for less than 4/5 of
    /// this (`session`).
    pub session_idle_timeout: Duration,
    /// Filler bytes a parent sends on a warm stream before its first hello, to grow the
    /// stream's receive window while the links are idle (`session::warm_sessions`; 0: none;
    /// at most `wire::MAX_FILLER_BYTES`; sent in whole 64 KiB frames, a remainder dropped).
    pub warm_up_bytes: u64,
    /// Deadline for each frame read or written on a chunk stream or fetch (plus time for a
    /// large frame at [`super::MIN_RATE_BYTES_PER_S`]); also for opening a stream.
    pub read_timeout: Duration,
    /// Where the acceptance marks persist across restarts (`storage::replay`, normally
    /// `DATA_DIR/replay.state`); `None` keeps them in memory only.
    pub replay_path: Option<PathBuf>,
    /// Test-only misbehaviour (the `corrupt_chunks` attack is `Fault::CorruptOutgoing`).
    #[cfg(feature = "adversary")]
    pub fault: Option<Fault>,
}

impl DisseminationConfig {
    pub fn new(swarm_id: &str, learner_key: VerifyingKey) -> Self {
        DisseminationConfig {
            swarm_id: swarm_id.to_string(),
            learner_key,
            signing_key: None,
            mode: BroadcastMode::Chain,
            plan: PlanParams::default(),
            chunk_size: 1 << 20,
            uplink_mbps: 0.0,
            downlink_mbps: 0.0,
            stall_timeout: Duration::from_secs(5),
            push_idle_timeout: Duration::from_secs(60),
            session_idle_timeout: super::session::DEFAULT_SESSION_IDLE_TIMEOUT,
            warm_up_bytes: super::session::DEFAULT_WARM_UP_BYTES,
            read_timeout: DEFAULT_READ_TIMEOUT,
            replay_path: None,
            #[cfg(feature = "adversary")]
            fault: None,
        }
    }
}

/// Default [`DisseminationConfig::read_timeout`].
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
