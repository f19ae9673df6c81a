//! `echo-node inspect …`: read-only views of a node's stores.

use anyhow::Context;
use serde_json::json;
use storage::manifest::hash_hex;
use storage::{ChunkStore, DataDir, SignedManifest, TrajectoryStore};

use crate::cli::{InspectArgs, InspectWhat, StoreArgs};
use crate::config::NodeConfig;

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    match args.what {
        InspectWhat::Trajectories { store, list } => trajectories(&store, list),
        InspectWhat::Snapshots { store } => snapshots(&store),
        InspectWhat::Manifest { store, version } => manifest(&store, version),
    }
}

/// The data dir and the keep-K setting named by `--data-dir` or `--config`.
fn data_dir(args: &StoreArgs) -> anyhow::Result<(DataDir, usize)> {
    let (dir, keep) = match (&args.data_dir, &args.config) {
        (Some(d), _) => (d.clone(), usize::MAX),
        (None, Some(c)) => {
            let cfg = NodeConfig::load(c)?;
            (cfg.data_dir, cfg.storage.keep_snapshots)
        }
        (None, None) => anyhow::bail!("give --data-dir DIR or --config FILE"),
    };
    anyhow::ensure!(dir.is_dir(), "data dir {} does not exist", dir.display());
    Ok((DataDir::new(dir), keep))
}

const IN_USE: &str =
    "is a node running on this data dir? stop it, or use `echo-node status` for a live node";

fn open_chunks(data: &DataDir, keep: usize) -> anyhow::Result<ChunkStore> {
    let path = data.snapshots();
    anyhow::ensure!(path.is_dir(), "no snapshot store at {}", path.display());
    ChunkStore::open(&path, keep).with_context(|| format!("opening {} ({IN_USE})", path.display()))
}

fn trajectories(args: &StoreArgs, list: usize) -> anyhow::Result<()> {
    let (data, _) = data_dir(args)?;
    let path = data.trajectories();
    anyhow::ensure!(path.is_dir(), "no trajectory store at {}", path.display());
    let store = TrajectoryStore::open(&path)
        .with_context(|| format!("opening {} ({IN_USE})", path.display()))?;
    let inv = store.check_invariant()?;
    let c = inv.counters;
    let versions = store.versions()?;
    let leases = store.leases()?;
    let groups = store.scan(0, list)?;
    if args.json {
        let out = json!({
            "path": path,
            "counters": {
                "produced": c.produced, "leased": c.leased, "consumed": c.consumed,
                "discarded_stale": c.discarded_stale, "rejected_invalid": c.rejected_invalid,
                "duplicates": c.duplicates,
                "pending": inv.stored,
            },
            "invariant_holds": inv.holds(),
            "groups_per_version": versions.iter().map(|(v, n)| json!({"version": v, "groups": n})).collect::<Vec<_>>(),
            "leases": leases.iter().map(|l| json!({"id": l.id, "expires_unix_ms": l.expires_unix_ms, "groups": l.groups})).collect::<Vec<_>>(),
            "groups": groups.iter().map(|(k, g)| json!({
                "version": k.version, "seq": k.seq, "group_id": hex::encode(g.group_id), "task": g.task_id,
                "prompt_id": g.prompt_id, "producer": g.producer, "samples": g.samples.len(),
                "mean_reward": g.mean_reward(),
            })).collect::<Vec<_>>(),
            "size_on_disk": store.size_on_disk()?,
        });
        println!("{out}");
        return Ok(());
    }
    println!("trajectory store {}", path.display());
    println!(
        "  produced {}  leased {}  consumed {}  discarded_stale {}  rejected_invalid {}  duplicates {}  pending {}",
        c.produced, c.leased, c.consumed, c.discarded_stale, c.rejected_invalid, c.duplicates, inv.stored
    );
    println!(
        "  invariant produced = consumed + discarded_stale + pending: {}",
        if inv.holds() { "holds" } else { "BROKEN" }
    );
    println!("  on disk: {} bytes", store.size_on_disk()?);
    if versions.is_empty() {
        println!("  no groups stored");
    }
    for (v, n) in &versions {
        println!("  version {v:>6}: {n} groups");
    }
    for l in &leases {
        println!(
            "  lease {} : {} groups, expires at {} ms",
            l.id, l.groups, l.expires_unix_ms
        );
    }
    for (k, g) in &groups {
        println!(
            "  [v{} #{}] {} task={} prompt={} n={} mean_reward={:.3} producer={}",
            k.version,
            k.seq,
            hex::encode(g.group_id),
            g.task_id,
            g.prompt_id,
            g.samples.len(),
            g.mean_reward(),
            g.producer
        );
    }
    Ok(())
}

/// What a manifest's payload is: `{"kind": "full"}`, a delta with its base version, or a LoRA
/// run's adapters with their base (version or `null` = the configured model) and identity.
fn payload_json(kind: &storage::PayloadKind) -> serde_json::Value {
    match kind {
        storage::PayloadKind::Full => json!({"kind": "full"}),
        storage::PayloadKind::Delta { base_version, .. } => {
            json!({"kind": "delta", "base_version": base_version})
        }
        storage::PayloadKind::Adapter {
            base_version,
            base_hash,
        } => json!({
            "kind": "adapter", "base_version": base_version, "base_hash": hash_hex(base_hash),
        }),
    }
}

fn snapshots(args: &StoreArgs) -> anyhow::Result<()> {
    let (data, keep) = data_dir(args)?;
    let store = open_chunks(&data, keep)?;
    let stats = store.stats()?;
    let mut rows = Vec::new();
    for v in store.versions()? {
        let Some(m) = store.manifest(v)? else {
            continue;
        };
        let missing = store.missing_chunks(v)?.len();
        rows.push((m, missing));
    }
    if args.json {
        let out = json!({
            "chunks": stats.chunks, "bytes": stats.bytes, "manifests": stats.manifests,
            "snapshots": rows.iter().map(|(m, missing)| json!({
                "version": m.manifest.version, "total_len": m.manifest.total_len,
                "chunks": m.manifest.chunk_hashes.len(), "missing": missing,
                "root_hash": hash_hex(&m.manifest.root_hash),
                "payload": payload_json(&m.manifest.payload),
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "snapshot store {}: {} chunks, {} bytes, {} manifests",
        data.snapshots().display(),
        stats.chunks,
        stats.bytes,
        stats.manifests
    );
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["version", "bytes", "chunks", "state", "root hash"]);
    for (m, missing) in rows {
        let m = m.manifest;
        t.add_row(vec![
            format!("v{}", m.version),
            m.total_len.to_string(),
            m.chunk_hashes.len().to_string(),
            if missing == 0 {
                "complete".to_string()
            } else {
                format!("{missing} missing")
            },
            hash_hex(&m.root_hash),
        ]);
    }
    println!("{t}");
    Ok(())
}

fn manifest(args: &StoreArgs, version: Option<u64>) -> anyhow::Result<()> {
    let (data, keep) = data_dir(args)?;
    let store = open_chunks(&data, keep)?;
    let signed: SignedManifest = match version {
        Some(v) => store
            .manifest(v)?
            .with_context(|| format!("no manifest for version {v}"))?,
        None => store
            .latest_manifest()?
            .context("the store holds no manifest")?,
    };
    let sig_ok = signed.verify_self_consistent().is_ok();
    let m = &signed.manifest;
    if args.json {
        println!(
            "{}",
            json!({
                "swarm_id": m.swarm_id, "version": m.version,
                "model_config_hash": hash_hex(&m.model_config_hash), "total_len": m.total_len,
                "chunk_size": m.chunk_size, "root_hash": hash_hex(&m.root_hash),
                "created_unix_ms": m.created_unix_ms, "learner_key": hex::encode(m.learner_key),
                "signature_valid": sig_ok,
                "chunks": m.chunk_hashes.iter().map(hash_hex).collect::<Vec<_>>(),
            })
        );
        return Ok(());
    }
    println!("manifest v{} of swarm `{}`", m.version, m.swarm_id);
    println!(
        "  total length   {} bytes in {} chunks of {} bytes",
        m.total_len,
        m.chunk_hashes.len(),
        m.chunk_size
    );
    println!("  root hash      {}", hash_hex(&m.root_hash));
    println!("  config hash    {}", hash_hex(&m.model_config_hash));
    println!("  learner key    {}", hex::encode(m.learner_key));
    println!(
        "  signature      {}",
        if sig_ok {
            "valid for the learner key above"
        } else {
            "INVALID"
        }
    );
    println!("  created        {} ms since epoch", m.created_unix_ms);
    for (i, h) in m.chunk_hashes.iter().enumerate() {
        println!("  chunk {i:>5}    {}", hash_hex(h));
    }
    Ok(())
}
