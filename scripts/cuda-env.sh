# shellcheck shell=bash
# Source this file to point any cargo command at the CUDA 13.0 toolchain that
# scripts/cuda-install.sh keeps outside the repository (installing it first if it is missing):
#
#   . scripts/cuda-env.sh && cargo check -p echo-node --features cuda
#
# It sets the environment of the shell that sources it and nothing else: no cargo command, no
# file in the repository. What the variables are for:
#   PATH                 nvcc (candle-kernels compiles its .cu files with it; cudarc asks
#                        `nvcc --version` which CUDA bindings to use)
#   CUDA_HOME/_PATH/_ROOT/_TOOLKIT_ROOT_DIR
#                        the toolkit root: cuda.h for the kernels, lib/ and lib/stubs/ for the
#                        linker (cudarc reads the first set of these, so all point at the same root)
#   CUDARC_CUDA_VERSION  13000 = CUDA 13.0, the same answer nvcc gives, stated so that no other
#                        nvcc on PATH can change it
#   LIBRARY_PATH         the toolkit's lib/static: candle-kernels' `-lcudart` links the static
#                        CUDA runtime (no CUDA library is recorded as NEEDED)
#   CUDA_COMPUTE_CAP     the GPU generation the kernels are compiled for; 90 (sm_90) = H100/H200.
#                        No nvidia-smi here to ask, so it must be given. Override it before
#                        sourcing for another GPU (80 = A100, 89 = L4/L40S/RTX 4090, 86 = A10/RTX 3090).
# It also unpacks cudarc into third_party/cudarc (scripts/cudarc-dynload.sh): the `cuda` build
# opens the CUDA libraries at run time, so the same binary starts on a CPU-only host.
# The stub driver library in lib/stubs/ is for the linker only and is deliberately not added to
# LD_LIBRARY_PATH: binaries run on a GPU host through scripts/run-on-gpu.sh.

_echo_cuda_scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if _echo_cuda_root=$("$_echo_cuda_scripts/cuda-install.sh" | tail -n 1) && [ -x "$_echo_cuda_root/bin/nvcc" ] \
  && "$_echo_cuda_scripts/cudarc-dynload.sh"; then
  case ":$PATH:" in
    *":$_echo_cuda_root/bin:"*) ;;
    *) export PATH="$_echo_cuda_root/bin:$PATH" ;;
  esac
  export CUDA_HOME="$_echo_cuda_root"
  export CUDA_PATH="$_echo_cuda_root"
  export CUDA_ROOT="$_echo_cuda_root"
  export CUDA_TOOLKIT_ROOT_DIR="$_echo_cuda_root"
  export CUDARC_CUDA_VERSION=13000
  export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
  # `-lcudart` (candle-kernels) resolves to the static runtime: no CUDA library is NEEDED.
  case ":${LIBRARY_PATH:-}:" in
    *":$_echo_cuda_root/lib/static:"*) ;;
    *) export LIBRARY_PATH="$_echo_cuda_root/lib/static${LIBRARY_PATH:+:$LIBRARY_PATH}" ;;
  esac
  # bindgen_cuda runs one nvcc per CPU it sees unless told; keep it to the cargo job count.
  export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-${CARGO_BUILD_JOBS:-2}}"
  echo "cuda-env: CUDA 13.0 at $_echo_cuda_root, CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP" >&2
  unset _echo_cuda_root _echo_cuda_scripts
else
  echo "cuda-env: the CUDA toolchain could not be installed (see above); environment unchanged" >&2
  unset _echo_cuda_root _echo_cuda_scripts
  # `return` when sourced; `exit` if someone ran it as a script.
  # shellcheck disable=SC2317
  return 1 2>/dev/null || exit 1
fi
