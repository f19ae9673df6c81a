//! Broadcast benchmark roles (the testnet `broadcast` scenario, `docs/broadcast.md`), started by the
//! hidden `echo-node run` flags the testnet harness passes:
//!
//! - `--bench-broadcast-mb M --bench-workers N --bench-rounds R` on the learner: once N
//!   rollout workers are connected and active, publish R snapshots of M MB of fresh random
//!   bytes (nothing reusable between rounds) through the real dissemination engine, and time
//!   each until every worker — and until a fraction 1/γ — reports the install in its
//!   heartbeat. Results go to the `bench` section of `/status` and to
//!   `<data_dir>/metrics/broadcast.json`.
//! - `--bench-sink` on a worker: no model, no generation; the probe reports the version the
//!   dissemination engine installed (so any payload counts).
//!
//! The payload is opaque to the dissemination layer, so the benchmark exercises exactly the
//! code path of real snapshots: signed manifest, scored chain plan, verified store-and-forward
//! chunk streams, in-node bandwidth caps, repair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use control::capacity::{broadcast_completed_at, broadcast_done};
use dissemination::Disseminator;
use rand::RngCore;

use super::{Probe, RoleView, VersionChanges};
use crate::api::{BenchRound, BenchStatus, RoleSection};
use crate::state::NodeState;
use p2p::{active_install_times, active_installs};

/// What the learner-side benchmark is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct BenchPlan {
    pub size_mb: f64,
    pub workers: usize,
    pub rounds: u32,
}

/// How long to wait for the workers to join, and for one broadcast to complete.
const JOIN_LIMIT: Duration = Duration::from_secs(180);
const ROUND_LIMIT: Duration = Duration::from_secs(600);

/// A worker's probe: the version the dissemination engine installed, and its changes.
pub fn sink_probe(d: &Disseminator) -> (Probe, VersionChanges) {
    let changes = VersionChanges::Version(d.installed_changes());
    let d = d.clone();
    (Arc::new(move || (d.installed_version(), 0.0)), changes)
}

/// Runs the benchmark as a task; returns when all rounds are done (the node keeps serving).
pub async fn run_publisher(
    state: Arc<NodeState>,
    client: p2p::Client,
    dissem: Disseminator,
    plan: BenchPlan,
    view: RoleView,
) -> anyhow::Result<()> {
    let mut rounds: Vec<BenchRound> = Vec::new();
    let show = |rounds: &[BenchRound], phase: &str| {
        view.set(RoleSection::Bench(BenchStatus {
            phase: phase.into(),
            done: phase == "done",
            size_mb: plan.size_mb,
            workers: plan.workers,
            rounds: rounds.to_vec(),
        }))
    };
    show(&rounds, "joining");
    let t_join = Instant::now();
    let mut changes = client.peer_changes();
    loop {
        let joined = active_installs(&client.peers().await?).len();
        if joined >= plan.workers {
            break;
        }
        anyhow::ensure!(
            t_join.elapsed() < JOIN_LIMIT,
            "only {joined} of {} workers joined within {JOIN_LIMIT:?}",
            plan.workers
        );
        // The next heartbeat or connection (or a second, to check the limit).
        let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    }
    tracing::info!(
        workers = plan.workers,
        secs = t_join.elapsed().as_secs_f64(),
        "bench: all workers joined"
    );
    let bytes = (plan.size_mb * 1e6) as usize;
    let start_version = state
        .chunks
        .versions()?
        .into_iter()
        .max()
        .map_or(1, |v| v + 1);
    for r in 0..plan.rounds {
        show(&rounds, "publishing");
        let version = start_version + u64::from(r);
        let payload = tokio::task::spawn_blocking(move || {
            let mut p = vec![0u8; bytes];
            rand::thread_rng().fill_bytes(&mut p);
            p
        })
        .await?;
        let before = dissem.counters();
        let t0 = Instant::now();
        let report = dissem
            .publish(version, [0u8; 32], payload.into(), None)
            .await
            .context("bench publish")?;
        let (mut t_q, mut t_all) = (None, None);
        while t_all.is_none() {
            anyhow::ensure!(
                t0.elapsed() < ROUND_LIMIT,
                "round {r}: not every worker installed within {ROUND_LIMIT:?}"
            );
            // Each end is the install time the reports state (a report held back by the
            // sender's pacing states its age), else the time this loop noticed it.
            let timed = active_install_times(&client.peers().await?);
            let installs: Vec<Option<u64>> = timed.iter().map(|(v, _)| *v).collect();
            let now = Instant::now();
            let since = |t: Option<Instant>| t.map_or(now, |t| t.clamp(t0, now)) - t0;
            if t_q.is_none() && broadcast_done(&installs, version) {
                t_q = Some(since(broadcast_completed_at(&timed, version)).as_secs_f64());
            }
            if installs.len() >= plan.workers
                && installs.iter().all(|v| v.is_some_and(|v| v >= version))
            {
                // The last install; unknown when any install time is.
                let last = timed.iter().map(|(_, t)| *t).collect::<Option<Vec<_>>>();
                t_all = Some(since(last.and_then(|t| t.into_iter().max())).as_secs_f64());
            }
            // Install reports arrive as heartbeats: wait for the next change of the peer
            // view (or a second, to check the limit).
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }
        let after = dissem.counters();
        let chains: Vec<usize> = report.plan.plan.chains.iter().map(Vec::len).collect();
        let row = BenchRound {
            round: r,
            version,
            bytes,
            t_bcast_all_s: t_all,
            t_bcast_q_s: t_q,
            n_chains: chains.len(),
            chain_lengths: chains,
            fetch_only: report.plan.plan.fetch_only.len(),
            learner_pushed_bytes: after.pushed_bytes - before.pushed_bytes,
            learner_served_bytes: after.served_bytes - before.served_bytes,
        };
        tracing::info!(row = ?row, "bench: broadcast complete");
        rounds.push(row);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = state.config.data_dir.join("metrics").join("broadcast.json");
    std::fs::create_dir_all(out.parent().unwrap_or(&state.config.data_dir))?;
    std::fs::write(
        &out,
        serde_json::to_vec_pretty(&serde_json::json!({"rounds": rounds}))?,
    )
    .with_context(|| format!("writing {}", out.display()))?;
    show(&rounds, "done");
    Ok(())
}
