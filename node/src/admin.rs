//! The admin endpoint (loopback only): `GET /` — a self-contained HTML page that polls
//! `/status` (`node/assets/admin.html`) — `GET /status` — the node's view of the swarm as JSON
//! ([`crate::api::NodeStatus`]) — and `GET /metrics` — Prometheus text format 0.0.4 with the
//! project's `metrics`-crate series followed by libp2p's own `prometheus-client` registry
//! (converted from OpenMetrics), in one response (`crate::telemetry`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::api::{NodeStatus, RoleSection};

/// What the handlers need.
#[derive(Clone)]
pub struct AdminState {
    pub client: p2p::Client,
    pub registry: Arc<p2p::Registry>,
    pub prometheus: Option<PrometheusHandle>,
    pub node_version: &'static str,
    /// The role's section (`learner` / `rollout`) of the status object.
    pub role_view: crate::roles::RoleView,
}

/// Installs the global `metrics` recorder (once per process) and returns its render handle:
/// the time series are histograms ([`crate::telemetry::TIME_BUCKETS`]), every series is
/// described and every counter exported at 0 ([`crate::telemetry::describe`]).
pub fn install_metrics_recorder() -> Option<PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut builder = PrometheusBuilder::new();
    for s in crate::telemetry::SERIES {
        if s.kind == crate::telemetry::Kind::Histogram {
            builder = match builder.set_buckets_for_metric(
                Matcher::Full(s.name.into()),
                &crate::telemetry::TIME_BUCKETS,
            ) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, series = s.name, "histogram buckets");
                    return None;
                }
            };
        }
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    match metrics::set_global_recorder(recorder) {
        Ok(()) => {
            crate::telemetry::describe();
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "a metrics recorder is already installed; /metrics shows libp2p series only");
            None
        }
    }
}

/// The status object: the network service's view plus the role's section.
pub fn node_status(
    network: p2p::NetworkStatus,
    node_version: &str,
    role: Option<RoleSection>,
) -> NodeStatus {
    let mut st = NodeStatus {
        version: network.local.installed_version,
        node_version: node_version.to_string(),
        network,
        learner: None,
        rollout: None,
        bench: None,
        forwarding: None,
    };
    match role {
        Some(RoleSection::Learner(l)) => st.learner = Some(*l),
        Some(RoleSection::Rollout(r)) => st.rollout = Some(r),
        Some(RoleSection::Bench(b)) => st.bench = Some(b),
        None => {}
    }
    st
}

/// The admin page: one HTML file with inline CSS and JS, no external asset.
const ADMIN_PAGE: &str = include_str!("../assets/admin.html");

async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        ADMIN_PAGE,
    )
        .into_response()
}

async fn status(State(s): State<AdminState>) -> Response {
    match s.client.status().await {
        Ok(mut net) => {
            let chains = s.role_view.chains();
            crate::api::fill_chain_positions(&mut net.peers, chains.as_deref());
            let version = net.local.installed_version;
            crate::api::fill_install_lag(&mut net.peers, version);
            let mut st = node_status(net, s.node_version, s.role_view.get());
            st.forwarding = s.role_view.forwarding();
            axum::Json(st).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("network service unavailable: {e}\n"),
        )
            .into_response(),
    }
}

async fn metrics_text(State(s): State<AdminState>) -> Response {
    let mut out = s
        .prometheus
        .as_ref()
        .map(|h| h.render())
        .unwrap_or_default();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&crate::telemetry::render_seconds_totals());
    let mut libp2p = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut libp2p, &s.registry) {
        tracing::warn!(error = %e, "encoding libp2p metrics");
    }
    // prometheus-client writes OpenMetrics; the response is the text format it says it is.
    out.push_str(&crate::telemetry::openmetrics_to_text(&libp2p));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// Binds `addr` (must be loopback) and serves, as a task of `tasks`, until they are stopped.
/// Returns the bound address (useful with port 0).
/// [`serve`] at the config's `network.admin`, and the node's address file written once the
/// node listens (`crate::addr_file`); what `run` and the relay start beside their roles.
pub async fn serve_node(
    config: &crate::config::NodeConfig,
    peer_id: String,
    state: AdminState,
    tasks: &crate::roles::Tasks,
) -> anyhow::Result<()> {
    let addr: SocketAddr = config
        .network
        .admin
        .parse()
        .with_context(|| format!("network.admin `{}`", config.network.admin))?;
    let client = state.client.clone();
    let bound = serve(addr, state, tasks).await?;
    tracing::info!(admin = %bound, "admin endpoint: /, /status, /metrics");
    tasks.spawn(crate::addr_file::write_when_listening(
        client,
        config.data_dir.clone(),
        peer_id,
        bound,
    ));
    Ok(())
}

pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    tasks: &crate::roles::Tasks,
) -> anyhow::Result<SocketAddr> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "admin endpoint {addr} must be a loopback address"
    );
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("binding the admin endpoint {addr} (is another node using this port?)")
    })?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(page))
        .route("/status", get(status))
        .route("/metrics", get(metrics_text))
        .with_state(state);
    tasks.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
    Ok(bound)
}
