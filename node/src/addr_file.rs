//! The node's address file, `<data_dir>/node.addr.json`: where a running node can be reached,
//! written by the node itself once it listens. Tools that start nodes (`echo-node demo`, the
//! testnet harness, the integration tests) configure port 0 — the kernel picks a free port at
//! bind time — and read the bound addresses back from here, instead of picking a free port,
//! releasing it and hoping nobody takes it before the node binds it.
//!
//! Format 1 (JSON): `{"format": 1, "pid", "peer_id", "admin": "127.0.0.1:PORT", "listen":
//! [multiaddr, …]}`. Written atomically (temporary file, then rename) once the first listen
//! address is known, and removed when the node stops cleanly; a reader checks `pid` against the
//! process it started, so a file left by a killed earlier run is never mistaken for the new
//! one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The current format.
pub const FORMAT: u32 = 1;

/// What `node.addr.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrFile {
    pub format: u32,
    /// The node process.
    pub pid: u32,
    pub peer_id: String,
    /// The admin endpoint actually bound (`/`, `/status`, `/metrics`).
    pub admin: String,
    /// The libp2p listen addresses actually bound.
    pub listen: Vec<String>,
}

impl AddrFile {
    /// The first TCP listen address with `/p2p/<peer id>` appended: what other nodes put in
    /// `network.bootstrap`.
    pub fn dial_addr(&self) -> Option<String> {
        self.dial_addr_on("/tcp/")
    }

    /// The first listen address containing `transport` (`"/tcp/"`, `"/quic-v1"`) with
    /// `/p2p/<peer id>` appended.
    pub fn dial_addr_on(&self, transport: &str) -> Option<String> {
        self.listen
            .iter()
            .find(|a| a.contains(transport))
            .map(|a| format!("{a}/p2p/{}", self.peer_id))
    }
}

/// `<data_dir>/node.addr.json`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.addr.json")
}

/// Writes `f` atomically.
pub fn write(data_dir: &Path, f: &AddrFile) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(f).map_err(std::io::Error::other)?;
    storage::write_atomic(&path(data_dir), &text)
}

/// The address file of the node with process id `pid`, if it has written it (`None` while it
/// has not, or if the file belongs to another process).
pub fn read(data_dir: &Path, pid: u32) -> Option<AddrFile> {
    let f: AddrFile = serde_json::from_slice(&std::fs::read(path(data_dir)).ok()?).ok()?;
    (f.format == FORMAT && f.pid == pid).then_some(f)
}

/// Removes the file if it is this process's.
pub fn remove(data_dir: &Path) {
    if read(data_dir, std::process::id()).is_some() {
        let _ = std::fs::remove_file(path(data_dir));
    }
}

/// Writes `<data_dir>/node.addr.json` once the swarm reports its first listen address (the
/// ports actually bound, also when the config asks for port 0).
pub(crate) async fn write_when_listening(
    client: p2p::Client,
    data_dir: std::path::PathBuf,
    peer_id: String,
    admin: std::net::SocketAddr,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        match client.listen_addrs().await {
            Ok(addrs) if !addrs.is_empty() => {
                let f = AddrFile {
                    format: FORMAT,
                    pid: std::process::id(),
                    peer_id,
                    admin: admin.to_string(),
                    listen: addrs.iter().map(ToString::to_string).collect(),
                };
                match write(&data_dir, &f) {
                    Ok(()) => tracing::info!(
                        file = %path(&data_dir).display(),
                        "listening; addresses written"
                    ),
                    Err(e) => tracing::warn!(error = %e, "writing the address file"),
                }
                return;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(_) => return,
        }
    }
    tracing::warn!("no listen address within 30 s: the address file is not written");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_are_read_back_only_for_their_process() {
        let dir = tempfile::tempdir().unwrap();
        let f = AddrFile {
            format: FORMAT,
            pid: std::process::id(),
            peer_id: "12D3KooWtest".into(),
            admin: "127.0.0.1:40001".into(),
            listen: vec![
                "/ip4/127.0.0.1/udp/5/quic-v1".into(),
                "/ip4/127.0.0.1/tcp/40002".into(),
            ],
        };
        assert_eq!(read(dir.path(), f.pid), None);
        write(dir.path(), &f).unwrap();
        assert_eq!(read(dir.path(), f.pid), Some(f.clone()));
        assert_eq!(read(dir.path(), f.pid + 1), None, "another process's file");
        assert_eq!(
            f.dial_addr().as_deref(),
            Some("/ip4/127.0.0.1/tcp/40002/p2p/12D3KooWtest")
        );
        remove(dir.path());
        assert!(!path(dir.path()).exists());
    }
}
