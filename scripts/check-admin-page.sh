#!/usr/bin/env bash
# The admin page in a real browser: starts `echo-node demo` (a learner and two workers on
# 127.0.0.1), waits until the learner has trained a few steps, then renders the learner's
# admin page (`GET /`) in headless Chromium and
#   - fails on any script error the page logs (an uncaught exception, a console error),
#   - fails unless the page rendered what it polls: the status line says "updated", and each of
#     the four time charts (reward, bubble ratio, T_bcast, rollout throughput) drew its line,
#   - writes a screenshot (default docs/img/admin-page.png).
# `--self-test` first renders a page with a deliberate script error and checks that it is caught
# (the check's positive control).
#
# Usage: scripts/check-admin-page.sh [--self-test] [SCREENSHOT.png]
# Needs: chromium (Debian: `apt-get install chromium`), a built echo-node (ECHO_NODE, default
# target/debug/echo-node or $CARGO_TARGET_DIR/debug/echo-node). Everything runs on 127.0.0.1 and
# stops by itself: the demo is bounded by --steps, and killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

self_test=0
if [ "${1:-}" = "--self-test" ]; then
  self_test=1
  shift
fi
shot="${1:-docs/img/admin-page.png}"
min_steps="${MIN_STEPS:-40}"
bin="${ECHO_NODE:-${CARGO_TARGET_DIR:-target}/debug/echo-node}"
chromium="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$chromium" ] || { echo "error: chromium is not installed (apt-get install chromium)" >&2; exit 2; }
[ -x "$bin" ] || { echo "error: $bin not found (cargo build -p echo-node, or set ECHO_NODE)" >&2; exit 2; }

work="$(mktemp -d)"
demo_pid=""
cleanup() {
  if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then
    kill "$demo_pid" 2>/dev/null || true
    wait "$demo_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# Headless Chromium on a URL: DOM on stdout, the page's console (and Chromium's log) in $2.
render() {
  local url="$1" log="$2"
  shift 2
  timeout 60 "$chromium" --headless=new --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$work/profile" --enable-logging=stderr --v=0 \
    --virtual-time-budget=6000 "$@" "$url" 2>"$log"
}

# Script errors the page logged: uncaught exceptions and console.error.
script_errors() {
  grep -E 'CONSOLE.*(Uncaught|Error|error)|:ERROR:CONSOLE' "$1" || true
}

if [ "$self_test" = 1 ]; then
  cat >"$work/broken.html" <<'EOF'
<!doctype html><html><body><script>"use strict"; undefinedFunction();</script></body></html>
EOF
  render "file://$work/broken.html" "$work/broken.log" --dump-dom >/dev/null || true
  if [ -z "$(script_errors "$work/broken.log")" ]; then
    echo "self-test FAILED: a deliberate script error was not caught; chromium's log:" >&2
    cat "$work/broken.log" >&2
    exit 1
  fi
  echo "self-test: a deliberate script error is caught"
fi

"$bin" demo --workers 2 --steps $((min_steps + 200)) --dir "$work/demo" >"$work/demo.log" 2>&1 &
demo_pid=$!

# The learner's admin address from its address file, then its steps from /status.
admin=""
for _ in $(seq 1 600); do
  if [ -f "$work/demo/learner/node.addr.json" ]; then
    admin="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$work/demo/learner/node.addr.json")"
    steps="$(curl -s "http://$admin/status" | python3 -c 'import json,sys
try: print((json.load(sys.stdin).get("learner") or {}).get("steps", 0))
except Exception: print(0)')"
    [ "${steps:-0}" -ge "$min_steps" ] && break
  fi
  kill -0 "$demo_pid" 2>/dev/null || { echo "error: the demo stopped:" >&2; tail -20 "$work/demo.log" >&2; exit 1; }
  sleep 1
done
[ -n "$admin" ] && [ "${steps:-0}" -ge "$min_steps" ] || { echo "error: the learner did not reach $min_steps steps" >&2; exit 1; }
url="http://$admin/"
echo "learner admin page at $url after $steps steps"

render "$url" "$work/page.log" --dump-dom >"$work/dom.html"
errors="$(script_errors "$work/page.log")"
if [ -n "$errors" ]; then
  echo "FAIL: the admin page logged script errors:" >&2
  echo "$errors" >&2
  exit 1
fi
grep -q 'id="state" class="ok"' "$work/dom.html" || { echo "FAIL: the page did not show a /status answer" >&2; exit 1; }
for chart in c_reward c_bubble c_tbcast c_rate; do
  python3 - "$work/dom.html" "$chart" <<'EOF' || { echo "FAIL: chart $chart drew no line" >&2; exit 1; }
import re, sys
dom, chart = open(sys.argv[1]).read(), sys.argv[2]
m = re.search(r'<svg[^>]*id="%s"[^>]*>(.*?)</svg>' % chart, dom, re.S)
sys.exit(0 if m and re.search(r'<path class="line" d="M[^"]+L', m.group(1)) else 1)
EOF
done
echo "the page rendered without script errors; its four time charts have lines"

mkdir -p "$(dirname "$shot")"
render "$url" "$work/shot.log" --window-size=1360,1500 --hide-scrollbars --screenshot="$work/shot.png" >/dev/null
cp "$work/shot.png" "$shot"
echo "screenshot: $shot"
