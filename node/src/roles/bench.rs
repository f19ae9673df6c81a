//! Broadcast benchmark roles (the testnet `broadcast` scenario, `docs/broadcast.md`), started by the
//! hidden `echo-node run` flags the testnet harness passes:
//!
//! - `--bench-broadcast-mb M --bench-workers N --bench-rounds R` on the learner: once N
//!   rollout workers are connected and active, publish R snapshots of M MB of fresh random
//!   bytes (nothing reusable between rounds) through the real dissemination engine, and time
//!   each until every worker — and until a fraction 1/γ — reports the install in its
//!   heartbeat. Results go to the `bench` section of `/status` and to
//!   `<data_dir>/metrics/broadcast.json`.
//! - `--bench-delta-changed-pct P` with it: the rounds are synthetic bf16 snapshots in which
//!   P % of the values changed since the round before (by one bf16 unit in the last place, as
//!   an RL step at a small learning rate moves them), published the way the learner
//!   publishes bf16 versions: a keyframe first, then sparse deltas (`policy::delta`, chosen
//!   by the learner's own [`DeltaPublisher`] rule). The rows carry the bytes sent and the
//!   full payload's size.
//! - `--bench-sink` on a worker: no model, no generation; the probe reports the version whose
//!   full payload the sink holds — a full payload as the dissemination engine delivered it,
//!   a delta once applied to the payload before and checked against its signed root
//!   ([`DeltaBase`]), so a delta round ends when the workers have reconstructed it.
//!
//! The payload is opaque to the dissemination layer, so the benchmark exercises exactly the
//! code path of real snapshots: signed manifest, scored chain plan, verified store-and-forward
//! chunk streams, in-node bandwidth caps, repair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use control::capacity::{broadcast_completed_at, broadcast_done};
use dissemination::DisseminationEvent;
use dissemination::Disseminator;
use rand::{Rng, RngCore};
use tokio::sync::{mpsc, watch};

use super::delta::{DeltaBase, DeltaPublisher};
use super::{Probe, RoleView, Tasks, VersionChanges};
use crate::api::{BenchRound, BenchStatus, RoleSection};
use crate::state::NodeState;
use p2p::{active_install_times, active_installs};

/// What the learner-side benchmark is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct BenchPlan {
    pub size_mb: f64,
    pub workers: usize,
    pub rounds: u32,
    /// Publish synthetic bf16 versions as deltas, this percentage of values changed per
    /// version (`None`: fresh random bytes every round, always whole).
    pub delta_changed_pct: Option<f64>,
}

/// How long to wait for the workers to join, and for one broadcast to complete.
const JOIN_LIMIT: Duration = Duration::from_secs(180);
const ROUND_LIMIT: Duration = Duration::from_secs(600);
/// The most the benchmark waits for the learner's warm streams to the first hops (opened and
/// their filler sent), and the pause after them for the workers' own (see [`warm_up`]): a
/// dial and a stream's negotiation take a few round trips, 8 MiB of filler at 100 Mbit/s
/// about 0.7 s once the window has grown; 3 s is 30 round trips at 100 ms.
const WARM_LIMIT: Duration = Duration::from_secs(10);
const WARM_SETTLE: Duration = Duration::from_secs(3);

/// A sink worker: the version whose full payload it holds (its probe and version watch), kept
/// by a task that applies each delivered payload as the rollout role does — a delta to the
/// full payload held before, checked against its signed root — but loads no model.
pub fn sink(
    installs: Option<mpsc::UnboundedReceiver<DisseminationEvent>>,
) -> (Probe, VersionChanges, Tasks) {
    let (tx, rx) = watch::channel(None::<u64>);
    let tasks = Tasks::default();
    if let Some(mut installs) = installs {
        tasks.spawn(async move {
            let mut base = DeltaBase::default();
            let mut bar = super::progress::Bar::default();
            while let Some(ev) = installs.recv().await {
                let (version, payload, kind) = match ev {
                    DisseminationEvent::Installed {
                        version,
                        payload,
                        kind,
                        ..
                    } => {
                        bar.installed(version);
                        (version, payload, kind)
                    }
                    DisseminationEvent::Progress {
                        version,
                        stored,
                        total,
                        bytes,
                    } => {
                        bar.progress(version, stored, total, bytes);
                        continue;
                    }
                    _ => continue,
                };
                let held = base.clone();
                let full =
                    tokio::task::spawn_blocking(move || held.full_payload(version, payload, kind))
                        .await;
                match full {
                    Ok(Ok(full)) => {
                        base.installed(version, full);
                        tx.send_replace(Some(version));
                    }
                    Ok(Err(e)) => tracing::warn!(version, error = %e, "bench sink: not installed"),
                    Err(e) => tracing::error!(error = %e, "bench sink: install task failed"),
                }
            }
        });
    }
    let version = rx.clone();
    let probe: Probe = Arc::new(move || (*version.borrow(), 0.0));
    (probe, VersionChanges::Version(rx), tasks)
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
    let mut changes = client.peer_changes();
    wait_for_workers(&client, &mut changes, plan.workers).await?;
    let start_version = state
        .chunks
        .versions()?
        .into_iter()
        .max()
        .map_or(1, |v| v + 1);
    let first = dissem
        .announce_plan(start_version, None)
        .await
        .context("bench: announcing the standing plan")?;
    warm_up(&dissem, first).await;
    let mut source = RoundSource {
        bytes: (plan.size_mb * 1e6) as usize,
        synthetic: plan.delta_changed_pct.map(|pct| SyntheticVersions {
            pct,
            full: bytes::Bytes::new(),
            // No keyframe but the first (and any delta that would not save a tenth).
            deltas: DeltaPublisher::new(u64::MAX),
        }),
    };
    for r in 0..plan.rounds {
        show(&rounds, "publishing");
        let version = start_version + u64::from(r);
        let t_prepare = Instant::now();
        let (payload, kind, full_bytes, changed) = source.next(version).await?;
        let prepare_s = t_prepare.elapsed().as_secs_f64();
        let sent = payload.len();
        let before = dissem.counters();
        let t0 = Instant::now();
        let report = dissem
            .publish_as(version, [0u8; 32], payload, kind, None)
            .await
            .context("bench publish")?;
        let (t_q, t_all) = time_installs(&client, &mut changes, version, plan.workers, t0)
            .await
            .with_context(|| format!("round {r}"))?;
        let after = dissem.counters();
        let chains: Vec<usize> = report.plan.plan.chains.iter().map(Vec::len).collect();
        let row = BenchRound {
            round: r,
            version,
            bytes: sent,
            full_bytes,
            delta: kind != storage::PayloadKind::Full,
            changed_frac: changed,
            prepare_s,
            t_bcast_all_s: Some(t_all),
            t_bcast_q_s: t_q,
            n_chains: chains.len(),
            chain_lengths: chains,
            fetch_only: report.plan.plan.fetch_only.len(),
            learner_pushed_bytes: after.pushed_bytes - before.pushed_bytes,
            learner_served_bytes: after.served_bytes - before.served_bytes,
        };
        tracing::info!(row = ?row, "bench: broadcast complete");
        rounds.push(row);
        // Between versions, as the learner's publisher does: the next version's plan goes
        // out ahead of it when it has new pairs (a plan epoch's seat re-draw).
        let next = dissem
            .announce_if_due(&client.peers().await?)
            .await
            .context("bench: announcing a standing plan")?;
        warm_up(&dissem, next).await;
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

/// After a standing plan was announced (`plan`: the run's first before its snapshot exists,
/// as a learner does once its workers are known, or a later one between versions), gives the
/// parents the time a training step would before the next publication: until the learner's
/// own warm streams are open and have carried their filler (at most [`WARM_LIMIT`]), then
/// [`WARM_SETTLE`] for the workers' streams to their children, which the learner cannot see.
/// The rounds are timed from their publication, as before; this phase precedes them.
async fn warm_up(dissem: &Disseminator, plan: Option<dissemination::SignedPlan>) {
    let Some(plan) = plan else {
        return;
    };
    let t = Instant::now();
    while dissem.warming() > 0 && t.elapsed() < WARM_LIMIT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(WARM_SETTLE).await;
    tracing::info!(
        version = plan.plan.version,
        secs = t.elapsed().as_secs_f64(),
        learner_sessions = dissem.kept_sessions(),
        first_hops = plan.plan.chains.len(),
        "bench: plan announced, streams warmed"
    );
}

/// Waits until `workers` rollout workers are connected and active (at most [`JOIN_LIMIT`]).
async fn wait_for_workers(
    client: &p2p::Client,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    workers: usize,
) -> anyhow::Result<()> {
    let t_join = Instant::now();
    loop {
        let joined = active_installs(&client.peers().await?).len();
        if joined >= workers {
            break;
        }
        anyhow::ensure!(
            t_join.elapsed() < JOIN_LIMIT,
            "only {joined} of {workers} workers joined within {JOIN_LIMIT:?}"
        );
        // The next heartbeat or connection (or a second, to check the limit).
        let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    }
    tracing::info!(
        workers,
        secs = t_join.elapsed().as_secs_f64(),
        "bench: all workers joined"
    );
    Ok(())
}

/// Seconds from `t0` until a fraction 1/γ of the active workers (`None` when that end is not
/// seen before the last) and until all `workers` reported `version` installed, at most
/// [`ROUND_LIMIT`].
async fn time_installs(
    client: &p2p::Client,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    version: u64,
    workers: usize,
    t0: Instant,
) -> anyhow::Result<(Option<f64>, f64)> {
    let mut t_q = None;
    loop {
        anyhow::ensure!(
            t0.elapsed() < ROUND_LIMIT,
            "not every worker installed within {ROUND_LIMIT:?}"
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
        if installs.len() >= workers && installs.iter().all(|v| v.is_some_and(|v| v >= version)) {
            // The last install; unknown when any install time is.
            let last = timed.iter().map(|(_, t)| *t).collect::<Option<Vec<_>>>();
            return Ok((
                t_q,
                since(last.and_then(|t| t.into_iter().max())).as_secs_f64(),
            ));
        }
        // Install reports arrive as heartbeats: wait for the next change of the peer view
        // (or a second, to check the limit).
        let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    }
}

/// Where a round's payload comes from: fresh random bytes, or the next synthetic bf16 version.
struct RoundSource {
    bytes: usize,
    synthetic: Option<SyntheticVersions>,
}

impl RoundSource {
    /// The payload to publish as `version`, its kind, the full payload's bytes and the
    /// fraction of values changed (synthetic versions after the first). Off the async
    /// workers: making and encoding 64 MB takes a while.
    async fn next(
        &mut self,
        version: u64,
    ) -> anyhow::Result<(bytes::Bytes, storage::PayloadKind, usize, Option<f64>)> {
        let bytes = self.bytes;
        let Some(v) = self.synthetic.take() else {
            let payload = tokio::task::spawn_blocking(move || {
                let mut p = vec![0u8; bytes];
                rand::thread_rng().fill_bytes(&mut p);
                p
            })
            .await?;
            return Ok((payload.into(), storage::PayloadKind::Full, bytes, None));
        };
        let (v, payload, kind, changed) =
            tokio::task::spawn_blocking(move || v.next(version, bytes)).await?;
        let full_bytes = v.full.len();
        self.synthetic = Some(v);
        Ok((payload, kind, full_bytes, changed))
    }
}

/// The synthetic bf16 versions of a delta benchmark: the full payload published last and the
/// learner's keyframe-or-delta choice.
struct SyntheticVersions {
    /// Percentage of values changed per version.
    pct: f64,
    full: bytes::Bytes,
    deltas: DeltaPublisher,
}

impl SyntheticVersions {
    /// The next version's payload to publish (a keyframe or a delta), its kind, and the
    /// fraction of values that changed (`None` for the first). CPU-bound.
    fn next(
        mut self,
        version: u64,
        bytes: usize,
    ) -> (Self, bytes::Bytes, storage::PayloadKind, Option<f64>) {
        let mut rng = rand::thread_rng();
        let (full, changed) = if self.full.is_empty() {
            (synthetic_bf16(bytes, &mut rng), None)
        } else {
            let mut full = self.full.to_vec();
            let frac = perturb_bf16(&mut full, self.pct / 100.0, &mut rng)
                .expect("the benchmark's own payload is bf16 safetensors");
            (full, Some(frac))
        };
        let full = bytes::Bytes::from(full);
        let (payload, kind, _root) = self.deltas.prepare(version, &full);
        self.deltas.published(version, full.clone(), kind);
        self.full = full;
        (self, payload, kind, changed)
    }
}

/// Elements per tensor of a synthetic payload: 4 Mi bf16 values (8 MiB), the size of a small
/// model's projection matrix, so the delta's per-tensor encoding choice is exercised.
const SYNTHETIC_TENSOR_NUMEL: usize = 1 << 22;

/// A bf16 safetensors payload of about `bytes` bytes (tensors `t00000`, `t00001`, … of at most
/// [`SYNTHETIC_TENSOR_NUMEL`] values): weight-like values, uniform in ±0.05.
fn synthetic_bf16(bytes: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut numel = (bytes / 2).max(1);
    let mut header = serde_json::Map::new();
    let (mut offset, mut i) = (0usize, 0usize);
    while numel > 0 {
        let n = numel.min(SYNTHETIC_TENSOR_NUMEL);
        header.insert(
            format!("t{i:05}"),
            serde_json::json!({"dtype": "BF16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}),
        );
        (offset, numel, i) = (offset + 2 * n, numel - n, i + 1);
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    // The data starts 8-aligned (the safetensors convention; spaces are valid JSON padding).
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for _ in 0..offset / 2 {
        let x: f32 = rng.gen_range(-0.05..0.05);
        out.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

/// Changes each bf16 value of a [`synthetic_bf16`] payload with probability `p`, by one unit
/// in the last place up or down at random (what a small optimiser step does to the values it
/// moves at all: the step's sign is the gradient's, not the value's); returns the fraction
/// changed. `None` if `payload` is not one.
fn perturb_bf16(payload: &mut [u8], p: f64, rng: &mut impl Rng) -> Option<f64> {
    let header = usize::try_from(u64::from_le_bytes(payload.get(..8)?.try_into().ok()?)).ok()?;
    let data = payload.get_mut(8usize.checked_add(header)?..)?;
    let p = p.clamp(0.0, 1.0);
    let mut changed = 0usize;
    for v in data.chunks_exact_mut(2) {
        if rng.gen_bool(p) {
            // One unit in the last place (the bits of a finite bf16 value of this payload's
            // magnitude never reach infinity or cross zero).
            let bits = u16::from_le_bytes([v[0], v[1]]);
            let bits = if rng.gen() {
                bits.wrapping_add(1)
            } else {
                bits.wrapping_sub(1)
            };
            v.copy_from_slice(&bits.to_le_bytes());
            changed += 1;
        }
    }
    Some(changed as f64 / (data.len() / 2).max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The synthetic versions are what the delta codec takes (bf16 safetensors, one header),
    /// a perturbed version changes about the asked fraction, and the delta round-trips.
    #[test]
    fn synthetic_versions_delta_code_at_the_asked_fraction() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = synthetic_bf16(3 * SYNTHETIC_TENSOR_NUMEL + 1000, &mut rng);
        let mut new = base.clone();
        let frac = perturb_bf16(&mut new, 0.01, &mut rng).unwrap();
        assert!((0.008..0.012).contains(&frac), "changed {frac}");
        let d = policy::delta::encode(&base, &new).unwrap();
        assert!(
            d.len() * 20 < new.len(),
            "delta {} of {}",
            d.len(),
            new.len()
        );
        assert_eq!(policy::delta::apply(&base, &d).unwrap(), new);
    }

    /// The publisher's rounds: a keyframe, then deltas whose reconstruction is the next full
    /// payload; a dense one-ulp change is still a delta.
    #[test]
    fn synthetic_rounds_are_a_keyframe_then_deltas() {
        let bytes = 2 * SYNTHETIC_TENSOR_NUMEL;
        let mut v = SyntheticVersions {
            pct: 1.0,
            full: bytes::Bytes::new(),
            deltas: DeltaPublisher::new(u64::MAX),
        };
        let (v1, p1, k1, c1) = v.next(1, bytes);
        assert_eq!((k1, c1), (storage::PayloadKind::Full, None));
        assert_eq!(p1, v1.full);
        let (v2, p2, k2, _) = v1.next(2, bytes);
        assert!(matches!(
            k2,
            storage::PayloadKind::Delta {
                base_version: 1,
                ..
            }
        ));
        assert_eq!(policy::delta::apply(&p1, &p2).unwrap(), v2.full.to_vec());
        v = v2;
        // Every value one ulp up or down: the differences compress (about a bit a value), so
        // even that is a delta, a fraction of the payload.
        v.pct = 100.0;
        let (v3, p3, k3, c3) = v.next(3, bytes);
        assert!(matches!(k3, storage::PayloadKind::Delta { .. }), "{k3:?}");
        assert_eq!(c3, Some(1.0));
        assert!(p3.len() * 4 < v3.full.len(), "{} B", p3.len());
    }
}
