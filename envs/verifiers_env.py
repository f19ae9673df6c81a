"""verifiers environments behind the echo-swarm environment protocol (docs/environments.md).

    pip install "verifiers==0.1.14"  # then: [task] kind = "external", command = ["python3", "envs/verifiers_env.py"]

Params: `env_id` (an installed verifiers environment, loaded by `vf.load_environment`, or a
path to a Python file defining `load_environment(**env_args)`), `env_args` (its keyword
arguments), `split` ("train": the environment's dataset, "eval": its eval dataset),
`return_range` (default [0, 1]: a rubric's weighted sum of rewards in [0, 1]),
`max_turns` (when the environment sets none, default 8), `tokens_per_turn` (default 64).

The adapter runs the environment's own `rollout` — its `env_response`, stop conditions and
rubric — with the agent as the model: a verifiers `Client` whose `get_response` hands the
prompt to the node (an observation) and answers with the node's next action. Initial state i
is row i of the dataset (modulo its length); the reward is the rubric's, at the end.

Offline only: environments whose datasets come from the Hugging Face Hub (load_environment
downloads them), whose rubrics call a judge model, or that run tools in remote sandboxes
need the network, which the node denies by default ([task.external] network = true allows
it; their determinism is then the judge's). `envs/verifiers_examples.py` has one
SingleTurnEnv and one MultiTurnEnv that run offline.
"""

import asyncio
import importlib.metadata
import importlib.util
import os
import queue
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import echo_env  # noqa: E402

import verifiers as vf  # noqa: E402
from verifiers.clients.client import Client  # noqa: E402
from verifiers.types import Response, ResponseMessage  # noqa: E402


class Abandoned(Exception):
    pass


def _field(m, key):
    return m.get(key) if isinstance(m, dict) else getattr(m, key, None)


def _content(m):
    c = _field(m, "content")
    if isinstance(c, list):
        return "\n".join(str(_field(p, "text") or "") for p in c)
    return "" if c is None else str(c)


class Bridge:
    """One episode: the rollout's thread asks for actions, the protocol answers them."""

    def __init__(self):
        self.to_node = queue.Queue()
        self.to_env = queue.Queue()

    def ask(self, prompt):
        self.to_node.put(("obs", prompt))
        action = self.to_env.get()
        if action is Abandoned:
            raise Abandoned()
        return action


class AgentClient(Client):
    """The node's agent as a verifiers model client."""

    def __init__(self, bridge):
        super().__init__(object())
        self.bridge = bridge

    def setup_client(self, config):
        return None

    async def to_native_tool(self, tool):
        return tool

    async def to_native_prompt(self, messages):
        return messages, {}

    async def get_native_response(self, *args, **kwargs):
        raise NotImplementedError

    async def raise_from_native_response(self, response):
        return None

    async def from_native_response(self, response):
        return response

    async def close(self):
        return None

    async def get_response(self, prompt, model, sampling_args=None, tools=None, **kwargs):
        loop = asyncio.get_running_loop()
        action = await loop.run_in_executor(None, self.bridge.ask, prompt)
        message = ResponseMessage(role="assistant", content=action, finish_reason="stop", is_truncated=False)
        return Response(id="echo", created=0, model=model, message=message)


def _load(env_id, env_args):
    if env_id.endswith(".py"):
        spec = importlib.util.spec_from_file_location("echo_vf_env", env_id)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.load_environment(**env_args)
    return vf.load_environment(env_id, **env_args)


class Verifiers:
    def __init__(self, params):
        self.env_id = params["env_id"]
        self.env = _load(self.env_id, dict(params.get("env_args") or {}))
        split = params.get("split", "train")
        ds = self.env.get_eval_dataset() if split == "eval" else self.env.get_dataset()
        self.rows = [dict(r) for r in ds]
        if not self.rows:
            raise ValueError("the environment's dataset is empty")
        turns = int(getattr(self.env, "max_turns", -1) or -1)
        self.max_turns = turns if turns > 0 else int(params.get("max_turns", 8))
        self.tokens = int(params.get("tokens_per_turn", 64))
        self.range = [float(x) for x in params.get("return_range", [0.0, 1.0])]
        self.bridge = None
        self.row = None
        self.seen = 0

    def metadata(self):
        return {
            "description": "verifiers %s (%s)" % (os.path.basename(self.env_id), type(self.env).__name__),
            "num_initial_states": len(self.rows),
            "max_turns": self.max_turns,
            "return_range": self.range,
            "suggested_tokens_per_turn": self.tokens,
            "system_prompt": getattr(self.env, "system_prompt", None) or None,
            "version": "verifiers " + importlib.metadata.version("verifiers"),
        }

    def _abandon(self):
        if self.bridge is not None:
            self.bridge.to_env.put(Abandoned)
            self.bridge = None

    def _next(self):
        kind, value = self.bridge.to_node.get()
        if kind == "done":
            self.bridge = None
            return None, value
        # The observation: what the prompt adds after the agent's last message (the first
        # time: the user messages, the system prompt being the metadata's).
        msgs = list(value)
        new = msgs[self.seen:]
        self.seen = len(msgs) + 1
        text = "\n".join(_content(m) for m in new if _field(m, "role") != "system")
        return text, None

    def reset(self, seed):
        self._abandon()
        row = self.row = dict(self.rows[seed % len(self.rows)])
        row.setdefault("example_id", seed)
        bridge = self.bridge = Bridge()
        self.seen = 0
        client = AgentClient(bridge)

        async def play():
            state = await self.env.rollout(row, client, "echo-agent")
            # `rollout` plays; scoring is the rubric's (what `run_rollout` adds).
            if state.get("reward") is None:
                await self.env.rubric.score_rollout(state)
            return state

        def run():
            try:
                state = asyncio.run(play())
                reward = state.get("reward")
                bridge.to_node.put(("done", 0.0 if reward is None else float(reward)))
            except Abandoned:
                pass
            except Exception as e:  # reported to the node as a refusal of the next call
                bridge.to_node.put(("done", e))

        threading.Thread(target=run, daemon=True).start()
        obs, end = self._next()
        if obs is None:
            raise RuntimeError("the episode ended before the first turn: %r" % (end,))
        return obs

    def step(self, action):
        if self.bridge is None:
            raise RuntimeError("no episode")
        self.bridge.to_env.put(action)
        obs, end = self._next()
        if obs is not None:
            return obs, 0.0, False
        if isinstance(end, Exception):
            raise end
        return None, end, True

    def truncate(self):
        self._abandon()
        return 0.0

    def reference(self, seed):
        # A single-turn row's answer is a correct completion (the supervised warm start).
        if self.max_turns == 1 and self.bridge is not None:
            return self.row.get("answer")
        return None


if __name__ == "__main__":
    echo_env.serve(Verifiers)
