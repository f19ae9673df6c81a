//! Persisted replay state: the newest learner-signed manifest, plan and activation order a node
//! accepted, so that after a restart an *older* signed message — still carrying a valid
//! learner signature — is refused instead of rolling the node back (`docs/security.md`).
//!
//! Owns: the marks ([`ReplayMarks`]), the freshness rules ([`ReplayMarks::check_manifest`],
//! [`ReplayMarks::check_plan`], [`ReplayMarks::check_order`]) and the file that holds them
//! ([`ReplayState`]). Must not touch: signatures (the caller verifies them first), the
//! messages' formats (the caller passes versions, sequences and a digest of the encoding).
//!
//! # File layout (`replay.state` in the node's data directory), format 1
//!
//! ```text
//! magic "ERPL" | u8 format (1)
//! | u8 has_manifest | [varint version | 32-byte digest]
//! | u8 has_plan     | [varint version | varint seq | 32-byte digest]
//! | u8 has_order    | [varint seq]
//! | 32-byte BLAKE3 of everything before it
//! ```
//! Varints are LEB128 (`storage::codec`); a digest is the BLAKE3 of the message's signed
//! encoding. The file is rewritten whole on every acceptance: written to `replay.state.tmp`,
//! fsynced, renamed over the old one, and the directory fsynced — a crash leaves the old or
//! the new file, never a torn one (the checksum catches anything else). A file that is
//! missing reads as "nothing accepted yet"; one that is corrupt or of an unknown format is an
//! error (the caller decides whether to start without it).
//!
//! # Rules
//!
//! A manifest is *new* when its version is above the mark, the *same* when version and digest
//! equal the mark (a repeat of what was accepted, harmless — e.g. the learner's catch-up answer
//! after a restart), and *stale* otherwise (an older version, or another manifest under the
//! marked version). Plans are ordered by `(version, seq)` the same way. Orders by `seq` only:
//! an order is new only when its sequence is above the mark.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::codec::{Reader, Writer};
use crate::error::{Result, StorageError};
use crate::manifest::Hash;

/// File name of the replay state inside a node's data directory.
pub const REPLAY_FILE_NAME: &str = "replay.state";
/// Current format of the replay-state file.
pub const REPLAY_FORMAT: u8 = 1;
const MAGIC: &[u8; 4] = b"ERPL";
/// Largest valid file: magic, format, three flags, four varints, two digests, the checksum.
const MAX_FILE_BYTES: u64 = 4 + 1 + 3 + 4 * 10 + 3 * 32;

/// Verdict on a signed message against the marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Newer than anything accepted: accept (and record).
    New,
    /// Exactly what was accepted last: harmless to accept again, nothing to record.
    Same,
    /// Older, or another message under the accepted version / sequence: a replay.
    Stale,
}

/// The newest accepted manifest, plan and order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayMarks {
    /// `(version, digest)` of the newest accepted manifest.
    pub manifest: Option<(u64, Hash)>,
    /// `(version, seq, digest)` of the newest accepted plan.
    pub plan: Option<(u64, u64, Hash)>,
    /// Sequence of the newest accepted activation order.
    pub order: Option<u64>,
}

impl ReplayMarks {
    pub fn check_manifest(&self, version: u64, digest: &Hash) -> Freshness {
        match self.manifest {
            None => Freshness::New,
            Some((v, _)) if version > v => Freshness::New,
            Some((v, d)) if version == v && d == *digest => Freshness::Same,
            Some(_) => Freshness::Stale,
        }
    }

    pub fn check_plan(&self, version: u64, seq: u64, digest: &Hash) -> Freshness {
        match self.plan {
            None => Freshness::New,
            Some((v, s, _)) if (version, seq) > (v, s) => Freshness::New,
            Some((v, s, d)) if (version, seq) == (v, s) && d == *digest => Freshness::Same,
            Some(_) => Freshness::Stale,
        }
    }

    pub fn check_order(&self, seq: u64) -> Freshness {
        match self.order {
            Some(s) if seq <= s => Freshness::Stale,
            _ => Freshness::New,
        }
    }

    /// The file's bytes (format [`REPLAY_FORMAT`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(MAX_FILE_BYTES as usize);
        w.raw(MAGIC);
        w.u8(REPLAY_FORMAT);
        match self.manifest {
            Some((v, d)) => {
                w.u8(1);
                w.varint(v);
                w.raw(&d);
            }
            None => w.u8(0),
        }
        match self.plan {
            Some((v, s, d)) => {
                w.u8(1);
                w.varint(v);
                w.varint(s);
                w.raw(&d);
            }
            None => w.u8(0),
        }
        match self.order {
            Some(s) => {
                w.u8(1);
                w.varint(s);
            }
            None => w.u8(0),
        }
        let mut bytes = w.into_bytes();
        let sum = blake3::hash(&bytes);
        bytes.extend_from_slice(sum.as_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "replay state";
        if bytes.len() < 32 + MAGIC.len() + 1 {
            return Err(StorageError::decode(WHAT, "file too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(StorageError::decode(WHAT, "checksum mismatch"));
        }
        let mut r = Reader::new(body, WHAT);
        if r.raw(MAGIC.len())? != MAGIC {
            return Err(r.err("bad magic"));
        }
        let format = r.u8()?;
        if format != REPLAY_FORMAT {
            return Err(r.err(format!("unknown format {format}")));
        }
        let flag = |r: &mut Reader<'_>| -> Result<bool> {
            match r.u8()? {
                0 => Ok(false),
                1 => Ok(true),
                f => Err(r.err(format!("flag {f}"))),
            }
        };
        let manifest = if flag(&mut r)? {
            Some((r.varint()?, r.array::<32>()?))
        } else {
            None
        };
        let plan = if flag(&mut r)? {
            Some((r.varint()?, r.varint()?, r.array::<32>()?))
        } else {
            None
        };
        let order = if flag(&mut r)? {
            Some(r.varint()?)
        } else {
            None
        };
        r.finish()?;
        Ok(ReplayMarks {
            manifest,
            plan,
            order,
        })
    }
}

/// The marks and where they persist: every `accept_*` checks freshness and, for a new message,
/// records it durably before returning — under one lock, so concurrent acceptances cannot
/// interleave a check and a write.
#[derive(Debug)]
pub struct ReplayState {
    path: Option<PathBuf>,
    marks: Mutex<ReplayMarks>,
}

/// A replay-state file that does not decode: refused, with what the operator can do.
fn damaged(path: &Path, reason: String) -> StorageError {
    StorageError::Damaged {
        path: path.to_path_buf(),
        reason,
        recovery: format!(
            "restore it from a backup, or remove it (`rm {}`): the node then accepts the \
             learner's newest signed messages again and, until they arrive, also older ones \
             (docs/security.md, \"Replay after a restart\")",
            path.display()
        ),
    }
}

impl ReplayState {
    /// Loads `path` (a missing file = nothing accepted yet; one that does not decode is
    /// [`StorageError::Damaged`], naming the file).
    pub fn open(path: &Path) -> Result<Self> {
        let marks = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ReplayMarks::default(),
            Err(e) => return Err(StorageError::io(path, e)),
            Ok(m) if m.len() > MAX_FILE_BYTES => {
                return Err(damaged(
                    path,
                    format!("{} bytes, more than a replay state holds", m.len()),
                ))
            }
            Ok(_) => {
                let bytes = std::fs::read(path).map_err(|e| StorageError::io(path, e))?;
                ReplayMarks::decode(&bytes).map_err(|e| damaged(path, e.to_string()))?
            }
        };
        Ok(ReplayState {
            path: Some(path.to_path_buf()),
            marks: Mutex::new(marks),
        })
    }

    /// Marks kept in memory only (tests, and nodes run without a data directory).
    pub fn in_memory() -> Self {
        ReplayState {
            path: None,
            marks: Mutex::new(ReplayMarks::default()),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn marks(&self) -> ReplayMarks {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplayMarks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises the manifest mark to at least `version` without a digest check for that version
    /// (e.g. the newest manifest found in the chunk store at start): older versions become
    /// stale. Nothing is written.
    pub fn raise_manifest_floor(&self, version: u64, digest: Hash) {
        let mut m = self.lock();
        if m.manifest.is_none_or(|(v, _)| v < version) {
            m.manifest = Some((version, digest));
        }
    }

    /// Checks a manifest; a new one is recorded (and persisted) before this returns.
    pub fn accept_manifest(&self, version: u64, digest: Hash) -> Result<Freshness> {
        self.update(|m| {
            let f = m.check_manifest(version, &digest);
            if f == Freshness::New {
                m.manifest = Some((version, digest));
            }
            f
        })
    }

    /// Checks a plan; a new one is recorded (and persisted) before this returns.
    pub fn accept_plan(&self, version: u64, seq: u64, digest: Hash) -> Result<Freshness> {
        self.update(|m| {
            let f = m.check_plan(version, seq, &digest);
            if f == Freshness::New {
                m.plan = Some((version, seq, digest));
            }
            f
        })
    }

    /// Checks an activation order; a new one is recorded (and persisted) before this returns.
    pub fn accept_order(&self, seq: u64) -> Result<Freshness> {
        self.update(|m| {
            let f = m.check_order(seq);
            if f == Freshness::New {
                m.order = Some(seq);
            }
            f
        })
    }

    /// Applies `f` to a copy of the marks; when it reports a new message, writes the copy and
    /// only then makes it current (a failed write changes nothing).
    fn update(&self, f: impl FnOnce(&mut ReplayMarks) -> Freshness) -> Result<Freshness> {
        let mut cur = self.lock();
        let mut next = *cur;
        let verdict = f(&mut next);
        if verdict == Freshness::New {
            if let Some(path) = &self.path {
                crate::fs::write_atomic(path, &next.encode())
                    .map_err(|e| StorageError::io(path, e))?;
            }
            *cur = next;
        }
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D5: Hash = [5; 32];
    const D5B: Hash = [55; 32];

    #[test]
    fn freshness_rules() {
        let m = ReplayMarks {
            manifest: Some((5, D5)),
            plan: Some((5, 2, D5)),
            order: Some(100),
        };
        assert_eq!(m.check_manifest(6, &D5B), Freshness::New);
        assert_eq!(m.check_manifest(5, &D5), Freshness::Same);
        assert_eq!(m.check_manifest(5, &D5B), Freshness::Stale);
        assert_eq!(m.check_manifest(4, &D5), Freshness::Stale);
        assert_eq!(m.check_plan(5, 3, &D5B), Freshness::New);
        assert_eq!(m.check_plan(6, 0, &D5B), Freshness::New);
        assert_eq!(m.check_plan(5, 2, &D5), Freshness::Same);
        assert_eq!(m.check_plan(5, 2, &D5B), Freshness::Stale);
        assert_eq!(m.check_plan(4, 9, &D5), Freshness::Stale);
        assert_eq!(m.check_order(101), Freshness::New);
        assert_eq!(m.check_order(100), Freshness::Stale);
        assert_eq!(m.check_order(7), Freshness::Stale);
        let empty = ReplayMarks::default();
        assert_eq!(empty.check_manifest(0, &D5), Freshness::New);
        assert_eq!(empty.check_plan(0, 0, &D5), Freshness::New);
        assert_eq!(empty.check_order(0), Freshness::New);
    }

    #[test]
    fn accepted_marks_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REPLAY_FILE_NAME);
        {
            let s = ReplayState::open(&path).unwrap();
            assert_eq!(s.marks(), ReplayMarks::default(), "no file yet");
            assert_eq!(s.accept_manifest(5, D5).unwrap(), Freshness::New);
            assert_eq!(s.accept_plan(5, 1, D5).unwrap(), Freshness::New);
            assert_eq!(s.accept_order(5).unwrap(), Freshness::New);
        }
        // "Restart": reopen from disk.
        let s = ReplayState::open(&path).unwrap();
        assert_eq!(s.accept_manifest(4, [4; 32]).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_manifest(5, D5B).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_manifest(5, D5).unwrap(), Freshness::Same);
        assert_eq!(s.accept_plan(5, 1, D5B).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_plan(5, 0, D5).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_order(5).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_order(4).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_order(6).unwrap(), Freshness::New);
        assert_eq!(s.accept_manifest(6, [6; 32]).unwrap(), Freshness::New);
        drop(s);
        let s = ReplayState::open(&path).unwrap();
        assert_eq!(
            s.marks(),
            ReplayMarks {
                manifest: Some((6, [6; 32])),
                plan: Some((5, 1, D5)),
                order: Some(6),
            }
        );
        assert!(!dir.path().join("replay.state.tmp").exists());
    }

    #[test]
    fn a_floor_from_the_chunk_store_makes_older_manifests_stale() {
        let s = ReplayState::in_memory();
        s.raise_manifest_floor(7, [7; 32]);
        s.raise_manifest_floor(3, [3; 32]);
        assert_eq!(s.accept_manifest(6, [6; 32]).unwrap(), Freshness::Stale);
        assert_eq!(s.accept_manifest(7, [7; 32]).unwrap(), Freshness::Same);
        assert_eq!(s.accept_manifest(8, [8; 32]).unwrap(), Freshness::New);
    }

    #[test]
    fn corrupt_or_foreign_files_are_errors_never_panics() {
        let m = ReplayMarks {
            manifest: Some((u64::MAX, D5)),
            plan: Some((u64::MAX, u64::MAX, D5B)),
            order: Some(u64::MAX),
        };
        let bytes = m.encode();
        assert!(bytes.len() as u64 <= MAX_FILE_BYTES);
        assert_eq!(ReplayMarks::decode(&bytes).unwrap(), m);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(ReplayMarks::decode(&b).is_err(), "flip at {i}");
            assert!(ReplayMarks::decode(&bytes[..i]).is_err(), "cut at {i}");
        }
        // A well-checksummed body of another format.
        let mut body = ReplayMarks::default().encode();
        body.truncate(body.len() - 32);
        body[4] = 9;
        let sum = *blake3::hash(&body).as_bytes();
        body.extend_from_slice(&sum);
        let err = ReplayMarks::decode(&body).unwrap_err();
        assert!(err.to_string().contains("unknown format 9"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REPLAY_FILE_NAME);
        std::fs::write(&path, vec![0u8; 10_000]).unwrap();
        assert!(ReplayState::open(&path).is_err());
        std::fs::write(&path, b"garbage").unwrap();
        let err = ReplayState::open(&path).unwrap_err();
        assert!(matches!(err, StorageError::Damaged { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("rm "),
            "names the file and the recovery: {text}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"garbage", "left as it was");
    }
}
