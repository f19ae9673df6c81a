//! Simulation of snapshot broadcast for fleets one machine cannot host (`testnet
//! sim-broadcast`, `docs/experiments.md`).
//!
//! It reuses the real chain planner (`control::plan`) and models chunked store-and-forward
//! exactly at chunk granularity: a chunk crosses a link in `c / rate` seconds, where a link's
//! rate is the minimum of the sender's uplink share and the receiver's downlink; a worker
//! forwards chunk `k` to its child once it holds chunk `k` and has finished sending chunk
//! `k − 1`. For a chain that gives the recurrence
//! `t[p][k] = max(t[p−1][k], t[p][k−1]) + c / rate_p`, evaluated for every worker and chunk
//! (the event order of a discrete-event simulation of this pipeline, without a queue because
//! every link carries one flow). The learner's uplink `B0` is shared equally by its concurrent
//! flows (the `N_ch` first hops in chain mode, all `N` workers in star mode).
//! `T_bcast` is the time until a fraction `q` of the workers hold every chunk.
//!
//! Owns the simulation and the `sim-broadcast` sweep and chart. Must not carry its own copy
//! of the bound or of the units: it compares with [`crate::broadcast::bound_s`], the function
//! the real `broadcast` scenario uses, over `control::plan` and `control::units`.

use control::plan::{plan_chains, PlanParams};
use control::units::mbps_to_bytes_per_s;

pub use crate::broadcast::BroadcastMode;
use crate::broadcast::{bound_s, chunk_bytes, snapshot_bytes};
use crate::chart::{Chart, Series};

#[derive(Debug, Clone, Copy)]
pub struct BroadcastSim {
    pub nodes: usize,
    pub size_bytes: f64,
    pub chunk_bytes: f64,
    pub worker_mbps: f64,
    pub learner_mbps: f64,
    pub mode: BroadcastMode,
    /// Fraction of workers that must have installed (q = 1/γ).
    pub quantile: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// Install time of every worker (seconds from publication), ascending.
    pub install_s: Vec<f64>,
    pub t_bcast_s: f64,
    pub n_chains: usize,
    pub max_chain_len: usize,
}

impl BroadcastSim {
    pub fn run(&self) -> SimResult {
        let n_chunks = (self.size_bytes / self.chunk_bytes).ceil().max(1.0) as usize;
        let chunk_len =
            |k: usize| (self.size_bytes - k as f64 * self.chunk_bytes).min(self.chunk_bytes);
        let bw = mbps_to_bytes_per_s(self.worker_mbps);
        let b0 = mbps_to_bytes_per_s(self.learner_mbps);
        let (mut install, n_chains, max_len) = match self.mode {
            BroadcastMode::Star => {
                // All N flows share the learner uplink; each is also capped by the worker link.
                let rate = bw.min(b0 / self.nodes.max(1) as f64);
                let t = (0..n_chunks).map(|k| chunk_len(k) / rate).sum::<f64>();
                (vec![t; self.nodes], 0, 1)
            }
            BroadcastMode::Chain => {
                let workers: Vec<(usize, f64)> = (0..self.nodes).map(|i| (i, 100.0)).collect();
                let plan = plan_chains(
                    &workers,
                    &PlanParams {
                        learner_mbps: self.learner_mbps,
                        worker_mbps: self.worker_mbps,
                        ..PlanParams::default()
                    },
                );
                let first_hop_rate = bw.min(b0 / plan.chains.len().max(1) as f64);
                let mut install = Vec::with_capacity(self.nodes);
                for chain in &plan.chains {
                    // prev[k]: when the upstream node (learner = 0) holds chunk k.
                    let mut prev = vec![0.0f64; n_chunks];
                    for p in 0..chain.len() {
                        let rate = if p == 0 { first_hop_rate } else { bw };
                        let mut done = 0.0f64; // when this link finished the previous chunk
                        let mut cur = vec![0.0f64; n_chunks];
                        for k in 0..n_chunks {
                            done = prev[k].max(done) + chunk_len(k) / rate;
                            cur[k] = done;
                        }
                        install.push(cur[n_chunks - 1]);
                        prev = cur;
                    }
                }
                (install, plan.chains.len(), plan.max_len())
            }
        };
        install.sort_by(f64::total_cmp);
        let need =
            ((self.quantile * self.nodes as f64).ceil() as usize).clamp(1, self.nodes.max(1));
        let t_bcast_s = install.get(need - 1).copied().unwrap_or(0.0);
        SimResult {
            install_s: install,
            t_bcast_s,
            n_chains,
            max_chain_len: max_len,
        }
    }
}

/// The `sim-broadcast` inputs shared by every N, in the units of the command line.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Snapshot size in MB (10⁶ bytes).
    pub size_mb: f64,
    /// Chunk size in KiB (1024 bytes).
    pub chunk_kb: u32,
    pub worker_mbps: f64,
    pub learner_mbps: f64,
    /// Fraction of workers that must have installed (1/γ).
    pub quantile: f64,
}

/// One simulated broadcast and its bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub nodes: usize,
    pub t_bcast_s: f64,
    pub bound_s: f64,
    pub n_chains: usize,
    pub max_chain_len: usize,
}

impl Params {
    /// Simulates one broadcast to `nodes` workers.
    pub fn point(&self, nodes: usize, mode: BroadcastMode) -> Point {
        let r = BroadcastSim {
            nodes,
            size_bytes: snapshot_bytes(self.size_mb),
            chunk_bytes: chunk_bytes(self.chunk_kb),
            worker_mbps: self.worker_mbps,
            learner_mbps: self.learner_mbps,
            mode,
            quantile: self.quantile,
        }
        .run();
        Point {
            nodes,
            t_bcast_s: r.t_bcast_s,
            bound_s: bound_s(
                mode,
                self.size_mb,
                self.chunk_kb,
                self.worker_mbps,
                self.learner_mbps,
                nodes,
                r.max_chain_len,
            ),
            n_chains: r.n_chains,
            max_chain_len: r.max_chain_len,
        }
    }

    /// T_bcast vs N for both modes and their bounds, log-log.
    pub fn chart(&self, nodes: &[usize]) -> Chart {
        let mut sorted = nodes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let points = |mode: BroadcastMode| -> Vec<Point> {
            sorted.iter().map(|&n| self.point(n, mode)).collect()
        };
        let (chain, star) = (points(BroadcastMode::Chain), points(BroadcastMode::Star));
        let xy = |pts: &[Point], bound: bool| -> Vec<(f64, f64)> {
            pts.iter()
                .map(|p| (p.nodes as f64, if bound { p.bound_s } else { p.t_bcast_s }))
                .collect()
        };
        Chart {
            title: format!(
                "T_bcast vs N: M = {} MB, c = {} KiB, Bw = {} Mbit/s, B0 = {} Mbit/s, q = {}",
                self.size_mb, self.chunk_kb, self.worker_mbps, self.learner_mbps, self.quantile
            ),
            x_label: "N (workers)".into(),
            y_label: "T_bcast (s)".into(),
            series: vec![
                Series::solid("chain (simulated)", xy(&chain, false)),
                Series::solid("star (simulated)", xy(&star, false)),
                Series::dashed("chain bound", xy(&chain, true)),
                Series::dashed("star bound", xy(&star, true)),
            ],
            log_x: true,
            log_y: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(nodes: usize, mode: BroadcastMode) -> SimResult {
        BroadcastSim {
            nodes,
            size_bytes: 64e6,
            chunk_bytes: 1e6,
            worker_mbps: 100.0,
            learner_mbps: 300.0,
            mode,
            quantile: 1.0,
        }
        .run()
    }

    #[test]
    fn chain_meets_the_store_and_forward_bound_exactly() {
        for n in [4, 8, 32, 1000] {
            let r = sim(n, BroadcastMode::Chain);
            let bound = control::plan::chain_bound_s(64e6, 1e6, 100.0, r.max_chain_len);
            assert!(
                (r.t_bcast_s - bound).abs() < 1e-9,
                "N={n}: {} vs {bound}",
                r.t_bcast_s
            );
            assert_eq!(r.n_chains, 3.min(n));
        }
    }

    #[test]
    fn star_grows_linearly_once_the_uplink_is_shared() {
        let r = sim(3, BroadcastMode::Star);
        assert!(
            (r.t_bcast_s - 5.12).abs() < 1e-9,
            "3 flows fit in 300 Mbit/s"
        );
        let r = sim(30, BroadcastMode::Star);
        let bound = control::plan::star_bound_s(64e6, 100.0, 300.0, 30);
        assert!((r.t_bcast_s - bound).abs() < 1e-9);
        assert!(r.t_bcast_s > 10.0 * sim(3, BroadcastMode::Star).t_bcast_s * 0.99);
        assert!(
            sim(1000, BroadcastMode::Chain).t_bcast_s
                < sim(1000, BroadcastMode::Star).t_bcast_s / 40.0
        );
    }

    #[test]
    fn the_quantile_picks_the_q_th_install() {
        let mut s = BroadcastSim {
            nodes: 10,
            size_bytes: 10e6,
            chunk_bytes: 1e6,
            worker_mbps: 100.0,
            learner_mbps: 100.0,
            mode: BroadcastMode::Chain,
            quantile: 1.0,
        };
        let all = s.run();
        s.quantile = 0.5;
        let half = s.run();
        assert_eq!(half.t_bcast_s, all.install_s[4]);
        assert!(half.t_bcast_s < all.t_bcast_s);
    }

    #[test]
    fn simulation_and_real_scenario_compare_against_the_same_bound() {
        let p = Params {
            size_mb: 64.0,
            chunk_kb: 1024,
            worker_mbps: 100.0,
            learner_mbps: 300.0,
            quantile: 1.0,
        };
        let settings = crate::broadcast::Settings {
            nodes: vec![8],
            size_mb: p.size_mb,
            chunk_kb: p.chunk_kb,
            worker_mbps: p.worker_mbps,
            learner_mbps: p.learner_mbps,
            modes: vec![BroadcastMode::Chain, BroadcastMode::Star],
            rounds: 1,
            bin: std::path::PathBuf::new(),
            heartbeat_ms: 2000,
            wan: None,
            quic: false,
            restart_congestion: true,
            warm_up_mib: None,
            plan_epoch: control::seats::EPOCH_VERSIONS,
            delta_changed_pct: None,
        };
        for n in [4, 8, 32, 1000] {
            for mode in [BroadcastMode::Chain, BroadcastMode::Star] {
                let pt = p.point(n, mode);
                let real = crate::broadcast::bound_s(
                    mode,
                    settings.size_mb,
                    settings.chunk_kb,
                    settings.worker_mbps,
                    settings.learner_mbps,
                    n,
                    pt.max_chain_len,
                );
                assert_eq!(pt.bound_s, real, "N={n} {mode:?}");
            }
            // On uniform links the simulated chain meets its bound exactly, in KiB chunks too.
            let pt = p.point(n, BroadcastMode::Chain);
            assert!((pt.t_bcast_s - pt.bound_s).abs() < 1e-9, "N={n}");
        }
        // 1024 KiB = 1 MiB: the chain bound at N = 1000 (L = 334) is 5.12 s + 333 MiB / 12.5 MB/s.
        let pt = p.point(1000, BroadcastMode::Chain);
        assert_eq!(pt.max_chain_len, 334);
        assert!((pt.bound_s - (5.12 + 333.0 * 1_048_576.0 / 12.5e6)).abs() < 1e-9);
        let chart = p.chart(&[8, 4, 8]);
        assert_eq!(chart.series.len(), 4);
        assert_eq!(chart.series[0].points.len(), 2);
    }
}
