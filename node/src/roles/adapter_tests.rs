//! Adapter versions end to end in one process: what a LoRA learner publishes, a worker's
//! install onto the published base or its configured model, and the refusal of adapters
//! trained on another base (both identities named, nothing installed).

use policy::lora::LoraConfig;
use policy::{Device, ModelConfig, Tensor};
use rollout::PolicySlot;

use super::*;
use crate::test_util::max_diff;

/// The embedded model of `seed` with rank-4 adapters whose `B`s are non-zero (trained).
fn learner(seed: u64) -> Policy {
    let p = Policy::new_random(&ModelConfig::tiny(), seed, &Device::Cpu)
        .unwrap()
        .with_lora(&LoraConfig::new(4, 8.0), 2)
        .unwrap();
    for (name, var) in p.trainable_named_vars().unwrap() {
        if name.ends_with("lora_B.weight") {
            var.set(&Tensor::randn(0f32, 0.05, var.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    p
}

/// A worker's bases: the embedded model of `seed` is its configured model.
fn bases(dir: &std::path::Path, seed: u64) -> Bases {
    let config = NodeConfig::parse(&format!(
        "role = \"rollout\"\nswarm_id = \"t\"\ndata_dir = \"{}\"\n[model]\nseed = {seed}\n",
        dir.display()
    ))
    .unwrap();
    let chunks = Arc::new(ChunkStore::open(&dir.join("chunks"), 2).unwrap());
    Bases::new(config, ModelConfig::tiny(), chunks)
}

fn logits(p: &Policy) -> Tensor {
    let ids = Tensor::new(&[[257u32, 5, 9, 200, 3, 77]], &Device::Cpu).unwrap();
    p.forward(&ids).unwrap()
}

#[test]
fn a_lora_learner_ships_its_base_once_then_adapters() {
    let p = learner(1);
    let s = Shipping::of(&p, true).unwrap();
    assert_eq!(s.base_version, Some(0));
    let (base, kind) = s.payload(&p, 0, DType::F32).unwrap();
    assert_eq!(kind, PayloadKind::Full);
    let decoded = Policy::from_safetensors_bytes(p.config(), &base, &Device::Cpu).unwrap();
    assert_eq!(base_identity(&decoded).unwrap(), s.base_hash);
    let (a, kind) = s.payload(&p, 3, DType::BF16).unwrap();
    assert_eq!(
        kind,
        PayloadKind::Adapter {
            base_version: Some(0),
            base_hash: s.base_hash
        }
    );
    assert_eq!(Adapters::stored_dtype(&a).unwrap(), DType::BF16);
    assert!(a.len() * 10 < base.len(), "{} vs {}", a.len(), base.len());
    let local = Shipping::of(&p, false).unwrap();
    assert_eq!(local.base_version, None);
    assert!(matches!(
        local.payload(&p, 0, DType::F32).unwrap().1,
        PayloadKind::Adapter {
            base_version: None,
            ..
        }
    ));
}

#[test]
fn a_worker_installs_adapters_on_the_published_base_and_refuses_another() {
    let dir = tempfile::tempdir().unwrap();
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    // The worker's configured model is not the base: it needs version 0.
    let mut b = bases(dir.path(), 77);
    let l = learner(1);
    let s = Shipping::of(&l, true).unwrap();
    let (base, kind) = s.payload(&l, 0, DType::F32).unwrap();
    install(&slot, &mut b, 0, &base, kind).unwrap();
    let (a, kind) = s.payload(&l, 1, DType::F32).unwrap();
    let root = install(&slot, &mut b, 1, &a, kind).unwrap();
    assert_eq!(root, hex::encode(hash_bytes(&a)));
    let installed = slot.current().unwrap();
    assert_eq!(installed.version, 1);
    assert!(installed.policy.lora().is_some());
    let d = max_diff(&logits(&installed.policy), &logits(&l));
    assert!(d < 1e-5, "installed vs learner logits: {d}");

    // Adapters of a learner with another base (a published base v0 it does not share).
    let other = learner(9);
    let so = Shipping::of(&other, true).unwrap();
    let (a, kind) = so.payload(&other, 2, DType::F32).unwrap();
    let e = install(&slot, &mut b, 2, &a, kind).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e.downcast_ref::<AdapterRefused>(),
            Some(AdapterRefused::BaseMismatch { .. })
        ),
        "{e:#}"
    );
    assert!(msg.contains(&hex::encode(so.base_hash)), "{msg}");
    assert!(msg.contains(&hex::encode(s.base_hash)), "{msg}");
    assert_eq!(slot.version(), Some(1), "nothing was installed");
    // A payload that is not adapters of this model is a typed refusal too.
    let e = install(&slot, &mut b, 3, b"garbage", kind).unwrap_err();
    assert!(matches!(
        e.downcast_ref::<AdapterRefused>(),
        Some(AdapterRefused::Payload { .. })
    ));
}

#[test]
fn the_configured_model_is_a_base_when_no_version_names_one() {
    let dir = tempfile::tempdir().unwrap();
    // The learner trains on the embedded model of seed 5 (no warm start).
    let l = learner(5);
    let s = Shipping::of(&l, false).unwrap();
    let (a, kind) = s.payload(&l, 0, DType::F32).unwrap();

    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let mut same = bases(&dir.path().join("same"), 5);
    install(&slot, &mut same, 0, &a, kind).unwrap();
    let d = max_diff(&logits(&slot.current().unwrap().policy), &logits(&l));
    assert!(d < 1e-5, "{d}");

    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let mut other = bases(&dir.path().join("other"), 6);
    let e = install(&slot, &mut other, 0, &a, kind).unwrap_err();
    let local = Policy::new_random(&ModelConfig::tiny(), 6, &Device::Cpu).unwrap();
    let msg = e.to_string();
    assert!(msg.contains(&hex::encode(s.base_hash)), "{msg}");
    assert!(
        msg.contains(&hex::encode(base_identity(&local).unwrap())),
        "{msg}"
    );
    assert!(msg.contains("configured model"), "{msg}");
    assert_eq!(slot.version(), None);
}

#[test]
fn a_restarted_worker_resumes_an_adapter_version_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let key = storage::NodeKey::generate();
    let chunks = Arc::new(ChunkStore::open(&dir.path().join("chunks"), 2).unwrap());
    let l = learner(1);
    let s = Shipping::of(&l, true).unwrap();
    for v in 0..4 {
        let (bytes, kind) = s.payload(&l, v, DType::F32).unwrap();
        let mut m = storage::SnapshotManifest::build(
            "t",
            v,
            l.config().hash(),
            &bytes,
            1 << 20,
            &key.verifying_key(),
        )
        .unwrap();
        m.payload = kind;
        chunks
            .publish(&m.sign(key.signing_key()).unwrap(), &bytes.into())
            .unwrap();
        chunks.retain().unwrap();
    }
    // Versions 0 (the base, kept for the adapters that name it), 2 and 3 are held.
    assert_eq!(chunks.versions().unwrap(), [0, 2, 3]);
    let config = NodeConfig::parse(&format!(
        "role = \"rollout\"\nswarm_id = \"t\"\ndata_dir = \"{}\"\n",
        dir.path().display()
    ))
    .unwrap();
    let mut b = Bases::new(config, ModelConfig::tiny(), chunks.clone());
    let slot = PolicySlot::new(ModelConfig::tiny(), Device::Cpu);
    let stored = install_stored(&slot, &mut b, &chunks).unwrap();
    assert_eq!(stored.map(|(v, _, _)| v), Some(3));
    let d = max_diff(&logits(&slot.current().unwrap().policy), &logits(&l));
    assert!(d < 1e-5, "{d}");
}

#[test]
fn changed_fraction_counts_changed_values_of_one_layout() {
    let l = learner(1);
    let a = l.lora().unwrap();
    let before = a.to_safetensors_bytes_as(l.config(), DType::BF16).unwrap();
    assert_eq!(
        changed_fraction(&before, &before),
        Some((0.0, changed_fraction(&before, &before).unwrap().1))
    );
    // Change every B by a lot: B's values (half the tensors' rows at rank 4) all change.
    for (name, var) in a.named_vars().unwrap() {
        if name.ends_with("lora_B.weight") {
            var.set(&(var.as_tensor() + 1.0).unwrap()).unwrap();
        }
    }
    let after = a.to_safetensors_bytes_as(l.config(), DType::BF16).unwrap();
    let (frac, delta) = changed_fraction(&before, &after).unwrap();
    let b_values: usize = a
        .named_vars()
        .unwrap()
        .iter()
        .filter(|(n, _)| n.ends_with("lora_B.weight"))
        .map(|(_, v)| v.elem_count())
        .sum();
    let all: usize = a
        .named_vars()
        .unwrap()
        .iter()
        .map(|(_, v)| v.elem_count())
        .sum();
    assert!((frac - b_values as f64 / all as f64).abs() < 1e-9, "{frac}");
    assert!(delta.unwrap() > 0.0);
    assert_eq!(changed_fraction(&before, &before[..before.len() - 2]), None);
    assert_eq!(changed_fraction(b"x", b"y"), None);
}
