//! The admin endpoint's page and the Grafana dashboard, against real `echo-node` processes on
//! 127.0.0.1: `GET /` serves the self-contained HTML page, and every metric the dashboard
//! (`docs/grafana/echo-swarm.json`) queries is exported on `/metrics` by a learner or a rollout
//! worker. Waits poll against a deadline; nodes are killed and reaped on drop (see `swarm.rs`).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::swarm::{http_get, Node, WAIT};

/// A learner that does not train, for the page test.
const IDLE_LEARNER: &str =
    "[storage]\nmax_pending_groups = 1\n[learner]\nwarm_start_steps = 0\nmax_steps = 1\n";

#[test]
fn the_admin_page_is_served_self_contained() {
    let tmp = tempfile::tempdir().unwrap();
    let mut node = Node::start_full(
        tmp.path(),
        "learner",
        "learner",
        "it-page",
        None,
        "",
        IDLE_LEARNER,
    );
    node.wait_ready();
    let reply = http_get(&node.admin, "/");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.content_type.starts_with("text/html"),
        "content-type {}",
        reply.content_type
    );
    let page = reply.body;
    assert!(page.contains("<title>echo-swarm node</title>"), "{page}");
    assert!(
        page.contains("fetch(\"/status\""),
        "the page does not poll /status"
    );
    // No external asset: no absolute URL at all (scripts, styles, fonts, images, links).
    for scheme in ["http://", "https://", "//cdn", "url("] {
        assert!(!page.contains(scheme), "the page references `{scheme}`");
    }
    for tag in ["<script src", "<link", "<img", "@import"] {
        assert!(!page.contains(tag), "the page loads an asset with `{tag}`");
    }
}

/// Issue 49 (5): `/metrics` is a valid text-format 0.0.4 exposition, as its content type says,
/// read by a real parser (`prometheus-parse`): every sample is of a declared type and has a
/// HELP text; counters are counters (`_total`), times are histograms, cumulative seconds are
/// `_seconds_total` counters, and counters are there at 0 before their first event.
#[test]
fn the_metrics_exposition_parses_with_the_conventional_types() {
    use prometheus_parse::{Scrape, Value as PValue};
    let tmp = tempfile::tempdir().unwrap();
    let mut node = Node::start_full(
        tmp.path(),
        "learner",
        "learner",
        "it-metrics",
        None,
        "",
        IDLE_LEARNER,
    );
    node.wait_ready();
    let reply = http_get(&node.admin, "/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.content_type,
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = reply.body;
    for openmetrics_only in ["# UNIT", "# EOF"] {
        assert!(
            !body.contains(openmetrics_only),
            "{openmetrics_only} in a 0.0.4 exposition"
        );
    }
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parses");
    let histograms: BTreeSet<String> = scrape
        .samples
        .iter()
        .filter(|s| matches!(s.value, PValue::Histogram(_)))
        .map(|s| s.metric.clone())
        .collect();
    let mut kinds = std::collections::BTreeMap::new();
    for s in &scrape.samples {
        let part_of_histogram = ["_sum", "_count"].iter().any(|x| {
            s.metric
                .strip_suffix(x)
                .is_some_and(|b| histograms.contains(b))
        });
        if part_of_histogram {
            continue;
        }
        let kind = match &s.value {
            PValue::Counter(_) => "counter",
            PValue::Gauge(_) => "gauge",
            PValue::Histogram(_) => "histogram",
            PValue::Summary(_) => "summary",
            PValue::Untyped(_) => panic!("{} is of no declared type:\n{body}", s.metric),
        };
        assert!(
            scrape.docs.contains_key(&s.metric),
            "{} has no HELP",
            s.metric
        );
        if s.metric.ends_with("_total") {
            assert_eq!(kind, "counter", "{} is named as a counter", s.metric);
        }
        kinds.insert(s.metric.clone(), kind);
    }
    let value = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && s.labels.is_empty())
            .map(|s| s.value.clone())
    };
    for (name, kind) in [
        ("p2p_connection_errors_total", "counter"),
        ("p2p_connections_denied_total", "counter"),
        ("p2p_messages_rejected_total", "counter"),
        ("dissemination_chunk_verification_failures_total", "counter"),
        ("learner_idle_seconds_total", "counter"),
        ("learner_train_seconds_total", "counter"),
        ("learner_t_train_seconds", "histogram"),
        ("learner_t_bcast_seconds", "histogram"),
        ("learner_pull_seconds", "histogram"),
        ("p2p_connected_peers", "gauge"),
    ] {
        assert_eq!(kinds.get(name).copied(), Some(kind), "{name}:\n{body}");
    }
    assert_eq!(
        value("p2p_connection_errors_total"),
        Some(PValue::Counter(0.0)),
        "at 0 from the start"
    );
    assert!(
        kinds
            .keys()
            .any(|k| k.starts_with("libp2p_") && kinds[k] == "counter"),
        "libp2p's counters are typed too: {kinds:?}"
    );
}

/// Every metric name a PromQL expression reads: identifiers outside label matchers, ranges,
/// strings and `by (…)`/`without (…)` clauses that are not function calls or keywords, with
/// the `_bucket`/`_sum`/`_count` suffix of a histogram or summary removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Blank out {…}, […] and "…" (label matchers, range durations such as $__rate_interval,
    // label values).
    let mut clean = String::new();
    let mut close = None;
    for c in expr.chars() {
        match (close, c) {
            (None, '{') => close = Some('}'),
            (None, '[') => close = Some(']'),
            (None, '"') => close = Some('"'),
            (None, _) => clean.push(c),
            (Some(end), _) if c == end => {
                close = None;
                clean.push(' ');
            }
            (Some(_), _) => {}
        }
    }
    // Binary and grouping keywords, and the aggregation operators (which may be followed by
    // `by (…)` rather than directly by their parenthesis).
    const KEYWORDS: [&str; 22] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
    ];
    const LABEL_LISTS: [&str; 4] = ["by", "without", "on", "ignoring"];
    let chars: Vec<char> = clean.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let rest = chars[i..].iter().find(|c| !c.is_whitespace());
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            if LABEL_LISTS.contains(&word.as_str()) && rest == Some(&'(') {
                // `by (label, …)`: skip the label list.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
            } else if rest != Some(&'(') && !KEYWORDS.contains(&word.as_str()) && !preceded_by_digit
            {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .unwrap_or(&word);
                names.insert(base.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names("sum by (instance) (rate(p2p_heartbeats_sent_total{instance=~\"$instance\"}[$__rate_interval]))"),
        ["p2p_heartbeats_sent_total"]
    );
    assert_eq!(
        names("histogram_quantile(0.9, sum by (le) (rate(libp2p_ping_rtt_seconds_bucket[5m])))"),
        ["libp2p_ping_rtt_seconds"]
    );
    assert_eq!(
        names("rate(a_seconds_sum[1m]) / rate(a_seconds_count[1m]) * 1e3 > bool 0"),
        ["a_seconds"]
    );
    assert_eq!(
        names(
            "max without (le) (x_total{a=\"b\"}) - on (instance) group_left max by (instance) (y)"
        ),
        ["x_total", "y"]
    );
    assert_eq!(
        names("max(learner_published_version) - min(node_installed_snapshot_version)"),
        [
            "learner_published_version",
            "node_installed_snapshot_version"
        ]
    );
}

/// Every `expr` of every panel (rows nest their panels when collapsed).
fn exprs(panel: &Value, out: &mut Vec<String>) {
    for t in panel["targets"].as_array().into_iter().flatten() {
        if let Some(e) = t["expr"].as_str() {
            out.push(e.to_string());
        }
    }
    for p in panel["panels"].as_array().into_iter().flatten() {
        exprs(p, out);
    }
}

fn dashboard_metrics() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana/echo-swarm.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut all = Vec::new();
    exprs(&dash, &mut all);
    assert!(
        all.len() >= 15,
        "only {} queries in the dashboard",
        all.len()
    );
    let names: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    assert!(!names.is_empty());
    names
}

/// The series names of a Prometheus text exposition, each also without a
/// `_bucket`/`_sum`/`_count` suffix.
fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_:".contains(*c))
            .collect();
        if name.is_empty() {
            continue;
        }
        for s in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(s) {
                out.insert(base.to_string());
            }
        }
        out.insert(name);
    }
    out
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_exported() {
    // Every counter is exported at 0 from the start, so every query has a series to read,
    // rare events (a repair, a corrupt chunk, a refused peer) included.
    let wanted = dashboard_metrics();
    let scraped = wanted.clone();

    // A learner that trains a few steps and publishes snapshots, and one worker that installs
    // them and serves its groups: every role-specific series gets set at least once.
    let tmp = tempfile::tempdir().unwrap();
    let swarm = "it-dashboard";
    let (mut learner, workers) = Node::learner_and_workers(
        tmp.path(),
        swarm,
        "[learner]\nwarm_start_steps = 2\nmax_steps = 8\n",
        1,
        "[storage]\nmax_pending_groups = 8\n",
    );
    let mut worker = workers.into_iter().next().unwrap();
    worker.wait_ready();
    let deadline = Instant::now() + WAIT + Duration::from_secs(120);
    loop {
        // The status calls also notice (and report) a node that died.
        let ready = learner.status().is_some() && worker.status().is_some();
        let mut have = BTreeSet::new();
        if ready {
            have = exported(&http_get(&learner.admin, "/metrics").body);
            have.extend(exported(&http_get(&worker.admin, "/metrics").body));
        }
        let missing: Vec<&String> = scraped.difference(&have).collect();
        if ready && missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dashboard metrics exported by neither the learner nor the worker: {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("{} dashboard metrics exported", wanted.len());
}
