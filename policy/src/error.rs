//! The policy crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while building, loading, running or saving a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A tensor operation failed (shape mismatch, unsupported dtype, device error, ...).
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A model configuration value is missing, out of range or inconsistent.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A snapshot or checkpoint was made for a different model configuration.
    #[error("config hash mismatch: the weights were saved for config {found}, this model's config is {expected}")]
    ConfigMismatch {
        /// Hash (hex) of the config the caller expects.
        expected: String,
        /// Hash (hex) recorded in the weights (or `"<none>"`).
        found: String,
    },
    /// A weight tensor is missing, unexpected, or has the wrong shape or dtype.
    #[error("invalid weights: {0}")]
    Weights(String),
    /// The safetensors payload could not be parsed or written.
    #[error("safetensors: {0}")]
    SafeTensors(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file was read but its content is not what we expected (corrupt JSON, ...).
    #[error("corrupt file {path}: {reason}")]
    CorruptFile {
        /// The file that failed.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Tokenizer construction or encoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The requested compute device is unknown, unsupported by this build, or cannot be opened.
    #[error("device: {0}")]
    Device(String),
    /// The model (and its caches) would not fit in the device's free memory.
    #[error("out of memory: {0}")]
    DoesNotFit(String),
    /// Bad sampling parameters or inputs (empty prompt, prompt longer than the context, ...).
    #[error("sampling: {0}")]
    Sampling(String),
}

impl PolicyError {
    /// Whether the device ran out of memory: the model did not fit
    /// ([`PolicyError::DoesNotFit`]) or a tensor operation failed to allocate
    /// ([`candle_out_of_memory`]). Classified by variant, never by message.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            PolicyError::DoesNotFit(_) => true,
            PolicyError::Candle(e) => candle_out_of_memory(e),
            _ => false,
        }
    }
}

/// Whether a candle error is a failed device allocation: on CUDA the driver's
/// `CUDA_ERROR_OUT_OF_MEMORY` or cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED`, through candle's
/// backtrace and context wrappers. (A failed host allocation aborts the process: there is no
/// CPU variant to classify.)
pub fn candle_out_of_memory(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => {
            candle_out_of_memory(inner)
        }
        #[cfg(feature = "cuda")]
        E::Cuda(b) => {
            use candle_core::cuda_backend::cudarc::{cublas, driver};
            use candle_core::cuda_backend::CudaError;
            match b.downcast_ref::<CudaError>() {
                Some(CudaError::Cuda(d)) => d.0 == driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                Some(CudaError::Cublas(c)) => {
                    c.0 == cublas::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
                }
                _ => b
                    .downcast_ref::<driver::DriverError>()
                    .is_some_and(|d| d.0 == driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            }
        }
        _ => false,
    }
}

/// Result alias for this crate.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;
