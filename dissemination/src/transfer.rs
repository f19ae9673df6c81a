//! The per-version transfer state of a receiving node, as a pure state machine: which chunks
//! of snapshot `version` are held (verified and stored) and which are missing, how this node
//! is fed (a chain parent, or fetch-only), which peers served a corrupt chunk, and the
//! decisions taken from that — report progress, repair from other holders after a stall,
//! install once complete, stop when superseded (`docs/broadcast.md`, "Repair" and "Install").
//!
//! **Superseded.** A version this node installed (or a newer one) ends the transfer. A newer
//! *manifest* ends it too — the node wants the newest weights — except for a fetch-only
//! transfer that has already stored chunks: that one keeps going ([`Transfer::keeps_going`])
//! until it completes, or until [`MAX_FRUITLESS_REPAIRS`] repair rounds in a row fetched
//! nothing (its holders dropped it). A node that fetches everything (fetch-only, or behind a
//! relay) and needs longer per snapshot than the learner's publication period would otherwise
//! abandon every version for the next one and never install any; this way it installs every
//! k-th version. The engine lets only the oldest such transfer fetch
//! ([`Transfer::has_priority`]), so the versions in between do not split its bandwidth.
//!
//! Owns: those decisions, nothing else. Must not touch: I/O of any kind, clocks (the engine
//! feeds inputs and carries out the actions — `engine/install.rs`), verification itself (a
//! chunk reaches [`Input::Held`] only after its BLAKE3 matched the manifest).
//!
//! The shape follows iroh-blobs' download state machine: [`Transfer::apply`] takes one
//! [`Input`] and returns the [`Action`]s the engine must perform, in order.

use std::collections::HashSet;
use std::time::Duration;

use p2p::PeerId;

/// How this node receives the version, from the newest accepted plan for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feed {
    /// No plan for this version yet: wait for a push (a plan usually follows the manifest).
    Unplanned,
    /// A chain member at `position` (0: a first hop): its parent (the learner for a first
    /// hop) pushes every chunk.
    Parent { position: usize },
    /// Named fetch-only by the plan, or not in it at all (a late joiner): nobody pushes, so
    /// fetch from holders at once and keep fetching.
    FetchOnly,
}

/// Why the engine's acquirer woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// No new event: the acquisition just started, or a repair round just ended. Checked
    /// before waiting; never a reason to repair.
    Check,
    /// Some chunk was stored: the feed is making progress.
    Stored,
    /// A chunk stream into this node ended (complete, broken or corrupt): do not wait for
    /// the stall timeout.
    StreamEnded,
    /// [`Transfer::stall_wait`] passed with no chunk stored.
    Timer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// Chunk `index` passed verification and is held; `new` when this node stored it just
    /// now (not already held, e.g. unchanged since an earlier version).
    Held { index: usize, new: bool },
    /// A chunk from `peer` failed verification, or `peer` missed a fetch deadline or broke the
    /// fetch protocol: never ask it again for this version.
    Rejected { peer: PeerId },
    /// The store's view, read when the acquirer wakes: exactly these chunks are missing.
    /// The store is the final word (it holds a chunk once per hash, and drops a chunk file it
    /// finds corrupt), so this overrides what the `Held` inputs said.
    Missing { indices: Vec<usize> },
    /// The newest plan says how this node is fed.
    Plan(Feed),
    /// This or a newer version was installed.
    Superseded,
    /// A newer manifest was accepted (nothing at or past this version installed yet).
    Newer,
    /// A repair round the engine carried out fetched `fetched` chunks.
    Repaired { fetched: usize },
    /// The engine's acquirer for this version returned (installed, stopped, or failed): the
    /// transfer is over whatever its state said.
    Ended,
    /// Whether this node is behind (the engine's reading, [`behind`]): it skipped an accepted
    /// version since its last install, or — fed by a parent — that parent failed it on its
    /// last version ([`FeedStanding`]), or — fetch-only — it has installed nothing yet. A
    /// behind node repairs at once, whatever feeds it, instead of first giving its feed a
    /// wait: when versions come faster than that wait, a wait renewed by every new manifest
    /// would never end (a child of a silent parent installed 0 of 151 versions that way).
    Behind(bool),
    /// Whether the planned parent's hello for this version has arrived.
    Hello(bool),
    /// The acquirer woke up: decide what to do next.
    Woken(Wake),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Report progress to the role: `stored` chunks newly stored so far, of `total`.
    Progress { stored: usize, total: usize },
    /// Fetch the missing chunks ([`Transfer::missing`]) from holders, skipping
    /// [`Transfer::is_bad`] peers.
    Repair,
    /// Every chunk is held: assemble, check the root hash, install.
    Install,
    /// Stop acquiring this version (superseded or installed).
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Acquiring,
    /// `Install` was issued; a `Missing` input naming chunks sends it back to acquiring.
    Installing,
    Stopped,
}

/// Chunks a node fed by a parent asks holders for per fetch during a repair
/// ([`repair_batch`]).
pub(crate) const BEHIND_PUSH_BATCH: usize = 8;

/// Which of the `missing` chunks (in index order) a repair asks the next holder for.
///
/// A node fed by a parent repairs after a stall, but its parent's push may only be slow: deep
/// in a long chain the first chunk comes late (each hop adds a chunk time and a one-way
/// delay), and a lossy hop pauses. The push fills the snapshot from chunk 0 up, so the repair
/// takes the missing chunks from the last one down, [`BEHIND_PUSH_BATCH`] at a time, and the
/// engine looks at the store again between batches: a push that is still coming and the
/// repair meet in the middle instead of receiving the same chunks twice, and the node
/// installs as soon as they meet. A parent that is gone is replaced batch after batch, at
/// holders' speed. In the lab (N = 32, 11 hops, 100 ms RTT), chain tails whose first chunk
/// came just after the 5 s stall timeout fetched all 62 chunks in one request, sharing their
/// downlink with the push that was delivering the same chunks, and installed 6 s after their
/// parents. Nodes nobody pushes to (fetch-only, unplanned) take everything in index order.
pub(crate) fn repair_batch<T>(mut missing: Vec<T>, feed: Feed) -> Vec<T> {
    if let Feed::Parent { .. } = feed {
        missing.reverse();
        missing.truncate(BEHIND_PUSH_BATCH);
    }
    missing
}

/// What a chain member allows per hop above it, beyond the stall timeout, for its first chunk
/// of a version ([`hop_allowance`]): a hop's one-way delay and scheduling, not known here.
pub(crate) const HOP_MARGIN: Duration = Duration::from_millis(250);

/// How much later than its parent a chain member may see its first chunk: two chunk times at
/// the planned per-worker bandwidth `B̂w` (`hop_bytes_per_s`; the parent stores and verifies a
/// whole chunk before forwarding it, then sends it at that rate) plus [`HOP_MARGIN`].
///
/// Why: a chain member counted its stall timeout from the manifest, the same 5 s at every
/// position, but store-and-forward delays the first chunk at position `p` by about
/// `p` hops. At N = 32 (chains of 11, 5 Mbit/s, 128 KiB chunks, 100 ms RTT) the first chunk
/// reached the tails 5–10 s after publication, past their timeout, in every round: they
/// repaired from the back while the push was on its way, their repairs drew on the uplinks
/// of the forwarders ahead of them, and the chains slowed (`docs/netlab.md`). The first wait
/// is therefore [`Transfer::stall_wait`] = stall timeout + `p` × this; once a chunk arrived
/// the plain stall timeout applies.
pub(crate) fn hop_allowance(chunk_bytes: u64, hop_bytes_per_s: f64) -> Duration {
    let chunk_time = if hop_bytes_per_s.is_finite() && hop_bytes_per_s > 0.0 {
        chunk_bytes as f64 / hop_bytes_per_s
    } else {
        0.0
    };
    // A chunk time of a minute or more is no real hop: never wait beyond that per hop.
    Duration::from_secs_f64((2.0 * chunk_time).min(60.0)) + HOP_MARGIN
}

/// Repair rounds in a row that fetched nothing after which a superseded fetch-only transfer
/// gives up (the chunks are no longer held by anyone it can reach).
pub(crate) const MAX_FRUITLESS_REPAIRS: u32 = 3;

/// Whether a node is behind for a transfer of `version` (see [`Input::Behind`]): `installed`
/// is its newest installed version, `older_accepted` whether it accepted a manifest older than
/// `version` and newer than `installed` (a version it skipped), `distrusted` whether the
/// parent feeding it failed its last version ([`FeedStanding::distrusts`]) or is feeding this
/// one too slowly ([`slow_feed`]).
///
/// **Patience per node, not per version.** Each version's transfer gives its parent one stall
/// wait (the stall timeout, plus the hops above for the first chunk). A newer manifest ends a
/// parent-fed transfer; the next one starts *behind* — the node skipped a version — and
/// repairs at once from any holder, so a new manifest never renews the wait. And a parent
/// that failed this node's last version (delivered under a quarter of what it needed) is
/// not waited for again until it delivers, or the plan names another. The bound: a node whose
/// parent stops delivering loses at most **one** version to it — the one it was waiting
/// for, if a newer one is published during that one wait — and waits at most one stall wait
/// (`stall_timeout + position × hop allowance`) per parent; from then on it fetches every
/// version from holders at once, while the learner moves it under another parent
/// (`control::forwarding`).
pub(crate) fn behind(
    feed: Feed,
    installed: Option<u64>,
    older_accepted: bool,
    distrusted: bool,
) -> bool {
    match feed {
        Feed::Unplanned => false,
        Feed::Parent { .. } => older_accepted || distrusted,
        Feed::FetchOnly => installed.is_none() || older_accepted,
    }
}

/// Whether a parent's push is too slow to wait for: since its first chunk, at least three
/// chunk times at the planned rate `B̂w` (and `min`: the hello wait, a twentieth of the stall
/// timeout) have passed and it delivered `bytes` at under a third of `B̂w`. The node then repairs the rest at once, from the back, while the
/// push goes on from the front; it does not wait for a stall (a trickle is no stall) nor lose
/// the version to the next one. An honest parent fed slowly itself looks the same, and its
/// child is right not to wait for it either.
pub(crate) fn slow_feed(
    bytes: u64,
    since_first_chunk: Option<Duration>,
    chunk_bytes: u64,
    bytes_per_s: f64,
    min: Duration,
) -> bool {
    let Some(t) = since_first_chunk else {
        return false;
    };
    if !(bytes_per_s.is_finite() && bytes_per_s > 0.0) {
        return false;
    }
    let chunk_s = chunk_bytes as f64 / bytes_per_s;
    let t = t.as_secs_f64();
    t >= (3.0 * chunk_s).max(min.as_secs_f64()) && (bytes as f64) < t * bytes_per_s / 3.0
}

/// Share of the chunks a version needed that its parent must deliver to keep this node's
/// trust: a quarter. An honest parent whose push meets this node's own repair in the middle
/// delivers about half; one that trickles a chunk per version to look alive delivers a
/// sliver.
pub(crate) const FED_SHARE: f64 = 0.25;

/// Which parent failed this node on its last version, if any (see [`behind`]). The learner is
/// never held here: its uplink is the trust root's, and a first hop that repaired at once
/// would only ask the learner twice for the same chunks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FeedStanding {
    failed: Option<PeerId>,
}

impl FeedStanding {
    /// A version ended (installed, or given up for a newer one): `parent` was the planned
    /// parent (`None`: the learner, or nobody), `needed` chunks were missing when it began,
    /// `fed` of them came on that parent's push.
    pub(crate) fn ended(&mut self, parent: Option<PeerId>, needed: usize, fed: usize) {
        let Some(parent) = parent else { return };
        if needed == 0 {
            return;
        }
        if fed as f64 >= FED_SHARE * needed as f64 {
            if self.failed == Some(parent) {
                self.failed = None;
            }
        } else {
            self.failed = Some(parent);
        }
    }

    /// Whether `parent` failed this node's last version it fed.
    pub(crate) fn distrusts(&self, parent: Option<&PeerId>) -> bool {
        parent.is_some() && self.failed.as_ref() == parent
    }
}

/// One version's transfer state.
#[derive(Debug)]
pub(crate) struct Transfer {
    held: Vec<bool>,
    missing: usize,
    /// Chunks newly stored by this node (the progress count).
    stored: usize,
    bad: HashSet<PeerId>,
    feed: Feed,
    stall: Duration,
    /// Allowance per hop above this node for its first chunk ([`hop_allowance`]).
    hop: Duration,
    phase: Phase,
    /// A newer manifest was accepted.
    newer: bool,
    /// Repair rounds in a row that fetched nothing.
    fruitless: u32,
    /// See [`Input::Behind`].
    behind: bool,
    /// See [`Input::Hello`].
    hello: bool,
    /// How long a chain member waits for its parent's hello ([`HELLO_WAIT_SHARE`]).
    hello_wait: Duration,
}

/// The share of the stall timeout a chain member waits at most for its parent's hello before
/// it repairs: a twentieth (250 ms by default); less once the parent's hellos have been timed
/// (`delivery::adaptive_hello_wait`). An honest parent sends its hello the moment it
/// accepts the manifest — a gossip hop after the child did — before it holds a byte, and the
/// hello is never paced; a parent that has not said it by then is silent or not there, and
/// waiting the whole stall timeout for it cost its child every version whenever the learner
/// published faster than that. A repair that starts early because a hello was merely late
/// costs a batch of chunks fetched twice, nothing more.
pub(crate) const HELLO_WAIT_SHARE: u32 = 20;

impl Transfer {
    /// A transfer of a snapshot of `chunks` chunks, nothing held yet; `stall` is how long a
    /// chain member waits for a chunk before repairing.
    pub(crate) fn new(chunks: usize, stall: Duration) -> Self {
        Transfer {
            held: vec![false; chunks],
            missing: chunks,
            stored: 0,
            bad: HashSet::new(),
            feed: Feed::Unplanned,
            stall,
            hop: Duration::ZERO,
            phase: Phase::Acquiring,
            newer: false,
            fruitless: 0,
            behind: false,
            hello: false,
            hello_wait: stall / HELLO_WAIT_SHARE,
        }
    }

    /// The same waiting `wait` for the parent's hello (`delivery::adaptive_hello_wait`)
    /// instead of the fixed share of the stall timeout, which stays the most.
    pub(crate) fn with_hello_wait(mut self, wait: Duration) -> Self {
        self.hello_wait = wait.min(self.stall / HELLO_WAIT_SHARE);
        self
    }

    /// The same with `hop` allowed per hop above this node for its first chunk.
    pub(crate) fn with_hop(mut self, hop: Duration) -> Self {
        self.hop = hop;
        self
    }

    /// Whether this transfer goes on although a newer manifest was accepted: it fetches
    /// everything itself (fetch-only, or behind: its feed is not waited for), has stored
    /// chunks of its own, and its repairs still find them.
    pub(crate) fn keeps_going(&self) -> bool {
        let fetching = self.feed == Feed::FetchOnly || self.feed_ignored();
        fetching && self.stored > 0 && self.fruitless < MAX_FRUITLESS_REPAIRS
    }

    /// A chain member that does not wait for its parent: it is behind, or its parent never
    /// said hello (whatever it stored, it fetched).
    fn feed_ignored(&self) -> bool {
        matches!(self.feed, Feed::Parent { .. }) && (self.behind || !self.hello)
    }

    /// A running fetch-only transfer that has stored chunks: newer transfers of this node
    /// wait with their repairs until it ends.
    pub(crate) fn has_priority(&self) -> bool {
        self.phase == Phase::Acquiring && self.keeps_going()
    }

    pub(crate) fn total(&self) -> usize {
        self.held.len()
    }

    #[cfg(test)]
    pub(crate) fn is_held(&self, index: usize) -> bool {
        self.held.get(index).copied().unwrap_or(false)
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// Indices not held yet, in order (the engine repairs from the store's view).
    #[cfg(test)]
    pub(crate) fn missing(&self) -> Vec<usize> {
        (0..self.held.len()).filter(|&i| !self.held[i]).collect()
    }

    pub(crate) fn is_bad(&self, peer: &PeerId) -> bool {
        self.bad.contains(peer)
    }

    pub(crate) fn bad_peers(&self) -> HashSet<PeerId> {
        self.bad.clone()
    }

    /// How long the acquirer waits for a chunk before it counts as stalled. Fetch-only nodes
    /// have no push to wait for; they look again four times as often. A chain member that has
    /// stored nothing of this version yet also allows for the hops above it
    /// ([`hop_allowance`]).
    pub(crate) fn stall_wait(&self) -> Duration {
        match self.feed {
            Feed::FetchOnly => self.stall / 4,
            // Repairing at once: look again as often as a fetch-only node.
            Feed::Parent { .. } if self.behind => self.stall / 4,
            // No word from the parent yet: wait for its hello only ([`HELLO_WAIT_SHARE`]).
            Feed::Parent { .. } if !self.hello && self.stored == 0 => self.hello_wait,
            Feed::Parent { position } if self.stored == 0 => self.stall.saturating_add(
                self.hop
                    .saturating_mul(position.min(u32::MAX as usize) as u32),
            ),
            _ => self.stall,
        }
    }

    fn set_held(&mut self, index: usize, held: bool) {
        if self.held[index] != held {
            self.held[index] = held;
            if held {
                self.missing -= 1;
            } else {
                self.missing += 1;
            }
        }
    }

    pub(crate) fn apply(&mut self, input: Input) -> Vec<Action> {
        match input {
            Input::Held { index, new } => {
                if index >= self.held.len() {
                    return Vec::new();
                }
                self.set_held(index, true);
                // Counted, not recomputed: a scan of the store per chunk is O(n²) per snapshot.
                if new {
                    self.stored += 1;
                    return vec![Action::Progress {
                        stored: self.stored,
                        total: self.total(),
                    }];
                }
                Vec::new()
            }
            Input::Rejected { peer } => {
                self.bad.insert(peer);
                Vec::new()
            }
            Input::Missing { indices } => {
                let mut missing = vec![false; self.held.len()];
                for i in indices {
                    if let Some(m) = missing.get_mut(i) {
                        *m = true;
                    }
                }
                for (i, m) in missing.into_iter().enumerate() {
                    self.set_held(i, !m);
                }
                if self.phase == Phase::Installing && !self.is_complete() {
                    self.phase = Phase::Acquiring;
                }
                Vec::new()
            }
            Input::Plan(feed) => {
                self.feed = feed;
                Vec::new()
            }
            Input::Superseded | Input::Ended => self.stop(),
            Input::Behind(behind) => {
                self.behind = behind;
                Vec::new()
            }
            Input::Hello(hello) => {
                self.hello = hello;
                Vec::new()
            }
            Input::Newer => {
                self.newer = true;
                // A complete transfer installs all the same (its wake comes next).
                if self.keeps_going() || self.is_complete() {
                    Vec::new()
                } else {
                    self.stop()
                }
            }
            Input::Repaired { fetched } => {
                if fetched == 0 {
                    self.fruitless = self.fruitless.saturating_add(1);
                } else {
                    self.fruitless = 0;
                }
                // A transfer the repair completed installs (on its next wake) even if
                // superseded meanwhile: its chunks are all here.
                if self.newer && !self.keeps_going() && !self.is_complete() {
                    self.stop()
                } else {
                    Vec::new()
                }
            }
            Input::Woken(wake) => self.woken(wake),
        }
    }

    fn stop(&mut self) -> Vec<Action> {
        if self.phase == Phase::Stopped {
            return Vec::new();
        }
        self.phase = Phase::Stopped;
        vec![Action::Stop]
    }

    /// The acquirer's decision on waking: stop if superseded, install if complete, repair
    /// after a stall (no chunk within the wait, or the stream ended) — and always when
    /// fetch-only, since nothing will be pushed, or behind ([`behind`]) — otherwise keep
    /// waiting.
    fn woken(&mut self, wake: Wake) -> Vec<Action> {
        match self.phase {
            Phase::Stopped => return vec![Action::Stop],
            Phase::Installing => return Vec::new(),
            Phase::Acquiring => {}
        }
        if self.is_complete() {
            self.phase = Phase::Installing;
            return vec![Action::Install];
        }
        if self.newer && !self.keeps_going() {
            return self.stop();
        }
        // Repair only after a wait: the feed (or the last repair) gets one wait to deliver,
        // even when fetch-only — unless this node is behind.
        let stalled = matches!(wake, Wake::StreamEnded | Wake::Timer);
        let at_once = match self.feed {
            Feed::FetchOnly => wake != Wake::Check || self.behind,
            Feed::Parent { .. } => self.behind,
            Feed::Unplanned => false,
        };
        if stalled || at_once {
            vec![Action::Repair]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fed_node_repairs_from_the_back_a_batch_at_a_time_others_take_everything() {
        let missing: Vec<usize> = (3..40).collect();
        let from_the_back: Vec<usize> = (32..40).rev().collect();
        assert_eq!(
            repair_batch(missing.clone(), Feed::Parent { position: 0 }),
            from_the_back
        );
        assert_eq!(repair_batch(missing.clone(), Feed::FetchOnly), missing);
        assert_eq!(repair_batch(missing.clone(), Feed::Unplanned), missing);
        assert_eq!(repair_batch(vec![5], Feed::Parent { position: 0 }), vec![5]);
    }

    const STALL: Duration = Duration::from_secs(5);

    #[test]
    fn a_deep_chain_member_waits_longer_for_its_first_chunk_only() {
        // 128 KiB at 5 Mbit/s: 0.21 s a chunk; two of them and the margin per hop.
        let hop = hop_allowance(128 << 10, 625_000.0);
        assert_eq!(hop.as_millis(), 669);
        assert_eq!(
            hop_allowance(1 << 20, 0.0),
            HOP_MARGIN,
            "no rate: the margin only"
        );
        assert_eq!(
            hop_allowance(1 << 30, 1.0),
            Duration::from_secs(60) + HOP_MARGIN
        );
        let fed = |position| Feed::Parent { position };
        let mut t = Transfer::new(62, STALL).with_hop(hop);
        t.apply(Input::Plan(fed(0)));
        t.apply(Input::Hello(true));
        assert_eq!(t.stall_wait(), STALL, "a first hop waits the stall timeout");
        t.apply(Input::Plan(fed(10)));
        assert_eq!(t.stall_wait(), STALL + hop * 10);
        // A chunk unchanged since an earlier version is no sign of the push.
        t.apply(Input::Held {
            index: 5,
            new: false,
        });
        assert_eq!(t.stall_wait(), STALL + hop * 10);
        held(&mut t, 0);
        assert_eq!(
            t.stall_wait(),
            STALL,
            "once the push delivers, the plain timeout"
        );
        let mut f = Transfer::new(62, STALL).with_hop(hop);
        f.apply(Input::Plan(Feed::FetchOnly));
        assert_eq!(f.stall_wait(), STALL / 4);
    }

    fn peer(i: u8) -> PeerId {
        p2p::peer_id_from_seed([i; 32])
    }

    fn held(t: &mut Transfer, index: usize) -> Vec<Action> {
        t.apply(Input::Held { index, new: true })
    }

    #[test]
    fn chunks_in_order_report_progress_and_completion_triggers_install() {
        let mut t = Transfer::new(3, STALL);
        t.apply(Input::Plan(Feed::Parent { position: 0 }));
        assert_eq!(t.apply(Input::Woken(Wake::Check)), []);
        for i in 0..3 {
            assert_eq!(
                held(&mut t, i),
                [Action::Progress {
                    stored: i + 1,
                    total: 3
                }]
            );
            if i < 2 {
                assert_eq!(t.apply(Input::Woken(Wake::Stored)), []);
            }
        }
        assert!(t.is_complete());
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), [Action::Install]);
        // Issued once.
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), []);
    }

    #[test]
    fn chunks_out_of_order_and_already_held_ones_complete_the_same_way() {
        let mut t = Transfer::new(4, STALL);
        // Held before the transfer started (an unchanged chunk): no progress reported.
        assert_eq!(
            t.apply(Input::Held {
                index: 2,
                new: false
            }),
            []
        );
        held(&mut t, 3);
        held(&mut t, 0);
        assert_eq!(t.missing(), [1]);
        assert!(!t.is_complete());
        held(&mut t, 1);
        assert_eq!(t.apply(Input::Woken(Wake::Check)), [Action::Install]);
    }

    #[test]
    fn a_duplicate_chunk_counts_once_and_out_of_range_is_ignored() {
        let mut t = Transfer::new(2, STALL);
        held(&mut t, 0);
        // The store already had it: no second progress, no double count.
        assert_eq!(
            t.apply(Input::Held {
                index: 0,
                new: false
            }),
            []
        );
        assert_eq!(t.missing(), [1]);
        assert_eq!(
            t.apply(Input::Held {
                index: 9,
                new: true
            }),
            []
        );
        assert_eq!(
            held(&mut t, 1),
            [Action::Progress {
                stored: 2,
                total: 2
            }]
        );
        assert!(t.is_complete());
    }

    #[test]
    fn the_store_view_overrides_what_the_inputs_said() {
        let mut t = Transfer::new(3, STALL);
        held(&mut t, 0);
        // Chunk 2 shares its hash with chunk 0 (held once per hash), chunk 0's file was dropped.
        t.apply(Input::Missing {
            indices: vec![0, 1],
        });
        assert_eq!(t.missing(), [0, 1]);
        assert!(t.is_held(2));
        // Out-of-range indices are ignored.
        t.apply(Input::Missing {
            indices: vec![1, 7],
        });
        assert_eq!(t.missing(), [1]);
    }

    #[test]
    fn a_stall_or_an_ended_stream_triggers_repair_for_a_chain_member() {
        let mut t = Transfer::new(3, STALL);
        t.apply(Input::Plan(Feed::Parent { position: 0 }));
        t.apply(Input::Hello(true));
        assert_eq!(t.stall_wait(), STALL);
        held(&mut t, 0);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), []);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        assert_eq!(t.apply(Input::Woken(Wake::StreamEnded)), [Action::Repair]);
        // A corrupt sender is remembered and skipped by the repair.
        t.apply(Input::Rejected { peer: peer(1) });
        assert!(t.is_bad(&peer(1)));
        assert!(!t.is_bad(&peer(2)));
    }

    #[test]
    fn a_fetch_only_node_repairs_after_every_wait_and_waits_less() {
        let mut t = Transfer::new(2, STALL);
        t.apply(Input::Plan(Feed::FetchOnly));
        assert_eq!(t.stall_wait(), STALL / 4);
        assert_eq!(t.apply(Input::Woken(Wake::Check)), []);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), [Action::Repair]);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        // An unplanned node waits for a push like a chain member.
        t.apply(Input::Plan(Feed::Unplanned));
        assert_eq!(t.stall_wait(), STALL);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), []);
    }

    #[test]
    fn an_installed_version_supersedes_an_older_one() {
        let mut t = Transfer::new(3, STALL);
        held(&mut t, 0);
        assert_eq!(t.apply(Input::Superseded), [Action::Stop]);
        assert_eq!(t.apply(Input::Superseded), []);
        // Whatever wakes it, it stays stopped — even when the last chunks arrive late.
        held(&mut t, 1);
        held(&mut t, 2);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Stop]);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), [Action::Stop]);
    }

    /// A fetch-only transfer that stored chunks keeps going past a newer manifest, completes
    /// and installs; one with nothing stored yet, or a chain member, yields at once.
    #[test]
    fn a_fetch_only_transfer_with_progress_finishes_before_a_newer_version() {
        let mut t = Transfer::new(3, STALL);
        t.apply(Input::Plan(Feed::FetchOnly));
        assert!(!t.has_priority(), "nothing stored yet");
        held(&mut t, 0);
        assert!(t.has_priority());
        assert_eq!(t.apply(Input::Newer), []);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        assert_eq!(t.apply(Input::Repaired { fetched: 2 }), []);
        held(&mut t, 1);
        held(&mut t, 2);
        assert_eq!(t.apply(Input::Woken(Wake::Check)), [Action::Install]);
        assert!(
            !t.has_priority(),
            "installing: the newer transfers may fetch"
        );
        // An install of this or a newer version always ends it.
        assert_eq!(t.apply(Input::Superseded), [Action::Stop]);

        // An acquirer that ended (here: failed) stops holding the newer ones back.
        let mut failed = Transfer::new(3, STALL);
        failed.apply(Input::Plan(Feed::FetchOnly));
        held(&mut failed, 0);
        assert!(failed.has_priority());
        assert_eq!(failed.apply(Input::Ended), [Action::Stop]);
        assert!(!failed.has_priority());

        let mut idle = Transfer::new(3, STALL);
        idle.apply(Input::Plan(Feed::FetchOnly));
        assert_eq!(idle.apply(Input::Newer), [Action::Stop]);

        let mut chain = Transfer::new(3, STALL);
        chain.apply(Input::Plan(Feed::Parent { position: 0 }));
        chain.apply(Input::Hello(true));
        held(&mut chain, 0);
        assert_eq!(chain.apply(Input::Newer), [Action::Stop]);
    }

    /// A node that is behind repairs at once, whatever feeds it; one that is up to date first
    /// gives its feed one wait.
    #[test]
    fn a_behind_node_repairs_without_waiting_whatever_feeds_it() {
        let mut t = Transfer::new(2, STALL);
        t.apply(Input::Plan(Feed::FetchOnly));
        assert_eq!(t.apply(Input::Woken(Wake::Check)), []);
        t.apply(Input::Behind(true));
        assert_eq!(t.apply(Input::Woken(Wake::Check)), [Action::Repair]);
        let mut chain = Transfer::new(2, STALL).with_hop(HOP_MARGIN);
        chain.apply(Input::Plan(Feed::Parent { position: 3 }));
        chain.apply(Input::Hello(true));
        assert_eq!(chain.apply(Input::Woken(Wake::Check)), []);
        assert!(chain.stall_wait() > STALL);
        chain.apply(Input::Behind(true));
        assert_eq!(chain.apply(Input::Woken(Wake::Check)), [Action::Repair]);
        assert_eq!(chain.stall_wait(), STALL / 4, "and keeps looking");
        // Without a plan nobody is behind: wait for the push the plan will announce.
        let mut unplanned = Transfer::new(2, STALL);
        unplanned.apply(Input::Behind(true));
        assert_eq!(unplanned.apply(Input::Woken(Wake::Check)), []);
    }

    /// A parent gets a twentieth of the stall timeout to say hello (less once its hellos are
    /// timed, never more); once it has, the whole stall wait (and the hops above) for its
    /// first chunk.
    #[test]
    fn a_parent_that_says_nothing_is_waited_for_only_briefly() {
        let mut t = Transfer::new(4, STALL).with_hop(HOP_MARGIN);
        t.apply(Input::Plan(Feed::Parent { position: 2 }));
        assert_eq!(t.stall_wait(), STALL / HELLO_WAIT_SHARE);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        t.apply(Input::Hello(true));
        assert_eq!(t.stall_wait(), STALL + HOP_MARGIN * 2);
        let short = Duration::from_millis(30);
        let mut timed = Transfer::new(4, STALL).with_hello_wait(short);
        timed.apply(Input::Plan(Feed::Parent { position: 1 }));
        assert_eq!(timed.stall_wait(), short);
        let long = Transfer::new(4, STALL).with_hello_wait(STALL);
        assert_eq!(
            long.hello_wait,
            STALL / HELLO_WAIT_SHARE,
            "the share stays the most"
        );
        // A first chunk came without a hello (a push from before a restart): a live feed.
        let mut u = Transfer::new(4, STALL);
        u.apply(Input::Plan(Feed::Parent { position: 0 }));
        held(&mut u, 0);
        assert_eq!(u.stall_wait(), STALL);
    }

    /// A chain member fetching its version itself (behind, or its parent never said hello)
    /// completes it past a newer manifest, as a fetch-only node does; one fed by its parent's
    /// push yields.
    #[test]
    fn a_chain_member_fetching_for_itself_finishes_its_version() {
        let mut t = Transfer::new(3, STALL);
        t.apply(Input::Plan(Feed::Parent { position: 1 }));
        t.apply(Input::Hello(true));
        t.apply(Input::Behind(true));
        held(&mut t, 2);
        assert!(t.has_priority());
        assert_eq!(t.apply(Input::Newer), []);
        held(&mut t, 0);
        held(&mut t, 1);
        assert_eq!(t.apply(Input::Woken(Wake::Check)), [Action::Install]);
        let mut silent_parent = Transfer::new(2, STALL);
        silent_parent.apply(Input::Plan(Feed::Parent { position: 1 }));
        held(&mut silent_parent, 0);
        assert_eq!(silent_parent.apply(Input::Newer), []);
        let mut pushed = Transfer::new(2, STALL);
        pushed.apply(Input::Plan(Feed::Parent { position: 1 }));
        pushed.apply(Input::Hello(true));
        held(&mut pushed, 0);
        assert_eq!(pushed.apply(Input::Newer), [Action::Stop]);
        // A transfer complete when a newer manifest comes installs all the same.
        let mut done = Transfer::new(2, STALL);
        done.apply(Input::Plan(Feed::Parent { position: 1 }));
        done.apply(Input::Hello(true));
        held(&mut done, 0);
        held(&mut done, 1);
        assert_eq!(done.apply(Input::Repaired { fetched: 1 }), []);
        assert_eq!(done.apply(Input::Newer), []);
        assert_eq!(done.apply(Input::Woken(Wake::Check)), [Action::Install]);
    }

    /// A push under a third of B̂w, measured from its first chunk after three chunk times, is
    /// not waited for.
    #[test]
    fn a_trickling_push_is_not_waited_for() {
        let (chunk, bw) = (64 << 10, 12.5e6); // 5 ms a chunk at B̂w
        let ms = Duration::from_millis;
        let min = STALL / HELLO_WAIT_SHARE;
        let slow = |bytes, since| slow_feed(bytes, since, chunk, bw, min);
        assert!(!slow(0, None), "no chunk yet: the stall rules apply");
        assert!(!slow(65_536, Some(ms(100))), "too early to tell");
        // 400 ms at a tenth of B̂w: 500 kB.
        assert!(slow(500_000, Some(ms(400))));
        // 400 ms at half of B̂w: 2.5 MB.
        assert!(!slow(2_500_000, Some(ms(400))));
        assert!(
            !slow_feed(1, Some(ms(400)), chunk, 0.0, min),
            "no planned rate"
        );
        // A long stall timeout (a configuration that keeps repair out) waits longer.
        assert!(!slow_feed(500_000, Some(ms(400)), chunk, bw, ms(30_000)));
    }

    /// Who is behind (`behind`): a skipped version behind any feed; a parent that failed the
    /// last version; a fetch-only node with nothing installed.
    #[test]
    fn behind_is_a_skipped_version_or_a_failed_parent() {
        let fed = Feed::Parent { position: 1 };
        assert!(!behind(fed, None, false, false), "a first version: wait");
        assert!(!behind(fed, Some(4), false, false));
        assert!(behind(fed, Some(4), true, false), "skipped a version");
        assert!(behind(fed, Some(4), false, true), "its parent failed it");
        assert!(behind(Feed::FetchOnly, None, false, false));
        assert!(!behind(Feed::FetchOnly, Some(4), false, false));
        assert!(behind(Feed::FetchOnly, Some(4), true, false));
        assert!(!behind(Feed::Unplanned, None, true, true));
    }

    /// Patience per node: a parent that failed a version is not waited for again; it earns
    /// trust back by delivering a quarter of a version, or a new parent starts trusted.
    #[test]
    fn a_parent_that_failed_a_version_is_not_waited_for_until_it_delivers() {
        let (p, q) = (peer(1), peer(2));
        let mut f = FeedStanding::default();
        assert!(!f.distrusts(Some(&p)));
        f.ended(Some(p), 16, 0);
        assert!(f.distrusts(Some(&p)));
        assert!(!f.distrusts(Some(&q)), "another parent starts trusted");
        assert!(!f.distrusts(None));
        // Nothing needed: no evidence either way.
        f.ended(Some(p), 0, 0);
        assert!(f.distrusts(Some(&p)));
        // One chunk of sixteen to look alive is not delivering.
        f.ended(Some(p), 16, 1);
        assert!(f.distrusts(Some(&p)));
        // Meeting this node's own repair in the middle is.
        f.ended(Some(p), 16, 7);
        assert!(!f.distrusts(Some(&p)));
        // The learner is never held: a first hop ends with `None`.
        f.ended(None, 16, 0);
        assert!(!f.distrusts(Some(&p)));
        // Another parent failing replaces the record; the old one is trusted again.
        f.ended(Some(p), 16, 0);
        f.ended(Some(q), 16, 0);
        assert!(f.distrusts(Some(&q)) && !f.distrusts(Some(&p)));
    }

    /// A superseded fetch-only transfer whose holders no longer answer gives up after
    /// `MAX_FRUITLESS_REPAIRS` empty rounds in a row; a fruitful round resets the count, and
    /// without a newer version it never gives up.
    #[test]
    fn a_superseded_fetch_only_transfer_gives_up_when_its_chunks_are_gone() {
        let mut t = Transfer::new(3, STALL);
        t.apply(Input::Plan(Feed::FetchOnly));
        held(&mut t, 0);
        for _ in 0..MAX_FRUITLESS_REPAIRS + 2 {
            assert_eq!(t.apply(Input::Repaired { fetched: 0 }), []);
        }
        assert!(
            !t.keeps_going(),
            "without a newer version it still acquires"
        );
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        assert_eq!(t.apply(Input::Repaired { fetched: 1 }), []);
        held(&mut t, 1);
        assert_eq!(t.apply(Input::Newer), []);
        for _ in 1..MAX_FRUITLESS_REPAIRS {
            assert_eq!(t.apply(Input::Repaired { fetched: 0 }), []);
        }
        assert_eq!(t.apply(Input::Repaired { fetched: 0 }), [Action::Stop]);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Stop]);
    }

    #[test]
    fn a_chunk_lost_before_install_sends_the_transfer_back_to_repair() {
        let mut t = Transfer::new(2, STALL);
        held(&mut t, 0);
        held(&mut t, 1);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), [Action::Install]);
        t.apply(Input::Missing { indices: vec![1] });
        assert_eq!(t.missing(), [1]);
        assert_eq!(t.apply(Input::Woken(Wake::Timer)), [Action::Repair]);
        held(&mut t, 1);
        assert_eq!(t.apply(Input::Woken(Wake::Stored)), [Action::Install]);
    }
}
