"""reasoning-gym behind the echo-swarm environment protocol (docs/environments.md).

    pip install reasoning-gym        # then: [task] kind = "external", command = ["python3", "envs/reasoning_gym_env.py"]

Params: `dataset` (any reasoning-gym dataset name, e.g. "basic_arithmetic"), `config` (its
keyword arguments, e.g. {"min_terms": 2, "max_digits": 1}), `dataset_seed` (default 0),
`size` (initial states, default 1e9: procedural datasets make item i on demand),
`answer` ("raw": the whole completion is the answer, stripped; "tags": the text inside
<answer>…</answer>, the library's `extract_answer`), `system_prompt` (optional override).

Single-turn: reset(i) is item i's question, the completion is scored by the dataset's own
`score_answer` (reward in [0, 1]); the reference action is the item's answer.
"""

import importlib.metadata
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import echo_env  # noqa: E402

import reasoning_gym  # noqa: E402
from reasoning_gym.utils import extract_answer  # noqa: E402

RAW_PROMPT = "Answer with the final answer only."
TAGS_PROMPT = "Think briefly, then give the final answer as <answer>ANSWER</answer>."


class ReasoningGym:
    def __init__(self, params):
        self.name = params["dataset"]
        self.size = int(params.get("size", 10**9))
        self.mode = params.get("answer", "raw")
        if self.mode not in ("raw", "tags"):
            raise ValueError("answer must be raw or tags")
        config = dict(params.get("config") or {})
        self.ds = reasoning_gym.create_dataset(
            self.name, size=self.size, seed=int(params.get("dataset_seed", 0)), **config
        )
        self.tokens = int(params.get("tokens_per_turn", 32 if self.mode == "raw" else 512))
        self.system = params.get("system_prompt", RAW_PROMPT if self.mode == "raw" else TAGS_PROMPT)
        self.entry = None

    def metadata(self):
        return {
            "description": "reasoning-gym %s, scored by its own score_answer" % self.name,
            "num_initial_states": self.size,
            "max_turns": 1,
            "return_range": [0.0, 1.0],
            "suggested_tokens_per_turn": self.tokens,
            "system_prompt": self.system or None,
            "version": "reasoning-gym " + importlib.metadata.version("reasoning-gym"),
        }

    def reset(self, seed):
        self.entry = self.ds[seed]
        return self.entry["question"]

    def step(self, action):
        answer = action.strip() if self.mode == "raw" else extract_answer(action)
        score = float(self.ds.score_answer(answer, self.entry))
        return None, min(max(score, 0.0), 1.0), True

    def reference(self, seed):
        a = str(self.entry["answer"])
        return a if self.mode == "raw" else "<answer>%s</answer>" % a


if __name__ == "__main__":
    echo_env.serve(ReasoningGym)
