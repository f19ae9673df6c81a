//! `ChunkStore`: content-addressed snapshot chunks and the manifests that list them (`docs/storage.md`).
//!
//! Layout under the store's root (see `docs/storage.md`):
//! - `chunks/<hh>/<hash hex>`: one file per chunk, named by its BLAKE3 hash (`hh` = first two
//!   hex digits). Large blobs stay out of sled (sled's own advice; `docs/storage.md`).
//! - `chunks/tmp/`: partially written chunks; emptied at open.
//! - `index/` (sled): tree `chunks` (hash → length, u64 BE), tree `manifests`
//!   (version u64 BE → signed manifest encoding).
//!
//! A chunk is published only after its bytes hashed to the expected value, by writing a temp
//! file and renaming it into place, so a chunk file is always complete and correct unless the disk
//! itself corrupts it — and every read from disk verifies the hash again. Chunk files are not
//! fsynced: they are a verified cache that can always be fetched again; at open the index is
//! reconciled with the files. Manifests are flushed before `put_manifest` returns.
//!
//! Chunks received over the network and published by the learner go through a bounded memory
//! tier first (`put_chunk_deferred`, see [`crate::hot`]): held in memory, served and assembled
//! from there, and written to disk by a background thread.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::error::{Result, StorageError};
use crate::hot::Hot;
use crate::manifest::{hash_bytes, hash_hex, Hash, SignedManifest};

/// Default bound of the memory tier (bytes): a few snapshots of the models this node is tested
/// with, a few hundred chunks of a large one.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;

pub struct ChunkStore {
    root: PathBuf,
    db: sled::Db,
    chunks: sled::Tree,
    manifests: sled::Tree,
    keep: usize,
    hot: Arc<Hot>,
    writer: Option<JoinHandle<()>>,
    /// `index/watermark` ([`crate::watermark`]): 1 + the newest manifest version ever stored
    /// (garbage collection always keeps the newest), and that value.
    mark_path: PathBuf,
    mark: std::sync::Mutex<u64>,
}

/// The watermark's counter: 1 + the newest manifest version stored (0: none yet).
const MARK_NEWEST: &str = "newest_manifest_plus_one";

/// What publishing a snapshot stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishStats {
    pub new_chunks: usize,
    pub reused_chunks: usize,
    pub new_bytes: u64,
}

/// What garbage collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    pub manifests_removed: usize,
    pub chunks_removed: usize,
    pub bytes_removed: u64,
}

/// Summary counts for `inspect` and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkStoreStats {
    pub chunks: usize,
    pub bytes: u64,
    pub manifests: usize,
}

impl ChunkStore {
    /// Opens (or creates) the store under `root`, keeping the last `keep` snapshots (≥ 1), with
    /// a memory tier of [`DEFAULT_MEMORY_BYTES`].
    pub fn open(root: &Path, keep: usize) -> Result<Self> {
        Self::open_with_memory(root, keep, DEFAULT_MEMORY_BYTES)
    }

    /// [`ChunkStore::open`] with a memory tier of `memory_bytes` (0: every chunk is written
    /// through, as `put_chunk` does).
    pub fn open_with_memory(root: &Path, keep: usize, memory_bytes: u64) -> Result<Self> {
        if keep == 0 {
            return Err(StorageError::invalid(
                "chunk store",
                "must keep at least 1 snapshot",
            ));
        }
        let chunk_dir = root.join("chunks");
        let tmp = chunk_dir.join("tmp");
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
        }
        fs::create_dir_all(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
        let index = root.join("index");
        let mark_path = index.join(crate::watermark::WATERMARK_FILE);
        let marks = crate::watermark::read(&mark_path)?;
        let damaged = |reason: String| StorageError::Damaged {
            path: index.join("db"),
            reason,
            recovery: format!(
                "restore {} from a backup, or move it away (e.g. `mv {0} {0}.damaged`): the node \
                 then starts without its snapshots' manifests and fetches them again (a learner \
                 resumes from its checkpoint)",
                index.display()
            ),
        };
        let db = crate::open_db(sled::Config::new().path(&index)).map_err(|e| match e {
            StorageError::Db(sled::Error::Corruption { at, .. }) => damaged(match at {
                Some(at) => format!("sled reports corruption at {at}"),
                None => "sled reports corruption (its log cannot be read)".into(),
            }),
            e => e,
        })?;
        let mut store = ChunkStore {
            root: root.to_path_buf(),
            chunks: db.open_tree("chunks")?,
            manifests: db.open_tree("manifests")?,
            db,
            keep,
            hot: Hot::new(memory_bytes),
            writer: None,
            mark_path,
            mark: std::sync::Mutex::new(0),
        };
        let newest = store.versions()?.last().map_or(0, |v| v + 1);
        if let Some(&mark) = marks.as_ref().and_then(|m| m.get(MARK_NEWEST)) {
            if newest < mark {
                return Err(damaged(format!(
                    "its newest manifest is {}, but its watermark ({}) recorded version {}: the \
                     file was truncated or overwritten",
                    newest
                        .checked_sub(1)
                        .map_or("none".into(), |v| v.to_string()),
                    store.mark_path.display(),
                    mark - 1
                )));
            }
        }
        store.raise_mark(newest)?;
        store.reconcile()?;
        if store.hot.enabled() {
            let (root, tree) = (store.root.clone(), store.chunks.clone());
            let persist = move |h: &Hash, b: &[u8]| persist_chunk(&root, &tree, h, b);
            store.writer = Some(
                store
                    .hot
                    .spawn_writer(store.root.clone(), Box::new(persist))
                    .map_err(|e| StorageError::io(&store.root, e))?,
            );
        }
        Ok(store)
    }

    fn chunk_path(&self, hash: &Hash) -> PathBuf {
        chunk_path(&self.root, hash)
    }

    /// The files are the truth for which chunks exist: index entries without a file are
    /// dropped, and files the index does not know (written just before a crash) are added.
    fn reconcile(&self) -> Result<()> {
        let mut on_disk = HashSet::new();
        let chunk_dir = self.root.join("chunks");
        for sub in fs::read_dir(&chunk_dir).map_err(|e| StorageError::io(&chunk_dir, e))? {
            let sub = sub.map_err(|e| StorageError::io(&chunk_dir, e))?;
            if sub.file_name() == "tmp" || !sub.path().is_dir() {
                continue;
            }
            for f in fs::read_dir(sub.path()).map_err(|e| StorageError::io(sub.path(), e))? {
                let f = f.map_err(|e| StorageError::io(sub.path(), e))?;
                let name = f.file_name();
                let parsed: Option<Hash> = name
                    .to_str()
                    .and_then(|n| hex::decode(n).ok())
                    .and_then(|v| v.try_into().ok());
                match parsed {
                    Some(h) => {
                        let len = f
                            .metadata()
                            .map_err(|e| StorageError::io(f.path(), e))?
                            .len();
                        if self.chunks.get(h)?.is_none() {
                            self.chunks.insert(h, &len.to_be_bytes())?;
                        }
                        on_disk.insert(h);
                    }
                    None => {
                        tracing::warn!(file = %f.path().display(), "ignoring stray file in chunk store")
                    }
                }
            }
        }
        for k in self.chunks.iter().keys() {
            let k = k?;
            if k.len() != 32 || !on_disk.contains(&<Hash>::try_from(k.as_ref()).unwrap_or_default())
            {
                self.chunks.remove(k)?;
            }
        }
        Ok(())
    }

    /// Whether the chunk is held (in memory or on disk).
    pub fn has_chunk(&self, hash: &Hash) -> Result<bool> {
        Ok(self.hot.contains(hash) || self.chunks.contains_key(hash)?)
    }

    /// Stores a chunk under its hash after checking that `bytes` hash to it, writing its file
    /// before returning. Returns `true` if the chunk was new, `false` if it was already held.
    /// Wrong bytes are refused with [`StorageError::HashMismatch`] and leave nothing behind.
    pub fn put_chunk(&self, hash: &Hash, bytes: &[u8]) -> Result<bool> {
        // Verify first, also for a chunk already held: wrong bytes are refused and never touch
        // the disk.
        verify(hash, bytes)?;
        if self.has_chunk(hash)? {
            return Ok(false);
        }
        persist_chunk(&self.root, &self.chunks, hash, bytes)?;
        Ok(true)
    }

    /// Like [`ChunkStore::put_chunk`], but the verified chunk goes to the memory tier and its
    /// file is written behind (at once when the tier is off or the chunk larger than it). May
    /// wait while the tier is full of chunks not yet written.
    pub fn put_chunk_deferred(&self, hash: &Hash, bytes: Bytes) -> Result<bool> {
        verify(hash, &bytes)?;
        self.store_verified(hash, bytes)
    }

    /// Stores bytes already verified against `hash` (memory tier or write-through).
    fn store_verified(&self, hash: &Hash, bytes: Bytes) -> Result<bool> {
        if self.chunks.contains_key(hash)? {
            return Ok(false);
        }
        if !self.hot.enabled() || !self.hot.fits(bytes.len()) {
            persist_chunk(&self.root, &self.chunks, hash, &bytes)?;
            return Ok(true);
        }
        Ok(self.hot.insert(*hash, bytes))
    }

    /// Blocks until every chunk of the memory tier has been written to disk.
    pub fn flush(&self) {
        self.hot.flush();
    }

    /// `(chunks, bytes)` held in memory and not yet written to disk.
    pub fn unpersisted(&self) -> (usize, u64) {
        self.hot.unpersisted()
    }

    /// A chunk's bytes if the memory tier holds it (no I/O, no re-hash).
    pub fn cached_chunk(&self, hash: &Hash) -> Option<Bytes> {
        self.hot.get(hash)
    }

    /// A chunk's bytes: from memory when held there (verified on arrival), else read from disk
    /// and verified again. A chunk file that no longer matches its hash (disk corruption) is
    /// removed and reported as [`StorageError::Corrupt`], so it is fetched again.
    pub fn get_chunk(&self, hash: &Hash) -> Result<Bytes> {
        if let Some(b) = self.hot.get(hash) {
            return Ok(b);
        }
        let path = self.chunk_path(hash);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.chunks.remove(hash)?;
                return Err(StorageError::NotFound {
                    what: "chunk",
                    key: hash_hex(hash),
                });
            }
            Err(e) => return Err(StorageError::io(&path, e)),
        };
        if &hash_bytes(&bytes) != hash {
            tracing::error!(chunk = %hash_hex(hash), "stored chunk is corrupt; removing it");
            let _ = fs::remove_file(&path);
            self.chunks.remove(hash)?;
            return Err(StorageError::Corrupt(format!(
                "chunk {} failed verification",
                hash_hex(hash)
            )));
        }
        Ok(Bytes::from(bytes))
    }

    /// Stores a manifest (durably). Store the manifest before its chunks: garbage collection
    /// keeps only chunks that some stored manifest references.
    pub fn put_manifest(&self, signed: &SignedManifest) -> Result<()> {
        signed.manifest.check()?;
        self.manifests
            .insert(signed.manifest.version.to_be_bytes(), signed.encode())?;
        self.db.flush()?;
        self.raise_mark(signed.manifest.version + 1)
    }

    /// Raises the watermark to `newest_plus_one` (after the manifest is on disk).
    fn raise_mark(&self, newest_plus_one: u64) -> Result<()> {
        let mut mark = self.mark.lock().unwrap_or_else(|p| p.into_inner());
        if newest_plus_one > *mark || !self.mark_path.exists() {
            crate::watermark::write(&self.mark_path, [(MARK_NEWEST, newest_plus_one.max(*mark))])?;
            *mark = newest_plus_one.max(*mark);
        }
        Ok(())
    }

    pub fn manifest(&self, version: u64) -> Result<Option<SignedManifest>> {
        self.manifests
            .get(version.to_be_bytes())?
            .map(|v| {
                SignedManifest::decode(&v)
                    .map_err(|e| StorageError::Corrupt(format!("stored manifest: {e}")))
            })
            .transpose()
    }

    pub fn latest_manifest(&self) -> Result<Option<SignedManifest>> {
        match self.manifests.last()? {
            Some((_, v)) => {
                Ok(Some(SignedManifest::decode(&v).map_err(|e| {
                    StorageError::Corrupt(format!("stored manifest: {e}"))
                })?))
            }
            None => Ok(None),
        }
    }

    /// Versions of the stored manifests, ascending.
    pub fn versions(&self) -> Result<Vec<u64>> {
        self.manifests
            .iter()
            .keys()
            .map(|k| {
                let k = k?;
                let a: [u8; 8] = k
                    .as_ref()
                    .try_into()
                    .map_err(|_| StorageError::Corrupt("manifest key".into()))?;
                Ok(u64::from_be_bytes(a))
            })
            .collect()
    }

    fn require_manifest(&self, version: u64) -> Result<SignedManifest> {
        self.manifest(version)?
            .ok_or_else(|| StorageError::NotFound {
                what: "manifest",
                key: format!("version {version}"),
            })
    }

    /// `(index, hash)` of every chunk of `version` not yet held.
    pub fn missing_chunks(&self, version: u64) -> Result<Vec<(usize, Hash)>> {
        let m = self.require_manifest(version)?;
        let mut out = Vec::new();
        for (i, h) in m.manifest.chunk_hashes.iter().enumerate() {
            if !self.has_chunk(h)? {
                out.push((i, *h));
            }
        }
        Ok(out)
    }

    /// Reassembles a complete snapshot and checks its total length and root hash.
    pub fn assemble(&self, version: u64) -> Result<Vec<u8>> {
        let m = self.require_manifest(version)?.manifest;
        let missing = self.missing_chunks(version)?.len();
        if missing > 0 {
            return Err(StorageError::Incomplete {
                version,
                missing,
                total: m.chunk_hashes.len(),
            });
        }
        let mut out = Vec::with_capacity(m.total_len as usize);
        // The root hash is computed while copying (one pass over the bytes, each chunk still
        // in cache).
        let mut root = blake3::Hasher::new();
        for (i, h) in m.chunk_hashes.iter().enumerate() {
            let bytes = self.get_chunk(h)?;
            if bytes.len() as u64 != m.chunk_len(i) {
                return Err(StorageError::Corrupt(format!(
                    "chunk {i} of v{version} has {} bytes, manifest says {}",
                    bytes.len(),
                    m.chunk_len(i)
                )));
            }
            out.extend_from_slice(&bytes);
            root.update(&bytes);
        }
        if *root.finalize().as_bytes() != m.root_hash {
            return Err(StorageError::Corrupt(format!(
                "v{version}: root hash mismatch after assembly"
            )));
        }
        Ok(out)
    }

    /// Learner side: stores the manifest and every chunk of `payload` (through the memory
    /// tier); chunks already held are not stored again (delta publication). Each chunk is checked
    /// against the manifest's hash for it — with the length check that proves the payload is the
    /// one the manifest describes, so the root hash is not recomputed here.
    /// The chunks held in memory are slices of `payload` (no copy).
    pub fn publish(&self, signed: &SignedManifest, payload: &Bytes) -> Result<PublishStats> {
        let m = &signed.manifest;
        let mismatch = || StorageError::invalid("snapshot", "payload does not match its manifest");
        if payload.len() as u64 != m.total_len {
            return Err(mismatch());
        }
        let pieces = m
            .chunk_hashes
            .iter()
            .enumerate()
            .map(|(i, h)| Some((h, payload.slice(m.chunk_range(i)?))))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(mismatch)?;
        if pieces.iter().any(|(h, bytes)| hash_bytes(bytes) != **h) {
            return Err(mismatch());
        }
        self.put_manifest(signed)?;
        let mut stats = PublishStats::default();
        for (h, bytes) in pieces {
            if self.has_chunk(h)? {
                stats.reused_chunks += 1;
                continue;
            }
            stats.new_chunks += 1;
            stats.new_bytes += bytes.len() as u64;
            self.store_verified(h, bytes)?;
        }
        Ok(stats)
    }

    /// Keeps the newest `keep` manifests, every base a kept delta needs and the published base
    /// a kept adapter version names ([`crate::deps::retained`], [`crate::deps::needs`]),
    /// deletes the others, then collects chunks no kept manifest references.
    pub fn retain(&self) -> Result<GcStats> {
        let mut links = std::collections::BTreeMap::new();
        for v in self.manifests.iter().values() {
            let m = SignedManifest::decode(&v?)?.manifest;
            links.insert(m.version, crate::deps::needs(m.payload));
        }
        let kept = crate::deps::retained(&links, self.keep);
        let mut dropped = 0;
        for v in links.keys().filter(|v| !kept.contains(v)) {
            self.manifests.remove(v.to_be_bytes())?;
            dropped += 1;
        }
        self.db.flush()?;
        let mut stats = self.collect_garbage()?;
        stats.manifests_removed = dropped;
        Ok(stats)
    }

    /// Deletes every chunk that no stored manifest references.
    pub fn collect_garbage(&self) -> Result<GcStats> {
        let mut referenced = BTreeSet::new();
        for v in self.manifests.iter().values() {
            let m = SignedManifest::decode(&v?)?;
            referenced.extend(m.manifest.chunk_hashes);
        }
        self.hot.retain(|h| referenced.contains(h));
        let mut stats = GcStats::default();
        for kv in self.chunks.iter() {
            let (k, v) = kv?;
            let Ok(h) = <Hash>::try_from(k.as_ref()) else {
                self.chunks.remove(&k)?;
                continue;
            };
            if referenced.contains(&h) {
                continue;
            }
            let path = self.chunk_path(&h);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&path, e)),
            }
            self.chunks.remove(&k)?;
            stats.chunks_removed += 1;
            stats.bytes_removed += v.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
        }
        self.db.flush()?;
        Ok(stats)
    }

    pub fn stats(&self) -> Result<ChunkStoreStats> {
        let mut s = ChunkStoreStats {
            manifests: self.manifests.len(),
            ..Default::default()
        };
        for v in self.chunks.iter().values() {
            s.chunks += 1;
            s.bytes += v?.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
        }
        Ok(s)
    }
}

fn chunk_path(root: &Path, hash: &Hash) -> PathBuf {
    let h = hash_hex(hash);
    root.join("chunks").join(&h[..2]).join(h)
}

/// Refuses bytes that do not hash to `hash`.
fn verify(hash: &Hash, bytes: &[u8]) -> Result<()> {
    let actual = hash_bytes(bytes);
    if &actual != hash {
        return Err(mismatch(hash, &actual));
    }
    Ok(())
}

/// Writes a verified chunk: a temp file renamed into place, then the index entry — so the index
/// never names a file that is not complete.
fn persist_chunk(root: &Path, index: &sled::Tree, hash: &Hash, bytes: &[u8]) -> Result<()> {
    let tmp = root.join("chunks").join("tmp").join(format!(
        "{}.{:016x}",
        hash_hex(hash),
        rand::random::<u64>()
    ));
    if let Err(e) = write_file(&tmp, bytes) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let dest = chunk_path(root, hash);
    let parent = dest.parent().expect("chunk path has a parent");
    fs::create_dir_all(parent).map_err(|e| StorageError::io(parent, e))?;
    fs::rename(&tmp, &dest).map_err(|e| StorageError::io(&dest, e))?;
    index.insert(hash, &(bytes.len() as u64).to_be_bytes())?;
    Ok(())
}

impl Drop for ChunkStore {
    /// Lets the writer persist what the memory tier still holds, then stops it.
    fn drop(&mut self) {
        self.hot.close();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn mismatch(expected: &Hash, actual: &Hash) -> StorageError {
    StorageError::HashMismatch {
        expected: hash_hex(expected),
        actual: hash_hex(actual),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).map_err(|e| StorageError::io(path, e))?;
    f.write_all(bytes).map_err(|e| StorageError::io(path, e))
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::manifest::{PayloadKind, SnapshotManifest};

    const CHUNK: u32 = 4096;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[9; 32])
    }

    fn payload(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ salt)
            .collect()
    }

    fn manifest(version: u64, payload: &[u8]) -> SignedManifest {
        let k = key();
        SnapshotManifest::build("s", version, [0; 32], payload, CHUNK, &k.verifying_key())
            .unwrap()
            .sign(&k)
            .unwrap()
    }

    fn tmp_is_empty(root: &Path) -> bool {
        fs::read_dir(root.join("chunks").join("tmp"))
            .unwrap()
            .next()
            .is_none()
    }

    #[test]
    fn wrong_bytes_are_refused_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path(), 2).unwrap();
        for len in [100usize, 200 << 10] {
            let good = payload(len, 1);
            let h = hash_bytes(&good);
            let mut bad = good.clone();
            bad[len / 2] ^= 0xff;
            assert!(matches!(
                s.put_chunk(&h, &bad),
                Err(StorageError::HashMismatch { .. })
            ));
            assert!(!s.has_chunk(&h).unwrap());
            assert!(tmp_is_empty(dir.path()));
            assert!(s.put_chunk(&h, &good).unwrap());
            assert!(!s.put_chunk(&h, &good).unwrap(), "second put is a no-op");
            assert!(matches!(
                s.put_chunk(&h, &bad),
                Err(StorageError::HashMismatch { .. })
            ));
            assert_eq!(s.get_chunk(&h).unwrap(), good);
        }
    }

    /// An index cut short (its manifests gone) is refused at open, naming the file, instead
    /// of opening without the snapshots it held; put back whole, it opens with them.
    #[test]
    fn a_truncated_index_is_refused_naming_its_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = ChunkStore::open_with_memory(dir.path(), 3, 0).unwrap();
            for v in 1..=3 {
                let p = payload(2 * CHUNK as usize, v as u8);
                s.publish(&manifest(v, &p), &Bytes::from(p)).unwrap();
            }
        }
        let db = dir.path().join("index").join("db");
        let whole = fs::read(&db).unwrap();
        fs::write(&db, &whole[..1000.min(whole.len() / 2)]).unwrap();
        let err = match ChunkStore::open(dir.path(), 3) {
            Ok(s) => panic!("opened with versions {:?}", s.versions().unwrap()),
            Err(e) => e,
        };
        assert!(matches!(err, StorageError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
        fs::write(&db, &whole).unwrap();
        let s = ChunkStore::open(dir.path(), 3).unwrap();
        assert_eq!(s.versions().unwrap(), [1, 2, 3]);
    }

    #[test]
    fn assemble_needs_every_chunk_and_returns_the_payload() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path(), 2).unwrap();
        let p = payload(3 * CHUNK as usize + 17, 2);
        let m = manifest(1, &p);
        s.put_manifest(&m).unwrap();
        assert_eq!(s.missing_chunks(1).unwrap().len(), 4);
        for (i, c) in p.chunks(CHUNK as usize).enumerate().skip(1) {
            s.put_chunk(&m.manifest.chunk_hashes[i], c).unwrap();
        }
        assert!(matches!(
            s.assemble(1),
            Err(StorageError::Incomplete {
                missing: 1,
                total: 4,
                ..
            })
        ));
        assert_eq!(
            s.missing_chunks(1).unwrap(),
            vec![(0, m.manifest.chunk_hashes[0])]
        );
        s.put_chunk(&m.manifest.chunk_hashes[0], &p[..CHUNK as usize])
            .unwrap();
        assert_eq!(s.assemble(1).unwrap(), p);
        assert!(matches!(s.assemble(7), Err(StorageError::NotFound { .. })));
    }

    #[test]
    fn deferred_chunks_are_held_in_memory_and_on_disk_after_a_clean_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = payload(3 * CHUNK as usize, 6);
        let m = manifest(1, &p);
        {
            let s = ChunkStore::open(dir.path(), 2).unwrap();
            s.put_manifest(&m).unwrap();
            let (h0, c0) = (m.manifest.chunk_hashes[0], &p[..CHUNK as usize]);
            let mut bad = c0.to_vec();
            bad[7] ^= 1;
            assert!(matches!(
                s.put_chunk_deferred(&h0, bad.into()),
                Err(StorageError::HashMismatch { .. })
            ));
            assert!(!s.has_chunk(&h0).unwrap(), "wrong bytes are not held");
            for (i, c) in p.chunks(CHUNK as usize).enumerate() {
                let h = &m.manifest.chunk_hashes[i];
                assert!(s.put_chunk_deferred(h, Bytes::copy_from_slice(c)).unwrap());
                assert!(!s.put_chunk_deferred(h, Bytes::copy_from_slice(c)).unwrap());
            }
            // Held (in memory or already written) and served without waiting for the disk.
            assert!(s.missing_chunks(1).unwrap().is_empty());
            assert_eq!(s.get_chunk(&h0).unwrap(), c0);
            assert_eq!(s.assemble(1).unwrap(), p);
        }
        // Dropping the store drained the writer: the files are there at reopen.
        let s = ChunkStore::open_with_memory(dir.path(), 2, 0).unwrap();
        assert_eq!(s.stats().unwrap().chunks, 3);
        assert_eq!(s.assemble(1).unwrap(), p);
        assert!(tmp_is_empty(dir.path()));
    }

    #[test]
    fn republishing_stores_only_changed_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path(), 3).unwrap();
        let p1 = payload(10 * CHUNK as usize, 3);
        let first = s
            .publish(&manifest(1, &p1), &Bytes::from(p1.clone()))
            .unwrap();
        assert_eq!((first.new_chunks, first.reused_chunks), (10, 0));
        let mut p2 = p1.clone();
        p2[5 * CHUNK as usize + 3] ^= 1; // one chunk of ten changes
        let second = s
            .publish(&manifest(2, &p2), &Bytes::from(p2.clone()))
            .unwrap();
        assert_eq!((second.new_chunks, second.reused_chunks), (1, 9));
        assert_eq!(second.new_bytes, u64::from(CHUNK));
        assert_eq!(s.assemble(2).unwrap(), p2);
        assert_eq!(s.assemble(1).unwrap(), p1);
        assert!(
            s.publish(&manifest(3, &p1), &Bytes::from(p2.clone()))
                .is_err(),
            "payload must match manifest"
        );
    }

    #[test]
    fn keeps_the_last_k_snapshots_and_collects_their_unshared_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path(), 2).unwrap();
        let shared = payload(CHUNK as usize, 7);
        let mut versions = Vec::new();
        for v in 1..=4u8 {
            let mut p = shared.clone();
            p.extend(payload(CHUNK as usize, 10 + v));
            s.publish(&manifest(u64::from(v), &p), &Bytes::from(p.clone()))
                .unwrap();
            versions.push(p);
        }
        // Published chunks are written behind; `stats` counts files.
        s.flush();
        assert_eq!(s.unpersisted(), (0, 0));
        assert_eq!(s.stats().unwrap().chunks, 5);
        let gc = s.retain().unwrap();
        assert_eq!((gc.manifests_removed, gc.chunks_removed), (2, 2));
        assert_eq!(gc.bytes_removed, 2 * u64::from(CHUNK));
        assert_eq!(s.versions().unwrap(), [3, 4]);
        assert_eq!(s.assemble(3).unwrap(), versions[2]);
        assert_eq!(s.assemble(4).unwrap(), versions[3]);
        assert_eq!(s.stats().unwrap().chunks, 3);
        let files = walk_files(&dir.path().join("chunks"));
        assert_eq!(files, 3, "chunk files of dropped snapshots are deleted");
    }

    /// Garbage collection knows what a delta needs: with `keep = 2`, the two newest versions
    /// (deltas) keep their base chain back to the keyframe; an older, superseded chain goes.
    #[test]
    fn retain_keeps_the_bases_of_kept_deltas() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path(), 2).unwrap();
        let k = key();
        // v1 keyframe, v2 delta on 1, v3 keyframe, v4 on 3, v5 on 4.
        for (v, base) in [
            (1u64, None),
            (2, Some(1)),
            (3, None),
            (4, Some(3)),
            (5, Some(4)),
        ] {
            let p = payload(CHUNK as usize, v as u8);
            let mut m =
                SnapshotManifest::build("s", v, [0; 32], &p, CHUNK, &k.verifying_key()).unwrap();
            if let Some(base_version) = base {
                m.payload = PayloadKind::Delta {
                    base_version,
                    full_root: [v as u8; 32],
                };
            }
            s.publish(&m.sign(&k).unwrap(), &Bytes::from(p)).unwrap();
        }
        s.flush();
        let gc = s.retain().unwrap();
        assert_eq!(
            s.versions().unwrap(),
            [3, 4, 5],
            "v5 and v4 need keyframe v3"
        );
        assert_eq!((gc.manifests_removed, gc.chunks_removed), (2, 2));
        assert!(s.missing_chunks(3).unwrap().is_empty());
    }

    fn walk_files(p: &Path) -> usize {
        fs::read_dir(p)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                if e.path().is_dir() {
                    walk_files(&e.path())
                } else {
                    1
                }
            })
            .sum()
    }

    #[test]
    fn corrupt_chunk_files_are_detected_removed_and_refetchable() {
        let dir = tempfile::tempdir().unwrap();
        let p = payload(2 * CHUNK as usize, 4);
        let m = manifest(1, &p);
        let h0 = m.manifest.chunk_hashes[0];
        {
            // Memory tier off: chunks are read back from their files.
            let s = ChunkStore::open_with_memory(dir.path(), 2, 0).unwrap();
            s.publish(&m, &Bytes::from(p.clone())).unwrap();
            let path = s.chunk_path(&h0);
            let mut bytes = fs::read(&path).unwrap();
            bytes[0] ^= 1;
            fs::write(&path, bytes).unwrap();
            assert!(matches!(s.get_chunk(&h0), Err(StorageError::Corrupt(_))));
            assert!(!s.has_chunk(&h0).unwrap());
            assert_eq!(s.missing_chunks(1).unwrap(), vec![(0, h0)]);
            s.put_chunk(&h0, &p[..CHUNK as usize]).unwrap();
            assert_eq!(s.assemble(1).unwrap(), p);
            // A chunk file deleted behind the store's back is noticed at reopen.
            fs::remove_file(s.chunk_path(&m.manifest.chunk_hashes[1])).unwrap();
        }
        let s = ChunkStore::open(dir.path(), 2).unwrap();
        assert_eq!(
            s.missing_chunks(1).unwrap(),
            vec![(1, m.manifest.chunk_hashes[1])]
        );
        assert_eq!(
            s.latest_manifest().unwrap().unwrap(),
            m,
            "manifests persist"
        );
    }

    #[test]
    fn index_is_rebuilt_from_files_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = payload(CHUNK as usize, 5);
        let h = hash_bytes(&p);
        {
            let s = ChunkStore::open(dir.path(), 1).unwrap();
            s.put_chunk(&h, &p).unwrap();
            // Simulate a crash that lost the (unflushed) index entry but kept the file.
            s.chunks.remove(h).unwrap();
            s.db.flush().unwrap();
            fs::write(
                dir.path().join("chunks").join("tmp").join("partial"),
                b"torn",
            )
            .unwrap();
        }
        let s = ChunkStore::open(dir.path(), 1).unwrap();
        assert!(s.has_chunk(&h).unwrap());
        assert!(
            tmp_is_empty(dir.path()),
            "partial writes are discarded at open"
        );
    }
}
