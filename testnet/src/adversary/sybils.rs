//! The `young_sybils` attack of the adversary scenario: [`SYBILS`] fresh identities whose
//! data passes every check join once the honest workers are established (past probation), and
//! the run measures how much of the training they take while they are young — against the
//! probation share, which covers every young identity together — and over the whole run.
//!
//! Owns: when the identities join and what is measured of them. Must not touch: the
//! processes (started through [`Fleet`]) or the evidence rules.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::harness::{Fleet, NodeConfig, START_LIMIT};
use echo_node::misbehave::{Attack, ENV_VAR};

/// Fresh identities the attack starts.
pub const SYBILS: usize = 3;
/// The learner's probation time (s) in a run with `young_sybils` (the default, 120 s, would
/// make the run several minutes longer and measure nothing more).
pub const PROBATION_SECS: u64 = 30;

/// The sybils of one run.
#[derive(Debug, Default)]
pub(super) struct Sybils {
    /// Their peer ids, once started.
    ids: Vec<String>,
    /// The learner version when they joined.
    joined_at_version: Option<u64>,
    /// Groups the learner had trained, all producers, when they joined.
    trained_all_at_join: u64,
    /// While any of them was on probation: their trained groups and everyone's since joining.
    young_trained: u64,
    young_all: u64,
    /// The learner version when the last of them left probation (`None`: never in the run).
    graduated_at_version: Option<u64>,
    trained_end: u64,
    trained_all_end: u64,
    probation_share: Option<f64>,
}

impl Sybils {
    /// Starts the sybils once the learner shows two established workers (the honest ones);
    /// `worker` makes a worker config for a data dir name.
    pub(super) fn maybe_join(
        &mut self,
        fleet: &mut Fleet,
        bin: &Path,
        learner: &Value,
        trained_all: u64,
        worker: &dyn Fn(&str) -> NodeConfig,
    ) -> anyhow::Result<()> {
        if self.joined_at_version.is_some() {
            return Ok(());
        }
        let established = learner["learner"]["admission"]["established_workers"]
            .as_u64()
            .unwrap_or(0);
        if established < 2 {
            return Ok(());
        }
        for k in 0..SYBILS {
            let name = format!("sybil-{k}");
            let c = worker(&name);
            let i = fleet.start_with_env(
                bin,
                &name,
                &c,
                &[],
                &[(ENV_VAR, Attack::YoungSybils.name())],
            )?;
            let f = fleet.wait_addresses(i, &c, START_LIMIT)?;
            self.ids.push(f.peer_id);
        }
        let version = learner["learner"]["version"].as_u64().unwrap_or(0);
        eprintln!("adversary: {SYBILS} young sybils joined at version {version}");
        self.joined_at_version = Some(version);
        self.trained_all_at_join = trained_all;
        self.probation_share = learner["learner"]["admission"]["probation_share"].as_f64();
        Ok(())
    }

    /// One observation: the learner's status and trained groups per producer.
    pub(super) fn sample(&mut self, learner: &Value, trained: &BTreeMap<String, u64>) {
        if self.joined_at_version.is_none() {
            return;
        }
        let mine: u64 = self.ids.iter().filter_map(|id| trained.get(id)).sum();
        let all: u64 = trained.values().sum();
        self.trained_end = self.trained_end.max(mine);
        self.trained_all_end = self.trained_all_end.max(all);
        if self.graduated_at_version.is_some() {
            return;
        }
        let workers = learner["learner"]["admission"]["workers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let young = self.ids.iter().any(|id| {
            workers
                .iter()
                .find(|w| w["peer_id"].as_str() == Some(id))
                .is_none_or(|w| w["probation"].as_bool() != Some(false))
        });
        if young {
            self.young_trained = mine;
            self.young_all = all.saturating_sub(self.trained_all_at_join);
        } else {
            self.graduated_at_version = learner["learner"]["version"].as_u64();
        }
    }

    /// The attack's row.
    pub(super) fn report(&self, run: usize, honest_strikes: u64) -> Value {
        let share = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        let young_share = share(self.young_trained, self.young_all);
        json!({
            "attack": Attack::YoungSybils.name(),
            "detected": false,
            "banned": false,
            "identities": self.ids.len(),
            "peer_ids": self.ids,
            "joined_at_version": self.joined_at_version,
            "graduated_at_version": self.graduated_at_version,
            "groups_trained": self.trained_end,
            "groups_trained_while_young": self.young_trained,
            "groups_trained_all_while_young": self.young_all,
            "share_while_young": young_share,
            "share_since_join": share(
                self.trained_end,
                self.trained_all_end.saturating_sub(self.trained_all_at_join)
            ),
            "share_of_trained": share(self.trained_end, self.trained_all_end),
            "probation_share": self.probation_share,
            "within_probation_share": match (young_share, self.probation_share) {
                (Some(s), Some(p)) => Some(s <= p + 1e-9),
                _ => None,
            },
            "honest_strikes": honest_strikes,
            "run": run,
        })
    }
}
