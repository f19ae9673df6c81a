//! Structured logs with `tracing`, to stderr. `RUST_LOG` overrides the level flags.

use std::io::IsTerminal;

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
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files and CI output stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
