#!/usr/bin/env bash
# Runs a `cuda` build of echo-node (scripts/build-cuda.sh) on a GPU host: finds the NVIDIA driver
# and the CUDA 13 libraries the binary opens at run time, puts their directories on
# LD_LIBRARY_PATH and execs the binary with the remaining arguments.
#
#   scripts/run-on-gpu.sh path/to/echo-node run --device cuda ...
#   scripts/run-on-gpu.sh --check path/to/echo-node     # report what was found, run nothing
#
# Looks in: LD_LIBRARY_PATH, the driver's usual places (container mounts, distro dirs), CUDA
# toolkits under /usr/local, NVIDIA's Python wheels (e.g. PyTorch's), ldconfig's cache, and
# scripts/cuda-install.sh's cache. Never a `stubs` directory: the link-time driver stub there
# answers every call with an error.
set -euo pipefail

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 [--check] path/to/echo-node [args...]" >&2; exit 2; }
bin=$1
shift
if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then echo "run-on-gpu: not an executable: $bin" >&2; exit 2; fi

say() { echo "run-on-gpu: $*" >&2; }

# The CUDA libraries a `cuda` build opens at run time (it records none as NEEDED: the same
# binary starts on a CPU-only host, docs/gpu.md): the driver, cuBLAS (which loads cuBLASLt
# itself) and cuRAND. The CUDA runtime is linked in statically; NVRTC is never reached.
needed=(libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libcurand.so.10)

# Candidate directories, in order of preference: the driver first, so that a toolkit's copy of
# a compat libcuda never shadows the one matching the kernel module.
dirs=()
add() { case "$1" in */stubs | */stubs/) return ;; esac; [ -d "$1" ] && dirs+=("$1"); return 0; }
IFS=: read -ra pre <<<"${LD_LIBRARY_PATH:-}"
for d in "${pre[@]}"; do [ -n "$d" ] && add "$d"; done
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
  /lib/x86_64-linux-gnu /usr/lib/wsl/lib; do add "$d"; done
for root in /usr/local/cuda /usr/local/cuda-13*; do
  for sub in lib64 lib targets/x86_64-linux/lib; do add "$root/$sub"; done
done
for py in python3 /opt/torch/.venv/bin/python3; do
  command -v "$py" >/dev/null || continue
  while IFS= read -r p; do
    for d in "$p"/cu13/lib "$p"/*/lib; do add "$d"; done
  done < <("$py" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null || true)
done
while IFS= read -r f; do add "$(dirname "$f")"; done < <(ldconfig -p 2>/dev/null \
  | awk '/lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so\.[0-9]+ /{print $NF}')
add "${ECHO_CUDA_HOME:-$HOME/.cache/echo-swarm-cuda}/cuda-13.0/prefix/nvidia/cu13/lib"

ldp=""
missing=()
for lib in "${needed[@]}"; do
  found=""
  for d in "${dirs[@]}"; do
    if [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then missing+=("$lib"); continue; fi
  say "$lib: $found"
  case ":$ldp:" in *":$found:"*) ;; *) ldp=${ldp:+$ldp:}$found ;; esac
done

# The driver: CUDA 13.0 needs an NVIDIA driver of the 580 series or newer.
driver=""
if command -v nvidia-smi >/dev/null; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n 1 || true)
  [ -n "$gpu" ] && say "GPU: $gpu"
elif [ -r /proc/driver/nvidia/version ]; then
  driver=$(sed -nE 's/.*Kernel Module +([0-9.]+).*/\1/p' /proc/driver/nvidia/version | head -n 1)
fi
for lib in "${missing[@]}"; do
  if [ "$lib" = libcuda.so.1 ]; then
    say "no NVIDIA driver library (libcuda.so.1) on this host: this is not a GPU host, or its"
    say "driver is not mounted into this container. Install the NVIDIA driver (580 or newer) first."
    exit 1
  fi
done
if [ -n "$driver" ]; then
  say "driver: $driver"
  if [ "${driver%%.*}" -lt 580 ] 2>/dev/null; then
    say "driver $driver is older than 580: this build targets CUDA 13.0, which needs 580 or newer"
    exit 1
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "missing: ${missing[*]}"
  say "install the CUDA 13 libraries (e.g. scripts/cuda-install.sh, or the nvidia-cublas and"
  say "nvidia-curand 13.x wheels) or add their directory to LD_LIBRARY_PATH"
  exit 1
fi

export LD_LIBRARY_PATH="$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ "$check_only" = 1 ]; then
  exit 0
fi
exec "$bin" "$@"
