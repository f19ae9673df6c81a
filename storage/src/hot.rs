//! The chunk store's memory tier: verified chunks held in memory and written to disk behind the
//! caller's back (write-behind).
//!
//! Why: a relaying worker must verify a chunk and pass it on at once (store-and-forward per
//! chunk, ECHO-2 §4.2). Writing it to a file first, then reading it back and hashing it again to
//! forward it, put three extra passes over every byte on the forwarding path — measured as the
//! largest cost of a hop (`docs/broadcast.md`). With this tier a chunk is hashed once on
//! arrival, kept in memory, forwarded and assembled from memory, and persisted by a background
//! thread.
//!
//! Rules:
//! - Only verified bytes enter (the caller hashed them against the manifest).
//! - A chunk stays in memory at least until its file and index entry exist, so `has_chunk`
//!   never flickers: it is answered by the memory tier until the index knows the chunk. A
//!   chunk whose write fails is dropped (logged): kept, it could never be evicted.
//! - Memory is bounded by `capacity` bytes: persisted chunks are evicted oldest first; when
//!   every held chunk is still unpersisted, an insert waits for the writer (back-pressure
//!   reaches the network stream, never unbounded memory).
//! - Memory is trusted: a chunk read from this tier is not hashed again. Chunks read from disk
//!   still are (see `ChunkStore::get_chunk`).
//! - Writing yields to transfers: the writer starts once no chunk has entered or been read
//!   from the tier for [`IDLE`], when the tier is more than half full, or when asked to flush. A transfer thus
//!   gets the CPU and the disk first, the files follow right after it (measured in
//!   `docs/broadcast.md`).
//! - Dropping the store drains the queue: a clean shutdown persists everything received. After
//!   a crash the chunks not yet written are simply missing and fetched again.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::manifest::{hash_hex, Hash};

/// How long the tier must see no activity (a chunk in or out) before the writer starts.
pub(crate) const IDLE: Duration = Duration::from_millis(100);

struct Entry {
    bytes: Bytes,
    persisted: bool,
}

struct State {
    map: HashMap<Hash, Entry>,
    /// Insertion order, for eviction (may name chunks already removed).
    order: VecDeque<Hash>,
    /// Bytes of every chunk in `map`.
    bytes: u64,
    /// Chunks waiting for the writer, oldest first.
    queue: VecDeque<Hash>,
    /// Chunks the writer is writing now (0 or 1).
    writing: usize,
    /// The last insert or read.
    last_active: Instant,
    /// Callers waiting in `flush` (the writer does not wait for idleness then).
    flushing: usize,
    /// Inserts waiting for the writer to make room (back-pressure).
    waiting: usize,
    closing: bool,
}

impl State {
    fn new() -> Self {
        State {
            map: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            queue: VecDeque::new(),
            writing: 0,
            last_active: Instant::now(),
            flushing: 0,
            waiting: 0,
            closing: false,
        }
    }

    /// How long the writer should still hold back (`None`: write now).
    fn hold_back(&self, capacity: u64) -> Option<Duration> {
        if self.closing || self.flushing > 0 || self.bytes.saturating_mul(2) > capacity {
            return None;
        }
        IDLE.checked_sub(self.last_active.elapsed())
            .filter(|d| !d.is_zero())
    }
}

pub(crate) struct Hot {
    capacity: u64,
    state: Mutex<State>,
    /// Signalled when the queue grows (writer) or a chunk is persisted (inserters, flush).
    changed: Condvar,
}

/// Writes one verified chunk to disk and its index; `Ok(())` also when it already exists.
pub(crate) type Persist = dyn Fn(&Hash, &[u8]) -> crate::Result<()> + Send + Sync;

impl Hot {
    pub(crate) fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Hot {
            capacity,
            state: Mutex::new(State::new()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Whether `bytes` can be held at all (larger chunks are written through).
    pub(crate) fn fits(&self, len: usize) -> bool {
        len as u64 <= self.capacity
    }

    pub(crate) fn contains(&self, hash: &Hash) -> bool {
        self.lock().map.contains_key(hash)
    }

    /// A held chunk (counts as activity: a push or serve is reading the tier).
    pub(crate) fn get(&self, hash: &Hash) -> Option<Bytes> {
        let mut st = self.lock();
        let b = st.map.get(hash).map(|e| e.bytes.clone());
        if b.is_some() {
            st.last_active = Instant::now();
        }
        b
    }

    /// Holds `bytes` (verified) and queues it for writing. Returns `false` if it was already
    /// held. Waits while the tier is full of unpersisted chunks.
    pub(crate) fn insert(&self, hash: Hash, bytes: Bytes) -> bool {
        let len = bytes.len() as u64;
        let mut st = self.lock();
        loop {
            if st.map.contains_key(&hash) {
                return false;
            }
            if st.bytes + len <= self.capacity || evict(&mut st, self.capacity - len) {
                break;
            }
            st.waiting += 1;
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting -= 1;
        }
        st.bytes += len;
        st.map.insert(
            hash,
            Entry {
                bytes,
                persisted: false,
            },
        );
        st.order.push_back(hash);
        st.queue.push_back(hash);
        st.last_active = Instant::now();
        drop(st);
        self.changed.notify_all();
        true
    }

    /// Drops every held chunk `keep` rejects (garbage collection). Unpersisted ones are dropped
    /// too: nothing references them any more.
    pub(crate) fn retain(&self, keep: impl Fn(&Hash) -> bool) {
        let mut st = self.lock();
        let State { map, bytes, .. } = &mut *st;
        map.retain(|h, e| {
            let k = keep(h);
            if !k {
                *bytes -= e.bytes.len() as u64;
            }
            k
        });
        let State {
            map, order, queue, ..
        } = &mut *st;
        order.retain(|h| map.contains_key(h));
        queue.retain(|h| map.contains_key(h));
        drop(st);
        self.changed.notify_all();
    }

    /// `(chunks, bytes)` not yet on disk.
    pub(crate) fn unpersisted(&self) -> (usize, u64) {
        let st = self.lock();
        st.map
            .values()
            .filter(|e| !e.persisted)
            .fold((0, 0), |(n, b), e| (n + 1, b + e.bytes.len() as u64))
    }

    /// Blocks until every queued chunk has been written (or failed to be).
    pub(crate) fn flush(&self) {
        let mut st = self.lock();
        st.flushing += 1;
        self.changed.notify_all();
        while !st.queue.is_empty() || st.writing > 0 {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.flushing -= 1;
    }

    /// Starts the writer thread.
    pub(crate) fn spawn_writer(
        self: &Arc<Self>,
        root: PathBuf,
        persist: Box<Persist>,
    ) -> std::io::Result<JoinHandle<()>> {
        let hot = self.clone();
        std::thread::Builder::new()
            .name("chunk-writer".into())
            .spawn(move || hot.writer(&root, &*persist))
    }

    fn writer(&self, root: &std::path::Path, persist: &Persist) {
        loop {
            let (hash, bytes) = {
                let mut st = self.lock();
                loop {
                    if !st.queue.is_empty() {
                        if let Some(wait) = st.hold_back(self.capacity) {
                            st = self
                                .changed
                                .wait_timeout(st, wait)
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                            continue;
                        }
                    }
                    if let Some(h) = st.queue.pop_front() {
                        if let Some(e) = st.map.get(&h) {
                            let b = e.bytes.clone();
                            st.writing += 1;
                            break (h, b);
                        }
                        continue;
                    }
                    if st.closing {
                        return;
                    }
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let result = persist(&hash, &bytes);
            let mut st = self.lock();
            st.writing -= 1;
            match result {
                Ok(()) => {
                    if let Some(e) = st.map.get_mut(&hash) {
                        e.persisted = true;
                    }
                }
                Err(e) => {
                    // Dropped, not kept: a chunk that can never be written could never be
                    // evicted either, and would fill the tier. The store no longer holds it;
                    // whoever needs it fetches it again.
                    if let Some(e) = st.map.remove(&hash) {
                        st.bytes -= e.bytes.len() as u64;
                    }
                    tracing::error!(
                        store = %root.display(),
                        chunk = %hash_hex(&hash),
                        error = %e,
                        "writing a verified chunk to disk failed; dropped"
                    );
                }
            }
            drop(st);
            self.changed.notify_all();
        }
    }

    /// Lets the writer finish the queue and exit.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.changed.notify_all();
    }
}

/// Evicts persisted chunks, oldest first, until at most `limit` bytes are held. Returns whether
/// it got there.
fn evict(st: &mut State, limit: u64) -> bool {
    let mut i = 0;
    while st.bytes > limit && i < st.order.len() {
        let h = st.order[i];
        match st.map.get(&h) {
            None => {
                st.order.remove(i);
            }
            Some(e) if e.persisted => {
                st.bytes -= e.bytes.len() as u64;
                st.map.remove(&h);
                st.order.remove(i);
            }
            Some(_) => i += 1,
        }
    }
    st.bytes <= limit
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn h(i: u8) -> Hash {
        [i; 32]
    }

    #[test]
    fn chunks_are_written_behind_and_evicted_only_once_persisted() {
        let hot = Hot::new(3);
        let written = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let (w, g) = (written.clone(), gate.clone());
        let t = hot
            .spawn_writer(
                PathBuf::from("mem"),
                Box::new(move |_, _| {
                    let _open = g.lock().unwrap();
                    w.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
        for i in 0..3 {
            assert!(hot.insert(h(i), Bytes::from(vec![i])));
        }
        assert!(!hot.insert(h(0), Bytes::from(vec![0])), "already held");
        assert_eq!(hot.unpersisted(), (3, 3));
        // Full of unpersisted chunks: a fourth insert must wait for the writer.
        let hot2 = hot.clone();
        let inserter = std::thread::spawn(move || hot2.insert(h(3), Bytes::from(vec![3])));
        let deadline = Instant::now() + Duration::from_secs(10);
        while hot.lock().waiting == 0 {
            assert!(!inserter.is_finished(), "insert did not wait for space");
            assert!(Instant::now() < deadline, "the insert never blocked");
            std::thread::yield_now();
        }
        assert!(!inserter.is_finished(), "insert did not wait for space");
        assert_eq!(written.load(Ordering::SeqCst), 0);
        drop(held);
        assert!(inserter.join().unwrap());
        hot.flush();
        assert_eq!(written.load(Ordering::SeqCst), 4);
        assert_eq!(hot.unpersisted(), (0, 0));
        // The oldest persisted chunk made room for the fourth.
        assert!(!hot.contains(&h(0)));
        assert_eq!(hot.get(&h(3)).unwrap().as_ref(), &[3]);
        hot.close();
        t.join().unwrap();
    }

    #[test]
    fn a_chunk_that_cannot_be_written_is_dropped_and_frees_its_space() {
        let hot = Hot::new(2);
        let t = hot
            .spawn_writer(
                PathBuf::from("mem"),
                Box::new(|_, _| Err(crate::StorageError::Corrupt("disk full".into()))),
            )
            .unwrap();
        assert!(hot.insert(h(1), Bytes::from(vec![1, 1])));
        hot.flush();
        assert!(!hot.contains(&h(1)));
        assert_eq!(hot.unpersisted(), (0, 0));
        // The tier is not left full: a new chunk goes in without waiting for space.
        assert!(hot.insert(h(2), Bytes::from(vec![2, 2])));
        hot.close();
        t.join().unwrap();
    }

    #[test]
    fn retain_drops_unreferenced_chunks_even_before_they_are_written() {
        let hot = Hot::new(100);
        assert!(hot.insert(h(1), Bytes::from(vec![1; 10])));
        assert!(hot.insert(h(2), Bytes::from(vec![2; 10])));
        hot.retain(|x| *x == h(2));
        assert!(!hot.contains(&h(1)));
        assert_eq!(hot.unpersisted(), (1, 10));
        // The writer never sees the dropped chunk.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let t = hot
            .spawn_writer(
                PathBuf::from("mem"),
                Box::new(move |h, _| {
                    s.lock().unwrap().push(*h);
                    Ok(())
                }),
            )
            .unwrap();
        hot.flush();
        hot.close();
        t.join().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![h(2)]);
    }
}
