#!/usr/bin/env python3
"""Writes the RoPE config fixtures of `policy` (`policy/testdata/qwen3-rope/`), recorded once
with Hugging Face `transformers` and committed; the Rust tests read them without torch.

Two folders hold the same tiny random Qwen3 (vocabulary 260, the byte tokenizer) with a RoPE
base far from the 10 000 default:
- `tf5/`: `config.json` exactly as `save_pretrained` of transformers 5 writes it (θ only
  inside `rope_parameters`), θ = 1 000 000;
- `tf4/`: the same weights with `config.json` in the 4.x layout (top-level `rope_theta`,
  `rope_scaling: null`), θ = 500 000.
Each folder's `logits.json` is `{"ids": [...], "logits": [[...], ...], "rope_theta": θ,
"transformers": version}`: transformers' f32 CPU logits on one 64-token sequence, from the
folder as transformers loads it.

Usage (a throwaway virtual environment outside the repository; PyPI's torch wheel runs on
the CPU):

    python3 -m venv /tmp/ropevenv && /tmp/ropevenv/bin/pip install torch transformers safetensors
    /tmp/ropevenv/bin/python scripts/hf-rope-fixture.py policy/testdata/qwen3-rope

The folders hold no tokenizer: the test writes the byte tokenizer beside a copy
(`policy::hf::save_byte_tokenizer`) and loads it with `policy::hf::load_hf_dir`.
"""

import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

THETA_TF5 = 1_000_000.0
THETA_TF4 = 500_000.0


def tiny_config(theta):
    return Qwen3Config(
        vocab_size=260,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=257,
        eos_token_id=258,
        pad_token_id=256,
    )


def logits(model, ids):
    # Rounded to 1e-5 (the tests compare within 1e-4) to keep the fixture small.
    with torch.no_grad():
        rows = model(torch.tensor([ids])).logits[0].float().tolist()
    return [[round(x, 5) for x in row] for row in rows]


def record(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    theta = model.config.rope_parameters["rope_theta"]
    want = logits(model, ids)
    # What a loader that fell back to the 10 000 default would be off by.
    model.config.rope_parameters["rope_theta"] = 10_000.0
    wrong = AutoModelForCausalLM.from_pretrained(folder, config=model.config, dtype=torch.float32)
    off = max(abs(a - b) for r, s in zip(want, logits(wrong, ids)) for a, b in zip(r, s))
    out = {"ids": ids, "logits": want, "rope_theta": theta,
           "max_abs_logit": max(abs(x) for r in want for x in r),
           "max_diff_at_theta_10000": off,
           "transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(folder, "logits.json"), "w") as f:
        json.dump(out, f)
    return theta


def main():
    out = sys.argv[1]
    torch.manual_seed(53)
    model = Qwen3ForCausalLM(tiny_config(THETA_TF5)).float()
    # Weights large enough that the logits (and so a wrong θ) are far from uniform.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.35 * torch.randn_like(p))
    tf5 = os.path.join(out, "tf5")
    model.save_pretrained(tf5, safe_serialization=True)
    cfg = json.load(open(os.path.join(tf5, "config.json")))
    assert "rope_theta" not in cfg, "transformers wrote rope_theta at the top level"

    # The 4.x layout: the same weights, θ at the top level.
    tf4 = os.path.join(out, "tf4")
    os.makedirs(tf4, exist_ok=True)
    shutil.copy(os.path.join(tf5, "model.safetensors"), os.path.join(tf4, "model.safetensors"))
    old = {k: v for k, v in cfg.items()
           if k not in ("rope_parameters", "dtype", "transformers_version")}
    old.update({"rope_theta": THETA_TF4, "rope_scaling": None, "torch_dtype": "float32",
                "transformers_version": "4.51.3", "use_cache": True})
    with open(os.path.join(tf4, "config.json"), "w") as f:
        json.dump(old, f, indent=2, sort_keys=True)
    for name in ("generation_config.json",):
        for d in (tf5, tf4):
            p = os.path.join(d, name)
            if os.path.exists(p):
                os.remove(p)

    g = torch.Generator().manual_seed(7)
    ids = [257] + torch.randint(0, 256, (62,), generator=g).tolist() + [259]
    assert record(tf5, ids) == THETA_TF5
    assert record(tf4, ids) == THETA_TF4
    print(json.dumps({"out": out, "transformers": transformers.__version__,
                      "torch": torch.__version__, "tokens": len(ids)}))


if __name__ == "__main__":
    main()
