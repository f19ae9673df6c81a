//! `echo-node` as a library: everything the binary runs, so that the testnet harness and the
//! integration tests share its typed config ([`config::NodeConfig`]) and status contract
//! ([`api::NodeStatus`]) instead of re-spelling them.
//!
//! Layout (dependencies point down; nothing below imports from above):
//! - [`commands`]: one module per subcommand (`run`, `status`, `demo`, …);
//! - [`offences`]: every offence the node reports to its network service, by name (the
//!   roles' and the crates' own; read back from the ban list at start);
//! - [`roles`]: what a running node does — the learner (training thread, publisher, puller)
//!   and the rollout worker;
//! - [`admin`]: the loopback admin endpoint (`/`, `/status`, `/metrics`);
//! - [`admission`]: admission credentials, the learner's admission gate, persisted bans;
//! - [`state`]: the resolved config and opened stores a running node shares;
//! - [`config`], [`api`], [`cli`], [`logging`]: the contracts and plumbing.

pub mod addr_file;
pub mod admin;
pub mod admission;
pub mod api;
pub mod cli;
pub mod commands;
pub mod config;
pub mod fleet;
pub mod logging;
pub mod misbehave;
pub mod offences;
pub mod roles;
pub mod state;
pub mod telemetry;
#[cfg(test)]
mod test_util;
