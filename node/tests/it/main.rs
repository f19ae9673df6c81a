//! The integration-test binary of `echo-node`: real processes, loopback only, bounded waits.

mod admin;
mod cli;
mod durability;
mod learning;
mod proven;
mod relay;
mod scheduler;
mod swarm;
mod verified;

/// Sends SIGTERM to a child process (a node stops cleanly on it).
pub(crate) fn sigterm(child: &std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
}
