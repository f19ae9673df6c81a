//! The learner's journal of groups handed to training since the last durable checkpoint.
//!
//! The training thread acks a batch (deleting it from the buffer) before training it, so that
//! a crash never trains a group twice. Without more, a `kill -9` between two checkpoints
//! loses the groups trained since the last one twice over: the restarted learner resumes from
//! the checkpoint (their gradient steps are gone) and the buffer no longer holds them. The
//! journal closes that hole: each batch is written here (one file, fsynced, renamed into
//! place) *before* it is acked; once a checkpoint is durable every batch it covers is
//! deleted. Each batch is named with the step (the version after it) it is trained as. At
//! start the learner's weights stand at some version `w` — the checkpoint's, or a snapshot it
//! published after that checkpoint and resumed from (`docs/learner.md`, "Crash semantics"):
//! a batch of step ≤ `w` is in those weights, so its trajectory ids become consumed and it is
//! forgotten; any later batch — trained after `w`, or not trained at all — goes back into the
//! buffer and is trained again. The consumed-id set does not hold those groups, so they are
//! admitted; a group the crash left both in the buffer and here is trained once (the
//! trainer's duplicate check).
//!
//! Owns: `<data_dir>/journal/batch-<seq>-step-<step>.bin` (both numbers 20 digits; groups as
//! length-prefixed `TrajectoryGroup::encode` records; a `batch-<seq>.bin` of an older build,
//! without its step, is restored). Must not touch: the checkpoint itself, the buffer's
//! accounting beyond `put_groups` (a restored group counts as produced again).

use std::path::{Path, PathBuf};

use storage::{TrajectoryGroup, TrajectoryStore};

/// Largest record accepted when reading the journal back (a group far beyond any real one
/// means the file is not ours or is damaged).
const MAX_RECORD_BYTES: usize = 256 << 20;

pub(crate) struct Journal {
    dir: PathBuf,
    next: u64,
    /// The file of the batch recorded last (for [`Journal::forget_last`]).
    last: Option<PathBuf>,
}

/// What [`Journal::restore`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Restored {
    /// Groups put back into the buffer (trained after the weights' version, or never).
    pub(crate) returned: usize,
    /// Groups of steps the weights already hold: not trained again.
    pub(crate) in_weights: usize,
    /// Their trajectory ids, for the trainer's consumed set.
    pub(crate) consumed: Vec<[u8; 16]>,
}

impl Journal {
    /// Opens (creating) the journal folder; numbering continues after any batch in it.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        let next = batches(dir)?.last().map_or(0, |b| b.seq + 1);
        Ok(Journal {
            dir: dir.to_path_buf(),
            next,
            last: None,
        })
    }

    /// Writes `groups` as one batch to be trained as `step`, durably (temp file, fsync,
    /// rename, fsync the folder): call before acking them in the buffer.
    pub(crate) fn record(&mut self, groups: &[TrajectoryGroup], step: u64) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for g in groups {
            let rec = g.encode();
            bytes.extend_from_slice(&(rec.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&rec);
        }
        let name = format!("batch-{:020}-step-{step:020}.bin", self.next);
        let path = self.dir.join(name);
        storage::write_atomic(&path, &bytes)?;
        self.next += 1;
        self.last = Some(path);
        Ok(())
    }

    /// The batch recorded last changed nothing in the model (no step was taken: every group
    /// was dropped, or the step failed and the batch was quarantined): forget it, so that
    /// the journal holds only batches a checkpoint still has to cover.
    pub(crate) fn forget_last(&mut self) -> std::io::Result<()> {
        let Some(path) = self.last.take() else {
            return Ok(());
        };
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A checkpoint holding every batch recorded so far is durable: forget them.
    pub(crate) fn covered(&mut self) -> std::io::Result<usize> {
        let all = batches(&self.dir)?;
        for b in &all {
            std::fs::remove_file(&b.path)?;
        }
        storage::fs::sync_dir(&self.dir)?;
        Ok(all.len())
    }

    /// After a crash that came after these batches' acks and before a checkpoint covering
    /// them, with the model's weights at version `weights`: the groups of every batch trained
    /// as a step ≤ `weights` are in the weights (their ids are returned for the consumed set);
    /// every other group goes back into `buffer`. Then the journal is emptied. A damaged
    /// batch file is reported and skipped, never fatal.
    pub(crate) fn restore(
        &mut self,
        buffer: &TrajectoryStore,
        weights: u64,
    ) -> anyhow::Result<Restored> {
        let mut out = Restored::default();
        for b in batches(&self.dir)? {
            let groups = match read_batch(&b.path) {
                Ok(groups) => groups,
                Err(e) => {
                    tracing::warn!(
                        file = %b.path.display(), error = %e,
                        "a damaged journal batch is skipped"
                    );
                    continue;
                }
            };
            if b.step.is_some_and(|s| s <= weights) {
                out.in_weights += groups.len();
                out.consumed.extend(
                    groups
                        .iter()
                        .flat_map(|g| g.samples.iter().map(|s| s.trajectory_id)),
                );
                continue;
            }
            for g in &groups {
                match buffer.put_groups(std::slice::from_ref(g)) {
                    Ok(_) => out.returned += 1,
                    Err(e) => tracing::warn!(
                        group = %hex::encode(g.group_id), error = %e,
                        "a journaled group could not go back into the buffer"
                    ),
                }
            }
        }
        self.covered()?;
        Ok(out)
    }
}

/// One batch file: its recording number, the step it was trained as (absent in files of
/// older builds), its path.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Batch {
    seq: u64,
    step: Option<u64>,
    path: PathBuf,
}

/// The batch files of `dir`, in recording order.
fn batches(dir: &Path) -> std::io::Result<Vec<Batch>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name
            .strip_prefix("batch-")
            .and_then(|n| n.strip_suffix(".bin"))
        else {
            continue;
        };
        let (seq, step) = match stem.split_once("-step-") {
            Some((seq, step)) => match step.parse::<u64>() {
                Ok(step) => (seq, Some(step)),
                Err(_) => continue,
            },
            None => (stem, None),
        };
        if let Ok(seq) = seq.parse::<u64>() {
            out.push(Batch {
                seq,
                step,
                path: e.path(),
            });
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
            j.record(&hand, 1).unwrap();
            buffer.ack(lease.id).unwrap();
            assert_eq!(buffer.pending().unwrap(), 0, "acked: gone from the buffer");
            // kill -9 here: no checkpoint, nothing else runs.
        }
        let buffer = TrajectoryStore::open(&bdir).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(j.restore(&buffer, 0).unwrap().returned, gs.len());
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
        assert_eq!(
            Journal::open(&jdir).unwrap().restore(&buffer, 0).unwrap(),
            Restored::default()
        );
    }

    #[test]
    fn a_durable_checkpoint_forgets_the_batches_it_covers() {
        let tmp = tempfile::tempdir().unwrap();
        let jdir = tmp.path().join("journal");
        let mut j = Journal::open(&jdir).unwrap();
        let gs = groups();
        j.record(&gs[..2], 1).unwrap();
        j.record(&gs[2..], 2).unwrap();
        assert_eq!(j.covered().unwrap(), 2);
        j.record(&gs[..1], 3).unwrap();
        j.record(&gs[1..], 4).unwrap();
        j.forget_last().unwrap(); // that batch took no step
        drop(j);
        let buffer = TrajectoryStore::open(&tmp.path().join("buffer")).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(
            j.restore(&buffer, 2).unwrap().returned,
            1,
            "only the batch after the checkpoint that took a step"
        );
    }

    #[test]
    fn numbering_continues_across_reopens_and_damage_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let jdir = tmp.path().join("journal");
        let gs = groups();
        Journal::open(&jdir).unwrap().record(&gs[..1], 1).unwrap();
        let mut j = Journal::open(&jdir).unwrap();
        assert_eq!(j.next, 1);
        j.record(&gs[1..2], 2).unwrap();
        std::fs::write(
            jdir.join("batch-00000000000000000007-step-00000000000000000003.bin"),
            [9u8; 5],
        )
        .unwrap();
        std::fs::write(jdir.join("notes.txt"), "not a batch").unwrap();
        let buffer = TrajectoryStore::open(&tmp.path().join("buffer")).unwrap();
        assert_eq!(
            Journal::open(&jdir)
                .unwrap()
                .restore(&buffer, 0)
                .unwrap()
                .returned,
            2
        );
        assert_eq!(batches(&jdir).unwrap().len(), 0);
    }

    /// The learner resumed from a snapshot it published after its checkpoint (at version 2):
    /// the batches of steps 1 and 2 are in those weights — consumed, not trained again —
    /// while the batch of step 3 and one of an older build (no step in its name) go back.
    #[test]
    fn batches_the_resumed_weights_hold_are_consumed_not_returned() {
        let tmp = tempfile::tempdir().unwrap();
        let jdir = tmp.path().join("journal");
        let gs: Vec<_> = (0..4)
            .map(|i| storage::record::testing::group(2, 10 + i, 2, 4))
            .collect();
        let mut j = Journal::open(&jdir).unwrap();
        j.record(&gs[..1], 1).unwrap();
        j.record(&gs[1..2], 2).unwrap();
        j.record(&gs[2..3], 3).unwrap();
        let old = Journal::open(&jdir).unwrap().next;
        let mut rec = gs[3].encode();
        let mut bytes = (rec.len() as u64).to_le_bytes().to_vec();
        bytes.append(&mut rec);
        std::fs::write(jdir.join(format!("batch-{old:020}.bin")), bytes).unwrap();
        let buffer = TrajectoryStore::open(&tmp.path().join("buffer")).unwrap();
        let r = Journal::open(&jdir).unwrap().restore(&buffer, 2).unwrap();
        assert_eq!((r.returned, r.in_weights), (2, 2));
        let mut want: Vec<_> = gs[..2]
            .iter()
            .flat_map(|g| g.samples.iter().map(|s| s.trajectory_id))
            .collect();
        let mut got = r.consumed;
        want.sort();
        got.sort();
        assert_eq!(got, want);
        let mut back: Vec<_> = buffer
            .scan(0, 10)
            .unwrap()
            .into_iter()
            .map(|(_, g)| g.group_id)
            .collect();
        back.sort();
        let mut want = vec![gs[2].group_id, gs[3].group_id];
        want.sort();
        assert_eq!(back, want);
        assert!(batches(&jdir).unwrap().is_empty());
    }
}
