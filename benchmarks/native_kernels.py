"""Native kernels vs the torch-op path: engine decode steps of the real model, A/B interleaved.

Two engines (kernels native and torch: paged attention, RoPE + cache write, residual add + RMSNorm, silu * up) hold the same batch of sequences 128 tokens into their
context; rounds alternate which backend steps first (ABBA), and each round times a few decode steps of
each. Prints ms per step for both and the ratio with a bootstrap 95% CI, at each batch size.
    PYTHONPATH=src .venv/bin/python benchmarks/native_kernels.py [--batch 1 32] [--rounds 12]
        [--kv-cache-dtype bf16] [--json F]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from infragent.analysis.stats import bootstrap_median, paired_ratio
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams


def fill(llm: LLM, batch: int, max_tokens: int) -> None:
    """Add `batch` 128-token prompts and run their prefill."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        llm.engine.add_request(torch.randint(100, 40000, (128,), generator=gen).tolist(),
                               SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while any(s.num_computed_tokens < len(s.prompt_token_ids) for s in llm.engine.scheduler.running) \
            or llm.engine.scheduler.waiting:
        llm.engine.step()


def step_ms(llm: LLM, steps: int) -> float:
    """Mean wall time of `steps` engine decode steps."""
    start = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    """Measure and print the A/B comparison per batch size."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per backend per round")
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV storage of both engines (auto, bf16, ...)")
    parser.add_argument("--json", help="write the raw samples here")
    args = parser.parse_args()
    engines = {name: LLM(model="llama", kernels=name, kv_cache_dtype=args.kv_cache_dtype)
               for name in ("native", "torch")}
    results = {}
    for batch in args.batch:
        for llm in engines.values():
            fill(llm, batch, 2 + 2 * args.rounds * args.steps)
        samples: dict[str, list[float]] = {"native": [], "torch": []}
        for r in range(args.rounds):
            order = ("native", "torch") if r % 4 in (0, 3) else ("torch", "native")
            for name in order:
                samples[name].append(step_ms(engines[name], args.steps))
        for llm in engines.values():
            while llm.engine.has_unfinished():
                llm.engine.step()
        ratio = paired_ratio(samples["torch"], samples["native"])  # per round: native / torch
        results[batch] = samples
        print(f"batch {batch:3d}: native {bootstrap_median(samples['native']).fmt(1)} ms/step, "
              f"torch {bootstrap_median(samples['torch']).fmt(1)} ms/step, native/torch {ratio.fmt(3)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms_per_step": results, "kv_cache_dtype": args.kv_cache_dtype,
                       "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
