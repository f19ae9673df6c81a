//! Testnet harness. Today it runs the broadcast simulation (`sim-broadcast`), which reuses the
//! real chain planner for fleets one machine cannot host; the multi-process scenarios of SPEC
//! §13 (`broadcast`, `overlap`, `staleness`, `ablation`, `faults`) arrive with snapshot
//! dissemination and the scheduler in the node.

mod sim;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "testnet", about = "echo-swarm scenarios and simulations")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Chain,
    Star,
}

#[derive(Subcommand)]
enum Scenario {
    /// Simulated T_bcast of one snapshot for N workers (chain or star), against the bound.
    SimBroadcast {
        /// Rollout workers; several values give a sweep, e.g. `--nodes 4,8,1000`.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "4,8,16,32,64,128,256,512,1000"
        )]
        nodes: Vec<usize>,
        #[arg(long, default_value_t = 64.0)]
        size_mb: f64,
        #[arg(long, default_value_t = 1024.0)]
        chunk_kb: f64,
        #[arg(long, default_value_t = 100.0)]
        worker_mbps: f64,
        #[arg(long, default_value_t = 300.0)]
        learner_mbps: f64,
        #[arg(long, value_enum, default_value = "chain")]
        mode: ModeArg,
        /// Fraction of workers that must have installed (1/γ).
        #[arg(long, default_value_t = 1.0)]
        quantile: f64,
        /// One JSON line instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().scenario {
        Scenario::SimBroadcast {
            nodes,
            size_mb,
            chunk_kb,
            worker_mbps,
            learner_mbps,
            mode,
            quantile,
            json,
        } => {
            anyhow::ensure!(
                size_mb > 0.0 && chunk_kb > 0.0,
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
            let (size, chunk) = (size_mb * 1e6, chunk_kb * 1e3);
            let mut rows = Vec::new();
            for n in nodes {
                let mode = match mode {
                    ModeArg::Chain => sim::Mode::Chain,
                    ModeArg::Star => sim::Mode::Star,
                };
                let r = sim::BroadcastSim {
                    nodes: n,
                    size_bytes: size,
                    chunk_bytes: chunk,
                    worker_mbps,
                    learner_mbps,
                    mode,
                    quantile,
                }
                .run();
                let bound = match mode {
                    sim::Mode::Chain => {
                        control::plan::chain_bound_s(size, chunk, worker_mbps, r.max_chain_len)
                    }
                    sim::Mode::Star => {
                        control::plan::star_bound_s(size, worker_mbps, learner_mbps, n)
                    }
                };
                rows.push(serde_json::json!({
                    "nodes": n, "t_bcast_s": r.t_bcast_s, "bound_s": bound,
                    "n_chains": r.n_chains, "max_chain_len": r.max_chain_len,
                }));
            }
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
                for r in &rows {
                    println!(
                        "{:>6} {:>10.3} {:>10.3} {:>8} {:>8}",
                        r["nodes"].as_u64().unwrap_or(0),
                        r["t_bcast_s"].as_f64().unwrap_or(0.0),
                        r["bound_s"].as_f64().unwrap_or(0.0),
                        r["n_chains"].as_u64().unwrap_or(0),
                        r["max_chain_len"].as_u64().unwrap_or(0)
                    );
                }
            }
            Ok(())
        }
    }
}
