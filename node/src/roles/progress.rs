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
//! Owns: the bar. Must not touch: the engine or the install path (it only reads their events).

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

#[cfg(test)]
mod tests {
    use super::*;

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
