//! The swarm's decision rules as pure functions, with their rationale next to them and tests
//! without any I/O: forwarding-chain planning ([`plan`], ECHO-2 §4.2 / App. C.3) and its
//! seats ([`seats`]: re-drawn each plan epoch, with the accountability decisions applied),
//! accountable forwarding ([`forwarding`]: what a child's receipt says of its parent, who is
//! at fault), capacity
//! provisioning and broadcast completion ([`capacity`], ECHO-2 §3.3–3.4, App. B, C.2), the
//! staleness window ([`window`], ECHO-2 Algorithm 1), how a pull shortfall is split over
//! workers, bounded by what each was observed to deliver ([`pulls`]), probation, check rates
//! and batch shares of workers by their verified history ([`admission`]) and the units of
//! rates and chunk sizes ([`units`]).
//!
//! Owns: the arithmetic and the rules. Must not touch: the network, clocks, stores — callers
//! pass measured values and the current time in, and carry decisions out.

pub mod admission;
pub mod capacity;
pub mod commits;
pub mod forwarding;
pub mod plan;
pub mod pulls;
pub mod seats;
pub mod units;
pub mod window;

pub use pulls::{LedgerParams, PullLedger};
pub use window::Window;
