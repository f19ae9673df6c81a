"""TextArena behind the echo-swarm environment protocol (docs/environments.md).

    pip install textarena            # then: [task] kind = "external", command = ["python3", "envs/textarena_env.py"]

Params: `env_id` (a TextArena id, e.g. "IteratedRockPaperScissors-v0"), `env_kwargs` (its
constructor's keyword arguments, e.g. {"num_rounds": 3}), `num_players` (1 or 2, default 2),
`agent_seat` (0 or 1; default: the seed's parity), `opponent` (the fixed opponent: a list of
actions it plays in turn, cycled, default ["[rock]"]; `opponent_random`: true draws from
that list with a generator seeded by (seed, move) instead), `max_turns` (the agent's, default
16), `tokens_per_turn` (default 16), `max_observation_chars` (keep the last N characters of
each observation, 0 = all; for small contexts), `reference` (the actions scripted play
draws from, default the opponent's list), `return_range` (default [-1, 1]).

Multi-turn: each observation is what the agent's TextArena observation added since its last
turn; the episode's reward is the agent's TextArena reward at the end (0 before).
"""

import importlib.metadata
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import echo_env  # noqa: E402

import textarena as ta  # noqa: E402


def _text(obs):
    if isinstance(obs, str):
        return obs
    # Some versions return a list of (sender, message[, kind]) tuples.
    return "\n".join(str(o[1]) if isinstance(o, (list, tuple)) and len(o) > 1 else str(o) for o in obs)


class TextArena:
    def __init__(self, params):
        self.env_id = params["env_id"]
        self.kwargs = dict(params.get("env_kwargs") or {})
        self.players = int(params.get("num_players", 2))
        self.seat = params.get("agent_seat")
        self.opponent = list(params.get("opponent") or ["[rock]"])
        self.opponent_random = bool(params.get("opponent_random", False))
        self.max_turns = int(params.get("max_turns", 16))
        self.tokens = int(params.get("tokens_per_turn", 16))
        self.max_chars = int(params.get("max_observation_chars", 0))
        self.reference_actions = list(params.get("reference") or self.opponent)
        self.range = [float(x) for x in params.get("return_range", [-1.0, 1.0])]
        self.system = params.get("system_prompt")
        self.env = None

    def metadata(self):
        return {
            "description": "TextArena %s against a fixed opponent" % self.env_id,
            "num_initial_states": None,
            "max_turns": self.max_turns,
            "return_range": self.range,
            "suggested_tokens_per_turn": self.tokens,
            "system_prompt": self.system,
            "version": "textarena " + importlib.metadata.version("textarena"),
        }

    def _clip(self, s):
        if self.max_chars <= 0 or len(s) <= self.max_chars:
            return s
        s = s[-self.max_chars:]
        # Whole lines where one fits.
        return s[s.index("\n") + 1:] if "\n" in s[:-1] else s

    def _opponent_move(self):
        if self.opponent_random:
            rng = random.Random("%d/%d" % (self.seed, self.opp_moves))
            a = rng.choice(self.opponent)
        else:
            a = self.opponent[self.opp_moves % len(self.opponent)]
        self.opp_moves += 1
        return a

    def _advance(self):
        """Plays the opponent until it is the agent's turn or the game ends; returns the
        agent's new observation text, or None when the game is over."""
        while not self.done:
            pid, obs = self.env.get_observation()
            if pid == self.agent:
                text = _text(obs)
                new = text[len(self.seen):] if text.startswith(self.seen) else text
                self.seen = text
                return self._clip(new.strip("\n")) or "(your turn)"
            self.done, _ = self.env.step(self._opponent_move())
        return None

    def reset(self, seed):
        self.seed, self.opp_moves, self.seen, self.done = seed, 0, "", False
        self.env = ta.make(self.env_id, **self.kwargs)
        self.env.reset(num_players=self.players, seed=seed)
        self.agent = int(self.seat) if self.seat is not None else (seed % self.players)
        obs = self._advance()
        if obs is None:
            raise RuntimeError("the game ended before the agent's first turn")
        return obs

    def _reward(self):
        rewards, _ = self.env.close()
        return float((rewards or {}).get(self.agent, 0.0))

    def step(self, action):
        self.done, _ = self.env.step(action)
        obs = self._advance()
        if obs is None:
            return None, self._reward(), True
        return obs, 0.0, False

    def truncate(self):
        return 0.0

    def reference(self, seed):
        return random.Random(seed).choice(self.reference_actions)


if __name__ == "__main__":
    echo_env.serve(TextArena)
