//! The learner's journal of groups handed to training since the last durable checkpoint.
//!
//! The training thread acks a batch (deleting it from the buffer) before training it, so that
//! a crash never trains a group twice. Without more, a `kill -9` between two checkpoints
//! loses the groups trained since the last one twice over: the restarted learner resumes from
//! the checkpoint (their gradient steps are gone) and the buffer no longer holds them. The
//! journal closes that hole: each batch is written here (one file, fsynced, renamed into
//! place) *before* it is acked; once a checkpoint is durable every batch it covers is
//! deleted; at start any batch still here — trained after the last checkpoint, or not trained
//! at all — goes back into the buffer and is trained again from the checkpoint's state. The
//! checkpoint's consumed-id set does not hold these groups, so they are admitted; a group the
//! crash left both in the buffer and here is trained once (the trainer's duplicate check).
//!
//! Owns: `<data_dir>/journal/batch-<seq>.bin` (groups as length-prefixed
//! `TrajectoryGroup::encode` records). Must not touch: the checkpoint itself, the buffer's
//! accounting beyond `put_groups` (a restored group counts as produced again).

use std::io::Write;
use std::path::{Path, PathBuf};

use storage::{TrajectoryGroup, TrajectoryStore};

/// Largest record accepted when reading the journal back (a group far beyond any real one
/// means the file is not ours or is damaged).
const MAX_RECORD_BYTES: usize = 256 << 20;

pub(crate) struct Journal {
    dir: PathBuf,
    next: u64,
}

impl Journal {
    /// Opens (creating) the journal folder; numbering continues after any batch in it.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        let next = batches(dir)?.last().map_or(0, |(seq, _)| seq + 1);
        Ok(Journal {
            dir: dir.to_path_buf(),
            next,
        })
    }

    /// Writes `groups` as one batch, durably (temp file, fsync, rename, fsync the folder):
    /// call before acking them in the buffer.
    pub(crate) fn record(&mut self, groups: &[TrajectoryGroup]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for g in groups {
            let rec = g.encode();
            bytes.extend_from_slice(&(rec.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&rec);
        }
        let name = format!("batch-{:020}.bin", self.next);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, self.dir.join(name))?;
        sync_dir(&self.dir)?;
        self.next += 1;
        Ok(())
    }

    /// The batch recorded last changed nothing in the model (no step was taken: every group
    /// was dropped, or the step failed and the batch was quarantined): forget it, so that
    /// the journal holds only batches a checkpoint still has to cover.
    pub(crate) fn forget_last(&mut self) -> std::io::Result<()> {
        let Some(seq) = self.next.checked_sub(1) else {
            return Ok(());
        };
        match std::fs::remove_file(self.dir.join(format!("batch-{seq:020}.bin"))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A checkpoint holding every batch recorded so far is durable: forget them.
    pub(crate) fn covered(&mut self) -> std::io::Result<usize> {
        let all = batches(&self.dir)?;
        for (_, p) in &all {
            std::fs::remove_file(p)?;
        }
        sync_dir(&self.dir)?;
        Ok(all.len())
    }

    /// Puts every journaled group back into `buffer` (a crash came after their ack and before
    /// a checkpoint covering them), then forgets them. Returns how many groups went back. A
    /// damaged batch file is reported and skipped, never fatal.
    pub(crate) fn restore(&mut self, buffer: &TrajectoryStore) -> anyhow::Result<usize> {
        let mut restored = 0;
        for (_, path) in batches(&self.dir)? {
            match read_batch(&path) {
                Ok(groups) => {
                    for g in &groups {
                        match buffer.put_groups(std::slice::from_ref(g)) {
                            Ok(_) => restored += 1,
                            Err(e) => tracing::warn!(
                                group = %hex::encode(g.group_id), error = %e,
                                "a journaled group could not go back into the buffer"
                            ),
                        }
                    }
                }
                Err(e) => tracing::warn!(
                    file = %path.display(), error = %e,
                    "a damaged journal batch is skipped"
                ),
            }
        }
        self.covered()?;
        Ok(restored)
    }
}

/// The batch files of `dir`, in recording order.
fn batches(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(seq) = name
            .strip_prefix("batch-")
            .and_then(|n| n.strip_suffix(".bin"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push((seq, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn read_batch(path: &Path) -> anyhow::Result<Vec<TrajectoryGroup>> {
    let bytes = std::fs::read(path)?;
    let mut rest = bytes.as_slice();
    let mut groups = Vec::new();
    while !rest.is_empty() {
        anyhow::ensure!(rest.len() >= 8, "truncated record length");
        let (len, tail) = rest.split_at(8);
        let len = u64::from_le_bytes(len.try_into()?) as usize;
        anyhow::ensure!(
            len <= MAX_RECORD_BYTES && len <= tail.len(),
            "record of {len} bytes"
        );
        let (rec, tail) = tail.split_at(len);
        groups.push(TrajectoryGroup::decode(rec)?);
        rest = tail;
    }
    Ok(groups)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn groups() -> Vec<TrajectoryGroup> {
        (0..3)
            .map(|i| storage::record::testing::group(2, 10 + i, 2, 4))
            .collect()
    }

    /// The crash: groups leased and journaled, acked (gone from the buffer), trained, and the
    /// process dies before a checkpoint. The reopened learner finds them in its buffer again.
    #[test]
    fn groups_acked_after_the_last_checkpoint_return_to_the_buffer_after_a_crash() {
        let tmp = tempfile::tempdir().unwrap();
        let (bdir, jdir) = (tmp.path().join("buffer"), tmp.path().join("journal"));
        let gs = groups();
        {
            let buffer = TrajectoryStore::open(&bdir).unwrap();
            buffer.put_groups(&gs).unwrap();
            let lease = buffer
                .lease_newest(0, 8, Duration::from_secs(60))
                .unwrap()
                .unwrap();
            let hand: Vec<_> = lease.groups.into_iter().map(|(_, g)| g).collect();
            let mut j = Journal::open(&jdir).unwrap();
            j.record(&hand).unwrap();
            buffer.ack(lease.id).unwrap();
            assert_eq!(buffer.pending().unwrap(), 0, "acked: gone from the buffer");
            // kill -9 here: no checkpoint, nothing else runs.
        }
        let buffer = TrajectoryStore::open(&bdir).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(j.restore(&buffer).unwrap(), gs.len());
        assert_eq!(buffer.pending().unwrap(), gs.len() as u64);
        let mut back: Vec<_> = buffer
            .scan(0, 10)
            .unwrap()
            .into_iter()
            .map(|(_, g)| g.group_id)
            .collect();
        let mut want: Vec<_> = gs.iter().map(|g| g.group_id).collect();
        back.sort();
        want.sort();
        assert_eq!(back, want);
        assert!(buffer.check_invariant().unwrap().holds());
        // Restored once: a second restart restores nothing more.
        assert_eq!(Journal::open(&jdir).unwrap().restore(&buffer).unwrap(), 0);
    }

    #[test]
    fn a_durable_checkpoint_forgets_the_batches_it_covers() {
        let tmp = tempfile::tempdir().unwrap();
        let jdir = tmp.path().join("journal");
        let mut j = Journal::open(&jdir).unwrap();
        let gs = groups();
        j.record(&gs[..2]).unwrap();
        j.record(&gs[2..]).unwrap();
        assert_eq!(j.covered().unwrap(), 2);
        j.record(&gs[..1]).unwrap();
        j.record(&gs[1..]).unwrap();
        j.forget_last().unwrap(); // that batch took no step
        drop(j);
        let buffer = TrajectoryStore::open(&tmp.path().join("buffer")).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(
            j.restore(&buffer).unwrap(),
            1,
            "only the batch after the checkpoint that took a step"
        );
    }

    #[test]
    fn numbering_continues_across_reopens_and_damage_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let jdir = tmp.path().join("journal");
        let gs = groups();
        Journal::open(&jdir).unwrap().record(&gs[..1]).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(j.next, 1);
        j.record(&gs[1..2]).unwrap();
        std::fs::write(jdir.join("batch-00000000000000000007.bin"), [9u8; 5]).unwrap();
        std::fs::write(jdir.join("notes.txt"), "not a batch").unwrap();
        let buffer = TrajectoryStore::open(&tmp.path().join("buffer")).unwrap();
        assert_eq!(Journal::open(&jdir).unwrap().restore(&buffer).unwrap(), 2);
        assert_eq!(batches(&jdir).unwrap().len(), 0);
    }
}
