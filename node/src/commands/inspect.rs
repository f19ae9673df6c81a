//! `echo-node inspect …`: read-only views of a node's stores.
//!
//! Each view is built whole, then written to stdout at once; a reader that goes away
//! (`inspect … | head`) ends the command quietly with success. Times are printed as UTC
//! dates (`2026-12-01T21:02:23.120Z`), and also as milliseconds in `--json`.

use std::fmt::Write as _;
use std::io::Write as _;

use anyhow::Context;
use serde_json::json;
use storage::manifest::hash_hex;
use storage::{ChunkStore, DataDir, SignedManifest, TrajectoryStore};

use crate::cli::{InspectArgs, InspectWhat, StoreArgs};
use crate::config::NodeConfig;

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let mut out = String::new();
    match args.what {
        InspectWhat::Trajectories { store, list } => trajectories(&store, list, &mut out)?,
        InspectWhat::Snapshots { store } => snapshots(&store, &mut out)?,
        InspectWhat::Manifest { store, version } => manifest(&store, version, &mut out)?,
    }
    emit(&out)
}

/// Writes `text` to stdout; a closed pipe is not an error (the reader has what it wanted).
fn emit(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r.context("writing to stdout")?),
    }
}

/// `unix_ms` as an RFC 3339 UTC date with milliseconds (proleptic Gregorian calendar).
pub fn utc_date(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (non-negative here).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
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

/// A store that cannot be opened: a damaged one says so itself (and what to do); anything
/// else is most likely a running node's lock.
fn opening(path: &std::path::Path, e: storage::StorageError) -> anyhow::Error {
    match e {
        e @ storage::StorageError::Damaged { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(format!("opening {} ({IN_USE})", path.display())),
    }
}

fn open_chunks(data: &DataDir, keep: usize) -> anyhow::Result<ChunkStore> {
    let path = data.snapshots();
    anyhow::ensure!(path.is_dir(), "no snapshot store at {}", path.display());
    ChunkStore::open(&path, keep).map_err(|e| opening(&path, e))
}

fn trajectories(args: &StoreArgs, list: usize, out: &mut String) -> anyhow::Result<()> {
    let (data, _) = data_dir(args)?;
    let path = data.trajectories();
    anyhow::ensure!(path.is_dir(), "no trajectory store at {}", path.display());
    let store = TrajectoryStore::open(&path).map_err(|e| opening(&path, e))?;
    let inv = store.check_invariant()?;
    let c = inv.counters;
    let versions = store.versions()?;
    let leases = store.leases()?;
    let groups = store.scan(0, list)?;
    if args.json {
        let v = json!({
            "path": path,
            "counters": {
                "produced": c.produced, "leased": c.leased, "consumed": c.consumed,
                "discarded_stale": c.discarded_stale, "rejected_invalid": c.rejected_invalid,
                "duplicates": c.duplicates,
                "pending": inv.stored,
            },
            "invariant_holds": inv.holds(),
            "groups_per_version": versions.iter().map(|(v, n)| json!({"version": v, "groups": n})).collect::<Vec<_>>(),
            "leases": leases.iter().map(|l| json!({
                "id": l.id, "expires_unix_ms": l.expires_unix_ms,
                "expires": utc_date(l.expires_unix_ms), "groups": l.groups,
            })).collect::<Vec<_>>(),
            "groups": groups.iter().map(|(k, g)| json!({
                "version": k.version, "seq": k.seq, "group_id": hex::encode(g.group_id), "task": g.task_id,
                "prompt_id": g.prompt_id, "producer": g.producer, "samples": g.samples.len(),
                "mean_reward": g.mean_reward(),
            })).collect::<Vec<_>>(),
            "size_on_disk": store.size_on_disk()?,
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "trajectory store {}", path.display())?;
    writeln!(
        out,
        "  produced {}  leased {}  consumed {}  discarded_stale {}  rejected_invalid {}  duplicates {}  pending {}",
        c.produced, c.leased, c.consumed, c.discarded_stale, c.rejected_invalid, c.duplicates, inv.stored
    )?;
    writeln!(
        out,
        "  invariant produced = consumed + discarded_stale + pending: {}",
        if inv.holds() { "holds" } else { "BROKEN" }
    )?;
    writeln!(out, "  on disk: {} bytes", store.size_on_disk()?)?;
    if versions.is_empty() {
        writeln!(out, "  no groups stored")?;
    }
    for (v, n) in &versions {
        writeln!(out, "  version {v:>6}: {n} groups")?;
    }
    for l in &leases {
        writeln!(
            out,
            "  lease {} : {} groups, expires {}",
            l.id,
            l.groups,
            utc_date(l.expires_unix_ms)
        )?;
    }
    for (k, g) in &groups {
        writeln!(
            out,
            "  [v{} #{}] {} task={} prompt={} n={} mean_reward={:.3} producer={}",
            k.version,
            k.seq,
            hex::encode(g.group_id),
            g.task_id,
            g.prompt_id,
            g.samples.len(),
            g.mean_reward(),
            g.producer
        )?;
    }
    Ok(())
}

/// What a manifest's payload is: `{"kind": "full"}`, a delta with its base version, or a LoRA
/// run's adapters with their base (version or `null` = the configured model) and identity;
/// every kind with `full_root`, the BLAKE3 of the payload the version installs
/// (`SnapshotManifest::full_root`: a delta's reconstructed payload, signed in its manifest).
fn payload_json(m: &storage::SnapshotManifest) -> serde_json::Value {
    let full_root = hash_hex(&m.full_root());
    match &m.payload {
        storage::PayloadKind::Full => json!({"kind": "full", "full_root": full_root}),
        storage::PayloadKind::Delta { base_version, .. } => {
            json!({"kind": "delta", "base_version": base_version, "full_root": full_root})
        }
        storage::PayloadKind::Adapter {
            base_version,
            base_hash,
        } => json!({
            "kind": "adapter", "base_version": base_version, "base_hash": hash_hex(base_hash),
            "full_root": full_root,
        }),
    }
}

/// The payload in words: `full`, `delta on v3`, `adapter on v0` / `adapter on the configured model`.
fn payload_text(kind: &storage::PayloadKind) -> String {
    match kind {
        storage::PayloadKind::Full => "full".into(),
        storage::PayloadKind::Delta { base_version, .. } => format!("delta on v{base_version}"),
        storage::PayloadKind::Adapter {
            base_version: Some(v),
            ..
        } => format!("adapter on v{v}"),
        storage::PayloadKind::Adapter {
            base_version: None, ..
        } => "adapter on the configured model".into(),
    }
}

fn snapshots(args: &StoreArgs, out: &mut String) -> anyhow::Result<()> {
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
        let v = json!({
            "chunks": stats.chunks, "bytes": stats.bytes, "manifests": stats.manifests,
            "snapshots": rows.iter().map(|(m, missing)| json!({
                "version": m.manifest.version, "total_len": m.manifest.total_len,
                "chunks": m.manifest.chunk_hashes.len(), "missing": missing,
                "root_hash": hash_hex(&m.manifest.root_hash),
                "full_root": hash_hex(&m.manifest.full_root()),
                "created_unix_ms": m.manifest.created_unix_ms,
                "created": utc_date(m.manifest.created_unix_ms),
                "payload": payload_json(&m.manifest),
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(
        out,
        "snapshot store {}: {} chunks, {} bytes, {} manifests",
        data.snapshots().display(),
        stats.chunks,
        stats.bytes,
        stats.manifests
    )?;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "version",
        "payload",
        "bytes",
        "chunks",
        "state",
        "created (UTC)",
        "root hash (stored bytes)",
        "full root (installed payload)",
    ]);
    for (m, missing) in rows {
        let m = m.manifest;
        t.add_row(vec![
            format!("v{}", m.version),
            payload_text(&m.payload),
            m.total_len.to_string(),
            m.chunk_hashes.len().to_string(),
            if missing == 0 {
                "complete".to_string()
            } else {
                format!("{missing} missing")
            },
            utc_date(m.created_unix_ms),
            hash_hex(&m.root_hash),
            hash_hex(&m.full_root()),
        ]);
    }
    writeln!(out, "{t}")?;
    Ok(())
}

/// `versions` as `v1, v2, v5` (or `none`).
fn held(versions: &[u64]) -> String {
    if versions.is_empty() {
        return "none".into();
    }
    versions
        .iter()
        .map(|v| format!("v{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn manifest(args: &StoreArgs, version: Option<u64>, out: &mut String) -> anyhow::Result<()> {
    let (data, keep) = data_dir(args)?;
    let store = open_chunks(&data, keep)?;
    let signed: SignedManifest = match version {
        Some(v) => match store.manifest(v)? {
            Some(m) => m,
            None => anyhow::bail!(
                "no manifest for version {v} in {}; versions held: {} (the store keeps the \
                 newest storage.keep_snapshots and the keyframes their deltas need)",
                data.snapshots().display(),
                held(&store.versions()?)
            ),
        },
        None => store
            .latest_manifest()?
            .context("the store holds no manifest")?,
    };
    let sig_ok = signed.verify_self_consistent().is_ok();
    let m = &signed.manifest;
    if args.json {
        let v = json!({
            "swarm_id": m.swarm_id, "version": m.version,
            "model_config_hash": hash_hex(&m.model_config_hash), "total_len": m.total_len,
            "chunk_size": m.chunk_size, "root_hash": hash_hex(&m.root_hash),
            "full_root": hash_hex(&m.full_root()), "payload": payload_json(m),
            "created_unix_ms": m.created_unix_ms, "created": utc_date(m.created_unix_ms),
            "learner_key": hex::encode(m.learner_key),
            "signature_valid": sig_ok,
            "chunks": m.chunk_hashes.iter().map(hash_hex).collect::<Vec<_>>(),
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "manifest v{} of swarm `{}`", m.version, m.swarm_id)?;
    writeln!(out, "  payload        {}", payload_text(&m.payload))?;
    writeln!(
        out,
        "  total length   {} bytes in {} chunks of {} bytes",
        m.total_len,
        m.chunk_hashes.len(),
        m.chunk_size
    )?;
    writeln!(
        out,
        "  root hash      {} (the stored bytes)",
        hash_hex(&m.root_hash)
    )?;
    writeln!(
        out,
        "  full root      {} (the payload this version installs)",
        hash_hex(&m.full_root())
    )?;
    if let storage::PayloadKind::Adapter { base_hash, .. } = &m.payload {
        writeln!(out, "  base hash      {}", hash_hex(base_hash))?;
    }
    writeln!(out, "  config hash    {}", hash_hex(&m.model_config_hash))?;
    writeln!(out, "  learner key    {}", hex::encode(m.learner_key))?;
    writeln!(
        out,
        "  signature      {}",
        if sig_ok {
            "valid for the learner key above"
        } else {
            "INVALID"
        }
    )?;
    writeln!(out, "  created        {}", utc_date(m.created_unix_ms))?;
    for (i, h) in m.chunk_hashes.iter().enumerate() {
        writeln!(out, "  chunk {i:>5}    {}", hash_hex(h))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::utc_date;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.789.
        assert_eq!(utc_date(951_827_696_789), "2000-02-29T12:34:56.789Z");
        assert_eq!(utc_date(1_764_633_600_000), "2025-12-02T00:00:00.000Z");
        assert_eq!(utc_date(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
