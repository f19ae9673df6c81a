#!/usr/bin/env bash
# The demo on external environments (docs/environments.md, "External environments"):
# installs reasoning-gym and TextArena from PyPI into a venv under /tmp (not in CI), then runs
# `echo-node demo` on one reasoning-gym dataset and one TextArena game, writing each run's
# JSON summary to docs/results/.
#
#   scripts/external-env-demo.sh [minutes per run, default 6]
#
# Environment: VENV (default /tmp/echo-envs-venv), ECHO_NODE (default: the release build of
# `cargo build --release -p echo-node`), OUT (default docs/results), KEEP (a folder: keep each
# run's configs, stores, logs and metrics under KEEP/reasoning-gym and KEEP/textarena, e.g. to
# read the learner's metrics/steps.jsonl), ONLY (`reasoning-gym` or `textarena`: that run only).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${1:-6}"
VENV="${VENV:-/tmp/echo-envs-venv}"
OUT="${OUT:-docs/results}"
DAY="$(date -u +%Y-%m-%d)"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q "reasoning-gym==0.1.25" "textarena==0.7.4"
export ECHO_ENV_PYTHON="$VENV/bin/python"
if [ -n "${ECHO_NODE:-}" ]; then
    node=($ECHO_NODE)
else
    cargo build --release -p echo-node
    node=("${CARGO_TARGET_DIR:-target}/release/echo-node")
fi
mkdir -p "$OUT"
keep() { if [ -n "${KEEP:-}" ]; then echo --dir "$KEEP/$1"; fi; }

# reasoning-gym: one-digit additions, the whole completion is the answer, scored by the
# dataset's own score_answer (1 for the exact answer, partial credit for a completion that
# contains it). A warm start of 200 steps: after the default 60 the embedded model answers
# "Calculate a + b." with unrelated digit strings (1.8 % exact) and RL does not rise
# (docs/environments.md, "Measurements" of "External environments").
if [ "${ONLY:-reasoning-gym}" = reasoning-gym ]; then
"${node[@]}" demo --json --minutes "$MINUTES" --workers 2 --warm-start-steps 200 $(keep reasoning-gym) \
    --task external:reasoning-gym:basic_arithmetic \
    --task-params '{"config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                    "operators": ["+"], "allow_parentheses": false, "allow_negation": false},
                    "system_prompt": ""}' \
    | tee "$OUT/external-reasoning-gym-$DAY.json"
fi

# TextArena: three rounds of rock-paper-scissors against an opponent that always plays rock
# (the best response: paper every round); observations cut to their last 60 characters so
# that an episode fits the embedded model's 256-token context.
if [ "${ONLY:-textarena}" = textarena ]; then
"${node[@]}" demo --json --minutes "$MINUTES" --workers 2 --warm-start-steps 200 $(keep textarena) \
    --task external:textarena:IteratedRockPaperScissors-v0 \
    --task-params '{"env_kwargs": {"num_rounds": 3}, "agent_seat": 0, "opponent": ["[rock]"],
                    "reference": ["[rock]", "[paper]", "[scissors]"], "max_turns": 4,
                    "tokens_per_turn": 12, "max_observation_chars": 60}' \
    | tee "$OUT/external-textarena-$DAY.json"
fi
