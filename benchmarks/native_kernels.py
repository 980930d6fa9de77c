"""Native kernels vs the torch-op path: engine decode steps of the real model, A/B interleaved.

Two engines (kernels native and torch: paged attention, RoPE + cache write, residual add + RMSNorm,
silu * up) hold the same batch of sequences 128 tokens into their context; rounds alternate which backend
steps first (ABBA), and each round times a few decode steps of each. Prints ms per step for both and the
ratio with a bootstrap 95% CI, at each batch size.
    PYTHONPATH=src .venv/bin/python benchmarks/native_kernels.py [--batch 1 32] [--rounds 12]
        [--kv-cache-dtype bf16] [--json F]
"""
from __future__ import annotations

import argparse
import json

import torch

from engine_ab import ab_line, ab_steps
from infragent.engine.llm import LLM


def main() -> None:
    """Measure and print the A/B comparison per batch size."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per backend per round")
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV storage of both engines (auto, bf16, ...)")
    parser.add_argument("--json", help="write the raw samples here")
    args = parser.parse_args()
    engines = [LLM(model="llama", kernels=name, kv_cache_dtype=args.kv_cache_dtype) for name in ("native", "torch")]
    results = {}
    for batch in args.batch:
        native, torch_ops = ab_steps(*engines, batch, args.rounds, args.steps)
        results[batch] = {"native": native, "torch": torch_ops}
        print(ab_line(batch, ("native", "torch"), (native, torch_ops)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms_per_step": results, "kv_cache_dtype": args.kv_cache_dtype,
                       "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
