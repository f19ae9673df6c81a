//! The `[network]` section of a node's config.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Network settings. Unknown keys are rejected when parsing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// libp2p multiaddrs to listen on, e.g. `/ip4/127.0.0.1/tcp/0` or
    /// `/ip4/0.0.0.0/udp/4001/quic-v1`.
    pub listen: Vec<String>,
    /// Multiaddrs (ending in `/p2p/<peer id>`) of peers to dial at start and re-dial while
    /// disconnected.
    pub bootstrap: Vec<String>,
    /// Local-network discovery with mDNS.
    pub mdns: bool,
    /// Admin HTTP endpoint (`/status`, `/metrics`); must be a loopback address.
    pub admin: String,
    /// Private swarm: file holding the libp2p pre-shared key (`/key/swarm/psk/1.0.0/`, `/base16/`,
    /// 64 hex digits). When set, only TCP is used (pnet does not apply to QUIC) and a node
    /// without the same key cannot complete a handshake.
    pub psk_file: Option<PathBuf>,
    /// Private swarm: when non-empty, only these peer ids may hold a connection to this node.
    pub allow_list: Vec<String>,
    /// Enable the QUIC transport next to TCP (ignored — forced off — when `psk_file` is set).
    pub quic: bool,
    /// How often this node gossips its heartbeat, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// Declared cost of this node in $/h, gossiped in heartbeats (the scheduler's c_i).
    pub cost_per_hour: f64,
    /// Relay servers (multiaddrs ending in `/p2p/<peer id>`) to reserve a slot on, so that
    /// peers behind NAT can reach this node via `/p2p-circuit` (public testnets).
    pub relays: Vec<String>,
    /// Ask peers to probe our reachability (AutoNAT).
    pub autonat: bool,
    /// The node keeps at most this many connections open to discovered peers (bootstrap and
    /// allow-listed peers excepted); discovery stops dialing beyond it.
    pub max_peers: u32,
    /// Cap on this node's bulk-stream uploads (chunk pushes and fetch responses), Mbit/s;
    /// `0` = unlimited. Enforced in the node with a token bucket (`ratelimit`). On a worker it
    /// is also the forwarding bandwidth it can offer.
    pub uplink_mbps: f64,
    /// Cap on this node's bulk-stream downloads, Mbit/s; `0` = unlimited.
    pub downlink_mbps: f64,
    /// The learner's uplink budget `B0` for snapshot dissemination, Mbit/s: it caps the
    /// learner's bulk uploads and sets the number of chains `N_ch = max(1, ⌊B0/B̂w⌋)`;
    /// `0` = unlimited uploads (and one chain per 100 Mbit/s of `uplink_mbps`, see
    /// `dissemination`). Ignored on workers.
    pub learner_mbps: f64,
    /// A peer is banned for the run once this many strikes (evidence of bad data, checked by
    /// this node) were counted against it; at least 1. See `docs/security.md`.
    pub ban_after_strikes: u32,
    /// Most inbound connections held at once (all peers together).
    pub max_inbound: u32,
    /// Most connections held with one peer, both directions together (a relayed one, a direct
    /// one after hole punching, and one simultaneous dial).
    pub max_per_peer: u32,
    /// Most inbound connections still in their handshake at once.
    pub max_pending_inbound: u32,
    /// Also listen on QUIC next to every `/tcp/` listen address (same IP; UDP port 0 when the
    /// TCP port is 0, else the same number), unless QUIC is off or a QUIC address for that IP
    /// is already listed.
    pub quic_auto_listen: bool,
    /// Addresses this node is reachable at that it cannot see itself (a public IP or DNS name
    /// in front of a `0.0.0.0` listener or a port forward), announced to peers; a relay hands
    /// them out with its reservations.
    pub external_addrs: Vec<String>,
    /// Offer circuit relay service to other peers (a `relay` node always does). On a learner
    /// or worker the service is advertised only while the node has a confirmed public address
    /// (AutoNAT), so switching it on behind a NAT does nothing.
    pub relay_service: bool,
    /// Relay server limits (a `relay` node, or `relay_service = true`): reservations held at
    /// once, in total and per peer.
    pub relay_max_reservations: u32,
    pub relay_max_reservations_per_peer: u32,
    /// How long a reservation lasts before its holder must renew it, in seconds.
    pub relay_reservation_duration_s: u64,
    /// Circuits (relayed connections) open at once, in total and per peer.
    pub relay_max_circuits: u32,
    pub relay_max_circuits_per_peer: u32,
    /// Bytes one circuit may carry (both directions, MiB) before the relay closes it; a
    /// relayed worker receives every snapshot through its circuit, so this must exceed the
    /// snapshot size.
    pub relay_max_circuit_mb: u64,
    /// How long one circuit may stay open, in seconds.
    pub relay_max_circuit_duration_s: u64,
    /// Before each snapshot push, give the TCP connection to the child a fresh congestion
    /// model (Linux BBR only; `p2p::congestion`): BBR's bandwidth estimate goes stale while a
    /// connection carries only gossip between pushes. Off keeps whatever the kernel learnt.
    pub restart_congestion: bool,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".to_string()],
            bootstrap: Vec::new(),
            mdns: false,
            admin: "127.0.0.1:9100".to_string(),
            psk_file: None,
            allow_list: Vec::new(),
            quic: true,
            heartbeat_interval_ms: 2000,
            cost_per_hour: 0.0,
            relays: Vec::new(),
            autonat: true,
            max_peers: 64,
            uplink_mbps: 0.0,
            downlink_mbps: 0.0,
            learner_mbps: 0.0,
            ban_after_strikes: 3,
            max_inbound: 256,
            max_per_peer: 3,
            max_pending_inbound: 64,
            quic_auto_listen: true,
            external_addrs: Vec::new(),
            relay_service: false,
            relay_max_reservations: 128,
            relay_max_reservations_per_peer: 4,
            relay_reservation_duration_s: 3600,
            relay_max_circuits: 64,
            relay_max_circuits_per_peer: 8,
            relay_max_circuit_mb: 1024,
            relay_max_circuit_duration_s: 3600,
            restart_congestion: true,
        }
    }
}

impl NetworkConfig {
    /// Every problem with the values, as `(key relative to [network], what is allowed)`.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = self.validate_addrs();
        if let Some(p) = &self.psk_file {
            if p.as_os_str().is_empty() {
                out.push((
                    "psk_file".into(),
                    "must not be empty (omit the key for a public swarm)".into(),
                ));
            }
        }
        for (i, p) in self.allow_list.iter().enumerate() {
            if p.parse::<libp2p::PeerId>().is_err() {
                out.push((
                    format!("allow_list[{i}]"),
                    format!(
                        "`{p}` is not a peer id (as printed by `echo-node keygen`, e.g. 12D3KooW…)"
                    ),
                ));
            }
        }
        if !(100..=600_000).contains(&self.heartbeat_interval_ms) {
            out.push((
                "heartbeat_interval_ms".into(),
                format!(
                    "{} is outside 100..=600000 (milliseconds)",
                    self.heartbeat_interval_ms
                ),
            ));
        }
        if !self.cost_per_hour.is_finite() || !(0.0..=1.0e6).contains(&self.cost_per_hour) {
            out.push((
                "cost_per_hour".into(),
                format!(
                    "{} must be a number in 0..=1000000 ($ per hour)",
                    self.cost_per_hour
                ),
            ));
        }
        if !(1..=10_000).contains(&self.max_peers) {
            out.push((
                "max_peers".into(),
                format!("{} is outside 1..=10000", self.max_peers),
            ));
        }
        for (key, v, max) in [
            ("ban_after_strikes", self.ban_after_strikes, 1_000_000),
            ("max_inbound", self.max_inbound, 100_000),
            ("max_per_peer", self.max_per_peer, 64),
            ("max_pending_inbound", self.max_pending_inbound, 100_000),
        ] {
            if !(1..=max).contains(&v) {
                out.push((key.into(), format!("{v} is outside 1..={max}")));
            }
        }
        for (key, v) in [
            ("uplink_mbps", self.uplink_mbps),
            ("downlink_mbps", self.downlink_mbps),
            ("learner_mbps", self.learner_mbps),
        ] {
            if !v.is_finite() || !(0.0..=1.0e6).contains(&v) {
                out.push((
                    key.into(),
                    format!("{v} must be a number in 0..=1000000 (Mbit/s; 0 = unlimited)"),
                ));
            }
        }
        out.extend(self.validate_relay_limits());
        out
    }

    /// The address options' problems: listen addresses (a transport this config runs),
    /// bootstrap and relay addresses (with the peer id), external addresses, and a loopback
    /// admin endpoint.
    fn validate_addrs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.listen.is_empty() {
            out.push((
                "listen".into(),
                "at least one listen multiaddr is required".into(),
            ));
        }
        for (i, a) in self.listen.iter().enumerate() {
            match a.parse::<libp2p::Multiaddr>() {
                Err(e) => out.push((
                    format!("listen[{i}]"),
                    format!("`{a}` is not a multiaddr ({e}; e.g. /ip4/127.0.0.1/tcp/0)"),
                )),
                Ok(m) => {
                    let quic = a.contains("/quic");
                    if quic && (self.psk_file.is_some() || !self.quic) {
                        out.push((
                            format!("listen[{i}]"),
                            format!(
                                "`{m}` is a QUIC address but QUIC is off ({}); use a /tcp/ address",
                                if self.psk_file.is_some() {
                                    "a private swarm (psk_file) runs on TCP only"
                                } else {
                                    "quic = false"
                                }
                            ),
                        ));
                    } else if !quic && !a.contains("/tcp/") {
                        out.push((
                            format!("listen[{i}]"),
                            format!("`{a}` must name a /tcp/ or /udp/…/quic-v1 port"),
                        ));
                    }
                }
            }
        }
        for (key, list) in [("bootstrap", &self.bootstrap), ("relays", &self.relays)] {
            for (i, a) in list.iter().enumerate() {
                let ok = a
                    .parse::<libp2p::Multiaddr>()
                    .ok()
                    .is_some_and(|m| crate::peer_id_of(&m).is_some());
                if !ok {
                    out.push((
                        format!("{key}[{i}]"),
                        format!("`{a}` must be a multiaddr ending in /p2p/<peer id>"),
                    ));
                }
            }
        }
        for (i, a) in self.external_addrs.iter().enumerate() {
            if a.parse::<libp2p::Multiaddr>().is_err() {
                out.push((
                    format!("external_addrs[{i}]"),
                    format!("`{a}` is not a multiaddr (e.g. /ip4/203.0.113.7/tcp/4001)"),
                ));
            }
        }
        match self.admin.parse::<std::net::SocketAddr>() {
            Ok(addr) if addr.ip().is_loopback() => {}
            Ok(addr) => out.push((
                "admin".into(),
                format!("{addr} is not a loopback address; the admin endpoint binds 127.0.0.1 or ::1 only"),
            )),
            Err(_) => out.push((
                "admin".into(),
                format!("`{}` is not HOST:PORT (e.g. 127.0.0.1:9100)", self.admin),
            )),
        }
        out
    }

    /// The relay server limits: each at least 1 and bounded.
    fn validate_relay_limits(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, v, max) in [
            (
                "relay_max_reservations",
                u64::from(self.relay_max_reservations),
                100_000,
            ),
            (
                "relay_max_reservations_per_peer",
                u64::from(self.relay_max_reservations_per_peer),
                1_000,
            ),
            (
                "relay_reservation_duration_s",
                self.relay_reservation_duration_s,
                86_400,
            ),
            (
                "relay_max_circuits",
                u64::from(self.relay_max_circuits),
                100_000,
            ),
            (
                "relay_max_circuits_per_peer",
                u64::from(self.relay_max_circuits_per_peer),
                1_000,
            ),
            ("relay_max_circuit_mb", self.relay_max_circuit_mb, 1 << 20),
            (
                "relay_max_circuit_duration_s",
                self.relay_max_circuit_duration_s,
                86_400,
            ),
        ] {
            if !(1..=max).contains(&v) {
                out.push((key.into(), format!("{v} is outside 1..={max}")));
            }
        }
        out
    }

    /// QUIC is used only when enabled and no pre-shared key is configured.
    pub fn quic_enabled(&self) -> bool {
        self.quic && self.psk_file.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(c: &NetworkConfig) -> Vec<String> {
        c.validate().into_iter().map(|(k, _)| k).collect::<Vec<_>>()
    }

    #[test]
    fn defaults_are_valid() {
        assert!(NetworkConfig::default().validate().is_empty());
    }

    #[test]
    fn bad_values_are_named() {
        let c = NetworkConfig {
            listen: vec!["/ip4/127.0.0.1/udp/1/quic-v1".into(), "nonsense".into()],
            bootstrap: vec!["/ip4/127.0.0.1/tcp/1".into()],
            psk_file: Some(PathBuf::from("psk")),
            allow_list: vec!["not-a-peer".into()],
            heartbeat_interval_ms: 5,
            cost_per_hour: -1.0,
            max_peers: 0,
            relays: vec!["x".into()],
            uplink_mbps: -1.0,
            downlink_mbps: f64::INFINITY,
            learner_mbps: 2e6,
            ban_after_strikes: 0,
            max_inbound: 0,
            max_per_peer: 65,
            max_pending_inbound: 0,
            ..NetworkConfig::default()
        };
        assert_eq!(
            keys(&c),
            [
                "listen[0]",
                "listen[1]",
                "bootstrap[0]",
                "relays[0]",
                "allow_list[0]",
                "heartbeat_interval_ms",
                "cost_per_hour",
                "max_peers",
                "ban_after_strikes",
                "max_inbound",
                "max_per_peer",
                "max_pending_inbound",
                "uplink_mbps",
                "downlink_mbps",
                "learner_mbps"
            ]
        );
        assert!(!c.quic_enabled());
        let nan = NetworkConfig {
            cost_per_hour: f64::NAN,
            ..NetworkConfig::default()
        };
        assert_eq!(keys(&nan), ["cost_per_hour"]);
    }

    #[test]
    fn relay_limits_are_checked() {
        let c = NetworkConfig {
            relay_max_circuits: 0,
            relay_max_circuit_mb: 0,
            relay_reservation_duration_s: 100_000,
            ..NetworkConfig::default()
        };
        assert_eq!(
            keys(&c),
            [
                "relay_reservation_duration_s",
                "relay_max_circuits",
                "relay_max_circuit_mb"
            ]
        );
        // Defaults carry a snapshot of the embedded model many times over, for an hour.
        let d = NetworkConfig::default();
        assert!(!d.relay_service && d.quic && d.quic_auto_listen);
        assert!(d.relay_max_circuit_mb >= 256 && d.relay_max_circuit_duration_s >= 600);
    }

    #[test]
    fn a_circuit_listen_address_is_accepted() {
        let c = NetworkConfig {
            listen: vec![format!(
                "/ip4/127.0.0.1/tcp/4001/p2p/{}/p2p-circuit",
                crate::peer_id_from_seed([1; 32])
            )],
            ..NetworkConfig::default()
        };
        assert!(c.validate().is_empty(), "{:?}", c.validate());
    }
}
