//! Why a connection failed, in an operator's words: a dial that never reached the peer
//! (refused, timed out, no route) against one that reached it and failed in the handshake
//! (the usual face of a different swarm key, or none where the swarm has one: pnet turns
//! every byte after its nonce into garbage for the other side), and the text of libp2p's
//! errors, whose `TransportError::Other` displays as nothing.
//!
//! Owns: the classification (pure, tested without a swarm). Must not touch: what the service
//! does about a failure (counters, warnings: `service/swarm_events.rs`).

use std::io::ErrorKind;

use libp2p::swarm::{DialError, ListenError};
use libp2p::TransportError;

/// What the log says after a handshake failure, on both sides.
pub(crate) const HANDSHAKE_HINT: &str = "the other side likely has a different swarm key \
     (network.psk_file), or one where this node has none (or the reverse), or is not an \
     echo-node; every node of a private swarm needs the same psk_file";

/// How a dial failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DialFailureKind {
    /// The peer was never reached: refused, timed out, no route.
    Unreachable,
    /// The peer was reached and the connection failed while it was being set up.
    Handshake,
    /// Anything else (no address, wrong peer id, aborted).
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DialFailure {
    pub kind: DialFailureKind,
    pub text: String,
}

/// I/O errors nested in one transport error that [`io_kind`] reads at most.
const MAX_ERROR_DEPTH: usize = 16;

/// The kind of an I/O error of a connection attempt. The transport stack wraps the socket's
/// error (DNS's `Multiple dial errors occurred`, a boxed `Other` around it), so every I/O
/// error in its source chain counts: one that says the peer was never reached decides. Pure.
pub(crate) fn io_kind(e: &std::io::Error) -> DialFailureKind {
    let unreachable = |k: ErrorKind| {
        matches!(
            k,
            ErrorKind::ConnectionRefused
                | ErrorKind::TimedOut
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable
                | ErrorKind::NotConnected
        )
    };
    let mut found = unreachable(e.kind());
    let mut next = e
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    for _ in 0..MAX_ERROR_DEPTH {
        let Some(err) = next else { break };
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            found |= unreachable(io.kind());
            next = io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static))
                .or_else(|| std::error::Error::source(io));
        } else {
            next = err.source();
        }
    }
    // Some layers break the chain (`either::Either` and `io::Error` pass their inner error's
    // source on, not the inner error), but every layer displays what it wraps: the OS's words
    // for a socket that never reached the peer (Linux's strerror texts) still say so.
    if !found {
        let text = e.to_string();
        found = UNREACHABLE_TEXTS.iter().any(|t| text.contains(t));
    }
    if found {
        DialFailureKind::Unreachable
    } else {
        DialFailureKind::Handshake
    }
}

/// What `std::io::Error` displays for the OS errors of [`io_kind`]'s unreachable kinds.
const UNREACHABLE_TEXTS: &[&str] = &[
    "Connection refused",
    "Connection timed out",
    "No route to host",
    "Network is unreachable",
    "Cannot assign requested address",
];

/// Classifies a failed dial and says it in words. Pure.
pub(crate) fn dial_failure(e: &DialError) -> DialFailure {
    match e {
        DialError::Transport(attempts) => {
            let kinds: Vec<DialFailureKind> = attempts
                .iter()
                .map(|(_, t)| match t {
                    TransportError::MultiaddrNotSupported(_) => DialFailureKind::Other,
                    TransportError::Other(io) => io_kind(io),
                })
                .collect();
            // One address that got as far as a handshake is the finding.
            let kind = if kinds.contains(&DialFailureKind::Handshake) {
                DialFailureKind::Handshake
            } else if kinds.contains(&DialFailureKind::Unreachable) {
                DialFailureKind::Unreachable
            } else {
                DialFailureKind::Other
            };
            let text = attempts
                .iter()
                .map(|(a, t)| format!("{a}: {}", crate::transport::transport_error_text(t)))
                .collect::<Vec<_>>()
                .join("; ");
            DialFailure { kind, text }
        }
        other => DialFailure {
            kind: DialFailureKind::Other,
            text: other.to_string(),
        },
    }
}

/// The text of an inbound connection's failure (its transport error in full).
pub(crate) fn listen_error_text(e: &ListenError) -> String {
    match e {
        ListenError::Transport(t) => crate::transport::transport_error_text(t),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dial(kind: ErrorKind) -> DialError {
        DialError::Transport(vec![(
            "/ip4/127.0.0.1/tcp/4001".parse().unwrap(),
            TransportError::Other(std::io::Error::new(kind, "boom")),
        )])
    }

    #[test]
    fn a_refused_dial_is_unreachable_and_a_reset_one_a_handshake_failure() {
        let f = dial_failure(&dial(ErrorKind::ConnectionRefused));
        assert_eq!(f.kind, DialFailureKind::Unreachable);
        assert!(
            f.text.contains("/ip4/127.0.0.1/tcp/4001") && f.text.contains("boom"),
            "{f:?}"
        );
        assert_eq!(
            dial_failure(&dial(ErrorKind::TimedOut)).kind,
            DialFailureKind::Unreachable
        );
        for k in [
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
            ErrorKind::InvalidData,
        ] {
            assert_eq!(
                dial_failure(&dial(k)).kind,
                DialFailureKind::Handshake,
                "{k:?}"
            );
        }
        assert_eq!(
            dial_failure(&DialError::Aborted).kind,
            DialFailureKind::Other
        );
    }

    /// What a dial to a stopped bootstrap peer gives through the DNS transport: a refused
    /// socket inside `Multiple dial errors occurred`, inside an `Other` I/O error.
    #[test]
    fn a_refused_dial_wrapped_by_the_transport_stack_is_unreachable() {
        let refused = std::io::Error::new(ErrorKind::ConnectionRefused, "refused");
        let dns: libp2p::dns::Error<std::io::Error> =
            libp2p::dns::Error::Dial(vec![libp2p::dns::Error::Transport(refused)]);
        let wrapped = std::io::Error::other(dns);
        assert_eq!(io_kind(&wrapped), DialFailureKind::Unreachable);
        let reset = std::io::Error::new(ErrorKind::ConnectionReset, "reset");
        let dns: libp2p::dns::Error<std::io::Error> =
            libp2p::dns::Error::Dial(vec![libp2p::dns::Error::Transport(reset)]);
        assert_eq!(
            io_kind(&std::io::Error::other(dns)),
            DialFailureKind::Handshake
        );
        // A layer whose `source` skips the socket's error still displays it.
        #[derive(Debug)]
        struct Opaque(std::io::Error);
        impl std::fmt::Display for Opaque {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "Multiple dial errors occurred:\n - {}", self.0)
            }
        }
        impl std::error::Error for Opaque {}
        let os = std::io::Error::from_raw_os_error(111);
        assert_eq!(os.kind(), ErrorKind::ConnectionRefused);
        let opaque = std::io::Error::other(Opaque(os));
        assert_eq!(io_kind(&opaque), DialFailureKind::Unreachable);
        let garbage = std::io::Error::other(Opaque(std::io::Error::from_raw_os_error(104)));
        assert_eq!(io_kind(&garbage), DialFailureKind::Handshake, "a reset one");
    }
}
