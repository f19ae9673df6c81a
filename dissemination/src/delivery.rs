//! What a chain child records of its planned parent's delivery of each version, and the
//! receipt it issues from that (`p2p::DeliveryReceipt`, `docs/protocol.md`, "Delivery
//! receipt"; the learner's reading of it is `control::forwarding`).
//!
//! A record is opened when the child accepts a version's manifest, follows the plan's parent
//! for that version, counts the hello and the verified chunk bytes that parent pushed, and is
//! closed when the child installs the version or gives it up for a newer one. Its receipt is
//! issued once the record is closed and the parent's push of the version is over — or, if the
//! parent said nothing, once the horizon (a quarter of the stall timeout) has passed since
//! acceptance: an honest parent sends its hello when it accepts the manifest, before any data
//! and unpaced, so however slow its link it has said it by then (at once if it said hello for
//! a newer version) — and at three horizons whatever its state.
//!
//! Owns: the records and when a receipt is due. Must not touch: signing (the node's key is
//! the node's: `node` signs what [`Records::receipts`] returns), the wire, the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use p2p::{DeliveryReceipt, PeerId, MAX_HEARTBEAT_RECEIPTS, RECEIPT_VERSION};

/// Versions whose records are kept (the newest).
const KEEP: usize = 8;

/// Senders of hellos remembered per version (an honest swarm sends one: the planned parent's;
/// a few more after plan changes).
const HEARD_MAX: usize = 4;

/// One version's delivery from the planned parent.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    accepted: Instant,
    /// The plan's parent for this version, when it is a worker (first hops' parent is the
    /// learner, which is not judged by receipts).
    pub(crate) parent: Option<PeerId>,
    /// Chunks and bytes missing when the acquisition began.
    pub(crate) needed: usize,
    wanted_at_start: u64,
    /// Bytes the child asked the parent for in its reply to the hello.
    wanted_at_hello: Option<u64>,
    hello: Option<Instant>,
    /// Every peer whose hello for this version arrived, planned parent or not, the learner
    /// included (at most [`HEARD_MAX`]): whether the feed spoke is asked of this, not of
    /// `hello`, because a hello can come before the acquirer has read the plan that names its
    /// sender, and a first hop's parent — the learner — is no `parent` here.
    heard: Vec<PeerId>,
    /// The parent's push of this version ended (its end frame, or the stream broke).
    push_done: bool,
    pub(crate) fed_chunks: usize,
    /// Bytes of the first copy of each chunk counted from the parent (`counted`): at most
    /// what it was asked for.
    bytes: u64,
    counted: BTreeSet<usize>,
    /// Bytes the parent pushed that were not asked for or came again (its protocol errors).
    duplicates: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    end: Option<(Instant, bool)>,
}

impl Record {
    fn new(accepted: Instant) -> Self {
        Record {
            accepted,
            parent: None,
            needed: 0,
            wanted_at_start: 0,
            wanted_at_hello: None,
            hello: None,
            heard: Vec::new(),
            push_done: false,
            fed_chunks: 0,
            bytes: 0,
            counted: BTreeSet::new(),
            duplicates: 0,
            first: None,
            last: None,
            end: None,
        }
    }
}

/// The records of the newest versions.
#[derive(Debug)]
pub(crate) struct Records {
    by_version: BTreeMap<u64, Record>,
    horizon: Duration,
}

impl Records {
    /// `horizon`: the least time between accepting a version and issuing its receipt.
    pub(crate) fn new(horizon: Duration) -> Self {
        Records {
            by_version: BTreeMap::new(),
            horizon,
        }
    }

    /// The child accepted `version`'s manifest at `now`.
    pub(crate) fn accepted(&mut self, version: u64, now: Instant) {
        self.by_version
            .entry(version)
            .or_insert_with(|| Record::new(now));
        while self.by_version.len() > KEEP {
            self.by_version.pop_first();
        }
    }

    /// The acquisition of `version` began with `chunks` chunks (`bytes` bytes) missing, the
    /// plan naming `parent`. Only the first call counts for what was missing. A plan that
    /// names another parent than the one recorded starts that parent's account afresh: what
    /// the old one sent is not the new one's delivery.
    pub(crate) fn began(
        &mut self,
        version: u64,
        parent: Option<PeerId>,
        chunks: usize,
        bytes: u64,
    ) {
        if let Some(r) = self.by_version.get_mut(&version) {
            if r.needed == 0 && r.wanted_at_start == 0 {
                r.needed = chunks;
                r.wanted_at_start = bytes;
            }
            if r.parent.is_some() && r.parent != parent {
                r.wanted_at_hello = None;
                r.hello = None;
                r.push_done = false;
                r.fed_chunks = 0;
                r.bytes = 0;
                r.counted.clear();
                r.duplicates = 0;
                r.first = None;
                r.last = None;
            }
            r.parent = parent;
        }
    }

    /// A hello for `version` from `peer` arrived at `now`; the child asked it for `wanted`
    /// bytes. Counted only from the planned parent.
    /// The record is opened here if the acquirer has not opened it yet: the hello's manifest
    /// may be accepted (the same one, from gossip) a moment before that acquirer starts, and a
    /// hello dropped then left the node waiting for one that had come.
    pub(crate) fn hello(&mut self, version: u64, peer: PeerId, wanted: u64, now: Instant) {
        self.accepted(version, now);
        if let Some(r) = self.by_version.get_mut(&version) {
            if r.heard.len() < HEARD_MAX && !r.heard.contains(&peer) {
                r.heard.push(peer);
            }
        }
        if let Some(r) = self
            .by_version
            .get_mut(&version)
            .filter(|r| r.parent == Some(peer))
        {
            r.hello.get_or_insert(now);
            r.wanted_at_hello.get_or_insert(wanted);
        }
    }

    /// The planned parent `peer`'s push of `version` ended (complete or broken).
    pub(crate) fn push_ended(&mut self, version: u64, peer: PeerId) {
        if let Some(r) = self
            .by_version
            .get_mut(&version)
            .filter(|r| r.parent == Some(peer))
        {
            r.push_done = true;
        }
    }

    /// Bytes the planned parent pushed of `version`, and how long ago its first chunk came.
    pub(crate) fn fed(&self, version: u64, now: Instant) -> (u64, Option<Duration>) {
        self.by_version.get(&version).map_or((0, None), |r| {
            (r.bytes, r.first.map(|f| now.saturating_duration_since(f)))
        })
    }

    /// How long to wait for the planned parent's hello for the next version
    /// ([`adaptive_hello_wait`] over the hello delays of the versions kept).
    pub(crate) fn hello_wait(&self, cap: Duration) -> Duration {
        adaptive_hello_wait(&self.hello_delays(), cap)
    }

    /// Whether enough of the planned parents' hellos were timed for a missing one to be news
    /// ([`adaptive_hello_wait`] follows them): then a parent still silent after the wait is
    /// asked for chunks last (`engine::fetch::holders_in_order`). Before that — a new node, the
    /// first versions — its silence may be a push stream still opening on a cold link while
    /// it already holds chunks, and it is asked where the plan puts it.
    pub(crate) fn hellos_timed(&self) -> bool {
        self.hello_delays().len() >= HELLO_SAMPLES
    }

    /// Accepting a manifest → the planned parent's hello, for the versions kept that had one.
    fn hello_delays(&self) -> Vec<Duration> {
        self.by_version
            .values()
            .filter_map(|r| Some(r.hello?.saturating_duration_since(r.accepted)))
            .collect()
    }

    /// Whether `peer`'s hello for `version` arrived (recorded whoever the plan named then).
    pub(crate) fn heard(&self, version: u64, peer: &PeerId) -> bool {
        self.by_version
            .get(&version)
            .is_some_and(|r| r.heard.contains(peer))
    }

    /// Verified chunk `index` (`len` bytes) of `version` arrived on `peer`'s push at `now`.
    /// Only the first copy of a chunk counts; another copy from the same parent (a later
    /// transfer that pushed it again) counts as a duplicate.
    pub(crate) fn chunk(
        &mut self,
        version: u64,
        peer: PeerId,
        index: usize,
        len: u64,
        now: Instant,
    ) {
        if let Some(r) = self
            .by_version
            .get_mut(&version)
            .filter(|r| r.parent == Some(peer))
        {
            if !r.counted.insert(index) {
                r.duplicates += len;
                return;
            }
            r.fed_chunks += 1;
            r.bytes += len;
            r.first.get_or_insert(now);
            r.last = Some(now);
        }
    }

    /// `peer` pushed `len` bytes of `version` that the child had not asked for in this
    /// transfer, or had already received in it ([`PushTally`]): noted in the receipt when
    /// `peer` is the planned parent.
    pub(crate) fn duplicate(&mut self, version: u64, peer: PeerId, len: u64) {
        if let Some(r) = self
            .by_version
            .get_mut(&version)
            .filter(|r| r.parent == Some(peer))
        {
            r.duplicates += len;
        }
    }

    /// The child stopped needing `version` at `now` (`installed`, or gave it up). Returns the
    /// record (the parent and what it fed, for the node's patience).
    pub(crate) fn ended(&mut self, version: u64, installed: bool, now: Instant) -> Option<&Record> {
        let r = self.by_version.get_mut(&version)?;
        r.end.get_or_insert((now, installed));
        Some(r)
    }

    /// The receipts due at `now`, newest version first, at most
    /// [`MAX_HEARTBEAT_RECEIPTS`] (unsigned).
    pub(crate) fn receipts(&self, now: Instant) -> Vec<DeliveryReceipt> {
        let ms =
            |r: &Record, t: Instant| t.saturating_duration_since(r.accepted).as_millis() as u64;
        self.by_version
            .iter()
            .rev()
            .filter_map(|(&version, r)| {
                let parent = r.parent?;
                let age = now.saturating_duration_since(r.accepted);
                // Spoke: a hello for this or a newer version from the same parent.
                let spoke = self
                    .by_version
                    .range(version..)
                    .any(|(_, n)| n.parent == Some(parent) && n.hello.is_some());
                // Once the child is done with the version: when the parent's push is over (a
                // slow push is judged on all it sent), or at the horizon if it said nothing
                // (at once if it spoke for a newer version); at three horizons in any case.
                let settled = if r.hello.is_some() {
                    r.push_done
                } else {
                    spoke || age >= self.horizon
                };
                let due = (r.end.is_some() && settled) || age >= self.horizon * 3;
                if !due {
                    return None;
                }
                let (end, installed) = r.end.unwrap_or((now, false));
                Some(DeliveryReceipt {
                    v: RECEIPT_VERSION,
                    version,
                    parent: parent.to_string(),
                    wanted: r.wanted_at_hello.unwrap_or(r.wanted_at_start),
                    bytes: r.bytes,
                    duplicates: r.duplicates,
                    spoke,
                    hello_ms: r.hello.map(|t| ms(r, t)),
                    first_ms: r.first.map(|t| ms(r, t)),
                    last_ms: r.last.map(|t| ms(r, t)),
                    end_ms: ms(r, end),
                    installed,
                    sig: String::new(),
                })
            })
            .take(MAX_HEARTBEAT_RECEIPTS)
            .collect()
    }
}

/// What one copy of a pushed chunk is, against the child's reply to the transfer's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The first copy of a chunk the child asked for: counted.
    First,
    /// A chunk already received in this transfer.
    Again,
    /// A chunk the child's bitmap said it held (or out of range).
    Unasked,
}

/// One transfer's chunks against what the child asked for: an honest parent pushes each
/// chunk the child's reply lacked, once. Anything else is the parent's protocol error — it
/// read the bitmap — and is never counted as delivered (`docs/protocol.md`, "Chunk stream").
#[derive(Debug, Clone)]
pub(crate) struct PushTally {
    asked: Vec<bool>,
    seen: Vec<bool>,
}

impl PushTally {
    /// `asked[i]`: the child's reply lacked chunk `i`.
    pub(crate) fn new(asked: Vec<bool>) -> Self {
        let seen = vec![false; asked.len()];
        PushTally { asked, seen }
    }

    /// The next chunk header named `index`.
    pub(crate) fn take(&mut self, index: usize) -> Pushed {
        if !self.asked.get(index).copied().unwrap_or(false) {
            return Pushed::Unasked;
        }
        if std::mem::replace(&mut self.seen[index], true) {
            return Pushed::Again;
        }
        Pushed::First
    }
}

/// The least a chain member waits for its parent's hello ([`adaptive_hello_wait`]): a few
/// scheduler ticks on a loaded host, so that a parent whose hello is a moment late is not
/// repaired around.
pub(crate) const HELLO_WAIT_FLOOR: Duration = Duration::from_millis(25);

/// Hello delays needed before the wait follows them instead of `cap`.
const HELLO_SAMPLES: usize = 3;

/// How long a chain member waits for its planned parent's hello before it repairs: four times
/// the median delay between accepting a version's manifest and that parent's hello over the
/// recent versions (`delays`), at least [`HELLO_WAIT_FLOOR`], at most `cap` (the fixed share
/// of the stall timeout, `transfer::HELLO_WAIT_SHARE`); `cap` until [`HELLO_SAMPLES`] hellos
/// have been timed.
///
/// Why: an honest parent sends its hello the moment it accepts the manifest, so the delay is
/// one gossip hop's difference plus half a round trip, and it is steady. A fixed 250 ms was
/// 50–100 × the delay on a LAN or loopback, and a parent that froze (a stopped process, a
/// host swapping) held its child — and everyone below — for that long on every version it
/// missed: with the learner publishing every 0.1 s and S = 3, longer than a version stays
/// admissible (`docs/experiments.md`, "Faults", the frozen head). Four medians is past the
/// tail of a steady delay; a hello that is later still costs a batch of chunks fetched twice.
/// Versions whose parent never said hello are not in `delays`: a silent parent does not
/// lengthen the wait for the next one.
pub(crate) fn adaptive_hello_wait(delays: &[Duration], cap: Duration) -> Duration {
    if delays.len() < HELLO_SAMPLES {
        return cap;
    }
    let mut d = delays.to_vec();
    d.sort_unstable();
    let median = d[d.len() / 2];
    median
        .saturating_mul(4)
        .clamp(HELLO_WAIT_FLOOR.min(cap), cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(5);

    fn peer(i: u8) -> PeerId {
        p2p::peer_id_from_seed([i; 32])
    }

    #[test]
    fn a_receipt_counts_the_planned_parents_hello_and_bytes_once_due() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = Records::new(H);
        r.accepted(4, t0);
        r.began(4, Some(peer(1)), 4, 4000);
        r.hello(4, peer(1), 3000, t0 + ms(10));
        // Another peer's push (an old parent, a stranger) is not this parent's delivery.
        r.chunk(4, peer(2), 0, 1000, t0 + ms(15));
        r.chunk(4, peer(1), 0, 1000, t0 + ms(20));
        r.chunk(4, peer(1), 1, 1000, t0 + ms(40));
        assert!(r.receipts(t0 + ms(50)).is_empty(), "not closed, not due");
        let rec = r.ended(4, true, t0 + ms(60)).unwrap();
        assert_eq!((rec.needed, rec.fed_chunks), (4, 2));
        assert!(r.receipts(t0 + ms(61)).is_empty(), "the push goes on");
        r.push_ended(4, peer(2));
        assert!(r.receipts(t0 + ms(61)).is_empty(), "another peer's push");
        r.push_ended(4, peer(1));
        let got = r.receipts(t0 + ms(61));
        assert_eq!(got.len(), 1);
        let g = &got[0];
        assert_eq!((g.version, g.wanted, g.bytes), (4, 3000, 2000));
        assert_eq!((g.first_ms, g.last_ms, g.end_ms), (Some(20), Some(40), 60));
        assert!(g.spoke && g.installed);
        assert_eq!(g.hello_ms, Some(10));
        assert_eq!(g.parent, peer(1).to_string());
    }

    #[test]
    fn a_parent_that_pushes_chunks_again_never_inflates_the_bytes_delivered() {
        let t0 = Instant::now();
        let mut r = Records::new(H);
        r.accepted(4, t0);
        r.began(4, Some(peer(1)), 3, 3000);
        r.hello(4, peer(1), 3000, t0);
        // Every chunk three times (over transfers that were asked for them again), and a
        // chunk the child never asked for in a transfer, noted by the stream's tally.
        for _ in 0..3 {
            for i in 0..3 {
                r.chunk(4, peer(1), i, 1000, t0);
            }
        }
        r.duplicate(4, peer(1), 1000);
        // Another pusher's copies are not the planned parent's, either way.
        r.chunk(4, peer(2), 0, 1000, t0);
        r.duplicate(4, peer(2), 1000);
        r.ended(4, true, t0);
        r.push_ended(4, peer(1));
        let g = &r.receipts(t0 + H)[0];
        assert_eq!((g.wanted, g.bytes, g.duplicates), (3000, 3000, 7000));
        assert!(g.bytes <= g.wanted);
    }

    #[test]
    fn a_new_parent_for_a_version_starts_its_account_afresh() {
        let t0 = Instant::now();
        let mut r = Records::new(H);
        r.accepted(4, t0);
        r.began(4, Some(peer(1)), 4, 4000);
        r.hello(4, peer(1), 1000, t0);
        r.chunk(4, peer(1), 0, 1000, t0);
        // The plan was re-signed with another parent: what the first sent is not its.
        r.began(4, Some(peer(2)), 3, 3000);
        r.hello(4, peer(2), 3000, t0);
        for i in 1..4 {
            r.chunk(4, peer(2), i, 1000, t0);
        }
        r.ended(4, true, t0);
        r.push_ended(4, peer(2));
        let g = &r.receipts(t0 + H)[0];
        assert_eq!(g.parent, peer(2).to_string());
        assert_eq!((g.wanted, g.bytes, g.duplicates), (3000, 3000, 0));
    }

    #[test]
    fn a_push_tally_counts_each_asked_chunk_once() {
        let mut t = PushTally::new(vec![true, false, true]);
        assert_eq!(t.take(0), Pushed::First);
        assert_eq!(t.take(0), Pushed::Again);
        assert_eq!(t.take(1), Pushed::Unasked, "the bitmap said it was held");
        assert_eq!(t.take(7), Pushed::Unasked, "out of range");
        assert_eq!(t.take(2), Pushed::First);
    }

    #[test]
    fn every_hello_is_heard_also_the_learners_and_one_before_the_record() {
        let t0 = Instant::now();
        let mut r = Records::new(H);
        // The hello's manifest was accepted from gossip; the acquirer has not opened the
        // record yet when the hello is answered.
        r.hello(7, peer(9), 100, t0);
        r.accepted(7, t0);
        r.began(7, None, 1, 100);
        assert!(r.heard(7, &peer(9)), "the hello before the record");
        assert!(!r.heard(7, &peer(1)) && !r.heard(6, &peer(9)));
        // A first hop's parent is the learner, which is no `parent` of the record.
        r.accepted(8, t0);
        r.began(8, None, 1, 100);
        r.hello(8, peer(9), 100, t0);
        assert!(r.heard(8, &peer(9)));
        // Bounded: a few senders per version.
        for i in 0..2 * HEARD_MAX as u8 {
            r.hello(8, peer(20 + i), 100, t0);
        }
        assert_eq!(r.by_version[&8].heard.len(), HEARD_MAX);
    }

    #[test]
    fn a_silent_parent_gets_a_receipt_of_nothing_and_the_learner_none() {
        let t0 = Instant::now();
        let mut r = Records::new(H);
        r.accepted(1, t0);
        r.began(1, Some(peer(1)), 2, 2000);
        // A first hop: fed by the learner, no receipt.
        r.accepted(2, t0);
        r.began(2, None, 2, 2000);
        // Never closed: due at three horizons all the same.
        assert!(r.receipts(t0 + H * 2).is_empty());
        let got = r.receipts(t0 + H * 3);
        assert_eq!(got.len(), 1);
        let g = &got[0];
        assert_eq!((g.version, g.wanted, g.bytes), (1, 2000, 0));
        assert!(g.hello_ms.is_none() && !g.spoke && !g.installed);
        assert_eq!(g.end_ms, (H * 3).as_millis() as u64);
        // A hello only for a newer version from the same parent: it spoke.
        r.accepted(3, t0);
        r.began(3, Some(peer(1)), 2, 2000);
        r.hello(3, peer(1), 2000, t0);
        let got = r.receipts(t0 + H * 3);
        let old = got.iter().find(|g| g.version == 1).unwrap();
        assert!(old.hello_ms.is_none() && old.spoke);
        // Closed without a word from its parent: due at the horizon, not before.
        let mut q = Records::new(H);
        q.accepted(5, t0);
        q.began(5, Some(peer(1)), 2, 2000);
        q.ended(5, true, t0);
        assert!(q.receipts(t0 + H / 2).is_empty());
        assert_eq!(q.receipts(t0 + H).len(), 1);
    }

    #[test]
    fn only_the_newest_versions_are_kept_and_reported() {
        let t0 = Instant::now();
        let mut r = Records::new(H);
        for v in 0..20 {
            r.accepted(v, t0);
            r.began(v, Some(peer(1)), 1, 100);
            r.ended(v, true, t0);
        }
        let got = r.receipts(t0 + H);
        let versions: Vec<u64> = got.iter().map(|g| g.version).collect();
        assert_eq!(versions, [19, 18, 17]);
        assert_eq!(
            r.by_version.keys().next(),
            Some(&12),
            "the newest {KEEP} kept"
        );
    }

    #[test]
    fn the_hello_wait_follows_the_parents_recent_hello_delays() {
        let ms = Duration::from_millis;
        let cap = ms(250);
        // Too few hellos timed: the fixed share.
        assert_eq!(adaptive_hello_wait(&[], cap), cap);
        assert_eq!(adaptive_hello_wait(&[ms(2), ms(3)], cap), cap);
        // Four medians, clamped to [floor, cap].
        assert_eq!(adaptive_hello_wait(&[ms(9), ms(10), ms(400)], cap), ms(40));
        assert_eq!(
            adaptive_hello_wait(&[ms(1), ms(1), ms(2)], cap),
            HELLO_WAIT_FLOOR
        );
        assert_eq!(adaptive_hello_wait(&[ms(80), ms(90), ms(100)], cap), cap);
        // A cap under the floor (a tiny stall timeout) wins.
        assert_eq!(adaptive_hello_wait(&[ms(1); 5], ms(10)), ms(10));

        // From the records: only versions whose planned parent said hello count.
        let t0 = Instant::now();
        let mut r = Records::new(H);
        for v in 0..4u64 {
            r.accepted(v, t0);
            r.began(v, Some(peer(1)), 1, 100);
            r.hello(v, peer(1), 100, t0 + ms(5 + v));
        }
        // Another peer's hello and a version with no hello at all change nothing.
        r.accepted(4, t0);
        r.began(4, Some(peer(1)), 1, 100);
        r.hello(4, peer(2), 100, t0 + ms(900));
        assert_eq!(r.hello_wait(cap), ms(28), "4 × the median of 5, 6, 7, 8 ms");
        assert!(r.hellos_timed());
        let mut new = Records::new(H);
        for v in 0..2u64 {
            new.accepted(v, t0);
            new.began(v, Some(peer(1)), 1, 100);
            new.hello(v, peer(1), 100, t0 + ms(5));
        }
        assert!(!new.hellos_timed(), "two hellos are not enough");
        assert_eq!(new.hello_wait(cap), cap);
    }
}
