#!/usr/bin/env bash
# Installs the CUDA 13.0 toolchain that the `cuda` feature builds against, without a GPU, root or
# a system CUDA: NVIDIA's wheels from PyPI, unpacked into a cache directory outside the repository.
# Idempotent: a complete install (marked by a stamp file naming the pinned wheels) is left as is.
#
#   scripts/cuda-install.sh            # installs into ${ECHO_CUDA_HOME:-~/.cache/echo-swarm-cuda}
#
# What it owns: the cache directory. What it must not touch: the repository, the system, cargo.
# Prints the toolkit root (what CUDA_ROOT must name) on its last line of stdout.
set -euo pipefail

# Pinned to CUDA 13.0: the rented H100/H200 hosts run driver 580, which is CUDA 13.0, and a driver
# refuses PTX written by a newer nvcc (13.1 writes a PTX ISA the 580 driver cannot JIT). Bump these
# together, and only when the hosts' driver moves.
WHEELS=(
  nvidia-cuda-nvcc==13.0.88     # nvcc, ptxas, the host-side headers
  nvidia-cuda-crt==13.0.88      # crt/ headers nvcc includes
  nvidia-nvvm==13.0.88          # cicc, libnvvm (nvcc's device front end)
  nvidia-cuda-runtime==13.0.96  # cudart, cuda.h and the runtime headers
  nvidia-cuda-cccl==13.0.85     # thrust/cub/libcu++ headers the kernels include
  nvidia-cuda-nvrtc==13.0.88    # run-time compilation (cudarc links it)
  nvidia-cublas==13.1.0.3       # cuBLAS and cuBLASLt 13 (the matmuls)
  nvidia-curand==10.4.0.35      # cuRAND 10 (random tensors on the device)
)

ECHO_CUDA_HOME=${ECHO_CUDA_HOME:-$HOME/.cache/echo-swarm-cuda}
BASE=$ECHO_CUDA_HOME/cuda-13.0
PREFIX=$BASE/prefix
CU=$PREFIX/nvidia/cu13            # the wheels unpack to nvidia/cu13/{bin,include,lib,nvvm}
STAMP=$BASE/installed

log() { echo "cuda-install: $*" >&2; }

# The CUDA runtime as a static library under the name the linker looks for (`-lcudart`).
# candle-kernels links its MoE kernels against cudart; linked statically, the binary records
# no CUDA library as NEEDED and starts on a host without one (cudart's static build opens the
# driver itself, when first called). `cuda-env.sh` puts this directory on LIBRARY_PATH, and
# nothing else of the toolkit, so the linker cannot pick the shared libcudart instead.
static_cudart() {
  mkdir -p "$CU/lib/static"
  ln -sf ../libcudart_static.a "$CU/lib/static/libcudart.a"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${WHEELS[*]}" ] && [ -x "$CU/bin/nvcc" ] \
  && [ -f "$CU/lib/stubs/libcuda.so" ]; then
  static_cudart
  log "toolchain present in $CU"
  echo "$CU"
  exit 0
fi

for tool in python3 gcc readelf; do
  command -v "$tool" >/dev/null || { log "needs $tool on PATH"; exit 1; }
done

# 1) Download and unpack (about 650 MB of wheels, 1.2 GB unpacked). A partial earlier attempt is
#    discarded: the stamp is written last, so its absence means nothing here can be trusted.
rm -rf "$BASE"
mkdir -p "$BASE/wheels" "$PREFIX"
log "downloading ${#WHEELS[@]} wheels from PyPI"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$BASE/wheels" "${WHEELS[@]}"
for w in "$BASE"/wheels/*.whl; do python3 -m zipfile -e "$w" "$PREFIX"; done
rm -rf "$BASE/wheels"
# A wheel is a zip file: unpacking drops the executable bits.
chmod +x "$CU"/bin/* "$CU"/nvvm/bin/*

# 2) The wheels ship only versioned libraries (libcublas.so.13); the linker's `-lcublas` wants the
#    unversioned name. The binary still records the SONAME (libcublas.so.13).
(
  cd "$CU/lib"
  for lib in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnvrtc.so.13 libcurand.so.10; do
    [ -e "$lib" ] || { log "missing $lib in $CU/lib"; exit 1; }
    ln -sf "$lib" "${lib%.so.*}.so"
  done
)

# 3) The driver library (libcuda) comes with the NVIDIA driver, not with any wheel, and there is no
#    driver here. The link only needs a library that defines the driver API's symbols under the
#    driver's SONAME (libcuda.so.1), so that the binary records a dependency on the real driver
#    and binds to it at run time. The symbol list comes from this toolkit's own cuda.h after the
#    preprocessor (which maps cuMemAlloc to cuMemAlloc_v2 etc., exactly as the real library exports
#    them). This stub must never be on LD_LIBRARY_PATH of a running node: every call returns an
#    error.
mkdir -p "$CU/lib/stubs"
gcc -E -P -I "$CU/include" "$CU/include/cuda.h" \
  | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u \
  | sed 's/.*/int &(void) { return 999; }/' >"$BASE/libcuda_stub.c"
gcc -shared -fPIC -fno-builtin -w -o "$CU/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 \
  "$BASE/libcuda_stub.c"
log "driver stub: $(grep -c . "$BASE/libcuda_stub.c") symbols, $(readelf -d "$CU/lib/stubs/libcuda.so" | grep -o 'SONAME.*')"

static_cudart

"$CU/bin/nvcc" --version | grep -q 'release 13.0' || { log "nvcc is not CUDA 13.0"; exit 1; }
echo "${WHEELS[*]}" >"$STAMP"
log "installed in $CU"
echo "$CU"
