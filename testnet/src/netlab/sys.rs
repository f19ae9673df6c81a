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
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
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

/// Blocks SIGINT, SIGTERM and SIGHUP on the calling thread (and the threads it spawns
/// afterwards) and starts a thread that waits for them and then runs `on_signal(signal)`.
/// Child processes are unaffected: the standard library clears the signal mask of every
/// process it spawns.
pub fn on_termination(on_signal: impl FnOnce(i32) + Send + 'static) -> io::Result<()> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before any other use; the
    // set outlives every call that reads it.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` and `sig` are locals of this thread that outlive the call.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc == 0 {
            on_signal(sig);
        }
    });
    Ok(())
}
