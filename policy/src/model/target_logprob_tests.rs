//! The one-node target log-prob against the spelled-out form it replaces: the same values to
//! the bit and the same gradients, on the fused CPU path and on the elementary path a GPU runs.

use candle_core::{Device, Tensor, Var, D};

use super::target_logprobs;
use crate::model::fused_tests::{max_abs_diff, randn, value_and_grads};
use crate::model::{log_softmax_last, use_elementary_ops};

fn targets(shape: &[usize], vocab: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let ids: Vec<u32> = (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    Tensor::from_vec(ids, shape, &Device::Cpu).unwrap()
}

/// What `token_logprobs` computed before: divide, log-softmax, gather, all recorded.
fn spelled_out(x: &Tensor, t: &Tensor, temperature: f32) -> Tensor {
    let x = if temperature != 1.0 {
        (x / f64::from(temperature)).unwrap()
    } else {
        x.clone()
    };
    log_softmax_last(&x)
        .unwrap()
        .gather(
            &t.unsqueeze(D::Minus1).unwrap().contiguous().unwrap(),
            D::Minus1,
        )
        .unwrap()
        .squeeze(D::Minus1)
        .unwrap()
}

#[test]
fn values_and_gradients_match_the_spelled_out_log_softmax() {
    // The second shape has rows enough to be split between threads on the fused path.
    for (shape, vocab) in [([3, 5], 50), ([4, 40], 1000)] {
        let logits = [(randn(&[shape[0], shape[1], vocab], 21) * 4.0).unwrap()];
        let t = targets(&shape, vocab);
        check_against_spelled_out(&logits, &t);
    }
}

fn check_against_spelled_out(logits: &[Tensor; 1], t: &Tensor) {
    for elementary in [false, true] {
        for temperature in [1.0f32, 0.7] {
            use_elementary_ops(elementary);
            let one = value_and_grads(logits, |x| target_logprobs(&x[0], t, temperature).unwrap());
            let reference = value_and_grads(logits, |x| spelled_out(&x[0], t, temperature));
            use_elementary_ops(false);
            let what = format!("elementary {elementary}, T = {temperature}");
            // The value is the spelled-out form's own computation, detached: bit-identical.
            assert_eq!(max_abs_diff(&one.0, &reference.0), 0.0, "{what}: values");
            let d = max_abs_diff(&one.1[0], &reference.1[0]);
            assert!(d < 1e-6, "{what}: gradients differ by {d}");
        }
    }
}

#[test]
fn the_node_keeps_only_the_logits() {
    let x = Var::from_tensor(&randn(&[2, 4, 30], 3)).unwrap();
    let t = targets(&[2, 4], 30);
    for elementary in [false, true] {
        use_elementary_ops(elementary);
        let lp = target_logprobs(x.as_tensor(), &t, 0.9).unwrap();
        use_elementary_ops(false);
        // The result and the logits, nothing vocabulary-wide between them (the spelled-out
        // form records the division, the log-softmax's ops and the gather).
        assert_eq!(lp.sorted_nodes().len(), 2, "elementary {elementary}");
        assert_eq!(lp.dims(), &[2, 4]);
    }
}

#[test]
fn without_a_graph_it_is_the_plain_value() {
    let x = randn(&[2, 3, 20], 4);
    let t = targets(&[2, 3], 20);
    let lp = target_logprobs(&x, &t, 0.8).unwrap();
    assert!(!lp.track_op());
    assert_eq!(max_abs_diff(&lp, &spelled_out(&x, &t, 0.8)), 0.0);
}

/// A target outside the vocabulary is an error on both paths, not a read past the row.
#[test]
fn a_target_outside_the_vocabulary_is_an_error() {
    let x = Var::from_tensor(&randn(&[2, 10], 5)).unwrap();
    let t = Tensor::from_vec(vec![3u32, 10], 2, &Device::Cpu).unwrap();
    for elementary in [false, true] {
        use_elementary_ops(elementary);
        let r = target_logprobs(x.as_tensor(), &t, 1.0);
        use_elementary_ops(false);
        assert!(r.is_err(), "elementary {elementary}: {r:?}");
    }
    let e = target_logprobs(x.as_tensor(), &t, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 10 outside a vocabulary of 10"), "{e}");
}
