//! The frozen linear against candle's own matmul: the same values (f32 exactly; a bf16
//! weight as a bf16 GEMM rounds), the input's gradient `dy·W`, and no gradient for `W`.

use candle_core::{DType, Device, Tensor, Var};

use super::frozen_linear;

fn randn(shape: &[usize], seed: u64) -> Tensor {
    crate::model::fused_tests::randn(shape, seed)
}

/// `round(round(x)·round(W)ᵀ)` in f32 by candle's matmul, rounding through `dtype`.
fn reference(x: &Tensor, w: &Tensor, dtype: DType) -> Tensor {
    let r = |t: &Tensor| t.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
    let (b, t, k) = x.dims3().unwrap();
    let y = r(x)
        .reshape((b * t, k))
        .unwrap()
        .matmul(&r(w).t().unwrap())
        .unwrap();
    r(&y).reshape((b, t, w.dim(0).unwrap())).unwrap()
}

#[test]
fn values_and_the_input_gradient_match_candles_matmul_in_f32_and_bf16() {
    let x = Var::from_tensor(&randn(&[2, 3, 8], 1)).unwrap();
    let w32 = randn(&[5, 8], 2);
    let dy = randn(&[2, 3, 5], 3);
    for dtype in [DType::F32, DType::BF16] {
        let w = w32.to_dtype(dtype).unwrap();
        let y = frozen_linear(x.as_tensor(), &w).unwrap();
        assert_eq!(y.dtype(), DType::F32, "returned in the activation dtype");
        let want = reference(x.as_tensor(), &w32, dtype);
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{dtype:?}: the forward is a GEMM in the weight's dtype"
        );
        let grads = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        let dx = grads.get(x.as_tensor()).expect("x gets its gradient");
        let want = reference(&dy, &w32.t().unwrap().contiguous().unwrap(), dtype);
        // Up to the GEMM's summation order (the operands are laid out differently) and,
        // for bf16, one rounding of the result that order can flip (a bf16 ulp is at most
        // 2⁻⁷ of the value).
        let d = crate::model::fused_tests::max_abs_diff(dx, &want);
        let scale = want
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let tol = scale
            * if dtype == DType::F32 {
                1e-6
            } else {
                2f32.powi(-7)
            };
        assert!(d <= tol, "{dtype:?}: dx = dy·W, differs by {d}");
        for id in grads.get_ids() {
            let dims = grads.get_id(*id).unwrap().dims().to_vec();
            assert!(dims != [5, 8] && dims != [8, 5], "a weight-shaped gradient");
        }
    }
}

#[test]
fn refuses_an_input_whose_width_is_not_the_weights() {
    let x = Tensor::zeros((2, 7), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros((5, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(frozen_linear(&x, &w).is_err());
}
