//! The network lab: Linux network namespaces for scenarios that need real network paths —
//! NAT (`testnet nat`) and WAN conditions (`testnet broadcast --rtt-ms … --loss-pct …`).
//! Described in `docs/netlab.md`; `scripts/netlab-install.sh` prepares a machine.
//!
//! - [`ns`]: namespaces named by run prefix, teardown on drop and on signals, `--cleanup`;
//! - [`topo`]: the public segment with NAT routers, and the emulated WAN star;
//! - [`emu`]: the link emulator's pure queue rules (delay, jitter, loss, rate), seeded;
//! - [`tun`]: the forwarder thread that runs those rules on TUN devices (no `netem` needed);
//! - [`sys`]: the few system calls behind it (`setns`, `TUNSETIFF`, `poll`, signals).
//!
//! Node processes run inside namespaces through [`node_wrapper`]: the harness's `Fleet`
//! starts the wrapper, which `exec`s `ip netns exec NS echo-node …`, so the pid the fleet
//! knows is the node's own (the address-file check and signals work unchanged).
//!
//! Must not pick ports: nodes bind port 0 and the harness reads their address files.

pub mod emu;
pub mod ns;
mod sys;
pub mod topo;
pub mod tun;

use std::path::{Path, PathBuf};

/// Writes an executable script `dir/NAME` that runs `bin` with its arguments inside the
/// network namespace `ns` (`exec ip netns exec NS BIN "$@"`); returns its path. Both `exec`s
/// keep the pid.
pub fn node_wrapper(dir: &Path, name: &str, ns: &str, bin: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
            quote(ns),
            quote(&bin.to_string_lossy())
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}
