use super::*;
use crate::build_env;

#[test]
fn tasks_are_one_step_environments_with_the_same_rewards() {
    for name in ["arith", "knights-knaves"] {
        let task = crate::build_task(name, &serde_json::Value::Null).unwrap();
        let env = build_env(name, &serde_json::Value::Null).unwrap();
        assert_eq!(env.name(), name);
        let meta = env.metadata();
        assert_eq!(meta.max_turns, 1);
        assert!(!meta.is_multi_turn());
        assert_eq!(meta.num_initial_states, task.metadata().num_prompts);
        assert_eq!(meta.return_range, task.metadata().reward_range);
        assert!(env.as_task().is_some() && env.exact().is_none());
        for i in [0u64, 3, 17] {
            let p = task.prompt(i).unwrap();
            let reference = task.reference_completion(&p).unwrap();
            for completion in [reference.as_str(), "", "42", "garbage \u{fffd}"] {
                let start = env.reset(i).unwrap();
                assert_eq!(start.prompt, p);
                let mut ep = start.episode;
                let want = task.reward(&p, completion).value;
                assert_eq!(ep.step(completion), Step::Done { reward: want });
            }
            assert_eq!(env.seed_of(&p.id), Some(i));
            let mut rng = rand::rngs::mock::StepRng::new(0, 1);
            let ep = env.reset(i).unwrap().episode;
            assert_eq!(ep.reference_action(&mut rng), Some(reference));
        }
        assert_eq!(env.seed_of("nope"), None);
    }
}

#[test]
fn the_registry_builds_environments_and_names_them_all_on_error() {
    let kuhn = build_env("kuhn-poker", &serde_json::Value::Null).unwrap();
    assert!(kuhn.metadata().is_multi_turn() && kuhn.exact().is_some());
    assert!(kuhn.system_prompt().is_some());
    let holdem = build_env("holdem", &serde_json::Value::Null).unwrap();
    assert!(holdem.metadata().is_multi_turn());
    let e = build_env("chess", &serde_json::Value::Null).err().unwrap();
    for name in ["arith", "kuhn-poker", "holdem"] {
        assert!(e.to_string().contains(name), "{e}");
    }
    // A task's own parameter errors come through.
    let e = build_env("arith", &serde_json::json!({"ops": "/"}))
        .err()
        .unwrap();
    assert!(e.to_string().contains("arith"), "{e}");
    // Seeds of an unbounded environment are decimal u64s, and only those.
    assert_eq!(kuhn.seed_of("123"), Some(123));
    for bad in ["0123", "-1", "1e3", ""] {
        assert_eq!(kuhn.seed_of(bad), None, "{bad:?}");
    }
}

#[test]
fn budgets_default_from_metadata_and_validate_overrides() {
    let env = build_env("kuhn-poker", &serde_json::Value::Null).unwrap();
    let meta = env.metadata();
    let b = Budget::of(&meta);
    assert_eq!(b.max_turns, meta.max_turns);
    assert_eq!(b.max_turn_tokens, meta.suggested_tokens_per_turn);
    assert!(b.max_episode_tokens >= b.max_turn_tokens * b.max_turns as usize);
    let b2 = b.with(&meta, Some(1), Some(4), None).unwrap();
    assert_eq!((b2.max_turns, b2.max_turn_tokens), (1, 4));
    for (t, tt, et) in [
        (Some(0), None, None),
        (Some(meta.max_turns + 1), None, None),
        (None, Some(0), None),
        (None, Some(64), Some(8)),
    ] {
        let e = b.with(&meta, t, tt, et).unwrap_err();
        assert!(e.to_string().contains("kuhn-poker"), "{e}");
    }
}
