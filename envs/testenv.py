"""A stdlib-only environment for echo-swarm's tests (docs/environments.md).

The game: initial state `seed` fixes `turns` digits; turn k shows "turn k: say D" and the
agent earns 1/turns for answering D. Params: `turns` (default 3), `fault` (what goes wrong
at turn `fault_turn`, default 2; only for seeds where seed % fault_every == 0, default 1):

    none | crash | hang | garbage | huge | nan | out_of_range | refuse | alloc |
    nondeterministic

`probe_port`: the first observation says whether 127.0.0.1:probe_port could be reached
("net: open" or "net: closed"), to test the sandbox.
"""

import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import echo_env  # noqa: E402


class Digits:
    def __init__(self, params):
        self.turns = int(params.get("turns", 3))
        self.fault = params.get("fault", "none")
        self.fault_turn = int(params.get("fault_turn", 2))
        self.fault_every = int(params.get("fault_every", 1))
        self.probe_port = params.get("probe_port")
        self.digits = []
        self.k = 0
        self.seed = 0
        # A per-process salt: only the non-deterministic fault reads it.
        self.salt = random.SystemRandom().randrange(10)

    def metadata(self):
        return {
            "description": "say the digits shown, one per turn",
            "num_initial_states": None,
            "max_turns": self.turns,
            "return_range": [0.0, 1.0],
            "suggested_tokens_per_turn": 8,
            "system_prompt": "Answer with the digit only.",
            "version": "testenv 1",
        }

    def _digits(self, seed):
        rng = random.Random(seed)
        d = [rng.randrange(10) for _ in range(self.turns)]
        if self.fault == "nondeterministic":
            d[0] = (d[0] + self.salt) % 10
        return d

    def _obs(self):
        return "turn %d: say %d" % (self.k + 1, self.digits[self.k])

    def reset(self, seed):
        self.seed, self.k = seed, 0
        self.digits = self._digits(seed)
        if self.probe_port is not None:
            try:
                socket.create_connection(("127.0.0.1", int(self.probe_port)), timeout=2).close()
                return "net: open"
            except OSError:
                return "net: closed"
        return self._obs()

    def _faulty(self):
        return (self.fault != "none" and self.k + 1 == self.fault_turn
                and self.seed % self.fault_every == 0)

    def step(self, action):
        if self._faulty():
            if self.fault == "crash":
                os._exit(3)
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "garbage":
                echo_env_raw(b"}{ not json\n")
            if self.fault == "huge":
                echo_env_raw(b'{"ok": true, "pad": "' + b"x" * (8 << 20) + b'"}\n')
            if self.fault == "nan":
                echo_env_raw(b'{"ok": true, "reward": NaN, "done": true}\n')
            if self.fault == "out_of_range":
                return None, 5.0, True
            if self.fault == "refuse":
                raise ValueError("refused on purpose")
            if self.fault == "alloc":
                self.hog = bytearray(1 << 30)
        reward = 1.0 / self.turns if action.strip() == str(self.digits[self.k]) else 0.0
        self.k += 1
        if self.k >= self.turns:
            return None, reward, True
        return self._obs(), reward, False

    def truncate(self):
        return 0.0

    def reference(self, seed):
        return str(self.digits[self.k]) if self.k < len(self.digits) else None


def echo_env_raw(data):
    """Writes raw bytes where the reply goes, then waits for the node to give up."""
    out = echo_env.RAW
    out.write(data.decode("latin-1"))
    out.flush()
    time.sleep(3600)


if __name__ == "__main__":
    echo_env.serve(Digits)
