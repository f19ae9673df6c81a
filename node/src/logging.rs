//! Structured logs with `tracing`, to stderr. `RUST_LOG` overrides the level flags.
//!
//! Progress bars (`roles::rollout::progress`) share stderr with the log: both go through one
//! [`indicatif::MultiProgress`], which is cleared around each log line and redrawn after it.
//! Off a terminal the bars are hidden and log lines are written as they are.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use tracing_subscriber::EnvFilter;

pub fn init(verbose: u8, quiet: bool) {
    let default = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},sled=warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Stderr)
        // Colour only on a terminal: log files and CI output stay plain text.
        .with_ansi(on_terminal())
        .try_init();
}

/// Whether stderr is a terminal (asked once).
fn on_terminal() -> bool {
    static TERMINAL: OnceLock<bool> = OnceLock::new();
    *TERMINAL.get_or_init(|| std::io::stderr().is_terminal())
}

/// The bars drawn on stderr (hidden when it is not a terminal).
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| {
        if on_terminal() {
            MultiProgress::with_draw_target(ProgressDrawTarget::stderr())
        } else {
            MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
        }
    })
}

/// A new bar of `len` steps on stderr, drawn between log lines.
pub fn progress_bar(len: u64) -> ProgressBar {
    bars().add(ProgressBar::new(len))
}

/// stderr for the log: with the bars cleared while a line is written, on a terminal.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if on_terminal() {
            bars().suspend(|| std::io::stderr().write(buf))
        } else {
            std::io::stderr().write(buf)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
