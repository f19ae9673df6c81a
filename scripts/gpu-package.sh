#!/usr/bin/env bash
# Builds what a rented GPU host needs, on any machine (no GPU, no system CUDA): the `cuda`
# build of echo-node and of the two benchmarks, stripped and compressed into one archive with
# the scripts that run them, small enough to copy over in seconds (docs/gpu.md, "Packaging").
#
#   scripts/gpu-package.sh [--out DIR] [--no-fallback-check] [extra cargo args...]
#
# Writes DIR/echo-swarm-gpu/{bin/{echo-node,gen_bench,train_step,testnet},scripts/{run-on-gpu.sh,
# gpu-smoke.sh,gpu-session.sh},BUILD} and DIR/echo-swarm-gpu.tar.xz (DIR defaults to dist/gpu,
# git-ignored), and prints every size. BUILD names the commit (and whether the tree had
# uncommitted changes), so a results file says what it measured. Fails when a binary links a CUDA library (it must start on a CPU-only
# host: the libraries are opened at run time) or when the archive exceeds 64 MiB. On a host
# without the NVIDIA driver it then runs the packaged `echo-node demo --device auto` for a
# few steps and checks that it fell back to the CPU, saying so in its log.
#
# On the GPU host:  tar xf echo-swarm-gpu.tar.xz && echo-swarm-gpu/scripts/gpu-session.sh
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist/gpu
fallback_check=1
cargo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --no-fallback-check) fallback_check=0; shift ;;
    *) cargo_args+=("$1"); shift ;;
  esac
done
say() { echo "gpu-package: $*" >&2; }
limit=$((64 << 20))

# shellcheck source=scripts/cuda-env.sh
. scripts/cuda-env.sh
cargo build --release -j "${CARGO_BUILD_JOBS:-2}" -p echo-node -p policy -p learner \
  --features echo-node/cuda --bin echo-node --example gen_bench --example train_step \
  ${cargo_args[@]+"${cargo_args[@]}"}
# testnet (the broadcast sweep of gpu-session.sh) in a build of its own: it turns on the node
# library's `adversary` feature, which must not reach the packaged echo-node. The cuda feature
# shares the dependencies just built; the sweep runs the packaged echo-node, not this library.
cargo build --release -j "${CARGO_BUILD_JOBS:-2}" -p testnet --features echo-node/cuda \
  --bin testnet ${cargo_args[@]+"${cargo_args[@]}"}
target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

pkg="$out/echo-swarm-gpu"
rm -rf "$pkg" "$out/echo-swarm-gpu.tar.xz"
mkdir -p "$pkg/bin" "$pkg/scripts"
size() { stat -c %s "$1"; }
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**20:.1f} MiB')" "$1"; }
for b in release/echo-node release/testnet release/examples/gen_bench release/examples/train_step; do
  src="$target_dir/$b"
  name=$(basename "$b")
  needed=$(readelf -d "$src" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
  if grep -qE 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so' <<<"$needed"; then
    say "$name links a CUDA library ($needed): it would not start without a GPU"
    exit 1
  fi
  objcopy --strip-all "$src" "$pkg/bin/$name"
  say "$name: $(mib "$(size "$src")") built, $(mib "$(size "$pkg/bin/$name")") stripped; NEEDED: $needed"
done
cp scripts/run-on-gpu.sh scripts/gpu-smoke.sh scripts/gpu-session.sh "$pkg/scripts/"
dirty=""
if git status --porcelain --untracked-files=no 2>/dev/null | grep -q .; then
  dirty=", uncommitted changes"
fi
echo "echo-swarm $(git rev-parse --short HEAD 2>/dev/null || echo unknown)${dirty}, built $(date -u +%Y-%m-%dT%H:%MZ)" \
  >"$pkg/BUILD"
# The binaries are found by gpu-smoke.sh's default --bin-dir (../bin beside it).
tar -C "$out" -cf - echo-swarm-gpu | xz -9 -T "${CARGO_BUILD_JOBS:-2}" >"$out/echo-swarm-gpu.tar.xz"
total=$(size "$out/echo-swarm-gpu.tar.xz")
say "archive $out/echo-swarm-gpu.tar.xz: $(mib "$total") (limit 64 MiB)"
if [ "$total" -gt "$limit" ]; then
  say "the archive is over 64 MiB"
  exit 1
fi

# One binary for CPU and GPU hosts: on a host without the driver the packaged node starts,
# falls back to the CPU and says so.
if [ "$fallback_check" = 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu-package-demo.XXXXXX")
  say "no NVIDIA driver here: checking the CPU fallback (echo-node demo --device auto --steps 3)"
  "$pkg/bin/echo-node" demo --device auto --steps 3 --workers 1 --json --dir "$dir" \
    >"$dir/summary.json" 2>"$dir/demo.log"
  if grep -rqs 'no usable CUDA device; running on the CPU' "$dir" \
    && grep -q '"steps"' "$dir/summary.json"; then
    say "fallback ok: $(grep -rhos 'no usable CUDA device; running on the CPU[^"]*error[^}]*' "$dir" | head -n 1)"
    rm -rf "$dir"
  else
    say "the packaged echo-node did not fall back to the CPU; logs in $dir"
    exit 1
  fi
fi
echo "$out/echo-swarm-gpu.tar.xz"
