use super::*;
use crate::env::Step;

/// The stdlib-only test environment of the repository.
pub(crate) fn testenv_spec() -> ExternalSpec {
    ExternalSpec {
        command: vec![
            "python3".into(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../envs/testenv.py").into(),
        ],
        pin_files: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/../envs/echo_env.py").into()],
        // Generous on a loaded host: a healthy call answers in well under a millisecond.
        call_timeout_ms: 5_000,
        ..ExternalSpec::default()
    }
}

fn faulty(fault: &str) -> (serde_json::Value, ExternalSpec) {
    let params = serde_json::json!({"turns": 3, "fault": fault, "fault_turn": 2});
    let spec = ExternalSpec {
        // Every seed fails at turn 2: the start's determinism check would fail first.
        determinism_seeds: 0,
        ..testenv_spec()
    };
    (params, spec)
}

fn external(e: TaskError) -> ExternalError {
    match e {
        TaskError::External { error, .. } => error,
        other => panic!("not an external failure: {other}"),
    }
}

/// Plays `seed` with the reference actions; the rewards of every turn.
fn play(env: &dyn Environment, seed: u64) -> Result<(String, Vec<f32>), TaskError> {
    let start = env.reset(seed)?;
    let mut ep = start.episode;
    let mut rng = rand::rngs::mock::StepRng::new(0, 1);
    let mut rewards = Vec::new();
    loop {
        let a = ep.try_reference_action(&mut rng)?.unwrap_or_default();
        match ep.try_step(&a)? {
            Step::Continue { reward, .. } => rewards.push(reward),
            Step::Done { reward } => {
                rewards.push(reward);
                return Ok((start.prompt.text, rewards));
            }
        }
    }
}

#[test]
fn a_normal_episode_is_played_and_replays_identically() {
    let params = serde_json::json!({"turns": 3});
    let env = start("testenv", &params, &testenv_spec()).unwrap();
    let meta = env.metadata();
    assert_eq!((meta.max_turns, meta.return_range), (3, (0.0, 1.0)));
    assert_eq!(
        env.system_prompt().as_deref(),
        Some("Answer with the digit only.")
    );
    assert_eq!(env.hello().version.as_deref(), Some("testenv 1"));
    let (obs, rewards) = play(env.as_ref(), 17).unwrap();
    assert!(obs.starts_with("turn 1: say "), "{obs}");
    assert_eq!(rewards.len(), 3);
    assert!(
        (rewards.iter().sum::<f32>() - 1.0).abs() < 1e-6,
        "{rewards:?}"
    );
    // Same seed, same actions: the same observations and rewards, on a pooled process.
    assert_eq!(play(env.as_ref(), 17).unwrap(), (obs, rewards));
    // A wrong answer earns nothing for its turn; an illegal, huge or empty one is total.
    let mut ep = env.reset(17).unwrap().episode;
    for a in ["", &"x".repeat(100_000), "🙂"] {
        assert_eq!(ep.try_step(a).unwrap().reward(), 0.0);
    }
    assert!(ep.try_step("1").is_err(), "a step after the end is refused");
    // The same environment is shared, not started again.
    let again = start("testenv", &params, &testenv_spec()).unwrap();
    assert!(Arc::ptr_eq(&env.inner, &again.inner));
}

#[test]
fn the_pin_covers_name_params_version_and_files_not_paths() {
    let spec = testenv_spec();
    let p = serde_json::json!({"turns": 3});
    let base = pin("testenv", &p, &spec).unwrap();
    assert_eq!(pin("testenv", &p, &spec).unwrap(), base);
    assert_ne!(pin("testenv2", &p, &spec).unwrap(), base);
    assert_ne!(
        pin("testenv", &serde_json::json!({"turns": 2}), &spec).unwrap(),
        base
    );
    let versioned = ExternalSpec {
        version: Some("testenv 1".into()),
        ..spec.clone()
    };
    assert_ne!(pin("testenv", &p, &versioned).unwrap(), base);
    // Another interpreter path, the same program: the same pin.
    let mut elsewhere = spec.clone();
    elsewhere.command[0] = "/usr/local/bin/python3".into();
    assert_eq!(pin("testenv", &p, &elsewhere).unwrap(), base);
    // Other file contents: another pin; a missing file: an error.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("env.py");
    std::fs::write(&f, "a").unwrap();
    let with = |spec: &ExternalSpec| ExternalSpec {
        pin_files: vec![f.clone()],
        ..spec.clone()
    };
    let a = pin("testenv", &p, &with(&spec)).unwrap();
    std::fs::write(&f, "b").unwrap();
    assert_ne!(pin("testenv", &p, &with(&spec)).unwrap(), a);
    std::fs::remove_file(&f).unwrap();
    assert!(matches!(
        pin("testenv", &p, &with(&spec)),
        Err(ExternalError::PinFile { .. })
    ));
}

#[test]
fn a_crash_mid_episode_abandons_it_and_the_next_episode_restarts() {
    let (params, spec) = faulty("crash");
    let env = start("testenv", &params, &spec).unwrap();
    let mut ep = env.reset(4).unwrap().episode;
    assert!(matches!(ep.try_step("0").unwrap(), Step::Continue { .. }));
    let e = external(ep.try_step("0").unwrap_err());
    assert!(matches!(e, ExternalError::Exited { op: "step", .. }), "{e}");
    assert!(e.to_string().contains("exit status: 3"), "{e}");
    // Abandoned: no reward, no further step.
    assert!(ep.try_step("0").is_err());
    assert!(ep.try_truncate().is_err());
    drop(ep);
    let spawned = env.counters().spawned.load(Ordering::Relaxed);
    // A fresh process plays the next episode (which crashes at its turn 2 again).
    let mut ep = env.reset(5).unwrap().episode;
    assert!(ep.try_step("0").is_ok());
    assert!(env.counters().spawned.load(Ordering::Relaxed) > spawned);
    assert!(env.counters().failures.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_hang_is_timed_out_and_killed() {
    let (params, mut spec) = faulty("hang");
    spec.call_timeout_ms = 1_000;
    let env = start("testenv", &params, &spec).unwrap();
    let mut ep = env.reset(4).unwrap().episode;
    ep.try_step("0").unwrap();
    let e = external(ep.try_step("0").unwrap_err());
    assert_eq!(
        e,
        ExternalError::Timeout {
            op: "step",
            ms: 1_000
        }
    );
    drop(ep);
    // The hung process was killed, not pooled: the next episode answers.
    assert!(env.reset(6).unwrap().episode.try_step("0").is_ok());
}

#[test]
fn garbage_huge_lines_nan_and_out_of_range_returns_are_typed_errors() {
    for (fault, want) in [
        ("garbage", "not a JSON object"),
        ("huge", "a line longer than"),
        ("nan", "not a JSON object"),
        ("refuse", "refused on purpose"),
        ("out_of_range", "outside the declared range"),
    ] {
        let (params, mut spec) = faulty(fault);
        spec.max_line_bytes = 1 << 16;
        let env = start("testenv", &params, &spec).unwrap();
        let mut ep = env.reset(4).unwrap().episode;
        ep.try_step("0").unwrap();
        let e = external(ep.try_step("0").unwrap_err());
        assert!(e.to_string().contains(want), "{fault}: {e}");
        // The infallible `step` of an abandoned episode is never a usable reward.
        assert!(ep.step("0").reward().is_nan(), "{fault}");
    }
}

#[test]
fn a_memory_hog_is_stopped_by_the_limit() {
    let (params, mut spec) = faulty("alloc");
    spec.memory_mib = 256;
    let env = start("testenv", &params, &spec).unwrap();
    if !prlimit_works() {
        eprintln!("prlimit is not available here: the memory limit is not tested");
        return;
    }
    let mut ep = env.reset(4).unwrap().episode;
    ep.try_step("0").unwrap();
    // A MemoryError the program reports, or its death: either way no reward.
    let e = external(ep.try_step("0").unwrap_err());
    assert!(
        matches!(
            e,
            ExternalError::Refused { .. } | ExternalError::Exited { .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("MemoryError") || matches!(e, ExternalError::Exited { .. }));
}

#[test]
fn the_program_has_no_network_by_default() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let params = serde_json::json!({"turns": 1, "probe_port": port});
    let spec = ExternalSpec {
        determinism_seeds: 0,
        ..testenv_spec()
    };
    let open = ExternalSpec {
        network: true,
        ..spec.clone()
    };
    let env = start("testenv", &params, &open).unwrap();
    assert_eq!(env.reset(0).unwrap().prompt.text, "net: open");
    if !unshare_works() {
        eprintln!("unshare -rn is not available here: network isolation is not tested");
        return;
    }
    let env = start("testenv", &params, &spec).unwrap();
    assert_eq!(env.reset(0).unwrap().prompt.text, "net: closed");
}

#[test]
fn a_non_deterministic_program_is_refused_at_start() {
    let params = serde_json::json!({"turns": 2, "fault": "nondeterministic"});
    // Each process draws its own salt: two fresh processes differ with probability 9/10
    // per seed; 8 seeds make a false pass (1e-8) impossible in practice.
    let spec = ExternalSpec {
        determinism_seeds: 8,
        ..testenv_spec()
    };
    let e = external(start("testenv", &params, &spec).unwrap_err());
    assert!(matches!(e, ExternalError::NonDeterministic { .. }), "{e}");
    assert!(e.to_string().contains("not deterministic"), "{e}");
}

#[test]
fn bad_programs_and_wrong_versions_are_refused_at_start() {
    let spec = |command: &[&str]| ExternalSpec {
        command: command.iter().map(|s| s.to_string()).collect(),
        start_timeout_ms: 5_000,
        ..ExternalSpec::default()
    };
    let null = serde_json::Value::Null;
    let e = external(start("nope", &null, &spec(&["/nonexistent/program"])).unwrap_err());
    assert!(matches!(e, ExternalError::Spawn { .. }), "{e}");
    let e = external(start("chatty", &null, &spec(&["python3", "-c", "print('hi')"])).unwrap_err());
    assert!(
        matches!(e, ExternalError::BadJson { op: "hello", .. }),
        "{e}"
    );
    let e = external(
        start(
            "silent",
            &null,
            &spec(&["python3", "-c", "import sys; sys.exit(2)"]),
        )
        .unwrap_err(),
    );
    assert!(
        matches!(e, ExternalError::Exited { op: "hello", .. }),
        "{e}"
    );
    let hello = r#"import sys; sys.stdin.readline(); print('{"ok": true, "protocol": 1, "max_turns": 0, "return_range": [0, 1], "suggested_tokens_per_turn": 4}')"#;
    let e = external(start("zero", &null, &spec(&["python3", "-c", hello])).unwrap_err());
    assert!(e.to_string().contains("max_turns 0"), "{e}");
    let versioned = ExternalSpec {
        version: Some("testenv 2".into()),
        ..testenv_spec()
    };
    let e = external(start("testenv", &serde_json::json!({"turns": 1}), &versioned).unwrap_err());
    assert!(matches!(e, ExternalError::Version { .. }), "{e}");
    // Bad limits are a configuration error, before anything starts.
    let bad = ExternalSpec {
        call_timeout_ms: 0,
        ..testenv_spec()
    };
    assert!(matches!(
        start("testenv", &null, &bad),
        Err(TaskError::InvalidParams { .. })
    ));
}

#[test]
fn lines_are_read_within_their_bound() {
    let mut r = std::io::Cursor::new(b"ab\ncdef\nxyz".to_vec());
    assert_eq!(read_bounded(&mut r, 3).unwrap(), Some(Ok(b"ab".to_vec())));
    assert_eq!(read_bounded(&mut r, 3).unwrap(), Some(Err(())));
    let mut r = std::io::Cursor::new(b"xyz".to_vec());
    assert_eq!(read_bounded(&mut r, 3).unwrap(), Some(Ok(b"xyz".to_vec())));
    assert_eq!(read_bounded(&mut r, 3).unwrap(), None);
}
