//! The command line of `testnet`: one subcommand per scenario and its options, with the
//! option groups they share. Parsing and range checks only; [`crate::commands`] runs them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::broadcast::{self, BroadcastMode};

/// Where scenarios write their files unless told otherwise (`testnet/results/`, git-ignored).
pub const DEFAULT_OUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/results");

#[derive(Parser)]
#[command(name = "testnet", about = "echo-swarm scenarios and simulations")]
pub struct Cli {
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Options every multi-process scenario takes.
#[derive(Args)]
pub struct RunOpts {
    /// The `echo-node` binary (default: next to this one, i.e. the same cargo profile).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// Print the summary as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON results and PNG charts (created if missing).
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
}

/// The emulated WAN of `broadcast` and `nat`.
#[derive(Args, Clone, Copy)]
pub struct WanArgs {
    /// Emulated node-to-node round trip (ms): runs every node in a network namespace on
    /// an emulated WAN link (root; docs/netlab.md). Any of the three WAN options turns it on.
    #[arg(long)]
    pub rtt_ms: Option<f64>,
    /// Emulated packet loss per direction of a node-to-node path (%).
    #[arg(long)]
    pub loss_pct: Option<f64>,
    /// Emulated one-way jitter (± ms, uniform, no reordering).
    #[arg(long)]
    pub jitter_ms: Option<f64>,
}

#[derive(Subcommand)]
pub enum Scenario {
    /// T_bcast of real `echo-node` processes on 127.0.0.1, chain and/or star, against the
    /// bound (docs/broadcast.md); writes `broadcast.json` and `broadcast.png` under --out.
    Broadcast(BroadcastArgs),
    /// Workers behind NAT routers (endpoint-independent and symmetric) and a public learner
    /// in network namespaces, a few learner steps of a real swarm; per worker its NAT, how
    /// the learner reaches it, installs and pulls (root; docs/netlab.md). With the WAN
    /// options: no NAT routers, every node (the learner and 3 × --per-nat workers) on its own
    /// emulated WAN link, and the report adds the learner's pull round trip.
    Nat(NatArgs),
    /// Final reward and importance-weight variance per staleness budget S, GRPO and GEPO
    /// (one `echo-node demo` run of --minutes each; S = 0 runs in sequential mode).
    Staleness(StalenessArgs),
    /// Bubble ratio vs number of rollout workers, with the threshold the capacity model
    /// predicts (one `echo-node demo` run of --minutes per worker count).
    Overlap(OverlapArgs),
    /// ECHO-2 Table 4 on one chain: a worker slowed 0.5×, a forwarder slowed 0.5×, a forwarder
    /// dropped, a worker dropped, in a swarm whose scheduler keeps --active workers active and
    /// two on standby: throughput drop, recovery, bubble increase, the others' install lag.
    Faults(FaultsArgs),
    /// Malicious workers (one per attack, `ECHO_NODE_MISBEHAVE`) against a learner and two
    /// honest workers, a few attacks per run, plus one clean run: per attack whether it was
    /// detected and banned, and the rewards (docs/adversary.md).
    Adversary(AdversaryArgs),
    /// A clean swarm of workers with different uplinks in one chain (one at a tenth of the
    /// others by default): strikes and bans counted (the aim: none), demotions, forwarding
    /// verdicts, the honest install ratio (docs/adversary.md, "Heterogeneous clean run").
    Forwarding(ForwardingArgs),
    /// Chains vs star (T_bcast) and cost-aware vs random activation (cost per step) on a
    /// mixed-price pool.
    Ablation(AblationArgs),
    /// Charts of learner step logs (`<data_dir>/metrics/steps.jsonl`): reward and
    /// importance-weight variance vs step, moving averages; one `NAME=PATH` per run.
    LearningPlot(LearningPlotArgs),
    /// CPU per node spent on membership alone (heartbeats, identify, Kademlia) with N idle
    /// `echo-node` processes, sampled from /proc over --seconds once node 0 hears everyone.
    Membership(MembershipArgs),
    /// Simulated T_bcast of one snapshot for N workers (chain or star), against the bound.
    SimBroadcast(SimBroadcastArgs),
}

/// The options of `testnet broadcast`.
#[derive(Args)]
pub struct BroadcastArgs {
    /// Rollout workers; several values give a sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    pub nodes: Vec<usize>,
    /// Snapshot size in MB (10⁶ bytes).
    #[arg(long, default_value_t = 64.0)]
    pub size_mb: f64,
    /// Chunk size in KiB (1024 bytes), as `sim-broadcast` and the node's
    /// `storage.chunk_size_kib`.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kb: u32,
    #[arg(long, default_value_t = 100.0)]
    pub worker_mbps: f64,
    #[arg(long, default_value_t = 300.0)]
    pub learner_mbps: f64,
    /// `chain`, `star`, or both (`chain,star`).
    #[arg(long, value_delimiter = ',', default_value = "chain,star")]
    pub mode: Vec<BroadcastMode>,
    /// Snapshots published per setting (T_bcast is their median).
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Nodes' gossip heartbeat interval (ms). The node default; installs are reported at
    /// once regardless. Every heartbeat costs every node a signature check per copy it
    /// receives, which on one host adds up as N².
    #[arg(long, default_value_t = 2000)]
    pub heartbeat_ms: u64,
    /// Run nothing: re-plot a saved `broadcast.json` into --out.
    #[arg(long)]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub wan: WanArgs,
    /// Seed of the emulator's loss and jitter draws.
    #[arg(long, default_value_t = 1)]
    pub wan_seed: u64,
    /// Run every node on QUIC only (`/udp/0/quic-v1`) instead of TCP, so that the chunk
    /// streams go over QUIC.
    #[arg(long)]
    pub quic: bool,
    /// Nodes keep the kernel's congestion state across pushes
    /// (`network.restart_congestion = false`), to measure what the restart is worth.
    #[arg(long)]
    pub keep_congestion_state: bool,
    /// MiB of filler a parent sends on a new chunk stream before the first version
    /// (`broadcast.warm_up_mib`; 0 = none; default: the node's, 8), to measure what the
    /// warm-up is worth.
    #[arg(long)]
    pub warm_up_mib: Option<u64>,
    /// Versions per plan epoch (`broadcast.plan_epoch`: the seats are re-drawn at the first
    /// version of each, which gives new parent–child pairs), to measure what the re-draws cost.
    #[arg(long, default_value_t = control::seats::EPOCH_VERSIONS)]
    pub plan_epoch: u64,
    /// With the WAN options: cap the bandwidth in the emulated links (each node's link
    /// serialises at --learner-mbps / --worker-mbps in both directions) and turn the
    /// workers' own token buckets off, as on a real access link; the learner keeps its
    /// B0 bucket (it also sets the number of chains).
    #[arg(long)]
    pub link_caps: bool,
    /// Publish bf16 snapshots as sparse deltas: the first round is a keyframe of
    /// --size-mb, each later version differs from the one before in --changed-pct % of
    /// its values; T_bcast and the bound are the delta rounds'.
    #[arg(long)]
    pub delta: bool,
    /// With --delta: percentage of bf16 values changed per version.
    #[arg(long, default_value_t = 1.0, requires = "delta")]
    pub changed_pct: f64,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet nat`.
#[derive(Args)]
pub struct NatArgs {
    /// Learner steps after every worker has installed a snapshot.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Workers behind each of the NAT routers.
    #[arg(long, default_value_t = 1)]
    pub per_nat: usize,
    /// Also start a relay node on the public segment (needs an echo-node with the relay
    /// role) and let the workers reserve slots on it.
    #[arg(long)]
    pub relay: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub wan: WanArgs,
    /// Run nothing: remove the namespaces earlier lab runs left behind (runs whose
    /// process is gone) and exit.
    #[arg(long)]
    pub cleanup: bool,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet staleness`.
#[derive(Args)]
pub struct StalenessArgs {
    #[arg(long, value_delimiter = ',', default_value = "0,1,3,6,11")]
    pub values: Vec<u64>,
    #[arg(long, value_delimiter = ',', default_value = "grpo,gepo")]
    pub objectives: Vec<String>,
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Run nothing: re-plot a saved `staleness.json` into --out.
    #[arg(long)]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet overlap`.
#[derive(Args)]
pub struct OverlapArgs {
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub workers: Vec<usize>,
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Cap each worker at this many groups/s (0 = none): on one host, capped workers make
    /// capacity grow with their number instead of competing for the same cores.
    #[arg(long, default_value_t = 0.0)]
    pub worker_groups_per_s: f64,
    /// Extra `echo-node demo` options for every run, e.g. `--staleness 4 --kappa 2`.
    #[arg(long, allow_hyphen_values = true, value_delimiter = ' ')]
    pub demo_args: Vec<String>,
    /// Run nothing: re-analyse and re-plot a saved `overlap.json` into --out.
    #[arg(long)]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet faults`.
#[derive(Args)]
pub struct FaultsArgs {
    #[arg(long, default_value_t = 3)]
    pub active: usize,
    /// Seconds of each phase (the baseline and each of the four faults; each fault but the
    /// last is followed by half a phase of recovery).
    #[arg(long, default_value_t = 40.0)]
    pub phase_s: f64,
    /// Period of a slowed worker's stop/run cycle (ms; stopped for the first half). The
    /// default halves its compute and bandwidth with stops short against a training step;
    /// 1000 freezes it for half a second at a time.
    #[arg(long, default_value_t = 100)]
    pub slow_period_ms: u64,
    /// Run nothing: re-plot a saved `faults.json` into --out.
    #[arg(long)]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet adversary`.
#[derive(Args)]
pub struct AdversaryArgs {
    /// Attacks to run (default: every one of `echo_node::misbehave::Attack::ALL` but
    /// `mu_inflation`, whose target, the scheduler, the scenario does not run).
    #[arg(long, value_delimiter = ',')]
    pub attacks: Vec<echo_node::misbehave::Attack>,
    /// Learner steps per run.
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    /// Malicious workers per run (each run has its own learner and honest workers).
    #[arg(long, default_value_t = 3)]
    pub batch: usize,
    /// The learner's supervised warm-start steps.
    #[arg(long, default_value_t = 60)]
    pub warm_start_steps: usize,
    /// Skip the clean run (reward_clean is then null).
    #[arg(long)]
    pub no_clean: bool,
    /// Honest workers per run (`w0`, `w1`, …).
    #[arg(long, default_value_t = 2)]
    pub honest: usize,
    /// Clean runs (their rewards' spread is what an attack must stay inside).
    #[arg(long, default_value_t = 1)]
    pub clean_runs: usize,
    /// The `echo-node` binary (default: next to this one).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// Directory for `adversary.json` (created if missing).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results/adversary"))]
    pub out: PathBuf,
}

/// The options of `testnet forwarding`.
#[derive(Args)]
pub struct ForwardingArgs {
    /// Each worker's uplink cap, Mbit/s (0: none).
    #[arg(long, value_delimiter = ',', default_value = "40,40,40,4")]
    pub uplinks: Vec<f64>,
    /// B̂w (and B0: one chain), Mbit/s.
    #[arg(long, default_value_t = 40.0)]
    pub worker_mbps: f64,
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    #[arg(long, default_value_t = 60)]
    pub warm_start_steps: usize,
    /// Versions per plan epoch (seats re-drawn at each).
    #[arg(long, default_value_t = 3)]
    pub plan_epoch: u64,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet ablation`.
#[derive(Args)]
pub struct AblationArgs {
    /// Workers of the broadcast comparison.
    #[arg(long, default_value_t = 8)]
    pub nodes: usize,
    #[arg(long, default_value_t = 64.0)]
    pub size_mb: f64,
    /// Workers in the mixed-price pool (costs 0.1, 0.2, 0.4, … $/h).
    #[arg(long, default_value_t = 6)]
    pub pool: usize,
    /// Workers kept active.
    #[arg(long, default_value_t = 3)]
    pub active: usize,
    /// Seconds of training per activation policy.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet learning-plot`.
#[derive(Args)]
pub struct LearningPlotArgs {
    #[arg(long = "run", required = true)]
    pub runs: Vec<String>,
    /// Moving-average window in steps.
    #[arg(long, default_value_t = 50)]
    pub window: usize,
    /// File name prefix under --out (`PREFIX-reward.png`, `PREFIX-ivar.png`).
    #[arg(long, default_value = "learning")]
    pub prefix: String,
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
}

/// The options of `testnet membership`.
#[derive(Args)]
pub struct MembershipArgs {
    #[arg(long, value_delimiter = ',', default_value = "8,32,64")]
    pub nodes: Vec<usize>,
    /// The nodes' configured heartbeat interval (ms).
    #[arg(long, default_value_t = 2000)]
    pub heartbeat_ms: u64,
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub run: RunOpts,
}

/// The options of `testnet sim-broadcast`.
#[derive(Args)]
pub struct SimBroadcastArgs {
    /// Rollout workers; several values give a sweep, e.g. `--nodes 4,8,1000`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4,8,16,32,64,128,256,512,1000"
    )]
    pub nodes: Vec<usize>,
    /// Snapshot size in MB (10⁶ bytes).
    #[arg(long, default_value_t = 64.0)]
    pub size_mb: f64,
    /// Chunk size in KiB (1024 bytes), as in `broadcast`.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kb: u32,
    #[arg(long, default_value_t = 100.0)]
    pub worker_mbps: f64,
    #[arg(long, default_value_t = 300.0)]
    pub learner_mbps: f64,
    /// `chain` or `star`.
    #[arg(long, default_value = "chain")]
    pub mode: BroadcastMode,
    /// Fraction of workers that must have installed (1/γ).
    #[arg(long, default_value_t = 1.0)]
    pub quantile: f64,
    /// One JSON line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Directory for the chart `t_bcast_vs_n.png` (T_bcast vs N for chain and star and
    /// their bounds, log-log); created if missing.
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Do not write the chart.
    #[arg(long)]
    pub no_plot: bool,
}

impl WanArgs {
    /// The emulated WAN, when any of its options is given, its ranges checked.
    pub fn resolve(self, seed: u64, link_caps: bool) -> anyhow::Result<Option<broadcast::Wan>> {
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
