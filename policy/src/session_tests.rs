use candle_core::Device;
use rand::SeedableRng;

use super::*;
use crate::config::ModelConfig;
use crate::tokenizer::ByteTokenizer;

/// Plays three turns (observations of a few bytes between them) and returns the whole
/// trajectory after the prompt with the (position, sampled log-prob) of every sampled token.
fn episode(s: &mut Session<'_>, seed: u64) -> (Vec<u32>, Vec<(usize, f32)>) {
    let mut params = SamplingParams::new(6, vec![ByteTokenizer::EOS]);
    params.temperature = 1.3;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let draws = Draws::from_rng(&mut rng, 1);
    let (mut seq, mut sampled) = (Vec::new(), Vec::new());
    for turn in 0..3 {
        let c = s
            .sample(6, &params, &draws.row_from(0, sampled.len() as u64))
            .unwrap();
        assert_eq!(c.tokens.len(), c.logprobs.len());
        for (t, lp) in c.tokens.iter().zip(&c.logprobs) {
            sampled.push((seq.len(), *lp));
            seq.push(*t);
        }
        if turn < 2 {
            let obs: Vec<u32> = format!("obs {turn}")
                .bytes()
                .map(u32::from)
                .chain([ByteTokenizer::SEP])
                .collect();
            s.feed(&obs).unwrap();
            seq.extend(obs);
        }
    }
    (seq, sampled)
}

#[test]
fn carried_kv_cache_gives_the_log_probs_of_the_whole_history() {
    let policy = Policy::new_random(&ModelConfig::tiny(), 5, &Device::Cpu).unwrap();
    let infer = InferModel::from_policy(&policy).unwrap();
    let prompt: Vec<u32> = std::iter::once(ByteTokenizer::BOS)
        .chain("deal: K".bytes().map(u32::from))
        .chain([ByteTokenizer::SEP])
        .collect();
    for model in [Model::Infer(&infer), Model::Train(&policy)] {
        let mut s = Session::new(model, 200).unwrap();
        s.feed(&prompt).unwrap();
        let (seq, sampled) = episode(&mut s, 9);
        assert!(sampled.len() >= 3, "at least one token a turn");
        assert_eq!(s.len(), prompt.len() + seq.len());
        // One forward over prompt + everything: what the learner computes.
        let full = crate::sampling::response_logprobs(&policy, &prompt, &seq, 1.3).unwrap();
        let worst = sampled
            .iter()
            .map(|&(i, lp)| (full[i] - lp).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{model:?}: max |Δ log p| = {worst}");
    }
}

#[test]
fn forks_are_independent_and_reproducible() {
    let policy = Policy::new_random(&ModelConfig::tiny(), 6, &Device::Cpu).unwrap();
    let infer = InferModel::from_policy(&policy).unwrap();
    let prompt = vec![ByteTokenizer::BOS, 65, 66, ByteTokenizer::SEP];
    let mut base = Session::new(Model::Infer(&infer), 128).unwrap();
    base.feed(&prompt).unwrap();
    let mut a = base.fork().unwrap();
    let mut b = base.fork().unwrap();
    let ea = episode(&mut a, 1);
    let _other = episode(&mut b, 2);
    // The base is untouched by its forks: a third fork replays the first episode exactly.
    let mut c = base.fork().unwrap();
    assert_eq!(episode(&mut c, 1), ea);
    assert!(
        Session::new(Model::Infer(&infer), 8)
            .unwrap()
            .sample(
                4,
                &SamplingParams::new(4, vec![]),
                &Draws::from_rng(&mut rand::rngs::StdRng::seed_from_u64(0), 1)
            )
            .is_err(),
        "sampling before any feed is an error"
    );
}
