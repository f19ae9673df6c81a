//! `echo-node run --config FILE`: load and validate the config, open the stores, serve until
//! Ctrl-C / SIGTERM, then shut down cleanly.

use std::sync::Arc;

use anyhow::Context;

use crate::admin;
use crate::cli::RunArgs;
use crate::config::{NodeConfig, Role};
use crate::roles::{self, Probe, RoleView, VersionChanges};
use crate::state::{
    dissemination_config, load_config, open_state, service_config, NodeState, NODE_VERSION,
};

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = load_config(&args)?;
    // Before anything is created (data dir, key, stores): ports another process holds.
    probe_ports(&config)?;
    if config.role == Role::Relay {
        // No model, no stores: a relay runs only the network service and the admin endpoint.
        return roles::relay::run(config);
    }
    // Before `open_state`: its stores start sled's threads, and the heap setting binds only
    // threads that start after it.
    keep_freed_memory(&config);
    let state = open_state(config)?;
    let counters = state.trajectories.counters()?;
    let inv = state.trajectories.check_invariant()?;
    if !inv.holds() {
        tracing::error!(?inv, "trajectory accounting invariant does not hold");
    }
    tracing::info!(
        role = %state.config.role,
        swarm = %state.config.swarm_id,
        peer_id = %state.peer_id,
        public_key = %state.key.public_hex(),
        data_dir = %state.config.data_dir.display(),
        pending = counters.pending(),
        produced = counters.produced,
        snapshots = state.chunks.versions()?.len(),
        "node started"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let state = Arc::new(state);
    let bench = Bench::from_args(&args);
    let result = runtime.block_on(serve(state.clone(), bench));
    // A warm start still running on a blocking thread must not hold the exit forever.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    result?;
    drop(state);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Binds the listen addresses and the admin address once and lets them go: one that another
/// process listens on is refused with the operator guide's `listening on …` error (the swarm
/// itself listens with `SO_REUSEPORT`, which would let a second node start beside the first:
/// [`p2p::probe_listen_addrs`]).
pub(crate) fn probe_ports(config: &NodeConfig) -> anyhow::Result<()> {
    p2p::probe_listen_addrs(&config.network.listen)?;
    // Validated, so it parses; port 0 binds any free port.
    if let Ok(sa) = config.network.admin.parse::<std::net::SocketAddr>() {
        if sa.port() != 0 {
            std::net::TcpListener::bind(sa).map_err(|e| {
                anyhow::anyhow!(
                    "the admin endpoint: listening on {sa}: {}",
                    p2p::transport::bind_failure(&e)
                )
            })?;
        }
    }
    Ok(())
}

/// A learner that trains on the CPU keeps freed memory in its heap (`learner::heap`; the
/// config's `learner.keep_freed_memory`). `auto` counts as the CPU only in a build without
/// CUDA: a CUDA build's `auto` learner is on the GPU whenever one answers, where the setting
/// would only cost host memory.
fn keep_freed_memory(config: &NodeConfig) {
    use learner::heap::HeapSetting;
    use policy::DeviceChoice;
    let on_cpu = match config.model.device {
        DeviceChoice::Cpu => true,
        DeviceChoice::Auto => !policy::device::cuda_compiled(),
        DeviceChoice::Cuda(_) => false,
    };
    if config.role != Role::Learner || !config.learner.keep_freed_memory || !on_cpu {
        return;
    }
    match learner::heap::keep_freed_memory() {
        HeapSetting::Kept => tracing::info!("training on the CPU: freed memory stays in the heap"),
        HeapSetting::KeptLate { threads } => tracing::warn!(
            threads,
            "freed memory stays in the heap, but {threads} threads had started: theirs may not"
        ),
        HeapSetting::Refused { option } => {
            tracing::warn!(
                option,
                "the allocator refused a heap setting (the ones after it were not made)"
            )
        }
        HeapSetting::Unsupported => {
            tracing::debug!("keep_freed_memory: not a glibc build, the heap is left as it is")
        }
    }
}

/// The dissemination engine's test fault for the attacks carried out on snapshots (none for
/// an honest node; `crate::misbehave`).
#[cfg(feature = "adversary")]
fn dissemination_fault(m: &crate::misbehave::Misbehaviour) -> Option<dissemination::Fault> {
    use crate::misbehave::{Attack, SILENT_AFTER_INSTALLS};
    use dissemination::Fault;
    [
        (Attack::CorruptChunks, Fault::CorruptOutgoing),
        (Attack::SilentForwarder, Fault::SilentForwarder),
        (
            Attack::SilentAfterHonest,
            Fault::SilentAfterInstalls(SILENT_AFTER_INSTALLS),
        ),
        (Attack::SlowForwarder, Fault::SlowForwarder),
        (Attack::OverfeedParent, Fault::Overfeed),
    ]
    .into_iter()
    .find(|(a, _)| m.has(*a))
    .map(|(_, f)| f)
}

/// Runs the network service and the admin endpoint until Ctrl-C / SIGTERM.
async fn serve(state: Arc<NodeState>, bench: Bench) -> anyhow::Result<()> {
    let config = &state.config;
    let prometheus = admin::install_metrics_recorder();
    let mut registry = p2p::Registry::default();
    let svc = service_config(config, state.key.seed())?;
    let svc_learner = svc.learner;
    let (client, events, service) =
        p2p::start(state.key.seed(), svc, &mut registry).context("starting the network service")?;
    // Bans survive a restart: those of the previous run go back to the service first, and
    // every new one is written down (`crate::admission`).
    let ban_file = crate::admission::open_ban_file(&config.data_dir)?;
    crate::admission::restore_bans(&client, &ban_file, crate::offences::label_named).await;
    // A worker's admission credential (ticket, proof of work), gossiped in its heartbeats.
    let credential = admission_credential(&state).await?;
    // Test-only: a `replay_after_restart` node records the signed gossip it sees.
    let (events, replay_recorder) = roles::attacks::tap(&state.misbehave, events);
    let view = RoleView::default();
    // The node's own tasks (admin endpoint, address file, ban recorder, heartbeat feeder):
    // stopped and awaited at shutdown.
    let tasks = roles::Tasks::default();
    serve_admin(
        &state,
        &client,
        (registry, prometheus),
        &view,
        ban_file,
        &tasks,
    )
    .await?;

    let (dissem, installs) = start_dissemination(&state, &client, &view)?;
    // The role: the learner trains and publishes; a worker installs snapshots, generates and
    // serves pulls. Both need the swarm's learner key (the dissemination engine).
    // A signal during the role's start-up (model build, warm start) still stops cleanly.
    let shutdown = roles::shutdown_signal();
    tokio::pin!(shutdown);
    let starting = start_role(
        &state,
        &client,
        dissem.clone(),
        installs,
        svc_learner,
        &bench,
        &view,
    );
    let (role, early) = tokio::select! {
        r = starting => (Some(r.context("starting the role")?), None),
        r = &mut shutdown => (None, Some(r)),
    };
    // Heartbeat fields: the role's version and μ (its probe), pending groups from the store.
    // Refreshed every heartbeat interval, and at once when the installed version changes:
    // the service then gossips the heartbeat immediately (the install report that ends T_bcast, `docs/broadcast.md`).
    let interval = std::time::Duration::from_millis(config.network.heartbeat_interval_ms);
    let probe = role
        .as_ref()
        .map_or_else(|| -> Probe { Arc::new(|| (None, 0.0)) }, RunningRole::probe);
    let changes = role
        .as_ref()
        .map_or(VersionChanges::Never, RunningRole::version_changes);
    // Test-only network attacks (`crate::misbehave`); none for an honest node.
    let attack_tasks = roles::Tasks::default();
    roles::attacks::spawn(
        &attack_tasks,
        &state,
        &client,
        probe.clone(),
        replay_recorder,
    );
    feed_heartbeats(
        &tasks,
        (client.clone(), state.clone(), dissem.clone()),
        probe,
        changes,
        credential,
        interval,
    );
    // Domain events: Snapshots / Plans gossip gets the dissemination engine's verdict (Reject:
    // bad signature or garbage; Ignore: an old version), departed forwarders are excised, late
    // joiners catch up (`dissemination::drive`). Without an engine (no learner key) such
    // gossip is left unjudged: Ignore, not forwarded, no penalty.
    let drain = match dissem.clone() {
        Some(d) => tokio::spawn(dissemination::drive(d, client.clone(), events)),
        None => tokio::spawn(roles::ignore_role_gossip(client.clone(), events)),
    };

    let mut service = service;
    let mut role = role;
    let result = match early {
        Some(r) => r,
        None => tokio::select! {
            r = &mut shutdown => r,
            r = &mut service => r.context("network service task failed").and_then(|_| anyhow::bail!("the network service stopped unexpectedly")),
            _ = async { match role.as_mut() { Some(r) => r.failed().await, None => std::future::pending().await } } => {
                Err(anyhow::anyhow!("the {} role stopped (see the log above)", config.role))
            }
        },
    };
    tracing::info!("shutting down");
    attack_tasks.stop().await;
    let role_result = match role {
        Some(r) => r.shutdown().await,
        None => Ok(()),
    };
    if let (Err(_), Err(e)) = (&result, &role_result) {
        tracing::error!(error = %format!("{e:#}"), "the role's own error");
    }
    client.shutdown().await;
    if !service.is_finished() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut service).await;
    }
    tasks.stop().await;
    crate::addr_file::remove(&config.data_dir);
    if let Some(d) = &dissem {
        d.shutdown();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), d.stopped()).await;
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(3), drain).await;
    result.and(role_result)
}

/// A worker's admission credential (its ticket, or proof of work computed off the async
/// workers); `None` for other roles or without one.
async fn admission_credential(state: &Arc<NodeState>) -> anyhow::Result<Option<String>> {
    if state.config.role != Role::Rollout {
        return Ok(None);
    }
    let (c, peer) = (state.config.clone(), state.peer_id.clone());
    tokio::task::spawn_blocking(move || crate::admission::credential(&c, &peer))
        .await
        .context("joining the admission credential")?
}

/// Starts the node's own tasks beside the role: the admin endpoint (`/`, `/status`,
/// `/metrics`, loopback only), the ban recorder, and the address file written once the node
/// listens.
async fn serve_admin(
    state: &Arc<NodeState>,
    client: &p2p::Client,
    (registry, prometheus): (
        p2p::Registry,
        Option<metrics_exporter_prometheus::PrometheusHandle>,
    ),
    view: &RoleView,
    ban_file: storage::bans::BanFile,
    tasks: &roles::Tasks,
) -> anyhow::Result<()> {
    admin::serve_node(
        &state.config,
        state.peer_id.clone(),
        admin::AdminState {
            client: client.clone(),
            registry: Arc::new(registry),
            prometheus,
            node_version: NODE_VERSION,
            role_view: view.clone(),
        },
        tasks,
    )
    .await?;
    tasks.spawn(crate::admission::record_bans(client.clone(), ban_file));
    Ok(())
}

/// The installs a dissemination engine delivers to a worker's role.
type Installs = tokio::sync::mpsc::UnboundedReceiver<dissemination::DisseminationEvent>;

/// Starts snapshot dissemination when the swarm's learner key is known (the learner itself,
/// or a worker configured with `learner_public_key`), and points the status view at its plan
/// (and, on the learner, its forwarding accounts).
fn start_dissemination(
    state: &Arc<NodeState>,
    client: &p2p::Client,
    view: &RoleView,
) -> anyhow::Result<(Option<dissemination::Disseminator>, Option<Installs>)> {
    let config = &state.config;
    let (dissem, installs) = match dissemination_config(config, &state.key)? {
        Some(dcfg) => {
            #[cfg(feature = "adversary")]
            let dcfg = dissemination::DisseminationConfig {
                fault: dissemination_fault(&state.misbehave),
                ..dcfg
            };
            let (d, rx) =
                dissemination::Disseminator::start(dcfg, client.clone(), state.chunks.clone())
                    .context("starting snapshot dissemination")?;
            (Some(d), Some(rx))
        }
        None => {
            tracing::warn!("no learner_public_key: snapshots and plans are not accepted");
            (None, None)
        }
    };
    // `status` peers carry their chain and position in the newest accepted plan.
    if let Some(d) = dissem.clone() {
        view.set_plan_source(roles::plan_source(d.clone()));
        if config.role == Role::Learner {
            view.set_forwarding_source(Arc::new(move || d.forwarding_view()));
        }
    }
    Ok((dissem, installs))
}

/// Keeps the node's heartbeat fields current: the role's version and μ (its probe), pending
/// groups from the store, the chain child's signed delivery receipts, the device and the
/// admission credential; every `interval`, and at once when the role's version changes (the
/// service then gossips the heartbeat immediately: the install report that ends T_bcast,
/// `docs/broadcast.md`).
fn feed_heartbeats(
    tasks: &roles::Tasks,
    (client, state, dissem): (
        p2p::Client,
        Arc<NodeState>,
        Option<dissemination::Disseminator>,
    ),
    probe: Probe,
    mut changes: VersionChanges,
    credential: Option<String>,
    interval: std::time::Duration,
) {
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        let mut signed: Vec<p2p::DeliveryReceipt> = Vec::new();
        // The external environment's pin (its files are read once).
        let env_pin = state.config.task.env_pin().map(p2p::EnvPin);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // A new version is reported at once, and the next refresh is a full
                // interval later.
                _ = changes.changed() => tick.reset(),
            }
            let (installed_version, mu) = probe();
            // A chain child's delivery receipts, signed with the node key (each signed
            // once: an unchanged receipt keeps its signature).
            let due_receipts = dissem.as_ref().map(|d| d.receipts()).unwrap_or_default();
            let due_receipts = roles::attacks::receipts_claim(&state.misbehave, due_receipts);
            signed = sign_receipts(due_receipts, signed, &state);
            // One read of the store's counters: the pending claim and the accounting series.
            let counters = state.trajectories.counters().ok();
            let pending = roles::attacks::pending_claim(
                &state.misbehave,
                counters.map_or(0, |c| c.pending()),
            );
            let local = p2p::LocalStatus {
                installed_version,
                mu: roles::attacks::mu_claim(&state.misbehave, mu),
                pending,
                availability: 1.0,
                device: Some(roles::attacks::device_claim(
                    &state.misbehave,
                    p2p::DeviceReport {
                        // What the learner judges a worker's numeric spread by.
                        dtype: (state.config.role == Role::Rollout).then(|| {
                            let d = state.config.rollout.dtype.report(&state.device);
                            d.to_string()
                        }),
                        // What the learner compares with the rule it checks tokens by.
                        sampling: (state.config.role == Role::Rollout).then(|| {
                            p2p::SamplingReport {
                                env_pin,
                                ..state.config.rollout.sampling_report()
                            }
                        }),
                        ..crate::state::device_report(&state.device)
                    },
                )),
                receipts: signed.clone(),
                admission: credential.clone(),
                ..Default::default()
            };
            metrics::gauge!("node_pending_groups").set(pending as f64);
            if let Some(c) = counters {
                export_accounting(&c);
            }
            if client.set_local_status(local).await.is_err() {
                break;
            }
        }
    });
}

/// The trajectory store's accounting on `/metrics`, refreshed every heartbeat: every group
/// stored (`produced`) ends as `consumed`, `discarded_stale`, `rejected_stored` or still
/// pending (`node_pending_groups`), and the invariant `produced = consumed + discarded_stale +
/// rejected_stored + pending` holds across restarts (`docs/storage.md`); `rejected_invalid`
/// and `duplicate` count groups refused before they were stored.
fn export_accounting(c: &storage::Counters) {
    for (outcome, n) in [
        ("produced", c.produced),
        ("consumed", c.consumed),
        ("discarded_stale", c.discarded_stale),
        ("rejected_stored", c.rejected_stored),
        ("rejected_invalid", c.rejected_invalid),
        ("duplicate", c.duplicates),
    ] {
        metrics::counter!("node_trajectory_groups_total", "outcome" => outcome).absolute(n);
    }
}

/// Starts the node's role: the benchmark publisher or sink when asked for, else the learner
/// (which installs nothing) or a rollout worker (which installs what the dissemination engine
/// delivers).
async fn start_role(
    state: &Arc<NodeState>,
    client: &p2p::Client,
    dissem: Option<dissemination::Disseminator>,
    installs: Option<Installs>,
    svc_learner: Option<p2p::PeerId>,
    bench: &Bench,
    view: &RoleView,
) -> anyhow::Result<RunningRole> {
    let config = &state.config;
    if let (Role::Learner, Some(d), Some(plan)) = (config.role, dissem.clone(), bench.publish) {
        drop(installs);
        let stop = tokio_util::sync::CancellationToken::new();
        let publish =
            roles::bench::run_publisher(state.clone(), client.clone(), d, plan, view.clone());
        let token = stop.clone();
        let task = tokio::spawn(async move { token.run_until_cancelled(publish).await });
        return Ok(RunningRole::BenchPublisher(Some(task), stop));
    }
    Ok(match (config.role, dissem) {
        (Role::Rollout, Some(_)) if bench.sink => {
            let (probe, changes, tasks) = roles::bench::sink(installs);
            RunningRole::BenchSink(probe, changes, tasks)
        }
        (Role::Learner, Some(d)) => {
            drop(installs); // a learner installs nothing
            RunningRole::Learner(
                roles::learner::start(state.clone(), client.clone(), d, view.clone()).await?,
            )
        }
        (Role::Rollout, d) => {
            let learner = svc_learner.context("a rollout node needs learner_public_key")?;
            RunningRole::Rollout(
                roles::rollout::start(
                    state.clone(),
                    client.clone(),
                    learner,
                    installs,
                    d,
                    view.clone(),
                )
                .await?,
            )
        }
        (Role::Learner, None) => {
            anyhow::bail!("the learner's dissemination engine did not start")
        }
        // Started by `roles::relay::run` before any store is opened; never reaches here.
        (Role::Relay, _) => anyhow::bail!("a relay node runs no role here"),
    })
}

/// `due`, signed with the node key; a receipt already signed in `before` with the same
/// content keeps that signature.
fn sign_receipts(
    due: Vec<p2p::DeliveryReceipt>,
    before: Vec<p2p::DeliveryReceipt>,
    state: &NodeState,
) -> Vec<p2p::DeliveryReceipt> {
    due.into_iter()
        .map(|r| {
            let again = before.iter().find(|b| {
                p2p::DeliveryReceipt {
                    sig: String::new(),
                    ..(*b).clone()
                } == r
            });
            match again {
                Some(b) => b.clone(),
                None => r.sign(state.key.seed(), &state.config.swarm_id),
            }
        })
        .collect()
}

/// The hidden benchmark flags of `run` (testnet `broadcast`).
struct Bench {
    publish: Option<roles::bench::BenchPlan>,
    sink: bool,
}

impl Bench {
    fn from_args(args: &RunArgs) -> Bench {
        Bench {
            publish: args
                .bench_broadcast_mb
                .map(|size_mb| roles::bench::BenchPlan {
                    size_mb,
                    workers: args.bench_workers,
                    rounds: args.bench_rounds,
                    delta_changed_pct: args.bench_delta_changed_pct,
                }),
            sink: args.bench_sink,
        }
    }
}

/// How often a worker checks that its generation thread is still alive.
const ENGINE_WATCH: std::time::Duration = std::time::Duration::from_millis(500);

/// The role a running node plays.
enum RunningRole {
    Learner(roles::learner::LearnerRole),
    Rollout(roles::rollout::RolloutRole),
    /// The benchmark publisher's task (`None` once it has ended) and its stop signal.
    BenchPublisher(
        Option<tokio::task::JoinHandle<Option<anyhow::Result<()>>>>,
        tokio_util::sync::CancellationToken,
    ),
    BenchSink(Probe, VersionChanges, roles::Tasks),
}

impl RunningRole {
    fn probe(&self) -> Probe {
        match self {
            RunningRole::Learner(l) => l.probe(),
            RunningRole::Rollout(r) => r.probe(),
            RunningRole::BenchPublisher(..) => Arc::new(|| (None, 0.0)),
            RunningRole::BenchSink(p, ..) => p.clone(),
        }
    }

    /// Where the probe's version changes come from (see [`VersionChanges`]).
    fn version_changes(&self) -> VersionChanges {
        match self {
            RunningRole::Learner(l) => l.version_changes(),
            RunningRole::Rollout(r) => r.version_changes(),
            RunningRole::BenchPublisher(..) => VersionChanges::Never,
            RunningRole::BenchSink(_, c, _) => c.clone(),
        }
    }

    /// Resolves if the role stops on its own (an error), which ends the node with a non-zero
    /// exit. A worker whose generation thread died (a storage error: disk full) must not stay
    /// up heartbeating its old μ and pending groups as if it still produced: the scheduler
    /// would keep counting it. Its engine is polled every [`ENGINE_WATCH`].
    async fn failed(&mut self) {
        match self {
            RunningRole::Learner(l) => l.failed().await,
            RunningRole::Rollout(r) => loop {
                if r.engine_stopped() {
                    tracing::error!(
                        "the rollout engine stopped generating; this worker exits instead of \
                         heartbeating a rate it no longer produces"
                    );
                    return;
                }
                tokio::time::sleep(ENGINE_WATCH).await;
            },
            RunningRole::BenchPublisher(task, _) => {
                let Some(t) = task.as_mut() else {
                    return std::future::pending().await;
                };
                let r = t.await;
                *task = None;
                match r {
                    Ok(Some(Ok(()))) => {
                        tracing::info!("bench: all rounds done");
                        std::future::pending().await
                    }
                    // Stopped: only shutdown cancels it.
                    Ok(None) => std::future::pending().await,
                    Ok(Some(Err(e))) => {
                        tracing::error!(error = %format!("{e:#}"), "bench failed")
                    }
                    Err(e) => tracing::error!(error = %e, "bench task failed"),
                }
            }
            RunningRole::BenchSink(..) => std::future::pending().await,
        }
    }

    async fn shutdown(self) -> anyhow::Result<()> {
        match self {
            RunningRole::Learner(l) => l.shutdown().await,
            RunningRole::Rollout(r) => r.shutdown().await,
            RunningRole::BenchPublisher(task, stop) => {
                stop.cancel();
                if let Some(t) = task {
                    let _ = t.await;
                }
                Ok(())
            }
            RunningRole::BenchSink(_, _, tasks) => {
                tasks.stop().await;
                Ok(())
            }
        }
    }
}
