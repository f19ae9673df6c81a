//! The integration-test binary of `echo-node`: real processes, loopback only, bounded waits.

mod adapters;
mod admin;
mod admission;
mod bench;
mod cli;
mod deltas;
mod durability;
mod envs;
/// A forwarder that stalls mid-run (an attack: needs the `adversary` feature).
#[cfg(feature = "adversary")]
mod forwarding;
mod learning;
/// Proven rollouts: an honest f16 worker next to forced-token and mask-poisoning workers
/// (shares `verified`'s set-up, so built with it).
#[cfg(feature = "adversary")]
mod proven;
mod relay;
mod scheduler;
mod swarm;
/// Malicious workers: only a binary built with the `adversary` feature has attack code (on in
/// `cargo test --workspace`, where `testnet` enables it; or `--features adversary`).
#[cfg(feature = "adversary")]
mod verified;
/// A worker that keeps committed groups back (an attack: needs the `adversary` feature).
#[cfg(feature = "adversary")]
mod withholding;

/// Sends SIGTERM to a child process (a node stops cleanly on it).
pub(crate) fn sigterm(child: &std::process::Child) {
    signal(child, nix::sys::signal::Signal::SIGTERM);
}

/// Sends `sig` to `child` (a child that exited is not an error: the test's waits tell).
pub(crate) fn signal(child: &std::process::Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    let _ = nix::sys::signal::kill(pid, sig);
}
