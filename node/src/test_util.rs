//! Test helpers of the node's unit tests (compiled for tests only).

use policy::Tensor;

/// The largest absolute difference between two tensors of one shape (e.g. two models' logits).
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}
