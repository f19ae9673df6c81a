//! The staleness window: which trajectory groups a learner at version `v` with staleness
//! budget `S` may still train on (ECHO-2, Algorithm 1; the bounded-staleness rule).
//!
//! This is the one home of the rule. The trainer admits groups with it, the learner's puller
//! counts its buffer with it, and the `v_min` of every pull lease (below which workers prune)
//! is its floor. All three read the same [`Window`], built once from the `S` the trainer runs
//! with, so they cannot disagree.

/// A staleness budget `S` (in versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Staleness budget S: a group generated under version `v_τ` is admissible at learner
    /// version `v` while `v − v_τ ≤ S`. `S = 0` is on-policy.
    pub staleness: u64,
}

impl Window {
    pub const fn new(staleness: u64) -> Self {
        Window { staleness }
    }

    /// Oldest admissible version at learner version `v`: `v − S`, saturating at 0. It is the
    /// `v_min` of a pull lease and the bound below which stores prune.
    pub fn floor(self, v: u64) -> u64 {
        v.saturating_sub(self.staleness)
    }

    /// `v_τ ≥ v − S`: a group from version `v_tau` may train at learner version `v`. Groups
    /// from a version newer than the learner's pass this rule; the trainer refuses them
    /// separately (they cannot come from an honest worker).
    pub fn admissible(self, v_tau: u64, v: u64) -> bool {
        v_tau >= self.floor(v)
    }

    /// Oldest version that still counts as buffered at learner version `v`: a group must
    /// outlive the next step to be worth holding for it, so the floor is taken at `v + 1`.
    /// With `S = 0` nothing outlives a step, and the current version is what the next batch
    /// needs, so the floor is `v` itself.
    pub fn buffered_from(self, v: u64) -> u64 {
        if self.staleness == 0 {
            v
        } else {
            self.floor(v + 1)
        }
    }

    /// What the puller of a learner at version `v` asks for and counts, once the step at `v`
    /// has taken its batch (`taken`) or before: `(v_min, buffered_from)`.
    ///
    /// - `v_min`, the floor of its requests (workers prune below it and make nothing while
    ///   their installed version is under it): `floor(v)` while the batch is gathered, and
    ///   `floor(v + 1)` once it is taken — a group only the step at `v` could use is of no use
    ///   then. With `S = 0` (sequential mode) that is every group of `v`: the workers stop
    ///   making them while `v` trains and wait for `v + 1` ("refresh first").
    /// - `buffered_from`, the oldest version counted as buffered: [`Self::buffered_from`] of
    ///   `v`, except with `S = 0` once the batch is taken, when the next batch needs `v + 1`.
    pub fn filling(self, v: u64, taken: bool) -> (u64, u64) {
        let next = v + u64::from(taken);
        let buffered = if self.staleness == 0 {
            next
        } else {
            self.buffered_from(v)
        };
        (self.floor(next), buffered)
    }

    /// Default publication period κ = max(S − 1, 1): a snapshot is due before the oldest
    /// admissible version falls out of the window.
    pub fn default_kappa(self) -> u64 {
        self.staleness.saturating_sub(1).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_a_batch_is_taken_the_puller_fills_for_the_next_step() {
        // Sequential (S = 0) at v = 5: gathering asks for and counts v = 5; once the batch is
        // taken, v = 6 — no worker makes another group of 5.
        assert_eq!(Window::new(0).filling(5, false), (5, 5));
        assert_eq!(Window::new(0).filling(5, true), (6, 6));
        // S = 3 at v = 5: requests move from 2 to 3 (a group of 2 could only have served the
        // step at 5); what counts as buffered stays the groups that outlive the next step.
        assert_eq!(Window::new(3).filling(5, false), (2, 3));
        assert_eq!(Window::new(3).filling(5, true), (3, 3));
    }

    #[test]
    fn floor_and_admissibility() {
        let w = Window::new(3);
        assert_eq!(w.floor(10), 7);
        assert_eq!(w.floor(2), 0);
        assert!(w.admissible(7, 10));
        assert!(!w.admissible(6, 10));
        assert!(w.admissible(11, 10), "newer versions pass the window rule");
        let on_policy = Window::new(0);
        assert!(on_policy.admissible(5, 5));
        assert!(!on_policy.admissible(4, 5));
    }

    #[test]
    fn buffered_counts_what_outlives_the_next_step() {
        assert_eq!(Window::new(3).buffered_from(10), 8);
        assert_eq!(Window::new(1).buffered_from(10), 10);
        assert_eq!(Window::new(0).buffered_from(10), 10);
        assert_eq!(Window::new(3).buffered_from(0), 0);
    }

    #[test]
    fn kappa_default() {
        assert_eq!(Window::new(0).default_kappa(), 1);
        assert_eq!(Window::new(1).default_kappa(), 1);
        assert_eq!(Window::new(4).default_kappa(), 3);
    }
}
