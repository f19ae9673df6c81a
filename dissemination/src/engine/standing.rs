//! Standing plans (`docs/broadcast.md`, "Warm streams for the first version"): the learner
//! announces the next version's plan ahead of it when that plan will have new pairs and
//! nothing is in flight, so that every parent opens — and fills — its chunk stream to a new
//! child while the links are idle (`session::warm_sessions`).
//!
//! Owns: when and how a standing plan goes out ([`Disseminator::announce_if_due`],
//! [`Disseminator::announce_plan`]). Must not touch: the rule itself
//! (`control::plan::standing_plan_due`), how plans are made (`push::plan_for`), the warm-up
//! (`session`).

use p2p::PeerId;
use tracing::info;

use super::Disseminator;
use crate::error::Result;
use crate::plan_msg::SignedPlan;

impl Disseminator {
    /// Learner: signs and gossips the plan for `version` before its manifest exists — a
    /// standing plan, as soon as the workers it is for are known — so that every parent opens
    /// the chunk streams to its children ahead of the first chunk (`session`, the warm-up);
    /// the learner opens its own to the first hops here. `publish` of `version` keeps this
    /// plan when the workers and their order are unchanged (so the plan the warm streams were
    /// opened for is the one pushed on), and signs the next sequence number otherwise.
    /// Returns `None` (nothing announced) for a version not newer than the newest published
    /// one, and while that one is in flight (`control::plan::nothing_in_flight`: an active
    /// worker has not reported it installed): a plan for the next version replaces the plan
    /// the pushes in flight run on, and would take their children away from them. When to
    /// announce: [`Self::announce_if_due`].
    pub async fn announce_plan(
        &self,
        version: u64,
        workers: Option<Vec<(PeerId, f64)>>,
    ) -> Result<Option<SignedPlan>> {
        // Before anything is published nothing can be in flight: no peer view to read.
        let published = self.lock().manifest_version.is_some();
        let peers = if published {
            self.inner.client.peers().await?
        } else {
            Vec::new()
        };
        self.announce(version, workers, &peers).await
    }

    /// [`Self::announce_plan`] against `peers`, the peer view the in-flight check reads.
    async fn announce(
        &self,
        version: u64,
        workers: Option<Vec<(PeerId, f64)>>,
        peers: &[p2p::PeerView],
    ) -> Result<Option<SignedPlan>> {
        let _planning = self.inner.planning.lock().await;
        let published = self.lock().manifest_version;
        if published.is_some_and(|p| p >= version)
            || !control::plan::nothing_in_flight(&p2p::active_installs(peers), published)
        {
            return Ok(None);
        }
        let plan = self.plan_for(version, workers).await?;
        self.lock().plan = Some(plan.clone());
        info!(
            version,
            chains = plan.plan.chains.len(),
            fetch_only = plan.plan.fetch_only.len(),
            "standing plan announced"
        );
        self.count(
            |c| &c.plans_announced,
            1,
            "dissemination_plans_announced_total",
        );
        self.gossip_plan(&plan, "standing plan").await;
        self.warm_sessions();
        Ok(Some(plan))
    }

    /// Learner: announces the next version's plan ahead of it when a standing plan is due
    /// (`control::plan::standing_plan_due` over `peers`, this node's peer view: active
    /// workers the current plan was not made for, or a next version that starts a plan epoch
    /// and re-draws the seats, and nothing in flight). Whoever publishes calls it at every
    /// change of the peer view (the learner's publisher) or between versions (the broadcast
    /// benchmark). Once announced, the current plan is the next version's and names every
    /// active worker (a plan seats each, excluded ones as fetch-only), so the same plan is
    /// never announced twice.
    pub async fn announce_if_due(&self, peers: &[p2p::PeerView]) -> Result<Option<SignedPlan>> {
        let (published, planned, plan_version) = {
            let st = self.lock();
            let plan = st.plan.as_ref();
            (
                st.manifest_version,
                plan.map(|p| p.plan.to_plan().members()),
                plan.map(|p| p.plan.version),
            )
        };
        let Some(published) = published else {
            return Ok(None);
        };
        let next = published + 1;
        let active: Vec<(PeerId, Option<u64>)> = peers
            .iter()
            .filter(|p| p.is_worker() && p.active)
            .map(|p| (p.peer, p.installed_version))
            .collect();
        let redraw =
            control::seats::redraws(next, plan_version, self.inner.cfg.plan.epoch_versions);
        if !control::plan::standing_plan_due(planned.as_ref(), &active, Some(published), redraw) {
            return Ok(None);
        }
        self.announce(next, None, peers).await
    }
}
