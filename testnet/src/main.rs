//! Testnet: `broadcast` (real `echo-node` processes on loopback with in-node caps,
//! [`broadcast`]), `sim-broadcast` (the broadcast simulation that reuses the real chain
//! planner for fleets one machine cannot host, [`sim`]), `staleness` and `overlap` (learning
//! runs through `echo-node demo`, [`learning`]) and `learning-plot` (charts of learner step
//! logs). `faults` injects a slowed and a dropped worker into a scheduled swarm ([`faults`]);
//! `ablation` compares chains with star and cost-aware with random activation ([`ablation`]).
//! `nat` runs a swarm with workers behind NAT routers in network namespaces ([`nat`], on the
//! [`netlab`], which also puts `broadcast --rtt-ms …` on emulated WAN links).
//! The processes are the [`harness`]'s, the charts [`chart`]'s, the progress bars
//! [`progress`]'s. The experiments and their results are described in `docs/experiments.md`
//! and `docs/broadcast.md`.
//!
//! This file owns the command line only: parsing, validation, dispatch.

mod ablation;
mod adversary;
mod broadcast;
mod chart;
mod faults;
mod forwarding;
mod harness;
mod learning;
mod membership;
mod nat;
mod netlab;
mod progress;
mod sim;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::broadcast::BroadcastMode;
use crate::chart::{Chart, Series};

/// Where scenarios write their files unless told otherwise (`testnet/results/`, git-ignored).
const DEFAULT_OUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/results");

#[derive(Parser)]
#[command(name = "testnet", about = "echo-swarm scenarios and simulations")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

/// Options every multi-process scenario takes.
#[derive(Args)]
struct RunOpts {
    /// The `echo-node` binary (default: next to this one, i.e. the same cargo profile).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Print the summary as one JSON line.
    #[arg(long)]
    json: bool,
    /// Directory for the JSON results and PNG charts (created if missing).
    #[arg(long, default_value = DEFAULT_OUT)]
    out: PathBuf,
}

/// The emulated WAN of `broadcast` and `nat`.
#[derive(Args, Clone, Copy)]
struct WanArgs {
    /// Emulated node-to-node round trip (ms): runs every node in a network namespace on
    /// an emulated WAN link (root; docs/netlab.md). Any of the three WAN options turns it on.
    #[arg(long)]
    rtt_ms: Option<f64>,
    /// Emulated packet loss per direction of a node-to-node path (%).
    #[arg(long)]
    loss_pct: Option<f64>,
    /// Emulated one-way jitter (± ms, uniform, no reordering).
    #[arg(long)]
    jitter_ms: Option<f64>,
}

#[derive(Subcommand)]
enum Scenario {
    /// T_bcast of real `echo-node` processes on 127.0.0.1, chain and/or star, against the
    /// bound (docs/broadcast.md); writes `broadcast.json` and `broadcast.png` under --out.
    Broadcast {
        /// Rollout workers; several values give a sweep.
        #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
        nodes: Vec<usize>,
        /// Snapshot size in MB (10⁶ bytes).
        #[arg(long, default_value_t = 64.0)]
        size_mb: f64,
        /// Chunk size in KiB (1024 bytes), as `sim-broadcast` and the node's
        /// `storage.chunk_size_kib`.
        #[arg(long, default_value_t = 1024)]
        chunk_kb: u32,
        #[arg(long, default_value_t = 100.0)]
        worker_mbps: f64,
        #[arg(long, default_value_t = 300.0)]
        learner_mbps: f64,
        /// `chain`, `star`, or both (`chain,star`).
        #[arg(long, value_delimiter = ',', default_value = "chain,star")]
        mode: Vec<BroadcastMode>,
        /// Snapshots published per setting (T_bcast is their median).
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Nodes' gossip heartbeat interval (ms). The node default; installs are reported at
        /// once regardless. Every heartbeat costs every node a signature check per copy it
        /// receives, which on one host adds up as N².
        #[arg(long, default_value_t = 2000)]
        heartbeat_ms: u64,
        /// Run nothing: re-plot a saved `broadcast.json` into --out.
        #[arg(long)]
        from: Option<PathBuf>,
        #[command(flatten)]
        wan: WanArgs,
        /// Seed of the emulator's loss and jitter draws.
        #[arg(long, default_value_t = 1)]
        wan_seed: u64,
        /// Run every node on QUIC only (`/udp/0/quic-v1`) instead of TCP, so that the chunk
        /// streams go over QUIC.
        #[arg(long)]
        quic: bool,
        /// Nodes keep the kernel's congestion state across pushes
        /// (`network.restart_congestion = false`), to measure what the restart is worth.
        #[arg(long)]
        keep_congestion_state: bool,
        /// With the WAN options: cap the bandwidth in the emulated links (each node's link
        /// serialises at --learner-mbps / --worker-mbps in both directions) and turn the
        /// workers' own token buckets off, as on a real access link; the learner keeps its
        /// B0 bucket (it also sets the number of chains).
        #[arg(long)]
        link_caps: bool,
        /// Publish bf16 snapshots as sparse deltas: the first round is a keyframe of
        /// --size-mb, each later version differs from the one before in --changed-pct % of
        /// its values; T_bcast and the bound are the delta rounds'.
        #[arg(long)]
        delta: bool,
        /// With --delta: percentage of bf16 values changed per version.
        #[arg(long, default_value_t = 1.0, requires = "delta")]
        changed_pct: f64,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Workers behind NAT routers (endpoint-independent and symmetric) and a public learner
    /// in network namespaces, a few learner steps of a real swarm; per worker its NAT, how
    /// the learner reaches it, installs and pulls (root; docs/netlab.md). With the WAN
    /// options: no NAT routers, every node (the learner and 3 × --per-nat workers) on its own
    /// emulated WAN link, and the report adds the learner's pull round trip.
    Nat {
        /// Learner steps after every worker has installed a snapshot.
        #[arg(long, default_value_t = 3)]
        steps: u64,
        /// Workers behind each of the NAT routers.
        #[arg(long, default_value_t = 1)]
        per_nat: usize,
        /// Also start a relay node on the public segment (needs an echo-node with the relay
        /// role) and let the workers reserve slots on it.
        #[arg(long)]
        relay: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 900)]
        timeout_s: u64,
        #[command(flatten)]
        wan: WanArgs,
        /// Run nothing: remove the namespaces earlier lab runs left behind (runs whose
        /// process is gone) and exit.
        #[arg(long)]
        cleanup: bool,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Final reward and importance-weight variance per staleness budget S, GRPO and GEPO
    /// (one `echo-node demo` run of --minutes each; S = 0 runs in sequential mode).
    Staleness {
        #[arg(long, value_delimiter = ',', default_value = "0,1,3,6,11")]
        values: Vec<u64>,
        #[arg(long, value_delimiter = ',', default_value = "grpo,gepo")]
        objectives: Vec<String>,
        #[arg(long, default_value_t = 2.0)]
        minutes: f64,
        /// Run nothing: re-plot a saved `staleness.json` into --out.
        #[arg(long)]
        from: Option<PathBuf>,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Bubble ratio vs number of rollout workers, with the threshold the capacity model
    /// predicts (one `echo-node demo` run of --minutes per worker count).
    Overlap {
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
        workers: Vec<usize>,
        #[arg(long, default_value_t = 2.0)]
        minutes: f64,
        /// Cap each worker at this many groups/s (0 = none): on one host, capped workers make
        /// capacity grow with their number instead of competing for the same cores.
        #[arg(long, default_value_t = 0.0)]
        worker_groups_per_s: f64,
        /// Extra `echo-node demo` options for every run, e.g. `--staleness 4 --kappa 2`.
        #[arg(long, allow_hyphen_values = true, value_delimiter = ' ')]
        demo_args: Vec<String>,
        /// Run nothing: re-analyse and re-plot a saved `overlap.json` into --out.
        #[arg(long)]
        from: Option<PathBuf>,
        #[command(flatten)]
        run: RunOpts,
    },
    /// A slowed (0.5×) and then a dropped active worker in a swarm whose scheduler keeps
    /// --active workers active and one on standby: throughput drop, recovery, bubble increase.
    Faults {
        #[arg(long, default_value_t = 3)]
        active: usize,
        /// Seconds of each phase (baseline, slowed, dropped).
        #[arg(long, default_value_t = 40.0)]
        phase_s: f64,
        /// Run nothing: re-plot a saved `faults.json` into --out.
        #[arg(long)]
        from: Option<PathBuf>,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Malicious workers (one per attack, `ECHO_NODE_MISBEHAVE`) against a learner and two
    /// honest workers, a few attacks per run, plus one clean run: per attack whether it was
    /// detected and banned, and the rewards (docs/adversary.md).
    Adversary {
        /// Attacks to run (default: every one, `echo_node::misbehave::Attack::ALL`).
        #[arg(long, value_delimiter = ',')]
        attacks: Vec<echo_node::misbehave::Attack>,
        /// Learner steps per run.
        #[arg(long, default_value_t = 30)]
        steps: u64,
        /// Malicious workers per run (each run has its own learner and honest workers).
        #[arg(long, default_value_t = 3)]
        batch: usize,
        /// The learner's supervised warm-start steps.
        #[arg(long, default_value_t = 60)]
        warm_start_steps: usize,
        /// Skip the clean run (reward_clean is then null).
        #[arg(long)]
        no_clean: bool,
        /// The `echo-node` binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Directory for `adversary.json` (created if missing).
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results/adversary"))]
        out: PathBuf,
    },
    /// A clean swarm of workers with different uplinks in one chain (one at a tenth of the
    /// others by default): strikes and bans counted (the aim: none), demotions, forwarding
    /// verdicts, the honest install ratio (docs/adversary.md, "Heterogeneous clean run").
    Forwarding {
        /// Each worker's uplink cap, Mbit/s (0: none).
        #[arg(long, value_delimiter = ',', default_value = "40,40,40,4")]
        uplinks: Vec<f64>,
        /// B̂w (and B0: one chain), Mbit/s.
        #[arg(long, default_value_t = 40.0)]
        worker_mbps: f64,
        #[arg(long, default_value_t = 30)]
        steps: u64,
        #[arg(long, default_value_t = 60)]
        warm_start_steps: usize,
        /// Versions per plan epoch (seats re-drawn at each).
        #[arg(long, default_value_t = 3)]
        plan_epoch: u64,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Chains vs star (T_bcast) and cost-aware vs random activation (cost per step) on a
    /// mixed-price pool.
    Ablation {
        /// Workers of the broadcast comparison.
        #[arg(long, default_value_t = 8)]
        nodes: usize,
        #[arg(long, default_value_t = 64.0)]
        size_mb: f64,
        /// Workers in the mixed-price pool (costs 0.1, 0.2, 0.4, … $/h).
        #[arg(long, default_value_t = 6)]
        pool: usize,
        /// Workers kept active.
        #[arg(long, default_value_t = 3)]
        active: usize,
        /// Seconds of training per activation policy.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Charts of learner step logs (`<data_dir>/metrics/steps.jsonl`): reward and
    /// importance-weight variance vs step, moving averages; one `NAME=PATH` per run.
    LearningPlot {
        #[arg(long = "run", required = true)]
        runs: Vec<String>,
        /// Moving-average window in steps.
        #[arg(long, default_value_t = 50)]
        window: usize,
        /// File name prefix under --out (`PREFIX-reward.png`, `PREFIX-ivar.png`).
        #[arg(long, default_value = "learning")]
        prefix: String,
        #[arg(long, default_value = DEFAULT_OUT)]
        out: PathBuf,
    },
    /// CPU per node spent on membership alone (heartbeats, identify, Kademlia) with N idle
    /// `echo-node` processes, sampled from /proc over --seconds once node 0 hears everyone.
    Membership {
        #[arg(long, value_delimiter = ',', default_value = "8,32,64")]
        nodes: Vec<usize>,
        /// The nodes' configured heartbeat interval (ms).
        #[arg(long, default_value_t = 2000)]
        heartbeat_ms: u64,
        #[arg(long, default_value_t = 30.0)]
        seconds: f64,
        #[command(flatten)]
        run: RunOpts,
    },
    /// Simulated T_bcast of one snapshot for N workers (chain or star), against the bound.
    SimBroadcast {
        /// Rollout workers; several values give a sweep, e.g. `--nodes 4,8,1000`.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "4,8,16,32,64,128,256,512,1000"
        )]
        nodes: Vec<usize>,
        /// Snapshot size in MB (10⁶ bytes).
        #[arg(long, default_value_t = 64.0)]
        size_mb: f64,
        /// Chunk size in KiB (1024 bytes), as in `broadcast`.
        #[arg(long, default_value_t = 1024)]
        chunk_kb: u32,
        #[arg(long, default_value_t = 100.0)]
        worker_mbps: f64,
        #[arg(long, default_value_t = 300.0)]
        learner_mbps: f64,
        /// `chain` or `star`.
        #[arg(long, default_value = "chain")]
        mode: BroadcastMode,
        /// Fraction of workers that must have installed (1/γ).
        #[arg(long, default_value_t = 1.0)]
        quantile: f64,
        /// One JSON line instead of a table.
        #[arg(long)]
        json: bool,
        /// Directory for the chart `t_bcast_vs_n.png` (T_bcast vs N for chain and star and
        /// their bounds, log-log); created if missing.
        #[arg(long, default_value = DEFAULT_OUT)]
        out: PathBuf,
        /// Do not write the chart.
        #[arg(long)]
        no_plot: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().scenario {
        Scenario::Broadcast {
            nodes,
            size_mb,
            chunk_kb,
            worker_mbps,
            learner_mbps,
            mode,
            rounds,
            heartbeat_ms,
            from,
            wan,
            wan_seed,
            quic,
            keep_congestion_state,
            link_caps,
            delta,
            changed_pct,
            run: RunOpts { bin, json, out },
        } => {
            if let Some(from) = from {
                print_summary(&broadcast::replot(&read_json(&from)?, &out)?, json);
                return Ok(());
            }
            let wan = wan.resolve(wan_seed, link_caps)?;
            if wan.is_some() {
                netlab::ns::install_signal_teardown()?;
            }
            anyhow::ensure!(
                (100..=600_000).contains(&heartbeat_ms),
                "--heartbeat-ms must be within 100..=600000"
            );
            anyhow::ensure!(
                size_mb > 0.0 && chunk_kb >= 4,
                "--size-mb > 0, --chunk-kb >= 4"
            );
            anyhow::ensure!(
                worker_mbps > 0.0 && learner_mbps > 0.0,
                "bandwidths must be > 0"
            );
            anyhow::ensure!(
                nodes.iter().all(|n| (1..=1024).contains(n)),
                "--nodes must be in 1..=1024"
            );
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            if let Some(n) = nodes.iter().find(|&&n| n > 16 * cores) {
                eprintln!(
                    "warning: {n} nodes on {cores} cores: every node verifies every heartbeat, \
                     so the host, not the protocol, may set T_bcast (docs/broadcast.md)"
                );
            }
            anyhow::ensure!(rounds >= 1, "--rounds must be >= 1");
            anyhow::ensure!(
                (0.0..=100.0).contains(&changed_pct),
                "--changed-pct must be within 0..=100"
            );
            anyhow::ensure!(
                !delta || rounds >= 2,
                "--delta needs --rounds >= 2 (the first round is the keyframe)"
            );
            let bin = harness::node_bin(bin)?;
            let settings = broadcast::Settings {
                nodes,
                size_mb,
                chunk_kb,
                worker_mbps,
                learner_mbps,
                modes: mode,
                rounds,
                bin,
                heartbeat_ms,
                wan,
                quic,
                restart_congestion: !keep_congestion_state,
                delta_changed_pct: delta.then_some(changed_pct),
            };
            let summary = broadcast::sweep(&settings, &out, !json)?;
            if json {
                println!("{summary}");
            }
            Ok(())
        }
        Scenario::Nat {
            steps,
            per_nat,
            relay,
            timeout_s,
            wan,
            cleanup,
            run: RunOpts { bin, json, out },
        } => {
            if cleanup {
                return nat::cleanup();
            }
            let wan = wan.resolve(1, false)?;
            anyhow::ensure!((1..=4).contains(&per_nat), "--per-nat in 1..=4");
            anyhow::ensure!((1..=1000).contains(&steps), "--steps in 1..=1000");
            let opts = nat::Opts {
                bin: harness::node_bin(bin)?,
                steps,
                per_nat,
                relay,
                timeout: std::time::Duration::from_secs(timeout_s),
                wan,
            };
            print_summary(&nat::command(&opts, &out)?, json);
            Ok(())
        }
        Scenario::Staleness {
            values,
            objectives,
            minutes,
            from,
            run: RunOpts { bin, json, out },
        } => {
            if let Some(from) = from {
                print_summary(&learning::replot_staleness(&read_json(&from)?, &out)?, json);
                return Ok(());
            }
            anyhow::ensure!(minutes > 0.0, "--minutes must be > 0");
            for o in &objectives {
                anyhow::ensure!(
                    ["grpo", "dr_grpo", "gspo", "gepo"].contains(&o.as_str()),
                    "unknown objective {o}"
                );
            }
            let summary = learning::staleness(
                &harness::node_bin(bin)?,
                &values,
                &objectives,
                minutes,
                &out,
            )?;
            print_summary(&summary, json);
            Ok(())
        }
        Scenario::Overlap {
            workers,
            minutes,
            worker_groups_per_s,
            demo_args,
            from,
            run: RunOpts { bin, json, out },
        } => {
            if let Some(from) = from {
                print_summary(&learning::report_overlap(read_json(&from)?, &out)?, json);
                return Ok(());
            }
            anyhow::ensure!(minutes > 0.0, "--minutes must be > 0");
            anyhow::ensure!(
                workers.iter().all(|w| (1..=16).contains(w)),
                "--workers in 1..=16"
            );
            let summary = learning::overlap(
                &harness::node_bin(bin)?,
                &workers,
                minutes,
                worker_groups_per_s,
                &demo_args,
                &out,
            )?;
            print_summary(&summary, json);
            Ok(())
        }
        Scenario::Faults {
            active,
            phase_s,
            from,
            run: RunOpts { bin, json, out },
        } => {
            if let Some(from) = from {
                print_summary(&faults::replot(&read_json(&from)?, &out)?, json);
                return Ok(());
            }
            anyhow::ensure!((2..=8).contains(&active), "--active must be in 2..=8");
            anyhow::ensure!(phase_s >= 10.0, "--phase-s must be >= 10");
            let summary = faults::run(&harness::node_bin(bin)?, active, phase_s, &out)?;
            print_summary(&summary, json);
            Ok(())
        }
        Scenario::Adversary {
            attacks,
            steps,
            batch,
            warm_start_steps,
            no_clean,
            bin,
            json,
            out,
        } => {
            anyhow::ensure!((1..=10_000).contains(&steps), "--steps in 1..=10000");
            anyhow::ensure!((1..=10).contains(&batch), "--batch in 1..=10");
            let mut attacks = if attacks.is_empty() {
                echo_node::misbehave::Attack::ALL.to_vec()
            } else {
                attacks
            };
            attacks.dedup();
            let settings = adversary::Settings {
                attacks,
                steps,
                batch,
                warm_start_steps,
                no_clean,
            };
            let summary = adversary::run(&harness::node_bin(bin)?, &settings, &out)?;
            print_summary(&summary, json);
            Ok(())
        }
        Scenario::Forwarding {
            uplinks,
            worker_mbps,
            steps,
            warm_start_steps,
            plan_epoch,
            run,
        } => {
            anyhow::ensure!(
                uplinks.iter().all(|u| u.is_finite() && *u >= 0.0),
                "--uplinks: Mbit/s, 0 for none"
            );
            anyhow::ensure!(worker_mbps > 0.0, "--worker-mbps must be > 0");
            let settings = forwarding::Settings {
                uplinks,
                worker_mbps,
                steps,
                warm_start_steps,
                plan_epoch: plan_epoch.max(1),
            };
            let summary = forwarding::run(&harness::node_bin(run.bin)?, &settings, &run.out)?;
            print_summary(&summary, run.json);
            Ok(())
        }
        Scenario::Ablation {
            nodes,
            size_mb,
            pool,
            active,
            seconds,
            run: RunOpts { bin, json, out },
        } => {
            anyhow::ensure!((1..=32).contains(&nodes), "--nodes in 1..=32");
            anyhow::ensure!(
                active >= 1 && active < pool && pool <= 12,
                "need 1 <= --active < --pool <= 12"
            );
            anyhow::ensure!(
                seconds >= 10.0 && size_mb > 0.0,
                "--seconds >= 10, --size-mb > 0"
            );
            let summary = ablation::run(
                &harness::node_bin(bin)?,
                nodes,
                size_mb,
                pool,
                active,
                seconds,
                &out,
            )?;
            print_summary(&summary, json);
            Ok(())
        }
        Scenario::LearningPlot {
            runs,
            window,
            prefix,
            out,
        } => {
            let written = learning_plot(&runs, window, &prefix, &out)?;
            for w in written {
                eprintln!("wrote {}", w.display());
            }
            Ok(())
        }
        Scenario::Membership {
            nodes,
            heartbeat_ms,
            seconds,
            run: RunOpts { bin, json, out },
        } => {
            anyhow::ensure!(
                (100..=600_000).contains(&heartbeat_ms) && seconds > 0.0,
                "--heartbeat-ms within 100..=600000, --seconds > 0"
            );
            let bin = harness::node_bin(bin)?;
            let p = membership::Params {
                heartbeat_ms,
                seconds,
            };
            let v = membership::run(&bin, &nodes, &p)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let path = out.join("membership.json");
            std::fs::write(&path, serde_json::to_vec_pretty(&v)?)
                .with_context(|| format!("writing {}", path.display()))?;
            print_summary(&v, json);
            Ok(())
        }
        Scenario::SimBroadcast {
            nodes,
            size_mb,
            chunk_kb,
            worker_mbps,
            learner_mbps,
            mode,
            quantile,
            json,
            out,
            no_plot,
        } => {
            anyhow::ensure!(
                size_mb > 0.0 && chunk_kb > 0,
                "--size-mb and --chunk-kb must be > 0"
            );
            anyhow::ensure!(
                worker_mbps > 0.0 && learner_mbps > 0.0,
                "bandwidths must be > 0"
            );
            anyhow::ensure!(
                quantile > 0.0 && quantile <= 1.0,
                "--quantile must be in (0, 1]"
            );
            anyhow::ensure!(nodes.iter().all(|n| *n > 0), "--nodes must be ≥ 1");
            let params = sim::Params {
                size_mb,
                chunk_kb,
                worker_mbps,
                learner_mbps,
                quantile,
            };
            let points: Vec<sim::Point> = nodes.iter().map(|&n| params.point(n, mode)).collect();
            let rows: Vec<serde_json::Value> = points
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "nodes": p.nodes, "t_bcast_s": p.t_bcast_s, "bound_s": p.bound_s,
                        "n_chains": p.n_chains, "max_chain_len": p.max_chain_len,
                    })
                })
                .collect();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"scenario": "sim-broadcast", "results": rows})
                );
            } else {
                println!(
                    "{:>6} {:>10} {:>10} {:>8} {:>8}",
                    "N", "T_bcast s", "bound s", "chains", "max L"
                );
                for p in &points {
                    println!(
                        "{:>6} {:>10.3} {:>10.3} {:>8} {:>8}",
                        p.nodes, p.t_bcast_s, p.bound_s, p.n_chains, p.max_chain_len
                    );
                }
            }
            if !no_plot {
                std::fs::create_dir_all(&out)
                    .with_context(|| format!("creating {}", out.display()))?;
                let path = out.join("t_bcast_vs_n.png");
                params
                    .chart(&nodes)
                    .write_png(&path, 960, 600)
                    .with_context(|| format!("writing {}", path.display()))?;
                // stderr, so that `--json` keeps stdout to one JSON line.
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

/// A saved result file (`--from`).
fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))
}

impl WanArgs {
    /// The emulated WAN, when any of its options is given, its ranges checked.
    fn resolve(self, seed: u64, link_caps: bool) -> anyhow::Result<Option<broadcast::Wan>> {
        let WanArgs {
            rtt_ms,
            loss_pct,
            jitter_ms,
        } = self;
        let wan = (rtt_ms.is_some() || loss_pct.is_some() || jitter_ms.is_some()).then(|| {
            broadcast::Wan {
                rtt_ms: rtt_ms.unwrap_or(0.0),
                loss_pct: loss_pct.unwrap_or(0.0),
                jitter_ms: jitter_ms.unwrap_or(0.0),
                seed,
                link_caps,
            }
        });
        anyhow::ensure!(
            !link_caps || wan.is_some(),
            "--link-caps needs the WAN options (--rtt-ms, --loss-pct or --jitter-ms)"
        );
        if let Some(w) = wan {
            anyhow::ensure!(
                (0.0..=10_000.0).contains(&w.rtt_ms)
                    && (0.0..=50.0).contains(&w.loss_pct)
                    && (0.0..=10_000.0).contains(&w.jitter_ms),
                "--rtt-ms and --jitter-ms in 0..=10000, --loss-pct in 0..=50"
            );
        }
        Ok(wan)
    }
}

/// The one-line JSON summary (`--json`) or a pretty one.
fn print_summary(v: &serde_json::Value, json: bool) {
    if json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

/// Reward and importance-weight-variance charts of learner step logs.
fn learning_plot(
    runs: &[String],
    window: usize,
    prefix: &str,
    out: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(window >= 1, "--window must be >= 1");
    std::fs::create_dir_all(out)?;
    let mut reward = Vec::new();
    let mut ivar = Vec::new();
    for r in runs {
        // The path is after the last '=' (names may contain '=', e.g. "S=3").
        let (name, path) = r
            .rsplit_once('=')
            .with_context(|| format!("--run {r}: expected NAME=PATH"))?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        let mut rows: Vec<(f64, f64, f64)> = Vec::new();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{path}:{}", i + 1))?;
            let st = &v["stats"];
            rows.push((
                (i + 1) as f64,
                st["reward_mean"].as_f64().unwrap_or(f64::NAN),
                st["importance_weight_variance"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            ));
        }
        let smooth = |f: fn(&(f64, f64, f64)) -> f64| -> Vec<(f64, f64)> {
            rows.windows(window.min(rows.len()).max(1))
                .map(|w| {
                    (
                        w[w.len() - 1].0,
                        w.iter().map(f).sum::<f64>() / w.len() as f64,
                    )
                })
                .collect()
        };
        reward.push(Series::solid(name, smooth(|r| r.1)));
        ivar.push(Series::solid(name, smooth(|r| r.2)));
    }
    let mut written = Vec::new();
    for (what, label, series) in [
        ("reward", "mean reward", reward),
        ("ivar", "importance-weight variance", ivar),
    ] {
        let path = out.join(format!("{prefix}-{what}.png"));
        Chart {
            title: format!("{label} per step ({window}-step moving average)"),
            x_label: "learner step".into(),
            y_label: label.into(),
            series,
            log_x: false,
            log_y: false,
        }
        .write_png(&path, 960, 600)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::WanArgs;

    fn wan_options(
        rtt_ms: Option<f64>,
        loss_pct: Option<f64>,
        jitter_ms: Option<f64>,
        seed: u64,
        link_caps: bool,
    ) -> anyhow::Result<Option<crate::broadcast::Wan>> {
        let args = WanArgs {
            rtt_ms,
            loss_pct,
            jitter_ms,
        };
        args.resolve(seed, link_caps)
    }

    #[test]
    fn wan_options_are_off_without_any_and_checked_with_them() {
        assert!(wan_options(None, None, None, 1, false).unwrap().is_none());
        let w = wan_options(None, Some(0.5), None, 7, true)
            .unwrap()
            .unwrap();
        assert_eq!(
            (w.rtt_ms, w.loss_pct, w.seed, w.link_caps),
            (0.0, 0.5, 7, true)
        );
        let err = |r: anyhow::Result<_>| r.map(|_| ()).unwrap_err().to_string();
        assert!(err(wan_options(None, None, None, 1, true)).contains("--link-caps"));
        assert!(err(wan_options(Some(100.0), Some(60.0), None, 1, false)).contains("--loss-pct"));
        assert!(err(wan_options(Some(-1.0), None, None, 1, false)).contains("--rtt-ms"));
    }
}
