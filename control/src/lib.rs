//! The swarm's decision rules as pure functions, with their rationale next to them and tests
//! without any I/O: forwarding-chain planning ([`plan`], ECHO-2 §4.2 / App. C.3) and
//! capacity provisioning ([`capacity`], ECHO-2 §3.3–3.4, App. B, C.2).
//!
//! Owns: the arithmetic and the rules. Must not touch: the network, clocks, stores — callers
//! pass measured values and the current time in, and carry decisions out.

pub mod capacity;
pub mod plan;
pub mod units;
pub mod window;

pub use window::Window;
