//! The rollout role (`docs/architecture.md`, "Life of a trajectory group"): install the learner's snapshots as they arrive, generate
//! rewarded, version-tagged groups into the node's trajectory store, and serve the learner's
//! pulls.
//!
//! - **Install.** The dissemination engine's `Installed` event carries verified bytes; they are
//!   loaded into the [`PolicySlot`] (a snapshot for another model config is refused). At
//!   start the newest snapshot the chunk store rebuilds (a delta version from its keyframe and
//!   the deltas since, every root checked) is installed, so a restarted worker resumes at once
//!   and applies the next delta; a delta whose base it lacks is caught up (`super::catchup`).
//! - **Generate.** One [`RolloutEngine`] on its own thread; it idles until a policy is
//!   installed, pauses while `storage.max_pending_groups` groups wait to be pulled, and stands
//!   by while the learner's signed activation order says so (it keeps installing snapshots).
//! - **Serve.** `pull::serve` answers only the swarm's learner. A pull names the oldest
//!   admissible version; groups older than that are pruned (counted as discarded-stale) first.
//! - **Verifiable groups.** Every group is signed with the node key, numbered by the durable
//!   counter `<data_dir>/rollout.seq`, and answers the prompt assigned to (this peer, its
//!   number) by the seed of the swarm id and the learner's key (`tasks::assign`): what the
//!   learner checks (`docs/security.md`, "Verified rollouts").
//! - **Test-only attacks** (only in a build with the `adversary` feature). With
//!   `ECHO_NODE_MISBEHAVE` naming group attacks (`GROUP_ATTACKS`) the finished group is
//!   corrupted just before it is stored (`tamper`), so what the learner pulls is really bad;
//!   with several, group `seq` gets attack `seq mod k`. The `late_liar` and `sybil_rekey`
//!   workers forge log-probs only from a number of honest groups on (`forges`); every forged
//!   group's id is listed in `<data_dir>/misbehave.forged`. A `backlog_inflation` worker
//!   keeps far more groups pending than configured (`roles::attacks::pending_limit`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dissemination::DisseminationEvent;
use rollout::{PolicySlot, RolloutConfig, RolloutEngine, RunningEngine};
use tokio::sync::mpsc;

use super::{build_chat, build_env, build_model, Probe, RoleView};
use crate::api::{RoleSection, RolloutStatus};
#[cfg(feature = "adversary")]
use crate::misbehave::Attack;
use crate::state::NodeState;
#[cfg(feature = "adversary")]
use storage::TrajectoryGroup;

/// The attacks carried out on the groups a worker produces.
#[cfg(feature = "adversary")]
pub const GROUP_ATTACKS: [Attack; 13] = [
    Attack::InflatedReward,
    Attack::ForgedLogprobs,
    Attack::InvalidLogprob,
    Attack::OutOfVocab,
    Attack::Overlong,
    Attack::BadSignature,
    Attack::LateLiar,
    Attack::SybilRekey,
    Attack::MaskPoisoning,
    Attack::ForcedTokens,
    Attack::StaleVersion,
    Attack::ForgedReturn,
    Attack::ForgedObservation,
];

/// The group attacks that need the model ([`super::forge`]).
#[cfg(feature = "adversary")]
const MODEL_ATTACKS: [Attack; 2] = [Attack::ForcedTokens, Attack::StaleVersion];

/// Whether group `seq` of a worker carrying out `attack` is tampered with: always, except
/// for the honest prefix of `late_liar` and `sybil_rekey` (which then forge log-probs).
#[cfg(feature = "adversary")]
pub fn forges(attack: Attack, seq: u64) -> bool {
    use crate::misbehave::{LATE_LIAR_HONEST_GROUPS, SYBIL_HONEST_GROUPS};
    match attack {
        Attack::LateLiar => seq >= LATE_LIAR_HONEST_GROUPS,
        Attack::SybilRekey => seq >= SYBIL_HONEST_GROUPS,
        _ => true,
    }
}

/// Corrupts a finished group with `attack` (test only); `vocab` and `context` are the model's.
/// Log-prob, token and length changes keep the group schema-valid (it must be stored and
/// served): only the learner's own checks can refuse it.
#[cfg(feature = "adversary")]
pub fn tamper(attack: Attack, g: &mut TrajectoryGroup, vocab: usize, context: usize) {
    // Some attacks need a token to work on.
    if g.samples[0].response_tokens.is_empty() {
        let s = &mut g.samples[0];
        s.response_tokens.push(32);
        s.sampler_logprobs.push(-1.0);
        s.loss_mask.push(1);
    }
    match attack {
        Attack::InflatedReward => g.samples.iter_mut().for_each(|s| s.reward = 1.0),
        Attack::ForgedLogprobs | Attack::LateLiar | Attack::SybilRekey => {
            g.samples.iter_mut().for_each(|s| {
                s.sampler_logprobs
                    .iter_mut()
                    .for_each(|lp| *lp = (*lp + 0.5).min(0.0))
            })
        }
        Attack::InvalidLogprob => g.samples[0].sampler_logprobs[0] = -1e4,
        // Honest tokens, log-probs and rewards: only which tokens are trained is chosen.
        Attack::MaskPoisoning => g.samples.iter_mut().for_each(|s| {
            s.loss_mask.iter_mut().step_by(2).for_each(|m| *m = 0);
        }),
        Attack::OutOfVocab => {
            let s = &mut g.samples[0];
            let last = s.response_tokens.len() - 1;
            s.response_tokens[last] = u32::try_from(vocab).unwrap_or(u32::MAX);
        }
        Attack::ForgedReturn => g.samples[0].reward += 1.0,
        // The first observation token (loss mask 0) of an episode becomes another token of
        // the same observation: the story the environment told is changed. A group without
        // observations (one-turn episodes) gets a forged return instead.
        Attack::ForgedObservation => {
            let forged = g.samples.iter_mut().any(|s| {
                let obs: Vec<usize> = (0..s.loss_mask.len())
                    .filter(|&i| s.loss_mask[i] == 0)
                    .collect();
                let first = obs.first().copied();
                let other = obs
                    .iter()
                    .copied()
                    .find(|&i| Some(s.response_tokens[i]) != first.map(|f| s.response_tokens[f]));
                match (first, other) {
                    (Some(f), Some(o)) => {
                        s.response_tokens.swap(f, o);
                        true
                    }
                    _ => false,
                }
            });
            if !forged {
                g.samples[0].reward += 1.0;
            }
        }
        Attack::Overlong => {
            let s = &mut g.samples[0];
            let want = (context + 1).saturating_sub(g.prompt_tokens.len());
            while s.response_tokens.len() < want {
                s.response_tokens.push(32);
                s.sampler_logprobs.push(-1.0);
                s.loss_mask.push(1);
            }
        }
        _ => {}
    }
}

/// The seal hook of a misbehaving worker: tamper with group `seq` by attack `seq mod k` (when
/// [`forges`] says so, the model-aware ones through `forger`; the id goes to `forged_file`),
/// then sign it (with a fresh key for `bad_signature`, with the node key otherwise: the lie is
/// the worker's own).
#[cfg(feature = "adversary")]
fn attack_hook(
    attacks: Vec<Attack>,
    vocab: usize,
    context: usize,
    mut forger: Option<super::forge::Forger>,
    forged_file: std::path::PathBuf,
) -> rollout::SealHook {
    Box::new(move |g, key| {
        let attack = attacks[(g.seq % attacks.len() as u64) as usize];
        let mut forged = forges(attack, g.seq);
        if forged {
            match forger.as_mut().filter(|_| MODEL_ATTACKS.contains(&attack)) {
                Some(f) => match f.forge(attack, g) {
                    Ok(true) => {}
                    Ok(false) => return g.sign(key.signing_key()), // honest this once
                    Err(e) => {
                        tracing::warn!(%attack, error = %format!("{e:#}"), "forging failed");
                        forged = false;
                    }
                },
                None => tamper(attack, g, vocab, context),
            }
        }
        if attack == Attack::BadSignature {
            g.sign(storage::NodeKey::generate().signing_key());
        } else {
            g.sign(key.signing_key());
        }
        if forged {
            use std::io::Write;
            let line = format!("{}\n", hex::encode(g.group_id));
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&forged_file)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            tracing::warn!(%attack, seq = g.seq, "TEST-ONLY: stored a corrupted group");
        }
    })
}

/// The running rollout role.
pub struct RolloutRole {
    engine: Option<RunningEngine>,
    slot: PolicySlot,
    stats: Arc<rollout::RolloutStats>,
    tasks: super::Tasks,
}

impl RolloutRole {
    /// Heartbeat probe: the installed version and μ_i.
    pub fn probe(&self) -> Probe {
        let slot = self.slot.clone();
        let stats = self.stats.clone();
        Arc::new(move || (slot.version(), stats.snapshot().mu))
    }

    /// Every install into the policy slot.
    pub fn version_changes(&self) -> super::VersionChanges {
        super::VersionChanges::Slot(self.slot.subscribe())
    }

    /// True once the generation thread has exited (a storage error ends it): the node's
    /// watchdog then stops the node rather than let it heartbeat a rate it no longer produces.
    pub fn engine_stopped(&self) -> bool {
        self.engine.as_ref().is_none_or(RunningEngine::is_finished)
    }

    /// Stops the engine (after its current group) and the tasks.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.tasks.stop().await;
        let engine = self.engine.take();
        tokio::task::spawn_blocking(move || engine.map(|e| e.stop()).transpose())
            .await
            .context("joining the rollout engine")?
            .context("the rollout engine failed")?;
        Ok(())
    }
}

/// Starts the worker: engine thread, install loop, pull server, status view.
pub async fn start(
    state: Arc<NodeState>,
    client: p2p::Client,
    learner: p2p::PeerId,
    installs: Option<mpsc::UnboundedReceiver<DisseminationEvent>>,
    dissem: Option<dissemination::Disseminator>,
    view: RoleView,
) -> anyhow::Result<RolloutRole> {
    let config = &state.config;
    // The f32 weights stay in host memory (snapshots decode there too): the device holds only
    // the inference path's prepared copy.
    let (policy, tokenizer) = build_model(config, &policy::Device::Cpu)?;
    let env = build_env(config)?;
    let budget = config.task.budget(env.as_ref())?;
    // Generation: weights in the inference path's dtype (bf16 on a GPU) plus the KV cache of
    // one group of n rows; prompts are budgeted at 1024 tokens.
    let r = &config.rollout;
    let gen_dtype = r.dtype.resolve(&state.device);
    let new_tokens = if env.metadata().is_multi_turn() {
        budget.max_episode_tokens
    } else {
        r.max_new_tokens
    };
    let context = (1024 + new_tokens).min(policy.config().max_position_embeddings);
    let need = policy::memory::worker_bytes(policy.config(), gen_dtype, r.group_size, context);
    super::check_memory("the rollout worker", need, &state.device)?;
    let slot = PolicySlot::new(policy.config().clone(), state.device.clone());
    #[cfg(feature = "adversary")]
    let (vocab, max_context) = (
        policy.config().vocab_size,
        policy.config().max_position_embeddings,
    );
    // The bases adapter versions are installed onto (a LoRA run).
    let bases = Arc::new(std::sync::Mutex::new(super::adapter::Bases::new(
        config.clone(),
        policy.config().clone(),
        state.chunks.clone(),
    )));
    drop(policy);
    // Resume with the newest snapshot the durable chunk store rebuilds (a delta version from
    // its keyframe and the deltas since, each checked against its signed root; an adapter
    // version onto the base it names): installed, and the base of the next delta.
    let payloads = Arc::new(super::catchup::PayloadStats::default());
    let mut base = super::delta::DeltaBase::default();
    let (chunks, slot2, bases2) = (state.chunks.clone(), slot.clone(), bases.clone());
    let restored = tokio::task::spawn_blocking(move || {
        let mut b = bases2.lock().unwrap_or_else(|e| e.into_inner());
        let Some((v, full)) = super::adapter::install_stored(&slot2, &mut b, &chunks)? else {
            return anyhow::Ok(None);
        };
        Ok(Some((
            v,
            Arc::new(full),
            super::catchup::position(&chunks, v)?,
        )))
    })
    .await?;
    match restored {
        Ok(None) => {}
        Ok(Some((v, full, at))) => {
            tracing::info!(
                version = v,
                delta = at.position == crate::api::PayloadPosition::Delta,
                root = %hex::encode(storage::hash_bytes(&full)),
                "installed the stored snapshot"
            );
            base.installed(v, full);
            payloads.set_restored(v);
            payloads.set_installed(at);
        }
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "stored snapshot not installed"),
    }

    let mut sampling = policy::SamplingParams::new(r.max_new_tokens, tokenizer.eos_ids());
    sampling.temperature = r.temperature;
    sampling.top_p = r.top_p;
    let seed = r.seed.unwrap_or_else(|| {
        let h = blake3::hash(state.peer_id.as_bytes());
        u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or_default())
    });
    let learner_key = storage::keys::parse_public_key(
        config
            .learner_public_key
            .as_deref()
            .context("a rollout worker needs learner_public_key")?,
    )?;
    let assignment_seed = tasks::assign::assignment_seed(&config.swarm_id, &learner_key.to_bytes());
    #[cfg(feature = "adversary")]
    let forger = MODEL_ATTACKS
        .iter()
        .any(|a| state.misbehave.has(*a))
        .then_some(())
        // The model-aware forgeries are of single-turn groups.
        .and(env.as_task().cloned())
        .map(|task| {
            let mut params = sampling.clone();
            params.stop_tokens = tokenizer.eos_ids();
            super::forge::Forger::new(
                slot.clone(),
                task,
                tokenizer.clone(),
                assignment_seed,
                params,
            )
        });
    let chat = build_chat(config, tokenizer, env.as_ref())?;
    let engine = RolloutEngine::for_env(
        RolloutConfig {
            group_size: r.group_size,
            sampling,
            max_pending_groups: super::attacks::pending_limit(
                &state.misbehave,
                config.storage.max_pending_groups,
            ),
            seed,
            producer: state.peer_id.clone(),
            idle_poll: Duration::from_millis(20),
            max_groups_per_s: r.max_groups_per_s,
            assignment_seed: Some(assignment_seed),
            infer_dtype: Some(r.dtype.resolve(&state.device)),
            ..RolloutConfig::default()
        },
        env,
        chat,
        budget,
        state.trajectories.clone(),
        slot.clone(),
    )
    .context("creating the rollout engine")?
    .with_signer(state.key.clone())
    .with_seq_file(&config.data_dir.join("rollout.seq"))
    .context("opening the group counter")?;
    #[cfg(feature = "adversary")]
    let engine = {
        let attacks: Vec<Attack> = GROUP_ATTACKS
            .into_iter()
            .filter(|a| state.misbehave.has(*a))
            .collect();
        if attacks.is_empty() {
            engine
        } else {
            let forged_file = config.data_dir.join(crate::misbehave::FORGED_FILE);
            engine.with_seal_hook(attack_hook(
                attacks,
                vocab,
                max_context,
                forger,
                forged_file,
            ))
        }
    };
    let stats = engine.stats();
    let standby = engine.standby_flag();
    let engine = engine.spawn().context("starting the rollout engine")?;

    let tasks = super::Tasks::default();
    if let Some(mut rx) = installs {
        let slot = slot.clone();
        let standby = standby.clone();
        let (payloads, chunks) = (payloads.clone(), state.chunks.clone());
        tasks.spawn(async move {
            // `base`: the full payload installed last, the base of the next delta version.
            while let Some(ev) = rx.recv().await {
                match ev {
                    DisseminationEvent::Installed {
                        version,
                        payload,
                        kind,
                        latency,
                    } => {
                        if base.has(version) {
                            continue; // rebuilt from the store at start, or caught up past it
                        }
                        // Adapters need their published base: a late joiner fetches it first.
                        if let storage::PayloadKind::Adapter {
                            base_version: Some(b),
                            ..
                        } = kind
                        {
                            super::catchup::fetch_base(dissem.as_ref(), &chunks, b, &payloads)
                                .await;
                        }
                        let (slot2, bases2) = (slot.clone(), bases.clone());
                        let held = base.clone();
                        let r = tokio::task::spawn_blocking(move || {
                            // A delta is applied to the held base and checked against the
                            // signed full root before anything is loaded; adapters go onto
                            // the base their manifest names.
                            let full = held.full_payload(version, payload, kind)?;
                            let mut b = bases2.lock().unwrap_or_else(|e| e.into_inner());
                            let root =
                                super::adapter::install(&slot2, &mut b, version, &full, kind)?;
                            anyhow::Ok((full, root))
                        })
                        .await;
                        let r = match r {
                            // No base (a missed version, a late join, a restart behind):
                            // catch up on the chain instead.
                            Ok(Err(e)) if super::catchup::needs_catch_up(&e) => {
                                tracing::info!(version, error = %e, "catching up");
                                Ok(super::catchup::catch_up_and_load(
                                    dissem.as_ref(),
                                    &chunks,
                                    &slot,
                                    &base,
                                    version,
                                    &payloads,
                                )
                                .await)
                            }
                            r => r,
                        };
                        match r {
                            Ok(Ok((full, root))) => {
                                base.installed(version, full);
                                payloads.note_installed(&chunks, version).await;
                                metrics::gauge!("node_installed_snapshot_version")
                                    .set(version as f64);
                                tracing::info!(
                                    version,
                                    ?latency,
                                    delta = matches!(kind, storage::PayloadKind::Delta { .. }),
                                    adapter = matches!(kind, storage::PayloadKind::Adapter { .. }),
                                    root = %root,
                                    "snapshot installed"
                                );
                            }
                            Ok(Err(e)) => {
                                metrics::counter!("node_snapshots_refused_total").increment(1);
                                if e.downcast_ref::<super::adapter::AdapterRefused>().is_some() {
                                    metrics::counter!("node_adapter_versions_refused_total")
                                        .increment(1);
                                }
                                tracing::warn!(version, error = %e, "snapshot not installed")
                            }
                            Err(e) => tracing::error!(error = %e, "install task failed"),
                        }
                    }
                    DisseminationEvent::ChunkRejected {
                        peer,
                        version,
                        index,
                    } => tracing::warn!(%peer, version, index, "corrupt chunk rejected"),
                    DisseminationEvent::Activation { seq, active } => {
                        let was = !standby.swap(!active, Ordering::Relaxed);
                        if was != active {
                            tracing::info!(
                                seq,
                                active,
                                "the learner's scheduler changed this worker's state"
                            );
                        }
                    }
                    DisseminationEvent::Progress { .. } => {}
                }
            }
        });
    }
    let store = state.trajectories.clone();
    let control = client.stream_control();
    let serve_opts = pull::ServeOptions {
        #[cfg(feature = "adversary")]
        testing_oversized_answer: state
            .misbehave
            .has(crate::misbehave::Attack::OversizedAnswer),
        ..pull::ServeOptions::default()
    };
    tasks.spawn(async move {
        if let Err(e) = pull::serve_with(control, store, learner, serve_opts).await {
            tracing::error!(error = %e, "the pull server stopped");
        }
    });
    {
        let (slot, stats, store) = (slot.clone(), stats.clone(), state.trajectories.clone());
        let payloads = payloads.clone();
        let standby = standby.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let s = stats.snapshot();
                let (installed_payload, catch_ups, catch_up_bytes, restored_version) =
                    payloads.view();
                view.set(RoleSection::Rollout(RolloutStatus {
                    installed_version: slot.version(),
                    mu: s.mu,
                    groups: s.groups,
                    samples: s.samples,
                    tokens: s.tokens,
                    paused: s.paused,
                    errors: s.errors,
                    reward_ema: s.reward_ema,
                    standby: standby.load(Ordering::Relaxed),
                    last_group_version: s.version,
                    pending: store.pending().ok(),
                    installed_payload,
                    catch_ups,
                    catch_up_bytes,
                    restored_version,
                }));
                metrics::gauge!("rollout_mu_groups_per_s").set(s.mu);
                metrics::gauge!("rollout_groups_total").set(s.groups as f64);
            }
        });
    }
    Ok(RolloutRole {
        engine: Some(engine),
        slot,
        stats,
        tasks,
    })
}
