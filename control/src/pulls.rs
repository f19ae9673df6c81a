//! How the learner splits a shortfall of buffered groups over its rollout workers.
//!
//! The learner keeps a buffer of admissible groups (see [`crate::Window::buffered_from`]) and
//! tops it up from the workers with the pull protocol (`docs/pull.md`, `docs/learner.md`).

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

#[cfg(test)]
mod tests {
    use super::allocate_pulls;

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
