//! The lab's topologies, built from [`super::ns::Lab`] namespaces:
//!
//! - [`NatLab`]: a public segment (a bridge inside the `pub` namespace, 10.77.0.0/24) with
//!   public hosts on it (10.77.0.10 and up), and NAT routers (10.77.0.200 + k on the public
//!   side, 10.77.k.1/24 on their LAN bridge) with hosts behind them (10.77.k.10 and up,
//!   default route via the router). Routers masquerade what leaves their public side and drop
//!   what arrives there unsolicited; public hosts have no route to the private ranges.
//! - [`WanStar`]: hosts on point-to-point TUN links to a forwarding `hub` namespace
//!   (10.77.0.10 and up), every link through the userspace [`super::tun::Emulator`] (delay,
//!   jitter, loss: the kernel here has no `netem`), optionally rate-limited with `tbf`.
//!
//! What Linux conntrack NAT gives ([`NatKind`]): plain `MASQUERADE` keeps a connection's
//! source port when it is free on the router, so one local port maps to the same public port
//! for every destination (endpoint-independent mapping, "full-cone-like" for mapping), but
//! its filtering is address-and-port-dependent: only the exact remote a mapping was made for
//! gets in. `MASQUERADE --random-fully` picks a fresh random port per connection (per
//! 5-tuple): each destination sees another port, a symmetric NAT.
//!
//! Owns addresses, interface names and NAT rules. Node processes are the harness's.

use std::net::Ipv4Addr;

use super::emu::{LinkParams, LinkStats};
use super::ns::{Lab, LabError};
use super::tun::{Emulator, TunLink};

/// How a NAT router maps and filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// `MASQUERADE`: port-preserving, endpoint-independent mapping, address-and-port-dependent
    /// filtering.
    EndpointIndependent,
    /// `MASQUERADE --random-fully`: a new public port per destination.
    Symmetric,
}

impl NatKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NatKind::EndpointIndependent => "endpoint-independent",
            NatKind::Symmetric => "symmetric",
        }
    }
}

/// A host of a topology: its namespace and address.
#[derive(Debug, Clone)]
pub struct Host {
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// A public segment with NAT routers and hosts.
pub struct NatLab {
    pub lab: Lab,
    public: String,
    public_hosts: u8,
    /// Per router: its namespace, kind, and hosts behind it so far.
    routers: Vec<(String, NatKind, u8)>,
}

impl NatLab {
    /// The public segment (namespace `pub`, bridge `br0`, no addresses of its own).
    pub fn new(tag: &str) -> Result<NatLab, LabError> {
        let mut lab = Lab::new(tag)?;
        let public = lab.add_ns("pub")?;
        lab.ip(&public, &["link", "add", "br0", "type", "bridge"])?;
        lab.ip(&public, &["link", "set", "br0", "up"])?;
        Ok(NatLab {
            lab,
            public,
            public_hosts: 0,
            routers: Vec::new(),
        })
    }

    /// A host on the public segment, 10.77.0.(10 + i).
    pub fn public_host(&mut self, name: &str) -> Result<Host, LabError> {
        let i = self.public_hosts;
        anyhow_limit(i < 100, "public hosts")?;
        self.public_hosts += 1;
        let ns = self.lab.add_ns(name)?;
        let ip = Ipv4Addr::new(10, 77, 0, 10 + i);
        let port = format!("p{i}");
        self.lab.veth(&ns, "eth0", &self.public, &port)?;
        self.lab
            .ip(&self.public, &["link", "set", &port, "master", "br0"])?;
        self.lab
            .ip(&ns, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        Ok(Host { ns, ip })
    }

    /// A NAT router of `kind`; returns its index (1-based, its LAN is 10.77.k.0/24).
    pub fn router(&mut self, kind: NatKind) -> Result<u8, LabError> {
        let k = u8::try_from(self.routers.len() + 1).unwrap_or(u8::MAX);
        anyhow_limit(k <= 50, "NAT routers")?;
        let ns = self.lab.add_ns(&format!("nat{k}"))?;
        let (lab, public) = (&self.lab, &self.public);
        let port = format!("r{k}");
        lab.veth(&ns, "wan", public, &port)?;
        lab.ip(public, &["link", "set", &port, "master", "br0"])?;
        lab.ip(
            &ns,
            &[
                "addr",
                "add",
                &format!("10.77.0.{}/24", 200 + k),
                "dev",
                "wan",
            ],
        )?;
        lab.ip(&ns, &["link", "add", "lan", "type", "bridge"])?;
        lab.ip(&ns, &["link", "set", "lan", "up"])?;
        lab.ip(
            &ns,
            &["addr", "add", &format!("10.77.{k}.1/24"), "dev", "lan"],
        )?;
        lab.sysctl(&ns, "net.ipv4.ip_forward", "1")?;
        let mut masq = vec![
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            "wan",
            "-j",
            "MASQUERADE",
        ];
        if kind == NatKind::Symmetric {
            masq.push("--random-fully");
        }
        lab.exec(&ns, &[&["iptables"], masq.as_slice()].concat())?;
        // Only replies come in: what arrives on the public side unsolicited is dropped,
        // silently — for the hosts behind (FORWARD) and for the router itself (INPUT), as
        // consumer routers and cloud NAT gateways do. Without the INPUT rule the router's own
        // kernel answered a SYN for a port it has no mapping for with a reset, which kills a
        // TCP hole punch whenever one side's SYN arrives before the other side's SYN has made
        // the mapping (`docs/netlab.md`, "Hole punching").
        for chain in ["FORWARD", "INPUT"] {
            lab.exec(
                &ns,
                &[
                    "iptables",
                    "-A",
                    chain,
                    "-i",
                    "wan",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "ESTABLISHED,RELATED",
                    "-j",
                    "ACCEPT",
                ],
            )?;
            lab.exec(&ns, &["iptables", "-A", chain, "-i", "wan", "-j", "DROP"])?;
        }
        self.routers.push((ns, kind, 0));
        Ok(k)
    }

    /// A host behind router `k`, 10.77.k.(10 + j).
    pub fn host_behind(&mut self, k: u8, name: &str) -> Result<Host, LabError> {
        let idx = usize::from(k).checked_sub(1);
        let Some((router, _, count)) = idx.and_then(|i| self.routers.get_mut(i)) else {
            return Err(LabError::Command {
                cmd: format!("host_behind({k})"),
                stderr: "no such router".into(),
            });
        };
        let j = *count;
        *count += 1;
        let router = router.clone();
        let ns = self.lab.add_ns(name)?;
        let ip = Ipv4Addr::new(10, 77, k, 10 + j);
        let port = format!("h{j}");
        self.lab.veth(&ns, "eth0", &router, &port)?;
        self.lab
            .ip(&router, &["link", "set", &port, "master", "lan"])?;
        self.lab
            .ip(&ns, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        self.lab.ip(
            &ns,
            &["route", "add", "default", "via", &format!("10.77.{k}.1")],
        )?;
        Ok(Host { ns, ip })
    }

    /// The public address of router `k` (what peers see of the hosts behind it).
    pub fn router_public_ip(k: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, 200 + k)
    }
}

fn anyhow_limit(ok: bool, what: &str) -> Result<(), LabError> {
    if ok {
        Ok(())
    } else {
        Err(LabError::Command {
            cmd: "netlab".into(),
            stderr: format!("too many {what}"),
        })
    }
}

/// Hosts on emulated WAN links around a forwarding hub.
pub struct WanStar {
    /// Dropped after the emulator (field order): the devices go with their namespaces.
    /// Stopped through [`WanStar::stop`], which reads the kernel's drops first.
    emulator: Emulator,
    pub hosts: Vec<Host>,
    /// The forwarding hub's namespace (the devices `l0` … of the links).
    hub: String,
    /// Held for its drop, which removes the namespaces.
    pub lab: Lab,
}

/// The MTU of the lab's TUN links: Ethernet's, so that loss hits packets of realistic size.
pub const WAN_MTU: u32 = 1500;

/// Packets a TUN device queues for the forwarder (`txqueuelen`; the kernel's default is 500).
/// Measured (N = 8, 64 MB, 2 cores): with 500 the kernel dropped 1.5 % of the learner's
/// packets and up to 0.9 % of a worker's whenever the forwarder thread waited for a core —
/// three times the emulated loss on the learner's link. 10 000 packets (15 MB) hold
/// about 120 ms of a 1 Gbit/s burst, so a forwarder that falls behind delays packets instead
/// of losing them. What is still dropped is reported (`LinkStats::host_dropped`).
pub const TUN_QUEUE_PACKETS: u32 = 10_000;

impl WanStar {
    /// `n` hosts (`h0` … at 10.77.0.10 …), host `i` on its own emulated link to the hub with
    /// `params(i)` in both directions (seeded from `seed`), and a `tbf` rate cap of `tbf_mbit`
    /// on both ends of every link when given.
    pub fn new(
        tag: &str,
        n: usize,
        params: impl Fn(usize) -> LinkParams,
        seed: u64,
        tbf_mbit: Option<f64>,
    ) -> Result<WanStar, LabError> {
        anyhow_limit(n <= 200, "WAN hosts")?;
        let mut lab = Lab::new(tag)?;
        let hub = lab.add_ns("hub")?;
        lab.sysctl(&hub, "net.ipv4.ip_forward", "1")?;
        lab.sysctl(&hub, "net.ipv4.conf.all.rp_filter", "0")?;
        lab.sysctl(&hub, "net.ipv4.conf.default.rp_filter", "0")?;
        let mut hosts = Vec::new();
        let mut links = Vec::new();
        let mtu = WAN_MTU.to_string();
        for i in 0..n {
            let ns = lab.add_ns(&format!("h{i}"))?;
            let ip = Ipv4Addr::new(10, 77, 0, 10 + i as u8);
            let host_dev = super::sys::open_tun(&ns, "wan0")?;
            let hub_name = format!("l{i}");
            let hub_dev = super::sys::open_tun(&hub, &hub_name)?;
            lab.ip(&ns, &["addr", "add", &format!("{ip}/24"), "dev", "wan0"])?;
            let qlen = TUN_QUEUE_PACKETS.to_string();
            for (ns, dev) in [(&ns, "wan0"), (&hub, hub_name.as_str())] {
                lab.ip(
                    ns,
                    &["link", "set", dev, "mtu", &mtu, "txqueuelen", &qlen, "up"],
                )?;
            }
            lab.ip(
                &hub,
                &["route", "add", &format!("{ip}/32"), "dev", &hub_name],
            )?;
            if let Some(rate) = tbf_mbit {
                for (ns, dev) in [(&ns, "wan0"), (&hub, hub_name.as_str())] {
                    tbf(&lab, ns, dev, rate)?;
                }
            }
            links.push(TunLink::new(
                host_dev,
                hub_dev,
                params(i),
                seed ^ (i as u64) << 8,
            ));
            hosts.push(Host { ns, ip });
        }
        let emulator = Emulator::start(links)?;
        Ok(WanStar {
            emulator,
            hosts,
            hub,
            lab,
        })
    }

    /// Stops the forwarder and returns its totals with the kernel's drops at the TUN queues
    /// (`host_dropped`), read while the devices still exist (they go with the forwarder).
    pub fn stop(&mut self) -> anyhow::Result<LinkStats> {
        // For a TUN device, `tx_dropped` counts packets refused because its queue to the
        // reading process (the forwarder) was full.
        let mut dropped = 0;
        for (i, h) in self.hosts.iter().enumerate() {
            dropped += self.lab.iface_stat(&h.ns, "wan0", "tx_dropped")?;
            dropped += self
                .lab
                .iface_stat(&self.hub, &format!("l{i}"), "tx_dropped")?;
        }
        let mut stats = self.emulator.stop()?;
        stats.host_dropped = dropped;
        Ok(stats)
    }
}

/// Caps the egress of `dev` in `ns` at `mbit` Mbit/s with a token bucket (`tbf`): burst of
/// 10 ms at that rate (at least 32 KB), up to 200 ms of queue.
pub fn tbf(lab: &Lab, ns: &str, dev: &str, mbit: f64) -> Result<(), LabError> {
    let burst = ((mbit * 1e6 / 8.0 * 0.01) as u64).max(32 * 1024);
    lab.exec(
        ns,
        &[
            "tc",
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            &format!("{}kbit", (mbit * 1000.0) as u64),
            "burst",
            &burst.to_string(),
            "latency",
            "200ms",
        ],
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::super::sys::in_netns;
    use super::*;
    use std::net::{SocketAddr, TcpStream, UdpSocket};
    use std::time::{Duration, Instant};

    /// Skips (with the reason on stderr) where the lab cannot run.
    fn lab_available() -> bool {
        match super::super::ns::preflight() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipping the network-lab test: {e}");
                false
            }
        }
    }

    /// A UDP socket bound to `h`'s address (port 0) inside `h`'s namespace, reads time out.
    fn socket(h: &Host) -> UdpSocket {
        let ip = h.ip;
        in_netns(&h.ns, move || {
            let s = UdpSocket::bind((ip, 0))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            Ok(s)
        })
        .unwrap()
    }

    /// Sends one datagram from `s` to `to`; returns the source address the receiver saw.
    fn seen_from(s: &UdpSocket, to: &UdpSocket) -> SocketAddr {
        s.send_to(b"x", to.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        to.recv_from(&mut buf).unwrap().1
    }

    #[test]
    fn netlab_nat_lifecycle_crosses_nat_maps_by_kind_and_leaves_nothing() {
        if !lab_available() {
            return;
        }
        let prefix;
        {
            let mut lab = NatLab::new("t").unwrap();
            prefix = lab.lab.prefix().to_string();
            let a = lab.public_host("a").unwrap();
            let b = lab.public_host("b").unwrap();
            let (sa, sb) = (socket(&a), socket(&b));
            for (kind, k) in [
                (NatKind::EndpointIndependent, 1u8),
                (NatKind::Symmetric, 2u8),
            ] {
                assert_eq!(lab.router(kind).unwrap(), k);
                let h = lab.host_behind(k, &format!("w{k}")).unwrap();
                let s = socket(&h);
                let local = s.local_addr().unwrap().port();
                // One local port to two destinations: the masqueraded source each sees.
                let (to_a, to_b) = (seen_from(&s, &sa), seen_from(&s, &sb));
                assert_eq!(to_a.ip(), NatLab::router_public_ip(k), "masqueraded");
                assert_eq!(to_b.ip(), NatLab::router_public_ip(k));
                match kind {
                    NatKind::EndpointIndependent => assert_eq!(
                        (to_a.port(), to_b.port()),
                        (local, local),
                        "port-preserving, one mapping for every destination"
                    ),
                    NatKind::Symmetric => {
                        assert_ne!(to_a.port(), to_b.port(), "a new mapping per destination")
                    }
                }
                // Replies come back through the mapping...
                sa.send_to(b"r", to_a).unwrap();
                let mut buf = [0u8; 8];
                assert_eq!(s.recv_from(&mut buf).unwrap().1, sa.local_addr().unwrap());
                // ...but the private range is unreachable from the public side.
                assert!(sa.send_to(b"x", s.local_addr().unwrap()).is_err());
                // An unsolicited TCP connection to the router's public address is dropped,
                // not reset: a reset would kill a TCP hole punch whose SYN arrives before the
                // other side's SYN has made the mapping.
                let router = SocketAddr::new(NatLab::router_public_ip(k).into(), 9);
                let refused = in_netns(&a.ns, move || {
                    Ok(
                        TcpStream::connect_timeout(&router, Duration::from_millis(500))
                            .map(|_| ())
                            .map_err(|e| e.kind()),
                    )
                })
                .unwrap();
                assert_eq!(refused, Err(std::io::ErrorKind::TimedOut), "{kind:?}");
            }
            assert!(super::super::ns::list_lab_namespaces()
                .unwrap()
                .iter()
                .any(|(n, _)| n.starts_with(&prefix)));
        }
        let left: Vec<String> = super::super::ns::list_lab_namespaces()
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn netlab_wan_star_delays_packets_through_the_emulator() {
        if !lab_available() {
            return;
        }
        // 40 ms RTT: four crossings of 10 ms.
        let mut star = WanStar::new(
            "w",
            2,
            |_| LinkParams::per_star_link(40.0, 0.0, 0.0),
            1,
            None,
        )
        .unwrap();
        let (s0, s1) = (socket(&star.hosts[0]), socket(&star.hosts[1]));
        let echo_addr = s1.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..3 {
                let (n, from) = s1.recv_from(&mut buf)?;
                s1.send_to(&buf[..n], from)?;
            }
            std::io::Result::Ok(())
        });
        let mut rtts = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            s0.send_to(b"ping", echo_addr).unwrap();
            let mut buf = [0u8; 64];
            s0.recv_from(&mut buf)
                .expect("the echo comes back through the hub");
            rtts.push(t.elapsed());
        }
        echo.join().unwrap().unwrap();
        let min = rtts.iter().min().unwrap();
        assert!(
            *min >= Duration::from_millis(40),
            "RTT {min:?} below the emulated 40 ms"
        );
        let stats = star.stop().unwrap();
        assert!(stats.forwarded >= 12, "{stats:?}");
        assert_eq!(stats.host_dropped, 0, "{stats:?}");
    }
}
