//! Probation and shares: how much the learner checks, and how much it trains, of a worker
//! it does not know yet (`docs/security.md`, "Probation and admission").
//!
//! Identities are cheap: a banned worker comes back under a fresh key. What a fresh key can
//! take is therefore bounded by rules that depend only on what the learner *verified* of that
//! key, never on what it claims:
//!
//! - **Probation** ([`on_probation`]): a worker stays on probation until its verified history
//!   spans time and versions — [`ProbationParams::probation_groups`] accepted groups, made
//!   under at least [`ProbationParams::probation_versions`] distinct versions, the first
//!   accepted at least [`ProbationParams::probation_secs`] ago (the learner's clock). A count
//!   of groups alone is bought in seconds by a fast honest-looking identity; versions are
//!   published by the learner and time passes for everyone, so neither can be bought. Every
//!   group of a worker on probation is checked in full (the log-prob and sampling check, the
//!   costliest layer), and each is held until its check is done. Its pull credit starts at
//!   one group (`PullLedger`'s initial estimate).
//! - **Price of a new identity** ([`pow_price`]): where a proof of work is asked, its price in
//!   bits rises by one for every identity admitted within the last window beyond a free
//!   allowance, so a wave of fresh identities costs exponentially more per identity.
//! - **Check rate** ([`check_rate`]): after probation the fraction of a worker's groups that
//!   are checked falls with its verified history `h` (accepted groups past probation) as
//!   `max(floor, c / (c + h))`. A worker that lies after an honest history of `h` groups is
//!   caught at its first checked lie, so the lies it gets accepted before that are
//!   geometrically distributed with parameter `check_rate(h)`: [`forged_bound`] gives the
//!   number it stays below with a chosen confidence. Buying a lower rate costs honest work
//!   (`h` grows only with accepted groups), and the floor keeps every peer checked.
//! - **Shares of a batch** ([`batch_quota`], [`compose_batch`]): no single worker fills more
//!   than `max_peer_share` of a batch, whatever backlog it claims, and the workers on
//!   probation together no more than `probation_share`. Liveness comes first where only one
//!   source exists: when no *established* worker (past probation) is active the batch may be
//!   filled from probation workers (a swarm that is just starting), and when only `k`
//!   established workers offer groups right now each may give `⌈B/k⌉` (the learner does not
//!   idle to enforce a share no one else can fill; the puller keeps each worker's part of the
//!   buffer within its share, so this happens only when the others have nothing buffered).
//!   The probation share is never relaxed while an established worker is active.
//! - **Dense numbering** ([`SeqGaps`]): a worker numbers its groups 0, 1, 2, … and knows each
//!   group before it sends it, so it could withhold the ones it dislikes. Numbers it skips
//!   are counted (after a horizon that tolerates out-of-order pulls) and reported; the caller
//!   takes them off the worker's pull credit.
//!
//! Pure: no I/O, no clock; callers pass counts in and carry decisions out.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// The probation and check-rate rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbationParams {
    /// N: a worker's first N accepted groups are all checked, and it is on probation until
    /// it has N.
    pub probation_groups: u64,
    /// The lowest check rate, reached after a long verified history.
    pub floor_rate: f64,
    /// c: the history (in accepted groups past probation) over which the rate halves from 1.
    pub decay_groups: f64,
    /// Distinct versions its accepted groups must span before it leaves probation.
    pub probation_versions: u64,
    /// Seconds from its first accepted group before it leaves probation.
    pub probation_secs: u64,
}

/// Default N. Chosen from the measured cost of one full check: 4.9 ms against a training step
/// of 90 ms on the demo's shape (2 CPU cores; `docs/security.md`, "Cost of verification"),
/// so one identity's probation costs the learner 16 × 4.9 ≈ 78 ms, less than one training
/// step, once. The ratio of a check to a step is roughly independent of the model size (one
/// forward over one group against forward, reference forward and backward over B groups),
/// so the same N holds for larger models.
pub const DEFAULT_PROBATION_GROUPS: u64 = 16;
/// Default number of distinct versions a worker's accepted groups span before it leaves
/// probation: eight publications (at least `8 κ` learner steps).
pub const DEFAULT_PROBATION_VERSIONS: u64 = 8;
/// Default time from a worker's first accepted group before it leaves probation: longer than
/// the 10–15 s a fast identity took to reach 16 accepted groups, and than a demo run's first
/// phase, so fresh identities stay inside the probation share for minutes.
pub const DEFAULT_PROBATION_SECS: u64 = 120;
/// Default floor of the check rate (the old flat spot-check fraction).
pub const DEFAULT_FLOOR_RATE: f64 = 0.05;
/// Default c: the rate is 1/2 after 16 accepted groups past probation, 1/4 after 48, and
/// reaches the 5 % floor after 304.
pub const DEFAULT_DECAY_GROUPS: f64 = 16.0;

impl Default for ProbationParams {
    fn default() -> Self {
        ProbationParams {
            probation_groups: DEFAULT_PROBATION_GROUPS,
            floor_rate: DEFAULT_FLOOR_RATE,
            decay_groups: DEFAULT_DECAY_GROUPS,
            probation_versions: DEFAULT_PROBATION_VERSIONS,
            probation_secs: DEFAULT_PROBATION_SECS,
        }
    }
}

/// Whether a worker with verified history `h` is still on probation at `now_ms` (the
/// learner's clock, ms): fewer than N accepted groups, or spanning fewer than V versions, or
/// its first accepted group less than T ago.
pub fn on_probation(p: &ProbationParams, h: &PeerHistory, now_ms: u64) -> bool {
    let young = match h.first_accepted_ms {
        Some(t) => now_ms.saturating_sub(t) < p.probation_secs.saturating_mul(1000),
        None => true,
    };
    h.accepted < p.probation_groups || h.versions < p.probation_versions || young
}

/// The fraction of a worker's next groups that get the full check, after its history `h`: 1
/// on probation, then `max(floor, c / (c + h))` with `h = accepted − N`. Always in `[0, 1]`;
/// hostile parameters (NaN, negative) fall back to checking everything.
pub fn check_rate(p: &ProbationParams, h: &PeerHistory, now_ms: u64) -> f64 {
    if on_probation(p, h, now_ms) {
        return 1.0;
    }
    let accepted = h.accepted;
    let floor = if p.floor_rate.is_finite() {
        p.floor_rate.clamp(0.0, 1.0)
    } else {
        1.0
    };
    if !(p.decay_groups.is_finite() && p.decay_groups > 0.0) {
        return floor;
    }
    let h = accepted.saturating_sub(p.probation_groups) as f64;
    (p.decay_groups / (p.decay_groups + h)).clamp(floor, 1.0)
}

/// How many lies a worker checked at `rate` gets accepted before the first one is checked
/// (and it is caught), with probability at least `confidence`: the smallest `k` with
/// `(1 − rate)^k ≤ 1 − confidence`. 0 at rate 1 (every group checked); `u64::MAX` at rate 0.
/// At the 5 % floor and 95 % confidence: 59.
pub fn forged_bound(rate: f64, confidence: f64) -> u64 {
    if !(rate.is_finite() && confidence.is_finite()) || rate <= 0.0 {
        return u64::MAX;
    }
    if rate >= 1.0 || confidence <= 0.0 {
        return 0;
    }
    let miss = 1.0 - confidence.min(1.0 - 1e-12);
    let k = (miss.ln() / (1.0 - rate).ln()).ceil();
    if k.is_finite() && k >= 0.0 {
        k as u64
    } else {
        u64::MAX
    }
}

/// What the learner verified of one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerHistory {
    /// Groups that passed every verification layer.
    pub accepted: u64,
    /// Groups refused by a layer.
    pub rejected: u64,
    /// Sequence numbers it skipped for good ([`SeqGaps`]).
    pub skipped: u64,
    /// Distinct versions its accepted groups were made under (counted as the highest version
    /// accepted rises: cycling between two versions counts them once).
    pub versions: u64,
    /// The highest version of its accepted groups.
    pub highest_version: Option<u64>,
    /// When its first group was accepted (the learner's clock, ms).
    pub first_accepted_ms: Option<u64>,
}

/// The histories of the workers the learner verified groups of, at most `cap` of them.
/// Forgetting is always safe: a forgotten worker is new again (on probation, fully checked),
/// so when the map is full it is cleared rather than trimmed by some order a worker could
/// steer.
#[derive(Debug, Clone)]
pub struct Standings<K> {
    params: ProbationParams,
    peers: HashMap<K, PeerHistory>,
    cap: usize,
}

/// Workers whose history [`Standings`] keeps at most.
pub const MAX_STANDINGS: usize = 65_536;

impl<K: Hash + Eq + Clone> Standings<K> {
    pub fn new(params: ProbationParams) -> Self {
        Self::with_cap(params, MAX_STANDINGS)
    }

    pub fn with_cap(params: ProbationParams, cap: usize) -> Self {
        Standings {
            params,
            peers: HashMap::new(),
            cap: cap.max(1),
        }
    }

    pub fn params(&self) -> &ProbationParams {
        &self.params
    }

    fn entry(&mut self, peer: &K) -> &mut PeerHistory {
        if !self.peers.contains_key(peer) && self.peers.len() >= self.cap {
            self.peers.clear();
        }
        self.peers.entry(peer.clone()).or_default()
    }

    /// The history of `peer` (all zero for a worker never seen).
    pub fn history(&self, peer: &K) -> PeerHistory {
        self.peers.get(peer).copied().unwrap_or_default()
    }

    /// Records an accepted group of `peer` made under `version`, at `now_ms`.
    pub fn record_accepted(&mut self, peer: &K, version: u64, now_ms: u64) {
        let e = self.entry(peer);
        e.accepted = e.accepted.saturating_add(1);
        e.first_accepted_ms.get_or_insert(now_ms);
        if e.highest_version.is_none_or(|v| version > v) {
            e.highest_version = Some(version);
            e.versions = e.versions.saturating_add(1);
        }
    }

    pub fn record_rejected(&mut self, peer: &K) {
        let e = self.entry(peer);
        e.rejected = e.rejected.saturating_add(1);
    }

    pub fn record_skipped(&mut self, peer: &K, n: u64) {
        if n > 0 {
            let e = self.entry(peer);
            e.skipped = e.skipped.saturating_add(n);
        }
    }

    pub fn on_probation(&self, peer: &K, now_ms: u64) -> bool {
        on_probation(&self.params, &self.history(peer), now_ms)
    }

    /// The check rate of `peer`'s next group ([`check_rate`]).
    pub fn rate(&self, peer: &K, now_ms: u64) -> f64 {
        check_rate(&self.params, &self.history(peer), now_ms)
    }

    /// Drops `peer` (banned: if it ever comes back it starts over).
    pub fn forget(&mut self, peer: &K) {
        self.peers.remove(peer);
    }

    /// Every worker's history.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &PeerHistory)> {
        self.peers.iter()
    }
}

/// The share limits of a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareCaps {
    /// Most of a batch one worker may fill, in (0, 1].
    pub max_peer_share: f64,
    /// Most of a batch the workers on probation may fill together, in [0, 1].
    pub probation_share: f64,
}

impl Default for ShareCaps {
    fn default() -> Self {
        ShareCaps {
            max_peer_share: 0.5,
            probation_share: 0.25,
        }
    }
}

/// Groups per batch: at most `per_peer` from one worker and `probation` from all workers on
/// probation together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchQuota {
    pub per_peer: usize,
    pub probation: usize,
}

/// The quota of a batch of `b` groups when `established_active` workers past probation are
/// active and `established_offering` of them have groups to offer now (see the module doc):
/// - per worker `⌈max_peer_share·b⌉` (at least 1), raised to `⌈b/k⌉` when only
///   `k = established_offering` established workers can supply (a swarm of one or two
///   workers must still fill its batches);
/// - all probation workers together `⌊probation_share·b⌋`, or the whole batch while no
///   established worker is active (a swarm that is just starting has only new workers).
pub fn batch_quota(
    b: usize,
    caps: ShareCaps,
    established_active: usize,
    established_offering: usize,
) -> BatchQuota {
    let share = |s: f64, round_up: bool| -> usize {
        if !s.is_finite() || s <= 0.0 {
            return 0;
        }
        let x = s.min(1.0) * b as f64;
        let n = if round_up { x.ceil() } else { x.floor() };
        (n as usize).min(b)
    };
    let liveness = b.div_ceil(established_offering.max(1));
    let per_peer = share(caps.max_peer_share, true).max(1).max(liveness).min(b);
    let probation = if established_active == 0 {
        b
    } else {
        share(caps.probation_share, false)
    };
    BatchQuota {
        per_peer,
        probation,
    }
}

/// One group the learner could put in a batch: its worker (an index the caller assigns),
/// whether that worker is on probation, and how many of the learner's recently trained groups
/// were that worker's (the long-run tie-break of [`compose_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub peer: usize,
    pub probation: bool,
    pub recent: u32,
}

/// Picks up to `want` of `candidates` (in the caller's order of preference: freshest first)
/// without exceeding `quota`, counting `taken` (groups already in the batch) against it.
/// Returns the indices picked, in ascending order.
///
/// Fair before fresh: the batch is filled level by level — first one group from every worker
/// that offers any (each worker's most preferred), then a second from each, and so on up to
/// `quota.per_peer` — rather than by walking the preference order alone. Every admissible
/// group is usable (the staleness window and the importance weights cover its age), but a
/// pure freshest-first walk hands most of every batch to whichever worker holds each new
/// version first: the head of a chain, or the parent of a slow subtree, or a forwarder that
/// slows its children on purpose (`slow_forwarder`, `docs/adversary.md`). Levels bound each
/// worker to its fair part of a batch whenever the others have groups to offer, and fall back
/// to the per-peer quota only when they do not.
///
/// Within a level the workers with fewer recently trained groups (`Candidate::recent`) go
/// first, then the preference order: a batch of B groups from k < B workers has B mod k seats
/// past the even levels, and without the tie-break the freshest worker would take them in
/// every batch (measured: `slow_forwarder` 0.34 of the trained groups with 3 workers and
/// B = 4). With it the extra seats rotate, so over a run each worker that keeps offering
/// groups gets about 1/k of them.
pub fn compose_batch(
    candidates: &[Candidate],
    want: usize,
    quota: BatchQuota,
    taken: &[Candidate],
) -> Vec<usize> {
    let mut per_peer: HashMap<usize, usize> = HashMap::new();
    let mut probation = 0usize;
    for t in taken {
        *per_peer.entry(t.peer).or_default() += 1;
        probation += usize::from(t.probation);
    }
    let mut picked = vec![false; candidates.len()];
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| candidates[i].recent);
    let mut out = Vec::new();
    for level in 1..=quota.per_peer {
        for &i in &order {
            let c = &candidates[i];
            if out.len() >= want {
                break;
            }
            let n = per_peer.entry(c.peer).or_default();
            if picked[i] || *n >= level || (c.probation && probation >= quota.probation) {
                continue;
            }
            *n += 1;
            probation += usize::from(c.probation);
            picked[i] = true;
            out.push(i);
        }
    }
    out.sort_unstable();
    out
}

/// Largest part of a buffer of `target` groups one worker's pulls may hold (buffered plus
/// asked in flight): `⌈max_peer_share·target⌉`, at least 1, or all of it when it is the only
/// active worker. Keeps the buffer mixed so that [`compose_batch`] rarely has to relax.
pub fn pull_share(target: u64, max_peer_share: f64, active_workers: usize) -> u64 {
    if active_workers <= 1 || !max_peer_share.is_finite() || max_peer_share >= 1.0 {
        return target;
    }
    ((max_peer_share.max(0.0) * target as f64).ceil() as u64).clamp(1, target.max(1))
}

/// A tolerance and sampling margin a worker's checks are judged with: the bound on
/// `|reported − recomputed|` log-prob and the margin δ on cumulative masses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    pub tolerance: f64,
    pub delta: f64,
}

/// What the learner measured of one worker's sampling over its checked groups.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MarginEvidence {
    /// Groups checked.
    pub groups: u64,
    /// Sampled tokens whose draw was checked.
    pub tokens: u64,
    /// Of those, tokens the margins admitted that the exact window (no margin) does not.
    pub band_tokens: u64,
    /// The largest `|reported − recomputed|` log-prob seen in a checked group that passed.
    pub max_spread: f64,
}

impl MarginEvidence {
    /// Adds one checked group's figures.
    pub fn record(&mut self, tokens: u64, band_tokens: u64, spread: f64) {
        self.groups += 1;
        self.tokens += tokens;
        self.band_tokens += band_tokens;
        if spread.is_finite() {
            self.max_spread = self.max_spread.max(spread);
        }
    }
}

/// How margins are earned ([`earned_margin`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MarginRule {
    /// The tolerance earned is this many times the largest spread measured (the defaults of
    /// `learner::verdict` are 3× the measured spreads of f16).
    pub spread_factor: f64,
    /// Checked tokens before the band rate is judged.
    pub min_band_tokens: u64,
    /// The rate of tokens in the margin band an honest sampler stays below (plus three
    /// binomial standard deviations).
    pub band_rate: f64,
}

impl Default for MarginRule {
    fn default() -> Self {
        MarginRule {
            spread_factor: 3.0,
            min_band_tokens: 200,
            band_rate: 0.05,
        }
    }
}

/// Whether `ev` shows more tokens in the margin band than an honest sampler puts there:
/// `band > rate·n + 3·sqrt(rate·(1 − rate)·n)` over at least `min_band_tokens` tokens.
pub fn band_exceeded(rule: &MarginRule, ev: &MarginEvidence) -> bool {
    if ev.tokens < rule.min_band_tokens.max(1) {
        return false;
    }
    let r = rule.band_rate.clamp(0.0, 1.0);
    let n = ev.tokens as f64;
    ev.band_tokens as f64 > r * n + 3.0 * (r * (1.0 - r) * n).sqrt()
}

/// The margins one group of a worker is judged with, between `floor` (the tightest any
/// sampler meets: f32's) and `ceiling` (the widest its claimed dtype allows):
/// - the tolerance and δ are `spread_factor ×` the largest log-prob spread measured — over
///   its checked groups and this group's own `group_spread` (an honest group's own numeric
///   error widens its window as much as it needs) — each clamped to `[floor, ceiling]`;
/// - a worker whose tokens sit in the margin band more often than an honest sampler's
///   ([`band_exceeded`]) earns nothing: the floor.
///
/// So a new identity starts at the floor and widens only with measured spread: a "bf16"
/// worker whose log-probs match the learner's to 1e-6 is judged as the f32 sampler it is.
pub fn earned_margin(
    rule: &MarginRule,
    floor: Margin,
    ceiling: Margin,
    ev: &MarginEvidence,
    group_spread: f64,
) -> Margin {
    let ceiling = Margin {
        tolerance: ceiling.tolerance.max(floor.tolerance),
        delta: ceiling.delta.max(floor.delta),
    };
    if band_exceeded(rule, ev) || !(floor.tolerance > 0.0 && floor.delta > 0.0) {
        return floor;
    }
    let finite = |x: f64| if x.is_finite() { x.max(0.0) } else { 0.0 };
    let spread = finite(ev.max_spread).max(finite(group_spread));
    // Both scale with the spread: an honest sampler's cumulative-mass spread stays below its
    // log-prob spread (f16 on the CPU: 0.0165 against 0.066), so 3× the one covers the other.
    let earned = rule.spread_factor * spread;
    Margin {
        tolerance: earned.clamp(floor.tolerance, ceiling.tolerance),
        delta: earned.clamp(floor.delta, ceiling.delta),
    }
}

/// The rule that prices a new identity's proof of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowPricing {
    /// Identities admitted within [`PowPricing::window_secs`] that cost no surcharge.
    pub free_young: u64,
    /// How far back an admission counts as recent.
    pub window_secs: u64,
    /// Most bits the surcharge adds.
    pub max_surcharge: u32,
}

impl Default for PowPricing {
    fn default() -> Self {
        PowPricing {
            free_young: 4,
            window_secs: DEFAULT_PROBATION_SECS,
            max_surcharge: 16,
        }
    }
}

/// The bits of work a new identity must prove when `base_bits` are asked and `recent` new
/// identities were admitted within the window: `base + min(max, recent − free)` — each young
/// identity beyond the free allowance doubles the next one's price. No surcharge when no work
/// is asked at all (`base_bits = 0`: an open swarm without work has nothing to price).
pub fn pow_price(p: &PowPricing, base_bits: u32, recent: u64) -> u32 {
    if base_bits == 0 {
        return 0;
    }
    let extra = recent
        .saturating_sub(p.free_young)
        .min(u64::from(p.max_surcharge)) as u32;
    base_bits.saturating_add(extra).min(64)
}

/// Numbers below the highest seen that are still missing more than this far behind it are
/// counted as skipped: pulls serve the freshest groups first, so numbers arrive out of order
/// within a few leases, never hundreds behind.
pub const SKIP_HORIZON: u64 = 256;
/// Open gaps remembered per worker; a jump beyond it counts the excess as skipped at once.
pub const MAX_OPEN_GAPS: usize = 4096;

/// The gaps in one worker's group numbers, as the learner sees them arrive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqGaps {
    highest: Option<u64>,
    open: BTreeSet<u64>,
    skipped: u64,
}

impl SeqGaps {
    /// Records number `seq`; returns how many numbers became skipped for good with it.
    /// Numbers before the first one seen are not counted (the learner may meet a worker
    /// mid-sequence, after its own restart).
    pub fn see(&mut self, seq: u64) -> u64 {
        let Some(high) = self.highest else {
            self.highest = Some(seq);
            return 0;
        };
        let mut newly = 0u64;
        if seq > high {
            let jump = seq - high - 1;
            let room = (MAX_OPEN_GAPS - self.open.len().min(MAX_OPEN_GAPS)) as u64;
            let kept = jump.min(room);
            // The numbers right below `seq` are the likeliest to come late; keep those open.
            self.open.extend((seq - kept)..seq);
            newly += jump - kept;
            self.highest = Some(seq);
        } else {
            self.open.remove(&seq);
        }
        let limit = self.highest.unwrap_or(0).saturating_sub(SKIP_HORIZON);
        let keep = self.open.split_off(&limit);
        newly += self.open.len() as u64;
        self.open = keep;
        self.skipped = self.skipped.saturating_add(newly);
        newly
    }

    /// Numbers skipped for good so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Numbers below the highest seen and still missing (may yet arrive).
    pub fn open(&self) -> u64 {
        self.open.len() as u64
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
