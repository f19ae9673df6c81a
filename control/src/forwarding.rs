//! Accountable forwarding (`docs/broadcast.md`, "Accountable forwarding"; `docs/security.md`):
//! how the learner judges what a chain parent delivered to its child, from the child's signed
//! delivery receipt, and whom it holds at fault.
//!
//! Chains assume every forwarder forwards. A worker can receive and install every snapshot and
//! still pass nothing on (its whole subtree then starves), or pass it on at a trickle. Nothing
//! the parent says about itself proves it forwarded; what its child received does. So every
//! child reports, per version, what its planned parent delivered ([`Delivery`]), and the
//! learner turns each report into a [`Verdict`] ([`judge`]) and feeds the verdicts to a
//! [`Ledger`], which decides ([`Decision`]).
//!
//! **Verdicts.** *Silent*: the parent said nothing at all — no hello for this version or a
//! newer one, no byte — although it held the version (it reported installing it) before the
//! child reported. *Slow*: bytes came, at less than [`SLOW_FRACTION`] of the
//! planned per-worker bandwidth `B̂w` over the push (or a hello came and nothing else),
//! although the parent held the whole version for most of that time. *Excused*: the parent
//! did not hold the version in time (its own parent is to blame, and its own receipt says so),
//! or it spoke only for a newer version (a plan that raced a newer one). An honest slow link
//! always sends its hello (a few hundred bytes, not paced) and some bytes, so it is at worst
//! *slow*: never silent.
//!
//! **Attribution by moving the child.** A child that lags — a slow or silent delivery — could
//! be the parent's fault (it does not send) or the child's (its downlink is broken, or it lies
//! in its receipts). One lagging edge says nothing about which, so after [`LAG_VERSIONS`]
//! lagging versions in a row on the edge (parent `P`, child `C`) the learner *separates* them:
//! its next plan seats `C` under another parent and gives `P` another child. Then
//! - if `P`'s new child lags too, `P` is at fault — two different children saw the same;
//! - if `C` lags under its new parent too, `C` is at fault — two different parents did;
//! - if neither lags, it was transient: nothing is held against anyone.
//!
//! **What a fault costs.** A parent at fault for *slowness* is demoted: ranked after every
//! healthy forwarder for [`DEMOTE_VERSIONS`] versions (it lands at a chain's tail, where its
//! uplink delays nobody), no strike — a slow link is a fact of the network, not an attack.
//! So is a parent whose children saw it *overfeed* ([`Verdict::Overfed`]: chunks they had not
//! asked for, or a second copy — the child charges it and drops the stream at the first).
//! A parent at fault for *silence* (every child that lagged under it saw silence) is
//! *accused* ([`Decision::Accuse`]); receipts alone never ban, because identities are cheap
//! and two fresh ones seated under an honest parent can sign "nothing came". The accusation
//! is judged by [`sentence`] on evidence a fresh identity cannot manufacture: the learner's
//! own probe of the parent (it asks it over chunk fetch for a chunk of a version it reported
//! holding: withheld, it lied) or children that are established (past probation on verified
//! work, [`crate::admission`]). Either convicts: one strike per silent version in the
//! evidence, and exclusion from forwarding for the run — with [`LAG_VERSIONS`] = 2 the
//! evidence holds at least 4 silent versions, past the default ban threshold of 3 strikes. A
//! parent that serves the probe, accused by young children only, is cleared (its
//! separations stand: at most moved); one that leaves the probe unanswered is demoted. A
//! child at fault is demoted too (a tail has no child to starve) and its receipts are no
//! longer believed — a child that lies about its parents to frame them convicts itself after
//! two parents instead.
//!
//! Owns: the verdict and the ledger's rule. Must not touch: receipts' wire format and
//! signatures (`p2p::messages`), the plan layout (`crate::plan`), strikes and bans themselves
//! (the caller carries decisions out).

use std::collections::{BTreeMap, BTreeSet};

/// Below this fraction of the planned per-worker bandwidth `B̂w` a delivery is *slow*. A third:
/// store-and-forward per chunk, scheduling and a loaded host spread an honest hop's rate, but
/// a hop at a third of the plan's rate makes every node below it three times later than the
/// plan assumed — worth a place further back.
pub const SLOW_FRACTION: f64 = 1.0 / 3.0;

/// Lagging versions in a row on one edge before the learner separates parent and child. Two:
/// one bad version may be a transient (a reconnect, a plan that raced a newer one); two in a
/// row are a pattern, and waiting for more lets a silent parent starve its child longer.
pub const LAG_VERSIONS: u32 = 2;

/// Versions a demotion lasts. Long enough for the plans in between to settle without the
/// demoted worker, short enough that a link that recovered is used again within minutes.
pub const DEMOTE_VERSIONS: u64 = 32;

/// Versions a separation of a parent and a child lasts.
pub const SEPARATE_VERSIONS: u64 = 32;

/// What a child reports its planned parent delivered of one version (the learner's reading
/// of a signed receipt; times are the child's, in ms after it accepted the version's
/// manifest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delivery {
    /// Bytes the child lacked when the parent's push began (or when it accepted the manifest,
    /// if no push began): what the parent had to send.
    pub wanted: u64,
    /// Bytes of the first copy of each chunk asked of the parent and received from it.
    pub bytes: u64,
    /// Bytes the parent pushed that the child had not asked for, or had received already.
    pub duplicates: u64,
    /// The parent sent a hello for this version, or for a newer one, before the report.
    pub spoke: bool,
    /// The parent's hello for this very version.
    pub hello_ms: Option<u64>,
    /// First and last chunk from the parent.
    pub first_ms: Option<u64>,
    pub last_ms: Option<u64>,
    /// When the child stopped needing the version's bytes: it installed the version, or gave
    /// it up for a newer one (or, if neither, when it reported).
    pub end_ms: u64,
}

/// What the learner knows besides the receipt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expectation {
    /// The planned per-worker forwarding rate `B̂w` in bytes/s.
    pub bytes_per_s: f64,
    /// The snapshot's chunk size in bytes (a store-and-forward hop holds one chunk back).
    pub chunk_bytes: u64,
    /// When the learner heard the parent report installing this version (or a newer one), in
    /// ms after it published the version; `None`: not (yet). The child's times count from its
    /// acceptance of the manifest, a gossip hop after publication: the parent's time is the
    /// later of the two clocks' readings, so the comparison favours the parent.
    pub parent_held_ms: Option<u64>,
    /// When the learner received the receipt, in ms after it published the version.
    pub received_ms: u64,
}

impl Expectation {
    /// Whether the parent held the version `slack_ms` before `end_ms`.
    fn held_by(&self, end_ms: u64, slack_ms: u64) -> bool {
        self.parent_held_ms
            .is_some_and(|h| h.saturating_add(slack_ms) <= end_ms)
    }
}

/// The learner's reading of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Nothing was owed, or it came at a rate the plan can live with.
    OnTime,
    /// Bytes flowed below [`SLOW_FRACTION`] of `B̂w`.
    Slow,
    /// The parent held the version and said nothing.
    Silent,
    /// Not the parent's doing: it did not hold the version in time, or it had moved on to a
    /// newer version.
    Excused,
    /// The parent pushed chunks the child had not asked for, or again (a protocol error of
    /// the parent's: an honest parent pushes what the child's reply lacked, once).
    Overfed,
}

/// The verdict on one delivery (module docs, "Verdicts").
pub fn judge(d: &Delivery, e: &Expectation) -> Verdict {
    if d.duplicates > 0 {
        return Verdict::Overfed;
    }
    if d.wanted == 0 {
        return Verdict::OnTime;
    }
    // Silence needs only that the parent held the version before the child reported: its
    // hello goes out when it accepts the manifest, before it holds anything, so one that had
    // installed the version had said hello long before (the child reports at least a quarter
    // of a stall timeout after it accepted the manifest; it may well have stopped needing the
    // version earlier, fetching it from others).
    if d.bytes == 0 && d.hello_ms.is_none() {
        return match (d.spoke, e.held_by(e.received_ms, 0)) {
            // Spoke only for a newer version: its plan for this one raced the next.
            (true, _) | (false, false) => Verdict::Excused,
            (false, true) => Verdict::Silent,
        };
    }
    // The push's window: from its first chunk (its hello, if no chunk came) to its last chunk
    // or the end of the child's need, whichever is later — a push that goes on after the child
    // repaired the rest is judged on all it sent, and one that sends a chunk and stalls has
    // that chunk spread over the whole wait. Plus one chunk time: a store-and-forward hop's
    // first chunk is a chunk late.
    let chunk_s = if e.bytes_per_s > 0.0 {
        e.chunk_bytes as f64 / e.bytes_per_s
    } else {
        0.0
    };
    let start = d.first_ms.or(d.hello_ms).unwrap_or(0);
    let stop = d.last_ms.unwrap_or(0).max(d.end_ms).max(start);
    let span_s = (stop - start) as f64 / 1e3 + chunk_s;
    let rate = d.bytes.min(d.wanted) as f64 / span_s.max(1e-3);
    if rate >= SLOW_FRACTION * e.bytes_per_s {
        return Verdict::OnTime;
    }
    // Slow is the parent's doing only if it held the whole version for most of the window:
    // a parent fed slowly forwards slowly (store-and-forward), and is held only when it had
    // every byte by the window's middle.
    if e.held_by(start + (stop - start) / 2, 0) {
        Verdict::Slow
    } else {
        Verdict::Excused
    }
}

/// Which kind of fault a worker was held at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A parent whose children got bytes, too slowly.
    SlowParent,
    /// A parent that held versions and sent two different children nothing.
    SilentParent,
    /// A parent that pushed two different children chunks they had not asked for.
    OverfeedingParent,
    /// A child that lagged under two different parents.
    Child,
}

/// What the ledger decides; the caller carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<P> {
    /// The next plans must not seat `child` under `parent` (until version `until`).
    Separate { parent: P, child: P, until: u64 },
    /// Rank `peer` after every healthy forwarder until version `until`.
    Demote { peer: P, until: u64, fault: Fault },
    /// Two different children saw `peer` silent (`count` silent versions in the evidence,
    /// from `children`): the caller weighs the accusation ([`sentence`]) and hands the
    /// result back ([`Ledger::sentenced`]).
    Accuse {
        peer: P,
        count: u32,
        children: Vec<P>,
    },
    /// `count` strikes against `peer` (silent versions in the evidence); it is excluded from
    /// forwarding for the run.
    Strike { peer: P, count: u32 },
}

/// What the learner's own probe of an accused parent found: it asked the parent, over chunk
/// fetch, for one chunk of the newest version the parent reported holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The chunk came, and verified: the parent does pass on what it holds.
    Served,
    /// An empty answer (not held) or a chunk that failed verification, for a version it
    /// reported holding: it lied to the learner itself.
    Withheld,
    /// No answer in time, or no connection: evidence of nothing.
    Unanswered,
}

/// What an accusation of silence comes to ([`sentence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sentence {
    /// Convicted: `count` strikes, excluded from forwarding for the run.
    Strike { count: u32 },
    /// Not convicted, not cleared: ranked after every healthy forwarder for a while.
    Demote,
    /// Cleared: only the separations the receipts caused stand.
    Clear,
}

/// Weighs an accusation of silence of `count` versions. `established`: how many of the
/// accusing children are established (past probation on verified work — what a fresh
/// identity cannot have); `probe`: the learner's own probe of the parent, if it ran one.
/// Receipts alone — from children that are not both established — never convict: two cheap
/// identities could have signed them. A probe the parent fails convicts whoever accused it;
/// one it passes clears it unless established children accuse it (a parent may serve fetches
/// and still push nothing, which only its children can see).
pub fn sentence(count: u32, established: usize, probe: Option<Probe>) -> Sentence {
    if probe == Some(Probe::Withheld) || established >= 2 {
        return Sentence::Strike { count };
    }
    match probe {
        Some(Probe::Served) => Sentence::Clear,
        Some(Probe::Withheld) | Some(Probe::Unanswered) | None => Sentence::Demote,
    }
}

/// Lagging versions in a row on one edge so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Lag {
    versions: u32,
    silent: u32,
    overfed: u32,
}

/// The learner's record of lagging deliveries (module docs, "Attribution by moving the
/// child"). Bounded by the workers it is told about: [`Ledger::retain`] forgets the rest.
#[derive(Debug, Clone)]
pub struct Ledger<P> {
    edges: BTreeMap<(P, P), Lag>,
    /// Parent → the children that lagged [`LAG_VERSIONS`] in a row under it, with that lag.
    failed_children: BTreeMap<P, BTreeMap<P, Lag>>,
    /// Child → the parents under which it lagged [`LAG_VERSIONS`] in a row.
    failed_parents: BTreeMap<P, BTreeSet<P>>,
    separated: BTreeMap<(P, P), u64>,
    demoted: BTreeMap<P, (u64, Fault)>,
    excluded: BTreeSet<P>,
    /// Children at fault: their receipts are no longer believed.
    distrusted: BTreeSet<P>,
    /// Verdicts seen, per kind.
    verdicts: BTreeMap<Verdict, u64>,
}

impl<P> Default for Ledger<P> {
    fn default() -> Self {
        Ledger {
            edges: BTreeMap::new(),
            failed_children: BTreeMap::new(),
            failed_parents: BTreeMap::new(),
            separated: BTreeMap::new(),
            demoted: BTreeMap::new(),
            excluded: BTreeSet::new(),
            distrusted: BTreeSet::new(),
            verdicts: BTreeMap::new(),
        }
    }
}

impl<P: Clone + Ord> Ledger<P> {
    /// One verdict on the delivery of `version` from `parent` to `child`; returns what follows
    /// from it (module docs).
    pub fn observe(&mut self, version: u64, parent: &P, child: &P, v: Verdict) -> Vec<Decision<P>> {
        *self.verdicts.entry(v).or_default() += 1;
        if self.distrusted.contains(child) || self.excluded.contains(parent) || parent == child {
            return Vec::new();
        }
        let edge = (parent.clone(), child.clone());
        match v {
            Verdict::Excused => Vec::new(),
            Verdict::OnTime => {
                self.edges.remove(&edge);
                // A suspect parent that serves another child well is cleared (the first
                // child's lag was its own, or transient); a suspect child that is served well
                // by another parent likewise.
                if self
                    .failed_children
                    .get(parent)
                    .is_some_and(|c| !c.contains_key(child))
                {
                    self.failed_children.remove(parent);
                }
                if self
                    .failed_parents
                    .get(child)
                    .is_some_and(|p| !p.contains(parent))
                {
                    self.failed_parents.remove(child);
                }
                Vec::new()
            }
            Verdict::Slow | Verdict::Silent | Verdict::Overfed => {
                let lag = self.edges.entry(edge.clone()).or_default();
                lag.versions += 1;
                lag.silent += u32::from(v == Verdict::Silent);
                lag.overfed += u32::from(v == Verdict::Overfed);
                if lag.versions < LAG_VERSIONS {
                    return Vec::new();
                }
                // The evidence against the edge accumulates while the plans already signed
                // keep it (a separation takes effect only in the next one).
                let lag = self.edges.remove(&edge).unwrap_or_default();
                let held = self
                    .failed_children
                    .entry(parent.clone())
                    .or_default()
                    .entry(child.clone())
                    .or_default();
                held.versions += lag.versions;
                held.silent += lag.silent;
                held.overfed += lag.overfed;
                self.failed_parents
                    .entry(child.clone())
                    .or_default()
                    .insert(parent.clone());
                let until = version + SEPARATE_VERSIONS;
                self.separated.insert(edge, until);
                let mut out = vec![Decision::Separate {
                    parent: parent.clone(),
                    child: child.clone(),
                    until,
                }];
                if self
                    .failed_children
                    .get(parent)
                    .is_some_and(|c| c.len() >= 2)
                {
                    out.extend(self.parent_at_fault(version, parent));
                }
                if self.failed_parents.get(child).is_some_and(|p| p.len() >= 2) {
                    out.extend(self.child_at_fault(version, child));
                }
                out
            }
        }
    }

    fn parent_at_fault(&mut self, version: u64, parent: &P) -> Vec<Decision<P>> {
        let evidence = self.failed_children.remove(parent).unwrap_or_default();
        for parents in self.failed_parents.values_mut() {
            parents.remove(parent);
        }
        self.failed_parents.retain(|_, p| !p.is_empty());
        // Silent only when every child that lagged under it saw silence: a parent that sent
        // some child bytes is at worst slow.
        let silent = evidence.values().all(|l| l.silent > 0);
        if silent {
            vec![Decision::Accuse {
                peer: parent.clone(),
                count: evidence.values().map(|l| l.silent).sum(),
                children: evidence.into_keys().collect(),
            }]
        } else if evidence.values().any(|l| l.overfed > 0) {
            vec![self.demote(version, parent, Fault::OverfeedingParent)]
        } else {
            vec![self.demote(version, parent, Fault::SlowParent)]
        }
    }

    /// Carries out the [`sentence`] on an accused `peer` (at `version`); returns what it
    /// comes to (nothing when cleared).
    pub fn sentenced(&mut self, version: u64, peer: &P, s: Sentence) -> Option<Decision<P>> {
        match s {
            Sentence::Strike { count } => {
                self.excluded.insert(peer.clone());
                self.demoted.remove(peer);
                Some(Decision::Strike {
                    peer: peer.clone(),
                    count,
                })
            }
            Sentence::Demote => Some(self.demote(version, peer, Fault::SilentParent)),
            Sentence::Clear => None,
        }
    }

    fn child_at_fault(&mut self, version: u64, child: &P) -> Vec<Decision<P>> {
        self.failed_parents.remove(child);
        for children in self.failed_children.values_mut() {
            children.remove(child);
        }
        self.failed_children.retain(|_, c| !c.is_empty());
        self.distrusted.insert(child.clone());
        vec![self.demote(version, child, Fault::Child)]
    }

    fn demote(&mut self, version: u64, peer: &P, fault: Fault) -> Decision<P> {
        let until = version + DEMOTE_VERSIONS;
        self.demoted.insert(peer.clone(), (until, fault));
        Decision::Demote {
            peer: peer.clone(),
            until,
            fault,
        }
    }

    /// Pairs the plan for `version` must not seat as (parent, child).
    pub fn separated(&self, version: u64) -> Vec<(P, P)> {
        self.separated
            .iter()
            .filter(|(_, &until)| until > version)
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// Workers the plan for `version` ranks after every healthy forwarder.
    pub fn demoted(&self, version: u64) -> BTreeSet<P> {
        self.demoted
            .iter()
            .filter(|(_, (until, _))| *until > version)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Parents under suspicion: a child lagged under them twice in a row, and they have not
    /// been cleared or convicted yet. The plan gives each a child (another one) so that the
    /// next versions tell ([`crate::seats`]).
    pub fn suspects(&self) -> BTreeSet<P> {
        // A demoted or excluded parent has had its test: it ends a chain, or does not forward.
        self.failed_children
            .keys()
            .filter(|p| !self.excluded.contains(*p) && !self.demoted.contains_key(*p))
            .cloned()
            .collect()
    }

    /// Workers excluded from forwarding for the run (silent parents).
    pub fn excluded(&self) -> &BTreeSet<P> {
        &self.excluded
    }

    /// The fault a worker was last demoted or excluded for, if any is in force at `version`.
    pub fn fault_of(&self, peer: &P, version: u64) -> Option<Fault> {
        if self.excluded.contains(peer) {
            return Some(Fault::SilentParent);
        }
        self.demoted
            .get(peer)
            .filter(|(until, _)| *until > version)
            .map(|(_, f)| *f)
    }

    /// Lagging versions in a row on the edge (parent, child) so far.
    pub fn lag(&self, parent: &P, child: &P) -> u32 {
        self.edges
            .get(&(parent.clone(), child.clone()))
            .map_or(0, |l| l.versions)
    }

    /// Verdicts seen so far, per kind.
    pub fn verdicts(&self) -> &BTreeMap<Verdict, u64> {
        &self.verdicts
    }

    /// Forgets what is recorded about peers `keep` rejects (left the swarm, banned) and what
    /// expired by `version`, so the ledger stays bounded by the live workers.
    pub fn retain(&mut self, version: u64, keep: impl Fn(&P) -> bool) {
        self.edges.retain(|(p, c), _| keep(p) && keep(c));
        self.failed_children.retain(|p, _| keep(p));
        for c in self.failed_children.values_mut() {
            c.retain(|c, _| keep(c));
        }
        self.failed_children.retain(|_, c| !c.is_empty());
        self.failed_parents.retain(|c, _| keep(c));
        for p in self.failed_parents.values_mut() {
            p.retain(|p| keep(p));
        }
        self.failed_parents.retain(|_, p| !p.is_empty());
        self.separated
            .retain(|(p, c), until| keep(p) && keep(c) && *until > version);
        self.demoted
            .retain(|p, (until, _)| keep(p) && *until > version);
        self.excluded.retain(|p| keep(p));
        self.distrusted.retain(|p| keep(p));
    }
}

#[cfg(test)]
#[path = "forwarding_tests.rs"]
mod tests;
