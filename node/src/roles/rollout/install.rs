//! The worker's install side: resume from the durable chunk store at start, then install what
//! the dissemination engine delivers (whole payloads, deltas onto the held base, adapters
//! onto the base their manifest names), catching up on the delta chain when a base is missing.
//! The generation engine only ever sees the [`PolicySlot`] change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dissemination::DisseminationEvent;
use rollout::PolicySlot;
use storage::{ChunkStore, PayloadKind};
use tokio::sync::mpsc;

use crate::roles::adapter::{self, Bases};
use crate::roles::catchup::{self, PayloadStats};
use crate::roles::delta::DeltaBase;
use crate::state::NodeState;

/// Installs the newest snapshot the durable chunk store rebuilds (a delta version from its
/// keyframe and the deltas since, each checked against its signed root; an adapter version
/// onto the base it names) and returns it as the base of the next delta. A store that holds
/// nothing complete, or fails to rebuild, leaves the worker waiting for the next version.
pub(super) async fn restore(
    state: &NodeState,
    slot: &PolicySlot,
    bases: &Arc<Mutex<Bases>>,
    payloads: &PayloadStats,
) -> DeltaBase {
    let mut base = DeltaBase::default();
    let (chunks, slot, bases) = (state.chunks.clone(), slot.clone(), bases.clone());
    let restored = tokio::task::spawn_blocking(move || {
        let mut b = bases.lock().unwrap_or_else(|e| e.into_inner());
        let Some((v, full, root)) = adapter::install_stored(&slot, &mut b, &chunks)? else {
            return anyhow::Ok(None);
        };
        Ok(Some((
            v,
            Arc::new(full),
            root,
            catchup::position(&chunks, v)?,
        )))
    })
    .await;
    match restored {
        Ok(Ok(None)) => {}
        Ok(Ok(Some((v, full, root, at)))) => {
            tracing::info!(
                version = v,
                delta = at.position == crate::api::PayloadPosition::Delta,
                root = %root,
                "installed the stored snapshot"
            );
            base.installed(v, full);
            payloads.set_restored(v);
            payloads.set_installed(at);
        }
        Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "stored snapshot not installed"),
        Err(e) => tracing::error!(error = %e, "the restore task failed"),
    }
    base
}

/// The install loop's state: where versions go and what the next delta applies to.
pub(super) struct Installer {
    pub slot: PolicySlot,
    pub bases: Arc<Mutex<Bases>>,
    /// The full payload installed last: the base of the next delta version.
    pub base: DeltaBase,
    pub chunks: Arc<ChunkStore>,
    pub payloads: Arc<PayloadStats>,
    pub dissem: Option<dissemination::Disseminator>,
    /// Set while the learner's signed activation order keeps this worker on standby.
    pub standby: Arc<AtomicBool>,
    /// The download bar (on a terminal, for long payloads).
    pub bar: crate::roles::progress::Bar,
}

impl Installer {
    /// Handles the engine's events until its channel closes.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<DisseminationEvent>) {
        while let Some(ev) = rx.recv().await {
            match ev {
                DisseminationEvent::Installed {
                    version,
                    payload,
                    kind,
                    latency,
                } => {
                    self.bar.installed(version);
                    self.installed(version, payload, kind, latency).await;
                }
                DisseminationEvent::ChunkRejected {
                    peer,
                    version,
                    index,
                } => tracing::warn!(%peer, version, index, "corrupt chunk rejected"),
                DisseminationEvent::Activation { seq, active } => {
                    let was = !self.standby.swap(!active, Ordering::Relaxed);
                    if was != active {
                        tracing::info!(
                            seq,
                            active,
                            "the learner's scheduler changed this worker's state"
                        );
                    }
                }
                DisseminationEvent::Progress {
                    version,
                    stored,
                    total,
                    bytes,
                } => self.bar.progress(version, stored, total, bytes),
            }
        }
    }

    /// One verified payload from the engine: rebuilt into the full payload and loaded, or
    /// refused (counted and logged; the slot keeps the version it had).
    async fn installed(
        &mut self,
        version: u64,
        payload: Arc<Vec<u8>>,
        kind: PayloadKind,
        latency: Duration,
    ) {
        if self.base.has(version) {
            return; // rebuilt from the store at start, or caught up past it
        }
        // Adapters need their published base: a late joiner fetches it first.
        if let PayloadKind::Adapter {
            base_version: Some(b),
            ..
        } = kind
        {
            catchup::fetch_base(self.dissem.as_ref(), &self.chunks, b, &self.payloads).await;
        }
        let (slot, bases, held) = (self.slot.clone(), self.bases.clone(), self.base.clone());
        let r = tokio::task::spawn_blocking(move || {
            // A delta is applied to the held base and checked against the signed full root
            // before anything is loaded; adapters go onto the base their manifest names.
            let full = held.full_payload(version, payload, kind)?;
            let mut b = bases.lock().unwrap_or_else(|e| e.into_inner());
            let root = adapter::install(&slot, &mut b, version, &full, kind)?;
            anyhow::Ok((full, root))
        })
        .await;
        let r = match r {
            // No base (a missed version, a late join, a restart behind): catch up on the
            // chain instead.
            Ok(Err(e)) if catchup::needs_catch_up(&e) => {
                tracing::info!(version, error = %e, "catching up");
                Ok(catchup::catch_up_and_load(
                    self.dissem.as_ref(),
                    &self.chunks,
                    &self.slot,
                    &self.base,
                    version,
                    &self.payloads,
                )
                .await)
            }
            r => r,
        };
        match r {
            Ok(Ok((full, root))) => {
                self.base.installed(version, full);
                self.payloads.note_installed(&self.chunks, version).await;
                metrics::gauge!("node_installed_snapshot_version").set(version as f64);
                tracing::info!(
                    version,
                    ?latency,
                    delta = matches!(kind, PayloadKind::Delta { .. }),
                    adapter = matches!(kind, PayloadKind::Adapter { .. }),
                    root = %root,
                    "snapshot installed"
                );
            }
            Ok(Err(e)) => {
                metrics::counter!("node_snapshots_refused_total").increment(1);
                if e.downcast_ref::<adapter::AdapterRefused>().is_some() {
                    metrics::counter!("node_adapter_versions_refused_total").increment(1);
                }
                tracing::warn!(version, error = %e, "snapshot not installed")
            }
            Err(e) => tracing::error!(error = %e, "install task failed"),
        }
    }
}
