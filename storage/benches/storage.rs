//! Storage benchmarks (`cargo bench -p storage`). Numbers are recorded in `docs/storage.md`.
//!
//! - `group_put/single`: one durable `put_group` (one flush) per group.
//! - `group_put/batched_128`: `put_groups` of 128 groups (one transaction, one flush).
//! - `lease_ack/64`: lease 64 groups + ack the lease.
//! - `chunk/put_verified_1MiB` next to `chunk/blake3_raw_1MiB` and `chunk/file_write_raw_1MiB`
//!   (the I/O floor: write + rename, no hashing), in the same run.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use storage::record::testing::group;
use storage::{hash_bytes, ChunkStore, TrajectoryStore};

fn group_puts(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = TrajectoryStore::open(&dir.path().join("t")).unwrap();
    let mut seed = 0u64;
    let mut g = c.benchmark_group("group_put");
    g.throughput(Throughput::Elements(1));
    g.bench_function("single", |b| {
        b.iter(|| {
            seed += 1;
            store.put_group(&group(1, seed, 8, 64)).unwrap()
        })
    });
    g.throughput(Throughput::Elements(128));
    g.bench_function("batched_128", |b| {
        b.iter_batched(
            || {
                (0..128)
                    .map(|_| {
                        seed += 1;
                        group(1, seed, 8, 64)
                    })
                    .collect::<Vec<_>>()
            },
            |batch| store.put_groups(&batch).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn lease_ack(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = TrajectoryStore::open(&dir.path().join("t")).unwrap();
    let mut seed = 0u64;
    let mut g = c.benchmark_group("lease_ack");
    g.throughput(Throughput::Elements(64));
    g.bench_function("64", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batch: Vec<_> = (0..64)
                    .map(|_| {
                        seed += 1;
                        group(1, seed, 8, 64)
                    })
                    .collect();
                store.put_groups(&batch).unwrap();
                let t = Instant::now();
                let lease = store
                    .lease(0, 64, Duration::from_secs(30))
                    .unwrap()
                    .unwrap();
                store.ack(lease.id).unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

fn chunks(c: &mut Criterion) {
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(dir.path(), 1).unwrap();
    // A pool of distinct chunks so every put stores new bytes.
    let pool: Vec<(Vec<u8>, [u8; 32])> = (0..32u8)
        .map(|i| {
            let bytes: Vec<u8> = (0..MIB).map(|j| (j as u8).wrapping_mul(31) ^ i).collect();
            let h = hash_bytes(&bytes);
            (bytes, h)
        })
        .collect();
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("blake3_raw_1MiB", |b| b.iter(|| hash_bytes(&pool[0].0)));
    // The I/O floor: create + write + rename of a 1 MiB file, no hashing.
    let raw_dir = dir.path().join("raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    g.bench_function("file_write_raw_1MiB", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let tmp = raw_dir.join(format!("{i}.tmp"));
                let t = Instant::now();
                std::fs::write(&tmp, &pool[(i % 32) as usize].0).unwrap();
                std::fs::rename(&tmp, raw_dir.join(format!("{i}"))).unwrap();
                total += t.elapsed();
                if i % 32 == 31 {
                    // Not timed: delete, as garbage collection does for put_verified.
                    for j in i - 31..=i {
                        std::fs::remove_file(raw_dir.join(format!("{j}"))).unwrap();
                    }
                }
            }
            total
        })
    });
    g.bench_function("put_verified_1MiB", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut i = 0;
            while i < iters {
                for (bytes, h) in pool.iter().take((iters - i) as usize) {
                    let t = Instant::now();
                    assert!(store.put_chunk(h, bytes).unwrap());
                    total += t.elapsed();
                    i += 1;
                }
                // Not timed: forget the chunks so the next round stores them anew.
                store.collect_garbage().unwrap();
            }
            total
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1)).sample_size(20);
    targets = group_puts, lease_ack, chunks
}
criterion_main!(benches);
