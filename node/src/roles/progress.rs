//! A progress bar for long snapshot downloads, drawn on stderr when it is a terminal.
//!
//! The dissemination engine reports every chunk it verified and stored
//! (`DisseminationEvent::Progress`) and every install. A worker joining with a 1.2 GB bf16
//! snapshot of a 0.6B model spends minutes on its first download, and its log says nothing
//! between "manifest accepted" and "installed". [`Tracker`] decides, without I/O, what the
//! bar does: one bar for the newest version in flight whose payload is at least
//! [`LONG_DOWNLOAD_BYTES`] (a smaller one finishes before a bar is worth drawing), abandoned
//! when a newer version starts, finished when it (or a newer one) installs. [`Bar`] carries
//! the steps out with `indicatif` on the one `MultiProgress` the log writer suspends around
//! each line (`crate::logging`), so log lines and the bar do not garble each other; off a
//! terminal nothing is drawn (log files and CI output stay plain).
//!
//! [`StatusLine`], [`Eta`]: the demo's progress line, fitted to the terminal by dropping its
//! least important fields, with the time left.
//!
//! Owns: the bar and the line. Must not touch: the engine or the install path (it only reads
//! their events).

use indicatif::{ProgressBar, ProgressStyle};

/// Payloads at least this large get a bar.
pub const LONG_DOWNLOAD_BYTES: u64 = 64 << 20;

/// What the bar does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A bar for `version`: `total` chunks, `bytes` in all.
    Start {
        version: u64,
        total: usize,
        bytes: u64,
    },
    /// `stored` chunks of the bar's version are stored.
    Advance { stored: usize },
    /// The bar's version is installed.
    Finish,
    /// The bar's version was overtaken by a newer one (or installed past).
    Abandon,
}

/// The version the bar follows, if any (see the module doc).
#[derive(Debug, Default)]
pub struct Tracker {
    current: Option<u64>,
    /// The newest version seen, bar or not: older progress is ignored.
    newest: Option<u64>,
}

impl Tracker {
    /// One more chunk of `version` stored: `stored` of `total`, a payload of `bytes`.
    pub fn progress(&mut self, version: u64, stored: usize, total: usize, bytes: u64) -> Vec<Step> {
        if self.newest.is_some_and(|n| version < n) {
            return Vec::new();
        }
        self.newest = Some(version);
        let mut steps = Vec::new();
        match self.current {
            Some(v) if v == version => {}
            Some(_) => {
                steps.push(Step::Abandon);
                self.current = None;
            }
            None => {}
        }
        if self.current.is_none() {
            if bytes < LONG_DOWNLOAD_BYTES {
                return steps;
            }
            self.current = Some(version);
            steps.push(Step::Start {
                version,
                total,
                bytes,
            });
        }
        steps.push(Step::Advance {
            stored: stored.min(total),
        });
        steps
    }

    /// `version` was installed.
    pub fn installed(&mut self, version: u64) -> Vec<Step> {
        self.newest = Some(self.newest.map_or(version, |n| n.max(version)));
        match self.current {
            Some(v) if v == version => {
                self.current = None;
                vec![Step::Finish]
            }
            Some(v) if v < version => {
                self.current = None;
                vec![Step::Abandon]
            }
            _ => Vec::new(),
        }
    }
}

/// The bar itself: hidden unless stderr is a terminal.
#[derive(Default)]
pub struct Bar {
    tracker: Tracker,
    bar: Option<ProgressBar>,
}

impl Bar {
    pub fn progress(&mut self, version: u64, stored: usize, total: usize, bytes: u64) {
        let steps = self.tracker.progress(version, stored, total, bytes);
        self.apply(steps);
    }

    pub fn installed(&mut self, version: u64) {
        let steps = self.tracker.installed(version);
        self.apply(steps);
    }

    fn apply(&mut self, steps: Vec<Step>) {
        for step in steps {
            match step {
                Step::Start {
                    version,
                    total,
                    bytes,
                } => {
                    let bar = crate::logging::progress_bar(total as u64);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{msg} [{bar:30}] {pos}/{len} chunks ({elapsed}, eta {eta})",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    bar.set_message(format!(
                        "snapshot v{version} ({:.1} MiB)",
                        bytes as f64 / f64::from(1 << 20)
                    ));
                    self.bar = Some(bar);
                }
                Step::Advance { stored } => {
                    if let Some(b) = &self.bar {
                        b.set_position(stored as u64);
                    }
                }
                Step::Finish => {
                    if let Some(b) = self.bar.take() {
                        b.finish_and_clear();
                    }
                }
                Step::Abandon => {
                    if let Some(b) = self.bar.take() {
                        b.abandon();
                    }
                }
            }
        }
    }
}

/// A status line of fields, each with a priority (0 = kept longest): [`StatusLine::fit`] drops
/// the least important fields, not the tail, until the line fits the terminal. What the
/// demo's progress line is made of.
#[derive(Debug, Default, Clone)]
pub struct StatusLine {
    fields: Vec<(u8, String)>,
}

impl StatusLine {
    /// Adds a field (shown in the order added).
    pub fn field(mut self, priority: u8, text: impl Into<String>) -> Self {
        self.fields.push((priority, text.into()));
        self
    }

    /// The fields joined by two spaces, within `width` characters: the fields of the highest
    /// priority number go first, then the next, until the rest fits; a single field longer
    /// than `width` is cut with `…`. Pure.
    pub fn fit(&self, width: usize) -> String {
        let mut keep: Vec<bool> = vec![true; self.fields.len()];
        let len = |keep: &[bool]| -> usize {
            let shown: Vec<usize> = self
                .fields
                .iter()
                .zip(keep)
                .filter(|(_, k)| **k)
                .map(|((_, t), _)| t.chars().count())
                .collect();
            shown.iter().sum::<usize>() + 2 * shown.len().saturating_sub(1)
        };
        let mut by_priority: Vec<usize> = (0..self.fields.len()).collect();
        // Dropped first: the highest number; among equals, the last one.
        by_priority.sort_by_key(|&i| (std::cmp::Reverse(self.fields[i].0), std::cmp::Reverse(i)));
        for i in by_priority {
            if len(&keep) <= width || keep.iter().filter(|k| **k).count() <= 1 {
                break;
            }
            keep[i] = false;
        }
        let line: Vec<&str> = self
            .fields
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|((_, t), _)| t.as_str())
            .collect();
        let line = line.join("  ");
        if line.chars().count() <= width {
            line
        } else {
            let cut: String = line.chars().take(width.saturating_sub(1)).collect();
            format!("{cut}…")
        }
    }
}

/// The time left of a run of `total` steps, from the rate of the steps seen so far (counted
/// from the first step observed, so that a warm-up before it does not count).
#[derive(Debug, Clone)]
pub struct Eta {
    total: u64,
    first: Option<(u64, std::time::Duration)>,
}

impl Eta {
    pub fn new(total: u64) -> Self {
        Eta { total, first: None }
    }

    /// `step` reached at `elapsed` (since any fixed start): the estimated time left, once two
    /// distinct steps were seen. Pure.
    pub fn observe(
        &mut self,
        step: u64,
        elapsed: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let (s0, t0) = *self.first.get_or_insert((step, elapsed));
        if step <= s0 || elapsed <= t0 {
            return None;
        }
        let per_step = (elapsed - t0).as_secs_f64() / (step - s0) as f64;
        let left = self.total.saturating_sub(step) as f64 * per_step;
        Some(std::time::Duration::from_secs_f64(left))
    }
}

/// `ETA 1h02m`, `ETA 3m05s`, `ETA 12s`.
pub fn eta_text(left: Option<std::time::Duration>) -> String {
    let Some(left) = left else {
        return "ETA -".into();
    };
    let s = left.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("ETA {sec}s"),
        (0, m, sec) => format!("ETA {m}m{sec:02}s"),
        (h, m, _) => format!("ETA {h}h{m:02}m"),
    }
}

/// The width of the terminal on stdout, when it is one.
pub fn terminal_width() -> Option<usize> {
    let term = console::Term::stdout();
    term.is_term()
        .then(|| term.size_checked().map(|(_, cols)| usize::from(cols)))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_drops_its_least_important_fields_to_fit() {
        let line = StatusLine::default()
            .field(0, "step 12")
            .field(1, "reward 0.412")
            .field(1, "ETA 3m05s")
            .field(2, "bubble 0.08")
            .field(2, "Δmax 2")
            .field(3, "workers [v11 v12]")
            .field(4, "snapshots 6");
        let all =
            "step 12  reward 0.412  ETA 3m05s  bubble 0.08  Δmax 2  workers [v11 v12]  snapshots 6";
        assert_eq!(line.fit(200), all);
        assert_eq!(line.fit(all.chars().count()), all);
        assert_eq!(
            line.fit(72),
            "step 12  reward 0.412  ETA 3m05s  bubble 0.08  Δmax 2  workers [v11 v12]"
        );
        assert_eq!(
            line.fit(71),
            "step 12  reward 0.412  ETA 3m05s  bubble 0.08  Δmax 2"
        );
        assert_eq!(
            line.fit(50),
            "step 12  reward 0.412  ETA 3m05s  bubble 0.08"
        );
        assert_eq!(line.fit(20), "step 12");
        assert_eq!(line.fit(5), "step…");
        for w in 5..120 {
            assert!(line.fit(w).chars().count() <= w, "width {w}");
        }
    }

    #[test]
    fn the_eta_follows_the_rate_since_the_first_step_seen() {
        use std::time::Duration;
        let mut eta = Eta::new(100);
        assert_eq!(
            eta.observe(0, Duration::from_secs(30)),
            None,
            "one point: no rate"
        );
        assert_eq!(
            eta.observe(10, Duration::from_secs(50)),
            Some(Duration::from_secs(180)),
            "2 s a step, 90 steps left (the 30 s before step 0 do not count)"
        );
        assert_eq!(eta_text(Some(Duration::from_secs(185))), "ETA 3m05s");
        assert_eq!(eta_text(Some(Duration::from_secs(3725))), "ETA 1h02m");
        assert_eq!(eta_text(Some(Duration::from_secs(9))), "ETA 9s");
        assert_eq!(eta_text(None), "ETA -");
    }

    const BIG: u64 = LONG_DOWNLOAD_BYTES;

    #[test]
    fn a_long_download_gets_one_bar_that_finishes_at_its_install() {
        let mut t = Tracker::default();
        assert_eq!(
            t.progress(3, 1, 10, BIG),
            [
                Step::Start {
                    version: 3,
                    total: 10,
                    bytes: BIG
                },
                Step::Advance { stored: 1 }
            ]
        );
        assert_eq!(t.progress(3, 2, 10, BIG), [Step::Advance { stored: 2 }]);
        assert_eq!(t.installed(3), [Step::Finish]);
        assert!(t.installed(3).is_empty(), "nothing left to finish");
    }

    #[test]
    fn small_payloads_get_no_bar() {
        let mut t = Tracker::default();
        assert!(t.progress(1, 1, 2, BIG - 1).is_empty());
        assert!(t.installed(1).is_empty());
    }

    #[test]
    fn a_newer_version_takes_the_bar_and_older_progress_is_ignored() {
        let mut t = Tracker::default();
        t.progress(3, 1, 10, BIG);
        let steps = t.progress(4, 1, 10, BIG);
        assert_eq!(steps[0], Step::Abandon);
        assert!(matches!(steps[1], Step::Start { version: 4, .. }));
        assert!(t.progress(3, 5, 10, BIG).is_empty(), "v3 was overtaken");
        // v5 installed (caught up past v4): v4's bar is abandoned, not finished.
        assert_eq!(t.installed(5), [Step::Abandon]);
        assert!(t.progress(4, 6, 10, BIG).is_empty());
        // More stored than the total (a repeated report) stays within the bar.
        let steps = t.progress(6, 12, 10, BIG);
        assert_eq!(steps.last(), Some(&Step::Advance { stored: 10 }));
    }
}
