//! Fresh congestion state for a bulk transfer on a long-lived TCP connection.
//!
//! Why: one libp2p connection per peer carries both the bulk chunk streams and the small
//! control traffic (gossip, heartbeats, identify). Between two snapshot pushes the connection
//! only carries the small messages, and Linux's BBR (v1, the kernel's `bbr`) then loses its
//! model of the path: when its `min_rtt` has not been refreshed for 10 s it enters PROBE_RTT
//! (congestion window 4 packets for 200 ms), and a few kilobytes of gossip queued in that
//! window are delivered *congestion-window-limited*, which BBR takes as a genuine bandwidth
//! sample (≈ 4 packets per round trip: 0.46 Mbit/s at 100 ms). Once the 10-round window of
//! its bandwidth max-filter has passed over the idle period, that sample is the estimate, and
//! the next push starts at it and grows by only 25 % per eight round trips (PROBE_BW). Measured
//! in the netlab (`docs/netlab.md`, "Fresh congestion state"): at 100 ms RTT one push in five
//! to ten started on a connection whose BBR estimate had fallen to 0.24–0.48 Mbit/s and took
//! 10–17 s for 64 MB instead of 5.5 s.
//!
//! What: [`SocketRegistry`] remembers every TCP socket the transport made (through
//! [`SocketRegistry::track`], which wraps the socket in [`TrackedTcp`]) and, once the
//! connection is authenticated, the peer on the other end ([`SocketRegistry::bind`]). Before
//! a push, [`SocketRegistry::restart`] reads BBR's bandwidth estimate of each socket to that
//! peer (`TCP_CC_INFO`) and, where it is below [`STALE_BELOW`] of the rate the push will be
//! paced at, re-initialises the congestion control: it switches the socket to `reno` and back
//! (`TCP_CONGESTION`), which runs BBR's initialisation again — STARTUP from the current
//! window, doubling per round trip — instead of the stale estimate. Only sockets whose
//! algorithm is `bbr` are touched: others have no bandwidth model to lose, and the switch
//! needs no privileges (`reno` and the socket's own algorithm are always permitted). On
//! systems other than Linux it does nothing.
//!
//! Which models to restart is the caller's rate (`dissemination`): a node that paces its
//! pushes itself (an uplink cap below the path's capacity) passes an infinite rate, so every
//! BBR model is restarted — the push is app-limited, BBR does not leave STARTUP on
//! app-limited rounds, and STARTUP's larger window (2.89 × the bandwidth-delay product, not
//! 2 ×) rides out a loss's recovery: N = 8 chains at 100 ms / 0.5 % took 1.21 × their bound
//! this way against 1.46 × with models kept. A node without a cap passes B̂w, since there the
//! path is the bottleneck and a restart's STARTUP overshoot queues at it (1.64 × when every
//! push restarted, 1.43 × with every model kept): its sound model is kept.
//!
//! Owns: the registry and the socket wrapper. Must not touch: the sockets' data (the wrapper
//! only forwards reads and writes), or any socket option other than reading `TCP_CC_INFO`
//! and setting `TCP_CONGESTION`. The one `unsafe` call of the crate (`getsockopt` for
//! `TCP_CC_INFO`, which neither the standard library nor `socket2` offers) is here.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};

use futures::{AsyncRead, AsyncWrite};
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

/// One tracked socket.
struct Entry {
    remote: SocketAddr,
    peer: Option<PeerId>,
    socket: Weak<tokio::net::TcpStream>,
}

/// The TCP sockets of this node's connections (cheap to clone; shared by the transport, which
/// adds to it, and the [`crate::Client`], which restarts them).
#[derive(Clone)]
pub struct SocketRegistry {
    entries: Arc<Mutex<Vec<Entry>>>,
    /// `network.restart_congestion`: when off, [`SocketRegistry::restart`] does nothing.
    enabled: bool,
}

impl SocketRegistry {
    pub fn new(enabled: bool) -> Self {
        SocketRegistry {
            entries: Arc::default(),
            enabled,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        // Closed sockets (their stream dropped) leave: the list stays as long as the set of
        // open connections.
        entries.retain(|e| e.socket.strong_count() > 0);
        entries
    }

    /// Wraps a socket the TCP transport made; the registry holds it weakly.
    pub fn track(&self, stream: libp2p::tcp::tokio::TcpStream) -> TrackedTcp {
        let socket = Arc::new(stream.0);
        if let Ok(remote) = socket.peer_addr() {
            self.lock().push(Entry {
                remote,
                peer: None,
                socket: Arc::downgrade(&socket),
            });
        }
        TrackedTcp { socket }
    }

    /// Records that the connection at `endpoint` (just authenticated) is to `peer`: every
    /// tracked socket to that remote address not yet bound to a peer.
    pub fn bind(&self, endpoint: &ConnectedPoint, peer: PeerId) {
        let Some(remote) = socket_addr(endpoint.get_remote_address()) else {
            return; // a relayed or QUIC connection: no TCP socket of ours
        };
        for e in self.lock().iter_mut() {
            if e.remote == remote && e.peer.is_none() {
                e.peer = Some(peer);
            }
        }
    }

    /// Re-initialises the congestion control of every open BBR socket to `peer` whose
    /// bandwidth estimate is below `rate_bytes_per_s × STALE_BELOW` (module docs); returns how
    /// many were restarted.
    pub fn restart(&self, peer: &PeerId, rate_bytes_per_s: f64) -> usize {
        if !self.enabled {
            return 0;
        }
        let sockets: Vec<Arc<tokio::net::TcpStream>> = self
            .lock()
            .iter()
            .filter(|e| e.peer.as_ref() == Some(peer))
            .filter_map(|e| e.socket.upgrade())
            .collect();
        // The strong references keep each socket open until its option is set.
        let below = rate_bytes_per_s * STALE_BELOW;
        sockets
            .iter()
            .filter(|s| reinit_stale_bbr(s, below).unwrap_or(false))
            .count()
    }

    /// Open sockets tracked (bound or not).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// `/ip4|ip6/A/tcp/P[/…]` as a socket address.
fn socket_addr(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut it = addr.iter();
    let ip: IpAddr = match it.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    match it.next()? {
        Protocol::Tcp(port) => Some(SocketAddr::new(ip, port)),
        _ => None,
    }
}

/// The socket's congestion-control algorithm, without the kernel's NUL padding.
#[cfg(target_os = "linux")]
fn algorithm(socket: &tokio::net::TcpStream) -> io::Result<Vec<u8>> {
    let mut name = socket2::SockRef::from(socket).tcp_congestion()?;
    while name.last() == Some(&0) {
        name.pop();
    }
    Ok(name)
}

/// A BBR estimate below this fraction of the push's pacing rate is stale. In PROBE_BW BBR
/// paces at its estimate, so below the push's rate BBR itself is the bottleneck, and it climbs
/// back by only a quarter per eight round trips (0.8 s at 100 ms): from 80 % one such cycle
/// restores the rate, from less STARTUP (doubling per round trip) is quicker. A link that runs
/// at exactly the push's rate keeps an estimate at about that rate, above the line, so its
/// sound model is not thrown away. The collapsed estimates seen in the lab were 200–400 times
/// too low, partly decayed ones about half the rate.
pub const STALE_BELOW: f64 = 0.8;

/// BBR's current bandwidth estimate of `socket` in bytes per second (`TCP_CC_INFO`, struct
/// `tcp_bbr_info`), or `None` when its algorithm is not BBR.
#[cfg(target_os = "linux")]
fn bbr_estimate(socket: &tokio::net::TcpStream) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    if algorithm(socket)? != b"bbr" {
        return Ok(None);
    }
    // struct tcp_bbr_info { u32 bbr_bw_lo, bbr_bw_hi, bbr_min_rtt, bbr_pacing_gain,
    // bbr_cwnd_gain; } (linux/inet_diag.h, unchanged since 4.9).
    let mut info = [0u32; 5];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the descriptor belongs to `socket`, borrowed for the call; `info` is a writable
    // buffer of `len` bytes that outlives it, and the kernel writes at most `len` bytes.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CC_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < 8 {
        return Ok(None);
    }
    Ok(Some(u64::from(info[1]) << 32 | u64::from(info[0])))
}

/// Switches a BBR socket whose estimate is below `below` bytes/s to `reno` and back, which
/// re-runs BBR's initialisation; returns whether it did.
#[cfg(target_os = "linux")]
fn reinit_stale_bbr(socket: &tokio::net::TcpStream, below: f64) -> io::Result<bool> {
    let estimate = bbr_estimate(socket)?;
    let stale = estimate.is_some_and(|bw| (bw as f64) < below);
    tracing::trace!(
        estimate_mbps = estimate.map(|bw| bw as f64 * 8e-6),
        below_mbps = below * 8e-6,
        stale,
        "BBR model before a push"
    );
    if !stale {
        return Ok(false);
    }
    let s = socket2::SockRef::from(socket);
    s.set_tcp_congestion(b"reno")?;
    s.set_tcp_congestion(b"bbr")?;
    Ok(true)
}

#[cfg(not(target_os = "linux"))]
fn reinit_stale_bbr(_: &tokio::net::TcpStream, _: f64) -> io::Result<bool> {
    Ok(false)
}

/// A TCP socket of the transport, shared with the [`SocketRegistry`]: reads and writes go
/// straight to the socket (readiness, then a non-blocking call, as tokio's own stream does).
#[derive(Debug)]
pub struct TrackedTcp {
    socket: Arc<tokio::net::TcpStream>,
}

impl TrackedTcp {
    /// Waits for `ready`, then runs the non-blocking `op`; a spurious readiness (the call
    /// would block) clears it and waits again.
    fn poll_io<T>(
        &self,
        cx: &mut Context<'_>,
        ready: fn(&tokio::net::TcpStream, &mut Context<'_>) -> Poll<io::Result<()>>,
        mut op: impl FnMut(&tokio::net::TcpStream) -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        loop {
            ready!(ready(&self.socket, cx))?;
            match op(&self.socket) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

impl AsyncRead for TrackedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_io(cx, tokio::net::TcpStream::poll_read_ready, |s| {
            s.try_read(buf)
        })
    }
}

impl AsyncWrite for TrackedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_io(cx, tokio::net::TcpStream::poll_write_ready, |s| {
            s.try_write(buf)
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_io(cx, tokio::net::TcpStream::poll_write_ready, |s| {
            s.try_write_vectored(bufs)
        })
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // TCP_NODELAY is set: nothing is held back in user space.
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(
            match socket2::SockRef::from(&*self.socket).shutdown(std::net::Shutdown::Write) {
                Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                r => r,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair on loopback, the dialing side tracked.
    async fn pair(reg: &SocketRegistry) -> (TrackedTcp, tokio::net::TcpStream, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialed, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let tracked = reg.track(libp2p::tcp::tokio::TcpStream(dialed.unwrap()));
        (tracked, accepted.unwrap().0, addr)
    }

    fn dialer(addr: SocketAddr) -> ConnectedPoint {
        ConnectedPoint::Dialer {
            address: format!("/ip4/{}/tcp/{}", addr.ip(), addr.port())
                .parse()
                .unwrap(),
            role_override: libp2p::core::Endpoint::Dialer,
            port_use: libp2p::core::transport::PortUse::New,
        }
    }

    #[tokio::test]
    async fn bytes_pass_through_and_closing_ends_the_stream() {
        use futures::{AsyncReadExt, AsyncWriteExt};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let reg = SocketRegistry::new(true);
        let (mut tracked, mut other, _) = pair(&reg).await;
        tracked.write_all(b"chunk bytes").await.unwrap();
        tracked.close().await.unwrap();
        let mut got = Vec::new();
        other.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"chunk bytes", "everything arrives, then EOF");
        other.write_all(b"reply").await.unwrap();
        let mut buf = [0u8; 5];
        tracked.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"reply");
    }

    #[tokio::test]
    async fn only_the_bound_peers_stale_bbr_sockets_are_restarted() {
        use futures::AsyncWriteExt;
        use tokio::io::AsyncReadExt;
        let reg = SocketRegistry::new(true);
        let (mut tracked, mut other, addr) = pair(&reg).await;
        let (peer, stranger) = (PeerId::random(), PeerId::random());
        assert_eq!(reg.len(), 1);
        assert_eq!(reg.restart(&peer, f64::MAX), 0, "not bound yet");
        reg.bind(&dialer(addr), peer);
        assert_eq!(
            reg.restart(&stranger, f64::MAX),
            0,
            "another peer's sockets are not touched"
        );
        #[cfg(target_os = "linux")]
        if socket2::SockRef::from(&*tracked.socket)
            .set_tcp_congestion(b"bbr")
            .is_ok()
        {
            use futures::AsyncReadExt as _;
            use tokio::io::AsyncWriteExt as _;
            // Give BBR a model: 8 MB across loopback. The reader's one-byte reply carries the
            // acknowledgement of every byte, so once it is read nothing is in flight and no
            // later ACK can change the estimate under the assertions.
            let reader = tokio::spawn(async move {
                let mut sink = vec![0u8; 8 << 20];
                other.read_exact(&mut sink).await?;
                other.write_all(b"k").await?;
                Ok::<_, io::Error>(other)
            });
            let block = vec![7u8; 1 << 20];
            for _ in 0..8 {
                tracked.write_all(&block).await.unwrap();
            }
            let mut reply = [0u8; 1];
            tracked.read_exact(&mut reply).await.unwrap();
            let _other = reader.await.unwrap().unwrap();
            let bw = bbr_estimate(&tracked.socket)
                .unwrap()
                .expect("a BBR socket");
            assert!(bw > 0, "BBR measured the transfer");
            // An estimate at or above 80 % of the push's rate is kept …
            assert_eq!(reg.restart(&peer, 1.0), 0);
            assert_eq!(bbr_estimate(&tracked.socket).unwrap(), Some(bw));
            // … one below it is re-initialised: BBR starts over with an empty bandwidth
            // filter, on BBR again.
            assert_eq!(reg.restart(&peer, 4.0 * bw as f64), 1);
            assert_eq!(bbr_estimate(&tracked.socket).unwrap(), Some(0));
            assert_eq!(algorithm(&tracked.socket).unwrap(), b"bbr");
        }
        let off = SocketRegistry::new(false);
        let (_kept, _o, addr) = pair(&off).await;
        off.bind(&dialer(addr), peer);
        assert_eq!(
            off.restart(&peer, f64::MAX),
            0,
            "switched off (network.restart_congestion)"
        );
        drop(tracked);
        assert_eq!(reg.len(), 0, "a closed socket leaves the registry");
    }

    #[test]
    fn only_tcp_addresses_map_to_sockets() {
        let tcp: Multiaddr =
            "/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWLUquq8U2nfcuJAscFJ1dUpJVCYRCAcGbwsLWzqj9tHmz"
                .parse()
                .unwrap();
        assert_eq!(socket_addr(&tcp), Some("10.0.0.1:4001".parse().unwrap()));
        let quic: Multiaddr = "/ip4/10.0.0.1/udp/4001/quic-v1".parse().unwrap();
        assert_eq!(socket_addr(&quic), None);
        let relayed: Multiaddr = "/p2p-circuit".parse().unwrap();
        assert_eq!(socket_addr(&relayed), None);
    }
}
