//! `echo-node demo [--workers N] [--steps K] [--json]`: the one-command local swarm.
//!
//! Writes a learner config and N worker configs (embedded model, `--task`, default `arith`;
//! `kuhn-poker` trains against the exploitable `always-bet` opponent) under a temporary
//! directory, starts each as its own `echo-node run` process on 127.0.0.1, follows
//! the learner through its admin endpoint, and once the learner has taken K steps stops every
//! node with SIGTERM and prints a summary computed from the learner's `metrics/steps.jsonl`.
//! Every child is killed if the demo itself fails.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use super::status::http_get;
use crate::api::NodeStatus;
use crate::cli::DemoArgs;
use crate::config::{NodeConfig, Role};
use crate::fleet::Fleet;
use crate::roles::progress::{eta_text, terminal_width, Eta, StatusLine};

/// Heartbeat interval of the demo's nodes (fast, so that progress shows quickly).
const HEARTBEAT_MS: u64 = 500;
/// The demo fails if the learner makes no step for this long.
const STALL: Duration = Duration::from_secs(180);
/// Warm-start steps the demo times on this host before starting the swarm: the learner's
/// warm start (the same code, config and device) scaled to its steps sizes the patience
/// before the first version. Kuhn poker's 200 steps took 1.9 s each on a two-core machine
/// shared with other builds and 3.9 s on a more loaded one: no fixed allowance fits both.
const CALIBRATION_STEPS: usize = 3;
/// How much slower than measured the learner's warm start may run (the workers start beside
/// it, the host's load changes) before the demo calls it stalled.
const WARM_SLACK: f64 = 3.0;
/// The demo's swarm name.
const SWARM: &str = "echo-demo";

/// The network settings every demo node shares: loopback only, ports picked by the kernel
/// (read back from the nodes' address files), no discovery beyond the bootstrap address, fast
/// heartbeats.
fn demo_network() -> p2p::NetworkConfig {
    p2p::NetworkConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".into()],
        admin: "127.0.0.1:0".into(),
        mdns: false,
        autonat: false,
        quic: false,
        heartbeat_interval_ms: HEARTBEAT_MS,
        ..p2p::NetworkConfig::default()
    }
}

/// Shows the learner's progress: a progress bar on a terminal, plain lines otherwise; each
/// line fitted to the terminal's width ([`StatusLine::fit`]) and carrying an ETA.
struct Progress {
    out: ProgressOut,
    eta: std::cell::RefCell<Eta>,
}

enum ProgressOut {
    Bar(ProgressBar),
    Lines,
    Quiet,
}

/// Columns of the bar's template before its message: `{bar:30} {pos}/{len} steps `.
fn bar_prefix_width(steps: u64) -> usize {
    30 + 1 + 2 * steps.to_string().len() + 1 + " steps ".len()
}

impl Progress {
    fn new(args: &DemoArgs) -> Self {
        let out = if args.json {
            ProgressOut::Quiet
        } else if std::io::stdout().is_terminal() {
            let bar = ProgressBar::new(args.steps);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            ProgressOut::Bar(bar)
        } else {
            ProgressOut::Lines
        };
        Progress {
            out,
            eta: std::cell::RefCell::new(Eta::new(args.steps)),
        }
    }

    fn say(&self, line: String) {
        match &self.out {
            ProgressOut::Bar(b) => b.println(line),
            ProgressOut::Lines => println!("{line}"),
            ProgressOut::Quiet => {}
        }
    }

    /// Shows `line` for `step`, with the time left, fitted to the terminal (a plain line off a
    /// terminal is shown whole).
    fn update(&self, step: u64, line: (Duration, StatusLine)) {
        let (elapsed, line) = line;
        let left = self.eta.borrow_mut().observe(step, elapsed);
        let line = line.field(1, eta_text(left));
        let width = terminal_width();
        match &self.out {
            ProgressOut::Bar(b) => {
                b.set_position(step);
                let room = width
                    .unwrap_or(100)
                    .saturating_sub(bar_prefix_width(b.length().unwrap_or(0)));
                b.set_message(line.fit(room.max(20)));
            }
            ProgressOut::Lines => println!("{}", line.fit(width.unwrap_or(usize::MAX))),
            ProgressOut::Quiet => {}
        }
    }

    fn finish(&self) {
        if let ProgressOut::Bar(b) = &self.out {
            b.finish_and_clear();
        }
    }
}

pub fn demo(args: &DemoArgs) -> anyhow::Result<()> {
    if args.workers == 0 || args.workers > 16 {
        bail!("--workers must be in 1..=16 (got {})", args.workers);
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if !(args.worker_groups_per_s.is_finite() && args.worker_groups_per_s >= 0.0) {
        bail!("--worker-groups-per-s must be >= 0");
    }
    let tmp;
    let root = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("echo-demo-")
                .tempdir()
                .context("creating a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let exe = std::env::current_exe().context("locating the echo-node binary")?;
    let task = demo_task(args)?;

    // The learner's key is the swarm's authority; workers are told its public key.
    let learner_dir = root.join("learner");
    std::fs::create_dir_all(&learner_dir)?;
    let (key, _) = storage::NodeKey::load_or_create(&learner_dir.join("node.key"))?;
    let learner = learner_config(args, &task, learner_dir.clone());
    let progress = Progress::new(args);
    let warm = warm_start_allowance(&learner)?;
    if let Some(w) = &warm {
        progress.say(format!(
            "warm start: {} steps at {:.2} s each on this host (measured over {}): expected \
             {:.0} s, allowed {:.0} s before the first version",
            w.steps,
            w.step_s,
            w.measured,
            w.expected().as_secs_f64(),
            w.stall().as_secs_f64()
        ));
    }
    let warm_stall = warm.as_ref().map_or(STALL, WarmAllowance::stall);
    let mut fleet = Fleet::default();
    // Every node binds port 0; the learner's bound addresses come back in its address file.
    let i = fleet.start(&exe, "learner", &learner, &[])?;
    let addrs = fleet.wait_addresses(i, &learner, STALL)?;
    let learner_admin = addrs.admin.clone();
    let bootstrap = addrs
        .dial_addr()
        .context("the learner listens on no TCP address")?;
    let mut data_dirs = vec![learner.data_dir.clone()];
    for i in 1..=args.workers {
        let mut w = NodeConfig::new(Role::Rollout, SWARM, root.join(format!("worker-{i}")));
        w.learner_public_key = Some(key.public_hex());
        w.network = demo_network();
        w.task = task.clone();
        w.model.device = args.device;
        w.model.seed = args.seed;
        w.network.bootstrap = vec![bootstrap.clone()];
        w.storage.max_pending_groups = 4;
        w.rollout.max_groups_per_s = args.worker_groups_per_s;
        fleet.start(&exe, &format!("worker-{i}"), &w, &[])?;
        data_dirs.push(w.data_dir.clone());
    }
    progress.say(format!(
        "echo-node demo: 1 learner + {} rollout workers on 127.0.0.1 (embedded model, task {}), \
         {} steps, {} mode, {}, S = {}; data and logs in {}",
        args.workers,
        task.name,
        args.steps,
        mode_name(args.mode),
        args.objective,
        args.staleness,
        root.display()
    ));

    let t0 = Instant::now();
    let final_status = follow_learner(
        &mut fleet,
        args,
        &learner_admin,
        &learner_dir,
        warm_stall,
        &progress,
    )?;
    progress.finish();
    let elapsed = t0.elapsed().as_secs_f64();
    let not_clean = fleet.stop(Duration::from_secs(30));

    // Summary from the learner's step log and the stores (the nodes have exited).
    let steps = read_steps(&learner_dir.join("metrics").join("steps.jsonl"))?;
    let mut invariant_ok = true;
    // The workers' accounting: groups made, and of those discarded below the learner's window.
    let (mut produced, mut discarded) = (0u64, 0u64);
    for dir in &data_dirs {
        let store = storage::TrajectoryStore::open(&storage::DataDir::new(dir).trajectories())?;
        let report = store.check_invariant()?;
        invariant_ok &= report.holds();
        if *dir != learner.data_dir {
            produced += report.counters.produced;
            discarded += report.counters.discarded_stale;
        }
    }
    let mut summary = summarize(&steps, &final_status, elapsed, invariant_ok, &not_clean);
    summary["worker_groups_produced"] = json!(produced);
    summary["worker_groups_discarded_stale"] = json!(discarded);
    summary["mode"] = json!(args.mode);
    summary["objective"] = json!(args.objective);
    summary["staleness"] = json!(args.staleness);
    summary["workers"] = json!(args.workers);
    summary["device"] = json!(args.device.to_string());
    summary["snapshot_dtype"] = json!(args.snapshot_dtype);
    summary["lora_rank"] = json!(args.lora_rank);
    summary["precision"] = json!(args.precision);
    summary["recompute"] = json!(args.recompute);
    summary["lr"] = json!(learner.learner.lr);
    summary["delta"] = json!(learner.broadcast.delta_enabled());
    summary["worker_groups_per_s"] = json!(args.worker_groups_per_s);
    summary["task"] = json!(task.name);
    if let Some(e) = eval_summary(&crate::roles::learner::envs::eval_log(&learner_dir))? {
        summary["eval"] = e;
    }
    if args.json {
        println!("{summary}");
    } else {
        print_text_summary(&summary, elapsed, invariant_ok);
    }
    if !not_clean.is_empty() {
        bail!("nodes did not exit cleanly: {}", not_clean.join(", "));
    }
    anyhow::ensure!(
        invariant_ok,
        "the trajectory accounting invariant does not hold"
    );
    Ok(())
}

/// The learner's warm start as timed on this host.
struct WarmAllowance {
    steps: usize,
    /// Steps timed.
    measured: usize,
    /// Seconds per step (setup included, so an over-estimate).
    step_s: f64,
}

impl WarmAllowance {
    fn expected(&self) -> Duration {
        Duration::from_secs_f64(self.step_s * self.steps as f64)
    }

    /// The stall limit before the first version: the usual limit plus the expected warm
    /// start [`WARM_SLACK`] times over.
    fn stall(&self) -> Duration {
        STALL.saturating_add(self.expected().mul_f64(WARM_SLACK))
    }
}

/// Times [`CALIBRATION_STEPS`] steps of `learner`'s warm start (its model, task and device,
/// in this process) and scales them to its `warm_start_steps`; `None` without a warm start.
fn warm_start_allowance(learner: &NodeConfig) -> anyhow::Result<Option<WarmAllowance>> {
    let steps = learner.learner.warm_start_steps;
    if steps == 0 {
        return Ok(None);
    }
    let mut probe = learner.clone();
    probe.learner.warm_start_steps = CALIBRATION_STEPS.min(steps);
    let device = policy::device::select(probe.model.device)?;
    let (policy, tokenizer) = crate::roles::build_model(&probe, &device)?;
    let t = Instant::now();
    crate::roles::learner::warm_start(&probe, &policy, &tokenizer)
        .context("timing the warm start on this host")?;
    let measured = probe.learner.warm_start_steps;
    Ok(Some(WarmAllowance {
        steps,
        measured,
        step_s: t.elapsed().as_secs_f64() / measured as f64,
    }))
}

/// The demo learner's config: the demo's network, `task`, and the command line's learner
/// settings (LoRA at ten times the learning rate unless `--lr` names one).
fn learner_config(args: &DemoArgs, task: &crate::config::TaskConfig, dir: PathBuf) -> NodeConfig {
    let mut learner = NodeConfig::new(Role::Learner, SWARM, dir);
    learner.network = demo_network();
    learner.task = task.clone();
    learner.model.device = args.device;
    learner.model.seed = args.seed;
    learner.broadcast.dtype = args.snapshot_dtype;
    if args.no_delta {
        learner.broadcast.delta = Some(false);
    }
    let l = &mut learner.learner;
    l.max_steps = args.steps;
    l.warm_start_steps = args
        .warm_start_steps
        .unwrap_or(if task.name == "kuhn-poker" { 200 } else { 60 });
    l.mode = args.mode;
    l.objective = args.objective;
    l.staleness = args.staleness;
    l.kappa = args.kappa;
    if args.lora_rank > 0 {
        // At the full fine-tuning rate: 10x does not learn on the embedded task.
        l.lora = Some(policy::LoraConfig::new(args.lora_rank, 32.0));
    }
    // Checked by the parser (finite, > 0).
    if let Some(lr) = args.lr {
        l.lr = lr;
    }
    l.precision = args.precision;
    l.recompute = args.recompute;
    learner
}

/// Follows the learner's status until it finished its steps (or `--minutes` ran out after its
/// first version), showing progress; fails when a node died, the admin endpoint does not
/// answer, or the learner made no step for too long (`warm_stall` before its first version,
/// which allows for the warm start).
fn follow_learner(
    fleet: &mut Fleet,
    args: &DemoArgs,
    learner_admin: &str,
    learner_dir: &Path,
    warm_stall: Duration,
    progress: &Progress,
) -> anyhow::Result<NodeStatus> {
    let t0 = Instant::now();
    let (mut last_step, mut last_change) = (None::<u64>, Instant::now());
    let mut last_print = Instant::now() - Duration::from_secs(60);
    // When the learner reported its first version (the --minutes budget starts there).
    let mut rl_start: Option<Instant> = None;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        fleet.ensure_running()?;
        let Some(v) = http_get(learner_admin, "/status")
            .ok()
            .and_then(|b| serde_json::from_str::<NodeStatus>(&b).ok())
        else {
            anyhow::ensure!(
                t0.elapsed() < STALL,
                "the learner's admin endpoint did not answer"
            );
            continue;
        };
        let version = v.learner.as_ref().map(|l| l.version);
        if version != last_step {
            last_step = version;
            last_change = Instant::now();
        }
        // Before version 0 the learner is warm-starting: allow for it.
        let stall = if version.is_some() { STALL } else { warm_stall };
        anyhow::ensure!(
            last_change.elapsed() < stall,
            "the learner made no step for {stall:?}; learner log:\n{}",
            crate::fleet::tail(&crate::fleet::log_path(learner_dir), 20)
        );
        if rl_start.is_none() && version.is_some() {
            rl_start = Some(Instant::now());
        }
        let out_of_time = args.minutes > 0.0
            && rl_start.is_some_and(|t| t.elapsed().as_secs_f64() > args.minutes * 60.0);
        let done = v.learner.as_ref().is_some_and(|l| l.finished) || out_of_time;
        if last_print.elapsed() >= Duration::from_secs(2) || done {
            last_print = Instant::now();
            progress.update(version.unwrap_or(0), progress_line(&v, t0.elapsed()));
        }
        if done {
            return Ok(v);
        }
    }
}

/// The demo's summary for people (`--json` prints the object itself).
fn print_text_summary(summary: &serde_json::Value, elapsed: f64, invariant_ok: bool) {
    println!(
        "summary: {} steps in {:.0}s, reward {:.3} -> {:.3} (first/last tenth of steps), bubble ratio {:.3}, \
         {} snapshots published, worker versions {}, Δmax {}, accounting invariant {}",
        summary["steps"],
        elapsed,
        summary["reward_first"].as_f64().unwrap_or(f64::NAN),
        summary["reward_last"].as_f64().unwrap_or(f64::NAN),
        summary["bubble_ratio"].as_f64().unwrap_or(f64::NAN),
        summary["snapshots"],
        summary["worker_versions"],
        summary["staleness_max"],
        if invariant_ok { "holds" } else { "VIOLATED" },
    );
    if let Some(e) = summary.get("eval") {
        println!(
            "exact EV against `{}`: {:+.4} (v{}) -> {:+.4} (v{}); best response {:+.4}; \
             exploitability {:.4} -> {:.4}",
            e["opponent"].as_str().unwrap_or("?"),
            e["start"].as_f64().unwrap_or(f64::NAN),
            e["version_start"],
            e["end"].as_f64().unwrap_or(f64::NAN),
            e["version_end"],
            e["best_response"].as_f64().unwrap_or(f64::NAN),
            e["exploitability_start"].as_f64().unwrap_or(f64::NAN),
            e["exploitability_end"].as_f64().unwrap_or(f64::NAN),
        );
    }
}

/// The demo's `[task]`: `--task` with `--task-params`, or the demo's defaults for it.
fn demo_task(args: &DemoArgs) -> anyhow::Result<crate::config::TaskConfig> {
    let params = match (&args.task_params, args.task.as_str()) {
        (Some(p), _) => serde_json::from_str(p).context("--task-params is not JSON")?,
        // Illegal words pay a chip on top of the passive action's outcome (reward shaping,
        // docs/environments.md), so that RL does not learn to fold by saying anything.
        (None, "kuhn-poker") => json!({ "opponent": "always-bet", "illegal_penalty": 1.0 }),
        (None, _) => json!({}),
    };
    let task = crate::config::TaskConfig::from_cli(&args.task, params)?;
    let env = task.build_env()?;
    task.budget(env.as_ref())?;
    Ok(task)
}

/// `{"opponent", "start", "end", "best_response"}`: the exact expected values of the first
/// and last evaluated versions (environments with an exact evaluator; `None` otherwise).
fn eval_summary(path: &Path) -> anyhow::Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let lines = read_steps(path)?;
    let (Some(first), Some(last)) = (lines.first(), lines.last()) else {
        return Ok(None);
    };
    Ok(Some(json!({
        "opponent": last["opponent"], "start": first["ev"], "end": last["ev"],
        "best_response": last["best_response"], "exploitability_start": first["exploitability"],
        "exploitability_end": last["exploitability"], "version_start": first["version"],
        "version_end": last["version"], "versions_evaluated": lines.len(),
    })))
}

fn mode_name(m: crate::config::LearnerMode) -> &'static str {
    match m {
        crate::config::LearnerMode::Async => "async",
        crate::config::LearnerMode::Sequential => "sequential",
    }
}

/// Installed versions of the rollout workers the learner sees.
fn worker_versions(status: &NodeStatus) -> Vec<Option<u64>> {
    status
        .network
        .peers
        .iter()
        .filter(|p| p.role == Some(p2p::Role::Rollout))
        .map(|p| p.installed_version)
        .collect()
}

/// The demo's progress line at `t` since start, most important fields first in priority
/// (0: kept longest; [`StatusLine::fit`] drops the others to fit the terminal); the ETA is
/// added by [`Progress::update`].
fn progress_line(v: &NodeStatus, t: Duration) -> (Duration, StatusLine) {
    let time = format!("[{:5.1}s]", t.as_secs_f64());
    let Some(l) = &v.learner else {
        let line = StatusLine::default()
            .field(0, time)
            .field(0, "starting: the learner builds and warm-starts its model;")
            .field(1, format!("{} peers connected", v.network.connected_peers));
        return (t, line);
    };
    let versions: Vec<String> = worker_versions(v)
        .iter()
        .map(|x| x.map_or("-".into(), |n| format!("v{n}")))
        .collect();
    let line = StatusLine::default()
        .field(0, time)
        .field(0, format!("step {:>4}", l.version))
        .field(
            1,
            format!("reward {:.3}", l.reward_recent.unwrap_or(f64::NAN)),
        )
        .field(2, format!("bubble {:.2}", l.bubble_ratio))
        .field(2, format!("Δmax {}", l.staleness_max))
        .field(3, format!("workers [{}]", versions.join(" ")))
        .field(4, format!("snapshots {}", l.snapshots_published))
        .field(
            4,
            format!(
                "buffer {}",
                l.buffer_pending.map_or("-".into(), |b| b.to_string())
            ),
        );
    (t, line)
}

/// The learner's per-step JSON lines.
pub fn read_steps(path: &Path) -> anyhow::Result<Vec<Value>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    BufReader::new(f)
        .lines()
        .filter(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(|l| Ok(serde_json::from_str(&l?)?))
        .collect()
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// The summary (`docs/operator-guide.md`, "Demo"): `reward_first` / `reward_last` are means over the first and last
/// tenth of the steps (at least one step each).
fn summarize(
    steps: &[Value],
    status: &NodeStatus,
    elapsed_s: f64,
    invariant_ok: bool,
    not_clean: &[String],
) -> Value {
    let rewards: Vec<f64> = steps
        .iter()
        .filter_map(|s| s["stats"]["reward_mean"].as_f64())
        .collect();
    let tenth = (rewards.len() / 10).max(1).min(rewards.len());
    let idle: f64 = steps.iter().filter_map(|s| s["idle_s"].as_f64()).sum();
    let train: f64 = steps
        .iter()
        .filter_map(|s| s["stats"]["t_train_s"].as_f64())
        .sum();
    let l = status.learner.clone().unwrap_or_default();
    let span = match (steps.first(), steps.last()) {
        (Some(a), Some(b)) => b["t"].as_f64().unwrap_or(0.0) - a["t"].as_f64().unwrap_or(0.0),
        _ => 0.0,
    };
    json!({
        "steps": steps.len(),
        "version": l.version,
        "reward_first": mean(rewards[..tenth].iter().copied()),
        "reward_last": mean(rewards[rewards.len() - tenth..].iter().copied()),
        "bubble_ratio": if idle + train > 0.0 { idle / (idle + train) } else { 0.0 },
        "snapshots": l.snapshots_published,
        "snapshot_bytes_full": l.snapshot_bytes_full,
        "snapshot_bytes_median": l.snapshot_bytes_median,
        "worker_versions": worker_versions(status),
        "staleness_max": l.staleness_max,
        "staleness_histogram": l.staleness_histogram,
        "delta_max_bound": l.delta_max_bound,
        "t_train_s": l.t_train_s,
        "t_bcast_s": l.t_bcast_s,
        "mu_pool": l.mu_pool,
        "mu_min": l.mu_min,
        "mu_target": l.mu_target,
        "groups_dropped_zero_advantage": l.groups_dropped_zero_advantage,
        "groups_dropped_stale": l.groups_dropped_stale,
        "elapsed_s": elapsed_s,
        "steps_per_hour": if span > 0.0 { (steps.len() - 1) as f64 * 3600.0 / span } else { 0.0 },
        "importance_weight_variance_mean": mean(steps.iter().filter_map(|s| s["stats"]["importance_weight_variance"].as_f64())),
        "kl_sampler_learner_mean": mean(steps.iter().filter_map(|s| s["stats"]["kl_sampler_learner"].as_f64())),
        "invariant_holds": invariant_ok,
        "clean_exit": not_clean.is_empty(),
        // Every worker of the demo is honest: any strike or ban is a false positive.
        "strikes": status.network.counters.strikes,
        "bans": status.network.counters.bans,
        "reward_basis": l.reward_basis,
        "reward_recent_checked": l.reward_recent_checked,
    })
}
