#!/usr/bin/env bash
# Everything a short loan of a GPU host should measure, in one command and one time budget:
# the smoke test (scripts/gpu-smoke.sh: CUDA generation and training, full and LoRA, and the
# demo swarm), then the broadcast sweep on the host's cores (`testnet broadcast`, chain mode,
# loopback). Runs from the unpacked archive of scripts/gpu-package.sh (docs/gpu.md, "The
# first GPU hour").
#
#   echo-swarm-gpu/scripts/gpu-session.sh [--out DIR] [--budget SECONDS] [--smoke SECONDS]
#                                         [--nodes 8,16,32,64] [--size-mb 64] [--rounds 2]
#                                         [--device cuda|cpu] [--quick] [--work DIR]
#
#   --out     where the results go (default ./gpu-session): session.log, gpu-smoke.json, the
#             smoke's logs (smoke-work.tgz) and broadcast-n<N>.json for every swarm size run;
#             small files only, so that it can be fetched back from a lent host
#   --work    the scratch directory: the smoke test's files and the swarms' node directories,
#             gigabytes for 64 nodes (default: a new directory under $TMPDIR or /tmp)
#   --budget  seconds for the whole session (default 540); the sweep takes what the smoke
#             test leaves and skips the sizes that no longer fit
#   --smoke   seconds for the smoke test (default 300; each check at most 150)
#   --device, --quick   passed to gpu-smoke.sh (`--device cpu --quick` rehearses the session on
#             a machine without a GPU)
#
# Exit status: the smoke test's (0 when every check passed). What it owns: DIR and a work
# directory under it.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
pkg=$(cd "$here/.." && pwd)
out=gpu-session budget=540 smoke=300 nodes=8,16,32,64 size=64 rounds=2 device=cuda quick=()
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --smoke) smoke=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --size-mb) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --work) work=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-session: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${work:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-session.XXXXXX")}
mkdir -p "$work"
exec > >(tee -a "$out/session.log") 2>&1
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
say() { echo "gpu-session [$(elapsed) s]: $*"; }

say "package: $(cat "$pkg/BUILD" 2>/dev/null || echo 'no BUILD file')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
say "cores: $(nproc); memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"

# 1. The smoke test, under its own limit.
timeout "$smoke" "$here/gpu-smoke.sh" --device "$device" ${quick[@]+"${quick[@]}"} --timeout 150 \
  --bin-dir "$pkg/bin" --work "$work/smoke" --out "$out/gpu-smoke.json"
smoke_rc=$?
say "smoke test exit $smoke_rc"
tar -C "$work" -czf "$out/smoke-work.tgz" smoke 2>/dev/null

# 2. The broadcast sweep: one swarm size after another while the budget lasts (a size is
#    started only with at least 30 s left, and stopped at the budget).
if [ -x "$pkg/bin/testnet" ]; then
  for n in ${nodes//,/ }; do
    left=$((budget - $(elapsed) - 10))
    if [ "$left" -lt 30 ]; then
      say "no time left for N=$n"
      break
    fi
    timeout "$left" "$pkg/bin/testnet" broadcast --nodes "$n" --size-mb "$size" \
      --rounds "$rounds" --mode chain --bin "$pkg/bin/echo-node" --out "$work/bcast-n$n" \
      --json >"$work/bcast-n$n.stdout" 2>"$work/bcast-n$n.log"
    rc=$?
    cp "$work/bcast-n$n/broadcast.json" "$out/broadcast-n$n.json" 2>/dev/null
    say "broadcast N=$n exit $rc"
    tail -n 3 "$work/bcast-n$n.log"
  done
else
  say "no testnet binary in the package: sweep skipped"
fi
say "done"
exit "$smoke_rc"
