//! Engine tests: reproducibility, version switching, log-prob agreement, self-regulation.

use std::sync::Arc;
use std::time::Duration;

use policy::{response_logprobs, Device, GenerationPath, ModelConfig, Policy, Tokenizer};
use storage::{TrajectoryGroup, TrajectoryStore};

use super::*;

fn policy(seed: u64) -> Arc<Policy> {
    Arc::new(Policy::new_random(&ModelConfig::tiny(), seed, &Device::Cpu).unwrap())
}

fn engine(
    dir: &std::path::Path,
    path: GenerationPath,
    cap: u64,
) -> (RolloutEngine, Arc<TrajectoryStore>) {
    let store = Arc::new(TrajectoryStore::open(dir).unwrap());
    let cfg = RolloutConfig {
        group_size: 4,
        sampling: SamplingParams::new(6, Vec::new()),
        path,
        max_pending_groups: cap,
        seed: 42,
        producer: "12D3KooWtest".into(),
        id_nonce: Some([7; 16]),
        ..RolloutConfig::default()
    };
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let e = RolloutEngine::new(cfg, task, Tokenizer::byte(), store.clone(), slot).unwrap();
    (e, store)
}

/// Produces 3 groups under v1, installs v2 from snapshot bytes, produces 2 more.
fn run(dir: &std::path::Path, path: GenerationPath) -> Vec<TrajectoryGroup> {
    let (mut e, store) = engine(dir, path, 100);
    assert_eq!(e.step().unwrap(), StepOutcome::NoPolicy);
    e.slot().install(1, policy(1)).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            e.step().unwrap(),
            StepOutcome::Produced { version: 1, .. }
        ));
    }
    let bytes = policy(2).to_safetensors_bytes().unwrap();
    e.slot().install_bytes(2, &bytes).unwrap();
    for _ in 0..2 {
        assert!(matches!(
            e.step().unwrap(),
            StepOutcome::Produced { version: 2, .. }
        ));
    }
    let groups: Vec<TrajectoryGroup> = store
        .scan(0, 100)
        .unwrap()
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    assert_eq!(groups.len(), 5);
    let snap = e.stats().snapshot();
    assert_eq!((snap.groups, snap.samples, snap.version), (5, 20, 2));
    assert!(snap.mu > 0.0);
    groups
}

fn strip_times(mut g: TrajectoryGroup) -> TrajectoryGroup {
    g.created_unix_ms = 0;
    for s in &mut g.samples {
        s.finished_unix_ms = 0;
    }
    g
}

fn check_path(path: GenerationPath) {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = run(d1.path(), path);
    let b = run(d2.path(), path);
    let mut versions: Vec<u64> = a.iter().map(|g| g.version).collect();
    versions.sort();
    assert_eq!(versions, vec![1, 1, 1, 2, 2]);
    // Reproducible: same versions, prompts, tokens, rewards and log-probs.
    let a: Vec<_> = a.into_iter().map(strip_times).collect();
    let b: Vec<_> = b.into_iter().map(strip_times).collect();
    assert_eq!(a, b);
    // Records are well-formed and their log-probs equal the learner's full forward.
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let tok = Tokenizer::byte();
    let (p1, p2) = (policy(1), policy(2));
    for g in &a {
        g.validate().unwrap();
        assert_eq!(g.task_id, "arith");
        assert_eq!(g.samples.len(), 4);
        let prompt = task.prompt_by_id(&g.prompt_id).unwrap();
        assert_eq!(prompt.text, g.prompt_text);
        assert_eq!(tok.encode_prompt(&g.prompt_text).unwrap(), g.prompt_tokens);
        let p = if g.version == 1 { &p1 } else { &p2 };
        for s in &g.samples {
            assert_eq!(s.reward, task.reward(&prompt, &s.response_text).value);
            assert_eq!(tok.decode(&s.response_tokens).unwrap(), s.response_text);
            assert!(s.loss_mask.iter().all(|&m| m == 1));
            let full = response_logprobs(p, &g.prompt_tokens, &s.response_tokens, 1.0).unwrap();
            for (x, y) in s.sampler_logprobs.iter().zip(&full) {
                assert!((x - y).abs() < 1e-4, "{path:?} v{}: {x} vs {y}", g.version);
            }
        }
    }
    let ids: std::collections::HashSet<[u8; 16]> = a
        .iter()
        .flat_map(|g| g.samples.iter().map(|s| s.trajectory_id))
        .collect();
    assert_eq!(ids.len(), 20, "trajectory ids are unique");
}

#[test]
fn reproducible_groups_and_version_switch_infer() {
    // The inference model is rebuilt on the v2 install: v2's log-probs must match p2.
    check_path(GenerationPath::Infer);
}

#[test]
fn the_inference_path_is_the_default() {
    assert_eq!(RolloutConfig::default().path, GenerationPath::Infer);
    let v = serde_json::json!("batched");
    assert_eq!(
        serde_json::from_value::<GenerationPath>(v).unwrap(),
        GenerationPath::Batched
    );
}

#[test]
fn reproducible_groups_and_version_switch_batched() {
    check_path(GenerationPath::Batched);
}

#[test]
fn reproducible_groups_and_version_switch_sequential() {
    check_path(GenerationPath::Sequential);
}

#[test]
fn pauses_at_the_pending_cap_and_resumes_after_ack() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, store) = engine(dir.path(), GenerationPath::default(), 2);
    e.slot().install(1, policy(1)).unwrap();
    assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
    assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
    assert_eq!(e.step().unwrap(), StepOutcome::Paused { pending: 2 });
    // Standby wins over everything and produces nothing; clearing it resumes.
    let gate = e.standby_flag();
    gate.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(e.step().unwrap(), StepOutcome::Standby);
    assert!(e.stats().snapshot().paused);
    let lease = store
        .lease(0, 10, Duration::from_secs(60))
        .unwrap()
        .unwrap();
    store.ack(lease.id).unwrap();
    // Room again, but still on standby: nothing is generated until the gate is cleared.
    assert_eq!(e.step().unwrap(), StepOutcome::Standby);
    assert_eq!(store.counters().unwrap().pending(), 0);
    gate.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
    assert!(!e.stats().snapshot().paused);
}

#[test]
fn nothing_is_made_below_the_learners_window_until_a_newer_version_installs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, store) = engine(dir.path(), GenerationPath::default(), 100);
    e.slot().install(1, policy(1)).unwrap();
    assert!(matches!(
        e.step().unwrap(),
        StepOutcome::Produced { version: 1, .. }
    ));
    // The learner's next pull asks for v ≥ 2 (sequential mode after a step): the v1 group is
    // discarded, and no more are made under v1.
    assert_eq!(store.prune_below(2).unwrap(), 1);
    assert_eq!(store.window_floor(), 2);
    assert_eq!(
        e.step().unwrap(),
        StepOutcome::Behind {
            installed: 1,
            floor: 2
        }
    );
    assert!(e.stats().snapshot().behind);
    assert_eq!(
        store.counters().unwrap().produced,
        1,
        "nothing made while behind"
    );
    // The learner's step did not happen (its batch had no advantage): it asks for v1 again,
    // and v1 groups are made again.
    store.prune_below(1).unwrap();
    assert_eq!(store.window_floor(), 1);
    assert!(matches!(
        e.step().unwrap(),
        StepOutcome::Produced { version: 1, .. }
    ));
    store.prune_below(2).unwrap();
    e.slot().install(2, policy(2)).unwrap();
    assert!(matches!(
        e.step().unwrap(),
        StepOutcome::Produced { version: 2, .. }
    ));
    assert!(!e.stats().snapshot().behind);
}

#[test]
fn stale_or_mismatched_snapshots_are_refused() {
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    slot.install(3, policy(1)).unwrap();
    let bytes = policy(2).to_safetensors_bytes().unwrap();
    assert!(matches!(
        slot.install_bytes(3, &bytes),
        Err(RolloutError::StaleVersion { .. })
    ));
    assert!(matches!(
        slot.install(2, policy(2)),
        Err(RolloutError::StaleVersion { .. })
    ));
    assert!(slot.install_bytes(4, b"not safetensors").is_err());
    let mut other = ModelConfig::tiny();
    other.num_hidden_layers = 1;
    let small = Policy::new_random(&other, 0, &Device::Cpu).unwrap();
    let e = slot
        .install_bytes(5, &small.to_safetensors_bytes().unwrap())
        .unwrap_err();
    assert!(
        matches!(e, RolloutError::Policy(PolicyError::ConfigMismatch { .. })),
        "{e}"
    );
    assert!(slot.install(5, Arc::new(small)).is_err());
    assert_eq!(slot.version(), Some(3));
    slot.install_bytes(4, &bytes).unwrap();
    assert_eq!(slot.version(), Some(4));
}

#[test]
fn bad_config_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let cfg = RolloutConfig {
        group_size: 0,
        ..RolloutConfig::default()
    };
    assert!(RolloutEngine::new(cfg, task, Tokenizer::byte(), store, slot).is_err());
}

#[test]
fn spawned_engine_produces_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (e, store) = engine(dir.path(), GenerationPath::default(), 3);
    let slot = e.slot().clone();
    let stats = e.stats();
    let running = e.spawn().unwrap();
    slot.install(1, policy(1)).unwrap();
    // The cap stops it at 3 pending groups; wait for that state (no timing assertion).
    while !stats.snapshot().paused {
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop().unwrap();
    assert_eq!(store.pending().unwrap(), 3);
    assert_eq!(stats.snapshot().groups, 3);
}

#[test]
fn a_rate_cap_bounds_the_reported_mu() {
    // Every producing step lasts at least 1/cap (the engine sleeps out the rest of its slot),
    // so μ = 1/EMA(step time) can never exceed the cap.
    let dir = tempfile::tempdir().unwrap();
    let (mut e, _store) = engine(dir.path(), GenerationPath::default(), 100);
    e.cfg.max_groups_per_s = 25.0;
    e.slot().install(1, policy(1)).unwrap();
    for _ in 0..3 {
        assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
    }
    let mu = e.stats().snapshot().mu;
    assert!(mu > 0.0 && mu <= 25.0, "μ {mu}");
}

#[test]
fn groups_are_signed_assigned_and_numbered_durably() {
    let dir = tempfile::tempdir().unwrap();
    let seq_path = dir.path().join("rollout.seq");
    let key = storage::NodeKey::from_seed([3; 32]);
    let seed = tasks::assign::assignment_seed("swarm", &[5; 32]);
    let task = tasks::build_task("arith", &serde_json::Value::Null).unwrap();
    let make = |store_dir: &std::path::Path| {
        let store = Arc::new(TrajectoryStore::open(store_dir).unwrap());
        let cfg = RolloutConfig {
            group_size: 2,
            sampling: SamplingParams::new(4, Vec::new()),
            producer: "12D3KooWtest".into(),
            assignment_seed: Some(seed),
            ..RolloutConfig::default()
        };
        let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
        slot.install(1, policy(1)).unwrap();
        RolloutEngine::new(cfg, task.clone(), Tokenizer::byte(), store, slot)
            .unwrap()
            .with_signer(key.clone())
            .with_seq_file(&seq_path)
            .unwrap()
    };
    let mut e = make(&dir.path().join("a"));
    let groups: Vec<TrajectoryGroup> = (0..3)
        .map(|_| e.produce_group().unwrap().unwrap())
        .collect();
    let public = key.verifying_key().to_bytes();
    for (i, g) in groups.iter().enumerate() {
        assert_eq!(g.seq, i as u64);
        g.verify_signature(&public).unwrap();
        let want = tasks::assign::assigned_index(task.as_ref(), &seed, "12D3KooWtest", g.seq);
        assert_eq!(g.prompt_id, task.prompt(want).unwrap().id, "group {i}");
        // Every token is the canonical rule's draw from the uniforms prescribed for (seed,
        // producer, seq, sample): what the learner's spot check recomputes.
        let model = policy::InferModel::from_policy(&policy(1)).unwrap();
        let params = SamplingParams::new(4, Tokenizer::byte().eos_ids());
        let draws = policy::Draws::prescribed(&seed, "12D3KooWtest", g.seq, 2);
        let again =
            policy::infer::generate_with(&model, &g.prompt_tokens, &params, &draws).unwrap();
        let tokens: Vec<&Vec<u32>> = g.samples.iter().map(|s| &s.response_tokens).collect();
        assert_eq!(
            tokens,
            again.iter().map(|c| &c.tokens).collect::<Vec<_>>(),
            "group {i}"
        );
    }
    drop(e);
    // A restarted engine continues past every number it used.
    let mut e = make(&dir.path().join("b"));
    let g = e.produce_group().unwrap().unwrap();
    assert!(g.seq > groups[2].seq, "seq {} reused", g.seq);
    // The seal hook replaces signing: a hook that signs with another key.
    let mut e = make(&dir.path().join("c")).with_seal_hook(Box::new(|g, _key| {
        g.samples[0].reward = 1.0;
        g.sign(storage::NodeKey::from_seed([4; 32]).signing_key());
    }));
    let g = e.produce_group().unwrap().unwrap();
    assert_eq!(g.samples[0].reward, 1.0);
    assert!(g.verify_signature(&public).is_err());
}

/// ECHO-2 App. F, Eq. 21: a group is the episodes of one initial state. Every episode of a
/// group the engine produces replays from the group's seed (its `prompt_id`: the same deal,
/// hidden cards included) with its reported return, and groups of different seeds hold
/// different deals, so group-normalised advantages compare like with like.
#[test]
fn a_group_is_the_episodes_of_one_initial_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
    let env = tasks::build_env("kuhn-poker", &serde_json::json!({"opponent": "random"})).unwrap();
    let chat = Chat::for_model(Tokenizer::byte(), None, true).unwrap();
    let budget = Budget::of(&env.metadata());
    let mut sampling = SamplingParams::new(8, Vec::new());
    sampling.temperature = 1.0;
    let cfg = RolloutConfig {
        group_size: 4,
        sampling,
        seed: 9,
        producer: "12D3KooWtest".into(),
        id_nonce: Some([7; 16]),
        ..RolloutConfig::default()
    };
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let mut e = RolloutEngine::for_env(
        cfg,
        env.clone(),
        Chat::for_model(Tokenizer::byte(), None, true).unwrap(),
        budget,
        store.clone(),
        slot,
    )
    .unwrap();
    e.slot().install(1, policy(1)).unwrap();
    for _ in 0..6 {
        assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
    }
    let spec = episode::Spec {
        env: env.as_ref(),
        chat: &chat,
        budget,
        context: ModelConfig::tiny().max_position_embeddings,
    };
    let groups: Vec<TrajectoryGroup> = store
        .scan(0, 100)
        .unwrap()
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    assert_eq!(groups.len(), 6);
    let mut seeds = std::collections::HashSet::new();
    for g in &groups {
        assert_eq!(g.task_id, "kuhn-poker");
        let seed: u64 = g.prompt_id.parse().unwrap();
        seeds.insert(seed);
        for s in &g.samples {
            let r = episode::replay(spec, seed, &g.prompt_tokens, &s.response_tokens, s.reward)
                .expect("every episode of the group is a hand of the group's deal");
            assert_eq!(r.ret, s.reward);
            assert_eq!(r.mask(), s.loss_mask);
        }
        // Another deal is another initial state: its first observation differs, or its
        // hidden card gives another return, so the group's episodes would not replay there.
        let other = (0..64u64)
            .find(|&o| env.reset(o).unwrap().prompt.text != env.reset(seed).unwrap().prompt.text)
            .unwrap();
        let s = &g.samples[0];
        assert!(
            episode::replay(spec, other, &g.prompt_tokens, &s.response_tokens, s.reward).is_err()
        );
    }
    assert!(seeds.len() > 1, "groups draw their own deals: {seeds:?}");
}

/// Group numbers are dense (`control::commits`): a restarted engine resumes at the store's
/// next commitment, though its counter file reserved a block past it, and a produced group
/// that was not stored gives its number to the next one.
#[test]
fn numbers_stay_dense_across_restarts_and_unstored_groups() {
    let dir = tempfile::tempdir().unwrap();
    let seq_path = dir.path().join("rollout.seq");
    let store_dir = dir.path().join("store");
    let mut seqs = Vec::new();
    for _ in 0..2 {
        let (e, store) = engine(&store_dir, GenerationPath::default(), 100);
        let mut e = e.with_seq_file(&seq_path).unwrap();
        e.slot().install(1, policy(1)).unwrap();
        for _ in 0..2 {
            assert!(matches!(e.step().unwrap(), StepOutcome::Produced { .. }));
        }
        // Made but never stored (a group an attacker drops): its number is not used up.
        let dropped = e.produce_group().unwrap().unwrap();
        assert_eq!(Some(dropped.seq), store.next_commit().unwrap());
        drop(e);
        seqs.extend(store.scan(0, 100).unwrap().into_iter().map(|(_, g)| g.seq));
        seqs.sort_unstable();
        seqs.dedup();
        drop(store);
    }
    assert_eq!(seqs, [0, 1, 2, 3], "no number skipped");
}

/// Several groups in flight: `max_batch = 16` with groups of 4 makes 4 groups a step, their
/// samples decoded in one batch. The pending cap, the store's counters, the group numbers,
/// the versions (staleness) and μ's counts stay exact when several groups finish at once, and
/// every group has the tokens it gets one group at a time (log-probs within 1e-5).
#[test]
fn groups_in_flight_keep_the_accounting_exact_and_the_tokens_of_one_at_a_time() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut one, one_store) = engine(d1.path(), GenerationPath::Infer, 100);
    let (mut many, store) = engine(d2.path(), GenerationPath::Infer, 6);
    many.cfg.max_batch = 16;
    for e in [&one, &many] {
        e.slot().install(1, policy(1)).unwrap();
    }
    // 4 groups, then the 2 the cap of 6 has room for, then a pause.
    let pending = |s: &TrajectoryStore| s.counters().unwrap().pending();
    assert!(matches!(
        many.step().unwrap(),
        StepOutcome::Produced { version: 1, .. }
    ));
    assert_eq!(pending(&store), 4);
    assert!(matches!(
        many.step().unwrap(),
        StepOutcome::Produced { version: 1, .. }
    ));
    assert_eq!(pending(&store), 6);
    assert_eq!(many.step().unwrap(), StepOutcome::Paused { pending: 6 });
    assert_eq!(store.pending().unwrap(), 6);
    let snap = many.stats().snapshot();
    assert_eq!((snap.groups, snap.samples, snap.version), (6, 24, 1));
    assert!(snap.mu > 0.0);
    // The same six groups made one at a time.
    for _ in 0..6 {
        assert!(matches!(one.step().unwrap(), StepOutcome::Produced { .. }));
    }
    let scan = |s: &TrajectoryStore| -> Vec<TrajectoryGroup> {
        let mut g: Vec<_> = s
            .scan(0, 100)
            .unwrap()
            .into_iter()
            .map(|(_, g)| g)
            .collect();
        g.sort_by_key(|g| g.seq);
        g
    };
    let (a, b) = (scan(&one_store), scan(&store));
    assert_eq!(
        b.iter().map(|g| g.seq).collect::<Vec<_>>(),
        (0..6).collect::<Vec<u64>>()
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.group_id, &x.prompt_id, x.version),
            (y.group_id, &y.prompt_id, y.version)
        );
        assert_eq!(x.prompt_tokens, y.prompt_tokens);
        for (s, t) in x.samples.iter().zip(&y.samples) {
            assert_eq!(s.response_tokens, t.response_tokens, "group {}", x.seq);
            assert_eq!(s.reward, t.reward);
            for (p, q) in s.sampler_logprobs.iter().zip(&t.sampler_logprobs) {
                assert!((p - q).abs() <= 1e-5, "{p} vs {q}");
            }
        }
    }
    // A new version: the next batch carries it (the version installed when the step began).
    many.cfg.max_pending_groups = 100;
    many.slot().install(2, policy(2)).unwrap();
    assert!(matches!(
        many.step().unwrap(),
        StepOutcome::Produced { version: 2, .. }
    ));
    let after = scan(&store);
    assert_eq!(after.len(), 10);
    assert!(after[6..].iter().all(|g| g.version == 2));
    assert_eq!(pending(&store), 10);
}
