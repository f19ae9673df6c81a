//! The persisted ban list: the peers a node banned, so that a ban survives a restart
//! (`docs/security.md`, "Strikes and bans").
//!
//! Owns the file and its format. Must not touch: who is banned or why (the network service
//! decides; the node records each ban here and hands the list back to the service at start).
//!
//! # File layout (`bans.state` in the node's data directory), format 1
//!
//! ```text
//! magic "EBAN" | u8 format (1) | varint n
//! | n × (str peer_id | str reason | varint banned_unix_ms)
//! | 32-byte BLAKE3 of everything before it
//! ```
//! Rewritten whole on every new ban, atomically (temporary file, fsync, rename, directory
//! fsync), like `replay.state`. At most [`MAX_PERSISTED_BANS`] entries, the newest kept —
//! the network service keeps no more at once either. A missing file reads as "no bans"; a
//! corrupt one is an error (the caller decides whether to start without it).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};

/// File name of the ban list inside a node's data directory.
pub const BANS_FILE_NAME: &str = "bans.state";
/// Current format of the ban-list file.
pub const BANS_FORMAT: u8 = 1;
/// Entries kept at most (the network service's own bound on bans held at once).
pub const MAX_PERSISTED_BANS: usize = 4096;
const MAGIC: &[u8; 4] = b"EBAN";
const MAX_ID: usize = 128;

/// One ban.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanEntry {
    /// Base58 peer id.
    pub peer_id: String,
    /// The label of the strike that banned it (`p2p::ReportLabel`, e.g. `invalid_group`:
    /// the names of every offence a node reports are listed in `node/src/offences.rs`).
    pub reason: String,
    pub banned_unix_ms: u64,
}

fn encode(entries: &[BanEntry]) -> Vec<u8> {
    let mut w = Writer::with_capacity(16 + entries.len() * 80);
    w.raw(MAGIC);
    w.u8(BANS_FORMAT);
    w.varint(entries.len() as u64);
    for e in entries {
        w.str(&e.peer_id);
        w.str(&e.reason);
        w.varint(e.banned_unix_ms);
    }
    let mut bytes = w.into_bytes();
    let sum = blake3::hash(&bytes);
    bytes.extend_from_slice(sum.as_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Result<Vec<BanEntry>> {
    let what = "ban list";
    if bytes.len() < 32 {
        return Err(StorageError::decode(what, "shorter than its checksum"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(StorageError::decode(what, "checksum mismatch"));
    }
    let mut r = Reader::new(body, what);
    if r.raw(4)? != MAGIC {
        return Err(r.err("bad magic"));
    }
    let format = r.u8()?;
    if format != BANS_FORMAT {
        return Err(r.err(format!("format {format} (this build reads {BANS_FORMAT})")));
    }
    let n = r.len(MAX_PERSISTED_BANS, 3, "entries")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(BanEntry {
            peer_id: r.string(MAX_ID, "peer_id")?,
            reason: r.string(MAX_ID, "reason")?,
            banned_unix_ms: r.varint()?,
        });
    }
    r.finish()?;
    Ok(out)
}

/// The ban list of a data directory.
#[derive(Debug)]
pub struct BanFile {
    path: PathBuf,
    entries: Mutex<Vec<BanEntry>>,
}

impl BanFile {
    /// Reads `path` (missing: no bans).
    pub fn open(path: &Path) -> Result<Self> {
        let entries = match std::fs::read(path) {
            Ok(bytes) => decode(&bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StorageError::io(path, e)),
        };
        Ok(BanFile {
            path: path.to_path_buf(),
            entries: Mutex::new(entries),
        })
    }

    /// The bans, oldest first.
    pub fn entries(&self) -> Vec<BanEntry> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Adds a ban (a peer already listed keeps its first entry) and rewrites the file.
    /// Returns whether it was new.
    pub fn record(&self, entry: BanEntry) -> Result<bool> {
        if entry.peer_id.len() > MAX_ID || entry.reason.len() > MAX_ID {
            return Err(StorageError::invalid(
                "ban entry",
                "peer id or reason too long",
            ));
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.iter().any(|e| e.peer_id == entry.peer_id) {
            return Ok(false);
        }
        entries.push(entry);
        let excess = entries.len().saturating_sub(MAX_PERSISTED_BANS);
        entries.drain(..excess);
        crate::fs::write_atomic(&self.path, &encode(&entries))
            .map_err(|e| StorageError::io(&self.path, e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(peer: &str) -> BanEntry {
        BanEntry {
            peer_id: peer.into(),
            reason: "logprob_mismatch".into(),
            banned_unix_ms: 7,
        }
    }

    #[test]
    fn bans_survive_a_reopen_and_are_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(BANS_FILE_NAME);
        let f = BanFile::open(&path).unwrap();
        assert!(f.entries().is_empty());
        assert!(f.record(ban("a")).unwrap());
        assert!(f.record(ban("b")).unwrap());
        assert!(!f.record(ban("a")).unwrap(), "already banned");
        drop(f);
        let f = BanFile::open(&path).unwrap();
        assert_eq!(f.entries(), vec![ban("a"), ban("b")]);
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(BANS_FILE_NAME);
        BanFile::open(&path).unwrap().record(ban("a")).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[6] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(BanFile::open(&path).is_err(), "checksum");
        std::fs::write(&path, b"nonsense").unwrap();
        assert!(BanFile::open(&path).is_err());
        let mut other = encode(&[]);
        other[4] = 9;
        let n = other.len() - 32;
        let sum = *blake3::hash(&other[..n]).as_bytes();
        other[n..].copy_from_slice(&sum);
        std::fs::write(&path, &other).unwrap();
        let e = BanFile::open(&path).unwrap_err().to_string();
        assert!(e.contains("format 9"), "{e}");
    }

    #[test]
    fn the_list_is_bounded_to_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let f = BanFile::open(&dir.path().join(BANS_FILE_NAME)).unwrap();
        {
            let mut e = f.entries.lock().unwrap();
            e.extend((0..MAX_PERSISTED_BANS).map(|i| ban(&format!("p{i}"))));
        }
        f.record(ban("new")).unwrap();
        let e = f.entries();
        assert_eq!(e.len(), MAX_PERSISTED_BANS);
        assert_eq!(e[0].peer_id, "p1");
        assert_eq!(e.last().unwrap().peer_id, "new");
    }
}
