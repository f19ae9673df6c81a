//! Micro-batched gradients: a step's groups go through the model in passes of at most
//! [`TrainerConfig::micro_batch_tokens`](crate::TrainerConfig) padded tokens and their
//! gradients are summed, so the activation memory of a step is bounded by the budget rather
//! than by the batch (`docs/gpu.md`, "Learner memory").
//!
//! ## Rules
//! - **Passes.** Groups are taken in order and packed into passes whose padded size (rows ×
//!   the longest prompt + response of the pass) stays within the budget ([`plan`]). A budget
//!   of 0 puts the whole step in one pass.
//! - **A group larger than the budget** is split into chunks of rows by the chain rule at the
//!   log-prob boundary: its log-probs are first computed without a graph (in chunks), the
//!   objective's gradient with respect to them, `∂L/∂ℓ`, comes from a small graph over those
//!   values, and each chunk then runs forward with a graph and backward on `Σ ℓ ⊙ ∂L/∂ℓ`,
//!   whose gradient is exactly that chunk's share of `∂L/∂θ`. It costs one extra
//!   gradient-free forward of the group; any objective that is a function of the group's
//!   log-probs (GEPO's group weight included) is handled exactly.
//! - **Scaling.** Each group's objective enters divided by the number of groups the step
//!   averages over, so the summed gradient is that of the mean, as in one pass. With one
//!   pass the operations are those of a single batch, bit for bit; with several, the sums
//!   run in another order (a test bounds the difference).
//! - **Recomputed activations** (`recompute`): a pass's log-probs come from a forward that
//!   keeps only each layer's input; the objective's `∂L/∂ℓ` over them then drives the pass's
//!   layer-by-layer backward (`policy::model::recompute`), the same chain rule as a split
//!   group's. Split groups' chunks run their backward the same way.
//! - **No graph where none is needed**: the KL reference and the split groups' first
//!   forward run on [`policy::Policy::no_grad`] views.
//!
//! Must not touch: admission, quarantine and the optimiser step (the trainer's), the loss
//! formulas (`crate::loss`).

use std::collections::HashSet;
use std::ops::Range;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, TensorId, Var};
use storage::TrajectoryGroup;

use super::Trainer;
use crate::loss::{group_loss, GroupInput};
use crate::Result;

/// A group the step trains on, with its advantages.
pub(crate) type Used<'a> = (&'a TrajectoryGroup, Vec<f32>);

/// One pass through the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pass {
    /// These groups (indices into the step's list) in one forward and one backward.
    Groups(Range<usize>),
    /// One group over the budget: its rows in chunks of `rows` (see the module docs).
    Split { group: usize, rows: usize },
}

/// `(rows, padded length)` of one group in the learner's forward: its samples, and its
/// longest prompt + response − 1 (the last token is only a target).
pub(crate) fn group_shape(g: &TrajectoryGroup) -> (usize, usize) {
    let longest = g
        .samples
        .iter()
        .map(|s| g.prompt_tokens.len() + s.response_tokens.len())
        .max()
        .unwrap_or(1);
    (g.samples.len(), longest.saturating_sub(1).max(1))
}

/// Packs groups of the given `(rows, padded length)` shapes, in order, into passes of at most
/// `budget` padded tokens (rows × longest length of the pass); 0 = one pass for all. A group
/// over the budget on its own is split into chunks of `max(1, budget / length)` rows.
pub(crate) fn plan(shapes: &[(usize, usize)], budget: usize) -> Vec<Pass> {
    if budget == 0 || shapes.is_empty() {
        return vec![Pass::Groups(0..shapes.len())];
    }
    let mut passes = Vec::new();
    let (mut start, mut rows, mut len) = (0, 0, 0);
    for (i, &(r, l)) in shapes.iter().enumerate() {
        if r * l > budget {
            if i > start {
                passes.push(Pass::Groups(start..i));
            }
            passes.push(Pass::Split {
                group: i,
                rows: (budget / l).max(1),
            });
            (start, rows, len) = (i + 1, 0, 0);
            continue;
        }
        if (rows + r) * len.max(l) > budget {
            passes.push(Pass::Groups(start..i));
            (start, rows, len) = (i, 0, 0);
        }
        rows += r;
        len = len.max(l);
    }
    if start < shapes.len() {
        passes.push(Pass::Groups(start..shapes.len()));
    }
    passes
}

/// The largest pass a step over `groups` makes with passes of at most `budget` padded tokens
/// ([`plan`]): `(padded tokens, padded sequence length)` of it, the figures the memory model
/// counts a pass by (`policy::memory::pass_activation_bytes`); `(0, 0)` for no groups.
pub fn largest_pass(groups: &[TrajectoryGroup], budget: usize) -> (usize, usize) {
    let shapes: Vec<(usize, usize)> = groups.iter().map(group_shape).collect();
    plan(&shapes, budget)
        .into_iter()
        .map(|pass| match pass {
            Pass::Groups(range) => {
                let rows: usize = shapes[range.clone()].iter().map(|s| s.0).sum();
                let len = shapes[range].iter().map(|s| s.1).max().unwrap_or(0);
                (rows * len, len)
            }
            Pass::Split { group, rows } => {
                let (r, len) = shapes[group];
                (rows.min(r) * len, len)
            }
        })
        .max()
        .unwrap_or((0, 0))
}

/// A group's share of a step: its objective's value and what the learner reports about it.
#[derive(Debug, Clone)]
pub(crate) struct GroupTerms {
    pub loss: f64,
    pub tokens: f64,
    pub coefficients: Vec<f64>,
    pub clip_fraction: f64,
    pub kl: f64,
}

/// The gradient of the mean objective over some groups, summed over the passes.
pub(crate) struct BatchGradient {
    /// Σ over the groups with a finite loss of `∂loss_g/∂θ / denominator`, by variable
    /// (`None` when no group had one).
    pub grads: Option<GradStore>,
    /// One entry per group asked for, in that order; a non-finite `loss` means the group is
    /// not in `grads`.
    pub terms: Vec<GroupTerms>,
}

/// Adds the trainable variables' gradients of `new` into `acc` (the first store becomes the
/// sum). Only theirs: a backward's store also holds gradients of the graph's other leaves, and
/// candle leaves those attached to the ops that computed them, so keeping one would keep its
/// pass's whole forward graph alive through the step's later passes (twice the activation
/// memory, `docs/gpu.md`, "Learner memory"). candle can neither build an empty store nor
/// remove an entry by id, so the first store's other entries are replaced by an empty tensor.
fn add_into(acc: &mut Option<GradStore>, mut new: GradStore, vars: &[Var]) -> Result<()> {
    let Some(sum) = acc else {
        let kept: HashSet<TensorId> = vars.iter().map(|v| v.id()).collect();
        let others: Vec<TensorId> = new
            .get_ids()
            .filter(|id| !kept.contains(id))
            .copied()
            .collect();
        let empty = Tensor::zeros(0, DType::F32, &Device::Cpu)?;
        for id in others {
            new.insert_id(id, empty.clone());
        }
        for var in vars {
            if let Some(g) = new.remove(var.as_tensor()) {
                new.insert(var.as_tensor(), g.detach());
            }
        }
        *acc = Some(new);
        return Ok(());
    };
    for var in vars {
        if let Some(g) = new.get(var.as_tensor()) {
            let total = match sum.remove(var.as_tensor()) {
                Some(prev) => (prev + g)?,
                None => g.clone(),
            };
            sum.insert(var.as_tensor(), total.detach());
        }
    }
    Ok(())
}

impl Trainer {
    /// The gradient of `Σ_{g ∈ which} loss_g / denominator` over the groups `which` of `used`,
    /// in passes of at most `micro_batch_tokens` (see the module docs). Groups whose loss is
    /// not finite are left out of the gradient and reported as such in `terms`.
    pub(crate) fn batch_gradient(
        &self,
        used: &[Used<'_>],
        which: &[usize],
        denominator: usize,
    ) -> Result<BatchGradient> {
        let groups: Vec<&Used<'_>> = which.iter().map(|&i| &used[i]).collect();
        let shapes: Vec<(usize, usize)> = groups.iter().map(|(g, _)| group_shape(g)).collect();
        let vars = self.policy.vars()?;
        let k = denominator as f64;
        let (mut grads, mut terms) = (None, Vec::with_capacity(groups.len()));
        for pass in plan(&shapes, self.cfg.micro_batch_tokens) {
            match pass {
                Pass::Groups(range) if self.cfg.recompute => {
                    let sum = (&mut grads, vars.as_slice());
                    terms.extend(self.recomputed_groups_gradient(&groups[range], k, sum)?);
                }
                Pass::Groups(range) => {
                    let (losses, t) = self.groups_forward(&groups[range])?;
                    let finite: Vec<Tensor> = losses
                        .into_iter()
                        .zip(&t)
                        .filter(|(_, t)| t.loss.is_finite())
                        .map(|(l, _)| l)
                        .collect();
                    if !finite.is_empty() {
                        let loss = (Tensor::stack(&finite, 0)?.sum_all()? / k)?;
                        add_into(&mut grads, loss.backward()?, &vars)?;
                    }
                    terms.extend(t);
                }
                Pass::Split { group, rows } => {
                    let sum = (&mut grads, vars.as_slice());
                    terms.push(self.split_group_gradient(groups[group], rows, k, sum)?);
                }
            }
        }
        Ok(BatchGradient { grads, terms })
    }

    /// [`Trainer::groups_forward`] and its backward with recomputed activations: the pass's
    /// log-probs without a graph (`policy::recomputed_response_logprobs`), each group's
    /// objective over them as a variable, `∂(Σ_g loss_g / k)/∂ℓ` over the finite groups, then
    /// the pass's layer-by-layer backward of `Σ ℓ ⊙ ∂L/∂ℓ` into the step's sum `grads` (the
    /// chain rule at the log-prob boundary of the split groups, below).
    fn recomputed_groups_gradient(
        &self,
        groups: &[&Used<'_>],
        k: f64,
        (grads, vars): (&mut Option<GradStore>, &[Var]),
    ) -> Result<Vec<GroupTerms>> {
        let pairs: Vec<(&[u32], &[u32])> = groups
            .iter()
            .flat_map(|(g, _)| g.samples.iter().map(|s| pair(g, s)))
            .collect();
        let t = self.cfg.temperature;
        let chunk = self.cfg.query_chunk();
        let (lp, pass) = policy::recomputed_response_logprobs(&self.policy, &pairs, t, chunk)?;
        let logp = Var::from_tensor(&lp)?;
        drop(lp);
        let ref_lp = match &self.reference {
            Some(r) => Some(policy::batch_response_logprobs(&r.no_grad()?, &pairs, t)?.0),
            None => None,
        };
        let (mut finite, mut terms) = (Vec::new(), Vec::new());
        let mut row = 0;
        for (g, adv) in groups {
            let n = g.samples.len();
            let r = ref_lp.as_ref().map(|r| r.narrow(0, row, n)).transpose()?;
            let p = logp.as_tensor().narrow(0, row, n)?;
            let (loss, group_terms) = self.group_objective(g, adv, &p, r.as_ref())?;
            row += n;
            if group_terms.loss.is_finite() {
                finite.push(loss);
            }
            terms.push(group_terms);
        }
        if finite.is_empty() {
            return Ok(terms);
        }
        let loss = (Tensor::stack(&finite, 0)?.sum_all()? / k)?;
        let Some(dl_dlogp) = loss.backward()?.remove(logp.as_tensor()) else {
            return Ok(terms);
        };
        sink_backward(pass, &dl_dlogp, grads, vars)?;
        Ok(terms)
    }

    /// Log-probs of `groups`' rows (one right-padded batch, with a graph) and each group's
    /// objective (with its graph) and terms.
    fn groups_forward(&self, groups: &[&Used<'_>]) -> Result<(Vec<Tensor>, Vec<GroupTerms>)> {
        let pairs: Vec<(&[u32], &[u32])> = groups
            .iter()
            .flat_map(|(g, _)| g.samples.iter().map(|s| pair(g, s)))
            .collect();
        let t = self.cfg.temperature;
        let (lp, _) = policy::batch_response_logprobs(&self.policy, &pairs, t)?;
        let ref_lp = match &self.reference {
            Some(r) => Some(policy::batch_response_logprobs(&r.no_grad()?, &pairs, t)?.0),
            None => None,
        };
        let (mut losses, mut terms) = (Vec::new(), Vec::new());
        let mut row = 0;
        for (g, adv) in groups {
            let n = g.samples.len();
            let r = ref_lp.as_ref().map(|r| r.narrow(0, row, n)).transpose()?;
            let (loss, t) = self.group_objective(g, adv, &lp.narrow(0, row, n)?, r.as_ref())?;
            row += n;
            losses.push(loss);
            terms.push(t);
        }
        Ok((losses, terms))
    }

    /// Adds the gradient of `loss_g / k` for one group whose rows go through the model in
    /// chunks of `rows` (see the module docs) to the step's running sum `grads` of the
    /// trainable `vars`, chunk by chunk; nothing when its loss is not finite. Straight into
    /// the step's sum, not into a sum of the group's own added at the end: that would hold
    /// three model-sized gradients (the step's, the group's, the chunk's) where the memory
    /// model counts two.
    fn split_group_gradient(
        &self,
        (g, adv): &Used<'_>,
        rows: usize,
        k: f64,
        (grads, vars): (&mut Option<GradStore>, &[Var]),
    ) -> Result<GroupTerms> {
        let pairs: Vec<(&[u32], &[u32])> = g.samples.iter().map(|s| pair(g, s)).collect();
        let chunks: Vec<Range<usize>> = (0..pairs.len())
            .step_by(rows)
            .map(|s| s..(s + rows).min(pairs.len()))
            .collect();
        let len = longest_response(g);
        let t = self.cfg.temperature;
        // Log-probs of all rows without a graph, chunk by chunk, padded to the group's length.
        let free_logprobs = |p: &policy::Policy| -> Result<Tensor> {
            let view = p.no_grad()?;
            let mut parts = Vec::with_capacity(chunks.len());
            for c in &chunks {
                let lp = policy::batch_response_logprobs(&view, &pairs[c.clone()], t)?.0;
                parts.push(pad_to(&lp, len)?);
            }
            Ok(Tensor::cat(&parts, 0)?)
        };
        let logp = Var::from_tensor(&free_logprobs(&self.policy)?)?;
        let ref_lp = self.reference.as_ref().map(free_logprobs).transpose()?;
        let (loss, terms) = self.group_objective(g, adv, logp.as_tensor(), ref_lp.as_ref())?;
        if !terms.loss.is_finite() {
            return Ok(terms);
        }
        let Some(dl_dlogp) = (loss / k)?.backward()?.remove(logp.as_tensor()) else {
            return Ok(terms); // the objective does not depend on the log-probs
        };
        for c in chunks {
            let weight = dl_dlogp.narrow(0, c.start, c.len())?;
            if self.cfg.recompute {
                let chunk = self.cfg.query_chunk();
                let (lp, pass) =
                    policy::recomputed_response_logprobs(&self.policy, &pairs[c], t, chunk)?;
                let weight = weight.narrow(1, 0, lp.dim(1)?)?;
                sink_backward(pass, &weight, grads, vars)?;
                continue;
            }
            let lp = policy::batch_response_logprobs(&self.policy, &pairs[c.clone()], t)?.0;
            let surrogate = (pad_to(&lp, len)? * weight)?.sum_all()?;
            add_into(grads, surrogate.backward()?, vars)?;
        }
        Ok(terms)
    }

    /// One group's objective from its learner log-probs `p` (`[n, ≥ len]`, rows in sample
    /// order) and, with a KL penalty, the reference's.
    fn group_objective(
        &self,
        g: &TrajectoryGroup,
        adv: &[f32],
        p: &Tensor,
        r: Option<&Tensor>,
    ) -> Result<(Tensor, GroupTerms)> {
        let dev = self.policy.device();
        let n = g.samples.len();
        let len = longest_response(g);
        let (mut q, mut m) = (Vec::with_capacity(n * len), Vec::with_capacity(n * len));
        for (i, s) in g.samples.iter().enumerate() {
            // The learner's own mask (admission refused groups it cannot derive); the mask
            // a group carries is never used.
            let mask = self.masks.mask(g, i).unwrap_or_default();
            for j in 0..len {
                q.push(s.sampler_logprobs.get(j).copied().unwrap_or(0.0));
                m.push(mask.get(j).map_or(0.0, |&b| f32::from(u8::from(b != 0))));
            }
        }
        let q = Tensor::from_vec(q, (n, len), dev)?;
        let m = Tensor::from_vec(m, (n, len), dev)?;
        let a = Tensor::from_vec(adv.to_vec(), n, dev)?;
        let p = p.narrow(1, 0, len)?;
        let r = r.map(|r| r.narrow(1, 0, len)).transpose()?;
        let out = group_loss(
            &self.cfg.loss,
            &GroupInput {
                learner_logp: &p,
                sampler_logp: &q,
                mask: &m,
                advantages: &a,
                ref_logp: r.as_ref(),
            },
        )?;
        let terms = GroupTerms {
            loss: out
                .loss
                .to_dtype(candle_core::DType::F64)?
                .to_scalar::<f64>()?,
            tokens: f64::from(m.sum_all()?.to_scalar::<f32>()?),
            coefficients: out.coefficients,
            clip_fraction: out.clip_fraction,
            kl: out.kl_sampler_learner,
        };
        Ok((out.loss, terms))
    }
}

/// Runs a recomputed pass's backward of `Σ ℓ ⊙ weight`, adding each part into `grads`.
fn sink_backward(
    pass: policy::RecomputedPass<'_>,
    weight: &Tensor,
    grads: &mut Option<GradStore>,
    vars: &[Var],
) -> Result<()> {
    let mut failed = None;
    pass.backward(weight, &mut |store| {
        if failed.is_none() {
            failed = add_into(grads, store, vars).err();
        }
        Ok(())
    })?;
    failed.map_or(Ok(()), Err)
}

fn pair<'a>(g: &'a TrajectoryGroup, s: &'a storage::Sample) -> (&'a [u32], &'a [u32]) {
    (g.prompt_tokens.as_slice(), s.response_tokens.as_slice())
}

fn longest_response(g: &TrajectoryGroup) -> usize {
    g.samples
        .iter()
        .map(|s| s.response_tokens.len())
        .max()
        .unwrap_or(1)
}

/// `[rows, l]` log-probs right-padded with zeros to `[rows, len]`.
fn pad_to(lp: &Tensor, len: usize) -> Result<Tensor> {
    let l = lp.dim(1)?;
    Ok(if l < len {
        lp.pad_with_zeros(1, 0, len - l)?
    } else {
        lp.clone()
    })
}

#[cfg(test)]
#[path = "microbatch_tests.rs"]
mod tests;
