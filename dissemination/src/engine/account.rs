//! The learner's side of accountable forwarding (`docs/broadcast.md`, "Accountable
//! forwarding"): it reads the signed delivery receipts in its workers' heartbeats, judges
//! each against the plan it signed for that version and the install reports it heard
//! (`control::forwarding::judge`), feeds the verdicts to the attribution ledger, carries out
//! its strikes, and hands its separations, demotions and exclusions — with the epoch's seat
//! draw — to the next plan ([`Disseminator::seating`]).
//!
//! An accusation of silence (`Decision::Accuse`) is weighed before anyone is struck
//! (`control::forwarding::sentence`): by how many of the accusing children the learner counts
//! as established ([`Disseminator::set_established`]: past probation on verified work), and,
//! unless two are, by the learner's own probe of the parent — one chunk of the newest version
//! the parent reported holding, asked over chunk fetch.
//!
//! Owns: which receipts count (signed by the heartbeat's sender, for a version this learner
//! planned, naming the parent its plan named throughout that version, once per child and
//! version, read clamped), when a parent counts as having held a version, the probe of an
//! accused parent, the seat seed, and the forwarding section of `/status` ([`ForwardingView`]). Must not touch: the verdict and
//! attribution rules (`control::forwarding`), the seat rules (`control::seats`), the wire.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use std::sync::Arc;

use control::forwarding::{
    judge, sentence, Decision, Delivery, Expectation, Fault, Ledger, Probe, Verdict,
};
use control::plan::ChainPlan;
use control::seats::{epoch, redraws, Seating};
use control::units::mbps_to_bytes_per_s;
use p2p::{DeliveryReceipt, Heartbeat, PeerId};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::Disseminator;

/// Published versions whose plans and install reports are kept for judging receipts.
const KEEP_VERSIONS: usize = 16;

/// How long the bytes of a receipt took: from the first chunk to the last, plus one chunk
/// time at `B̂w` (the first chunk's own).
fn transfer_time(r: &DeliveryReceipt, chunk_bytes: u64, bytes_per_s: f64) -> Duration {
    let span = r
        .last_ms
        .unwrap_or(0)
        .saturating_sub(r.first_ms.unwrap_or(0));
    let one = if bytes_per_s > 0.0 {
        chunk_bytes.min(r.bytes) as f64 / bytes_per_s
    } else {
        0.0
    };
    Duration::from_millis(span) + Duration::from_secs_f64(one.min(60.0))
}

/// One published version as the learner planned it.
#[derive(Debug)]
struct Published {
    at: Instant,
    chunk_bytes: u64,
    /// Each worker's parent in the plan as first signed (`None`: the learner).
    first: HashMap<PeerId, Option<PeerId>>,
    /// … and in the newest plan for the version (a departure re-signs it).
    last: HashMap<PeerId, Option<PeerId>>,
}

/// Whether the learner counts a worker as established (past probation on verified work).
type EstablishedFn = Arc<dyn Fn(&PeerId) -> bool + Send + Sync>;

/// [`EstablishedFn`], where set (none: nobody is).
#[derive(Clone, Default)]
pub(super) struct Established(Option<EstablishedFn>);

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Established(set)"
        } else {
            "Established(none)"
        })
    }
}

impl Established {
    fn is(&self, peer: &PeerId) -> bool {
        self.0.as_ref().is_some_and(|f| f(peer))
    }
}

/// The learner's accounting of its forwarders.
#[derive(Debug, Default)]
pub(super) struct Accounts {
    ledger: Ledger<PeerId>,
    versions: BTreeMap<u64, Published>,
    /// When each worker was first heard holding each recent version.
    held: HashMap<PeerId, BTreeMap<u64, Instant>>,
    judged: BTreeSet<(u64, PeerId)>,
    judged_total: u64,
    refused: u64,
    silent_strikes: BTreeMap<PeerId, u64>,
    /// The version of each worker's newest plan seat with a child (seats rotate by it).
    last_parent: HashMap<PeerId, u64>,
    established: Established,
    /// Accused parents being probed now.
    probing: BTreeSet<PeerId>,
    /// Accusations weighed, by outcome: `struck`, `demoted`, `cleared`.
    sentences: BTreeMap<String, u64>,
}

impl Accounts {
    /// The learner signed `plan` for `version` (its first plan when new, else a re-signed one).
    pub(super) fn planned(&mut self, version: u64, chunk_bytes: u64, plan: &ChainPlan<PeerId>) {
        let parents = plan.parents();
        for p in parents.values().flatten() {
            self.last_parent.insert(*p, version);
        }
        match self.versions.get_mut(&version) {
            Some(p) => p.last = parents,
            None => {
                self.versions.insert(
                    version,
                    Published {
                        at: Instant::now(),
                        chunk_bytes,
                        first: parents.clone(),
                        last: parents,
                    },
                );
            }
        }
        while self.versions.len() > KEEP_VERSIONS {
            self.versions.pop_first();
        }
        let oldest = self.versions.keys().next().copied().unwrap_or(0);
        self.judged.retain(|(v, _)| *v >= oldest);
        for h in self.held.values_mut() {
            h.retain(|v, _| *v >= oldest);
        }
    }

    /// `peer` reported holding `installed` (and so every older version) at `now`.
    fn heard(&mut self, peer: PeerId, installed: u64, now: Instant) {
        let held = self.held.entry(peer).or_default();
        for &v in self.versions.keys().filter(|&&v| v <= installed) {
            held.entry(v).or_insert(now);
        }
    }

    /// The verdict on one receipt from `child`, or why it does not count.
    fn judge(
        &mut self,
        child: PeerId,
        r: &DeliveryReceipt,
        swarm_id: &str,
        bytes_per_s: f64,
    ) -> Option<(PeerId, Verdict, u64)> {
        if self.judged.contains(&(r.version, child)) {
            return None;
        }
        if !r.verify(&child, swarm_id) {
            self.refused += 1;
            warn!(%child, version = r.version, "delivery receipt with a bad signature: ignored");
            return None;
        }
        let p = self.versions.get(&r.version)?;
        let parent = r.parent_id()?;
        // The plan named this parent for the child when the version was published and still
        // does: a child moved mid-version has two parents, and neither answers for it alone.
        let named = |m: &HashMap<PeerId, Option<PeerId>>| m.get(&child) == Some(&Some(parent));
        if !(named(&p.first) && named(&p.last)) {
            debug!(%child, %parent, version = r.version, "receipt names a parent this plan did not");
            return None;
        }
        self.judged.insert((r.version, child));
        self.judged_total += 1;
        // Counts a parent inflated (or a child mis-stated) are read within their range.
        let r = &r.clamped();
        let parent_held_ms = self
            .held
            .get(&parent)
            .and_then(|h| h.get(&r.version))
            .map(|&t| t.saturating_duration_since(p.at).as_millis() as u64);
        let d = Delivery {
            wanted: r.wanted,
            bytes: r.bytes,
            duplicates: r.duplicates,
            spoke: r.spoke,
            hello_ms: r.hello_ms,
            first_ms: r.first_ms,
            last_ms: r.last_ms,
            end_ms: r.end_ms,
        };
        let e = Expectation {
            bytes_per_s,
            chunk_bytes: p.chunk_bytes,
            parent_held_ms,
            received_ms: p.at.elapsed().as_millis() as u64,
        };
        Some((parent, judge(&d, &e), p.chunk_bytes))
    }
}

/// The forwarding section of the learner's `/status` (`docs/protocol.md`, "Admin endpoint").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ForwardingView {
    /// Versions per plan epoch (seats are re-drawn at the first version of each).
    pub epoch_versions: u64,
    /// Receipts judged (signed, for a planned edge), and refused (bad signature).
    pub receipts_judged: u64,
    pub receipts_refused: u64,
    /// Verdicts so far: `on_time`, `slow`, `silent`, `excused`, `overfed` → count.
    pub verdicts: BTreeMap<String, u64>,
    /// Workers ranked after every other forwarder now, with why: `slow_parent` or `child`.
    pub demoted: BTreeMap<String, String>,
    /// Workers excluded from forwarding for the run (silent parents).
    pub excluded: Vec<String>,
    /// Parent–child pairs no plan seats now (`[parent, child]`).
    pub separated: Vec<[String; 2]>,
    /// `silent_forwarding` strikes given, per worker.
    pub silent_strikes: BTreeMap<String, u64>,
    /// Accusations of silence weighed (`control::forwarding::sentence`), by outcome:
    /// `struck`, `demoted`, `cleared`.
    pub accusations: BTreeMap<String, u64>,
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::OnTime => "on_time",
        Verdict::Slow => "slow",
        Verdict::Silent => "silent",
        Verdict::Excused => "excused",
        Verdict::Overfed => "overfed",
    }
}

fn fault_name(f: Fault) -> &'static str {
    match f {
        Fault::SlowParent => "slow_parent",
        Fault::SilentParent => "silent_parent",
        Fault::OverfeedingParent => "overfeeding_parent",
        Fault::Child => "child",
    }
}

impl Disseminator {
    /// Learner: reads a worker's heartbeat — its install report, and its delivery receipts —
    /// and carries out what the attribution ledger decides (strikes now; separations,
    /// demotions and exclusions in the next plan).
    pub async fn observe_heartbeat(&self, peer: PeerId, hb: &Heartbeat) {
        if !self.is_learner() {
            return;
        }
        let now = Instant::now();
        let bytes_per_s = mbps_to_bytes_per_s(self.inner.cfg.plan.worker_mbps);
        let mut decisions = Vec::new();
        let mut scored = Vec::new();
        {
            let mut st = self.lock();
            let acc = &mut st.accounts;
            if let Some(v) = hb.installed_version {
                acc.heard(peer, v, now);
            }
            for r in &hb.receipts {
                let swarm = &self.inner.cfg.swarm_id;
                let Some((parent, verdict, chunk)) = acc.judge(peer, r, swarm, bytes_per_s) else {
                    continue;
                };
                debug!(child = %peer, %parent, version = r.version, ?verdict, "delivery judged");
                decisions.extend(acc.ledger.observe(r.version, &parent, &peer, verdict));
                let r = r.clamped();
                let time = transfer_time(&r, chunk, bytes_per_s);
                scored.push((parent, verdict, r.bytes, time));
            }
        }
        // A delivery on time measures its parent's uplink and its child's downlink: both ends'
        // ECHO scores get the transfer (bytes and time), as a first hop's does from the
        // learner's own pushes. Without it only first hops would ever be measured by the
        // learner, and they would keep the best scores — and the heads of the chains — for
        // good. A lagging one is left to the ledger, which attributes it by moving the child:
        // scored at once, it would rank parent or child (whichever is at fault) at a tail,
        // where the parent has no child to tell.
        for (parent, verdict, bytes, time) in scored {
            if verdict == Verdict::OnTime {
                self.credit(parent, bytes, time).await;
                self.credit(peer, bytes, time).await;
            }
        }
        for d in decisions {
            self.carry_out(d).await;
        }
    }

    /// Learner: counts worker `peer` as established (past probation on verified work) when
    /// `f` says so — what weighs its receipts' accusations (module docs). Unset, nobody is,
    /// and every accusation waits for the learner's probe.
    pub fn set_established(&self, f: impl Fn(&PeerId) -> bool + Send + Sync + 'static) {
        self.lock().accounts.established = Established(Some(Arc::new(f)));
    }

    /// Carries out one decision of the attribution ledger: strikes now, an accusation weighed
    /// (probing the parent unless two established children accuse it), the rest logged (the
    /// next plan reads them).
    async fn carry_out(&self, d: Decision<PeerId>) {
        match d {
            Decision::Separate {
                parent,
                child,
                until,
            } => {
                info!(%parent, %child, until, "forwarding: child lagged twice in a row; moving it")
            }
            Decision::Demote { peer, until, fault } => {
                warn!(%peer, until, fault = fault_name(fault), "forwarding: demoted")
            }
            Decision::Strike { peer, count } => {
                warn!(%peer, count, "forwarding: convicted of silence; struck and excluded");
                *self.lock().accounts.silent_strikes.entry(peer).or_default() += u64::from(count);
                for _ in 0..count {
                    self.strike(peer, crate::Offence::SilentForwarding).await;
                }
            }
            Decision::Accuse {
                peer,
                count,
                children,
            } => self.accused(peer, count, children),
        }
    }

    /// Weighs an accusation of silence against `peer` (module docs): at once when two of the
    /// accusing `children` are established, else after the learner's own probe of it (one
    /// at a time per parent, as an engine task).
    fn accused(&self, peer: PeerId, count: u32, children: Vec<PeerId>) {
        let (established, target) = {
            let mut st = self.lock();
            let acc = &mut st.accounts;
            let established = children.iter().filter(|c| acc.established.is(c)).count();
            if established < 2 && !acc.probing.insert(peer) {
                return;
            }
            // The newest version it reported holding, of those whose manifest is still here.
            let target = acc
                .held
                .get(&peer)
                .and_then(|h| h.keys().next_back().copied());
            (established, target)
        };
        info!(%peer, count, established, "forwarding: accused of silence by two children");
        if established >= 2 {
            self.sentence_accused(peer, sentence(count, established, None));
            return;
        }
        let me = self.clone();
        self.spawn(async move {
            let probe = match target {
                Some(v) => me.probe_holder(peer, v, me.probe_pick(&peer, v)).await,
                None => Probe::Unanswered,
            };
            info!(%peer, version = ?target, ?probe, "forwarding: probed the accused parent");
            me.lock().accounts.probing.remove(&peer);
            me.sentence_accused(peer, sentence(count, established, Some(probe)));
        });
    }

    /// Applies `s` to the accused `peer` in the ledger and carries out what follows.
    fn sentence_accused(&self, peer: PeerId, s: control::forwarding::Sentence) {
        let decision = {
            let mut st = self.lock();
            let acc = &mut st.accounts;
            let version = acc.versions.keys().next_back().copied().unwrap_or(0);
            let outcome = match s {
                control::forwarding::Sentence::Strike { .. } => "struck",
                control::forwarding::Sentence::Demote => "demoted",
                control::forwarding::Sentence::Clear => "cleared",
            };
            *acc.sentences.entry(outcome.to_string()).or_default() += 1;
            acc.ledger.sentenced(version, &peer, s)
        };
        match decision {
            None => info!(%peer, "forwarding: accused parent cleared (it served the probe)"),
            Some(d) => {
                let me = self.clone();
                self.spawn(async move { me.carry_out_sentence(d).await });
            }
        }
    }

    /// A sentence's decision (a strike or a demotion; never another accusation).
    async fn carry_out_sentence(&self, d: Decision<PeerId>) {
        match d {
            Decision::Accuse { .. } => {}
            d => self.carry_out(d).await,
        }
    }

    /// Which chunk a probe asks for: keyed by the learner's signing key, so the parent cannot
    /// keep just the chunks it will be asked for.
    fn probe_pick(&self, peer: &PeerId, version: u64) -> u64 {
        let Ok(key) = self.signing_key() else {
            return version;
        };
        let k = blake3::derive_key("echo-swarm forwarding probe v1", &key.to_bytes());
        let mut h = blake3::Hasher::new_keyed(&k);
        h.update(&peer.to_bytes());
        h.update(&version.to_le_bytes());
        u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap_or([0; 8]))
    }

    /// Learner: what the plan for `version` adds to the ranking rules — the epoch's seat
    /// draw when a new epoch begins (`prev`: the previous plan's version) and `draw` allows
    /// it, and the ledger's separations, demotions and exclusions; the ledger first forgets
    /// workers not in `live`.
    pub(super) fn seating(
        &self,
        version: u64,
        prev: Option<u64>,
        live: &[PeerId],
        draw: bool,
    ) -> Seating<PeerId> {
        let epoch_versions = self.inner.cfg.plan.epoch_versions;
        let redraw = (draw && redraws(version, prev, epoch_versions))
            .then(|| self.seat_seed(epoch(version, epoch_versions)))
            .flatten();
        let mut st = self.lock();
        st.accounts.last_parent.retain(|p, _| live.contains(p));
        let ledger = &mut st.accounts.ledger;
        ledger.retain(version, |p| live.contains(p));
        Seating {
            redraw,
            separated: ledger.separated(version),
            demoted: ledger.demoted(version),
            excluded: ledger.excluded().clone(),
            suspects: ledger.suspects(),
            last_parent: st
                .accounts
                .last_parent
                .iter()
                .filter(|(p, _)| live.contains(p))
                .map(|(p, v)| (*p, *v))
                .collect(),
        }
    }

    /// The seed of an epoch's seat draw: keyed by a key derived from the learner's signing
    /// key, so no worker can predict its seat (or grind a key for a good one).
    fn seat_seed(&self, epoch: u64) -> Option<u64> {
        let key = self.signing_key().ok()?;
        let k = blake3::derive_key("echo-swarm plan seats v1", &key.to_bytes());
        let h = blake3::keyed_hash(&k, &epoch.to_le_bytes());
        Some(u64::from_le_bytes(h.as_bytes()[..8].try_into().ok()?))
    }

    /// Learner: the forwarding section of `/status`.
    pub fn forwarding_view(&self) -> ForwardingView {
        let st = self.lock();
        let acc = &st.accounts;
        let version = acc.versions.keys().next_back().copied().unwrap_or(0);
        ForwardingView {
            epoch_versions: self.inner.cfg.plan.epoch_versions,
            receipts_judged: acc.judged_total,
            receipts_refused: acc.refused,
            verdicts: acc
                .ledger
                .verdicts()
                .iter()
                .map(|(v, n)| (verdict_name(*v).to_string(), *n))
                .collect(),
            demoted: acc
                .ledger
                .demoted(version)
                .into_iter()
                .filter_map(|p| {
                    let f = acc.ledger.fault_of(&p, version)?;
                    Some((p.to_string(), fault_name(f).to_string()))
                })
                .collect(),
            excluded: acc
                .ledger
                .excluded()
                .iter()
                .map(ToString::to_string)
                .collect(),
            separated: acc
                .ledger
                .separated(version)
                .into_iter()
                .map(|(p, c)| [p.to_string(), c.to_string()])
                .collect(),
            silent_strikes: acc
                .silent_strikes
                .iter()
                .map(|(p, n)| (p.to_string(), *n))
                .collect(),
            accusations: acc.sentences.clone(),
        }
    }
}
