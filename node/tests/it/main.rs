//! The integration-test binary of `echo-node`: real processes, loopback only, bounded waits.

mod admin;
mod cli;
mod learning;
mod scheduler;
mod swarm;
