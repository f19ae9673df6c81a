"""The echo-swarm environment protocol, version 1, for Python programs (stdlib only).

An environment program reads one JSON request per line on stdin and writes one JSON reply
per line on stdout (docs/environments.md, "External environments"). This module does the
framing: `serve(make_env)` answers `hello`, `reset`, `step`, `truncate` and `reference`
with the methods of the object `make_env(params)` returns:

    metadata() -> dict         description, num_initial_states, max_turns, return_range,
                               suggested_tokens_per_turn, system_prompt, version
    reset(seed) -> str         the first observation of initial state `seed`
    step(action) -> (observation or None, reward, done)
    truncate() -> float        reward of an episode a budget ends (optional, default 0)
    reference(seed) -> str|None  a legal action for scripted play (optional)

Everything a library prints goes to stderr: the protocol owns the real stdout.
"""

import json
import os
import sys

PROTOCOL = 1
# The protocol's output stream once `serve` runs (tests write raw bytes to it).
RAW = None


def _out():
    # The protocol's stream is a private duplicate of fd 1; fd 1 itself (and sys.stdout)
    # becomes stderr, so a library that prints cannot corrupt a reply.
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", newline="\n")


def serve(make_env):
    global RAW
    out = RAW = _out()
    env = None

    def reply(obj):
        out.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")
        out.flush()

    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "hello":
                if req.get("protocol") != PROTOCOL:
                    reply({"ok": False, "error": "protocol %r, this program speaks %d" % (req.get("protocol"), PROTOCOL)})
                    continue
                env = make_env(req.get("params") or {})
                meta = dict(env.metadata())
                meta.update({"ok": True, "protocol": PROTOCOL})
                reply(meta)
            elif env is None:
                reply({"ok": False, "error": "no hello yet"})
            elif op == "reset":
                reply({"ok": True, "observation": env.reset(int(req["seed"]))})
            elif op == "step":
                obs, reward, done = env.step(str(req["action"]))
                r = {"ok": True, "reward": float(reward), "done": bool(done)}
                if not done:
                    r["observation"] = obs
                reply(r)
            elif op == "truncate":
                f = getattr(env, "truncate", None)
                reply({"ok": True, "reward": float(f()) if f else 0.0})
            elif op == "reference":
                f = getattr(env, "reference", None)
                reply({"ok": True, "action": f(int(req["seed"])) if f else None})
            else:
                reply({"ok": False, "error": "unknown op %r" % op})
        except Exception as e:  # a refusal, not a crash: the node abandons the episode
            reply({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
