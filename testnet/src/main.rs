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
//! This file only dispatches: the command line is [`cli`]'s, running a scenario
//! [`commands`]'.

mod ablation;
mod adversary;
mod broadcast;
mod chart;
mod cli;
mod commands;
mod faults;
mod forwarding;
mod harness;
mod learning;
mod membership;
mod nat;
mod netlab;
mod progress;
mod sim;

fn main() -> anyhow::Result<()> {
    use cli::Scenario::*;
    match <cli::Cli as clap::Parser>::parse().scenario {
        Broadcast(a) => commands::broadcast(a),
        Nat(a) => commands::nat(a),
        Staleness(a) => commands::staleness(a),
        Overlap(a) => commands::overlap(a),
        Faults(a) => commands::faults(a),
        Adversary(a) => commands::adversary(a),
        Forwarding(a) => commands::forwarding(a),
        Ablation(a) => commands::ablation(a),
        LearningPlot(a) => commands::learning_plot(a),
        Membership(a) => commands::membership(a),
        SimBroadcast(a) => commands::sim_broadcast(a),
    }
}
