//! Redial backoff: a peer that keeps closing our connections the moment they open is not
//! dialed again at once.
//!
//! Without it, a node that a peer refuses after the handshake (it banned us for the run, or
//! its inbound limits are full) redials in a loop: the connection to a bootstrap peer starts a
//! Kademlia bootstrap query, the query dials the peer again, the peer closes again — one
//! handshake every few milliseconds, seen in CI as hundreds of connections a second from a
//! banned worker to its learner, each costing the learner a Noise or TLS handshake on a busy
//! 2-core machine. Every dial goes through [`Behaviour::handle_pending_outbound_connection`],
//! whoever asks for it (the service's bootstrap redial, Kademlia queries, a stream open), so
//! one gate here covers them all.
//!
//! The rule ([`Backoff`]): a connection that closes within [`SHORT_LIVED`] of opening, leaving
//! no other connection to that peer, is *short-lived*. The first [`FREE_TRIES`] short-lived
//! connections in a row cost nothing (a peer restarting, a duplicate connection closed by the
//! per-peer limit); each further one holds back our dials to the peer for
//! [`BASE_DELAY`]·2^k, at most [`MAX_DELAY`]. A connection that lives past [`SHORT_LIVED`]
//! forgets the peer's record. Inbound connections are never refused here (the peer's own
//! problem, bounded by the inbound limits).
//!
//! Owns: the per-peer record of short-lived connections and the outbound gate. Must not touch:
//! bans (`bans`), which are about what a peer sent, not about whether it will talk to us.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::swarm::{
    behaviour::ConnectionEstablished, dummy, ConnectionClosed, ConnectionDenied, ConnectionId,
    FromSwarm, NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};

/// A connection closed sooner than this after opening was refused or dropped by the peer, not
/// used: honest connections carry heartbeats and gossip for minutes.
pub const SHORT_LIVED: Duration = Duration::from_secs(2);
/// Short-lived connections in a row that are redialed without delay.
pub const FREE_TRIES: u32 = 3;
/// The first hold-back; doubled for each further short-lived connection.
pub const BASE_DELAY: Duration = Duration::from_secs(1);
/// The longest hold-back: a peer that refused us (a full learner) may take us again later, and
/// a worker must not wait longer than this to rejoin.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// Peers whose record is kept at once; past it the record touched longest ago is dropped (a
/// stream of fresh identities cannot grow the map).
pub const MAX_RECORDS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Record {
    /// When the current connection (if any) opened.
    opened: Option<Instant>,
    /// Short-lived connections in a row.
    short_lived: u32,
    /// No dial before this instant.
    hold_until: Option<Instant>,
    touched: Instant,
}

/// The pure rule: per-peer short-lived connection counts and hold-back deadlines.
#[derive(Debug, Default)]
pub struct Backoff {
    records: HashMap<PeerId, Record>,
}

impl Backoff {
    /// The first connection to `peer` opened at `now`.
    pub fn opened(&mut self, peer: PeerId, now: Instant) {
        let r = self.records.entry(peer).or_insert(Record {
            opened: None,
            short_lived: 0,
            hold_until: None,
            touched: now,
        });
        r.opened = Some(now);
        r.touched = now;
        self.bound();
    }

    /// The last connection to `peer` closed at `now`. Returns the hold-back that starts, if
    /// this closure earned one.
    pub fn closed(&mut self, peer: PeerId, now: Instant) -> Option<Duration> {
        let r = self.records.get_mut(&peer)?;
        let opened = r.opened.take()?;
        r.touched = now;
        if now.saturating_duration_since(opened) >= SHORT_LIVED {
            self.records.remove(&peer);
            return None;
        }
        r.short_lived = r.short_lived.saturating_add(1);
        let over = r.short_lived.checked_sub(FREE_TRIES + 1)?;
        let delay = BASE_DELAY
            .checked_mul(1u32 << over.min(16))
            .unwrap_or(MAX_DELAY)
            .min(MAX_DELAY);
        r.hold_until = Some(now + delay);
        Some(delay)
    }

    /// How long dials to `peer` are still held back at `now` (`None`: dial away).
    pub fn held(&self, peer: &PeerId, now: Instant) -> Option<Duration> {
        let until = self.records.get(peer)?.hold_until?;
        (until > now).then(|| until - now)
    }

    /// Peers with a record.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn bound(&mut self) {
        if self.records.len() <= MAX_RECORDS {
            return;
        }
        if let Some(oldest) = self
            .records
            .iter()
            .filter(|(_, r)| r.opened.is_none())
            .min_by_key(|(_, r)| r.touched)
            .or_else(|| self.records.iter().min_by_key(|(_, r)| r.touched))
            .map(|(p, _)| *p)
        {
            self.records.remove(&oldest);
        }
    }
}

/// Why a dial was refused: the peer is in its hold-back.
#[derive(Debug)]
pub struct HeldBack {
    pub peer: PeerId,
    pub remaining: Duration,
}

impl fmt::Display for HeldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer {} closed our last connections at once; next dial in {} ms",
            self.peer,
            self.remaining.as_millis()
        )
    }
}

impl std::error::Error for HeldBack {}

/// Whether a refused connection was this gate's doing (our own hold-back, not the peer's
/// refusal).
pub(crate) fn held_back(cause: &ConnectionDenied) -> bool {
    cause.downcast_ref::<HeldBack>().is_some()
}

/// The outbound gate: a [`NetworkBehaviour`] with no protocol of its own.
#[derive(Debug, Default)]
pub struct Behaviour {
    rule: Backoff,
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_pending_outbound_connection(
        &mut self,
        _: ConnectionId,
        peer: Option<PeerId>,
        _: &[Multiaddr],
        _: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if let Some(peer) = peer {
            if let Some(remaining) = self.rule.held(&peer, Instant::now()) {
                return Err(ConnectionDenied::new(HeldBack { peer, remaining }));
            }
        }
        Ok(vec![])
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm<'_>) {
        match event {
            FromSwarm::ConnectionEstablished(ConnectionEstablished {
                peer_id,
                other_established: 0,
                ..
            }) => self.rule.opened(peer_id, Instant::now()),
            FromSwarm::ConnectionClosed(ConnectionClosed {
                peer_id,
                remaining_established: 0,
                ..
            }) => {
                if let Some(delay) = self.rule.closed(peer_id, Instant::now()) {
                    tracing::warn!(
                        peer = %peer_id,
                        delay_ms = delay.as_millis() as u64,
                        "peer keeps closing our connections at once: dials held back (in a \
                         private swarm, is this node's peer id missing from that peer's \
                         network.allow_list, or did it ban us?)"
                    );
                }
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Opens and closes a connection to `p` lasting `life`, starting at `*t`; returns the
    /// hold-back it earned and moves `*t` to the close.
    fn cycle(b: &mut Backoff, p: PeerId, t: &mut Instant, life: Duration) -> Option<Duration> {
        b.opened(p, *t);
        *t += life;
        b.closed(p, *t)
    }

    #[test]
    fn the_first_short_lived_connections_are_free_then_the_hold_back_doubles_to_its_cap() {
        let mut b = Backoff::default();
        let p = PeerId::random();
        let mut t = Instant::now();
        for _ in 0..FREE_TRIES {
            assert_eq!(cycle(&mut b, p, &mut t, MS), None);
            assert_eq!(b.held(&p, t), None, "free tries are redialed at once");
        }
        let mut delays = vec![];
        for _ in 0..8 {
            let d = cycle(&mut b, p, &mut t, MS).expect("held back");
            assert_eq!(b.held(&p, t), Some(d));
            assert_eq!(b.held(&p, t + d), None, "the hold-back ends");
            delays.push(d.as_secs());
            t += d;
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn a_connection_that_lives_resets_the_record() {
        let mut b = Backoff::default();
        let p = PeerId::random();
        let mut t = Instant::now();
        for _ in 0..FREE_TRIES + 2 {
            cycle(&mut b, p, &mut t, MS);
        }
        t += MAX_DELAY;
        assert_eq!(cycle(&mut b, p, &mut t, SHORT_LIVED), None);
        assert!(b.is_empty(), "a used connection forgets the peer");
        for _ in 0..FREE_TRIES {
            assert_eq!(cycle(&mut b, p, &mut t, MS), None);
        }
    }

    #[test]
    fn other_peers_are_not_held_back_and_a_close_without_an_open_is_ignored() {
        let mut b = Backoff::default();
        let (p, q) = (PeerId::random(), PeerId::random());
        let mut t = Instant::now();
        for _ in 0..FREE_TRIES + 1 {
            cycle(&mut b, p, &mut t, MS);
        }
        assert!(b.held(&p, t).is_some());
        assert_eq!(b.held(&q, t), None);
        assert_eq!(b.closed(q, t), None);
        assert_eq!(b.held(&q, t), None);
    }

    #[test]
    fn the_records_are_bounded() {
        let mut b = Backoff::default();
        let t = Instant::now();
        for i in 0..MAX_RECORDS + 100 {
            let p = PeerId::random();
            b.opened(p, t + MS * i as u32);
            b.closed(p, t + MS * i as u32 + MS);
        }
        assert_eq!(b.len(), MAX_RECORDS);
    }
}
