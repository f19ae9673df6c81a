//! Keeping freed memory in the process's heap while the learner trains on the CPU.
//!
//! Owns: one process-wide allocator setting ([`keep_freed_memory`]) and its outcome
//! ([`HeapSetting`]). Must not touch: anything but glibc's `mallopt` — no allocator of its own,
//! no GPU memory (on a GPU the tensors live on the device and none of this applies).
//!
//! Why. On a large model most of a CPU training step's tensors (a tied embedding's gradient:
//! 622 MB at Qwen3-0.6B; vocabulary-wide rows of 155 MB per 256 tokens)
//! are larger than glibc's mmap threshold (128 KiB, raised as large blocks are freed up to at
//! most 32 MiB). glibc serves each with a fresh `mmap` and unmaps it on `free`, so every step
//! faults in and zeroes all their pages again: `perf` puts a third of a Qwen3-0.6B-shaped CPU
//! step in the kernel's page clearing (`docs/gpu.md`, "Page faults at large shapes").
//!
//! What. Three `mallopt` settings:
//! - `M_ARENA_MAX = 1`: every thread allocates from the main heap. A thread's own arena grows
//!   in heaps of at most 64 MiB and glibc serves anything larger with `mmap` whatever
//!   `M_MMAP_MAX` says — and the node trains on a blocking thread of its runtime, not on `main`.
//!   The limit binds only threads that had not allocated yet, hence "before any other thread".
//! - `M_MMAP_MAX = 0`: no allocation is served with `mmap`; large blocks come from the heap.
//! - `M_TRIM_THRESHOLD = -1`: `free` never hands the heap's top back to the kernel, so the
//!   next step reuses those pages without a fault. (The largest positive value, `i32::MAX`,
//!   is not enough: a step frees more than 2 GiB at the top of the heap at once.)
//!
//! Cost: freed memory stays in the process, so its resident size stays at its peak plus the
//! heap's fragmentation (measured: +11–23 % peak RSS at Qwen3-0.6B's shape while AdamW
//! allocated temporaries, none at all layers since it runs in place); and every thread's
//! allocations take one arena's lock (no difference measured in the demo's steps per hour).
//! A node turns it off with `[learner] keep_freed_memory = false`.

/// What [`keep_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapSetting {
    /// All three settings are in place and no other thread had started: every thread shares
    /// the main heap.
    Kept,
    /// The settings are in place, but `threads` threads were already running: those that had
    /// allocated keep their own arenas, whose large blocks are still mapped and unmapped.
    KeptLate { threads: usize },
    /// `mallopt` refused the named option (the process's heap is unchanged from there on).
    Refused { option: &'static str },
    /// Not glibc on Linux: nothing was changed.
    Unsupported,
}

/// Keeps freed memory in the heap for the rest of the process (see the module's doc). Call it
/// once, first thing on the main thread of a process that trains on the CPU, before any other
/// thread starts (a runtime, a store with background threads, rayon's pool).
pub fn keep_freed_memory() -> HeapSetting {
    imp::keep_freed_memory()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use super::HeapSetting;

    pub(super) fn keep_freed_memory() -> HeapSetting {
        let threads = running_threads();
        let options = [
            ("M_ARENA_MAX", libc::M_ARENA_MAX, 1),
            ("M_MMAP_MAX", libc::M_MMAP_MAX, 0),
            // −1: no trimming at all (mallopt(3)). `i32::MAX` would still trim a top above
            // 2 GiB, which a large step's freed tensors exceed.
            ("M_TRIM_THRESHOLD", libc::M_TRIM_THRESHOLD, -1),
        ];
        for (option, param, value) in options {
            // SAFETY: `mallopt` only changes the allocator's parameters; glibc takes its own
            // lock for them, and these values are in the documented ranges.
            #[allow(unsafe_code)]
            let accepted = unsafe { libc::mallopt(param, value) } == 1;
            if !accepted {
                return HeapSetting::Refused { option };
            }
        }
        match threads {
            0 | 1 => HeapSetting::Kept,
            threads => HeapSetting::KeptLate { threads },
        }
    }

    /// The process's threads (Linux lists one directory per thread under `/proc/self/task`);
    /// 0 when that cannot be read.
    fn running_threads() -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    use super::HeapSetting;

    pub(super) fn keep_freed_memory() -> HeapSetting {
        HeapSetting::Unsupported
    }
}
