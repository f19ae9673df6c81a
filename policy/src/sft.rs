//! Supervised warm-start on the answer format (documented in `docs/model.md`).
//!
//! A randomly initialised byte-level model almost never emits a number followed by EOS, so RL
//! from scratch would see only zero rewards. A few dozen supervised steps on reference
//! completions (e.g. `tasks::Task::reference_completion`) teach the format; RL then improves
//! correctness. These are pure functions over a [`Policy`]; the learner decides when to call
//! them.

use candle_core::Tensor;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{seq::SliceRandom, SeedableRng};

use crate::error::{PolicyError, Result};
use crate::sampling::token_logprobs;
use crate::tokenizer::Tokenizer;
use crate::weights::Policy;

/// One supervised example: prompt ids (template applied) and the target response ids (with
/// the stop token at the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Target response token ids.
    pub target: Vec<u32>,
}

/// Builds examples from `(prompt text, reference completion)` pairs: the prompt template of
/// `tokenizer` is applied and its first EOS id is appended to each target. For a task:
/// `(0..n).map(|i| task.prompt(i)).map(|p| (p.text.clone(), task.reference_completion(&p)))`.
pub fn examples_from_text<I, P, C>(tokenizer: &Tokenizer, pairs: I) -> Result<Vec<SftExample>>
where
    I: IntoIterator<Item = (P, C)>,
    P: AsRef<str>,
    C: AsRef<str>,
{
    let eos = tokenizer.eos_ids().first().copied();
    pairs
        .into_iter()
        .map(|(p, c)| {
            let mut target = tokenizer.encode(c.as_ref())?;
            target.extend(eos);
            Ok(SftExample {
                prompt: tokenizer.encode_prompt(p.as_ref())?,
                target,
            })
        })
        .collect()
}

/// Right-padded batch tensors: `(inputs [b, t], targets [b, t], mask [b, t] f32)`; the mask is
/// 1 where the target is a response token. Padding uses id 0 and mask 0.
pub fn sft_batch(policy: &Policy, examples: &[SftExample]) -> Result<(Tensor, Tensor, Tensor)> {
    if examples.is_empty() {
        return Err(PolicyError::Sampling("empty SFT batch".into()));
    }
    let t = examples
        .iter()
        .map(|e| e.prompt.len() + e.target.len() - 1)
        .max()
        .unwrap_or(0);
    let (mut inp, mut tgt, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for e in examples {
        if e.prompt.is_empty() || e.target.is_empty() {
            return Err(PolicyError::Sampling(
                "SFT example with empty prompt or target".into(),
            ));
        }
        let seq: Vec<u32> = e.prompt.iter().chain(e.target.iter()).copied().collect();
        for i in 0..t {
            if i + 1 < seq.len() {
                inp.push(seq[i]);
                tgt.push(seq[i + 1]);
                mask.push(if i + 1 >= e.prompt.len() { 1f32 } else { 0.0 });
            } else {
                inp.push(0);
                tgt.push(0);
                mask.push(0.0);
            }
        }
    }
    let b = examples.len();
    let dev = policy.device();
    Ok((
        Tensor::from_vec(inp, (b, t), dev)?,
        Tensor::from_vec(tgt, (b, t), dev)?,
        Tensor::from_vec(mask, (b, t), dev)?,
    ))
}

/// Mean negative log-likelihood of the target tokens (differentiable scalar).
pub fn sft_loss(policy: &Policy, examples: &[SftExample]) -> Result<Tensor> {
    let (inp, tgt, mask) = sft_batch(policy, examples)?;
    let logits = policy.forward(&inp)?;
    let lp = token_logprobs(&logits, &tgt, 1.0)?;
    let total = (lp * &mask)?.sum_all()?;
    let count = mask.sum_all()?;
    Ok((total.neg()? / count)?)
}

/// Warm-start settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    /// Optimiser steps.
    pub steps: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Seed of the example shuffling.
    pub seed: u64,
}

impl Default for WarmStart {
    fn default() -> Self {
        WarmStart {
            steps: 60,
            batch_size: 32,
            lr: 3e-3,
            seed: 0,
        }
    }
}

/// Runs `cfg.steps` AdamW steps of [`sft_loss`] over shuffled `examples`, updating `policy` in
/// place. Returns the loss of every step.
pub fn warm_start(policy: &Policy, examples: &[SftExample], cfg: &WarmStart) -> Result<Vec<f32>> {
    if examples.is_empty() || cfg.batch_size == 0 {
        return Err(PolicyError::Sampling(
            "warm start needs examples and batch_size > 0".into(),
        ));
    }
    let mut opt = AdamW::new(
        policy.vars()?,
        ParamsAdamW {
            lr: cfg.lr,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut pos = order.len();
    let mut losses = Vec::with_capacity(cfg.steps);
    for _ in 0..cfg.steps {
        let mut batch = Vec::with_capacity(cfg.batch_size);
        while batch.len() < cfg.batch_size {
            if pos == order.len() {
                order.shuffle(&mut rng);
                pos = 0;
            }
            batch.push(examples[order[pos]].clone());
            pos += 1;
        }
        let loss = sft_loss(policy, &batch)?;
        opt.backward_step(&loss)?;
        losses.push(loss.to_scalar::<f32>()?);
    }
    Ok(losses)
}
