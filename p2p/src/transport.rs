//! Transport: TCP (optionally wrapped in a pnet pre-shared-key layer) + noise + yamux, and QUIC
//! when no pre-shared key is configured (pnet cannot wrap QUIC's own handshake).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use libp2p::core::muxing::{StreamMuxer, StreamMuxerBox};
use libp2p::core::transport::Boxed;
use libp2p::core::upgrade::Version;
use libp2p::core::ConnectedPoint;
use libp2p::core::Transport;
use libp2p::identity::Keypair;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::{noise, quic, tcp, yamux, Multiaddr, PeerId};

use crate::congestion::SocketRegistry;
use crate::error::P2pError;

/// Reads a pre-shared key file in the standard format:
/// `/key/swarm/psk/1.0.0/` newline `/base16/` newline 64 hex digits.
pub fn load_psk(path: &Path) -> Result<PreSharedKey, P2pError> {
    let err = |reason: String| P2pError::Psk {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    PreSharedKey::from_str(text.trim()).map_err(|e| {
        err(format!(
            "{e} (expected `/key/swarm/psk/1.0.0/`, `/base16/`, 64 hex digits on three lines)"
        ))
    })
}

/// The file contents of a pre-shared key in the standard format.
pub fn psk_file_contents(key: [u8; 32]) -> String {
    format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", hex::encode(key))
}

/// Fingerprint of a key (safe to log: it does not reveal the key).
pub fn psk_fingerprint(psk: &PreSharedKey) -> String {
    psk.fingerprint().to_string()
}

/// TCP [+ pnet] + noise + yamux (default config: yamux's auto-tuned window), plus QUIC if `quic`.
/// Every TCP socket is tracked in `sockets`, bound to its peer once authenticated (so that a
/// push can restart its congestion control: [`crate::congestion`]).
pub(crate) fn build_transport(
    key: &Keypair,
    psk: Option<PreSharedKey>,
    quic: bool,
    sockets: SocketRegistry,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, P2pError> {
    let noise = noise::Config::new(key).map_err(|e| P2pError::Transport(e.to_string()))?;
    let tracker = sockets.clone();
    let base = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
        .map(move |socket, _| tracker.track(socket));
    let tcp = match psk {
        Some(psk) => base
            .and_then(move |socket, _| PnetConfig::new(psk).handshake(socket))
            .upgrade(Version::V1)
            .authenticate(noise)
            .multiplex(yamux::Config::default())
            .timeout(Duration::from_secs(20))
            .map(bind(sockets.clone()))
            .boxed(),
        None => base
            .upgrade(Version::V1)
            .authenticate(noise)
            .multiplex(yamux::Config::default())
            .timeout(Duration::from_secs(20))
            .map(bind(sockets.clone()))
            .boxed(),
    };
    if !quic {
        return Ok(tcp);
    }
    let quic = quic::tokio::Transport::new(quic::Config::new(key))
        .map(|(p, c), _| (p, StreamMuxerBox::new(c)));
    Ok(tcp
        .or_transport(quic)
        .map(|either, _| either.into_inner())
        .boxed())
}

/// The last step of the TCP upgrade: records the authenticated peer of the connection's
/// socket in `sockets`, and boxes the muxer.
fn bind<M>(
    sockets: SocketRegistry,
) -> impl FnOnce((PeerId, M), ConnectedPoint) -> (PeerId, StreamMuxerBox) + Clone
where
    M: StreamMuxer + Send + 'static,
    M::Substream: Send + 'static,
    M::Error: Send + Sync + 'static,
{
    move |(p, m), endpoint| {
        sockets.bind(&endpoint, p);
        (p, StreamMuxerBox::new(m))
    }
}

/// The socket a listen address binds: `(ip:port, udp)`, for `/ip4|ip6/…/tcp|udp/P…`
/// addresses (not relay circuits, not DNS names). Pure.
pub fn bind_target(addr: &Multiaddr) -> Option<(std::net::SocketAddr, bool)> {
    use libp2p::multiaddr::Protocol;
    let (mut ip, mut port, mut udp) = (None, None, false);
    for p in addr.iter() {
        match p {
            Protocol::Ip4(a) => ip = Some(std::net::IpAddr::V4(a)),
            Protocol::Ip6(a) => ip = Some(std::net::IpAddr::V6(a)),
            Protocol::Tcp(p) => port = Some(p),
            Protocol::Udp(p) => {
                port = Some(p);
                udp = true;
            }
            Protocol::P2pCircuit => return None,
            _ => {}
        }
    }
    Some((std::net::SocketAddr::new(ip?, port?), udp))
}

/// What the error of a bind that failed says to an operator.
pub fn bind_failure(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "another process is already listening on this port ({e}): stop it (a node still \
             running?) or pick another port (0 = any)"
        ),
        std::io::ErrorKind::AddrNotAvailable => {
            format!("not an address of this machine ({e})")
        }
        _ => e.to_string(),
    }
}

/// Binds each fixed-port listen address once, *without* `SO_REUSEPORT`, and lets it go: the
/// swarm's own listeners set `SO_REUSEPORT` (libp2p reuses the listening port for outbound
/// dials, which hole punching needs), and with it a second node on the same address would
/// start and split the inbound connections with the first. A socket without the option cannot
/// bind beside one that listens, so a port another process holds is found here, before
/// anything is created. Port 0 and relay circuits are not probed.
pub fn probe_listen_addrs(listen: &[String]) -> Result<(), P2pError> {
    for a in listen {
        let Ok(addr) = a.parse::<Multiaddr>() else {
            continue; // the config's validation names it
        };
        let Some((sa, udp)) = bind_target(&addr).filter(|(sa, _)| sa.port() != 0) else {
            continue;
        };
        let bound = if udp {
            std::net::UdpSocket::bind(sa).map(drop)
        } else {
            std::net::TcpListener::bind(sa).map(drop)
        };
        bound.map_err(|e| P2pError::Listen {
            addr: a.clone(),
            reason: bind_failure(&e),
        })?;
    }
    Ok(())
}

/// The text of a `listen_on` error: libp2p's `TransportError::Other` displays as nothing, so
/// its inner error is shown (with its source chain).
pub fn transport_error_text(e: &libp2p::TransportError<std::io::Error>) -> String {
    match e {
        libp2p::TransportError::MultiaddrNotSupported(a) => {
            format!("no transport of this node can listen on {a}")
        }
        libp2p::TransportError::Other(io) => {
            let mut text = match io.kind() {
                std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable => {
                    bind_failure(io)
                }
                _ => io.to_string(),
            };
            let mut src = std::error::Error::source(io);
            while let Some(s) = src {
                text.push_str(&format!(": {s}"));
                src = s.source();
            }
            text
        }
    }
}

/// The QUIC listen addresses `network.quic_auto_listen` adds: for each `/ip4|ip6/…/tcp/P`
/// address (not a relay circuit) whose IP has no QUIC address in `listen` yet, the same IP on
/// `/udp/P/quic-v1` (port 0 stays 0: any free port). Pure, so the rule is tested without a
/// swarm; the service listens on the result.
pub fn quic_companions(listen: &[Multiaddr]) -> Vec<Multiaddr> {
    use libp2p::multiaddr::Protocol;
    let is_quic = |a: &Multiaddr| a.iter().any(|p| matches!(p, Protocol::QuicV1));
    fn ip_of(a: &Multiaddr) -> Option<Protocol<'_>> {
        a.iter()
            .find(|p| matches!(p, Protocol::Ip4(_) | Protocol::Ip6(_)))
    }
    let mut out: Vec<Multiaddr> = Vec::new();
    for a in listen {
        if a.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
            continue;
        }
        let mut parts = a.iter();
        let (Some(ip), Some(Protocol::Tcp(port)), None) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if !matches!(ip, Protocol::Ip4(_) | Protocol::Ip6(_)) {
            continue;
        }
        let taken = listen
            .iter()
            .chain(out.iter())
            .any(|b| is_quic(b) && ip_of(b) == Some(ip.clone()));
        if !taken {
            out.push(
                Multiaddr::empty()
                    .with(ip)
                    .with(Protocol::Udp(port))
                    .with(Protocol::QuicV1),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<Multiaddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn quic_companions_mirror_tcp_addresses_once() {
        assert_eq!(
            quic_companions(&addrs(&["/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/tcp/4001"])),
            addrs(&[
                "/ip4/127.0.0.1/udp/0/quic-v1",
                "/ip4/0.0.0.0/udp/4001/quic-v1"
            ])
        );
        // An IP that already has a QUIC address, or listed twice, gets no (second) companion.
        assert_eq!(
            quic_companions(&addrs(&[
                "/ip4/0.0.0.0/tcp/4001",
                "/ip4/0.0.0.0/udp/4002/quic-v1",
                "/ip6/::1/tcp/0",
                "/ip6/::1/tcp/5",
            ])),
            addrs(&["/ip6/::1/udp/0/quic-v1"])
        );
        // Relay circuits and DNS names are left alone.
        let relay = crate::peer_id_from_seed([3; 32]);
        assert!(quic_companions(&addrs(&[
            &format!("/ip4/127.0.0.1/tcp/1/p2p/{relay}/p2p-circuit"),
            "/dns4/example.org/tcp/1",
        ]))
        .is_empty());
    }

    #[test]
    fn psk_file_roundtrip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("psk");
        std::fs::write(&p, psk_file_contents([7u8; 32])).unwrap();
        let k = load_psk(&p).unwrap();
        assert_eq!(k, PreSharedKey::new([7u8; 32]));
        std::fs::write(&p, "not a key").unwrap();
        assert!(load_psk(&p)
            .unwrap_err()
            .to_string()
            .contains("/key/swarm/psk/1.0.0/"));
        assert!(load_psk(&dir.path().join("missing")).is_err());
    }
}
