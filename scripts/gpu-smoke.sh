#!/usr/bin/env bash
# The first GPU hour in one command: runs the ordered checks of docs/gpu.md ("GPU smoke test")
# with the packaged binaries and writes one JSON summary.
#
#   scripts/gpu-smoke.sh [--bin-dir DIR] [--device cuda|cuda:N|cpu] [--out FILE] [--quick]
#                        [--timeout SECONDS] [--work DIR]
#
#   --bin-dir   where echo-node, gen_bench and train_step are (default: ../bin beside this
#               script, as scripts/gpu-package.sh lays them out, else target/release)
#   --device    cuda (default) or cpu: the same checks with CPU numbers
#   --quick     CPU-sized checks: the `small` shape instead of Qwen3-0.6B, short generations,
#               a 5-step demo (what the CPU run of the tests uses)
#   --out       the JSON summary (default gpu-smoke.json in the current directory)
#
# Checks, in order (each with its time, its figures and ok / not ok; a failed check does not
# stop the later ones): 1 device and driver, 2 tiny model f32 generation (log-prob spread
# against the learner's forward ≤ 1e-4), 3 tiny model half precision (bf16 on a GPU, f16 on
# the CPU, warm-started) with and without the f32 head, 4 a small learner step, 5 the
# Qwen3-0.6B generation benchmark at batch 1/16/64 (5b the rule's device kernel against the
# CPU rule, 5c 16 groups x 16 samples in flight, 5d on a GPU 16 x 8,192 new tokens and the
# Qwen3-8B shape), 6 a Qwen3-0.6B learner step and its peak
# memory (on a GPU within the memory model's count), full and LoRA (rank 8, a bf16 base on a
# GPU), 7 `echo-node demo` for 20 steps with no strike and no ban, full and LoRA. Exit status
# 0 when every check is ok.
#
# Needs bash, python3 (reads and writes the JSON) and coreutils `timeout`; on a GPU host
# nvidia-smi (driver and peak memory) and the CUDA libraries scripts/run-on-gpu.sh finds.
# What it owns: the work directory (logs of every check) and the summary file.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin_dir=""
device=cuda
out=gpu-smoke.json
quick=0
limit=600
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --timeout) limit=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu-smoke: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin_dir" ]; then
  for d in "$here/../bin" "$here/../target/release"; do
    [ -x "$d/echo-node" ] && { bin_dir=$d; break; }
  done
fi
for b in echo-node gen_bench train_step; do
  [ -x "$bin_dir/$b" ] || { echo "gpu-smoke: no executable $b in '${bin_dir}' (--bin-dir)" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "gpu-smoke: needs python3" >&2; exit 2; }
work=${work:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-smoke.XXXXXX")}
mkdir -p "$work"
say() { echo "gpu-smoke: $*" >&2; }

gpu=0
case "$device" in cuda*) gpu=1 ;; cpu) ;; *) say "--device cuda, cuda:N or cpu"; exit 2 ;; esac
# On a GPU host every binary runs through run-on-gpu.sh (driver and CUDA libraries on
# LD_LIBRARY_PATH: the binaries open them at run time).
run() {
  local b=$1; shift
  if [ "$gpu" = 1 ]; then "$here/run-on-gpu.sh" "$bin_dir/$b" "$@"; else "$bin_dir/$b" "$@"; fi
}

# Sizes: the GPU figures of docs/gpu.md, or CPU-sized ones with --quick.
if [ "$quick" = 1 ]; then
  big=small batches=1,4 new=8 t_groups=2 t_n=4 t_prompt=16 t_resp=32 t_micro=4096 demo_steps=5
  half_batch=1,4
  # Groups in flight (groups x samples x new tokens, bucket) and the rule kernel's rows.
  g_groups=4 g_n=2 g_new=8 g_batch=8 rule_rows=20000
else
  # Passes of 1024 tokens: the memory model counts ≈ 35 GB for the 0.6B learner with a KL
  # reference (the default 4096 does not fit one GPU; docs/gpu.md, "Learner memory").
  big=qwen3-0.6b batches=1,16,64 new=256 t_groups=4 t_n=8 t_prompt=64 t_resp=256 t_micro=1024
  demo_steps=20 half_batch=1,16
  # 16 groups x 16 samples x 512 new tokens in one bucket of 256 (issue 46).
  g_groups=16 g_n=16 g_new=512 g_batch=256 rule_rows=100000
fi
if [ "$gpu" = 1 ]; then half=bf16; else half=f16; fi

# `check NAME CMD...`: runs CMD under the time limit, keeps its log, takes its last JSON line
# as the result; records ok / not ok, seconds and the result in $work/NAME.check.json.
checks=()
check() {
  local name=$1; shift
  local log="$work/$name.log" t0 rc
  say "[$((${#checks[@]} + 1))] $name"
  t0=$(date +%s.%N)
  # The command may be one of this script's functions: run it in a child bash (the functions
  # and their variables are exported below), in timeout's process group so that a timeout
  # stops the binaries too.
  timeout "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
  rc=$?
  python3 - "$name" "$rc" "$t0" "$(date +%s.%N)" "$log" >"$work/$name.check.json" <<'PY'
import json, sys
name, rc, t0, t1, log = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
lines = open(log, errors="replace").read().splitlines()
result = None
for line in reversed(lines):
    if line.startswith("{"):
        try:
            result = json.loads(line)
            break
        except ValueError:
            pass
entry = {"name": name, "exit": rc, "secs": round(t1 - t0, 3), "result": result}
if rc != 0 or result is None:
    entry["log_tail"] = lines[-15:]
print(json.dumps(entry))
PY
  checks+=("$name")
}

# A check's verdict beyond its exit status: `judge NAME PYTHON-EXPR` over `r` (the result).
judge() {
  local f="$work/$1.check.json"
  python3 - "$f" "$2" <<'PY'
import json, sys
path, expr = sys.argv[1], sys.argv[2]
e = json.load(open(path))
r = e.get("result") or {}
try:
    ok = e["exit"] == 0 and e.get("result") is not None and bool(eval(expr, {}, {"r": r}))
except Exception as err:  # a missing figure is a failed check
    ok, e["judge_error"] = False, repr(err)
e["ok"], e["expect"] = ok, expr
json.dump(e, open(path, "w"))
PY
}

export here bin_dir device gpu work big t_groups t_n t_prompt t_resp t_micro
export -f run

# 1. Device and driver: what nvidia-smi reports, which libraries run-on-gpu.sh finds, and the
#    device the binaries open (a one-token generation).
device_probe() {
  if [ "$gpu" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader || true
    "$here/run-on-gpu.sh" --check "$bin_dir/echo-node" || true
  fi
  run gen_bench --device "$device" --shape tiny --batch 1 --new-tokens 2 --paths infer \
    --check-samples 0 --json
}
export -f device_probe
check device device_probe
judge device "r['device'] == ('cuda' if $gpu else 'cpu')"

# 2. Tiny model, f32: the inference path against the learner's forward.
check generate_tiny_f32 run gen_bench --device "$device" --shape tiny --dtype f32 --batch 1,8 \
  --new-tokens 32 --json
judge generate_tiny_f32 "r['logprob_spread']['max_abs'] <= 1e-4"

# 3. Tiny model, half precision, warm-started (peaked distributions): the spread a
#    learner-side check must allow, with the default f32 head and without it.
for head in true false; do
  check "generate_tiny_${half}_f32_head_${head}" run gen_bench --device "$device" --shape tiny \
    --dtype "$half" --f32-head "$head" --warm-start 60 --batch "$half_batch" --new-tokens 32 --json
  judge "generate_tiny_${half}_f32_head_${head}" "r['logprob_spread']['max_abs'] < 1"
done

# 4. A small learner step (forward, backward, AdamW).
check train_tiny run train_step --device "$device" --shape tiny --groups 4 --group-size 8 \
  --prompt-len 16 --response-len 32 --steps 2
judge train_tiny "r['step_ms_median'] > 0"

# 5. The generation benchmark (Qwen3-0.6B shape; `small` with --quick).
check "generate_${big}" run gen_bench --device "$device" --shape "$big" --batch "$batches" \
  --new-tokens "$new" --paths infer --check-samples 4 --json
judge "generate_${big}" "len(r['throughput']) == len('$batches'.split(','))"

# 5b. The canonical rule's kernel (rule_device: NVRTC, a block per row, 8 bytes per row back)
#     against the CPU rule on random bf16 rows; with --device cpu its CPU emulation.
check rule_device run gen_bench --device "$device" --shape tiny --batch 1 --new-tokens 2 \
  --paths none --check-samples 0 --rule-check "$rule_rows" --json
judge rule_device "r['rule_check']['ok'] and r['rule_check']['rows'] >= $rule_rows and r['rule_check']['on_device'] == bool($gpu)"

# 5c. Groups in flight: the samples of several groups decoded in one static-buffer bucket with
#     continuous batching (infer::batch), each prompt prefilled once; the same step_ms split.
check "generate_${big}_groups" run gen_bench --device "$device" --shape "$big" --paths none \
  --groups "$g_groups" --group-size "$g_n" --new-tokens "$g_new" --max-batch "$g_batch" \
  --check-samples 4 --json
judge "generate_${big}_groups" "r['groups_in_flight']['tokens'] == $g_groups * $g_n * $g_new"

# 5d. On a GPU: the paper's long responses (one group of 16 x 8,192 new tokens, 0.6B shape) and
#     the Qwen3-8B shape (batch 1 and 64, and 4 groups of 16 in flight), bf16.
if [ "$gpu" = 1 ]; then
  check generate_qwen3-0.6b_long run gen_bench --device "$device" --shape qwen3-0.6b --paths none \
    --groups 1 --group-size 16 --new-tokens 8192 --max-batch 16 --check-samples 1 --json
  judge generate_qwen3-0.6b_long "r['groups_in_flight']['tokens'] == 16 * 8192"
  check generate_qwen3-8b run gen_bench --device "$device" --shape qwen3-8b --batch 1,64 \
    --new-tokens 128 --paths infer --groups 4 --group-size 16 --max-batch 64 --check-samples 1 --json
  judge generate_qwen3-8b "len(r['throughput']) == 2 and r['groups_in_flight']['tokens'] == 64 * 128"
fi

# 6. A learner step of the same shape and its peak memory: sampled from nvidia-smi every 100
#    ms on a GPU, the process's peak resident memory on the CPU. Then the same step training
#    LoRA adapters (rank 8, all seven projections) on a frozen base, which a GPU holds in bf16
#    (`policy::lora::frozen_base_dtype`): the path `frozen_linear`'s CUDA forward runs.
train_big() {
  local name=$1 poll=""
  shift
  if [ "$gpu" = 1 ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 \
      >"$work/$name.memory.csv" 2>/dev/null &
    poll=$!
  fi
  run train_step --device "$device" --shape "$big" --groups "$t_groups" --group-size "$t_n" \
    --prompt-len "$t_prompt" --response-len "$t_resp" --micro-batch-tokens "$t_micro" --steps 2 \
    --kl "$@"
  local rc=$?
  if [ -n "$poll" ]; then
    kill "$poll" 2>/dev/null
    wait "$poll" 2>/dev/null
    # One more JSON line: the peak the poller saw, in bytes (nvidia-smi reports MiB).
    python3 -c 'import json,sys; v=[int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]; print(json.dumps({"device_peak_used_bytes": max(v)*2**20 if v else None}))' \
      "$work/$name.memory.csv"
  fi
  return $rc
}
export -f train_big
for variant in "" lora; do
  name="train_${big}${variant:+_$variant}"
  extra=()
  [ "$variant" = lora ] && extra=(--lora-rank 8)
  check "$name" train_big "$name" ${extra[@]+"${extra[@]}"}
  if [ "$gpu" = 1 ]; then
    # The result is the poller's line; the step's own JSON is the line before it in the log.
    python3 - "$work/$name.check.json" "$work/$name.log" <<'PY'
import json, sys
path, log = sys.argv[1], sys.argv[2]
e = json.load(open(path))
objs = [json.loads(l) for l in open(log, errors="replace") if l.startswith("{")]
merged = {}
for o in objs:
    merged.update(o)
e["result"] = merged or None
json.dump(e, open(path, "w"))
PY
  fi
  # On a GPU the device's peak must stay within what the start-up refusal counts for these
  # passes (`predicted_bytes`, the worst case of one sequence filling a pass): more would make
  # the refusal unsafe. `predicted_bytes_at_len` is the count for the passes really run.
  judge "$name" "r['step_ms_median'] > 0 and (r.get('device_peak_used_bytes') is None or r['device_peak_used_bytes'] <= r['predicted_bytes'])"
done

# 6b. Mixed precision and recomputed activations (issue 47): the same 0.6B step computing in
#     bf16 (f16 on the CPU), then the paper's shapes at an 8,192-token response in one pass —
#     Qwen3-4B full fine-tuning and Qwen3-8B LoRA r = 16 on a bf16 base, both recomputing with
#     attention in chunks of 1,024 queries. Each JSON has tokens_per_s, mfu (6·P a token for
#     full, 4·P for LoRA, over 989.4 TFLOP/s bf16 on CUDA) and, on a GPU, the device's peak.
#     With --quick (the CPU rehearsal) the small shape runs the f16 and recomputed paths.
if [ "$quick" = 1 ]; then
  mp_checks=("train_${big}_half:--precision $half"
    "train_${big}_half_recompute:--precision $half --recompute --query-chunk 8")
else
  mp_checks=("train_${big}_half:--precision $half"
    "train_qwen3-4b_recompute:--shape qwen3-4b --groups 1 --group-size 1 --prompt-len 256 --response-len 8192 --micro-batch-tokens 0 --precision $half --recompute"
    "train_qwen3-8b_lora16_recompute:--shape qwen3-8b --groups 1 --group-size 1 --prompt-len 256 --response-len 8192 --micro-batch-tokens 0 --precision $half --recompute --lora-rank 16")
fi
for entry in "${mp_checks[@]}"; do
  name=${entry%%:*}
  # shellcheck disable=SC2206
  extra=(${entry#*:})
  check "$name" train_big "$name" "${extra[@]}"
  if [ "$gpu" = 1 ]; then
    python3 - "$work/$name.check.json" "$work/$name.log" <<'PY'
import json, sys
path, log = sys.argv[1], sys.argv[2]
e = json.load(open(path))
merged = {}
for l in open(log, errors="replace"):
    if l.startswith("{"):
        merged.update(json.loads(l))
e["result"] = merged or None
json.dump(e, open(path, "w"))
PY
  fi
  judge "$name" "r['step_ms_median'] > 0 and (r.get('device_peak_used_bytes') is None or r['device_peak_used_bytes'] <= r['predicted_bytes'])"
done

# 7. The demo swarm on this device: training runs, and no honest worker is struck or banned;
#    then the same with LoRA (rank 8): adapter versions over the chains, installed by workers.
check demo run echo-node demo --device "$device" --steps "$demo_steps" --json
judge demo "r['steps'] >= $demo_steps and r['strikes'] == 0 and r['bans'] == 0"
check demo_lora run echo-node demo --device "$device" --steps "$demo_steps" --lora-rank 8 --json
judge demo_lora "r['steps'] >= $demo_steps and r['strikes'] == 0 and r['bans'] == 0 and r['lora_rank'] == 8"

# The summary: every check in order, and whether all passed. It names what was measured: the
# node's `--version` line (package version and features) and the package's BUILD line (commit,
# uncommitted changes, build time) when the binaries came from scripts/gpu-package.sh.
version=$(run echo-node --version 2>/dev/null | head -n 1)
build=""
[ -f "$bin_dir/../BUILD" ] && build=$(head -n 1 "$bin_dir/../BUILD")
python3 - "$out" "$device" "$quick" "$bin_dir" "$work" "$version" "$build" "${checks[@]}" <<'PY'
import json, os, platform, sys, time
out, device, quick, bin_dir, work, version, build = sys.argv[1:8]
quick, names = quick == "1", sys.argv[8:]
checks = [json.load(open(os.path.join(work, n + ".check.json"))) for n in names]
summary = {
    "echo_swarm_gpu_smoke": 1,
    "time_unix": int(time.time()),
    "host": platform.node(),
    "version": version or None,
    "build": build or None,
    "device": device,
    "quick": quick,
    "bin_dir": os.path.abspath(bin_dir),
    "logs": os.path.abspath(work),
    "ok": all(c.get("ok") for c in checks),
    "checks": checks,
}
with open(out, "w") as f:
    json.dump(summary, f, indent=1)
for c in checks:
    print(f"{'ok ' if c.get('ok') else 'NOT'} {c['name']:<32} {c['secs']:8.1f} s", file=sys.stderr)
print(f"summary: {out} ({'all ok' if summary['ok'] else 'FAILED'})", file=sys.stderr)
sys.exit(0 if summary["ok"] else 1)
PY
