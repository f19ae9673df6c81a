//! What one adversary run observed of a malicious worker ([`Watch`]) and the rules that read
//! evidence out of the nodes' status JSON: strikes, bans, rejections, forwarding verdicts.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::honest_env;
use super::probes::{newest_complete_snapshot, status};
use crate::harness::{Fleet, NodeConfig, START_LIMIT};

/// What one run observed of one malicious worker.
#[derive(Debug, Default, Clone)]
pub(super) struct Watch {
    pub(super) attack: String,
    pub(super) peer_id: String,
    pub(super) admin: String,
    pub(super) evidence: Vec<String>,
    pub(super) banned: bool,
    /// Who banned it first: `learner` or `w<i>` (an honest worker).
    pub(super) banned_by: Option<String>,
    pub(super) ban_reason: Option<String>,
    pub(super) strikes: u64,
    /// `groups − pending` of the worker when the ban was first seen.
    pub(super) groups_until_ban: Option<u64>,
    pub(super) trained_at_ban: Option<u64>,
    pub(super) trained_end: Option<u64>,
    pub(super) groups_produced: Option<u64>,
    /// Last `groups − pending` the worker reported.
    pub(super) groups_left: Option<u64>,
    /// What the learner's peer table last showed of the worker's claims.
    pub(super) claimed_pending: Option<u64>,
    pub(super) heartbeats_seen: Option<u64>,
    /// The learner's forwarding accounts demoted or excluded it (`forwarding` in its status):
    /// the fault (`slow_parent`, `silent_parent`, `child`).
    pub(super) demoted: Option<String>,
    /// Earlier identities (re-keyed): their trained groups at the end of their life, and the
    /// part of it trained after the learner banned them.
    pub(super) past_trained: u64,
    pub(super) past_trained_after_ban: u64,
    pub(super) identities: u64,
    /// All groups the learner trained in the run, and which of the attacker's forged groups
    /// it trained (filled at the end).
    pub(super) run_trained: Option<u64>,
    pub(super) forged: Option<u64>,
    pub(super) forged_trained: Option<u64>,
}

impl Watch {
    pub(super) fn note(&mut self, what: String) {
        if !self.evidence.contains(&what) && self.evidence.len() < 16 {
            self.evidence.push(what);
        }
    }

    /// Trained after the learner banned this identity (`None`: not banned by the learner).
    pub(super) fn trained_after_ban_now(&self) -> Option<u64> {
        match (self.trained_at_ban, self.trained_end) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            (Some(_), None) => Some(0),
            _ => None,
        }
    }

    /// The worker came back under a new key (`peer_id`, `admin`): what the old identity got
    /// is kept, the per-identity figures start over.
    pub(super) fn rekeyed(&mut self, peer_id: String, admin: String) {
        if let Some(n) = self.trained_after_ban_now() {
            self.past_trained_after_ban += n;
        }
        self.past_trained += self.trained_end.unwrap_or(0);
        self.identities += 1;
        self.peer_id = peer_id;
        self.admin = admin;
        self.trained_at_ban = None;
        self.trained_end = None;
    }

    pub(super) fn groups_trained(&self) -> u64 {
        self.past_trained + self.trained_end.unwrap_or(0)
    }

    /// The row of this attack; `run` adds the run-wide figures (`groups_trained` of all
    /// producers, honest workers' installs).
    pub(super) fn report(&self, batch: usize) -> Value {
        let trained_after_ban = match self.trained_after_ban_now() {
            Some(n) => Some(n + self.past_trained_after_ban),
            None if self.past_trained_after_ban > 0 || self.identities > 1 => {
                Some(self.past_trained_after_ban)
            }
            None => None,
        };
        json!({
            "attack": self.attack,
            "detected": !self.evidence.is_empty(),
            "banned": self.banned,
            "groups_until_ban": self.groups_until_ban,
            "trained_after_ban": trained_after_ban,
            "ban_reason": self.ban_reason,
            "banned_by": self.banned_by,
            "strikes": self.strikes,
            "evidence": self.evidence,
            "peer_id": self.peer_id,
            "groups_produced": self.groups_produced,
            "groups_left_store": self.groups_left,
            "claimed_pending": self.claimed_pending,
            "heartbeats_seen_by_learner": self.heartbeats_seen,
            "groups_trained": self.groups_trained(),
            "demoted": self.demoted,
            "share_of_trained": self
                .run_trained
                .filter(|t| *t > 0)
                .map(|t| self.groups_trained() as f64 / t as f64),
            "identities": self.identities.max(1),
            "groups_forged": self.forged,
            "forged_trained": self.forged_trained,
            "run": batch,
        })
    }
}

/// Evidence against `peer` in one node's peer table (`observer` names the node).
pub(super) fn peer_evidence(status: &Value, peer: &str, observer: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(row) = peer_row(status, peer) else {
        return out;
    };
    if row["banned"].as_bool() == Some(true) {
        let why = row["ban_reason"].as_str().unwrap_or("?");
        out.push(format!("{observer}: banned ({why})"));
    }
    for field in ["strikes", "rejected_messages"] {
        if let Some(n) = row[field].as_u64().filter(|n| *n > 0) {
            out.push(format!("{observer}: {field} = {n}"));
        }
    }
    out
}

/// Strikes against the honest workers `honest_ids` (peer ids): for each, the most any of the
/// `tables` (status documents: the learner's, the honest workers') records, summed. An honest
/// worker must never be struck; a non-zero figure is a false positive of some check.
pub(super) fn honest_strikes(tables: &[&Value], honest_ids: &[String]) -> u64 {
    honest_ids
        .iter()
        .map(|id| {
            tables
                .iter()
                .filter_map(|t| peer_row(t, id))
                .filter_map(|row| row["strikes"].as_u64())
                .max()
                .unwrap_or(0)
        })
        .sum()
}

/// Why the honest workers were struck, one line per observer and struck honest worker:
/// `"<observer> struck <peer id>: {reason: count, …}"`, the observer named by its own status
/// (`learner`, or `worker <its peer id>`). Reported beside [`honest_strikes`] so that a false
/// positive names the check that made it.
pub(super) fn honest_strike_reasons(tables: &[&Value], honest_ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for table in tables {
        let observer = match table["role"].as_str() {
            Some("learner") => "learner".to_string(),
            _ => format!("worker {}", table["peer_id"].as_str().unwrap_or("?")),
        };
        for id in honest_ids {
            if let Some(row) = peer_row(table, id).filter(|r| r["strikes"].as_u64() > Some(0)) {
                out.push(format!(
                    "{observer} struck {id}: {}",
                    row["strikes_by_reason"]
                ));
            }
        }
    }
    out
}

/// The lines of the node log at `log` that blame one of `honest_ids` (a strike's warning names
/// the peer and says "fault"), at most five, each cut to 400 characters: the error behind an
/// honest strike, for the report. Nothing when the log cannot be read.
pub(super) fn fault_lines(log: &std::path::Path, honest_ids: &[String]) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("fault") && honest_ids.iter().any(|id| l.contains(id.as_str())))
        .take(5)
        .map(|l| l.chars().take(400).collect())
        .collect()
}

pub(super) fn peer_row<'a>(status: &'a Value, peer: &str) -> Option<&'a Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"].as_str() == Some(peer))
}

/// What the learner's forwarding accounts (`forwarding` in its status) hold against `peer`:
/// a demotion, an exclusion, silent-forwarding strikes, a separation from a child.
pub(super) fn forwarding_evidence(f: &Value, peer: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(fault) = f["demoted"][peer].as_str() {
        out.push(format!("learner: forwarding demoted ({fault})"));
    }
    if f["excluded"]
        .as_array()
        .is_some_and(|x| x.iter().any(|p| p.as_str() == Some(peer)))
    {
        out.push("learner: forwarding excluded".into());
    }
    if let Some(n) = f["silent_strikes"][peer].as_u64().filter(|n| *n > 0) {
        out.push(format!("learner: silent_forwarding strikes = {n}"));
    }
    let separated = f["separated"].as_array().into_iter().flatten();
    if separated
        .filter_map(Value::as_array)
        .any(|pair| pair.first().and_then(Value::as_str) == Some(peer))
    {
        out.push("learner: forwarding separated from a child".into());
    }
    out
}

/// Counters in the learner section keyed by `peer` (e.g. rejections per peer), as
/// `path = n` for the non-zero ones: found by walking the section, whatever it is called.
pub(super) fn keyed_counters(v: &Value, peer: &str, path: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            if k == peer {
                let n = match x {
                    Value::Number(n) => n.as_f64().unwrap_or(0.0),
                    Value::Object(o) => o.values().filter_map(Value::as_f64).sum(),
                    _ => 0.0,
                };
                if n > 0.0 {
                    out.push(format!("learner: {p} = {x}"));
                }
            } else {
                keyed_counters(x, peer, &p, out);
            }
        }
    }
}

/// The learner section's counters whose name says "reject" (per reason, where it says).
pub(super) fn rejection_counters(learner: &Value) -> Value {
    let mut out = serde_json::Map::new();
    if let Value::Object(m) = learner {
        for (k, v) in m {
            if k.contains("reject") || k.contains("strike") || k.contains("ban") {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Updates what is known about one malicious worker from this second's statuses.
pub(super) fn observe(
    w: &mut Watch,
    learner: &Value,
    honest: &[Value],
    trained: &BTreeMap<String, u64>,
) {
    let own = status(&w.admin);
    if let Some(r) = own.as_ref().map(|s| &s["rollout"]) {
        let groups = r["groups"].as_u64();
        w.groups_produced = groups.or(w.groups_produced);
        if let Some(g) = groups {
            w.groups_left = Some(g.saturating_sub(r["pending"].as_u64().unwrap_or(0)));
        }
    }
    // A producer the learner never trained has no series: 0 once the page lists any.
    let mine = trained
        .get(&w.peer_id)
        .copied()
        .or_else(|| (!trained.is_empty()).then_some(0));
    w.trained_end = mine.or(w.trained_end);
    for e in peer_evidence(learner, &w.peer_id, "learner") {
        w.note(e);
    }
    for (i, h) in honest.iter().enumerate() {
        for e in peer_evidence(h, &w.peer_id, &format!("w{i}")) {
            w.note(e);
        }
    }
    let mut keyed = Vec::new();
    keyed_counters(&learner["learner"], &w.peer_id, "", &mut keyed);
    for e in keyed {
        w.note(e);
    }
    for e in forwarding_evidence(&learner["forwarding"], &w.peer_id) {
        w.note(e);
    }
    let f = &learner["forwarding"];
    if let Some(fault) = f["demoted"][&w.peer_id].as_str() {
        w.demoted = Some(fault.to_string());
    }
    let excluded = f["excluded"].as_array();
    if excluded.is_some_and(|x| x.iter().any(|p| p.as_str() == Some(&w.peer_id))) {
        w.demoted = Some("silent_parent".into());
    }
    if let Some(row) = peer_row(learner, &w.peer_id) {
        w.strikes = w.strikes.max(row["strikes"].as_u64().unwrap_or(0));
        w.claimed_pending = row["pending"].as_u64().or(w.claimed_pending);
        w.heartbeats_seen = row["heartbeats"].as_u64().or(w.heartbeats_seen);
    }
    // Banned by the learner, or by an honest worker it attacked (a corrupting forwarder is
    // caught by the children it fed: the evidence, bytes that do not match the signed
    // manifest, is theirs and cannot be handed on).
    let observers = std::iter::once(("learner".to_string(), learner))
        .chain(honest.iter().enumerate().map(|(i, h)| (format!("w{i}"), h)));
    for (name, view) in observers {
        let Some(row) = peer_row(view, &w.peer_id) else {
            continue;
        };
        let by_learner = name == "learner";
        if row["banned"].as_bool() == Some(true) && !w.banned {
            w.banned = true;
            w.ban_reason = row["ban_reason"].as_str().map(String::from);
            w.groups_until_ban = w.groups_left.or(Some(0));
            w.banned_by = Some(name);
        }
        // Training is the learner's: what it trained after *its* ban is what the ban must
        // stop. A peer banned by a worker only (a corrupting forwarder) still has its
        // verified groups trained; that is not counted here.
        if w.trained_at_ban.is_none() && by_learner && row["banned"].as_bool() == Some(true) {
            w.trained_at_ban = Some(mine.unwrap_or(0));
        }
    }
}

/// The honest worker restarted under a replay: does its installed version ever go back?
///
/// A `kill -9` may cost the worker its newest snapshot (the chunk store's memory tier writes
/// behind, `docs/storage.md`): it comes back on the newest *complete* snapshot of its own
/// store, which may be older than what it had installed. That is its own state, not a replay;
/// a replay would show as an install below that durable version, or as a step back later.
pub(super) struct ReplayWatch {
    pub(super) before: Option<u64>,
    /// The newest complete snapshot in the worker's store between the kill and the restart.
    pub(super) durable: Option<u64>,
    pub(super) versions: Vec<u64>,
}

impl ReplayWatch {
    pub(super) fn restart(
        fleet: &mut Fleet,
        bin: &Path,
        (i, config): &(usize, NodeConfig),
        admin: &mut String,
    ) -> anyhow::Result<ReplayWatch> {
        let before = status(admin).and_then(|s| s["version"].as_u64());
        fleet.kill(*i);
        let durable = newest_complete_snapshot(bin, &config.data_dir);
        let j = fleet.start_with_env(bin, "w0-restarted", config, &[], &honest_env())?;
        *admin = fleet.wait_addresses(j, config, START_LIMIT)?.admin;
        eprintln!(
            "adversary: w0 restarted (installed version before: {before:?}, newest complete on disk: {durable:?})"
        );
        Ok(ReplayWatch {
            before,
            durable,
            versions: Vec::new(),
        })
    }

    pub(super) fn sample(&mut self, admin: &str) {
        if let Some(v) = status(admin).and_then(|s| s["version"].as_u64()) {
            if self.versions.last() != Some(&v) {
                self.versions.push(v);
            }
        }
    }

    pub(super) fn report(&self) -> Value {
        // Without a durable snapshot on disk the floor is what it had installed.
        let floor = self.durable.or(self.before);
        let regressed = self.versions.windows(2).any(|w| w[1] < w[0])
            || matches!((floor, self.versions.iter().min()), (Some(f), Some(m)) if *m < f);
        json!({
            "installed_before_restart": self.before,
            "durable_at_restart": self.durable,
            "installed_after_restart": self.versions,
            "regressed": regressed,
        })
    }
}
