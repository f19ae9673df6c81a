//! The worker's durable group counter: every group a worker produces carries a sequence number
//! `seq`, and the learner refuses a `seq` it has seen before with other content (the prompt of
//! a group is assigned per `seq`, see `tasks::assign`). So a restarted worker must not start
//! again at 0.
//!
//! Numbers are reserved in blocks of [`BLOCK`]: before the first number of a block is used,
//! the end of the block is written durably to the file (write a temporary file, fsync,
//! rename). A restart resumes at the last reserved end, skipping at most one block's unused
//! numbers (gaps are harmless; reuse is not). File format: one line `echo-rollout-seq v1 <next>`.

use std::path::{Path, PathBuf};

use crate::RolloutError;

/// Sequence numbers reserved per durable write.
pub const BLOCK: u64 = 64;
const HEADER: &str = "echo-rollout-seq v1";

/// A durable, monotone group counter backed by a small file.
#[derive(Debug)]
pub struct SeqFile {
    path: PathBuf,
    next: u64,
    reserved_until: u64,
}

impl SeqFile {
    /// Opens the counter at `path` (starting at 0 when the file does not exist).
    pub fn open(path: &Path) -> Result<Self, RolloutError> {
        let next = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text).ok_or_else(|| {
                RolloutError::Config(format!(
                    "{} is not a sequence file (`{HEADER} <n>`); remove it only if the learner \
                     never saw this worker's groups",
                    path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => {
                return Err(RolloutError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Ok(SeqFile {
            path: path.to_path_buf(),
            next,
            reserved_until: next,
        })
    }

    /// The next number this file would hand out (the floor of a restarted engine whose store
    /// has no commitments yet).
    pub fn peek(&self) -> u64 {
        self.next
    }

    /// Records that every number below `n` is in use (durably, a block at a time).
    pub fn reserve_through(&mut self, n: u64) -> Result<(), RolloutError> {
        self.next = self.next.max(n);
        if self.next > self.reserved_until {
            let until = self.next.saturating_add(BLOCK);
            write_durably(&self.path, until)?;
            self.reserved_until = until;
        }
        Ok(())
    }

    /// The next sequence number; never returns a number twice, also across restarts.
    pub fn take(&mut self) -> Result<u64, RolloutError> {
        if self.next >= self.reserved_until {
            let until = self.next.saturating_add(BLOCK);
            write_durably(&self.path, until)?;
            self.reserved_until = until;
        }
        let n = self.next;
        self.next += 1;
        Ok(n)
    }
}

fn parse(text: &str) -> Option<u64> {
    text.trim().strip_prefix(HEADER)?.trim().parse().ok()
}

fn write_durably(path: &Path, next: u64) -> Result<(), RolloutError> {
    storage::write_atomic(path, format!("{HEADER} {next}\n").as_bytes()).map_err(|source| {
        RolloutError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_never_reused_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rollout.seq");
        let mut s = SeqFile::open(&path).unwrap();
        let first: Vec<u64> = (0..3).map(|_| s.take().unwrap()).collect();
        assert_eq!(first, [0, 1, 2]);
        drop(s); // a crash: the rest of the block is skipped, not reused
        let mut s = SeqFile::open(&path).unwrap();
        let n = s.take().unwrap();
        assert_eq!(n, BLOCK);
        for _ in 0..BLOCK {
            s.take().unwrap();
        }
        let mut s = SeqFile::open(&path).unwrap();
        assert!(s.take().unwrap() > n + BLOCK, "past the second block");
        std::fs::write(&path, "garbage").unwrap();
        assert!(
            SeqFile::open(&path).is_err(),
            "a corrupt file is an error, not a reset"
        );
    }
}
