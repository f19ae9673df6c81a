#!/usr/bin/env bash
# The learning curve of `echo-node demo --task kuhn-poker` for one seed, as one JSON file:
# the demo's summary, the warm start's measured time, and per evaluated version the exact EV
# against `always-bet`, its best response (+1/3), exploitability, illegal mass (and the
# sampled EV beside it when the illegal mass is high) and the learner's wall time at that
# step. Run it on an idle host (the figures in docs/environments.md are 2-core runs); it
# takes MINUTES of RL plus the warm start.
#
#   scripts/kuhn-curve.sh SEED [MINUTES] [OUT.json] [extra `echo-node demo` flags...]
#   scripts/kuhn-curve.sh 1 10 docs/results/kuhn-curve-seed1.json
#
# ECHO_NODE (default target/release/echo-node, else target/debug/echo-node) picks the binary;
# build it first (`cargo build --release -p echo-node`). The demo's folder is kept in
# OUT.json's directory as kuhn-curve-seed<SEED>.d (configs, stores, logs).
set -euo pipefail

seed=${1:?usage: scripts/kuhn-curve.sh SEED [MINUTES] [OUT.json] [demo flags...]}
minutes=${2:-10}
out=${3:-kuhn-curve-seed${seed}.json}
shift $(( $# < 3 ? $# : 3 ))

bin=${ECHO_NODE:-}
if [[ -z $bin ]]; then
  for b in target/release/echo-node target/debug/echo-node; do
    [[ -x $b ]] && bin=$b && break
  done
fi
[[ -n $bin && -x $bin ]] || { echo "no echo-node binary (set ECHO_NODE)" >&2; exit 1; }

dir=$(dirname "$out")/kuhn-curve-seed${seed}.d
rm -rf "$dir"
mkdir -p "$dir"
summary=$dir/summary.json
start=$(date +%s)
# --steps is a ceiling: the run ends after MINUTES of RL.
"$bin" demo --task kuhn-poker --seed "$seed" --minutes "$minutes" --steps 100000 \
  --json --dir "$dir" "$@" > "$summary"
end=$(date +%s)

python3 - "$dir" "$summary" "$out" "$seed" "$minutes" "$((end - start))" <<'EOF'
import json, os, sys
d, summary, out, seed, minutes, wall = sys.argv[1:]
steps = {}
with open(os.path.join(d, "learner/metrics/steps.jsonl")) as f:
    for line in f:
        if line.strip():
            s = json.loads(line)
            steps[s["step"]] = s["t"]
curve = []
with open(os.path.join(d, "learner/metrics/eval.jsonl")) as f:
    for line in f:
        if line.strip():
            e = json.loads(line)
            e["t_rl_s"] = steps.get(e["version"], 0.0)
            curve.append(e)
warm = None
with open(os.path.join(d, "learner/node.log"), errors="replace") as f:
    for line in f:
        if "warm start done" in line:
            warm = line.strip()
best = curve[-1]["best_response"] if curve else None
hit = next((e for e in curve if e["illegal_mass"] <= 0.05 and best is not None
            and e["ev"] >= best - 0.05), None)
res = {
    "seed": int(seed), "minutes_rl": float(minutes), "wall_s": int(wall),
    "host": {"nproc": os.cpu_count(), "loadavg": os.getloadavg()},
    "summary": json.load(open(summary)),
    "warm_start_log": warm,
    "target": {"illegal_mass_max": 0.05, "ev_within": 0.05, "best_response": best,
               "reached_at": hit},
    "curve": curve,
}
json.dump(res, open(out, "w"), indent=1)
last = curve[-1] if curve else {}
print(json.dumps({"out": out, "versions": len(curve), "ev_last": last.get("ev"),
                  "illegal_mass_last": last.get("illegal_mass"),
                  "reached_target": hit is not None, "wall_s": int(wall)}))
EOF
