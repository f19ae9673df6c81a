//! Which compute device the policy runs on, and what that device looks like.
//!
//! Owns: the operator-facing [`DeviceChoice`] (`auto`, `cpu`, `cuda`, `cuda:N`), turning it
//! into a candle [`Device`] ([`select`]), and a serialisable description of a device
//! ([`describe`]: name, memory, compute capability) for logs, heartbeats and memory checks.
//!
//! Must not touch: model code, or any decision about *what* fits on the device (that is
//! [`crate::memory`]). Nothing here allocates tensors.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// The device an operator asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceChoice {
    /// The first CUDA device when this binary has CUDA support and one opens, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device `N` (`cuda` means `cuda:0`).
    Cuda(usize),
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            PolicyError::Device(format!(
                "unknown device {s:?}: expected `auto`, `cpu`, `cuda` or `cuda:N`"
            ))
        };
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                // Only plain decimal digits: no sign, no spaces, no `cuda:+1`.
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(DeviceChoice::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl TryFrom<String> for DeviceChoice {
    type Error = PolicyError;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<DeviceChoice> for String {
    fn from(c: DeviceChoice) -> String {
        c.to_string()
    }
}

/// Whether this binary was built with candle's CUDA backend (`--features cuda`).
pub fn cuda_compiled() -> bool {
    candle_core::utils::cuda_is_available()
}

/// Opens the chosen device. `Auto` never fails: without CUDA support, without the NVIDIA
/// driver or CUDA libraries on this host, or when no CUDA device opens, it falls back to the
/// CPU (and logs why).
///
/// A `cuda` build opens the driver and the CUDA libraries at run time (`docs/gpu.md`, "One
/// binary for CPU and GPU hosts"), so the same binary starts on a host without them; they
/// are looked for before any CUDA call, since a missing library would otherwise abort the
/// process at its first use.
pub fn select(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto => {
            if !cuda_compiled() {
                return Ok(Device::Cpu);
            }
            match open_cuda(0) {
                Ok(d) => Ok(d),
                Err(e) => {
                    tracing::warn!(error = %e, "no usable CUDA device; running on the CPU");
                    Ok(Device::Cpu)
                }
            }
        }
        DeviceChoice::Cuda(n) => {
            if !cuda_compiled() {
                return Err(PolicyError::Device(format!(
                    "device cuda:{n} requested but this binary was built without CUDA support; \
                     build it with `scripts/build-cuda.sh` (cargo build --release --features cuda, \
                     see docs/gpu.md) or use `--device cpu`"
                )));
            }
            open_cuda(n)
        }
    }
}

/// CUDA device `n`, once the libraries it needs are known to load.
fn open_cuda(n: usize) -> Result<Device> {
    let missing = missing_cuda_libraries();
    if !missing.is_empty() {
        return Err(PolicyError::Device(format!(
            "cannot open CUDA device cuda:{n}: {} not found on this host (install the NVIDIA \
             driver, 580 or newer, and the CUDA 13 libraries, or run through \
             scripts/run-on-gpu.sh, which puts them on LD_LIBRARY_PATH; docs/gpu.md)",
            missing.join(", ")
        )));
    }
    Device::new_cuda(n)
        .map_err(|e| PolicyError::Device(format!("cannot open CUDA device cuda:{n}: {e}")))
}

/// The shared libraries opening a CUDA device loads that this host does not have (each is
/// opened and closed again, nothing in it is called). Empty in a build without CUDA.
pub fn missing_cuda_libraries() -> Vec<&'static str> {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc;
        // SAFETY: `is_culib_present` only dlopen()s the library under its candidate names and
        // drops the handle; it calls none of its functions. Loading runs the library's
        // initialisers, which is what opening the device would do anyway.
        #[allow(unsafe_code)]
        let found = unsafe {
            [
                (
                    "libcuda.so.1 (the NVIDIA driver)",
                    cudarc::driver::sys::is_culib_present(),
                ),
                ("libcublas.so.13", cudarc::cublas::sys::is_culib_present()),
                (
                    "libcublasLt.so.13",
                    cudarc::cublaslt::sys::is_culib_present(),
                ),
                ("libcurand.so.10", cudarc::curand::sys::is_culib_present()),
            ]
        };
        found
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(name, _)| *name)
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    Vec::new()
}

/// A description of a device for logs, heartbeats and memory checks. Unknown values are `0`
/// or `"unknown"`, never an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `"cpu"` or `"cuda"`.
    pub kind: String,
    /// CPU model name or GPU name.
    pub name: String,
    /// Total memory of the device (host RAM for the CPU), bytes.
    pub memory_total_bytes: u64,
    /// Memory available for new allocations, bytes.
    pub memory_free_bytes: u64,
    /// CUDA compute capability, e.g. `"9.0"`; `None` on the CPU.
    pub compute_capability: Option<String>,
}

/// Describes `device` (reads `/proc` for the CPU, asks the CUDA driver for a GPU).
pub fn describe(device: &Device) -> DeviceInfo {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => describe_cuda(d),
        _ if device.is_cuda() => DeviceInfo {
            kind: "cuda".into(),
            name: "unknown".into(),
            memory_total_bytes: 0,
            memory_free_bytes: 0,
            compute_capability: None,
        },
        _ if device.is_cpu() => {
            let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
            let (total, free) = parse_meminfo(&meminfo);
            DeviceInfo {
                kind: "cpu".into(),
                name: parse_cpu_name(&cpuinfo).unwrap_or_else(|| "cpu".into()),
                memory_total_bytes: total,
                memory_free_bytes: free,
                compute_capability: None,
            }
        }
        _ => DeviceInfo {
            kind: "other".into(),
            name: "unknown".into(),
            memory_total_bytes: 0,
            memory_free_bytes: 0,
            compute_capability: None,
        },
    }
}

#[cfg(feature = "cuda")]
fn describe_cuda(d: &candle_core::CudaDevice) -> DeviceInfo {
    use candle_core::cuda_backend::cudarc;
    let stream = d.cuda_stream();
    let ctx = stream.context();
    // `mem_get_info` reports the device of the calling thread's current context.
    let (free, total) = ctx
        .bind_to_thread()
        .ok()
        .and_then(|()| cudarc::driver::result::mem_get_info().ok())
        .unwrap_or((0, 0));
    DeviceInfo {
        kind: "cuda".into(),
        name: ctx.name().unwrap_or_else(|_| "unknown".into()),
        memory_total_bytes: total as u64,
        memory_free_bytes: free as u64,
        compute_capability: ctx
            .compute_capability()
            .ok()
            .map(|(major, minor)| format!("{major}.{minor}")),
    }
}

/// The first `model name` line of `/proc/cpuinfo` (x86), or `Model`/`CPU part` lines elsewhere.
fn parse_cpu_name(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        let k = k.trim();
        let v = v.trim();
        ((k == "model name" || k == "Model") && !v.is_empty()).then(|| v.to_string())
    })
}

/// `(MemTotal, MemAvailable)` in bytes from `/proc/meminfo` (values are in kB); 0 if absent.
fn parse_meminfo(meminfo: &str) -> (u64, u64) {
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .map_or(0, |kb| kb.saturating_mul(1024))
    };
    (field("MemTotal"), field("MemAvailable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_and_display_round_trip() {
        for (s, c) in [
            ("auto", DeviceChoice::Auto),
            ("cpu", DeviceChoice::Cpu),
            ("cuda:0", DeviceChoice::Cuda(0)),
            ("cuda:3", DeviceChoice::Cuda(3)),
        ] {
            assert_eq!(s.parse::<DeviceChoice>().unwrap(), c);
            assert_eq!(c.to_string(), s);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<DeviceChoice>(&json).unwrap(), c);
        }
        assert_eq!(
            "cuda".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(0)
        );
        assert_eq!(DeviceChoice::default(), DeviceChoice::Auto);
    }

    #[test]
    fn bad_strings_are_refused() {
        for s in [
            "", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:x", "cuda0", " cpu",
            "metal",
        ] {
            let e = s.parse::<DeviceChoice>().unwrap_err().to_string();
            assert!(e.contains("cuda:N"), "{s:?}: {e}");
        }
        assert!(serde_json::from_str::<DeviceChoice>("\"gpu\"").is_err());
    }

    #[test]
    fn auto_picks_the_cpu_without_cuda() {
        if cuda_compiled() {
            return; // the CUDA build may legitimately pick a GPU
        }
        assert!(select(DeviceChoice::Auto).unwrap().is_cpu());
        assert!(select(DeviceChoice::Cpu).unwrap().is_cpu());
        assert!(missing_cuda_libraries().is_empty());
    }

    /// The `cuda` build on a host without the NVIDIA driver (CI, this development machine):
    /// it starts (the driver is loaded at run time, not linked), `auto` falls back to the CPU
    /// and `cuda` is refused with the missing library named — no abort. On a GPU host it
    /// checks that the device opens instead.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_build_falls_back_without_a_driver() {
        let missing = missing_cuda_libraries();
        if missing.is_empty() {
            assert!(select(DeviceChoice::Cuda(0)).unwrap().is_cuda());
            return;
        }
        assert!(select(DeviceChoice::Auto).unwrap().is_cpu());
        let e = select(DeviceChoice::Cuda(0)).unwrap_err().to_string();
        assert!(e.contains(missing[0]) && e.contains("cuda:0"), "{e}");
    }

    #[test]
    fn cuda_without_support_explains_how_to_build() {
        if cuda_compiled() {
            return;
        }
        for c in [DeviceChoice::Cuda(0), DeviceChoice::Cuda(1)] {
            let e = select(c).unwrap_err().to_string();
            assert!(e.contains(&c.to_string()), "{e}");
            assert!(e.contains("without CUDA"), "{e}");
            assert!(e.contains("scripts/build-cuda.sh"), "{e}");
            assert!(e.contains("docs/gpu.md"), "{e}");
        }
    }

    #[test]
    fn describes_the_cpu() {
        let info = describe(&Device::Cpu);
        assert_eq!(info.kind, "cpu");
        assert!(!info.name.is_empty());
        assert!(info.compute_capability.is_none());
        assert!(info.memory_free_bytes <= info.memory_total_bytes);
        let json = serde_json::to_string(&info).unwrap();
        assert_eq!(serde_json::from_str::<DeviceInfo>(&json).unwrap(), info);
    }

    #[test]
    fn proc_parsers() {
        let cpu = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) X\n";
        assert_eq!(parse_cpu_name(cpu).as_deref(), Some("Intel(R) Xeon(R) X"));
        assert_eq!(parse_cpu_name("processor: 0\n"), None);
        let mem = "MemTotal:       16000 kB\nMemFree:  100 kB\nMemAvailable:   8000 kB\n";
        assert_eq!(parse_meminfo(mem), (16000 * 1024, 8000 * 1024));
        assert_eq!(parse_meminfo("garbage"), (0, 0));
    }
}
