//! [`DeviceRule`]: the rule kernel ([`super::KERNEL_SRC`]) compiled by NVRTC on the model's
//! CUDA device, its scratch buffers allocated once for a bucket of rows, and its output (8
//! bytes per row) copied into page-locked host memory that is *not* write-combined (the CPU
//! reads it; write-combined memory is slow to read).
//!
//! **Untested on a device**: built and linted against cudarc 0.19 with the CUDA 13.0 toolkit,
//! and the kernel compiled to sm_90 PTX with NVRTC's flags (both in `.ci/run`), but never run;
//! the GPU test `rule_device_matches_the_rule_on_the_device` (run by `scripts/gpu-smoke.sh`)
//! is its first run. Built only with the `cuda-rule` feature.

// Pinned host memory and kernel launches are FFI: the unsafe blocks are each one call.
#![allow(unsafe_code)]

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    result, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::{DType, Device, Storage, Tensor};

use super::{decode_output, THREADS};
use crate::error::{PolicyError, Result};
use crate::rule::{Drawn, RuleParams, WALK_BLOCK};

fn err(what: &str, e: impl std::fmt::Debug) -> PolicyError {
    PolicyError::Sampling(format!("device rule: {what}: {e:?}"))
}

/// Page-locked host memory allocated without `CU_MEMHOSTALLOC_WRITECOMBINED`.
struct Pinned {
    ptr: *mut u32,
    len: usize,
}

// The buffer is only touched through `&mut self` of its owner.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(len: usize) -> Result<Self> {
        let ptr = unsafe { result::malloc_host(len * 4, 0) }.map_err(|e| err("pinned alloc", e))?;
        Ok(Pinned {
            ptr: ptr as *mut u32,
            len,
        })
    }

    fn as_mut_slice(&mut self) -> &mut [u32] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}

/// The rule kernel and its buffers for up to `rows` rows of `vocab` logits.
pub struct DeviceRule {
    stream: Arc<CudaStream>,
    funcs: [CudaFunction; 3],
    rows: usize,
    vocab: usize,
    e: CudaSlice<f32>,
    bs: CudaSlice<f64>,
    uniforms: CudaSlice<f64>,
    out: CudaSlice<u32>,
    host: Pinned,
}

impl DeviceRule {
    /// Compiles the kernel for `device` (a CUDA device) and allocates the buffers of a bucket
    /// of `rows` rows.
    pub fn new(device: &Device, rows: usize, vocab: usize) -> Result<Self> {
        let Device::Cuda(dev) = device else {
            return Err(PolicyError::Sampling(
                "the device rule needs a CUDA device".into(),
            ));
        };
        let opts = CompileOptions {
            ftz: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            fmad: Some(false),
            use_fast_math: Some(false),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(super::KERNEL_SRC, opts).map_err(|e| err("nvrtc", e))?;
        let stream = dev.cuda_stream();
        let module = stream
            .context()
            .load_module(ptx)
            .map_err(|e| err("load module", e))?;
        let load = |name: &str| module.load_function(name).map_err(|e| err(name, e));
        let funcs = [
            load("rule_rows_f32")?,
            load("rule_rows_bf16")?,
            load("rule_rows_f16")?,
        ];
        let nblocks = vocab.div_ceil(WALK_BLOCK);
        let alloc = |what| move |e| err(what, e);
        Ok(DeviceRule {
            e: stream
                .alloc_zeros::<f32>(rows * vocab)
                .map_err(alloc("e"))?,
            bs: stream
                .alloc_zeros::<f64>(rows * nblocks)
                .map_err(alloc("bs"))?,
            uniforms: stream.alloc_zeros::<f64>(rows).map_err(alloc("u"))?,
            out: stream.alloc_zeros::<u32>(2 * rows).map_err(alloc("out"))?,
            host: Pinned::new(2 * rows)?,
            stream,
            funcs,
            rows,
            vocab,
        })
    }

    /// Whether this bucket holds `rows` rows of `vocab` logits.
    pub fn fits(&self, rows: usize, vocab: usize) -> bool {
        rows <= self.rows && vocab == self.vocab
    }

    /// Draws one token per uniform from `logits` (`[rows, vocab]`, or `[vocab]` shared by
    /// every row: the first step after a prefill), on the device; only the tokens and
    /// log-probs come back.
    pub fn draw(
        &mut self,
        logits: &Tensor,
        rule: RuleParams,
        uniforms: &[f64],
    ) -> Result<Vec<Drawn>> {
        let n = uniforms.len();
        let logits = logits.contiguous()?;
        let (rows, vocab) = match logits.dims() {
            [v] => (1, *v),
            [r, v] => (*r, *v),
            d => return Err(PolicyError::Sampling(format!("logits of shape {d:?}"))),
        };
        if vocab != self.vocab || n > self.rows || (rows != 1 && rows != n) || n == 0 {
            return Err(PolicyError::Sampling(format!(
                "{n} uniforms for {rows} rows of {vocab} (bucket: {} rows of {})",
                self.rows, self.vocab
            )));
        }
        let stride: i64 = if rows == 1 { 0 } else { vocab as i64 };
        let t = if rule.temperature > 0.0 {
            rule.temperature
        } else {
            1.0
        };
        let inv_t: f32 = 1.0 / t;
        let greedy: i32 = i32::from(rule.temperature == 0.0);
        let top_p = f64::from(rule.top_p);
        let vocab_i = vocab as i32;
        self.stream
            .memcpy_htod(uniforms, &mut self.uniforms.slice_mut(0..n))
            .map_err(|e| err("uniforms", e))?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            return Err(PolicyError::Sampling(
                "logits are not on a CUDA device".into(),
            ));
        };
        let start = layout.start_offset();
        macro_rules! launch {
            ($ty:ty, $f:expr) => {{
                let src = cs.as_cuda_slice::<$ty>()?.slice(start..);
                let mut b = self.stream.launch_builder($f);
                b.arg(&src)
                    .arg(&stride)
                    .arg(&vocab_i)
                    .arg(&self.uniforms)
                    .arg(&inv_t)
                    .arg(&greedy)
                    .arg(&top_p)
                    .arg(&mut self.e)
                    .arg(&mut self.bs)
                    .arg(&mut self.out);
                unsafe { b.launch(cfg) }.map_err(|e| err("launch", e))?;
            }};
        }
        match logits.dtype() {
            DType::F32 => launch!(f32, &self.funcs[0]),
            DType::BF16 => launch!(half::bf16, &self.funcs[1]),
            DType::F16 => launch!(half::f16, &self.funcs[2]),
            d => return Err(PolicyError::Sampling(format!("logits in {d:?}"))),
        }
        drop(storage);
        {
            let (src, _sync) = self.out.device_ptr(&self.stream);
            let dst = &mut self.host.as_mut_slice()[..2 * n];
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(|e| err("copy out", e))?;
        }
        self.stream.synchronize().map_err(|e| err("sync", e))?;
        let host = &self.host.as_mut_slice()[..2 * n];
        host.chunks_exact(2)
            .map(|p| decode_output(p[0], p[1]))
            .collect()
    }
}
