//! `learner::heap::keep_freed_memory`: a block allocated and freed on a thread that is not
//! `main` (where the node's learner trains) comes from the heap and stays there, instead of
//! being mapped and unmapped — even a block above 2 GiB, which `M_TRIM_THRESHOLD = i32::MAX`
//! would hand back (a large step frees that much at once).
//!
//! The setting is process-wide and must precede every other thread, so this test is its own
//! `main` (no harness) and runs each case in a child process of its own: `kept` (the setting
//! first), `default` (no setting: the control, which shows that the measurement sees a mapped
//! block) and `late` (the setting after a thread has allocated: reported as such, and that
//! thread's large blocks are still mapped). A child prints what glibc's `mallinfo2` counted.

use std::process::Command;

const CASE: &str = "ECHO_HEAP_TEST_CASE";
/// The block of the `default` and `late` cases.
const BLOCK: usize = 256 << 20;
/// The block of the `kept` case: above `i32::MAX` bytes.
const LARGE_BLOCK: usize = 5 << 29;

fn main() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert_eq!(
            learner::heap::keep_freed_memory(),
            learner::heap::HeapSetting::Unsupported
        );
        println!("heap: not glibc, only the Unsupported outcome is checked");
        return;
    }
    match std::env::var(CASE).as_deref() {
        Ok(case) => child::run(case),
        Err(_) => parent(),
    }
}

/// What a child measured around its thread's block.
#[derive(Debug)]
struct Measured {
    /// Bytes glibc had mapped for allocations while the block was alive, above what it had
    /// mapped before.
    mapped_during: u64,
    /// Free bytes held in the heap after the block was freed.
    free_after: u64,
}

fn measure(case: &str) -> Measured {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .env(CASE, case)
        .output()
        .expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "case {case} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| -> u64 {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("case {case}: no {name} in {stdout:?}"))
    };
    Measured {
        mapped_during: field("mapped_during"),
        free_after: field("free_after"),
    }
}

fn parent() {
    let block = BLOCK as u64;
    // The control first: without the setting the block is mapped and handed back, so the
    // measurement below would see a broken setting.
    let default = measure("default");
    assert!(
        default.mapped_during >= block && default.free_after < block,
        "without the setting a {block}-byte block on a thread is mapped and unmapped: {default:?}"
    );
    let kept = measure("kept");
    let large = LARGE_BLOCK as u64;
    assert!(
        kept.mapped_during < large,
        "with the setting the block came from the heap, not a mapping: {kept:?}"
    );
    assert!(
        kept.free_after >= large,
        "with the setting the freed {large}-byte block stays in the heap: {kept:?}"
    );
    // Too late for a thread that already has its own arena: reported, and that thread's block
    // is still mapped (why the node sets it before opening its stores).
    let late = measure("late");
    assert!(
        late.mapped_during >= block,
        "a thread with its own arena still maps: {late:?}"
    );
    println!("heap: default {default:?}, kept {kept:?}, late {late:?}");
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod child {
    use learner::heap::{keep_freed_memory, HeapSetting};

    use super::{BLOCK, LARGE_BLOCK};

    pub fn run(case: &str) {
        match case {
            "default" => print_block_on(std::thread::spawn(|| block_on_this_thread(BLOCK))),
            "kept" => {
                assert_eq!(keep_freed_memory(), HeapSetting::Kept);
                print_block_on(std::thread::spawn(|| block_on_this_thread(LARGE_BLOCK)));
            }
            "late" => {
                // A thread that allocates (and so gets an arena of its own) before the setting.
                let (go, wait) = std::sync::mpsc::channel::<()>();
                let (ready, started) = std::sync::mpsc::channel::<()>();
                let early = std::thread::spawn(move || {
                    drop(std::hint::black_box(vec![1u8; 4096]));
                    ready.send(()).expect("parent waits");
                    wait.recv().expect("parent says go");
                    block_on_this_thread(BLOCK)
                });
                started.recv().expect("the early thread started");
                match keep_freed_memory() {
                    HeapSetting::KeptLate { threads } => assert!(threads >= 2, "{threads}"),
                    other => panic!("a setting after a thread started is late, got {other:?}"),
                }
                go.send(()).expect("early thread waits");
                print_block_on(early);
            }
            other => panic!("unknown case {other}"),
        }
    }

    fn print_block_on(thread: std::thread::JoinHandle<(u64, u64)>) {
        let (mapped_during, free_after) = thread.join().expect("block thread");
        println!("mapped_during={mapped_during} free_after={free_after}");
    }

    /// Allocates, writes and frees one block of `bytes` on the calling thread; returns the
    /// bytes mapped for it and the heap's free bytes after.
    fn block_on_this_thread(bytes: usize) -> (u64, u64) {
        // SAFETY: `mallinfo2` only reads the allocator's counters.
        let before = unsafe { libc::mallinfo2() };
        let block = std::hint::black_box(vec![1u8; bytes]);
        let during = unsafe { libc::mallinfo2() };
        drop(block);
        let after = unsafe { libc::mallinfo2() };
        (
            during.hblkhd.saturating_sub(before.hblkhd) as u64,
            after.fordblks as u64,
        )
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod child {
    pub fn run(_case: &str) {}
}
