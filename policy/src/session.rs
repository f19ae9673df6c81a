//! Multi-turn generation with the KV cache carried across turns: one episode is one
//! [`Session`]; each turn samples the assistant's tokens with the shared decode loop of
//! [`crate::sampling`] (the same sampling rule, RNG draws and log-prob convention as
//! single-turn generation), and only the *new* tokens — the last sampled token and the next
//! observation — are encoded before the next turn. The log-probs equal those of one
//! full-sequence forward over the whole history (tested to 1e-4 in f32).
//!
//! Owns: [`Session`] over either generation path (the inference path's preallocated cache
//! or the training module's cache). Must not touch: chat rendering or environments (the
//! rollout engine feeds the tokens).

use candle_core::Tensor;

use crate::draw::Draws;
use crate::error::{PolicyError, Result};
use crate::infer::{InferCache, InferModel};
use crate::model::KvCache;
use crate::sampling::{Completion, RowCache, SamplingParams};
use crate::weights::Policy;

/// The model a session generates with.
#[derive(Debug, Clone, Copy)]
pub enum Model<'a> {
    /// The inference path (fused kernels, preallocated cache).
    Infer(&'a InferModel),
    /// The training module's forward.
    Train(&'a Policy),
}

#[derive(Debug, Clone)]
enum Cache {
    Infer(InferCache),
    Train(KvCache),
}

/// One episode's generation state: the KV cache of every token fed so far, the logits of
/// the next position, and the last sampled token (sampled but not yet fed).
#[derive(Debug)]
pub struct Session<'a> {
    model: Model<'a>,
    cache: Cache,
    next: Option<Vec<f32>>,
    pending: Option<u32>,
}

impl<'a> Session<'a> {
    /// An empty session for up to `capacity` tokens (prompt, samples and observations; the
    /// model's context bounds it).
    pub fn new(model: Model<'a>, capacity: usize) -> Result<Self> {
        let cache = match model {
            Model::Infer(m) => Cache::Infer(m.new_cache(1, capacity)?),
            Model::Train(p) => Cache::Train(p.new_cache()),
        };
        Ok(Session {
            model,
            cache,
            next: None,
            pending: None,
        })
    }

    /// Tokens in the context: fed ones plus a pending sampled one.
    pub fn len(&self) -> usize {
        let fed = match &self.cache {
            Cache::Infer(c) => c.len(),
            Cache::Train(c) => c.len(),
        };
        fed + usize::from(self.pending.is_some())
    }

    /// True before anything was fed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The model's context length.
    pub fn context(&self) -> usize {
        match self.model {
            Model::Infer(m) => m.config().max_position_embeddings,
            Model::Train(p) => p.config().max_position_embeddings,
        }
    }

    /// An independent copy (a deep copy of the cache): prefill a prompt once, then play
    /// several episodes from it.
    pub fn fork(&self) -> Result<Self> {
        let cache = match &self.cache {
            Cache::Infer(c) => Cache::Infer(c.deep_copy()?),
            Cache::Train(c) => Cache::Train(c.clone()),
        };
        Ok(Session {
            model: self.model,
            cache,
            next: self.next.clone(),
            pending: self.pending,
        })
    }

    /// Encodes the pending sampled token (if any) and `tokens`, keeping the logits of the
    /// last position for the next [`Self::sample`].
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        let mut ids: Vec<u32> = self.pending.take().into_iter().collect();
        ids.extend_from_slice(tokens);
        if ids.is_empty() {
            return Ok(());
        }
        let logits = match (&self.model, &mut self.cache) {
            (Model::Infer(m), Cache::Infer(c)) => {
                let t = Tensor::new(ids.as_slice(), m.device())?.unsqueeze(0)?;
                crate::sampling::host_logits(&m.forward_last(&t, c)?)?
            }
            (Model::Train(p), Cache::Train(c)) => {
                let t = Tensor::new(ids.as_slice(), p.device())?.unsqueeze(0)?;
                last_logits(&p.model().forward_cached_last(&t, c)?)?
            }
            _ => return Err(PolicyError::Sampling("session cache mismatch".into())),
        };
        self.next = Some(logits);
        Ok(())
    }

    /// Samples one assistant turn of at most `max_new` tokens from the current position
    /// (after a [`Self::feed`]) with the uniforms of `draws`' one row (the canonical rule,
    /// [`crate::rule`]); its last token stays pending until the next feed.
    pub fn sample(
        &mut self,
        max_new: usize,
        params: &SamplingParams,
        draws: &Draws,
    ) -> Result<Completion> {
        if draws.len() != 1 {
            return Err(PolicyError::Sampling(format!(
                "a session samples one row, got {} draws",
                draws.len()
            )));
        }
        params.validate()?;
        let first = self
            .next
            .take()
            .ok_or_else(|| PolicyError::Sampling("sample before feed".into()))?;
        let room = self.context().saturating_sub(self.len());
        let max_new = max_new.min(room);
        if max_new == 0 {
            return Err(PolicyError::Sampling("no room left in the context".into()));
        }
        let model = self.model;
        let mut out = match &mut self.cache {
            Cache::Infer(c) => crate::sampling::decode_rows(
                c,
                first,
                max_new,
                params,
                draws,
                RowCache {
                    repeat: |_: &mut InferCache, _| Ok(()),
                    select: |_: &mut InferCache, _: &[u32]| Ok(()),
                    step: |c: &mut InferCache, last: &[u32]| match model {
                        Model::Infer(m) => {
                            let ids = Tensor::new(last, m.device())?.unsqueeze(1)?;
                            crate::sampling::host_logits(&m.forward_last(&ids, c)?)
                        }
                        Model::Train(_) => Err(PolicyError::Sampling("cache mismatch".into())),
                    },
                },
            )?,
            Cache::Train(c) => crate::sampling::decode_rows(
                c,
                first,
                max_new,
                params,
                draws,
                RowCache {
                    repeat: |_: &mut KvCache, _| Ok(()),
                    select: |_: &mut KvCache, _: &[u32]| Ok(()),
                    step: |c: &mut KvCache, last: &[u32]| match model {
                        Model::Train(p) => {
                            let ids = Tensor::new(last, p.device())?.unsqueeze(1)?;
                            last_logits(&p.model().forward_cached_last(&ids, c)?)
                        }
                        Model::Infer(_) => Err(PolicyError::Sampling("cache mismatch".into())),
                    },
                },
            )?,
        };
        let c = out
            .pop()
            .ok_or_else(|| PolicyError::Sampling("no sample".into()))?;
        self.pending = c.tokens.last().copied();
        Ok(c)
    }
}

/// Logits `[1, 1, V]` of the training forward's last position on the host.
fn last_logits(logits: &Tensor) -> Result<Vec<f32>> {
    crate::sampling::host_logits(logits)
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
