//! A snapshot put together while its chunks arrive.
//!
//! Each verified chunk is copied to its offset in the payload buffer as soon as it is held, and
//! the root hash advances over the longest complete prefix. When the last chunk lands the
//! payload is ready and its root hash already known: installing needs no second pass over the
//! bytes (that pass — read every chunk back, copy it, hash the whole — was the largest cost
//! after the transfer itself, `docs/broadcast.md`). Chunks usually arrive in order along a chain,
//! so the root hash keeps up; out-of-order chunks (repair) are hashed when the gap before them
//! closes.
//!
//! Only chunks the caller verified against the manifest are added. The root hash is checked at
//! [`Assembly::finish`]; a mismatch (an inconsistent manifest) yields nothing, and the caller
//! falls back to assembling from the store, which reports the error.

use std::ops::Range;

use storage::manifest::chunk_range;
use storage::SnapshotManifest;

pub(crate) struct Assembly {
    buf: Vec<u8>,
    have: Vec<bool>,
    missing: usize,
    chunk_size: u32,
    root: blake3::Hasher,
    /// Chunks `[0, hashed)` have been fed to `root`.
    hashed: usize,
}

impl Assembly {
    pub(crate) fn new(m: &SnapshotManifest) -> Self {
        let n = m.chunk_hashes.len();
        Assembly {
            // Zeroed lazily by the OS: pages are touched as the chunks land.
            buf: vec![0; m.total_len as usize],
            have: vec![false; n],
            missing: n,
            chunk_size: m.chunk_size,
            root: blake3::Hasher::new(),
            hashed: 0,
        }
    }

    /// Where chunk `index` goes in `buf` (`storage::manifest::chunk_range`).
    fn range(&self, index: usize) -> Option<Range<usize>> {
        chunk_range(self.buf.len() as u64, self.chunk_size, index)
    }

    pub(crate) fn has(&self, index: usize) -> bool {
        self.have.get(index).copied().unwrap_or(true)
    }

    /// Copies verified chunk `index` into place (once; a repeat or a wrong length is ignored).
    pub(crate) fn add(&mut self, index: usize, bytes: &[u8]) {
        if self.has(index) {
            return;
        }
        let Some(r) = self.range(index) else {
            return;
        };
        if r.len() != bytes.len() {
            return;
        }
        self.buf[r].copy_from_slice(bytes);
        self.have[index] = true;
        self.missing -= 1;
        while self.hashed < self.have.len() && self.have[self.hashed] {
            if let Some(r) = self.range(self.hashed) {
                self.root.update(&self.buf[r]);
            }
            self.hashed += 1;
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// The payload, if every chunk is in and the root hash matches the manifest.
    pub(crate) fn finish(self, m: &SnapshotManifest) -> Option<Vec<u8>> {
        (self.is_complete() && *self.root.finalize().as_bytes() == m.root_hash).then_some(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;

    fn manifest(payload: &[u8], chunk: u32) -> SnapshotManifest {
        let key = SigningKey::from_bytes(&[3; 32]);
        SnapshotManifest::build("t", 1, [0; 32], payload, chunk, &key.verifying_key()).unwrap()
    }

    #[test]
    fn out_of_order_and_repeated_chunks_assemble_the_payload() {
        let payload: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let m = manifest(&payload, 4096);
        let mut a = Assembly::new(&m);
        let parts: Vec<&[u8]> = payload.chunks(4096).collect();
        for i in [3, 0, 9, 1, 1, 2, 8, 4, 5, 7] {
            a.add(i, parts[i]);
        }
        assert!(!a.is_complete(), "chunk 6 is missing");
        a.add(6, &parts[6][..10]); // wrong length: ignored
        assert!(!a.is_complete());
        a.add(6, parts[6]);
        assert_eq!(a.finish(&m).unwrap(), payload);
    }

    #[test]
    fn incomplete_or_inconsistent_assemblies_yield_nothing() {
        let payload = vec![5u8; 4 * 4096];
        let m = manifest(&payload, 4096);
        let mut a = Assembly::new(&m);
        a.add(0, &payload[..4096]);
        assert!(Assembly::new(&m).finish(&m).is_none());
        assert!(a.finish(&m).is_none());
        // Bytes that do not match the root hash (never verified chunks, a bad manifest).
        let mut a = Assembly::new(&m);
        for i in 0..4 {
            a.add(i, &[6u8; 4096]);
        }
        assert!(a.is_complete());
        assert!(a.finish(&m).is_none());
    }
}
