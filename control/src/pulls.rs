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

mod delivery;
mod ledger;

pub use delivery::DeliveryMeter;
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

#[cfg(test)]
mod tests {
    use super::{allocate_capped, allocate_pulls};

    #[test]
    fn capped_shares_never_exceed_credits_and_fill_up_to_the_need() {
        assert_eq!(allocate_capped(10, &[0, 0, 0], 0), vec![0, 0, 0]);
        assert_eq!(allocate_capped(10, &[2, 0, 3], 0), vec![2, 0, 3]);
        assert_eq!(allocate_capped(3, &[1, 100], 0).iter().sum::<u64>(), 3);
        assert_eq!(allocate_capped(0, &[5, 5], 0), vec![0, 0]);
        assert!(allocate_capped(5, &[], 0).is_empty());
        let mut x = 0x2545f4914f6cdd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let n = (next() % 9) as usize;
            let credits: Vec<u64> = (0..n)
                .map(|_| match next() % 5 {
                    0 => 0,
                    1 => u64::MAX,
                    _ => next() % 50,
                })
                .collect();
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
