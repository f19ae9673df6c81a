#!/usr/bin/env python3
"""The baseline for `policy`'s `gen_bench` on a GPU: Hugging Face `transformers` `generate`
(PyTorch eager attention) on a Qwen3-0.6B-shaped model with random weights (nothing is
downloaded), bf16, sampling at temperature 1 with no early stop, for the same batches and
lengths. Prints one JSON line per batch size: tokens/s = batch × new tokens / wall time.

    pip install torch transformers        # a CUDA build of torch on the GPU host
    python3 scripts/bench/generate_torch.py --batch 1,16,64 --new-tokens 256
"""
import argparse
import json
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    cfg = Qwen3Config(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40_960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=False,
    )
    cfg._attn_implementation = a.attn
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(device=a.device, dtype=dtype).eval()
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    for b in [int(x) for x in a.batch.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, a.prompt_len), device=a.device)
        kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0,
                  eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)  # warm-up
            sync()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, **kw)
            sync()
            dt = time.perf_counter() - t0
        new = out.shape[1] - a.prompt_len
        print(json.dumps({"impl": f"transformers-{a.attn}", "dtype": a.dtype, "batch": b,
                          "new_tokens": new, "seconds": dt, "tokens_per_s": b * new / dt}))


if __name__ == "__main__":
    main()
