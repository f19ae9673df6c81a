//! The one home of the small file-system and clock helpers every crate uses: an atomic,
//! durable whole-file write ([`write_atomic`]: temporary file, fsync, rename, fsync the
//! directory), the directory sync it ends with ([`sync_dir`]), and wall-clock milliseconds
//! ([`unix_ms`]).
//!
//! Owns: those helpers and nothing else. Must not touch: any file format (callers pass the
//! bytes).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the
/// new one, never a torn one: a temporary file beside it (`.<name>.<pid>.tmp`) is written
/// and fsynced, renamed over `path`, and the directory is fsynced so the rename is durable
/// too. On error the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_path(path);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Fsyncs a directory, making the renames and creations in it durable. A platform that
/// cannot open a directory (Windows) skips it.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all(),
        Err(_) if cfg!(windows) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The temporary file [`write_atomic`] writes first: hidden, beside `path`, named by this
/// process so that two processes never share one.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomic(&path, b"first, longer content").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state"], "no temporary file is left behind");
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomic(&path, b"kept").unwrap();
        // Renaming a file over a non-empty directory fails.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"").unwrap();
        assert!(write_atomic(&blocked, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["blocked", "state"]);
    }

    #[test]
    fn unix_ms_is_after_2020() {
        assert!(unix_ms() > 1_577_836_800_000);
    }
}
