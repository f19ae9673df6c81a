#!/usr/bin/env bash
# Fills third_party/cudarc/ (the workspace's `[patch.crates-io]` for cudarc) with upstream cudarc
# 0.19.10's source and build script, so that a `cuda` build opens the CUDA libraries at run time
# (docs/gpu.md, "One binary for CPU and GPU hosts"; third_party/cudarc/Cargo.toml says why).
# Idempotent; `scripts/cuda-env.sh` runs it. A CPU build does not need it.
#
# The crate comes through cargo itself (a throw-away manifest that depends on it, `cargo fetch`)
# and is checked against the checksum of the crates.io index that the lock file recorded before
# the patch. What it owns: third_party/cudarc/{src,build.rs,LICENSE-*} (git-ignored). What it must
# not touch: anything else in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.19.10
SHA256=7359bf1de037ddada72729c3acec9b040f3468400c6e9e740b01ba0cd2e89562
DEST=third_party/cudarc
STAMP=$DEST/.unpacked

log() { echo "cudarc-dynload: $*" >&2; }

grep -q "^version = \"$VERSION\"\$" "$DEST/Cargo.toml" \
  || { log "$DEST/Cargo.toml is not cudarc $VERSION: bump this script with it"; exit 1; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION $SHA256" ] && [ -f "$DEST/src/lib.rs" ]; then
  exit 0
fi

# 1) The published crate, through cargo (it downloads into and unpacks under CARGO_HOME).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
touch "$scratch/src/lib.rs"
cat >"$scratch/Cargo.toml" <<TOML
[package]
name = "fetch-cudarc"
version = "0.0.0"
edition = "2021"
[dependencies]
cudarc = { version = "=$VERSION", default-features = false, features = ["dynamic-loading"] }
TOML
cargo fetch --quiet --manifest-path "$scratch/Cargo.toml"
crate=$(ls "$cargo_home"/registry/cache/*/cudarc-"$VERSION".crate | head -n 1)
echo "$SHA256  $crate" | sha256sum --check --quiet - \
  || { log "checksum mismatch for $crate"; exit 1; }

# 2) Unpack source, build script and licences next to the committed manifest.
rm -rf "$DEST/src" "$DEST/build.rs" "$STAMP"
tar -xzf "$crate" -C "$scratch" "cudarc-$VERSION/src" "cudarc-$VERSION/build.rs" \
  "cudarc-$VERSION/LICENSE-MIT" "cudarc-$VERSION/LICENSE-APACHE"
cp -r "$scratch/cudarc-$VERSION/src" "$scratch/cudarc-$VERSION/build.rs" \
  "$scratch/cudarc-$VERSION/LICENSE-MIT" "$scratch/cudarc-$VERSION/LICENSE-APACHE" "$DEST/"

# 3) Two edits to build.rs, each of which must match exactly once: with both features on (the
#    manifest makes `dynamic-linking` imply `dynamic-loading`), do not panic, and emit no link
#    flags. The Rust source only ever asks for `dynamic-loading`, so it needs no edit.
python3 - "$DEST/build.rs" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
edits = [
    ('#[cfg(all(feature = "dynamic-loading", feature = "dynamic-linking"))]\n    panic!',
     '#[cfg(any())] // echo-swarm: dynamic-linking implies dynamic-loading\n    panic!'),
    ('#[cfg(feature = "dynamic-linking")]\n    dynamic_linking(major, minor);',
     '#[cfg(all(feature = "dynamic-linking", not(feature = "dynamic-loading")))]\n'
     '    dynamic_linking(major, minor);'),
]
for old, new in edits:
    if text.count(old) != 1:
        sys.exit(f"cudarc-dynload: build.rs no longer contains exactly one of:\n{old}")
    text = text.replace(old, new)
open(path, "w").write(text)
PY
echo "$VERSION $SHA256" >"$STAMP"
log "cudarc $VERSION unpacked into $DEST (run-time loading)"
