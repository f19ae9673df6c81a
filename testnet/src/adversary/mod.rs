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
//! processes itself: it asks [`crate::harness::Fleet`] to. What a run observes of a
//! malicious worker and the evidence rules are [`evidence`]'s; reading nodes' status, metrics
//! and stores is [`probes`]'.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use echo_node::misbehave::{Attack, ENV_VAR};
use serde_json::{json, Value};

use crate::harness::{self, Fleet, NodeConfig, Role, START_LIMIT};

mod evidence;
mod probes;
mod sybils;

use evidence::{
    fault_lines, honest_strike_reasons, honest_strikes, observe, rejection_counters, ReplayWatch,
    Watch,
};
use probes::{forged_group_ids, trained_group_ids};
pub(crate) use probes::{http_get, settle_installs, status, trained_by_producer, InstallWatch};

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
    /// Honest workers per run.
    pub honest: usize,
    /// Clean runs: `reward_clean` is their mean, `reward_clean_spread` their range.
    pub clean_runs: usize,
}

const HEARTBEAT_MS: u64 = 500;
/// A run that has not reached its steps by then is ended and reported as timed out.
fn run_limit(s: &Settings) -> Duration {
    Duration::from_secs(180 + 20 * s.steps + 2 * s.warm_start_steps as u64)
}

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
    /// Who struck them and why ([`honest_strike_reasons`], as last seen).
    honest_strike_reasons: Vec<String>,
    /// What the learner's forwarding accounts held against an honest worker at the end
    /// (demoted, excluded, separated from a child), one line each, prefixed with its id.
    honest_forwarding: Vec<String>,
    /// The `young_sybils` row, when the run had them.
    sybils: Option<Value>,
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
            | Attack::OverfeedParent
            | Attack::FramingReceipts
    )
}

/// Processes (identities) an attack runs as: `framing_receipts` takes two fresh children
/// lying together (it takes two children's receipts to accuse a parent); the others one.
fn identities(a: Attack) -> usize {
    if a == Attack::FramingReceipts {
        2
    } else {
        1
    }
}

/// Plan epoch (versions) of the forwarding runs.
const FORWARDING_EPOCH: u64 = 4;
/// Chunk size (KiB) of the forwarding runs.
const FORWARDING_CHUNK_KIB: u32 = 64;

/// The processes of one run: the learner, two honest workers and one malicious worker per
/// attack, started and answering.
struct Launched {
    fleet: Fleet,
    /// The learner's fleet index, admin endpoint and data dir.
    learner: usize,
    learner_admin: String,
    learner_dir: std::path::PathBuf,
    /// Honest workers (fleet index, config), their admin endpoints and peer ids.
    honest: Vec<(usize, NodeConfig)>,
    honest_admins: Vec<String>,
    honest_ids: Vec<String>,
    /// Malicious workers (fleet index, config, attack) and what the run watches of each.
    bad: Vec<(usize, NodeConfig, Attack)>,
    watches: Vec<Watch>,
    /// What a worker's config needs: the learner's key and bootstrap address.
    key: String,
    bootstrap: String,
}

/// A worker's config in a run of swarm `tn-adversary` (data dir `root/name`).
fn worker_config(root: &Path, name: &str, key: &str, bootstrap: &str) -> NodeConfig {
    let mut w = harness::node_config(
        Role::Rollout,
        "tn-adversary",
        &root.join(name),
        HEARTBEAT_MS,
    );
    w.learner_public_key = Some(key.to_string());
    w.network.bootstrap = vec![bootstrap.to_string()];
    w.storage.max_pending_groups = 4;
    w
}

/// Starts one run's swarm under `root`: the learner (one chain when an attack forwards), the
/// honest workers `w0`, `w1`, and `bad-<attack>` per attack with its `ECHO_NODE_MISBEHAVE`;
/// returns once every node answers.
fn launch(bin: &Path, root: &Path, s: &Settings, attacks: &[Attack]) -> anyhow::Result<Launched> {
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
    if attacks.contains(&Attack::YoungSybils) {
        lc.verification.probation_secs = sybils::PROBATION_SECS;
    }
    let mut fleet = Fleet::with_log_filter(&harness::node_log_filter());
    let li = fleet.start_with_env(bin, "learner", &lc, &[], &honest_env())?;
    let laddr = fleet.wait_addresses(li, &lc, START_LIMIT)?;
    let bootstrap = laddr
        .dial_addr()
        .context("the learner has no TCP address")?;
    let worker = |name: &str| worker_config(root, name, &key, &bootstrap);
    let mut honest = Vec::new();
    for name in (0..s.honest).map(|i| format!("w{i}")) {
        let c = worker(&name);
        honest.push((fleet.start_with_env(bin, &name, &c, &[], &honest_env())?, c));
    }
    let mut bad = Vec::new();
    // `young_sybils` join later, once the honest workers are established (`sybils`).
    for a in attacks.iter().filter(|a| **a != Attack::YoungSybils) {
        for k in 0..identities(*a) {
            let name = match k {
                0 => format!("bad-{a}"),
                k => format!("bad-{a}-{}", k + 1),
            };
            let c = worker(&name);
            let env = [(ENV_VAR, a.name())];
            bad.push((fleet.start_with_env(bin, &name, &c, &[], &env)?, c, *a));
        }
    }
    let (mut honest_admins, mut honest_ids) = (Vec::new(), Vec::new());
    for (i, c) in &honest {
        let f = fleet.wait_addresses(*i, c, START_LIMIT)?;
        honest_admins.push(f.admin);
        honest_ids.push(f.peer_id);
    }
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
    Ok(Launched {
        fleet,
        learner: li,
        learner_admin: laddr.admin,
        learner_dir: ldir,
        honest,
        honest_admins,
        honest_ids,
        bad,
        watches,
        key,
        bootstrap,
    })
}

/// Per malicious worker, how many groups it forged (its own list) and how many of those the
/// learner trained (its step log), read from the stopped nodes' data dirs.
fn count_forged(watches: &mut [Watch], bad: &[(usize, NodeConfig, Attack)], learner_dir: &Path) {
    let trained_ids = trained_group_ids(learner_dir);
    for (w, (_, c, _)) in watches.iter_mut().zip(bad) {
        let forged = forged_group_ids(&c.data_dir);
        w.forged = Some(forged.len() as u64);
        w.forged_trained = Some(forged.intersection(&trained_ids).count() as u64);
    }
}

fn run_once(
    bin: &Path,
    root: &Path,
    s: &Settings,
    attacks: &[Attack],
) -> anyhow::Result<RunResult> {
    let Launched {
        mut fleet,
        learner: li,
        learner_admin,
        learner_dir: ldir,
        honest,
        mut honest_admins,
        honest_ids,
        mut bad,
        mut watches,
        key,
        bootstrap,
    } = launch(bin, root, s, attacks)?;
    let mut sybils = attacks
        .contains(&Attack::YoungSybils)
        .then(sybils::Sybils::default);
    // Per honest worker: groups produced (its status) and trained (the learner's counter).
    let mut honest_groups = vec![(None::<u64>, None::<u64>); honest.len()];
    let mut struck_honest = 0u64;
    let mut struck_reasons = Vec::new();
    let replay = attacks.contains(&Attack::ReplayAfterRestart);
    let mut restart: Option<ReplayWatch> = None;
    let mut installs = InstallWatch::default();
    let (t0, limit) = (Instant::now(), run_limit(s));
    let mut last_learner = Value::Null;
    let mut last_forwarding = Value::Null;
    let mut trained_all = 0u64;
    let (mut learner_crashed, mut timed_out) = (false, false);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(code) = fleet.exit_status(li) {
            eprintln!("adversary: the learner exited ({code}) during {attacks:?}");
            learner_crashed = true;
            break;
        }
        let Some(ls) = status(&learner_admin) else {
            continue;
        };
        let version = ls["learner"]["version"].as_u64().unwrap_or(0);
        let trained = http_get(&learner_admin, "/metrics")
            .map(|m| trained_by_producer(&m))
            .unwrap_or_default();
        let honest_status: Vec<Value> = honest_admins.iter().filter_map(|a| status(a)).collect();
        let tables: Vec<&Value> = std::iter::once(&ls).chain(&honest_status).collect();
        struck_honest = struck_honest.max(honest_strikes(&tables, &honest_ids));
        let reasons = honest_strike_reasons(&tables, &honest_ids);
        if !reasons.is_empty() {
            struck_reasons = reasons;
        }
        for w in &mut watches {
            observe(w, &ls, &honest_status, &trained);
        }
        installs.sample(&ls, &honest_admins, false);
        trained_all = trained.values().sum::<u64>().max(trained_all);
        if let Some(sy) = &mut sybils {
            let worker = |name: &str| worker_config(root, name, &key, &bootstrap);
            sy.maybe_join(&mut fleet, bin, &ls, trained_all, &worker)?;
            sy.sample(&ls, &trained);
        }
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
        last_forwarding = ls["forwarding"].clone();
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
        settle_installs(&learner_admin, &honest_admins, &mut installs, |ls| {
            let honest_status: Vec<Value> =
                honest_admins.iter().filter_map(|a| status(a)).collect();
            let trained = http_get(&learner_admin, "/metrics")
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
    count_forged(&mut watches, &bad, &ldir);
    if struck_honest > 0 {
        // The learner's own words for it (the error behind a strike is in its log).
        struck_reasons.extend(fault_lines(&echo_node::fleet::log_path(&ldir), &honest_ids));
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
        honest_strike_reasons: struck_reasons,
        honest_forwarding: honest_ids
            .iter()
            .flat_map(|id| {
                evidence::forwarding_evidence(&last_forwarding, id)
                    .into_iter()
                    .map(move |e| format!("{id}: {e}"))
            })
            .collect(),
        sybils: sybils.map(|sy| sy.report(0, struck_honest)),
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

/// Runs the scenario; writes `adversary.json` under `out` and returns the summary.
pub fn run(bin: &Path, s: &Settings, out: &Path) -> anyhow::Result<Value> {
    anyhow::ensure!(
        s.steps >= 1 && s.batch >= 1,
        "--steps and --batch must be >= 1"
    );
    if !s.attacks.is_empty() {
        harness::require_features(bin, &["adversary"])?;
    }
    std::fs::create_dir_all(out)?;
    let mut tally = Tally::default();
    let mut clean = Vec::new();
    if !s.no_clean {
        for k in 0..s.clean_runs.max(1) {
            eprintln!("adversary: clean run {} (honest workers only)", k + 1);
            let r = harness::in_run_dir("tn-adversary-clean-", |root| run_once(bin, root, s, &[]))?;
            tally.add("clean", &r);
            clean.extend(r.reward);
        }
    }
    let reward_clean = (!clean.is_empty()).then(|| clean.iter().sum::<f64>() / clean.len() as f64);
    let clean_spread = (!clean.is_empty()).then(|| {
        let lo = clean.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = clean.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        [lo, hi]
    });
    let mut attacks = Vec::new();
    let mut rewards = Vec::new();
    // A forwarding attack runs alone: two attackers in one chain would starve the honest
    // workers between them, and the install ratio would no longer be any one attack's.
    // So does `young_sybils`: its run's learner has a shorter probation.
    let (fwd, other): (Vec<Attack>, Vec<Attack>) = s
        .attacks
        .iter()
        .partition(|a| forwards(**a) || **a == Attack::YoungSybils);
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
        tally.add(&names.join(","), &r);
        rewards.extend(r.reward);
        attacks.extend(r.watches.iter().map(|w| {
            let mut a = w.report(k);
            if w.attack == Attack::ReplayAfterRestart.name() {
                a["replay"] = r.replay.clone().unwrap_or(Value::Null);
            }
            run_figures(&mut a, w, &r);
            a["reward_clean"] = json!(reward_clean);
            a
        }));
        if let Some(mut row) = r.sybils.clone() {
            row["run"] = json!(k);
            row["reward_run"] = json!(r.reward);
            row["reward_clean"] = json!(reward_clean);
            row["honest_install_ratio"] = json!(r.honest_install_ratio);
            attacks.push(row);
        }
    }
    let reward_attacked =
        (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64);
    let summary = json!({
        "attacks": attacks,
        "learner_crashes": tally.crashes,
        "honest_strikes": tally.honest_struck,
        "honest_strike_reasons": tally.struck_reasons,
        "reward_clean": reward_clean,
        "reward_clean_runs": clean,
        "reward_clean_spread": clean_spread,
        "reward_attacked": reward_attacked,
        "steps": s.steps,
        "runs": tally.runs.len(),
    });
    let full = json!({ "summary": summary, "runs": tally.runs });
    let path = out.join("adversary.json");
    std::fs::write(&path, format!("{full:#}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(summary)
}

/// What every run adds to the summary: its learner crash, its honest strikes and their reasons
/// (each line prefixed with the run's name), and its row of `adversary.json`.
#[derive(Default)]
struct Tally {
    crashes: u64,
    honest_struck: u64,
    struck_reasons: Vec<String>,
    runs: Vec<Value>,
}

impl Tally {
    fn add(&mut self, name: &str, r: &RunResult) {
        self.crashes += u64::from(r.learner_crashed);
        self.honest_struck += r.honest_strikes;
        let reasons = r
            .honest_strike_reasons
            .iter()
            .map(|w| format!("{name}: {w}"));
        self.struck_reasons.extend(reasons);
        self.runs.push(run_json(name, r));
    }
}

/// The run-wide figures of an attack's row: its share of the groups trained (with the fair
/// share, one over the workers of the run) and the honest workers' install ratio.
fn run_figures(row: &mut Value, w: &Watch, r: &RunResult) {
    // All identities of a re-keyed worker count ([`Watch::groups_trained`]).
    let share = (r.trained_all > 0).then(|| w.groups_trained() as f64 / r.trained_all as f64);
    row["share_of_trained"] = json!(share);
    row["fair_share"] = json!(1.0 / r.workers.max(1) as f64);
    row["honest_install_ratio"] = json!(r.honest_install_ratio);
    row["honest_strikes"] = json!(r.honest_strikes);
    row["honest_forwarding"] = json!(r.honest_forwarding);
    // The honest workers' reward in this run (the learner's recent reward: it trains on the
    // honest workers' groups too), to set against the clean run's.
    row["reward_run"] = json!(r.reward);
    row["honest_groups_trained"] = json!(r
        .honest_groups
        .iter()
        .map(|(_, t)| t.unwrap_or(0))
        .sum::<u64>());
}

fn run_json(name: &str, r: &RunResult) -> Value {
    json!({
        "attacks": name,
        "steps_reached": r.steps,
        "timed_out": r.timed_out,
        "learner_crashed": r.learner_crashed,
        "honest_strikes": r.honest_strikes,
        "honest_strike_reasons": r.honest_strike_reasons,
        "honest_forwarding": r.honest_forwarding,
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
    use super::evidence::{keyed_counters, peer_evidence};
    use super::*;
    use std::collections::BTreeMap;

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
    fn fault_lines_are_the_log_lines_that_blame_an_honest_worker() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        std::fs::write(
            &log,
            "INFO started\n\
             WARN pull failed by the worker's fault peer=h0 error=timed out\n\
             WARN pull failed by the worker's fault peer=bad error=oversized\n\
             INFO h0 connected\n",
        )
        .unwrap();
        let lines = super::evidence::fault_lines(&log, &["h0".to_string()]);
        assert_eq!(
            lines,
            vec!["WARN pull failed by the worker's fault peer=h0 error=timed out".to_string()]
        );
        assert!(super::evidence::fault_lines(&dir.path().join("none"), &[]).is_empty());
    }

    #[test]
    fn an_honest_strike_names_its_observer_and_reasons() {
        let learner = json!({"role": "learner", "peers": [
            {"peer_id": "h0", "strikes": 1, "strikes_by_reason": {"heartbeat_flood": 1}},
            {"peer_id": "bad", "strikes": 3, "strikes_by_reason": {"replay": 3}},
            {"peer_id": "h1", "strikes": 0}
        ]});
        let w0 =
            json!({"role": "rollout", "peer_id": "h0", "peers": [{"peer_id": "h1", "strikes": 0}]});
        let ids = ["h0".to_string(), "h1".to_string()];
        assert_eq!(
            honest_strike_reasons(&[&learner, &w0], &ids),
            vec![r#"learner struck h0: {"heartbeat_flood":1}"#.to_string()],
            "the attacker's strikes and unstruck workers are not listed"
        );
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
