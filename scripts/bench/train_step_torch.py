#!/usr/bin/env python3
"""One training step (forward + log-prob loss + backward + AdamW) of Hugging Face
`transformers`' Qwen3ForCausalLM on the CPU, for the same models and batches as the candle
bench `cargo bench -p learner --bench train_step` (see docs/gpu.md, "CPU: one training step,
candle vs PyTorch").

Models (random init, float32):
  tiny : hidden 128, 3 layers, 4 heads, 2 KV heads, head_dim 32, intermediate 384, vocab 260
  small: hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, intermediate 768, vocab 4096
both with tied embeddings, RoPE theta 1e4, RMSNorm eps 1e-6, no attention bias.
Batches: 16 x 24 and 4 x 128 tokens. Loss: minus the mean log-prob of the input ids (as the
candle bench). Optimiser: clip_grad_norm_(1.0) + torch.optim.AdamW(lr=1e-3, weight_decay=0),
matching learner::AdamWConfig::default().

Usage (PyPI's `torch` wheel runs on the CPU; `pip install torch transformers`):
  python3 scripts/bench/train_step_torch.py --threads 1
  python3 scripts/bench/train_step_torch.py --threads 2 --attn eager --clock cpu
Prints one line per case: model, batch, threads, attention kernel, clock, median, mean and
minimum ms/step.
"""
import argparse
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

MODELS = {
    "tiny": dict(vocab_size=260, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=256),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=512),
}
BATCHES = [(16, 24), (4, 128)]


def build(name, attn):
    cfg = Qwen3Config(**MODELS[name], rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
                      use_cache=False)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float().train()
    return model, cfg


def step(model, opt, ids):
    logits = model(input_ids=ids, use_cache=False).logits
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss = -lp.mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="cpu: process CPU time (all threads), for a loaded shared host")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    for name in MODELS:
        for bsz, t in BATCHES:
            model, cfg = build(name, args.attn)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=0.0)
            ids = torch.tensor([(i * 7919 + 13) % cfg.vocab_size for i in range(bsz * t)],
                               dtype=torch.long).view(bsz, t)
            for _ in range(args.warmup):
                step(model, opt, ids)
            times = []
            for _ in range(args.iters):
                t0 = clock()
                step(model, opt, ids)
                times.append((clock() - t0) * 1e3)
            print(f"{name:5s} {bsz}x{t:<4d} threads={args.threads} attn={args.attn:5s} clock={args.clock} "
                  f"median={statistics.median(times):8.2f} ms mean={statistics.mean(times):8.2f} ms "
                  f"min={min(times):8.2f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
