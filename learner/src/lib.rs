//! The learner role: bounded-staleness training (ECHO-2 Algorithm 1), lease–ack pulls of
//! admissible trajectory groups, checkpoints and publication of snapshots.
//!
//! Owns: the training loop, losses, the learner's trajectory buffer policy.
//! Must not touch: the libp2p swarm (it talks to `p2p` through its client handle) or on-disk
//! formats (those belong to `storage`).
//!
//! The training loop arrives with issue 6; this crate is intentionally empty until then.
