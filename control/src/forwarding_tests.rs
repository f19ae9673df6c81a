use super::*;

/// B̂w = 100 Mbit/s, 64 KiB chunks; the parent held the version from publication on, or never.
fn expect(parent_held: bool) -> Expectation {
    Expectation {
        bytes_per_s: 12.5e6,
        chunk_bytes: 64 << 10,
        parent_held_ms: parent_held.then_some(0),
        received_ms: 6000,
    }
}

/// 1.25 MB wanted, `bytes` of it from the parent from `first_ms` on; the child stopped needing
/// it (and the push ended) at `end_ms`.
fn delivery(bytes: u64, first_ms: Option<u64>, end_ms: u64) -> Delivery {
    Delivery {
        wanted: 1_250_000,
        bytes,
        duplicates: 0,
        spoke: first_ms.is_some(),
        hello_ms: first_ms.map(|_| 1),
        first_ms,
        last_ms: first_ms.map(|_| end_ms),
        end_ms,
    }
}

#[test]
fn verdicts_follow_bytes_rate_and_whether_the_parent_held_the_version() {
    let e = expect(true);
    // At B̂w: 1.25 MB in 100 ms.
    assert_eq!(
        judge(&delivery(1_250_000, Some(5), 105), &e),
        Verdict::OnTime
    );
    // At a tenth of B̂w: 1 s.
    assert_eq!(
        judge(&delivery(1_250_000, Some(5), 1005), &e),
        Verdict::Slow
    );
    // One chunk, then nothing until the child repaired the rest 5 s later.
    let stall = Delivery {
        last_ms: Some(5),
        ..delivery(65_536, Some(5), 5005)
    };
    assert_eq!(judge(&stall, &e), Verdict::Slow);
    // Half delivered at B̂w when the child met the push with its own repair: on time.
    assert_eq!(judge(&delivery(625_000, Some(5), 60), &e), Verdict::OnTime);
    // The child repaired everything in 0.3 s; the parent's push went on, at a tenth of B̂w.
    let crawl = Delivery {
        last_ms: Some(1005),
        ..delivery(1_250_000, Some(5), 300)
    };
    assert_eq!(judge(&crawl, &e), Verdict::Slow);
    // Not a word.
    let silent = Delivery {
        wanted: 1_250_000,
        end_ms: 5000,
        ..Delivery::default()
    };
    assert_eq!(judge(&silent, &e), Verdict::Silent);
    // A hello and then nothing: a stall, not silence.
    let stalled = Delivery {
        hello_ms: Some(2),
        spoke: true,
        ..silent
    };
    assert_eq!(judge(&stalled, &e), Verdict::Slow);
    // The parent held the version only late in the window: it was fed slowly itself, so its
    // slowness is excused; its silence is not.
    let late = Expectation {
        parent_held_ms: Some(4960),
        ..e
    };
    assert_eq!(judge(&stalled, &late), Verdict::Excused);
    assert_eq!(judge(&crawl, &late), Verdict::Excused);
    assert_eq!(judge(&silent, &late), Verdict::Silent);
    // Held only after the child reported: silence is excused too.
    let after = Expectation {
        parent_held_ms: Some(6001),
        ..e
    };
    assert_eq!(judge(&silent, &after), Verdict::Excused);
    // Held after the child stopped needing the version (it fetched it from others at once),
    // but before it reported: silent all the same — the hello was due at acceptance.
    let early = Delivery {
        end_ms: 200,
        ..silent
    };
    let held = Expectation {
        parent_held_ms: Some(900),
        ..e
    };
    assert_eq!(judge(&early, &held), Verdict::Silent);
    // A hello only for a newer version: its plan for this one raced the next.
    let raced = Delivery {
        spoke: true,
        ..silent
    };
    assert_eq!(judge(&raced, &e), Verdict::Excused);
    // The parent did not hold the version itself: no silence or slowness is its doing…
    assert_eq!(judge(&silent, &expect(false)), Verdict::Excused);
    assert_eq!(
        judge(&delivery(65_536, Some(5), 5005), &expect(false)),
        Verdict::Excused
    );
    // … but what it delivered well is on time all the same.
    assert_eq!(
        judge(&delivery(1_250_000, Some(5), 105), &expect(false)),
        Verdict::OnTime
    );
    // Nothing was wanted (the child held every chunk already).
    let nothing = Delivery {
        wanted: 0,
        ..silent
    };
    assert_eq!(judge(&nothing, &e), Verdict::OnTime);
}

/// An honest link however slow sends its hello and some bytes: never silent.
#[test]
fn an_honest_slow_link_is_at_worst_slow() {
    for tenth in [1u64, 10, 100, 1000] {
        // `tenth`: how many times slower than B̂w; the child gives up after 5 s.
        let bytes = (12_500_000 / tenth * 5).clamp(1, 1_250_000);
        let d = delivery(bytes, Some(30), 5000);
        assert_ne!(judge(&d, &expect(true)), Verdict::Silent, "{tenth}");
    }
}

fn p(name: &str) -> String {
    name.to_string()
}

fn lag_twice(
    l: &mut Ledger<String>,
    v: u64,
    parent: &str,
    child: &str,
    x: Verdict,
) -> Vec<Decision<String>> {
    let first = l.observe(v, &p(parent), &p(child), x);
    assert!(first.is_empty(), "{first:?}");
    l.observe(v + 1, &p(parent), &p(child), x)
}

#[test]
fn a_silent_parent_is_separated_from_its_child_then_struck_when_a_second_child_sees_it() {
    let mut l = Ledger::default();
    let out = lag_twice(&mut l, 1, "bad", "c1", Verdict::Silent);
    assert_eq!(
        out,
        [Decision::Separate {
            parent: p("bad"),
            child: p("c1"),
            until: 2 + SEPARATE_VERSIONS
        }]
    );
    assert_eq!(l.separated(3), [(p("bad"), p("c1"))]);
    assert_eq!(l.suspects(), [p("bad")].into(), "to be given another child");
    // One child's word is not enough: nothing else yet.
    assert!(l.excluded().is_empty() && l.demoted(3).is_empty());
    // Moved: `c1` under `good` is fine, `bad`'s new child `c2` gets nothing either.
    assert!(l
        .observe(3, &p("good"), &p("c1"), Verdict::OnTime)
        .is_empty());
    // A plan signed before the separation still seats `c1` under it: the evidence grows.
    let more = l.observe(3, &p("bad"), &p("c1"), Verdict::Silent);
    assert!(more.is_empty(), "{more:?}");
    let more = l.observe(4, &p("bad"), &p("c1"), Verdict::Silent);
    assert_eq!(more.len(), 1, "separated again, nothing more: {more:?}");
    let out = lag_twice(&mut l, 5, "bad", "c2", Verdict::Silent);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        out[1],
        Decision::Accuse {
            peer: p("bad"),
            count: 6,
            children: vec![p("c1"), p("c2")],
        }
    );
    assert!(l.excluded().is_empty(), "receipts alone exclude nobody");
    // The learner's probe found it withholding a chunk it reported holding: convicted.
    let s = sentence(6, 0, Some(Probe::Withheld));
    assert_eq!(s, Sentence::Strike { count: 6 });
    assert_eq!(
        l.sentenced(6, &p("bad"), s),
        Some(Decision::Strike {
            peer: p("bad"),
            count: 6
        })
    );
    assert!(l.excluded().contains("bad"));
    assert!(l.suspects().is_empty());
    assert_eq!(l.fault_of(&p("bad"), 7), Some(Fault::SilentParent));
    // Excluded: what its children say about it no longer matters.
    assert!(lag_twice(&mut l, 7, "bad", "c3", Verdict::Silent).is_empty());
}

#[test]
fn a_slow_parent_is_demoted_and_never_struck() {
    let mut l = Ledger::default();
    lag_twice(&mut l, 1, "slow", "c1", Verdict::Slow);
    let out = lag_twice(&mut l, 3, "slow", "c2", Verdict::Slow);
    assert_eq!(
        out.last(),
        Some(&Decision::Demote {
            peer: p("slow"),
            until: 4 + DEMOTE_VERSIONS,
            fault: Fault::SlowParent
        })
    );
    assert!(l.demoted(5).contains("slow"));
    assert!(!l.demoted(4 + DEMOTE_VERSIONS).contains("slow"), "expires");
    // Lags from plans signed before the demotion do not make it a suspect again: it has had
    // its test, and ends chains now.
    lag_twice(&mut l, 5, "slow", "c3", Verdict::Slow);
    assert!(l.suspects().is_empty());
    // A parent silent to one child and slow to another sent bytes: at worst slow.
    let mut m = Ledger::default();
    lag_twice(&mut m, 1, "x", "c1", Verdict::Silent);
    let out = lag_twice(&mut m, 3, "x", "c2", Verdict::Slow);
    assert!(
        out.iter().all(|d| !matches!(d, Decision::Strike { .. })),
        "{out:?}"
    );
}

/// However the children of an honest slow link are shuffled, it is only ever demoted.
#[test]
fn an_honest_slow_link_is_never_struck_whatever_the_seating() {
    let mut l = Ledger::default();
    let children = ["a", "b", "c", "d"];
    for v in 0..400u64 {
        let child = children[(v / 3 % 4) as usize];
        for d in l.observe(v, &p("slow"), &p(child), Verdict::Slow) {
            assert!(!matches!(d, Decision::Strike { .. }), "v{v}: {d:?}");
        }
        // The others deliver well to each other.
        l.observe(v, &p("a"), &p("b"), Verdict::OnTime);
    }
    assert!(l.excluded().is_empty());
}

#[test]
fn a_child_that_lags_under_two_parents_is_at_fault_and_no_longer_believed() {
    let mut l = Ledger::default();
    lag_twice(&mut l, 1, "p1", "liar", Verdict::Silent);
    // `p1` serves another child well: cleared.
    assert!(l.suspects().contains("p1"));
    assert!(l.observe(3, &p("p1"), &p("c2"), Verdict::OnTime).is_empty());
    assert!(l.suspects().is_empty());
    let out = lag_twice(&mut l, 3, "p2", "liar", Verdict::Silent);
    assert_eq!(
        out.last(),
        Some(&Decision::Demote {
            peer: p("liar"),
            until: 4 + DEMOTE_VERSIONS,
            fault: Fault::Child
        })
    );
    assert!(l.excluded().is_empty(), "neither parent is struck");
    // Its receipts no longer count: framing a third parent gets nowhere.
    assert!(lag_twice(&mut l, 5, "p3", "liar", Verdict::Silent).is_empty());
    // `p2` has a clean record: a lag with its next child starts from scratch.
    assert!(lag_twice(&mut l, 7, "p2", "c3", Verdict::Silent)
        .iter()
        .all(|d| matches!(d, Decision::Separate { .. })));
}

#[test]
fn a_transient_lag_or_an_excused_version_holds_nothing_against_anyone() {
    let mut l = Ledger::default();
    assert!(l.observe(1, &p("a"), &p("b"), Verdict::Silent).is_empty());
    assert_eq!(l.lag(&p("a"), &p("b")), 1);
    // Excused versions neither count nor reset.
    assert!(l.observe(2, &p("a"), &p("b"), Verdict::Excused).is_empty());
    assert_eq!(l.lag(&p("a"), &p("b")), 1);
    assert!(l.observe(3, &p("a"), &p("b"), Verdict::OnTime).is_empty());
    assert_eq!(l.lag(&p("a"), &p("b")), 0);
    assert!(l.observe(4, &p("a"), &p("b"), Verdict::Silent).is_empty());
    assert!(l.separated(5).is_empty());
    assert_eq!(l.verdicts()[&Verdict::Silent], 2);
    assert_eq!(l.verdicts()[&Verdict::Excused], 1);
}

#[test]
fn retain_forgets_departed_peers_and_expired_decisions() {
    let mut l = Ledger::default();
    lag_twice(&mut l, 1, "slow", "c1", Verdict::Slow);
    lag_twice(&mut l, 3, "slow", "c2", Verdict::Slow);
    lag_twice(&mut l, 5, "bad", "c1", Verdict::Silent);
    lag_twice(&mut l, 7, "bad", "c3", Verdict::Silent);
    l.sentenced(8, &p("bad"), Sentence::Strike { count: 4 });
    assert!(l.excluded().contains("bad"));
    l.retain(9, |x| x != "bad");
    assert!(l.excluded().is_empty());
    assert!(l.separated(9).iter().all(|(a, b)| a != "bad" && b != "bad"));
    assert!(l.demoted(9).contains("slow"));
    l.retain(100, |_| true);
    assert!(l.demoted(100).is_empty() && l.separated(100).is_empty());
}

/// Receipts alone never convict: only the learner's own probe or established children do.
#[test]
fn an_accusation_convicts_only_on_a_failed_probe_or_established_children() {
    use Probe::*;
    for probe in [None, Some(Served), Some(Unanswered)] {
        // Two fresh children (say, two cheap identities lying together).
        assert_ne!(
            sentence(4, 0, probe),
            Sentence::Strike { count: 4 },
            "{probe:?}"
        );
        assert_ne!(
            sentence(4, 1, probe),
            Sentence::Strike { count: 4 },
            "{probe:?}"
        );
        // Two established ones: their word is enough (a parent can serve fetches and push
        // nothing).
        assert_eq!(
            sentence(4, 2, probe),
            Sentence::Strike { count: 4 },
            "{probe:?}"
        );
    }
    for established in 0..3 {
        assert_eq!(
            sentence(5, established, Some(Withheld)),
            Sentence::Strike { count: 5 }
        );
    }
    // Fresh accusers of a parent that served the probe: cleared (at most moved); one that
    // did not answer: demoted.
    assert_eq!(sentence(4, 1, Some(Served)), Sentence::Clear);
    assert_eq!(sentence(4, 0, Some(Unanswered)), Sentence::Demote);
    assert_eq!(sentence(4, 0, None), Sentence::Demote);
}

/// Two framers seated in turn under an honest parent: it is separated from each, accused,
/// serves the probe, and is cleared — moved, never demoted, excluded or struck.
#[test]
fn two_framers_get_an_honest_parent_at_most_moved() {
    let mut l = Ledger::default();
    lag_twice(&mut l, 1, "honest", "f1", Verdict::Silent);
    let out = lag_twice(&mut l, 3, "honest", "f2", Verdict::Silent);
    let Some(Decision::Accuse { peer, count, .. }) = out.last().cloned() else {
        panic!("{out:?}");
    };
    assert_eq!(
        l.sentenced(4, &peer, sentence(count, 0, Some(Probe::Served))),
        None
    );
    assert!(l.excluded().is_empty() && l.demoted(5).is_empty());
    assert_eq!(l.fault_of(&p("honest"), 5), None);
    assert_eq!(l.separated(5).len(), 2, "moved away from both");
}

#[test]
fn a_parent_that_overfeeds_two_children_is_moved_then_demoted_never_struck() {
    let e = expect(true);
    let over = Delivery {
        duplicates: 2_500_000,
        ..delivery(1_250_000, Some(5), 105)
    };
    assert_eq!(judge(&over, &e), Verdict::Overfed);
    let mut l = Ledger::default();
    let out = lag_twice(&mut l, 1, "over", "c1", Verdict::Overfed);
    assert!(matches!(out[..], [Decision::Separate { .. }]), "{out:?}");
    let out = lag_twice(&mut l, 3, "over", "c2", Verdict::Overfed);
    assert_eq!(
        out.last(),
        Some(&Decision::Demote {
            peer: p("over"),
            until: 4 + DEMOTE_VERSIONS,
            fault: Fault::OverfeedingParent
        })
    );
    assert!(out
        .iter()
        .all(|d| !matches!(d, Decision::Strike { .. } | Decision::Accuse { .. })));
    // Its children are not at fault for it.
    assert!(l.demoted(5).iter().all(|x| x == "over"));
}
