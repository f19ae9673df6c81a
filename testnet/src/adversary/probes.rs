//! Reading the adversary scenario's nodes: `/status` and `/metrics` over the admin
//! endpoint, install counters and their quiet-start watch, stopped nodes' stores and logs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::harness;

/// `learner_groups_trained_total{producer="…"}` of a Prometheus text page, per producer.
pub(crate) fn trained_by_producer(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("learner_groups_trained_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let producer = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("producer=\""))
            .and_then(|p| p.strip_suffix('"'));
        if let (Some(p), Ok(n)) = (producer, value.trim().parse::<f64>()) {
            out.insert(p.to_string(), n as u64);
        }
    }
    out
}

/// `GET path` on a node's admin endpoint (HTTP/1.0, bounded), the body of a 200 answer.
pub(crate) fn http_get(admin: &str, path: &str) -> Option<String> {
    let addr = admin.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {admin}\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.take(64 << 20).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.split_whitespace()
        .nth(1)
        .is_some_and(|c| c == "200")
        .then(|| body.to_string())
}

/// The newest snapshot version whose chunks are all in a stopped node's store
/// (`echo-node inspect snapshots --json`); `None` when it holds none or cannot be read.
pub(super) fn newest_complete_snapshot(bin: &Path, data_dir: &Path) -> Option<u64> {
    let out = std::process::Command::new(bin)
        .args(["inspect", "snapshots", "--json", "--data-dir"])
        .arg(data_dir)
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["snapshots"]
        .as_array()?
        .iter()
        .filter(|s| s["missing"] == 0)
        .filter_map(|s| s["version"].as_u64())
        .max()
}

pub(crate) fn status(admin: &str) -> Option<Value> {
    serde_json::from_str(&http_get(admin, "/status")?).ok()
}

/// The end of an install measure: the learner has stopped publishing (`max_steps`); waits up
/// to [`SETTLE_LIMIT`] for every worker of `admins` to install its newest version (handing
/// each learner status read meanwhile to `seen`: a verdict may still land), then takes the
/// counters.
pub(crate) fn settle_installs(
    learner: &str,
    admins: &[String],
    installs: &mut InstallWatch,
    mut seen: impl FnMut(&Value),
) {
    let Some(ls) = status(learner) else { return };
    let newest = ls["learner"]["published_version"].as_u64();
    let _ = harness::poll(SETTLE_LIMIT, Duration::from_millis(500), || {
        if let Some(ls) = status(learner) {
            seen(&ls);
        }
        let at = |a: &String| status(a).and_then(|s| s["version"].as_u64());
        Ok(admins.iter().all(|a| at(a) >= newest).then_some(()))
    });
    if let Some(ls) = status(learner) {
        seen(&ls);
        installs.sample(&ls, admins, true);
    }
}

/// How long the end of a run waits for the honest workers to install the final version.
pub(super) const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// A counter of a Prometheus text page (`name value`, no labels).
pub(crate) fn counter(metrics: &str, name: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse::<f64>().ok().map(|x| x as u64))?
    })
}

/// Installs (the dissemination engine's `dissemination_installs_total`) of a node.
pub(crate) fn installs(admin: &str) -> Option<u64> {
    counter(
        &http_get(admin, "/metrics")?,
        "dissemination_installs_total",
    )
}

/// `honest_install_ratio`: versions the honest workers installed over versions published,
/// from the learner's and each worker's counters at the start and at the end of the measure.
/// `None` before a start was taken. A worker restarted in between (its counter began again)
/// is left out.
#[derive(Debug, Default)]
pub(crate) struct InstallWatch {
    pub(super) start: Option<(u64, Vec<Option<u64>>)>,
    pub(super) end: Option<(u64, Vec<Option<u64>>)>,
    pub(super) restarted: Vec<usize>,
}

impl InstallWatch {
    /// Takes the start, or the end. The start is taken at a quiet moment: the learner has
    /// published and every worker has installed exactly the version the learner last counted
    /// as published. The learner counts a version once its publication returns, and workers
    /// may install it before that; a start taken between the two counted that install but
    /// not the publication, and read one version short per worker (0.93 in a run where every
    /// honest worker installed every version). The end is taken by [`settle_installs`], once
    /// every worker has installed the newest version.
    pub(crate) fn sample(&mut self, learner: &Value, admins: &[String], end: bool) {
        let Some(published) = learner["learner"]["snapshots_published"].as_u64() else {
            return;
        };
        if !end && (self.start.is_some() || published == 0) {
            return;
        }
        if end {
            let counts = admins.iter().map(|a| installs(a)).collect();
            self.end = Some((published, counts));
            return;
        }
        // Quiet before and after the counters are read: no install can fall between.
        let newest = learner["learner"]["published_version"].as_u64();
        let quiet = || {
            admins.iter().all(|a| {
                newest.is_some() && status(a).and_then(|s| s["version"].as_u64()) == newest
            })
        };
        if !quiet() {
            return;
        }
        let counts = admins.iter().map(|a| installs(a)).collect();
        if quiet() {
            self.start = Some((published, counts));
        }
    }

    pub(crate) fn restarted(&mut self, worker: usize) {
        self.restarted.push(worker);
    }

    pub(crate) fn ratio(&self) -> Option<f64> {
        let ((p0, i0), (p1, i1)) = (self.start.as_ref()?, self.end.as_ref()?);
        let published = p1.checked_sub(*p0)?;
        let (mut got, mut want) = (0u64, 0u64);
        for (w, (a, b)) in i0.iter().zip(i1).enumerate() {
            if self.restarted.contains(&w) {
                continue;
            }
            let (Some(a), Some(b)) = (a, b) else { continue };
            got += b.saturating_sub(*a).min(published);
            want += published;
        }
        (want > 0).then(|| got as f64 / want as f64)
    }
}

/// The ids (hex) of the groups the learner trained (`<data_dir>/metrics/steps.jsonl`).
pub(super) fn trained_group_ids(learner_dir: &Path) -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(learner_dir.join("metrics").join("steps.jsonl"))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| {
            v["trained_groups"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The ids (hex) of the groups a misbehaving worker forged (`misbehave.forged`).
pub(super) fn forged_group_ids(data_dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(data_dir.join(echo_node::misbehave::FORGED_FILE))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}
