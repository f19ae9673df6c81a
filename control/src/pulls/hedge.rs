//! Hedged pulls: when a pull in flight stops counting towards the learner's buffer.
//!
//! The puller tops the buffer up to its target: the shortfall less what pulls still in flight
//! asked for, split over the workers with no pull in flight. A pull in flight therefore
//! *covers* its share until it ends — and a worker that stops answering without closing the
//! connection (a stopped or swapping process, a black-holed path, a peer that answers just
//! inside every read deadline) held its share for up to the pull's read deadline, 10 s, while
//! the training thread waited for groups nobody else was asked for. The worker with the
//! freshest backlog is the one asked most, so it holds the most.
//!
//! So a pull *hedges* ("The Tail at Scale", Dean and Barroso, 2013: issue a second request once
//! the first is slower than the tail of the usual latency): once it has been in flight for
//! [`hedge_after`] — [`HEDGE_FACTOR`] times the median of the recent pull round trips, within
//! [`HEDGE_MIN`]..=[`HEDGE_MAX`] — it no longer covers its share ([`covered`]), and the next
//! round asks the other workers for it. The slow pull is not cancelled: what it brings is
//! verified and stored like any other group, and a surplus is what a late answer costs —
//! groups that may age out of the window unused — bounded by one share per slow worker.
//!
//! Owns: the hedge delay and what in-flight pulls cover. Must not touch: how a shortfall is
//! split ([`crate::pulls::allocate_capped`]), the pulls themselves (`node`, `pull`).

use std::time::Duration;

/// A pull in flight longer than this many times the median recent round trip stops covering
/// its share. Four: a healthy worker's round trip varies with its backlog and with what the
/// hosts are doing, and a hedge fired by that spread costs surplus groups for nothing. In the
/// emulated wide-area swarm (`docs/netlab.md`, six workers, 0.5 % loss) the ninetieth
/// percentile was 1.4–4.5 times the median (0.068 s against 0.015 s on loopback, 0.449 s
/// against 0.317 s at 100 ms RTT); four medians, with the [`HEDGE_MIN`] floor, lies past the
/// ninetieth percentile in each of those runs.
pub const HEDGE_FACTOR: f64 = 4.0;

/// The least hedge delay: below this a loopback round trip's scheduling noise would hedge
/// healthy pulls.
pub const HEDGE_MIN: Duration = Duration::from_millis(100);

/// The hedge delay before any pull has finished (nothing to take a median of).
pub const HEDGE_DEFAULT: Duration = Duration::from_secs(1);

/// The greatest hedge delay: the pull protocol's read deadline (`pull::READ_TIMEOUT`), after
/// which a silent pull fails anyway.
pub const HEDGE_MAX: Duration = Duration::from_secs(10);

/// How long a pull may be in flight before it stops covering its share, given the median of
/// the recent pull round trips in seconds (`None`: none finished yet).
pub fn hedge_after(median_round_trip_s: Option<f64>) -> Duration {
    match median_round_trip_s {
        Some(m) if m.is_finite() && m >= 0.0 => {
            Duration::from_secs_f64((HEDGE_FACTOR * m).min(HEDGE_MAX.as_secs_f64()))
                .clamp(HEDGE_MIN, HEDGE_MAX)
        }
        _ => HEDGE_DEFAULT,
    }
}

/// The groups that the pulls in flight — `(groups asked, time in flight)` — still cover: those
/// of pulls in flight for less than `hedge_after`.
pub fn covered(in_flight: impl IntoIterator<Item = (u64, Duration)>, hedge_after: Duration) -> u64 {
    in_flight
        .into_iter()
        .filter(|&(_, age)| age < hedge_after)
        .map(|(groups, _)| groups)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hedge_delay_is_four_median_round_trips_within_bounds() {
        assert_eq!(hedge_after(Some(0.05)), Duration::from_millis(200));
        // Loopback round trips of a few ms would hedge healthy pulls: the floor.
        assert_eq!(hedge_after(Some(0.002)), HEDGE_MIN);
        assert_eq!(hedge_after(Some(0.0)), HEDGE_MIN);
        // A slow wide-area swarm: never past the read deadline.
        assert_eq!(hedge_after(Some(30.0)), HEDGE_MAX);
        // Nothing measured yet, or nonsense: the default.
        assert_eq!(hedge_after(None), HEDGE_DEFAULT);
        assert_eq!(hedge_after(Some(f64::NAN)), HEDGE_DEFAULT);
        assert_eq!(hedge_after(Some(f64::INFINITY)), HEDGE_DEFAULT);
        assert_eq!(hedge_after(Some(-1.0)), HEDGE_DEFAULT);
    }

    #[test]
    fn a_pull_slower_than_the_hedge_delay_no_longer_covers_its_share() {
        let ms = Duration::from_millis;
        let flights = [(5, ms(20)), (3, ms(450)), (2, ms(199))];
        // The 450-ms pull is past a 200-ms hedge: its 3 groups are asked of others.
        assert_eq!(covered(flights, ms(200)), 7);
        // At exactly the delay it has hedged.
        assert_eq!(covered([(4, ms(200))], ms(200)), 0);
        // With a patient delay every pull covers; with none in flight nothing does.
        assert_eq!(covered(flights, HEDGE_MAX), 10);
        assert_eq!(covered([], ms(200)), 0);
    }
}
