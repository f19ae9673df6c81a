//! The gossip side of the service task: publishing this node's heartbeats (and, on the
//! learner, score tables), validating the topics the service checks itself (heartbeats, score
//! tables), handing the other topics to the role, turning verdicts into gossipsub
//! acceptances and strikes, and applying the per-source heartbeat rate limit.
//!
//! Owns: which topic is validated where, and what a valid, invalid or too frequent message
//! does to the peer table and counters. Must not touch: message formats and their checks
//! ([`crate::messages`]), topic names ([`crate::topics`]), connection handling (the rest of
//! [`crate::service`]).

use std::time::Instant;

use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, MessageId};
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use tracing::{debug, info, warn};

use super::{strip_p2p, Service};
use crate::behaviour;
use crate::client::{Event, Validation};
use crate::error::MessageError;
use crate::hbgate::HeartbeatVerdict;
use crate::messages::{
    Heartbeat, ScoreTable, HEARTBEAT_VERSION, MAX_HEARTBEAT_ADDRS, MAX_HEARTBEAT_ADDR_BYTES,
};
use crate::peers::Arrival;
use crate::report::NetOffence;
use crate::topics::{parse_topic, TopicKind};
use storage::unix_ms;

impl Service {
    /// A role's verdict on an [`Event::Gossip`] message: passed on to gossipsub, and a
    /// rejection is also a strike against the author.
    pub(super) fn on_verdict(
        &mut self,
        id: &MessageId,
        propagation_source: PeerId,
        source: Option<PeerId>,
        verdict: Validation,
    ) {
        let acceptance = match verdict {
            Validation::Accept => MessageAcceptance::Accept,
            Validation::Reject => MessageAcceptance::Reject,
            Validation::Ignore => MessageAcceptance::Ignore,
        };
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, &propagation_source, acceptance);
        if verdict == Validation::Reject {
            self.penalise(source.unwrap_or(propagation_source));
        }
    }

    fn penalise(&mut self, peer: PeerId) {
        self.counters.messages_rejected += 1;
        metrics::counter!("p2p_messages_rejected_total").increment(1);
        self.strike_bad_message(peer);
    }

    pub(super) fn publish_heartbeat(&mut self) {
        let now = Instant::now();
        self.pacer.sent(now);
        self.seq += 1;
        let hb = Heartbeat {
            v: HEARTBEAT_VERSION,
            swarm_id: self.cfg.swarm_id.clone(),
            role: self.cfg.role,
            node_version: self.cfg.node_version.clone(),
            installed_version: self.local.installed_version,
            mu: self.local.mu,
            cost_per_hour: self.cfg.network.cost_per_hour,
            availability: self.local.availability,
            pending: self.local.pending,
            forward_rate_bps: self.local.forward_rate_bps,
            receive_rate_bps: self.local.receive_rate_bps,
            started_unix_ms: self.started_unix_ms,
            sent_unix_ms: unix_ms(),
            seq: self.seq,
            device: self.local.device.clone(),
            reachability: Some(self.nat.reachability()),
            addrs: self.dial_hints(),
            receipts: self
                .local
                .receipts
                .iter()
                .take(crate::receipt::MAX_HEARTBEAT_RECEIPTS)
                .cloned()
                .collect(),
            admission: self.local.admission.clone(),
            install_age_ms: self
                .local
                .installed_version
                .and(self.pacer.install_age(now))
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let topic = IdentTopic::new(TopicKind::Heartbeat.topic_name(&self.cfg.swarm_id));
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(topic, hb.encode())
        {
            Ok(_) => {
                self.counters.heartbeats_sent += 1;
                metrics::counter!("p2p_heartbeats_sent_total").increment(1);
            }
            Err(e) => debug!(error = %e, "heartbeat not published"),
        }
    }

    /// The learner's score table: one row per worker it hears and has not banned
    /// ([`PeerEntry::score_entry`]), the best ones up to what receivers accept
    /// ([`ScoreTable::capped`]).
    pub(super) fn publish_score_table(&mut self) {
        let now = Instant::now();
        let entries: Vec<_> = self
            .peers
            .iter()
            .filter_map(|(p, e)| {
                let mut row = e.score_entry(p, now)?;
                row.contribution = self.contributions.get(p).cloned().map(|mut c| {
                    c.strikes = e.strikes.total();
                    c
                });
                Some(row)
            })
            .collect();
        if entries.is_empty() {
            return;
        }
        let table = ScoreTable::capped(&self.cfg.swarm_id, unix_ms(), entries);
        let topic = IdentTopic::new(TopicKind::Scores.topic_name(&self.cfg.swarm_id));
        if let Err(e) = self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(topic, table.encode())
        {
            debug!(error = %e, "score table not published");
        }
    }

    /// Routes a gossip message by its topic: heartbeats and score tables are validated here,
    /// snapshots and plans go to the role as [`Event::Gossip`] (it reports the verdict).
    pub(super) fn on_gossip(
        &mut self,
        propagation_source: PeerId,
        id: MessageId,
        msg: gossipsub::Message,
    ) {
        let kind = match parse_topic(msg.topic.as_str()) {
            Ok((swarm, kind)) if swarm == self.cfg.swarm_id => kind,
            _ => {
                let error = MessageError::Invalid("unknown topic".into());
                self.reject(
                    propagation_source,
                    &id,
                    msg.source,
                    TopicKind::Heartbeat,
                    error,
                );
                return;
            }
        };
        let source = msg.source.unwrap_or(propagation_source);
        match kind {
            TopicKind::Heartbeat => match Heartbeat::decode(&msg.data, &self.cfg.swarm_id) {
                Ok(hb) => match self.gate_heartbeat(source, &hb) {
                    HeartbeatVerdict::Accept => {
                        self.accept(&id, &propagation_source);
                        self.on_heartbeat(source, hb);
                    }
                    verdict => {
                        self.ignore(&id, &propagation_source);
                        self.counters.heartbeats_ignored += 1;
                        metrics::counter!("p2p_heartbeats_ignored_total").increment(1);
                        if verdict == HeartbeatVerdict::Flood {
                            self.strike(source, NetOffence::HeartbeatFlood.report());
                        }
                    }
                },
                Err(err) => self.reject(propagation_source, &id, Some(source), kind, err),
            },
            TopicKind::Scores => match ScoreTable::decode(&msg.data, &self.cfg.swarm_id)
                .and_then(|t| self.authorise_score_table(source, t))
            {
                Ok(table) => {
                    self.accept(&id, &propagation_source);
                    self.on_score_table(source, table);
                }
                Err(err) => self.reject(propagation_source, &id, Some(source), kind, err),
            },
            // Only the learner signs manifests, plans and orders, and only it publishes them
            // (others forward, which keeps the learner as the author): a message authored by
            // anyone else is a replay or a forgery, whatever the signature inside says
            // (`authored`: which of the two).
            TopicKind::Snapshots | TopicKind::Plans => match self.cfg.learner {
                Some(l) if l != source => {
                    warn!(peer = %source, via = %propagation_source, ?kind, "message only the learner may author: a replay or a forgery");
                    self.swarm
                        .behaviour_mut()
                        .gossipsub
                        .report_message_validation_result(
                            &id,
                            &propagation_source,
                            MessageAcceptance::Reject,
                        );
                    self.counters.messages_rejected += 1;
                    metrics::counter!("p2p_messages_rejected_total").increment(1);
                    // The reason says what happened: the learner's own bytes again (a
                    // replay), or bytes it never published (a forgery, or garbage).
                    let reason = if self.authored.contains(&msg.data) {
                        NetOffence::Replay
                    } else {
                        NetOffence::ForgedMessage
                    };
                    self.strike(source, reason.report());
                    let error = MessageError::Unauthorised(source);
                    self.emit(Event::Rejected {
                        peer: source,
                        topic: kind,
                        error,
                    });
                }
                learner => {
                    if learner == Some(source) {
                        self.authored.record(&msg.data);
                    }
                    self.hand_to_role(kind, propagation_source, id, msg)
                }
            },
        }
    }

    /// The per-source rate limit (`hbgate`) on a valid heartbeat of `source`.
    fn gate_heartbeat(&mut self, source: PeerId, hb: &Heartbeat) -> HeartbeatVerdict {
        let interval = self.intervals.gate;
        let e = self.peer(source);
        let last = e.heartbeat.as_ref().and_then(|(h, _)| h.installed_version);
        let new_version = match (hb.installed_version, last) {
            (Some(v), Some(l)) => v > l,
            (Some(_), None) => true,
            (None, _) => false,
        };
        e.heartbeat_gate
            .check(Instant::now(), interval, new_version)
    }

    /// This node's dial hints for its heartbeats ([`Heartbeat::addrs`]): confirmed external
    /// addresses, then listen addresses (direct before relayed, routable before loopback),
    /// at most [`MAX_HEARTBEAT_ADDRS`].
    fn dial_hints(&self) -> Vec<String> {
        let loopback = |a: &Multiaddr| {
            a.iter().any(|p| match p {
                Protocol::Ip4(ip) => ip.is_loopback() || ip.is_unspecified(),
                Protocol::Ip6(ip) => ip.is_loopback() || ip.is_unspecified(),
                _ => false,
            })
        };
        let listen = behaviour::ordered_listeners(&self.swarm);
        let (routable, local): (Vec<_>, Vec<_>) = listen.into_iter().partition(|a| !loopback(a));
        let mut out: Vec<String> = Vec::new();
        for a in self
            .swarm
            .external_addresses()
            .cloned()
            .chain(routable)
            .chain(local)
        {
            let a = strip_p2p(&a).to_string();
            if out.len() == MAX_HEARTBEAT_ADDRS {
                break;
            }
            if a.len() <= MAX_HEARTBEAT_ADDR_BYTES && !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }

    /// Hands a heartbeat's dial hints to Kademlia, whose routing table answers the swarm's
    /// address lookups when a stream is opened to `source` by peer id (a forwarder's first
    /// push to a child it never met). Only hints that decode are kept (checked at decode).
    fn learn_dial_hints(&mut self, source: PeerId, hb: &Heartbeat) {
        if source == *self.swarm.local_peer_id() || self.bans.contains(&source) {
            return;
        }
        for a in &hb.addrs {
            if let Ok(addr) = a.parse::<Multiaddr>() {
                self.swarm.behaviour_mut().kad.add_address(&source, addr);
            }
        }
    }

    /// Records a valid heartbeat in the peer table and passes it on to the role.
    fn on_heartbeat(&mut self, source: PeerId, hb: Heartbeat) {
        self.learn_dial_hints(source, &hb);
        self.counters.heartbeats_received += 1;
        metrics::counter!("p2p_heartbeats_received_total").increment(1);
        let role = hb.role;
        let arrival = self
            .peer(source)
            .record_heartbeat(hb.clone(), Instant::now());
        if arrival != Arrival::Regular {
            let restarted = arrival == Arrival::Restart;
            info!(peer = %source, %role, restarted, "peer joined");
        }
        self.emit(Event::Heartbeat {
            peer: source,
            heartbeat: Box::new(hb),
        });
    }

    /// Only the swarm's learner (when configured) may publish score tables.
    fn authorise_score_table(
        &self,
        source: PeerId,
        table: ScoreTable,
    ) -> Result<ScoreTable, MessageError> {
        match self.cfg.learner {
            Some(l) if l != source => Err(MessageError::Unauthorised(source)),
            _ => Ok(table),
        }
    }

    fn on_score_table(&mut self, source: PeerId, table: ScoreTable) {
        self.learner_scores = Some(table.clone());
        self.emit(Event::ScoreTable {
            from: source,
            table,
        });
    }

    /// Hands a role-validated message to the role; if the event channel is full the message
    /// is ignored (dropped without penalty) so that gossipsub does not wait for a verdict.
    fn hand_to_role(
        &mut self,
        topic: TopicKind,
        propagation_source: PeerId,
        id: MessageId,
        msg: gossipsub::Message,
    ) {
        let ev = Event::Gossip {
            topic,
            message_id: id.clone(),
            propagation_source,
            source: msg.source,
            data: msg.data,
        };
        if self.events.try_send(ev).is_err() {
            self.counters.events_dropped += 1;
            self.swarm
                .behaviour_mut()
                .gossipsub
                .report_message_validation_result(
                    &id,
                    &propagation_source,
                    MessageAcceptance::Ignore,
                );
        }
    }

    fn ignore(&mut self, id: &MessageId, propagation_source: &PeerId) {
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, propagation_source, MessageAcceptance::Ignore);
    }

    fn accept(&mut self, id: &MessageId, propagation_source: &PeerId) {
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, propagation_source, MessageAcceptance::Accept);
    }

    fn reject(
        &mut self,
        propagation_source: PeerId,
        id: &MessageId,
        source: Option<PeerId>,
        topic: TopicKind,
        error: MessageError,
    ) {
        let peer = source.unwrap_or(propagation_source);
        warn!(%peer, via = %propagation_source, ?topic, %error, "dropping invalid gossip message");
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(id, &propagation_source, MessageAcceptance::Reject);
        self.penalise(peer);
        self.emit(Event::Rejected { peer, topic, error });
    }
}
