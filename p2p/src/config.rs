//! The `[network]` section of a node's config.

use serde::Deserialize;

/// Network settings. Unknown keys are rejected when parsing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// libp2p multiaddrs to listen on, e.g. `/ip4/127.0.0.1/tcp/0`.
    pub listen: Vec<String>,
    /// Multiaddrs (ending in `/p2p/<peer id>`) of peers to dial at start.
    pub bootstrap: Vec<String>,
    /// Local-network discovery with mDNS.
    pub mdns: bool,
    /// Admin HTTP endpoint (`/status`, `/metrics`); must be a loopback address.
    pub admin: String,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".to_string()],
            bootstrap: Vec::new(),
            mdns: false,
            admin: "127.0.0.1:9100".to_string(),
        }
    }
}

impl NetworkConfig {
    /// Every problem with the values, as `(key relative to [network], what is allowed)`.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.listen.is_empty() {
            out.push(("listen".into(), "at least one listen multiaddr is required".into()));
        }
        for (i, a) in self.listen.iter().enumerate() {
            if !a.starts_with('/') {
                out.push((
                    format!("listen[{i}]"),
                    format!("`{a}` is not a multiaddr (e.g. /ip4/127.0.0.1/tcp/0)"),
                ));
            }
        }
        for (i, a) in self.bootstrap.iter().enumerate() {
            if !a.starts_with('/') || !a.contains("/p2p/") {
                out.push((
                    format!("bootstrap[{i}]"),
                    format!("`{a}` must be a multiaddr ending in /p2p/<peer id>"),
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
}
