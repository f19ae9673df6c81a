"""Two verifiers environments that run offline (for envs/verifiers_env.py):

- `load_environment(kind="single")`: a SingleTurnEnv of one-digit additions, rubric: exact
  answer (weight 1);
- `load_environment(kind="multi")`: a MultiTurnEnv guessing game — the agent guesses a digit,
  the environment answers "higher" or "lower" until it is found or four guesses are used;
  rubric: 1 for finding it.
"""

import random

import verifiers as vf
from datasets import Dataset


def _additions(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": "%d+%d=" % (a, b), "answer": str(a + b)})
    return Dataset.from_list(rows)


def _text(m):
    return m["content"] if isinstance(m, dict) else getattr(m, "content", m)


def exact(completion, answer, **kwargs):
    text = _text(completion[-1]) if isinstance(completion, list) else completion
    return 1.0 if str(text).strip() == str(answer).strip() else 0.0


class Guess(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        guess = str(_text(messages[-1])).strip()
        target = state["answer"]
        if guess == target:
            state["found"] = True
            state["final_env_response"] = [{"role": "user", "content": "found"}]
            return state["final_env_response"]
        hint = "higher" if guess.isdigit() and int(guess) < int(target) else "lower"
        return [{"role": "user", "content": hint}]


def found(state, **kwargs):
    return 1.0 if state.get("found") else 0.0


def load_environment(kind="single", n=1000, seed=0):
    if kind == "single":
        return vf.SingleTurnEnv(
            dataset=_additions(n, seed),
            system_prompt="Answer with the number only.",
            rubric=vf.Rubric(funcs=[exact], weights=[1.0]),
        )
    rng = random.Random(seed)
    rows = [{"question": "Guess my digit.", "answer": str(rng.randrange(10))} for _ in range(n)]
    return Guess(
        dataset=Dataset.from_list(rows),
        max_turns=4,
        rubric=vf.Rubric(funcs=[found], weights=[1.0]),
    )
