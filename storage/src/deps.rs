//! What a delta snapshot depends on (`docs/broadcast.md`, "Catch-up"): the pure rules that
//! garbage collection and a worker's catch-up apply to the chain of manifests — a delta
//! version is worth nothing without its base, and the base of a delta may itself be a delta,
//! back to a keyframe (a full payload).
//!
//! Owns: which versions a chunk store keeps ([`retained`]) and what a worker that cannot
//! apply a delta fetches to reach it ([`plan_catch_up`]). Must not touch: I/O — callers pass
//! the manifests' dependency links and what is held in.

use std::collections::{BTreeMap, BTreeSet};

use crate::PayloadKind;

/// The most links a catch-up (or a rebuild from the store) follows back from its target. The
/// learner publishes a keyframe at least every `broadcast.keyframe_every` versions (default
/// 16), so a chain has at most that many links; a longer one (a `keyframe_every` above 1024)
/// is not caught up — the worker waits for the keyframe. The bound also stops a walk over an
/// inconsistent store.
pub const MAX_CHAIN: usize = 1024;

/// The version a payload depends on: the base of a delta, nothing for a full payload.
pub fn base_of(kind: PayloadKind) -> Option<u64> {
    match kind {
        PayloadKind::Delta { base_version, .. } => Some(base_version),
        _ => None,
    }
}

/// The version a payload needs kept beside it in a chunk store: a delta's base, or the
/// published base an adapter version is trained on (without it a restarted worker holds
/// adapters for nothing; the base's own chain ends there, a base is a full payload). Catch-up
/// follows [`base_of`] only: adapters are applied to a base, never reconstructed from one.
pub fn needs(kind: PayloadKind) -> Option<u64> {
    match kind {
        PayloadKind::Adapter {
            base_version: Some(b),
            ..
        } => Some(b),
        other => base_of(other),
    }
}

/// Versions a chunk store keeps: the newest `keep` versions, and every version a kept delta
/// needs — its base, that base's base, back to the keyframe (as far as the links are known).
///
/// Why: the newest `keep` snapshots are what the operator asked for (the staleness window,
/// the spot checker); but a kept delta without its base reconstructs nothing — not for this
/// node's own restart (it rebuilds its installed payload from the store), nor for the workers
/// that catch up by fetching "keyframe + deltas since" from it. The closure is bounded by the
/// keyframe period: the chain of a kept delta ends at the keyframe at most
/// `keyframe_every − 1` versions below it, so at most `keep + keyframe_every − 1` versions
/// are kept. A base that is not known (never received) ends the walk: nothing to keep.
pub fn retained(links: &BTreeMap<u64, Option<u64>>, keep: usize) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for &v in links.keys().rev().take(keep) {
        let mut cur = v;
        for _ in 0..MAX_CHAIN {
            if !out.insert(cur) {
                break; // the rest of this chain is kept already
            }
            match links.get(&cur).copied().flatten() {
                Some(base) if links.contains_key(&base) => cur = base,
                _ => break,
            }
        }
    }
    out
}

/// What a worker knows of one version on the way to its catch-up target: the base it needs
/// (`None`: a keyframe) and how many bytes of it are not held yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub base: Option<u64>,
    pub missing_bytes: u64,
}

/// What to do to reach a target version ([`plan_catch_up`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatchUpPlan {
    /// The worker holds the target, or a newer version.
    UpToDate,
    /// The manifest of this version is needed to go on (ask for it, then plan again).
    NeedManifest(u64),
    /// Complete and apply `versions` in order, starting from the installed full payload of
    /// `from` (`None`: the first is a keyframe); `bytes` still to fetch.
    Apply {
        from: Option<u64>,
        versions: Vec<u64>,
        bytes: u64,
    },
    /// The chain is longer than [`MAX_CHAIN`] or loops: nothing to do but wait for a keyframe.
    Unreachable,
}

/// How a worker holding the full payload of `held` reaches `target`, given the links it knows
/// (`links[v]` for each version whose signed manifest it has).
///
/// The rule walks the target's chain of bases down, and stops at the first of:
/// - the version the worker holds: then only the deltas after it are needed;
/// - a keyframe: then the keyframe and every delta after it.
///
/// Why the first is taken whenever it is reached — the "fewer bytes" choice: the chain is
/// linear, so the deltas after `held` are a suffix of "keyframe + deltas since"; the suffix
/// is never more bytes, and it is fetched from the same holders. A worker whose held version
/// is not on the chain (it held a version the learner superseded with a new keyframe, or it
/// has nothing) must start at the keyframe, the only full payload the chain has.
/// (A direct delta computed by the learner from `held` to `target` would be at most the union
/// of the deltas' changes; it is not offered — `docs/broadcast.md`, "Catch-up" says why.)
pub fn plan_catch_up(links: &BTreeMap<u64, Link>, held: Option<u64>, target: u64) -> CatchUpPlan {
    if held.is_some_and(|h| h >= target) {
        return CatchUpPlan::UpToDate;
    }
    let mut chain = Vec::new();
    let mut cur = target;
    let from = loop {
        if chain.len() >= MAX_CHAIN {
            return CatchUpPlan::Unreachable;
        }
        if Some(cur) == held {
            break Some(cur);
        }
        let Some(link) = links.get(&cur) else {
            return CatchUpPlan::NeedManifest(cur);
        };
        chain.push(cur);
        match link.base {
            None => break None,
            // A base is always older (the manifest's own check); anything else is a loop.
            Some(b) if b < cur => cur = b,
            Some(_) => return CatchUpPlan::Unreachable,
        }
    };
    chain.reverse();
    let bytes = chain.iter().map(|v| links[v].missing_bytes).sum();
    CatchUpPlan::Apply {
        from,
        versions: chain,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Links of a learner with keyframes at `keyframes`, versions `1..=n`, each `bytes[v]`
    /// missing (keyframes 100, deltas 10 unless given).
    fn chain_links(n: u64, keyframes: &[u64]) -> BTreeMap<u64, Link> {
        (1..=n)
            .map(|v| {
                let kf = keyframes.contains(&v);
                let link = Link {
                    base: (!kf).then_some(v - 1),
                    missing_bytes: if kf { 100 } else { 10 },
                };
                (v, link)
            })
            .collect()
    }

    fn bases(l: &BTreeMap<u64, Link>) -> BTreeMap<u64, Option<u64>> {
        l.iter().map(|(v, k)| (*v, k.base)).collect()
    }

    #[test]
    fn an_adapter_version_needs_its_published_base_kept_but_catch_up_ignores_it() {
        let adapter = |base_version| PayloadKind::Adapter {
            base_version,
            base_hash: [7; 32],
        };
        assert_eq!(needs(adapter(Some(0))), Some(0));
        assert_eq!(needs(adapter(None)), None);
        assert_eq!(base_of(adapter(Some(0))), None);
        let delta = PayloadKind::Delta {
            base_version: 3,
            full_root: [1; 32],
        };
        assert_eq!((needs(delta), base_of(delta)), (Some(3), Some(3)));
        // Base 0, then adapter versions 1..=5; keeping the newest 2 keeps the base too.
        let links: BTreeMap<u64, Option<u64>> = std::iter::once((0, None))
            .chain((1..=5).map(|v| (v, needs(adapter(Some(0))))))
            .collect();
        assert_eq!(retained(&links, 2), BTreeSet::from([0, 4, 5]));
    }

    #[test]
    fn gc_keeps_the_newest_and_every_base_a_kept_delta_needs() {
        // Keyframes at 1 and 5; deltas between.
        let l = bases(&chain_links(7, &[1, 5]));
        // Newest 2 are 6 and 7 (deltas on keyframe 5): 5 is kept too, 1–4 are not.
        assert_eq!(retained(&l, 2), BTreeSet::from([5, 6, 7]));
        // Newest 4 reach 4, a delta on 3, on 2, on keyframe 1: the whole first chain too.
        assert_eq!(retained(&l, 4), (1..=7).collect());
        // A newest keyframe needs nothing older.
        let l = bases(&chain_links(5, &[1, 5]));
        assert_eq!(retained(&l, 1), BTreeSet::from([5]));
        // A base never received ends the walk (nothing to keep for it).
        let mut gap = bases(&chain_links(6, &[1]));
        gap.remove(&3);
        assert_eq!(retained(&gap, 2), BTreeSet::from([4, 5, 6]));
        assert!(retained(&BTreeMap::new(), 3).is_empty());
    }

    #[test]
    fn a_worker_on_the_chain_fetches_only_the_deltas_after_what_it_holds() {
        let l = chain_links(8, &[1, 5]);
        assert_eq!(
            plan_catch_up(&l, Some(6), 8),
            CatchUpPlan::Apply {
                from: Some(6),
                versions: vec![7, 8],
                bytes: 20
            }
        );
        assert_eq!(plan_catch_up(&l, Some(8), 8), CatchUpPlan::UpToDate);
        assert_eq!(plan_catch_up(&l, Some(9), 8), CatchUpPlan::UpToDate);
    }

    #[test]
    fn a_late_joiner_or_one_off_the_chain_starts_at_the_keyframe() {
        let l = chain_links(8, &[1, 5]);
        let from_keyframe = CatchUpPlan::Apply {
            from: None,
            versions: vec![5, 6, 7, 8],
            bytes: 130,
        };
        assert_eq!(plan_catch_up(&l, None, 8), from_keyframe);
        // Held v3 is on the old chain: the keyframe at 5 is the only way.
        assert_eq!(plan_catch_up(&l, Some(3), 8), from_keyframe);
        // A target that is itself a keyframe is that keyframe alone.
        assert_eq!(
            plan_catch_up(&l, Some(3), 5),
            CatchUpPlan::Apply {
                from: None,
                versions: vec![5],
                bytes: 100
            }
        );
        // Bytes already held count for nothing.
        let mut held = l.clone();
        held.get_mut(&5).unwrap().missing_bytes = 0;
        assert!(matches!(
            plan_catch_up(&held, None, 8),
            CatchUpPlan::Apply { bytes: 30, .. }
        ));
    }

    #[test]
    fn unknown_manifests_are_asked_for_one_at_a_time_and_loops_are_refused() {
        let mut l = chain_links(8, &[1, 5]);
        l.remove(&6);
        assert_eq!(plan_catch_up(&l, None, 8), CatchUpPlan::NeedManifest(6));
        assert_eq!(plan_catch_up(&l, None, 9), CatchUpPlan::NeedManifest(9));
        // The walk stops at the held version before it needs an unknown one.
        assert!(matches!(
            plan_catch_up(&l, Some(7), 8),
            CatchUpPlan::Apply { from: Some(7), .. }
        ));
        // A base that is not older (only an inconsistent store could say so).
        let looped = BTreeMap::from([(
            4,
            Link {
                base: Some(4),
                missing_bytes: 1,
            },
        )]);
        assert_eq!(plan_catch_up(&looped, None, 4), CatchUpPlan::Unreachable);
    }
}
