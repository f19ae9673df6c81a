//! How the learner splits a shortfall of buffered groups over its rollout workers.
//!
//! The learner keeps a buffer of admissible groups (see [`crate::Window::buffered_from`]) and
//! tops it up from the workers with the pull protocol (`docs/pull.md`, `docs/learner.md`).
//!
//! What a worker *claims* to hold (its heartbeat's `pending`) is never trusted alone: the
//! [`PullLedger`] turns claims into credits bounded by what the learner observed the worker
//! deliver, and [`allocate_capped`] splits a shortfall without exceeding any credit. Nor is
//! its claimed generation rate μ: the [`DeliveryMeter`] measures what it delivered per second
//! the learner asked, for the provisioning scheduler to weigh the claim against.
//!
//! A pull in flight covers its share of the shortfall only until it is slower than the usual
//! round trip ([`hedge`]): a worker that stops answering does not hold the learner's buffer.

use std::time::Duration;

mod delivery;
pub mod hedge;
mod ledger;

pub use delivery::DeliveryMeter;
pub use hedge::{covered, hedge_after};
pub use ledger::{LedgerParams, PeerRecord, PullLedger};

/// How many groups to ask each worker for: exactly `need` in total, split in proportion to
/// what each holds (`holdings`, plus one so that a worker whose report lags still gets a
/// share), by largest remainder. When `need` is smaller than the number of workers, the ones
/// holding most are asked and ties go round-robin from `round`, so that over successive
/// rounds every worker is asked.
///
/// Asking for more than `need` (an earlier version asked every worker for at least one group)
/// over-fills the buffer as the pool grows: with 8 workers and a shortfall of 1, 8 groups came
/// in, the surplus aged past `S` in the buffer (46 % of all pulled groups expired), and the
/// workers never reached their pending cap, so they kept generating groups nobody would train
/// on — on a shared host, CPU taken from the learner.
pub fn allocate_pulls(need: u64, holdings: &[u64], round: usize) -> Vec<u64> {
    let n = holdings.len();
    if need == 0 || n == 0 {
        return vec![0; n];
    }
    let weights: Vec<u128> = holdings.iter().map(|&h| u128::from(h) + 1).collect();
    let total: u128 = weights.iter().sum();
    let need128 = u128::from(need);
    // Whole shares first; each is at most `need` because w ≤ total.
    let mut out: Vec<u64> = weights
        .iter()
        .map(|w| (need128 * w / total) as u64)
        .collect();
    let left = need - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| {
        let remainder = need128 * weights[i] % total;
        (std::cmp::Reverse(remainder), (i + n - round % n) % n)
    });
    // `left` < n: the whole shares' remainders sum to less than n · total.
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

/// Like [`allocate_pulls`] over `credits` (see [`PullLedger::credit`]), but no worker is asked
/// for more than its credit: the total is `min(need, Σ credits)`. A share that the
/// proportional split puts above a credit (its `+1` gives a worker with credit 0 a share) is
/// cut to the credit and the excess split again over the workers with room left, until none
/// is left. A worker with credit 0 (pull in flight, backing off, claims nothing) gets nothing.
pub fn allocate_capped(need: u64, credits: &[u64], round: usize) -> Vec<u64> {
    let n = credits.len();
    let total: u64 = credits.iter().fold(0u64, |a, &c| a.saturating_add(c));
    let mut out = vec![0u64; n];
    let mut left = need.min(total);
    // Each pass either places everything left or fills at least one worker to its credit.
    for _ in 0..=n {
        if left == 0 {
            break;
        }
        let open: Vec<usize> = (0..n).filter(|&i| out[i] < credits[i]).collect();
        if open.is_empty() {
            break;
        }
        let room: Vec<u64> = open.iter().map(|&i| credits[i] - out[i]).collect();
        let shares = allocate_pulls(left, &room, round);
        for ((&i, r), s) in open.iter().zip(room).zip(shares) {
            let s = s.min(r);
            out[i] += s;
            left -= s;
        }
    }
    out
}

/// A worker whose last pull began this long ago (or never) is *due* a probe
/// ([`allocate_probing`], [`PullLedger::due`]). One second: several training steps of a small
/// model, and a fraction of the staleness window of a large one; a probe costs a one-group
/// pull.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);

/// [`allocate_capped`], except that each *due* worker (`due[i]`) with credit is first asked
/// for one group — in turn from `round` while the need lasts — and the rest of the need is
/// split by [`allocate_capped`] over the credit left. The total is still
/// `min(need, Σ credits)` and no worker gets more than its credit.
///
/// Why: a split in proportion to credit gives a shortfall smaller than the pool to the
/// workers with the largest remainders, which are those with the most credit, in every round.
/// A worker whose credit sank to the floor (its last pulls came back empty: what it held had
/// aged out of the window) was then never asked again, so it never pruned its stale backlog:
/// paused at `storage.max_pending_groups`, it made nothing. The floor of one group
/// ([`LedgerParams::floor`]) promised a probe that the split never made; this makes it. A
/// probation worker's credit is capped by the probation room before this split
/// (`node`'s `shares::pull_caps`): a worker with no room left gets no probe.
pub fn allocate_probing(need: u64, credits: &[u64], due: &[bool], round: usize) -> Vec<u64> {
    let n = credits.len();
    let mut out = vec![0u64; n];
    let mut probes: Vec<usize> = (0..n)
        .filter(|&i| credits[i] > 0 && due.get(i).copied().unwrap_or(false))
        .collect();
    if !probes.is_empty() {
        let k = round % probes.len();
        probes.rotate_left(k);
    }
    let mut left = need;
    for i in probes {
        if left == 0 {
            break;
        }
        out[i] = 1;
        left -= 1;
    }
    let room: Vec<u64> = credits.iter().zip(&out).map(|(c, o)| c - o).collect();
    for (o, more) in out.iter_mut().zip(allocate_capped(left, &room, round)) {
        *o += more;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{allocate_capped, allocate_probing, allocate_pulls};

    /// A xorshift generator for the property tests.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The credits of up to 8 workers: some 0, some unbounded, the rest small.
    fn random_credits(next: &mut impl FnMut() -> u64) -> Vec<u64> {
        let n = (next() % 9) as usize;
        (0..n)
            .map(|_| match next() % 5 {
                0 => 0,
                1 => u64::MAX,
                _ => next() % 50,
            })
            .collect()
    }

    #[test]
    fn a_worker_at_the_floor_is_probed_instead_of_starved() {
        // Credits 1, 3, 3 and a shortfall of 2: the proportional split never asks the first
        // worker, in any round.
        for round in 0..12 {
            assert_eq!(allocate_capped(2, &[1, 3, 3], round)[0], 0);
        }
        // Due a probe, it is asked for one group; the rest goes by credit.
        let due = [true, false, false];
        let got = allocate_probing(2, &[1, 3, 3], &due, 0);
        assert_eq!(got[0], 1);
        assert_eq!(got.iter().sum::<u64>(), 2);
        // Not due: as before.
        assert_eq!(
            allocate_probing(2, &[1, 3, 3], &[false; 3], 0),
            allocate_capped(2, &[1, 3, 3], 0)
        );
        // A due worker with no credit (pull in flight, backing off) is not probed.
        assert_eq!(
            allocate_probing(2, &[0, 3, 3], &[true, false, false], 0)[0],
            0
        );
        // More due workers than need: they take turns over the rounds.
        let due = [true; 3];
        let firsts: std::collections::BTreeSet<usize> = (0..3)
            .map(|round| {
                let got = allocate_probing(1, &[1, 3, 3], &due, round);
                assert_eq!(got.iter().sum::<u64>(), 1);
                got.iter().position(|&g| g == 1).unwrap()
            })
            .collect();
        assert_eq!(
            firsts.len(),
            3,
            "every due worker is probed within three rounds"
        );
        // A short `due` reads as not due.
        assert_eq!(
            allocate_probing(1, &[1, 3], &[], 0),
            allocate_capped(1, &[1, 3], 0)
        );
    }

    #[test]
    fn probing_shares_never_exceed_credits_and_fill_up_to_the_need() {
        let mut next = xorshift(0x9e3779b97f4a7c15);
        for _ in 0..2000 {
            let credits = random_credits(&mut next);
            let n = credits.len();
            let due: Vec<bool> = (0..n).map(|_| next().is_multiple_of(2)).collect();
            let need = next() % 200;
            let round = next() as usize;
            let got = allocate_probing(need, &credits, &due, round);
            assert_eq!(got.len(), n);
            let total = credits.iter().fold(0u64, |a, &c| a.saturating_add(c));
            assert_eq!(
                got.iter().sum::<u64>(),
                need.min(total),
                "{credits:?} {due:?} {need}"
            );
            // Every due worker with credit is asked while the need covers the due ones.
            let due_with_credit = credits
                .iter()
                .zip(&due)
                .filter(|(c, d)| **c > 0 && **d)
                .count() as u64;
            for ((g, c), d) in got.iter().zip(&credits).zip(&due) {
                assert!(g <= c, "{credits:?} {got:?}");
                if *d && *c > 0 && need >= due_with_credit {
                    assert!(*g >= 1, "{credits:?} {due:?} {need} {got:?}");
                }
            }
        }
    }

    #[test]
    fn capped_shares_never_exceed_credits_and_fill_up_to_the_need() {
        assert_eq!(allocate_capped(10, &[0, 0, 0], 0), vec![0, 0, 0]);
        assert_eq!(allocate_capped(10, &[2, 0, 3], 0), vec![2, 0, 3]);
        assert_eq!(allocate_capped(3, &[1, 100], 0).iter().sum::<u64>(), 3);
        assert_eq!(allocate_capped(0, &[5, 5], 0), vec![0, 0]);
        assert!(allocate_capped(5, &[], 0).is_empty());
        let mut next = xorshift(0x2545f4914f6cdd1d);
        for _ in 0..2000 {
            let credits = random_credits(&mut next);
            let need = next() % 200;
            let s = allocate_capped(need, &credits, (next() % 7) as usize);
            let total = credits.iter().fold(0u64, |a, &c| a.saturating_add(c));
            assert_eq!(
                s.iter().sum::<u64>(),
                need.min(total),
                "{need} {credits:?} {s:?}"
            );
            assert!(
                s.iter().zip(&credits).all(|(s, c)| s <= c),
                "{credits:?} {s:?}"
            );
        }
    }

    #[test]
    fn pulls_follow_holdings_and_never_exceed_the_need() {
        // Weights 11, 5, 1 of 17: whole shares 5, 2, 0; the largest remainder (8/17) gets the
        // last one.
        assert_eq!(allocate_pulls(8, &[10, 4, 0], 0), vec![5, 2, 1]);
        assert_eq!(allocate_pulls(0, &[10, 4], 0), vec![0, 0]);
        assert!(allocate_pulls(5, &[], 0).is_empty());
        assert_eq!(allocate_pulls(2, &[1000], 0), vec![2]);
        // Exactly `need` in total, however many workers and whatever they hold.
        for need in 0..20u64 {
            for holdings in [vec![0; 8], vec![3, 0, 9, 1, 1, 0, 7, 2], vec![u64::MAX, 0]] {
                for round in 0..10 {
                    let shares = allocate_pulls(need, &holdings, round);
                    assert_eq!(shares.iter().sum::<u64>(), need, "{need} {holdings:?}");
                }
            }
        }
        // A shortfall smaller than the pool goes to the workers holding most.
        assert_eq!(allocate_pulls(2, &[0, 9, 0, 5], 0), vec![0, 1, 0, 1]);
    }

    #[test]
    fn equal_workers_take_turns_when_the_need_is_small() {
        // One group a round from 8 idle workers holding the same: 8 rounds ask 8 different
        // workers.
        let mut asked = std::collections::HashSet::new();
        for round in 0..8 {
            let shares = allocate_pulls(1, &[2; 8], round);
            assert_eq!(shares.iter().sum::<u64>(), 1);
            asked.insert(shares.iter().position(|&s| s == 1).unwrap());
        }
        assert_eq!(asked.len(), 8);
    }
}
