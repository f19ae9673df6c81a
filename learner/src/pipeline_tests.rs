use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use storage::record::testing::group;

use super::*;

const W: &str = "12D3KooWtest";

fn limits() -> GroupLimits {
    GroupLimits {
        vocab_size: 300,
        max_context: 64,
        logprob_floor: -50.0,
        group_size: 4,
    }
}

/// A stage that refuses groups whose seq is in `bad`, counts its calls and records the rate
/// it was handed.
struct Probe {
    bad: Vec<u64>,
    calls: Arc<AtomicUsize>,
    rates: Arc<std::sync::Mutex<Vec<f64>>>,
}

impl Stage for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn check(&self, input: &StageInput<'_>, checks: &mut Checks) -> Result<(), Rejection> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.rates.lock().unwrap().push(input.check_rate);
        checks.sampling_checked = true;
        if self.bad.contains(&input.group.seq) {
            return Err(Rejection::MaskMismatch("bad".into()));
        }
        Ok(())
    }
}

fn probe(bad: Vec<u64>) -> (Probe, Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<f64>>>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let rates = Arc::new(std::sync::Mutex::new(Vec::new()));
    (
        Probe {
            bad,
            calls: calls.clone(),
            rates: rates.clone(),
        },
        calls,
        rates,
    )
}

#[test]
fn the_chain_runs_in_order_and_stops_at_the_first_refusal() {
    let (p, calls, _) = probe(vec![2]);
    let pipe = Pipeline::new(limits()).with_stage(p);
    assert_eq!(pipe.stage_names(), [STRUCTURE, "probe"]);
    let v = pipe.verify(W, 0, group(3, 1, 4, 8)).unwrap();
    assert_eq!(v.seq, 1, "derefs to the group");
    assert!(v.checks().sampling_checked);
    assert_eq!(v.limits(), &limits());
    // Structure refuses first: the stage never sees a group of the wrong size, a stale one,
    // or one that names another producer.
    let e = pipe.verify(W, 0, group(3, 5, 5, 8)).unwrap_err();
    assert_eq!(e.as_str(), "group_size");
    let e = pipe.verify(W, 4, group(3, 6, 4, 8)).unwrap_err();
    assert_eq!(e.as_str(), "inadmissible");
    let e = pipe
        .verify("12D3KooWother", 0, group(3, 7, 4, 8))
        .unwrap_err();
    assert_eq!(e.as_str(), "forged_producer");
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    let e = pipe.verify(W, 0, group(3, 2, 4, 8)).unwrap_err();
    assert_eq!(e.as_str(), "mask_mismatch");
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // Accepted and refused groups (the wrong size, the probe's) are the worker's history; an
    // aged-out one is not.
    let h = pipe.history(W);
    assert_eq!((h.accepted, h.rejected), (1, 2));
    assert_eq!(pipe.history("12D3KooWother").rejected, 1);
}

#[test]
fn stages_get_the_workers_rate_probation_first() {
    let (p, _, rates) = probe(vec![]);
    let params = ProbationParams {
        probation_groups: 3,
        floor_rate: 0.1,
        decay_groups: 1.0,
        probation_versions: 1,
        probation_secs: 0,
    };
    let pipe = Pipeline::with_probation(limits(), params).with_stage(p);
    for seq in 0..6 {
        assert_eq!(pipe.on_probation(W), seq < 3);
        pipe.verify(W, 0, group(1, seq, 4, 8)).unwrap();
    }
    let rates = rates.lock().unwrap().clone();
    assert_eq!(rates, [1.0, 1.0, 1.0, 1.0, 0.5, 1.0 / 3.0]);
    // A banned worker forgotten is new again.
    pipe.forget(W);
    assert!(pipe.on_probation(W));
    assert_eq!(pipe.rate(W), 1.0);
}

#[test]
fn skipped_numbers_are_reported_once() {
    let pipe = Pipeline::new(limits());
    pipe.verify(W, 0, group(1, 0, 4, 8)).unwrap();
    pipe.verify(W, 0, group(1, 300, 4, 8)).unwrap();
    // 1..=299 are missing; those more than the horizon (256) behind 300 — 1..=43 — are
    // skipped for good.
    let skips = pipe.take_new_skips();
    assert_eq!(skips, vec![(W.to_string(), 43)]);
    assert!(pipe.take_new_skips().is_empty(), "taken once");
    assert_eq!(pipe.history(W).skipped, 43);
}

#[test]
fn a_group_from_the_own_buffer_keeps_its_recorded_checks() {
    let (p, calls, _) = probe(vec![]);
    let pipe = Pipeline::new(limits()).with_stage(p);
    let g = group(3, 1, 4, 8);
    pipe.verify(W, 0, g.clone()).unwrap();
    let again = pipe.from_own_buffer(g.clone());
    assert!(again.checks().sampling_checked);
    assert_eq!(calls.load(Ordering::Relaxed), 1, "nothing checked again");
    let unknown = pipe.from_own_buffer(group(3, 9, 4, 8));
    assert_eq!(unknown.checks(), Checks::default());
    assert_eq!(unknown.into_inner().seq, 9);
}
