#!/usr/bin/env bash
# Builds the GPU echo-node: `cargo build --release -p echo-node --features cuda` against the CUDA
# 13.0 toolchain of scripts/cuda-install.sh (installed on first use, cached outside the repo).
# Works on a machine with no GPU and no system CUDA; the binary runs on a GPU host through
# scripts/run-on-gpu.sh.
#
#   scripts/build-cuda.sh [extra cargo args...]     e.g. scripts/build-cuda.sh --locked
#   CUDA_COMPUTE_CAP=80 scripts/build-cuda.sh       kernels for an A100 instead of H100/H200
#
# CARGO_TARGET_DIR is respected if set. Prints the binary's path and the shared libraries it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/cuda-env.sh
. scripts/cuda-env.sh

cargo build --release -p echo-node --features cuda -j "${CARGO_BUILD_JOBS:-2}" "$@"

target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/release/echo-node"
echo "built $bin"
needed=$(readelf -d "$bin" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
echo "needs (NEEDED): $needed"
# One binary for CPU and GPU hosts: the CUDA libraries are opened at run time, never linked.
# A CUDA library here means the cudarc patch (third_party/cudarc) or the static cudart
# (cuda-env.sh's LIBRARY_PATH) stopped applying: the binary would not start without a GPU.
if grep -qE 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so' <<<"$needed"; then
  echo "build-cuda: $bin links a CUDA library; it must load them at run time (docs/gpu.md)" >&2
  exit 1
fi
echo "run it on a GPU host with: scripts/run-on-gpu.sh $bin run --device cuda ..."
