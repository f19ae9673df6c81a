//! The command line. Subcommand and flag names are a contract scripts rely on
//! (`docs/operator-guide.md`): extend, do not rename.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{LearnerMode, Objective, SnapshotDtype};
use policy::DeviceChoice;

/// The optional features compiled into this binary, as `echo-node --version` lists them after
/// the package version: `cuda` (a GPU build) and `adversary` (the testnet's attack code). A
/// script tells the builds apart from this line without starting a node; `testnet adversary`
/// refuses a binary whose line lacks `adversary`, whose workers would quietly run honestly.
pub const FEATURES: &[&str] = &[
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "adversary")]
    "adversary",
];

/// `0.1.0 (features: cuda, adversary)`, or the bare package version for a default build.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let v = env!("CARGO_PKG_VERSION");
        if FEATURES.is_empty() {
            v.to_string()
        } else {
            format!("{v} (features: {})", FEATURES.join(", "))
        }
    })
}

/// The features an `echo-node --version` line lists (the inverse of [`version`]), so that a
/// harness holding only a binary's path reads its build the way this crate writes it.
pub fn features_in_version(line: &str) -> Vec<&str> {
    line.trim()
        .split_once("(features: ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map(|list| list.split(", ").collect())
        .unwrap_or_default()
}

#[derive(Debug, Parser)]
#[command(
    name = "echo-node",
    version = version(),
    about = "echo-swarm node: decentralized RL post-training over libp2p"
)]
pub struct Cli {
    /// More log output (-v debug, -vv trace). `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a new node key (ed25519) to DIR/node.key; prints the peer id and public key.
    Keygen(KeygenArgs),
    /// Start a node in the role its config names.
    Run(RunArgs),
    /// Write an admission ticket for PEER_ID, signed with the learner's key: the worker's
    /// `admission.ticket` in a swarm whose learner runs `admission.mode = "ticket"`.
    Admit(AdmitArgs),
    /// Show what a node's stores hold (the node must not be running on that data dir).
    Inspect(InspectArgs),
    /// Ask a running node's admin endpoint for its view of the swarm (peers, scores).
    Status(StatusArgs),
    /// The one-command local swarm: a learner and N rollout nodes on 127.0.0.1 train the
    /// embedded model on the embedded task; prints progress and a summary.
    Demo(DemoArgs),
    /// Preflight before joining a swarm: config, key, data dir, clock, ports, bootstrap peers,
    /// reachability — one line each (ok / warn / fail) with a fix; non-zero exit on any fail.
    Doctor(DoctorArgs),
    /// Write a learner checkpoint as a Hugging Face folder (config.json, model.safetensors,
    /// tokenizer.json when the model is the embedded one).
    Export(ExportArgs),
    /// A checkpoint or exported folder against an environment's opponents: mean return ±
    /// standard error per opponent, and the exact figures of games that have them (Kuhn).
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The task or environment (`kuhn-poker`, `holdem`, or a single-turn task).
    #[arg(long)]
    pub task: String,
    /// Its parameters as a JSON object (e.g. '{"betting": "limit"}'); --opponent sets the
    /// opponent.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// A learner checkpoint directory (`<data_dir>/checkpoints`).
    #[arg(long, conflicts_with = "export", required_unless_present = "export")]
    pub checkpoint: Option<PathBuf>,
    /// A Hugging Face folder (`echo-node export` output or a Qwen2/Qwen3 folder).
    #[arg(long)]
    pub export: Option<PathBuf>,
    /// Opponents (comma-separated; default: all of the environment's). Holdem's `model` is a
    /// frozen copy of the evaluated policy, or of --opponent-model.
    #[arg(long, value_delimiter = ',')]
    pub opponent: Vec<String>,
    /// Episodes per opponent.
    #[arg(long, default_value_t = 200)]
    pub episodes: u64,
    /// The frozen policy in holdem's `model` seat: a checkpoint directory or a folder.
    #[arg(long)]
    pub opponent_model: Option<PathBuf>,
    /// Sampling temperature (also the temperature of the exact evaluation's log-probs).
    #[arg(long, default_value_t = 1.2)]
    pub temperature: f32,
    /// The first episode's seed (episodes use seeds seed..seed+N; sampling is seeded by it).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Rollout worker processes (1..=16).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// The task or environment to train on (e.g. `arith`, `kuhn-poker`).
    #[arg(long, default_value = "arith")]
    pub task: String,
    /// Its parameters as a JSON object (default: the demo's choice for the task; for
    /// `kuhn-poker` the `always-bet` opponent).
    #[arg(long)]
    pub task_params: Option<String>,
    /// Learner steps before the demo stops.
    #[arg(long, default_value_t = 400)]
    pub steps: u64,
    /// Print the final summary as one JSON line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Keep configs, stores and logs in DIR (default: a temporary directory, removed at exit).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Supervised warm-start steps before RL (0 = pure RL from random weights; default 200
    /// for `kuhn-poker`, whose words must be learned per question, else 60).
    #[arg(long)]
    pub warm_start_steps: Option<usize>,
    /// Stop after this many minutes of training even if --steps is not reached (0 = no limit).
    #[arg(long, default_value_t = 0.0)]
    pub minutes: f64,
    /// Learner mode: `async` (bounded staleness) or `sequential` (S = 0, κ = 1).
    #[arg(long, value_enum, default_value_t = LearnerMode::Async)]
    pub mode: LearnerMode,
    /// Learner objective: grpo, dr_grpo, gspo or gepo.
    #[arg(long, default_value = "gepo")]
    pub objective: Objective,
    /// Staleness budget S (async mode).
    #[arg(long, default_value_t = 3)]
    pub staleness: u64,
    /// Publish every κ steps (async mode; default: max(S − 1, 1)).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub kappa: Option<u64>,
    /// Cap each worker's production at this many groups/s (0 = none; emulates slower
    /// machines so that capacity grows with the number of workers on one host).
    #[arg(long, default_value_t = 0.0)]
    pub worker_groups_per_s: f64,
    /// Where every node of the demo runs its model: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// The dtype snapshots are shipped in (`broadcast.dtype`): f32 or bf16.
    #[arg(long, value_enum, default_value_t = SnapshotDtype::F32)]
    pub snapshot_dtype: SnapshotDtype,
    /// Train LoRA adapters of this rank on the frozen (warm-started) model instead of every
    /// weight (0 = full fine-tuning): α = 32 at the full fine-tuning learning rate — on the
    /// embedded task 1× learns best and the 10× "LoRA Without Regret" (Thinking Machines,
    /// 2025) suggests does not learn (`docs/experiments.md`); --lr sets another. The
    /// warm-started base ships once as version 0, then only the adapters.
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
    /// The learner's learning rate (default: `learner.lr`'s default, with or without
    /// --lora-rank).
    #[arg(long, value_parser = parse_lr)]
    pub lr: Option<f64>,
    /// The learner's compute dtype (`learner.precision`): auto, bf16 (GPU), f16 or f32.
    #[arg(long, default_value = "auto", value_parser = parse_precision)]
    pub precision: learner::Precision,
    /// Recompute the learner's activations layer by layer (`learner.recompute`).
    #[arg(long)]
    pub recompute: bool,
    /// With `--snapshot-dtype bf16`: publish every version whole instead of as sparse deltas
    /// (`broadcast.delta = false`), to compare the two.
    #[arg(long)]
    pub no_delta: bool,
    /// `model.seed` of every node: the learner's initial weights and warm-start draws (runs
    /// of one seed differ only by timing and the workers' sampling).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The node's config.
    #[arg(long, short, default_value = "node.toml")]
    pub config: PathBuf,
    /// Print `{"checks": [{"name", "status", "detail", "hint"}]}` instead of text.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the bootstrap peers and for AutoNAT (seconds).
    #[arg(long, default_value_t = 10)]
    pub timeout_s: u64,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The learner's checkpoint directory (`<data_dir>/checkpoints`), or a learner config.
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    pub checkpoint: Option<PathBuf>,
    /// Take the checkpoint directory from this learner config (which also rebuilds the base
    /// of a LoRA checkpoint, as the learner does).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The frozen base of a LoRA checkpoint as a Hugging Face folder (its tokenizer is copied
    /// too); refused unless it is the base the adapters were trained on.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Output folder (created; existing files in it are not overwritten). A LoRA checkpoint
    /// also writes `peft/` (the PEFT adapter folder) and, unless --base names it, `base/`.
    #[arg(long)]
    pub out: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The node's admin endpoint HOST:PORT (default: `network.admin` of --config, else 127.0.0.1:9100).
    #[arg(long, alias = "addr")]
    pub admin: Option<String>,
    /// Take the admin endpoint from this config.
    #[arg(short = 'c', long)]
    pub config: Option<PathBuf>,
    /// Every column of the peer table and full peer ids (the default table is narrow).
    #[arg(long)]
    pub wide: bool,
    /// Print the status object as one line of JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Directory to write `node.key` into (created if missing; an existing key is never overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AdmitArgs {
    /// The worker's peer id (base58, as `echo-node keygen` prints it).
    pub peer_id: String,
    /// How long the ticket admits the worker, in hours (1 ..= 8784).
    #[arg(long)]
    pub hours: u64,
    /// The learner's config (its data dir holds the key that signs).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Also write the ticket (hex, one line) to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of the bare ticket.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The node's TOML config (see `configs/`).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Override `data_dir`.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override `network.listen` (repeatable), e.g. /ip4/127.0.0.1/tcp/4001.
    #[arg(long = "listen")]
    pub listen: Vec<String>,
    /// Override `network.admin` (HOST:PORT on loopback).
    #[arg(long)]
    pub admin: Option<String>,
    /// Override `model.device`: auto, cpu, cuda or cuda:N.
    #[arg(long)]
    pub device: Option<DeviceChoice>,
    /// Benchmark (testnet `broadcast`): a learner publishes random snapshots of this many MB
    /// instead of training.
    #[arg(long, hide = true)]
    pub bench_broadcast_mb: Option<f64>,
    /// Benchmark: workers to wait for before the first round.
    #[arg(long, hide = true, default_value_t = 1)]
    pub bench_workers: usize,
    /// Benchmark: snapshots to publish.
    #[arg(long, hide = true, default_value_t = 1)]
    pub bench_rounds: u32,
    /// Benchmark: publish synthetic bf16 versions as deltas, this percentage of values changed
    /// per version (a keyframe first).
    #[arg(long, hide = true, value_parser = parse_pct)]
    pub bench_delta_changed_pct: Option<f64>,
    /// Benchmark: a worker that only receives snapshots (no model, no generation).
    #[arg(long, hide = true)]
    pub bench_sink: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(subcommand)]
    pub what: InspectWhat,
}

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Data directory of the node.
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    pub data_dir: Option<PathBuf>,
    /// Take the data directory from this config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum InspectWhat {
    /// Trajectory store: counters, the accounting invariant, groups per version, leases.
    Trajectories {
        #[command(flatten)]
        store: StoreArgs,
        /// Also list up to N stored groups (oldest first).
        #[arg(long, default_value_t = 0)]
        list: usize,
    },
    /// Snapshot store: manifests held, completeness, chunk counts and bytes.
    Snapshots {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// One snapshot manifest in full (default: the latest).
    Manifest {
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        version: Option<u64>,
    },
}

/// A percentage in [0, 100] (`--bench-delta-changed-pct`).
fn parse_pct(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if (0.0..=100.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a percentage in [0, 100]"))
    }
}

/// A learning rate: finite and > 0 (`demo --lr`).
fn parse_precision(s: &str) -> Result<learner::Precision, String> {
    s.parse().map_err(|e: learner::LearnerError| e.to_string())
}

fn parse_lr(s: &str) -> Result<f64, String> {
    let lr: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if lr.is_finite() && lr > 0.0 {
        Ok(lr)
    } else {
        Err(format!("{lr} is not a learning rate (finite, > 0)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Out-of-range numbers are refused by the parser, with the value in the message.
    #[test]
    fn bad_percentages_and_learning_rates_are_refused() {
        let err = |args: &[&str]| Cli::try_parse_from(args).unwrap_err().to_string();
        let e = err(&["echo-node", "run", "--bench-delta-changed-pct", "150"]);
        assert!(e.contains("150 is not a percentage"), "{e}");
        let e = err(&["echo-node", "demo", "--lr=-0.1"]);
        assert!(e.contains("not a learning rate"), "{e}");
        let e = err(&["echo-node", "demo", "--lr", "NaN"]);
        assert!(e.contains("not a learning rate"), "{e}");
        let ok = Cli::try_parse_from(["echo-node", "demo", "--lr", "1e-4", "--no-delta"]).unwrap();
        match ok.command {
            Command::Demo(d) => assert_eq!((d.lr, d.no_delta), (Some(1e-4), true)),
            _ => panic!("not a demo"),
        }
    }

    /// `--version` lists exactly the features compiled in (`testnet adversary` reads it).
    #[test]
    fn the_version_line_lists_the_compiled_features() {
        let e = Cli::try_parse_from(["echo-node", "--version"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
        let line = e.to_string();
        assert!(
            line.starts_with(concat!("echo-node ", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert_eq!(
            line.contains("adversary"),
            cfg!(feature = "adversary"),
            "{line}"
        );
        assert_eq!(line.contains("cuda"), cfg!(feature = "cuda"), "{line}");
        assert_eq!(features_in_version(&line), FEATURES, "{line}");
        assert_eq!(
            features_in_version("echo-node 0.1.0 (features: cuda, adversary)\n"),
            ["cuda", "adversary"]
        );
        assert!(features_in_version("echo-node 0.1.0\n").is_empty());
    }
}
