#!/usr/bin/env python3
"""Checks an `echo-node export` of a LoRA run against Hugging Face `transformers` + `peft`.

Loads the base (`echo-export.json`'s "base") with transformers, puts the PEFT adapter folder
("peft") on it with `peft.PeftModel.from_pretrained`, and compares its logits with those of the
exported merged model (the export folder itself), with PEFT's own `merge_and_unload()`, and,
given `--ours FILE` (the output of `cargo run -p policy --example hf_logits -- EXPORT IDS`),
with echo-swarm's own forward on the same tokens. Also checks that the tokenizer.json of the
export loads in `tokenizers` and encodes the prompt as the byte tokenizer does.

Not run in CI (it needs torch). Usage, in a throwaway virtual environment:

    python3 -m venv /tmp/peftvenv
    /tmp/peftvenv/bin/pip install torch transformers peft safetensors
    /tmp/peftvenv/bin/python scripts/peft-check.py EXPORT_DIR [--ours ours.json] [--tol 1e-4]

Prints one JSON line with the maximum absolute differences; exits 1 when one exceeds --tol.
"""

import argparse
import json
import os
import sys

import torch
from peft import PeftModel
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

# The embedded byte tokenizer's prompt template: BOS, the prompt's bytes, SEP.
BOS, SEP = 257, 259


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="the folder `echo-node export --out` wrote")
    ap.add_argument("--prompt", default="3+4=", help="prompt text (byte tokenizer template)")
    ap.add_argument("--ours", help="JSON logits from the hf_logits example, same ids")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()

    meta = json.load(open(os.path.join(args.export, "echo-export.json")))
    tok = Tokenizer.from_file(os.path.join(args.export, "tokenizer.json"))
    enc = tok.encode(args.prompt, add_special_tokens=False).ids
    byte_level = tok.get_vocab_size(with_added_tokens=True) == 260
    if byte_level:
        assert enc == list(args.prompt.encode()), "tokenizer.json is not the byte tokenizer"
        ids = [BOS] + enc + [SEP]
    else:
        ids = enc

    merged = AutoModelForCausalLM.from_pretrained(args.export, dtype=torch.float32)
    want = logits(merged, ids)
    out = {"ids": ids, "model_type": merged.config.model_type, "tol": args.tol}
    if "peft" in meta:
        base = AutoModelForCausalLM.from_pretrained(meta["base"], dtype=torch.float32)
        base_logits = logits(base, ids)
        model = PeftModel.from_pretrained(base, meta["peft"])
        model.eval()
        got = logits(model, ids)
        out["peft_vs_merged"] = (got - want).abs().max().item()
        # The adapters must matter, or the comparison above proves nothing.
        out["base_vs_merged"] = (base_logits - want).abs().max().item()
        unloaded = model.merge_and_unload()
        out["peft_merge_and_unload_vs_merged"] = (logits(unloaded, ids) - want).abs().max().item()
    if args.ours:
        ours = json.load(open(args.ours))
        assert ours["ids"] == ids, f"--ours was computed on {ours['ids']}, not {ids}"
        out["ours_vs_transformers"] = (torch.tensor(ours["logits"]) - want).abs().max().item()
    print(json.dumps(out))
    worst = max((v for k, v in out.items() if k.endswith(("_vs_merged", "_vs_transformers"))
                 and not k.startswith("base_")), default=0.0)
    if worst > args.tol or out.get("base_vs_merged", 1.0) <= args.tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
