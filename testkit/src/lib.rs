//! The test kit: waiting on a condition with a deadline, the one helper that the workspace's
//! multi-process and loopback tests and the `testnet` scenarios share.
//!
//! Tests never sleep a fixed time and assert; they poll a condition until it holds or a
//! generous deadline passes (machines are noisy, so the deadline bounds a hang, it does not
//! measure speed). Three shapes cover every caller:
//!
//! - [`poll`]: a fallible synchronous probe, `Ok(None)` on timeout (the caller decides what a
//!   timeout means: `testnet` reports it with the logs it kept);
//! - [`wait_for`]: a synchronous probe in a test, panicking with what it waited for;
//! - [`wait_for_async`]: the same for an async probe (tokio tests).
//!
//! Owns nothing else: fixtures stay next to the tests that use them. A dev-dependency of the
//! library crates, a dependency of `testnet` only; no shipped binary links it.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`wait_for`] and [`wait_for_async`] probe.
pub const EVERY: Duration = Duration::from_millis(100);

/// Calls `probe` every `every` until it returns `Some` (returned) or `limit` has passed
/// (`Ok(None)`); an error of `probe` ends the wait at once. The last probe runs at the
/// deadline, so a condition that holds by then is seen.
pub fn poll<T, E>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe()? {
            return Ok(Some(v));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        std::thread::sleep(every.min(left));
    }
}

/// Calls `f` every [`EVERY`] until it returns `Some` (returned); panics with `what` after
/// `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    match poll(limit, EVERY, || Ok::<_, std::convert::Infallible>(f())) {
        Ok(Some(v)) => v,
        Ok(None) => panic!("timed out after {limit:?} waiting for {what}"),
        Err(never) => match never {},
    }
}

/// The longest one probe of [`wait_for_async`] may take before it is dropped and tried again.
pub const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// [`wait_for`] for an async probe: awaits `f()` every [`EVERY`] (on the tokio timer, so the
/// runtime keeps serving the nodes under test) until it yields `Some`; panics with `what`
/// after `limit`. Each probe is bounded too (by [`PROBE_LIMIT`] and what is left of
/// `limit`): one that never resolves — a stream open racing a connection — is dropped and
/// tried again, never left to hang the test.
pub async fn wait_for_async<T, F: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let probe = left.min(PROBE_LIMIT).max(Duration::from_millis(1));
        if let Ok(Some(v)) = tokio::time::timeout(probe, f()).await {
            return v;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(EVERY.min(left)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn poll_returns_the_first_some_and_stops_on_an_error() {
        let n = Cell::new(0);
        let got = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            n.set(n.get() + 1);
            Ok::<_, String>((n.get() == 3).then_some(n.get()))
        });
        assert_eq!(got, Ok(Some(3)));
        let n = Cell::new(0);
        let err = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            n.set(n.get() + 1);
            if n.get() == 2 {
                Err("broken")
            } else {
                Ok(None::<()>)
            }
        });
        assert_eq!((err, n.get()), (Err("broken"), 2));
    }

    #[test]
    fn poll_gives_none_after_the_limit_having_probed_at_the_deadline() {
        let n = Cell::new(0);
        let got = poll(Duration::from_millis(30), Duration::from_millis(10), || {
            n.set(n.get() + 1);
            Ok::<_, ()>(None::<()>)
        });
        assert_eq!(got, Ok(None));
        assert!(n.get() >= 2, "probed {} times", n.get());
    }

    #[test]
    #[should_panic(expected = "timed out after 10ms waiting for the impossible")]
    fn wait_for_panics_with_what_it_waited_for() {
        wait_for("the impossible", Duration::from_millis(10), || None::<()>);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn wait_for_async_yields_to_the_runtime_between_probes() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            // On the one runtime thread: runs only if the waiter yields between probes.
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send_replace(true);
        });
        let seen = wait_for_async("the flag", Duration::from_secs(30), || {
            let v = *rx.borrow();
            async move { v.then_some(()) }
        })
        .await;
        assert_eq!(seen, ());
    }

    #[tokio::test(flavor = "current_thread")]
    #[should_panic(expected = "waiting for nothing")]
    async fn wait_for_async_panics_after_the_limit() {
        wait_for_async("nothing", Duration::from_millis(10), || async {
            None::<()>
        })
        .await;
    }

    /// A probe that never resolves (a stream open that hangs) no longer hangs the test.
    #[tokio::test(flavor = "current_thread")]
    #[should_panic(expected = "waiting for a hung probe")]
    async fn wait_for_async_bounds_a_probe_that_never_resolves() {
        wait_for_async("a hung probe", Duration::from_millis(50), || {
            std::future::pending::<Option<()>>()
        })
        .await;
    }

    /// A hung probe is dropped and the next one tried.
    #[tokio::test(flavor = "current_thread")]
    async fn wait_for_async_retries_after_a_hung_probe() {
        let n = Cell::new(0);
        let got = wait_for_async("the second probe", PROBE_LIMIT * 3, || {
            n.set(n.get() + 1);
            let first = n.get() == 1;
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
                Some(7)
            }
        })
        .await;
        assert_eq!((got, n.get()), (7, 2));
    }
}
