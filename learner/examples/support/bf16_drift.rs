//! Per-step bf16 change statistics of a training run (`train_step --bf16-stats PATH`;
//! `docs/storage.md`, "How many bf16 values a step changes"). After every step each weight is
//! rounded to bf16 (nearest-even, as a bf16 snapshot is written) and compared with the bf16
//! value of the version before (κ = 1) and two versions before (κ = 2), per tensor kind. On a
//! strided sample of the f32 master weights it also records how far each weight moved, whether
//! it sat on the bf16 grid before the step, and the two rounding predictions the measured
//! fraction is compared with.

use std::collections::BTreeMap;

use policy::Policy;

/// Every `SAMPLE_STRIDE`-th element of a tensor is sampled (a prime, so rows and columns mix).
const SAMPLE_STRIDE: usize = 61;

/// bf16 bits of `x`, rounded to nearest-even (what a bf16 snapshot stores).
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The value of bf16 bits as f32.
fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The spacing of bf16 values at a bf16 value (its unit in the last place).
fn bf16_ulp(b: u16) -> f64 {
    let exp = i32::from((b >> 7) & 0xff);
    2f64.powi(exp.max(1) - 127 - 7)
}

/// The tensor kind of a parameter name: `embedding`, `norm`, `attention`, `mlp` or `other`.
pub fn kind_of(name: &str) -> &'static str {
    if name.contains("embed_tokens") || name.contains("lm_head") {
        "embedding"
    } else if name.ends_with("norm.weight") {
        "norm"
    } else if name.contains("self_attn") {
        "attention"
    } else if name.contains("mlp") {
        "mlp"
    } else {
        "other"
    }
}

/// Counters of one kind over one step.
#[derive(Default, Clone, serde::Serialize)]
pub struct KindStats {
    /// Elements.
    pub n: u64,
    /// Elements whose bf16 bits differ from the previous version's.
    pub changed_k1: u64,
    /// Elements whose bf16 bits differ from the version two steps before (0 on step 1).
    pub changed_k2: u64,
    /// Sampled elements.
    pub sample_n: u64,
    /// Sampled elements whose f32 master sat exactly on a bf16 value before the step.
    pub sample_on_grid: u64,
    /// Sampled elements whose bf16 bits changed.
    pub sample_changed: u64,
    /// Σ |Δw| / lr over the sample (the Adam step relative to the learning rate).
    pub sample_step_over_lr: f64,
    /// Σ min(1, |Δw| / ulp(w)) over the sample: the expected flips if each master weight sat
    /// uniformly inside its bf16 rounding interval (off the grid), for the step it really took.
    pub pred_offgrid: f64,
    /// Σ min(1, lr / ulp(w)) over the sample: the same for a step of exactly lr.
    pub pred_lr: f64,
}

/// The bf16 bits of the last two versions and the sampled f32 masters of the last one.
pub struct Tracker {
    lr: f64,
    prev: BTreeMap<String, Vec<u16>>,
    prev2: BTreeMap<String, Vec<u16>>,
    sample: BTreeMap<String, Vec<f32>>,
    steps: u64,
}

fn flat(var: &candle_core::Var) -> anyhow::Result<Vec<f32>> {
    Ok(var.as_tensor().flatten_all()?.to_vec1::<f32>()?)
}

impl Tracker {
    /// Records the policy's current weights as version 0.
    pub fn new(policy: &Policy, lr: f64) -> anyhow::Result<Tracker> {
        let mut t = Tracker {
            lr,
            prev: BTreeMap::new(),
            prev2: BTreeMap::new(),
            sample: BTreeMap::new(),
            steps: 0,
        };
        for (name, var) in policy.named_vars()? {
            let w = flat(&var)?;
            t.prev
                .insert(name.clone(), w.iter().map(|&x| bf16_bits(x)).collect());
            t.sample
                .insert(name, w.iter().step_by(SAMPLE_STRIDE).copied().collect());
        }
        Ok(t)
    }

    /// The rounding predictions and grid state of the current weights, before any step.
    pub fn initial(&self) -> BTreeMap<&'static str, KindStats> {
        let mut out: BTreeMap<&'static str, KindStats> = BTreeMap::new();
        for (name, s) in &self.sample {
            let k = out.entry(kind_of(name)).or_default();
            k.n += self.prev[name].len() as u64;
            for &w in s {
                let b = bf16_bits(w);
                k.sample_n += 1;
                k.sample_on_grid += u64::from(bf16_value(b) == w);
                k.pred_lr += (self.lr / bf16_ulp(b)).min(1.0);
            }
        }
        out
    }

    /// Compares the policy's weights after a step with the versions before; per kind.
    pub fn step(&mut self, policy: &Policy) -> anyhow::Result<BTreeMap<&'static str, KindStats>> {
        self.steps += 1;
        let mut out: BTreeMap<&'static str, KindStats> = BTreeMap::new();
        for (name, var) in policy.named_vars()? {
            let w = flat(&var)?;
            let k = out.entry(kind_of(&name)).or_default();
            let prev = self.prev.get_mut(&name).expect("same variables every step");
            let prev2 = self.prev2.entry(name.clone()).or_default();
            let old_sample = self.sample.get_mut(&name).expect("same variables");
            k.n += w.len() as u64;
            let mut new_bits: Vec<u16> = w.iter().map(|&x| bf16_bits(x)).collect();
            k.changed_k1 += prev.iter().zip(&new_bits).filter(|(a, b)| a != b).count() as u64;
            if !prev2.is_empty() {
                k.changed_k2 += prev2.iter().zip(&new_bits).filter(|(a, b)| a != b).count() as u64;
            }
            for (j, (&w0, &w1)) in old_sample
                .iter()
                .zip(w.iter().step_by(SAMPLE_STRIDE))
                .enumerate()
            {
                let b0 = bf16_bits(w0);
                let d = (f64::from(w1) - f64::from(w0)).abs();
                let ulp = bf16_ulp(b0);
                k.sample_n += 1;
                k.sample_on_grid += u64::from(bf16_value(b0) == w0);
                k.sample_changed += u64::from(b0 != new_bits[j * SAMPLE_STRIDE]);
                k.sample_step_over_lr += d / self.lr;
                k.pred_offgrid += (d / ulp).min(1.0);
                k.pred_lr += (self.lr / ulp).min(1.0);
            }
            *old_sample = w.iter().step_by(SAMPLE_STRIDE).copied().collect();
            // prev2 <- prev <- new, without copying.
            std::mem::swap(prev, &mut new_bits);
            *prev2 = new_bits;
        }
        Ok(out)
    }
}

/// One JSON object of per-kind stats plus their total, as fractions.
pub fn to_json(stats: &BTreeMap<&'static str, KindStats>) -> serde_json::Value {
    let mut total = KindStats::default();
    let mut kinds = serde_json::Map::new();
    for (k, s) in stats {
        total.n += s.n;
        total.changed_k1 += s.changed_k1;
        total.changed_k2 += s.changed_k2;
        total.sample_n += s.sample_n;
        total.sample_on_grid += s.sample_on_grid;
        total.sample_changed += s.sample_changed;
        total.sample_step_over_lr += s.sample_step_over_lr;
        total.pred_offgrid += s.pred_offgrid;
        total.pred_lr += s.pred_lr;
        kinds.insert((*k).to_string(), fractions(s));
    }
    kinds.insert("total".into(), fractions(&total));
    serde_json::Value::Object(kinds)
}

fn fractions(s: &KindStats) -> serde_json::Value {
    let n = s.n.max(1) as f64;
    let sn = s.sample_n.max(1) as f64;
    serde_json::json!({
        "n": s.n,
        "changed_k1": s.changed_k1 as f64 / n,
        "changed_k2": s.changed_k2 as f64 / n,
        "sample_n": s.sample_n,
        "sample_on_grid": s.sample_on_grid as f64 / sn,
        "sample_changed": s.sample_changed as f64 / sn,
        "mean_step_over_lr": s.sample_step_over_lr / sn,
        "pred_offgrid": s.pred_offgrid / sn,
        "pred_lr": s.pred_lr / sn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_the_definition() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
        assert_eq!(bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(bf16_ulp(0x3f80), 2f64.powi(-7));
    }
}
