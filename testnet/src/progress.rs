//! Progress bars of the long sweeps (settings of `broadcast`, runs of `staleness`,
//! `overlap` and `ablation`, phases of `faults`).
//!
//! Drawn on stderr and only when stderr is a terminal (indicatif hides the bar otherwise), so
//! that logs and the `--json` line on stdout stay as they are. Lines a scenario prints while a
//! bar is shown go through [`ProgressBar::suspend`], which prints them whether or not the bar
//! is visible. Must not decide what a scenario runs.

pub use indicatif::ProgressBar;
use indicatif::{ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps named `what`, with the elapsed time and the current step's message.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bar_counts_its_steps() {
        let bar = super::bar(3, "runs");
        bar.inc(2);
        assert_eq!(bar.position(), 2);
        assert_eq!(bar.length(), Some(3));
        // Suspended output runs whether or not the bar is drawn.
        assert_eq!(bar.suspend(|| 7), 7);
        bar.finish_and_clear();
    }
}
