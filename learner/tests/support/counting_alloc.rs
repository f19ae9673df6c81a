//! A global allocator that counts: the system allocator, plus the heap bytes held now and the
//! most held at once since the last [`reset_peak`]. On the CPU a tensor is a heap allocation,
//! so the peak is what the tensors really took, without the allocator's slack. Shared by the
//! memory test (`tests/memory.rs`) and `examples/train_step.rs`, which include it by path and
//! install it with `#[global_allocator]`.
// Each including crate uses only some of it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// Heap bytes held now.
pub fn live() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

/// The most heap bytes held at once since the start or the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak from what is held now.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counters only
// observe the sizes. (A global allocator cannot be written without `unsafe`; this one is a
// measuring instrument of a test and a benchmark, not part of any library.)
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}
