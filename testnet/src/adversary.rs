//! The `adversary` scenario (`docs/adversary.md`): does the swarm catch its malicious workers?
//!
//! Real `echo-node run` processes on 127.0.0.1. A *clean run* (one learner, two honest
//! workers) and *attacked runs* of the same length: the same swarm plus one malicious worker
//! per attack, a few attacks per run (`--batch`; 13 processes at once would measure the host,
//! not the defences). A malicious worker is an ordinary node started with
//! `ECHO_NODE_MISBEHAVE=<attack>` (`echo_node::misbehave`). In a run with
//! `replay_after_restart`, honest worker `w0` is killed and restarted halfway, so the replay
//! meets a restarted worker.
//!
//! Every second the learner's `/status` (and the workers') is read as untyped JSON, so the
//! scenario compiles and runs before the defences' fields exist and picks them up once they
//! do. Per attack:
//! - `detected`: some evidence against the malicious peer — in the learner's or an honest
//!   worker's peer table a strike (`strikes` > 0), a ban, a rejected message, or the peer's id
//!   as a key of a non-zero counter in the learner section; `evidence` lists what was seen;
//! - `banned`, `ban_reason`, `banned_by`: the first ban seen in the learner's or an honest
//!   worker's peer table (a worker bans a forwarder that fed it corrupt chunks);
//! - `groups_until_ban`: groups that had left the malicious worker's store (pulled, by its own
//!   `/status`: `groups − pending`) when the ban was first seen;
//! - `trained_after_ban`: the learner's `learner_groups_trained_total{producer}` (its
//!   `/metrics`) at the end less its value when the *learner's* ban was first seen (null when
//!   only workers banned the peer: training is the learner's, and a forwarder caught
//!   corrupting chunks by its children still has its verified groups trained);
//! - `learner_crashes`: learner processes that exited during a run;
//! - `reward_clean` / `reward_attacked`: the learner's final `reward_recent` in the clean run
//!   and the mean over the attacked runs;
//! - `groups_trained`: the learner's trained groups of all the attacker's identities (a
//!   `sybil_rekey` worker that wiped its identity is started again on its data dir and comes
//!   back under a new key; `identities` counts them), `share_of_trained`: that over all groups
//!   the learner trained in the run, `forged_trained`: how many of the groups the attacker
//!   lists as forged (`misbehave.forged`) appear among the learner's trained groups
//!   (`steps.jsonl`).
//!
//! Owns the schedule, the measurements and the report. Must not start, signal or stop
//! processes itself: it asks [`crate::harness::Fleet`] to.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use echo_node::misbehave::{Attack, ENV_VAR};
use serde_json::{json, Value};

use crate::harness::{self, Fleet, NodeConfig, Role, START_LIMIT};

/// What to run.
pub struct Settings {
    pub attacks: Vec<Attack>,
    /// Learner steps per run.
    pub steps: u64,
    /// Malicious workers per attacked run.
    pub batch: usize,
    pub warm_start_steps: usize,
    /// Skip the clean run (`reward_clean` is then null).
    pub no_clean: bool,
}

const HEARTBEAT_MS: u64 = 500;
/// A run that has not reached its steps by then is ended and reported as timed out.
fn run_limit(s: &Settings) -> Duration {
    Duration::from_secs(180 + 20 * s.steps + 2 * s.warm_start_steps as u64)
}

/// What one run observed of one malicious worker.
#[derive(Debug, Default, Clone)]
struct Watch {
    attack: String,
    peer_id: String,
    admin: String,
    evidence: Vec<String>,
    banned: bool,
    /// Who banned it first: `learner` or `w<i>` (an honest worker).
    banned_by: Option<String>,
    ban_reason: Option<String>,
    strikes: u64,
    /// `groups − pending` of the worker when the ban was first seen.
    groups_until_ban: Option<u64>,
    trained_at_ban: Option<u64>,
    trained_end: Option<u64>,
    groups_produced: Option<u64>,
    /// Last `groups − pending` the worker reported.
    groups_left: Option<u64>,
    /// What the learner's peer table last showed of the worker's claims.
    claimed_pending: Option<u64>,
    heartbeats_seen: Option<u64>,
    /// The learner's forwarding accounts demoted or excluded it (`forwarding` in its status):
    /// the fault (`slow_parent`, `silent_parent`, `child`).
    demoted: Option<String>,
    /// Earlier identities (re-keyed): their trained groups at the end of their life, and the
    /// part of it trained after the learner banned them.
    past_trained: u64,
    past_trained_after_ban: u64,
    identities: u64,
    /// All groups the learner trained in the run, and which of the attacker's forged groups
    /// it trained (filled at the end).
    run_trained: Option<u64>,
    forged: Option<u64>,
    forged_trained: Option<u64>,
}

impl Watch {
    fn note(&mut self, what: String) {
        if !self.evidence.contains(&what) && self.evidence.len() < 16 {
            self.evidence.push(what);
        }
    }

    /// Trained after the learner banned this identity (`None`: not banned by the learner).
    fn trained_after_ban_now(&self) -> Option<u64> {
        match (self.trained_at_ban, self.trained_end) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            (Some(_), None) => Some(0),
            _ => None,
        }
    }

    /// The worker came back under a new key (`peer_id`, `admin`): what the old identity got
    /// is kept, the per-identity figures start over.
    fn rekeyed(&mut self, peer_id: String, admin: String) {
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

    fn groups_trained(&self) -> u64 {
        self.past_trained + self.trained_end.unwrap_or(0)
    }

    /// The row of this attack; `run` adds the run-wide figures (`groups_trained` of all
    /// producers, honest workers' installs).
    fn report(&self, batch: usize) -> Value {
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
fn peer_evidence(status: &Value, peer: &str, observer: &str) -> Vec<String> {
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
fn honest_strikes(tables: &[&Value], honest_ids: &[String]) -> u64 {
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

fn peer_row<'a>(status: &'a Value, peer: &str) -> Option<&'a Value> {
    status["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer_id"].as_str() == Some(peer))
}

/// What the learner's forwarding accounts (`forwarding` in its status) hold against `peer`:
/// a demotion, an exclusion, silent-forwarding strikes, a separation from a child.
fn forwarding_evidence(f: &Value, peer: &str) -> Vec<String> {
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
fn keyed_counters(v: &Value, peer: &str, path: &str, out: &mut Vec<String>) {
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
fn rejection_counters(learner: &Value) -> Value {
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

/// `learner_groups_trained_total{producer="…"}` of a Prometheus text page, per producer.
pub(crate) fn trained_by_producer(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("learner_groups_trained_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let producer = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("producer=\""))
            .and_then(|p| p.strip_suffix('"'));
        if let (Some(p), Ok(n)) = (producer, value.trim().parse::<f64>()) {
            out.insert(p.to_string(), n as u64);
        }
    }
    out
}

/// `GET path` on a node's admin endpoint (HTTP/1.0, bounded), the body of a 200 answer.
pub(crate) fn http_get(admin: &str, path: &str) -> Option<String> {
    let addr = admin.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {admin}\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.take(64 << 20).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.split_whitespace()
        .nth(1)
        .is_some_and(|c| c == "200")
        .then(|| body.to_string())
}

/// The newest snapshot version whose chunks are all in a stopped node's store
/// (`echo-node inspect snapshots --json`); `None` when it holds none or cannot be read.
fn newest_complete_snapshot(bin: &Path, data_dir: &Path) -> Option<u64> {
    let out = std::process::Command::new(bin)
        .args(["inspect", "snapshots", "--json", "--data-dir"])
        .arg(data_dir)
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["snapshots"]
        .as_array()?
        .iter()
        .filter(|s| s["missing"] == 0)
        .filter_map(|s| s["version"].as_u64())
        .max()
}

pub(crate) fn status(admin: &str) -> Option<Value> {
    serde_json::from_str(&http_get(admin, "/status")?).ok()
}

/// The end of an install measure: the learner has stopped publishing (`max_steps`); waits up
/// to [`SETTLE_LIMIT`] for every worker of `admins` to install its newest version (handing
/// each learner status read meanwhile to `seen`: a verdict may still land), then takes the
/// counters.
pub(crate) fn settle_installs(
    learner: &str,
    admins: &[String],
    installs: &mut InstallWatch,
    mut seen: impl FnMut(&Value),
) {
    let Some(ls) = status(learner) else { return };
    let newest = ls["learner"]["published_version"].as_u64();
    let _ = harness::poll(SETTLE_LIMIT, Duration::from_millis(500), || {
        if let Some(ls) = status(learner) {
            seen(&ls);
        }
        let at = |a: &String| status(a).and_then(|s| s["version"].as_u64());
        Ok(admins.iter().all(|a| at(a) >= newest).then_some(()))
    });
    if let Some(ls) = status(learner) {
        seen(&ls);
        installs.sample(&ls, admins, true);
    }
}

/// How long the end of a run waits for the honest workers to install the final version.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// One run: a learner, two honest workers and one malicious worker per `attacks`.
struct RunResult {
    /// Per honest worker: groups it produced, groups of it the learner trained.
    honest_groups: Vec<(Option<u64>, Option<u64>)>,
    /// Versions the honest workers installed / versions published while they ran.
    honest_install_ratio: Option<f64>,
    /// Groups the learner trained, all producers.
    trained_all: u64,
    /// Workers in the run, honest and malicious.
    workers: usize,
    watches: Vec<Watch>,
    learner_crashed: bool,
    reward: Option<f64>,
    steps: u64,
    timed_out: bool,
    rejections: Value,
    replay: Option<Value>,
    pulled: Option<u64>,
    pruned: Option<u64>,
    /// Strikes against the honest workers ([`honest_strikes`], the most seen during the run).
    honest_strikes: u64,
}

fn honest_env() -> [(&'static str, &'static str); 1] {
    [(ENV_VAR, "")]
}

/// Attacks on what a worker forwards: their runs plan one chain (B0 = B̂w), so that every
/// worker but the tail has a child to harm, with small chunks (the tiny model's snapshot is
/// then some forty chunks, and a trickle is a trickle) and plan epochs of
/// [`FORWARDING_EPOCH`] versions, so that the re-drawn seats put every worker in a forwarding
/// seat within a run. (Seats are drawn by the learner with a seed of its own: no key puts an
/// attacker at the head any more.)
fn forwards(a: Attack) -> bool {
    matches!(
        a,
        Attack::CorruptChunks
            | Attack::SilentForwarder
            | Attack::SilentAfterHonest
            | Attack::SlowForwarder
    )
}

/// Plan epoch (versions) of the forwarding runs.
const FORWARDING_EPOCH: u64 = 4;
/// Chunk size (KiB) of the forwarding runs.
const FORWARDING_CHUNK_KIB: u32 = 64;

/// A counter of a Prometheus text page (`name value`, no labels).
pub(crate) fn counter(metrics: &str, name: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse::<f64>().ok().map(|x| x as u64))?
    })
}

/// Installs (the dissemination engine's `dissemination_installs_total`) of a node.
pub(crate) fn installs(admin: &str) -> Option<u64> {
    counter(
        &http_get(admin, "/metrics")?,
        "dissemination_installs_total",
    )
}

/// `honest_install_ratio`: versions the honest workers installed over versions published,
/// from the learner's and each worker's counters at the start and at the end of the measure.
/// `None` before a start was taken. A worker restarted in between (its counter began again)
/// is left out.
#[derive(Debug, Default)]
pub(crate) struct InstallWatch {
    start: Option<(u64, Vec<Option<u64>>)>,
    end: Option<(u64, Vec<Option<u64>>)>,
    restarted: Vec<usize>,
}

impl InstallWatch {
    /// Takes the start, or the end. The start is taken at a quiet moment: the learner has
    /// published and every worker has installed exactly the version the learner last counted
    /// as published. The learner counts a version once its publication returns, and workers
    /// may install it before that; a start taken between the two counted that install but
    /// not the publication, and read one version short per worker (0.93 in a run where every
    /// honest worker installed every version). The end is taken by [`settle_installs`], once
    /// every worker has installed the newest version.
    pub(crate) fn sample(&mut self, learner: &Value, admins: &[String], end: bool) {
        let Some(published) = learner["learner"]["snapshots_published"].as_u64() else {
            return;
        };
        if !end && (self.start.is_some() || published == 0) {
            return;
        }
        if end {
            let counts = admins.iter().map(|a| installs(a)).collect();
            self.end = Some((published, counts));
            return;
        }
        // Quiet before and after the counters are read: no install can fall between.
        let newest = learner["learner"]["published_version"].as_u64();
        let quiet = || {
            admins.iter().all(|a| {
                newest.is_some() && status(a).and_then(|s| s["version"].as_u64()) == newest
            })
        };
        if !quiet() {
            return;
        }
        let counts = admins.iter().map(|a| installs(a)).collect();
        if quiet() {
            self.start = Some((published, counts));
        }
    }

    pub(crate) fn restarted(&mut self, worker: usize) {
        self.restarted.push(worker);
    }

    pub(crate) fn ratio(&self) -> Option<f64> {
        let ((p0, i0), (p1, i1)) = (self.start.as_ref()?, self.end.as_ref()?);
        let published = p1.checked_sub(*p0)?;
        let (mut got, mut want) = (0u64, 0u64);
        for (w, (a, b)) in i0.iter().zip(i1).enumerate() {
            if self.restarted.contains(&w) {
                continue;
            }
            let (Some(a), Some(b)) = (a, b) else { continue };
            got += b.saturating_sub(*a).min(published);
            want += published;
        }
        (want > 0).then(|| got as f64 / want as f64)
    }
}

fn run_once(
    bin: &Path,
    root: &Path,
    s: &Settings,
    attacks: &[Attack],
) -> anyhow::Result<RunResult> {
    let swarm = "tn-adversary";
    let ldir = root.join("learner");
    std::fs::create_dir_all(&ldir)?;
    let key = harness::keygen(bin, &ldir)?;
    let mut lc = harness::node_config(Role::Learner, swarm, &ldir, HEARTBEAT_MS);
    lc.learner.warm_start_steps = s.warm_start_steps;
    // Training stops at the run's last step, so the honest workers' installs can be counted
    // against a final version.
    lc.learner.max_steps = s.steps;
    if attacks.iter().any(|a| forwards(*a)) {
        // One chain (B0 = B̂w), so workers forward to each other: a forwarding attacker harms,
        // and can be caught through, only the children it feeds.
        lc.network.learner_mbps = lc.broadcast.worker_mbps;
        lc.storage.chunk_size_kib = FORWARDING_CHUNK_KIB;
        lc.broadcast.plan_epoch = FORWARDING_EPOCH;
    }
    let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
    let li = fleet.start_with_env(bin, "learner", &lc, &[], &honest_env())?;
    let laddr = fleet.wait_addresses(li, &lc, START_LIMIT)?;
    let bootstrap = laddr
        .dial_addr()
        .context("the learner has no TCP address")?;
    let worker = |name: &str| {
        let mut w = harness::node_config(Role::Rollout, swarm, &root.join(name), HEARTBEAT_MS);
        w.learner_public_key = Some(key.clone());
        w.network.bootstrap = vec![bootstrap.clone()];
        w.storage.max_pending_groups = 4;
        w
    };
    let mut honest = Vec::new();
    for name in ["w0", "w1"] {
        let c = worker(name);
        honest.push((fleet.start_with_env(bin, name, &c, &[], &honest_env())?, c));
    }
    let mut bad = Vec::new();
    for a in attacks {
        let name = format!("bad-{a}");
        let c = worker(&name);
        let env = [(ENV_VAR, a.name())];
        bad.push((fleet.start_with_env(bin, &name, &c, &[], &env)?, c, *a));
    }
    let (mut honest_admins, mut honest_ids) = (Vec::new(), Vec::new());
    for (i, c) in &honest {
        let f = fleet.wait_addresses(*i, c, START_LIMIT)?;
        honest_admins.push(f.admin);
        honest_ids.push(f.peer_id);
    }
    // Per honest worker: groups produced (its status) and trained (the learner's counter).
    let mut honest_groups = vec![(None::<u64>, None::<u64>); honest.len()];
    let mut struck_honest = 0u64;
    let mut watches = Vec::new();
    for (i, c, a) in &bad {
        let f = fleet.wait_addresses(*i, c, START_LIMIT)?;
        watches.push(Watch {
            attack: a.name().into(),
            peer_id: f.peer_id,
            admin: f.admin,
            identities: 1,
            ..Watch::default()
        });
    }
    let replay = attacks.contains(&Attack::ReplayAfterRestart);
    let mut restart: Option<ReplayWatch> = None;
    let mut installs = InstallWatch::default();
    let (t0, limit) = (Instant::now(), run_limit(s));
    let mut last_learner = Value::Null;
    let mut trained_all = 0u64;
    let (mut learner_crashed, mut timed_out) = (false, false);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(code) = fleet.exit_status(li) {
            eprintln!("adversary: the learner exited ({code}) during {attacks:?}");
            learner_crashed = true;
            break;
        }
        let Some(ls) = status(&laddr.admin) else {
            continue;
        };
        let version = ls["learner"]["version"].as_u64().unwrap_or(0);
        let trained = http_get(&laddr.admin, "/metrics")
            .map(|m| trained_by_producer(&m))
            .unwrap_or_default();
        let honest_status: Vec<Value> = honest_admins.iter().filter_map(|a| status(a)).collect();
        let tables: Vec<&Value> = std::iter::once(&ls).chain(&honest_status).collect();
        struck_honest = struck_honest.max(honest_strikes(&tables, &honest_ids));
        for w in &mut watches {
            observe(w, &ls, &honest_status, &trained);
        }
        installs.sample(&ls, &honest_admins, false);
        trained_all = trained.values().sum::<u64>().max(trained_all);
        for (g, (st, id)) in honest_groups
            .iter_mut()
            .zip(honest_status.iter().zip(&honest_ids))
        {
            g.0 = st["rollout"]["groups"].as_u64().or(g.0);
            g.1 = trained.get(id).copied().or(g.1);
        }
        rekey_restarts(&mut fleet, bin, &mut bad, &mut watches)?;
        let run_trained: u64 = trained.values().sum();
        if let Some(r) = &mut restart {
            r.sample(&honest_admins[0]);
        }
        if replay && restart.is_none() && version >= s.steps / 2 {
            installs.restarted(0);
            restart = Some(ReplayWatch::restart(
                &mut fleet,
                bin,
                &honest[0],
                &mut honest_admins[0],
            )?);
        }
        last_learner = ls["learner"].clone();
        for w in &mut watches {
            w.run_trained = Some(run_trained);
        }
        if version >= s.steps {
            break;
        }
        if t0.elapsed() > limit {
            eprintln!(
                "adversary: run {attacks:?} did not reach {} steps in {limit:?}",
                s.steps
            );
            timed_out = true;
            break;
        }
    }
    if !learner_crashed {
        settle_installs(&laddr.admin, &honest_admins, &mut installs, |ls| {
            let honest_status: Vec<Value> =
                honest_admins.iter().filter_map(|a| status(a)).collect();
            let trained = http_get(&laddr.admin, "/metrics")
                .map(|m| trained_by_producer(&m))
                .unwrap_or_default();
            for w in &mut watches {
                observe(w, ls, &honest_status, &trained);
            }
        });
    }
    let unclean = fleet.stop(harness::STOP_GRACE);
    if !unclean.is_empty() {
        eprintln!("adversary: nodes that did not stop cleanly: {unclean:?}");
    }
    let trained_ids = trained_group_ids(&ldir);
    for (w, (_, c, _)) in watches.iter_mut().zip(&bad) {
        let forged = forged_group_ids(&c.data_dir);
        w.forged = Some(forged.len() as u64);
        w.forged_trained = Some(forged.intersection(&trained_ids).count() as u64);
    }
    Ok(RunResult {
        honest_groups,
        honest_install_ratio: installs.ratio(),
        trained_all,
        workers: honest.len() + bad.len(),
        watches,
        learner_crashed,
        reward: last_learner["reward_recent"].as_f64(),
        steps: last_learner["version"].as_u64().unwrap_or(0),
        timed_out,
        rejections: rejection_counters(&last_learner),
        pulled: last_learner["groups_pulled"].as_u64(),
        pruned: last_learner["groups_pruned"].as_u64(),
        replay: restart.map(|r| r.report()),
        honest_strikes: struck_honest,
    })
}

/// Starts again every `sybil_rekey` worker that exited after wiping its identity (it comes
/// back under a new key on the same data dir), and points its watch at the new identity.
fn rekey_restarts(
    fleet: &mut Fleet,
    bin: &Path,
    bad: &mut [(usize, NodeConfig, Attack)],
    watches: &mut [Watch],
) -> anyhow::Result<()> {
    for ((i, c, a), w) in bad.iter_mut().zip(watches.iter_mut()) {
        let rekeyed = fleet
            .exit_status(*i)
            .is_some_and(|s| s.code() == Some(echo_node::misbehave::REKEY_EXIT_CODE));
        if !rekeyed {
            continue;
        }
        // Its exit was the attack, not a failure.
        fleet.kill(*i);
        let name = format!("bad-{a}-{}", w.identities + 1);
        *i = fleet.start_with_env(bin, &name, c, &[], &[(ENV_VAR, a.name())])?;
        let f = fleet.wait_addresses(*i, c, START_LIMIT)?;
        eprintln!(
            "adversary: {a} came back as {} (identity {})",
            f.peer_id,
            w.identities + 1
        );
        w.rekeyed(f.peer_id, f.admin);
    }
    Ok(())
}

/// The ids (hex) of the groups the learner trained (`<data_dir>/metrics/steps.jsonl`).
fn trained_group_ids(learner_dir: &Path) -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(learner_dir.join("metrics").join("steps.jsonl"))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| {
            v["trained_groups"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The ids (hex) of the groups a misbehaving worker forged (`misbehave.forged`).
fn forged_group_ids(data_dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(data_dir.join(echo_node::misbehave::FORGED_FILE))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Updates what is known about one malicious worker from this second's statuses.
fn observe(w: &mut Watch, learner: &Value, honest: &[Value], trained: &BTreeMap<String, u64>) {
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
struct ReplayWatch {
    before: Option<u64>,
    /// The newest complete snapshot in the worker's store between the kill and the restart.
    durable: Option<u64>,
    versions: Vec<u64>,
}

impl ReplayWatch {
    fn restart(
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

    fn sample(&mut self, admin: &str) {
        if let Some(v) = status(admin).and_then(|s| s["version"].as_u64()) {
            if self.versions.last() != Some(&v) {
                self.versions.push(v);
            }
        }
    }

    fn report(&self) -> Value {
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

/// Runs the scenario; writes `adversary.json` under `out` and returns the summary.
pub fn run(bin: &Path, s: &Settings, out: &Path) -> anyhow::Result<Value> {
    anyhow::ensure!(
        s.steps >= 1 && s.batch >= 1,
        "--steps and --batch must be >= 1"
    );
    std::fs::create_dir_all(out)?;
    let mut runs = Vec::new();
    let (mut crashes, mut honest_struck) = (0u64, 0u64);
    let reward_clean = if s.no_clean {
        None
    } else {
        eprintln!("adversary: clean run (honest workers only)");
        let r = harness::in_run_dir("tn-adversary-clean-", |root| run_once(bin, root, s, &[]))?;
        crashes += u64::from(r.learner_crashed);
        honest_struck += r.honest_strikes;
        runs.push(run_json("clean", &r));
        r.reward
    };
    let mut attacks = Vec::new();
    let mut rewards = Vec::new();
    // A forwarding attack runs alone: two attackers in one chain would starve the honest
    // workers between them, and the install ratio would no longer be any one attack's.
    let (fwd, other): (Vec<Attack>, Vec<Attack>) = s.attacks.iter().partition(|a| forwards(**a));
    let batches: Vec<&[Attack]> = other.chunks(s.batch).chain(fwd.chunks(1)).collect();
    for (k, batch) in batches.iter().enumerate() {
        let names: Vec<&str> = batch.iter().map(|a| a.name()).collect();
        eprintln!(
            "adversary: run {} of {}: {}",
            k + 1,
            batches.len(),
            names.join(", ")
        );
        let r = harness::in_run_dir("tn-adversary-", |root| run_once(bin, root, s, batch))?;
        crashes += u64::from(r.learner_crashed);
        honest_struck += r.honest_strikes;
        rewards.extend(r.reward);
        attacks.extend(r.watches.iter().map(|w| {
            let mut a = w.report(k);
            if w.attack == Attack::ReplayAfterRestart.name() {
                a["replay"] = r.replay.clone().unwrap_or(Value::Null);
            }
            run_figures(&mut a, w, &r);
            a
        }));
        runs.push(run_json(&names.join(","), &r));
    }
    let reward_attacked =
        (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64);
    let summary = json!({
        "attacks": attacks,
        "learner_crashes": crashes,
        "honest_strikes": honest_struck,
        "reward_clean": reward_clean,
        "reward_attacked": reward_attacked,
        "steps": s.steps,
        "runs": runs.len(),
    });
    let full = json!({ "summary": summary, "runs": runs });
    let path = out.join("adversary.json");
    std::fs::write(&path, format!("{full:#}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(summary)
}

/// The run-wide figures of an attack's row: its share of the groups trained (with the fair
/// share, one over the workers of the run) and the honest workers' install ratio.
fn run_figures(row: &mut Value, w: &Watch, r: &RunResult) {
    // All identities of a re-keyed worker count ([`Watch::groups_trained`]).
    let share = (r.trained_all > 0).then(|| w.groups_trained() as f64 / r.trained_all as f64);
    row["share_of_trained"] = json!(share);
    row["fair_share"] = json!(1.0 / r.workers.max(1) as f64);
    row["honest_install_ratio"] = json!(r.honest_install_ratio);
}

fn run_json(name: &str, r: &RunResult) -> Value {
    json!({
        "attacks": name,
        "steps_reached": r.steps,
        "timed_out": r.timed_out,
        "learner_crashed": r.learner_crashed,
        "honest_strikes": r.honest_strikes,
        "reward": r.reward,
        "learner_rejections": r.rejections,
        "learner_groups_pulled": r.pulled,
        "learner_groups_pruned": r.pruned,
        "replay": r.replay,
        "honest_install_ratio": r.honest_install_ratio,
        "groups_trained_all": r.trained_all,
        "honest_workers": r.honest_groups.iter().map(|(p, t)| json!({
            "groups_produced": p, "groups_trained": t
        })).collect::<Vec<_>>(),
        "workers": r.watches.iter().map(|w| w.report(0)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honest_strikes_take_the_worst_table_per_honest_worker() {
        let learner = json!({"peers": [
            {"peer_id": "h0", "strikes": 1}, {"peer_id": "bad", "strikes": 3}, {"peer_id": "h1"}
        ]});
        let w0 =
            json!({"peers": [{"peer_id": "h1", "strikes": 2}, {"peer_id": "h0", "strikes": 0}]});
        let ids = ["h0".to_string(), "h1".to_string()];
        assert_eq!(
            honest_strikes(&[&learner, &w0], &ids),
            3,
            "h0: 1, h1: 2; bad not counted"
        );
        assert_eq!(honest_strikes(&[&json!({})], &ids), 0);
    }

    #[test]
    fn evidence_is_read_from_whatever_fields_the_peer_table_has() {
        let learner = json!({
            "peers": [
                {"peer_id": "bad", "strikes": 3, "banned": true, "ban_reason": "bad_signature",
                 "rejected_messages": 0},
                {"peer_id": "good", "strikes": 0},
                {"peer_id": "old"}
            ],
            "learner": {"pull_rejections": {"by_peer": {"bad": {"signature": 2}}}}
        });
        let e = peer_evidence(&learner, "bad", "learner");
        assert_eq!(
            e,
            ["learner: banned (bad_signature)", "learner: strikes = 3"]
        );
        assert!(peer_evidence(&learner, "good", "learner").is_empty());
        assert!(
            peer_evidence(&learner, "old", "learner").is_empty(),
            "no fields yet: no evidence"
        );
        assert!(peer_evidence(&learner, "absent", "learner").is_empty());
        let mut keyed = Vec::new();
        keyed_counters(&learner["learner"], "bad", "", &mut keyed);
        assert_eq!(keyed.len(), 1);
        assert!(
            keyed[0].starts_with("learner: pull_rejections.by_peer.bad"),
            "{keyed:?}"
        );

        let mut w = Watch {
            peer_id: "bad".into(),
            groups_left: Some(5),
            ..Watch::default()
        };
        let trained = BTreeMap::from([("bad".to_string(), 4u64)]);
        observe(&mut w, &learner, &[], &trained);
        assert!(w.banned && w.strikes == 3);
        assert_eq!(w.groups_until_ban, Some(5));
        let mut later = trained.clone();
        later.insert("bad".into(), 6);
        observe(&mut w, &learner, &[], &later);
        let r = w.report(0);
        assert_eq!(r["trained_after_ban"], 2, "{r}");
        assert_eq!(r["detected"], true);
    }

    #[test]
    fn trained_groups_per_producer_are_parsed_from_prometheus_text() {
        let text = "# TYPE learner_groups_trained_total counter\n\
                    learner_groups_trained_total{producer=\"12D3a\"} 7\n\
                    learner_groups_trained_total{producer=\"12D3b\"} 0\n\
                    learner_groups_trained_totally{producer=\"x\"} 1\n\
                    learner_version 3\n";
        let m = trained_by_producer(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m["12D3a"], 7);
        assert_eq!(m["12D3b"], 0);
    }

    #[test]
    fn a_replayed_install_that_goes_back_is_a_regression() {
        let watch = |before, durable, versions: &[u64]| ReplayWatch {
            before: Some(before),
            durable,
            versions: versions.to_vec(),
        };
        assert_eq!(watch(4, Some(4), &[4, 6, 8]).report()["regressed"], false);
        assert_eq!(watch(4, Some(4), &[6, 2, 8]).report()["regressed"], true);
        assert_eq!(watch(4, Some(4), &[2]).report()["regressed"], true);
        assert_eq!(watch(4, None, &[2]).report()["regressed"], true);
        // Killed before its newest snapshot reached the disk: it resumes on the older one it
        // holds, then only moves forward.
        assert_eq!(watch(6, Some(4), &[4, 6, 8]).report()["regressed"], false);
        assert_eq!(watch(6, Some(4), &[4, 2]).report()["regressed"], true);
    }

    #[test]
    fn rejection_counters_keep_only_the_defence_fields() {
        let l = json!({"version": 3, "pull_rejected": {"signature": 1}, "groups_pulled": 9,
                       "peers_banned": 1});
        let r = rejection_counters(&l);
        assert_eq!(
            r,
            json!({"pull_rejected": {"signature": 1}, "peers_banned": 1})
        );
    }
}
