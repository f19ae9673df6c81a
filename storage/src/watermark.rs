//! Watermarks: the monotonic counters a sled store had when it last wrote them, kept in a small
//! file beside the database. sled recovers a truncated or overwritten log by cutting it at the
//! first bad record, so a damaged file can open as an older or an empty store; the watermark is
//! how [`crate::TrajectoryStore`] and [`crate::ChunkStore`] notice that and refuse to start
//! instead of silently resetting (`docs/storage.md`, "Damaged stores").
//!
//! Format (text, written whole with [`crate::fs::write_atomic`]):
//! ```text
//! echo-watermark v1
//! <name> <u64>
//! …
//! ```
//! Owns: the file and the comparison ([`below`]). Must not touch: what the counters mean.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Result, StorageError};

/// File name of a store's watermark, inside the store's directory.
pub const WATERMARK_FILE: &str = "watermark";
const HEADER: &str = "echo-watermark v1";

/// Counter name → the value it had when the mark was written.
pub type Marks = BTreeMap<String, u64>;

/// Reads the watermark at `path` (`None` when there is none: a new store, or one written by a
/// version without watermarks). A file that is not a watermark is an error naming it.
pub fn read(path: &Path) -> Result<Option<Marks>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io(path, e)),
    };
    parse(&text).map(Some).ok_or_else(|| StorageError::Damaged {
        path: path.to_path_buf(),
        reason: format!("not a watermark file (first line must be `{HEADER}`)"),
        recovery: "restore the store from a backup, or remove this file if the store beside it is known to be intact".into(),
    })
}

fn parse(text: &str) -> Option<Marks> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Writes `marks` to `path` atomically.
pub fn write<'a>(path: &Path, marks: impl IntoIterator<Item = (&'a str, u64)>) -> Result<()> {
    let mut text = format!("{HEADER}\n");
    for (k, v) in marks {
        text.push_str(&format!("{k} {v}\n"));
    }
    crate::fs::write_atomic(path, text.as_bytes()).map_err(|e| StorageError::io(path, e))
}

/// The first counter of `now` below its mark: `(name, now, mark)`. A counter missing from
/// `now` reads as 0. Pure.
pub fn below(marks: &Marks, now: &[(&str, u64)]) -> Option<(String, u64, u64)> {
    marks.iter().find_map(|(k, &mark)| {
        let have = now.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
        (have < mark).then(|| (k.clone(), have, mark))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watermark_reads_back_and_a_counter_below_it_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WATERMARK_FILE);
        assert_eq!(read(&path).unwrap(), None);
        write(&path, [("produced", 20), ("consumed", 3)]).unwrap();
        let m = read(&path).unwrap().unwrap();
        assert_eq!(below(&m, &[("produced", 20), ("consumed", 3)]), None);
        assert_eq!(below(&m, &[("produced", 25), ("consumed", 4)]), None);
        assert_eq!(
            below(&m, &[("produced", 0), ("consumed", 0)]),
            Some(("consumed".into(), 0, 3))
        );
        assert_eq!(below(&m, &[]), Some(("consumed".into(), 0, 3)));
        std::fs::write(&path, b"garbage").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("watermark") && e.contains("damaged"), "{e}");
    }
}
