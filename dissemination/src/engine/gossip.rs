//! Accepting what the learner signs — manifests, plans, activation orders — from gossip or a
//! stream hello, and the learner's plan repair when a forwarder departs.
//!
//! Owns: the acceptance rules (learner key, this swarm, a version or sequence that moves
//! forward — also across restarts, through the persisted [`storage::replay`] marks;
//! `docs/broadcast.md`, "Trust"). Must not touch: wire layouts, chunk transfer.

use std::time::Instant;

use p2p::{PeerId, TopicKind, Validation};
use storage::replay::Freshness;
use storage::SignedManifest;
use tracing::{debug, info, warn};

use super::{DisseminationEvent, Disseminator};
use crate::error::Result;
use crate::order_msg::{ActivationOrder, SignedOrder};
use crate::plan_msg::{PlanMessage, SignedPlan};

impl Disseminator {
    /// Verdict on a manifest: `Accept` (newer, or the same one again), `Ignore` (older: a
    /// replay — also one older than what this node accepted before a restart), `Reject`
    /// (undecodable, wrong swarm, not signed by the learner key).
    pub fn accept_manifest(&self, signed: &SignedManifest) -> Validation {
        if let Err(e) = signed.verify(&self.inner.cfg.learner_key) {
            warn!(error = %e, "rejecting manifest");
            return Validation::Reject;
        }
        let v = signed.manifest.version;
        if signed.manifest.swarm_id != self.inner.cfg.swarm_id {
            warn!(swarm = %signed.manifest.swarm_id, "rejecting manifest of another swarm");
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            match st.manifest_version {
                Some(cur) if v < cur => return Validation::Ignore,
                Some(cur) if v == cur => {
                    return if st.manifests.get(&v) == Some(signed) {
                        Validation::Accept
                    } else {
                        Validation::Ignore
                    };
                }
                _ => {}
            }
            // Before a restart this node may have accepted newer (or another manifest of
            // this version): the persisted marks decide, and record a new one durably.
            let digest = *blake3::hash(&signed.encode()).as_bytes();
            if !self.fresh(self.inner.replay.accept_manifest(v, digest), "manifest", v) {
                return Validation::Ignore;
            }
            st.manifest_version = Some(v);
            st.manifests.insert(v, signed.clone());
            // Per-version bookkeeping is kept for the last 8 versions only.
            let recent = |k: &u64| k.saturating_add(8) > v;
            st.manifests.retain(|k, _| recent(k));
            st.accepted_at.retain(|k, _| recent(k));
            st.transfers.retain(|k, _| recent(k));
            st.pushing.retain(|(k, _)| recent(k));
            st.accepted_at.insert(v, Instant::now());
        }
        if let Err(e) = self.inner.store.put_manifest(signed) {
            warn!(error = %e, version = v, "cannot store manifest");
            return Validation::Ignore;
        }
        info!(
            version = v,
            chunks = signed.manifest.chunk_hashes.len(),
            "manifest accepted"
        );
        if !self.is_learner() {
            self.start_acquire(v);
        }
        self.start_forwarding();
        Validation::Accept
    }

    /// Verdict on a plan, with the same rules; a newer plan (re)starts forwarding.
    pub fn accept_plan(&self, signed: &SignedPlan) -> Validation {
        if let Err(e) = signed.verify(&self.inner.cfg.learner_key) {
            warn!(error = %e, "rejecting plan");
            return Validation::Reject;
        }
        let p = &signed.plan;
        if p.swarm_id != self.inner.cfg.swarm_id {
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            if let Some(cur) = &st.plan {
                let (cv, cs) = (cur.plan.version, cur.plan.seq);
                if (p.version, p.seq) < (cv, cs) {
                    return Validation::Ignore;
                }
                if (p.version, p.seq) == (cv, cs) {
                    return if cur == signed {
                        Validation::Accept
                    } else {
                        Validation::Ignore
                    };
                }
            }
            let digest = *blake3::hash(&signed.encode()).as_bytes();
            let marks = self.inner.replay.accept_plan(p.version, p.seq, digest);
            if !self.fresh(marks, "plan", p.seq) {
                return Validation::Ignore;
            }
            st.plan = Some(signed.clone());
        }
        debug!(version = p.version, seq = p.seq, "plan accepted");
        // Acquirers that waited without a plan learn how they are fed now.
        self.inner.stored.send_modify(|_| {});
        self.start_forwarding();
        // A child this node never pushed to gets its stream now, before the manifest.
        self.warm_sessions();
        Validation::Accept
    }

    /// Verdict on an activation order: the learner's key and signature, this swarm, a
    /// sequence that moves forward. An accepted order that names this node is passed to the
    /// role as [`DisseminationEvent::Activation`].
    pub fn accept_order(&self, signed: &SignedOrder) -> Validation {
        let o = match signed.verify(&self.inner.cfg.learner_key) {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "rejecting activation order");
                return Validation::Reject;
            }
        };
        if o.swarm_id != self.inner.cfg.swarm_id {
            return Validation::Reject;
        }
        {
            let mut st = self.lock();
            if st.order_seq.is_some_and(|s| o.seq <= s) {
                return Validation::Ignore;
            }
            if !self.fresh(self.inner.replay.accept_order(o.seq), "order", o.seq) {
                return Validation::Ignore;
            }
            st.order_seq = Some(o.seq);
        }
        if let Some(active) = o.state_of(&self.inner.local) {
            debug!(seq = o.seq, active, "activation order accepted");
            let _ = self
                .inner
                .events
                .send(DisseminationEvent::Activation { seq: o.seq, active });
        }
        Validation::Accept
    }

    /// Whether the persisted marks let a message through (new, or the very one accepted
    /// last); a mark that cannot be written refuses it (a restart would forget it).
    fn fresh(&self, verdict: storage::Result<Freshness>, what: &str, n: u64) -> bool {
        match verdict {
            Ok(Freshness::New | Freshness::Same) => true,
            Ok(Freshness::Stale) => {
                metrics::counter!("dissemination_replays_refused_total").increment(1);
                warn!(
                    what,
                    n, "refusing a signed {what} older than one accepted before"
                );
                false
            }
            Err(e) => {
                warn!(error = %e, what, "cannot persist the replay marks; not accepting");
                false
            }
        }
    }

    /// Learner: sign and gossip an activation order (`seq` must grow; use the clock in ms).
    pub async fn publish_order(
        &self,
        seq: u64,
        active: Vec<PeerId>,
        standby: Vec<PeerId>,
    ) -> Result<SignedOrder> {
        let key = self.signing_key()?;
        let signed = ActivationOrder {
            swarm_id: self.inner.cfg.swarm_id.clone(),
            seq,
            created_unix_ms: storage::unix_ms(),
            learner_key: self.inner.cfg.learner_key.to_bytes(),
            active,
            standby,
        }
        .sign(&key)?;
        self.inner
            .client
            .publish(TopicKind::Plans, signed.encode())
            .await?;
        Ok(signed)
    }

    /// Validates a Snapshots / Plans gossip message (the role reports the verdict).
    pub fn on_gossip(&self, topic: TopicKind, data: &[u8]) -> Validation {
        match topic {
            TopicKind::Snapshots => match SignedManifest::decode(data) {
                Ok(m) => self.accept_manifest(&m),
                Err(e) => {
                    warn!(error = %e, "undecodable manifest");
                    Validation::Reject
                }
            },
            TopicKind::Plans if SignedOrder::is_order(data) => match SignedOrder::decode(data) {
                Ok(o) => self.accept_order(&o),
                Err(e) => {
                    warn!(error = %e, "undecodable activation order");
                    Validation::Reject
                }
            },
            TopicKind::Plans => match SignedPlan::decode(data) {
                Ok(p) => self.accept_plan(&p),
                Err(e) => {
                    warn!(error = %e, "undecodable plan");
                    Validation::Reject
                }
            },
            _ => Validation::Ignore,
        }
    }

    /// A peer went away: any node closes the chunk stream it kept open to it. Learner: if it
    /// forwards in the current plan, excise it (its tail moves up to its nearest surviving
    /// ancestor, `ChainPlan::excise`), re-sign with the next sequence number, gossip, and push
    /// to any new first hop.
    pub async fn on_peer_disconnected(&self, peer: PeerId) {
        self.forget_session(peer);
        let Ok(key) = self.signing_key() else {
            return;
        };
        let new = {
            let mut st = self.lock();
            let Some(cur) = st.plan.clone() else { return };
            let mut plan = cur.plan.to_plan();
            if !plan.excise(&peer) {
                return;
            }
            let mut msg = PlanMessage::from_plan(
                &self.inner.cfg.swarm_id,
                cur.plan.version,
                cur.plan.seq + 1,
                &self.inner.cfg.learner_key,
                &plan,
            );
            msg.created_unix_ms = storage::unix_ms();
            match msg.sign(&key) {
                Ok(s) => {
                    st.plan = Some(s.clone());
                    let chunk = st
                        .manifests
                        .get(&cur.plan.version)
                        .map_or(0, |m| u64::from(m.manifest.chunk_size));
                    st.accounts.planned(cur.plan.version, chunk, &plan);
                    s
                }
                Err(_) => return,
            }
        };
        info!(%peer, seq = new.plan.seq, "excised a departed forwarder; plan re-signed");
        self.gossip_plan(&new, "re-signed plan").await;
        self.start_forwarding();
    }

    /// Learner: gossips a signed plan on the plans topic; a failure (no mesh peers yet) is
    /// only logged — the plan also travels in every push's hello.
    pub(super) async fn gossip_plan(&self, plan: &SignedPlan, what: &str) {
        if let Err(e) = self
            .inner
            .client
            .publish(TopicKind::Plans, plan.encode())
            .await
        {
            debug!(error = %e, "{what} not gossiped (no mesh peers yet?)");
        }
    }
}
