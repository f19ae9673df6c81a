//! What `/metrics` serves, by Prometheus's conventions (the `prometheus` client libraries'
//! "Metric and label naming" and exposition-format docs): every series the node's crates
//! record has a HELP text and its type here ([`SERIES`]); counters are counters named
//! `_total`, cumulative seconds `_seconds_total` ([`set_seconds_total`]: the `metrics` crate's
//! counters are integers), times are histograms with [`TIME_BUCKETS`]; every counter is
//! exported at 0 from the start ([`describe`]), so a dashboard panel shows 0, not "No data";
//! and the whole response is the text format 0.0.4 its content type names (libp2p's
//! OpenMetrics output is converted: [`openmetrics_to_text`]).
//!
//! Owns: the catalogue and the exposition. Must not touch: when a series changes (its
//! recorder's call site does that).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;

/// A series' Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Which label sets of a counter are exported at 0 before their first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zero {
    /// The series without labels.
    Plain,
    /// One series per value of this label (a closed set).
    Each(&'static str, &'static [&'static str]),
    /// Labels from an open set (or set at start by their recorder): none.
    Never,
}

/// One series the node exports.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub zero: Zero,
}

const fn counter(name: &'static str, help: &'static str) -> Series {
    Series {
        name,
        kind: Kind::Counter,
        help,
        zero: Zero::Plain,
    }
}

const fn labelled(name: &'static str, help: &'static str, zero: Zero) -> Series {
    Series {
        name,
        kind: Kind::Counter,
        help,
        zero,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Series {
    Series {
        name,
        kind: Kind::Gauge,
        help,
        zero: Zero::Never,
    }
}

const fn histogram(name: &'static str, help: &'static str) -> Series {
    Series {
        name,
        kind: Kind::Histogram,
        help,
        zero: Zero::Never,
    }
}

/// Bucket bounds (seconds) of every time histogram: 5 ms to 10 min.
pub const TIME_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0,
];

/// Cumulative seconds, exported as counters ([`set_seconds_total`]).
pub const SECONDS_TOTALS: [(&str, &str); 2] = [
    (
        "learner_idle_seconds_total",
        "Seconds the learner's training thread waited for groups since start (T_idle).",
    ),
    (
        "learner_train_seconds_total",
        "Seconds the learner spent in training steps since start (T_train summed).",
    ),
];

/// Every series the node's crates record through the `metrics` macros.
pub const SERIES: &[Series] = &[
    // p2p
    counter("p2p_bans_total", "Peers banned for the run."),
    labelled("p2p_strikes_total", "Strikes counted against peers by reason (a ban follows enough of them).", Zero::Never),
    counter("p2p_connection_errors_total", "Connections that failed (dial errors, failed handshakes: a wrong swarm key shows here)."),
    counter("p2p_connections_denied_total", "Connections refused by a gate (limits, bans, allow list)."),
    counter("p2p_heartbeats_sent_total", "Heartbeats this node gossiped."),
    counter("p2p_heartbeats_received_total", "Heartbeats received from peers and accepted."),
    counter("p2p_heartbeats_ignored_total", "Heartbeats ignored by the per-peer rate limit."),
    counter("p2p_messages_rejected_total", "Gossip messages rejected by validation."),
    labelled("p2p_holepunch_total", "Hole-punching attempts (DCUtR) by result.", Zero::Each("result", &["ok", "failed"])),
    gauge("p2p_banned_peers", "Peers banned now."),
    gauge("p2p_connected_peers", "Peers connected now."),
    gauge("p2p_known_peers", "Peers known (connected or not)."),
    gauge("p2p_heartbeat_interval_seconds", "The heartbeat interval in force (it adapts to the swarm's size)."),
    gauge("p2p_relay_circuits", "Relay circuits this node serves now (relay role)."),
    gauge("p2p_relay_reservations", "Relay reservations this node holds for others now (relay role)."),
    // dissemination
    counter("dissemination_installs_total", "Snapshot versions installed."),
    counter("dissemination_chunk_verification_failures_total", "Chunks whose BLAKE3 did not match the signed manifest."),
    counter("dissemination_replays_refused_total", "Learner-signed messages refused as older than the replay marks."),
    labelled("dissemination_streams_refused_total", "Chunk streams refused (too many open) by kind.", Zero::Each("kind", &["push", "fetch"])),
    counter("dissemination_pushed_bytes_total", "Chunk bytes pushed to children."),
    counter("dissemination_push_received_bytes_total", "Chunk bytes received by pushes."),
    counter("dissemination_fetched_bytes_total", "Chunk bytes fetched (repairs)."),
    counter("dissemination_served_bytes_total", "Chunk bytes served to fetching peers."),
    counter("dissemination_duplicate_bytes_total", "Chunk bytes received that were already held."),
    counter("dissemination_fetches_declined_total", "Chunk fetches declined while busy forwarding."),
    counter("dissemination_catch_ups_served_total", "Manifest requests answered for an older version (catch-ups)."),
    counter("dissemination_plans_announced_total", "Chain plans the learner announced."),
    counter("dissemination_push_open_retries_total", "Pushes whose chunk stream was opened again after a failure."),
    counter("dissemination_push_sessions_reused_total", "Pushes over a kept chunk stream."),
    counter("dissemination_push_sessions_stale_total", "Kept chunk streams found closed at the next push."),
    counter("dissemination_push_sessions_ended_idle_total", "Kept chunk streams closed by this child after an idle time."),
    counter("dissemination_push_sessions_warmed_total", "Chunk streams warmed up with filler before the first version."),
    counter("dissemination_warm_up_bytes_total", "Filler bytes sent to warm up chunk streams."),
    // pull
    counter("pull_groups_served_total", "Groups a worker served to the learner's pulls."),
    counter("pull_groups_stored_total", "Pulled groups the learner stored in its buffer."),
    labelled("pull_groups_rejected_total", "Pulled groups the learner refused, by reason.", Zero::Never),
    counter("pull_oversized_answers_total", "Pull answers over the size limit (refused)."),
    counter("pull_oversized_leases_total", "Leases cut to the answer size limit."),
    labelled("pull_peer_faults_total", "Pull exchanges that failed by the peer's fault, by reason.", Zero::Never),
    // node
    labelled("node_trajectory_groups_total", "The trajectory store's accounting by outcome (produced = consumed + discarded_stale + rejected_stored + pending).", Zero::Never),
    counter("node_catch_ups_total", "Catch-ups of a delta chain this worker made."),
    counter("node_catch_up_bytes_total", "Bytes fetched by catch-ups."),
    counter("node_snapshots_refused_total", "Snapshots refused at install (another model, a bad payload)."),
    counter("node_adapter_versions_refused_total", "Adapter versions refused at install (another base)."),
    gauge("node_installed_snapshot_version", "The snapshot version installed."),
    gauge("node_pending_groups", "Groups stored and not yet consumed (a worker's outbox, the learner's buffer)."),
    // rollout
    counter("rollout_groups_total", "Groups this worker generated since start."),
    gauge("rollout_mu_groups_per_s", "This worker's generation rate μ (groups/s)."),
    // learner
    counter("learner_snapshots_published_total", "Snapshot versions the learner published."),
    counter("learner_snapshot_deltas_total", "Versions published as deltas."),
    counter("learner_snapshot_keyframes_total", "Versions published as keyframes (deltas on)."),
    labelled("learner_groups_trained_total", "Groups trained, by producer.", Zero::Never),
    labelled("learner_groups_trained_by_staleness_total", "Groups trained by observed staleness Δ = v − v_τ.", Zero::Never),
    counter("learner_groups_dropped_stale_total", "Groups dropped for falling out of the staleness window."),
    counter("learner_groups_dropped_zero_advantage_total", "Groups dropped with zero advantage (every reward equal)."),
    counter("learner_groups_dropped_banned_total", "Pulled groups of banned producers dropped untrained."),
    counter("learner_groups_rejected_total", "Pulled groups refused by the verification pipeline."),
    counter("learner_groups_rejected_after_ban_total", "Buffered groups of a worker removed when it was banned."),
    counter("learner_groups_quarantined_total", "Groups quarantined (kept on disk, never trained)."),
    counter("learner_groups_withheld_total", "Committed group numbers withheld, uncommitted or mismatched (struck)."),
    counter("learner_groups_abandoned_total", "Committed group numbers whose episode failed in the environment program (not struck)."),
    counter("learner_backlog_capped_total", "Pulls where a claimed backlog met the share cap."),
    counter("learner_pulls_hedged_total", "Pulls that outlasted the hedge delay."),
    counter("learner_seq_skipped_total", "Group numbers workers skipped for good."),
    labelled("learner_spot_checks_total", "Log-prob spot checks by result.", Zero::Never),
    gauge("learner_version", "The learner's version v (optimiser steps)."),
    gauge("learner_published_version", "The newest published snapshot version."),
    gauge("learner_bubble_ratio", "T_idle / (T_idle + T_train) since start."),
    gauge("learner_staleness_max", "Largest staleness Δ trained on."),
    gauge("learner_reward_mean", "Mean reward of the last step's groups (label basis: recomputed or reported)."),
    gauge("learner_reward_std", "Standard deviation of the last step's rewards."),
    gauge("learner_reward_checked_mean", "Mean reward of the recent fully verified groups."),
    gauge("learner_loss", "The last step's loss."),
    gauge("learner_grad_norm", "The last step's gradient norm before clipping."),
    gauge("learner_clip_fraction", "Fraction of tokens clipped in the last step."),
    gauge("learner_kl_sampler_learner", "KL between the samplers' and the learner's log-probs in the last step."),
    gauge("learner_importance_weight_variance", "Variance of the importance weights in the last step."),
    gauge("learner_snapshot_bytes", "Bytes of the newest published payload."),
    gauge("learner_snapshot_delta_ratio", "Delta bytes / full bytes of the newest delta."),
    gauge("learner_adapter_changed_fraction", "Fraction of adapter weights changed in the newest adapter version."),
    histogram("learner_t_train_seconds", "Time of one training step (T_train)."),
    histogram("learner_t_bcast_seconds", "Time from publishing a version to 1/γ of the active workers installing it (T_bcast)."),
    histogram("learner_pull_seconds", "Round trip of one pull from a worker."),
];

/// Describes every series (HELP and type) to the installed `metrics` recorder, exports every
/// counter at 0 ([`Zero`]) and registers every histogram. Call once the recorder is installed.
pub fn describe() {
    for s in SERIES {
        match s.kind {
            Kind::Counter => {
                metrics::describe_counter!(s.name, s.help);
                match s.zero {
                    Zero::Plain => metrics::counter!(s.name).increment(0),
                    Zero::Each(label, values) => {
                        for v in values {
                            metrics::counter!(s.name, label => *v).increment(0);
                        }
                    }
                    Zero::Never => {}
                }
            }
            Kind::Gauge => metrics::describe_gauge!(s.name, s.help),
            Kind::Histogram => {
                metrics::describe_histogram!(s.name, s.help);
                // Registered now: its buckets are exported (empty) before the first time.
                let _ = metrics::histogram!(s.name);
            }
        }
    }
    for (name, _) in SECONDS_TOTALS {
        set_seconds_total(name, 0.0);
    }
}

/// The cumulative-seconds counters, by name.
static SECONDS: Mutex<BTreeMap<&'static str, f64>> = Mutex::new(BTreeMap::new());

/// Sets a cumulative-seconds counter (one of [`SECONDS_TOTALS`]) to `total` (never lowers it:
/// a counter only grows).
pub fn set_seconds_total(name: &'static str, total: f64) {
    let mut m = SECONDS.lock().unwrap_or_else(|p| p.into_inner());
    let v = m.entry(name).or_insert(0.0);
    if total.is_finite() && total > *v {
        *v = total;
    }
}

/// The cumulative-seconds counters in the text format.
pub fn render_seconds_totals() -> String {
    let m = SECONDS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::new();
    for (name, help) in SECONDS_TOTALS {
        if let Some(v) = m.get(name) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
    }
    out
}

/// Converts `prometheus-client`'s OpenMetrics text into the text format 0.0.4: no `# UNIT`
/// and `# EOF` lines; a counter family is named as its samples are (`…_total`), an `info`
/// family becomes the gauge its `…_info` samples are, `unknown` becomes `untyped`; `_created`
/// samples go. Pure.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut kinds: HashMap<&str, &str> = HashMap::new();
    for line in om.lines() {
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) {
            kinds.insert(name, kind.trim());
        }
    }
    let renamed = |name: &str| -> String {
        match kinds.get(name).copied() {
            Some("counter") if !name.ends_with("_total") => format!("{name}_total"),
            Some("info") => format!("{name}_info"),
            _ => name.to_string(),
        }
    };
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.trim() == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) {
            let kind = match kind.trim() {
                "info" => "gauge",
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" => "histogram",
                "summary" => "summary",
                _ => "untyped",
            };
            let _ = writeln!(out, "# TYPE {} {kind}", renamed(name));
        } else if let Some((name, help)) =
            line.strip_prefix("# HELP ").and_then(|r| r.split_once(' '))
        {
            let _ = writeln!(out, "# HELP {} {help}", renamed(name));
        } else if line.starts_with('#') || line.trim().is_empty() {
            continue;
        } else {
            let sample = line.split(['{', ' ']).next().unwrap_or("");
            let created = sample
                .strip_suffix("_created")
                .is_some_and(|f| kinds.get(f) == Some(&"counter"));
            if !created {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_counters_units_and_eof_become_text_format() {
        let om = "# HELP libp2p_bandwidth_bytes Bandwidth usage.\n\
                  # TYPE libp2p_bandwidth_bytes counter\n\
                  # UNIT libp2p_bandwidth_bytes bytes\n\
                  libp2p_bandwidth_bytes_total{direction=\"in\"} 7\n\
                  libp2p_bandwidth_bytes_created 1.0\n\
                  # HELP libp2p_ping_rtt_seconds Ping round trip.\n\
                  # TYPE libp2p_ping_rtt_seconds histogram\n\
                  libp2p_ping_rtt_seconds_bucket{le=\"+Inf\"} 1\n\
                  libp2p_ping_rtt_seconds_sum 0.1\n\
                  libp2p_ping_rtt_seconds_count 1\n\
                  # TYPE libp2p_build info\n\
                  libp2p_build_info{version=\"1\"} 1\n\
                  # EOF\n";
        let text = openmetrics_to_text(om);
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
        assert!(
            text.contains("# HELP libp2p_bandwidth_bytes_total Bandwidth usage."),
            "{text}"
        );
        assert!(text.contains("# TYPE libp2p_bandwidth_bytes_total counter\nlibp2p_bandwidth_bytes_total{direction=\"in\"} 7\n"), "{text}");
        assert!(!text.contains("_created"), "{text}");
        assert!(
            text.contains(
                "# TYPE libp2p_ping_rtt_seconds histogram\nlibp2p_ping_rtt_seconds_bucket"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE libp2p_build_info gauge\nlibp2p_build_info{"),
            "{text}"
        );
    }

    #[test]
    fn every_series_is_named_by_the_conventions() {
        let mut seen = std::collections::HashSet::new();
        for s in SERIES {
            assert!(seen.insert(s.name), "{} twice", s.name);
            assert!(!s.help.is_empty(), "{}", s.name);
            match s.kind {
                Kind::Counter => assert!(s.name.ends_with("_total"), "counter {}", s.name),
                Kind::Gauge | Kind::Histogram => {
                    assert!(!s.name.ends_with("_total"), "{} is not a counter", s.name)
                }
            }
        }
        for (name, _) in SECONDS_TOTALS {
            assert!(name.ends_with("_seconds_total"), "{name}");
        }
    }

    #[test]
    fn seconds_totals_only_grow() {
        set_seconds_total("learner_idle_seconds_total", 2.5);
        set_seconds_total("learner_idle_seconds_total", 1.0);
        let text = render_seconds_totals();
        assert!(
            text.contains(
                "# TYPE learner_idle_seconds_total counter\nlearner_idle_seconds_total 2.5\n"
            ),
            "{text}"
        );
    }
}
