//! The few system calls the lab needs that the standard library lacks: entering a network
//! namespace on one thread (`setns`), attaching to a TUN device (`TUNSETIFF`) and waiting on
//! several file descriptors (`poll`).
//!
//! This is the only module of the testnet with `unsafe` code, allowed here alone: each block
//! is one FFI call on a file descriptor this module owns or borrows for the call's duration,
//! with pointers to locals that outlive the call. Owns no policy: what to open where is
//! [`super::ns`]'s and [`super::tun`]'s.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// The bind mount `ip netns add NAME` creates for a namespace.
pub fn netns_path(name: &str) -> String {
    format!("/var/run/netns/{name}")
}

/// Runs `f` on a new thread that has entered the network namespace `name`, and returns its
/// result. Sockets and devices created by `f` stay in that namespace after the thread ends;
/// the calling thread's namespace is untouched.
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = File::open(netns_path(name))?;
    std::thread::spawn(move || {
        // SAFETY: `ns` is an open namespace file for the whole call; setns only changes this
        // thread's network namespace.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Creates (or attaches to) the TUN device `ifname` (L3, no packet-info header) in the
/// network namespace `ns`; returns its file, non-blocking. The device exists while the file
/// is open (it is not made persistent), so closing it removes the device.
pub fn open_tun(ns: &str, ifname: &str) -> io::Result<File> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    let name = ifname.to_string();
    in_netns(ns, move || {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // struct ifreq: the name (IFNAMSIZ bytes, NUL-terminated), then the flags (a short);
        // 40 bytes covers the union on every Linux ABI.
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        ifr[libc::IFNAMSIZ..libc::IFNAMSIZ + 2].copy_from_slice(&flags.to_ne_bytes());
        // SAFETY: `file` is an open /dev/net/tun descriptor; `ifr` is a writable 40-byte
        // buffer laid out as struct ifreq and outlives the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, ifr.as_mut_ptr()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(file)
    })
}

/// Waits until one of `files` is readable or `timeout` has passed; returns, per file, whether
/// it is readable (or has an error condition, which the next read reports).
pub fn poll_readable(files: &[&File], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut fds: Vec<libc::pollfd> = files
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // Round up so that a timer due in 0.3 ms does not turn into a busy loop of 0-ms polls.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structs for the whole call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; files.len()]);
        }
        return Err(e);
    }
    Ok(fds.iter().map(|p| p.revents != 0).collect())
}

/// The write end of the self-pipe the signal handler reports to (-1: none installed).
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// The signal handler: writes the signal's number to the self-pipe (`write` is
/// async-signal-safe; nothing else is done here).
extern "C" fn on_signal_handler(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: `fd` is the pipe's write end, open for the life of the process; `b` is a
        // local byte that outlives the call.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// Installs a handler for SIGINT, SIGTERM and SIGHUP that wakes a thread (through a
/// self-pipe), which runs `on_signal(signal)`. Handlers, unlike blocked signal masks, are
/// reset to the default in every process this one executes, so child processes still stop on
/// SIGTERM. Call once.
pub fn on_termination(on_signal: impl FnOnce(i32) + Send + 'static) -> io::Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a live two-element array the call fills in.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fds[0]` was just created by pipe2 and is owned by nothing else.
    let mut reader = unsafe { File::from_raw_fd(fds[0]) };
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let handler = on_signal_handler as extern "C" fn(libc::c_int);
        // SAFETY: the handler only calls `write` on a descriptor that stays open.
        if unsafe { libc::signal(s, handler as libc::sighandler_t) } == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        if matches!(reader.read(&mut b), Ok(1)) {
            on_signal(i32::from(b[0]));
        }
    });
    Ok(())
}
