#!/usr/bin/env bash
# The CPU learning check of mixed precision (issue 47, item 4): the demo trained with f16
# compute against f32, RUNS runs each (default 3), one at a time, niced. Prints one JSON line
# per run and a summary: each precision's final rewards, their mean and spread (min..max).
# The f16 path learns like f32 when the two ranges overlap (`docs/learner.md`, "Precision").
#
#   scripts/precision-demo.sh [--runs 3] [--steps 200] [--bin target/release/echo-node]
# Takes ~2-3 min a run on an idle 2-core host.
set -euo pipefail
runs=3 steps=200 bin=""
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  cargo build --release -p echo-node >&2
  bin="${CARGO_TARGET_DIR:-target}/release/echo-node"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for p in f32 f16; do
  for r in $(seq 1 "$runs"); do
    nice -n 10 "$bin" demo --steps "$steps" --precision "$p" --json | tail -n 1 | tee "$out/$p.$r.json"
  done
done
python3 - "$out" "$runs" <<'PY'
import json, sys, glob
out, runs = sys.argv[1], int(sys.argv[2])
summary = {}
for p in ("f32", "f16"):
    rs = []
    for f in sorted(glob.glob(f"{out}/{p}.*.json")):
        r = json.load(open(f))
        rs.append(r.get("reward_last"))
    vals = [v for v in rs if isinstance(v, (int, float))]
    summary[p] = {"rewards": rs, "mean": sum(vals) / len(vals) if vals else None,
                  "min": min(vals) if vals else None, "max": max(vals) if vals else None}
a, b = summary["f32"], summary["f16"]
summary["ranges_overlap"] = None if None in (a["min"], b["min"]) else not (b["max"] < a["min"] or a["max"] < b["min"])
print(json.dumps(summary))
PY
