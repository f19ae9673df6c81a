use storage::{NodeKey, Sample, SignedManifest, SnapshotManifest};

use super::*;

const T: f32 = 1.2;

/// The learner's side of a publication: manifest and chunks of `payload` as `version`, then
/// garbage collection (what the dissemination engine does).
fn publish(store: &ChunkStore, key: &NodeKey, version: u64, payload: Vec<u8>) {
    let cfg_hash = ModelConfig::tiny().hash();
    let m: SignedManifest = SnapshotManifest::build(
        "spot",
        version,
        cfg_hash,
        &payload,
        1 << 20,
        &key.verifying_key(),
    )
    .unwrap()
    .sign(key.signing_key())
    .unwrap();
    store.publish(&m, &payload.into()).unwrap();
    store.retain().unwrap();
}

/// The run's assignment seed in these tests.
const SEED: [u8; 32] = [42; 32];
/// The producer every test group names (the signature layer, not this one, ties it to the
/// peer pulled from).
const PRODUCER: &str = "worker";

// The names of the spot check's rejections, as status, metrics and logs show them
// (`Rejection::as_str`).
const REASON_MISMATCH: &str = "logprob_mismatch";
const REASON_FORGED: &str = "logprob_forged";
const REASON_UNPUBLISHED: &str = "unpublished_version";
const REASON_NOT_DRAWN: &str = "token_not_drawn";
const REASON_MARGIN_UNEARNED: &str = "margin_unearned";

/// A worker's group number `seq`: the snapshot bytes installed as a policy, sampled on the
/// inference path in `dtype` (what the rollout engine runs) with the prescribed uniforms, the
/// sampler's log-probs reported as they are.
fn worker_group_in(
    snapshot: &[u8],
    version: u64,
    seq: u64,
    dtype: policy::DType,
) -> TrajectoryGroup {
    let policy =
        Policy::from_safetensors_bytes(&ModelConfig::tiny(), snapshot, &Device::Cpu).unwrap();
    let model = policy::InferModel::new(&policy, dtype).unwrap();
    let prompt = policy::ByteTokenizer.encode_prompt("3+4=");
    let params = policy::SamplingParams {
        temperature: T,
        ..policy::SamplingParams::new(6, vec![])
    };
    let draws = policy::Draws::prescribed(&SEED, PRODUCER, seq, 4);
    let out = policy::infer::generate_with(&model, &prompt, &params, &draws).unwrap();
    TrajectoryGroup {
        group_id: [seq as u8; 16],
        task_id: "arith".into(),
        prompt_id: "34".into(),
        version,
        producer: PRODUCER.into(),
        seq,
        signature: None,
        prompt_text: "3+4=".into(),
        prompt_tokens: prompt,
        created_unix_ms: 0,
        samples: out
            .into_iter()
            .enumerate()
            .map(|(k, c)| Sample {
                trajectory_id: [k as u8 + 100; 16],
                loss_mask: vec![1; c.tokens.len()],
                response_text: String::new(),
                reward: 0.0,
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                finished_unix_ms: 0,
            })
            .collect(),
    }
}

fn worker_group(snapshot: &[u8], version: u64, seq: u64) -> TrajectoryGroup {
    worker_group_in(snapshot, version, seq, policy::DType::F32)
}

fn settings() -> SpotSettings {
    SpotSettings {
        temperature: T,
        seed: SEED,
        ..SpotSettings::default()
    }
}

/// The check of a group drawn for sure (rate 1).
fn run(c: &SpotChecker, g: &TrajectoryGroup) -> Result<(), Rejection> {
    c.check(PRODUCER, g, 1.0).map(|_| ())
}

/// The check of a group pulled from `peer` at check rate `rate`.
fn from(
    c: &SpotChecker,
    peer: &p2p::PeerId,
    g: &TrajectoryGroup,
    rate: f64,
) -> Result<(), Rejection> {
    c.check(&peer.to_base58(), g, rate).map(|_| ())
}

fn reason(r: Result<(), Rejection>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(e) => e.as_str(),
    }
}

/// A chunk store holding versions 2 (f32) and 4 (bf16) of the tiny model, version 0 collected
/// (keep 2); returns the payloads of 2 and 4.
fn store_with_snapshots(dir: &std::path::Path) -> (Arc<ChunkStore>, Vec<u8>, Vec<u8>) {
    let store = ChunkStore::open(dir, 2).unwrap();
    let key = NodeKey::generate();
    let mut payloads = Vec::new();
    for (v, seed, bf16) in [(0u64, 10u64, false), (2, 11, false), (4, 12, true)] {
        let p = Policy::new_random(&ModelConfig::tiny(), seed, &Device::Cpu).unwrap();
        let bytes = if bf16 {
            p.to_safetensors_bytes_as(policy::DType::BF16).unwrap()
        } else {
            p.to_safetensors_bytes().unwrap()
        };
        publish(&store, &key, v, bytes.clone());
        payloads.push(bytes);
    }
    assert_eq!(store.versions().unwrap(), vec![2, 4]);
    let v4 = payloads.pop().unwrap();
    let v2 = payloads.pop().unwrap();
    (Arc::new(store), v2, v4)
}

#[test]
fn honest_groups_pass_and_forged_log_probs_fail() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, v4) = store_with_snapshots(dir.path());
    let checker = SpotChecker::new(settings(), store, ModelConfig::tiny(), Device::Cpu).unwrap();
    // f32 and bf16 snapshots: the learner loads the very bytes the worker installed.
    let honest2 = worker_group(&v2, 2, 1);
    let honest4 = worker_group(&v4, 4, 2);
    assert_eq!(reason(run(&checker, &honest2)), "ok");
    assert_eq!(reason(run(&checker, &honest4)), "ok");
    // A difference within a hundred tolerances may be numeric; beyond, it is proof.
    for (delta, why) in [(0.5f32, REASON_FORGED), (0.05, REASON_MISMATCH)] {
        let mut g = honest2.clone();
        g.samples[1].sampler_logprobs[2] -= delta;
        let r = run(&checker, &g);
        assert_eq!(reason(r.clone()), why, "-{delta}");
        assert!(r.unwrap_err().to_string().contains("sample 1 token 2"));
    }
    // Samples and log-probs of another version's weights do not pass as this version's:
    // its tokens are not the rule's draws under these weights (proof, which outranks the
    // log-prob drift), and the producer is condemned.
    let mut wrong = honest4.clone();
    wrong.version = 2;
    assert_eq!(reason(run(&checker, &wrong)), REASON_NOT_DRAWN);
    let s = checker.stats();
    assert_eq!(
        (s.checked, s.mismatches, s.not_drawn, s.errors),
        (5, 2, 1, 0)
    );
    // Versions 2 and 4 loaded once each, then served from the cache.
    assert_eq!(s.loads, 2);
}

#[test]
fn claimed_versions_are_checked_against_the_published_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let checker = SpotChecker::new(settings(), store, ModelConfig::tiny(), Device::Cpu).unwrap();
    let honest = worker_group(&v2, 2, 3);
    // 3 lies between held versions and 5 after the newest: never published, forged claims.
    for v in [3, 5] {
        let mut g = honest.clone();
        g.version = v;
        assert_eq!(reason(run(&checker, &g)), REASON_UNPUBLISHED, "v{v}");
    }
    // 0 was published and collected: unavailable, not the worker's fault. Where groups are
    // drawn for checking it passes unchecked; where every group must be checked (probation,
    // rate 1) it is refused, without a strike, so that it does not pass as checked.
    let mut old = honest.clone();
    old.version = 0;
    old.samples[0].sampler_logprobs[0] += 1.0;
    assert_eq!(checker.check(PRODUCER, &old, 0.99), Ok(false));
    let e = run(&checker, &old).unwrap_err();
    assert!(matches!(e, Rejection::Unchecked(_)), "{e}");
    assert!(e.to_string().contains("no longer held"), "{e}");
    assert_eq!(crate::roles::learner::penalty::penalty(&e).strike, None);
    let s = checker.stats();
    assert_eq!((s.unpublished, s.skipped_unavailable, s.checked), (2, 2, 0));
}

#[test]
fn only_drawn_groups_are_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let checker =
        SpotChecker::with_key(settings(), store, ModelConfig::tiny(), Device::Cpu, [7; 32])
            .unwrap();
    let mut forged = worker_group(&v2, 2, 4);
    forged.samples[0].sampler_logprobs[0] -= 0.5;
    // Rate 1 (probation): checked; rate 0: never; in between, by the keyed draw of the id.
    assert_eq!(
        reason(checker.check(PRODUCER, &forged, 1.0).map(|_| ())),
        REASON_FORGED
    );
    assert_eq!(checker.check(PRODUCER, &forged, 0.0), Ok(false));
    let drawn = learner::spot_check::selected_by_fraction(&forged.group_id, &[7; 32], 0.5);
    assert_eq!(checker.check(PRODUCER, &forged, 0.5).is_err(), drawn);
    let honest = worker_group(&v2, 2, 8);
    assert_eq!(
        checker.check(PRODUCER, &honest, 1.0),
        Ok(true),
        "checked and passed"
    );
}

#[test]
fn groups_the_model_cannot_take_are_rejected_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let checker = SpotChecker::new(settings(), store, ModelConfig::tiny(), Device::Cpu).unwrap();
    let honest = worker_group(&v2, 2, 5);
    let mut oov = honest.clone();
    oov.samples[0].response_tokens[0] = u32::MAX;
    let mut long = honest.clone();
    long.prompt_tokens = vec![1; ModelConfig::tiny().max_position_embeddings];
    let mut empty = honest;
    empty.samples.clear();
    for g in [oov, long, empty] {
        assert_eq!(reason(run(&checker, &g)), REASON_MISMATCH);
    }
    assert!(SpotChecker::new(
        SpotSettings {
            tolerance: learner::verdict::ByDtype {
                f32: 0.0,
                ..DEFAULT_TOLERANCE
            },
            ..settings()
        },
        Arc::new(ChunkStore::open(&dir.path().join("other"), 1).unwrap()),
        ModelConfig::tiny(),
        Device::Cpu
    )
    .is_err());
}

#[test]
fn the_model_cache_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, v4) = store_with_snapshots(dir.path());
    let one = SpotSettings {
        cached_versions: 1,
        ..settings()
    };
    let checker = SpotChecker::new(one, store, ModelConfig::tiny(), Device::Cpu).unwrap();
    let (g2, g4) = (worker_group(&v2, 2, 6), worker_group(&v4, 4, 7));
    for g in [&g2, &g2, &g4, &g2] {
        assert_eq!(reason(run(&checker, g)), "ok");
    }
    // 2 loaded, reused, evicted by 4, loaded again.
    assert_eq!(checker.stats().loads, 3);
}

/// A worker that writes its responses and reports their true log-probs: every log-prob
/// matches, no token is the rule's draw. Proof: the group is refused as `token_not_drawn`, and
/// so is every later group of that producer, checked or not (the rest of its pull).
#[test]
fn written_responses_are_proof_and_condemn_their_producer() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let policy = Policy::from_safetensors_bytes(&ModelConfig::tiny(), &v2, &Device::Cpu).unwrap();
    let checker = SpotChecker::new(settings(), store, ModelConfig::tiny(), Device::Cpu).unwrap();
    let (bad, good) = (p2p::PeerId::random(), p2p::PeerId::random());
    let mut forced = worker_group(&v2, 2, 0);
    let want = policy::ByteTokenizer.encode("7777");
    for s in &mut forced.samples {
        s.sampler_logprobs =
            policy::response_logprobs(&policy, &forced.prompt_tokens, &want, T).unwrap();
        s.loss_mask = vec![1; want.len()];
        s.response_tokens = want.clone();
    }
    let r = from(&checker, &bad, &forced, 1.0);
    assert_eq!(reason(r.clone()), REASON_NOT_DRAWN);
    assert!(r.unwrap_err().to_string().contains("not the rule's draw"));
    // Its next group is honest and not drawn (rate 0): refused all the same.
    assert_eq!(
        reason(from(&checker, &bad, &worker_group(&v2, 2, 1), 0.0)),
        REASON_NOT_DRAWN
    );
    // Another peer is not affected.
    assert_eq!(
        reason(from(&checker, &good, &worker_group(&v2, 2, 2), 1.0)),
        "ok"
    );
    let s = checker.stats();
    assert_eq!((s.checked, s.not_drawn, s.mismatches), (2, 1, 0));
    // With the draw check off, the same group passes: log-probs alone cannot tell.
    let (store, _, _) = store_with_snapshots(&dir.path().join("b"));
    let blind = SpotChecker::new(
        SpotSettings {
            check_sampling: false,
            ..settings()
        },
        store,
        ModelConfig::tiny(),
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(reason(from(&blind, &bad, &forced, 1.0)), "ok");
}

/// A worker sampling in f16 is judged with the f16 tolerance and margin its heartbeat names;
/// without a report it is judged as f32 and refused.
#[test]
fn half_precision_workers_are_judged_by_their_reported_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let dtypes = WorkerDtypes::default();
    // Tight f32 limits (an f16 spread exceeds them), the default f16 ones.
    let mut tight = settings();
    tight.tolerance.f32 = 1e-6;
    tight.margin.f32 = 1e-9;
    let checker = SpotChecker::new(tight, store, ModelConfig::tiny(), Device::Cpu)
        .unwrap()
        .with_worker_dtypes(dtypes.clone());
    let peer = p2p::PeerId::random();
    let id = peer.to_base58();
    let report = p2p::DeviceReport {
        kind: "cpu".into(),
        dtype: Some("f16".into()),
        ..Default::default()
    };
    dtypes.refresh([(peer, Some(&report))]);
    assert_eq!(dtypes.get(&id), WorkerDtype::F16);
    for seq in 0..8 {
        let g = worker_group_in(&v2, 2, seq, policy::DType::F16);
        assert_eq!(reason(from(&checker, &peer, &g, 1.0)), "ok", "seq {seq}");
    }
    // Forgotten (no heartbeat): the f32 limits, which the f16 spread exceeds.
    dtypes.refresh([]);
    let refused = (0..8)
        .filter(|&seq| {
            let g = worker_group_in(&v2, 2, seq, policy::DType::F16);
            reason(from(&checker, &peer, &g, 1.0)) != "ok"
        })
        .count();
    assert!(refused > 0);
    // What a heartbeat without a dtype means: bf16 on CUDA, f32 otherwise.
    let gpu = p2p::DeviceReport {
        kind: "cuda".into(),
        ..Default::default()
    };
    assert_eq!(dtype_of(Some(&gpu)), WorkerDtype::Bf16);
    assert_eq!(dtype_of(None), WorkerDtype::F32);
}

/// [`worker_group`] with the worker's own choice of token: the prescribed uniforms of the
/// first 14 positions moved by 0.15, inside bf16's margin (the `false_dtype` attack).
fn chosen_group(snapshot: &[u8], version: u64, seq: u64) -> TrajectoryGroup {
    let honest = worker_group(snapshot, version, seq);
    let policy =
        Policy::from_safetensors_bytes(&ModelConfig::tiny(), snapshot, &Device::Cpu).unwrap();
    let model = policy::InferModel::new(&policy, policy::DType::F32).unwrap();
    let params = policy::SamplingParams {
        temperature: T,
        ..policy::SamplingParams::new(6, vec![])
    };
    let draws = policy::Draws::prescribed(&SEED, PRODUCER, seq, 4).nudged(14, 0.15);
    let out = policy::infer::generate_with(&model, &honest.prompt_tokens, &params, &draws).unwrap();
    TrajectoryGroup {
        samples: honest
            .samples
            .iter()
            .zip(out)
            .map(|(s, c)| Sample {
                loss_mask: vec![1; c.tokens.len()],
                response_tokens: c.tokens,
                sampler_logprobs: c.logprobs,
                ..s.clone()
            })
            .collect(),
        ..honest
    }
}

/// A CPU worker claiming bf16 is judged at the margins its measured spread earns (f32's: its
/// log-probs match the learner's), not at bf16's: its own choices of token inside bf16's
/// margin are refused as `margin_unearned` (not trained, not struck), while its honest groups
/// pass; a worker claiming bf16 with the same honest groups is never refused.
#[test]
fn a_false_dtype_is_judged_at_the_margins_it_earned() {
    let dir = tempfile::tempdir().unwrap();
    let (store, v2, _) = store_with_snapshots(dir.path());
    let dtypes = WorkerDtypes::default();
    let earned = EarnedMargins::default();
    let checker = SpotChecker::new(settings(), store, ModelConfig::tiny(), Device::Cpu)
        .unwrap()
        .with_worker_dtypes(dtypes.clone())
        .with_earned_margins(earned.clone());
    let (liar, honest) = (p2p::PeerId::random(), p2p::PeerId::random());
    let bf16 = p2p::DeviceReport {
        kind: "cuda".into(),
        dtype: Some("bf16".into()),
        ..Default::default()
    };
    dtypes.refresh([(liar, Some(&bf16)), (honest, Some(&bf16))]);
    let (mut chose, mut unearned, mut passed_choices) = (0, 0, 0);
    for seq in 0..12 {
        let g = worker_group(&v2, 2, seq);
        assert_eq!(
            reason(from(&checker, &honest, &g, 1.0)),
            "ok",
            "honest seq {seq}"
        );
        let c = chosen_group(&v2, 2, seq);
        if c.samples
            .iter()
            .zip(&g.samples)
            .all(|(a, b)| a.response_tokens == b.response_tokens)
        {
            continue; // the moved uniforms drew the same tokens
        }
        chose += 1;
        match reason(from(&checker, &liar, &c, 1.0)) {
            REASON_MARGIN_UNEARNED => unearned += 1,
            "ok" => passed_choices += 1,
            other => assert_eq!(other, REASON_NOT_DRAWN, "seq {seq}"),
        }
    }
    // A moved uniform can land within f32's own margin of its window (a boundary right next
    // to it): such a choice is one an f32 sampler's numeric error could make too.
    assert!(
        chose > 0 && unearned * 2 >= chose,
        "{chose} chosen, {unearned} refused, {passed_choices} passed"
    );
    let views: HashMap<String, EarnedView> = earned.all().into_iter().collect();
    let v = views[&liar.to_base58()];
    assert_eq!(v.claimed, Some(WorkerDtype::Bf16));
    assert!(
        (v.tolerance - 1e-3).abs() < 1e-9 && (v.delta - 1e-3).abs() < 1e-9,
        "judged at f32's margins: {v:?}"
    );
    assert!(v.evidence.max_spread < 1e-4, "{v:?}");
    assert_eq!(v.unearned, unearned);
    assert_eq!(checker.stats().unearned, unearned);
}
