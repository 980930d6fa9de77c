"""Tensor parallelism on the real model: TP=2 against TP=1 for each partial-sum precision (case study 1).

    PYTHONPATH=src .venv/bin/python benchmarks/tp_equivalence.py [--json out.json]

16 prompts: greedy tokens (32 each) compared with TP=1's, prompt log-probabilities at every position of
the 16 prompts compared elementwise (max relative difference, |a - b| / max(|b|, 1e-6)), and the wall time
of the greedy batch (after a warm-up). fp32 partial sums should match TP=1 to rounding; reduced (bf16 operands in each rank's
row-parallel GEMM) drifts; the 3-pass split (bf16x3) brings it back near the fp32 level.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three things to pack for a hike:", "Hi",
           "Once upon a time, in a small village,", "Water boils at", "The quick brown fox", "import numpy as np\n",
           "Name three primary colors:", "In 1969, astronauts", "SELECT * FROM", "My favourite book is",
           "The weather today is", "To make a cup of tea,", "2 + 2 =", "Translate to French: cat"]


def run(tp: int, precision: str) -> dict:
    """Greedy tokens, prompt log-probabilities and the greedy batch's wall time of one configuration."""
    llm = LLM(model="llama", kv_cache_gb=0.1, max_model_len=512, tensor_parallel_size=tp,
              tp_partial_precision=precision)
    try:
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4))  # warm-up: first-touch pages on every rank
        start = time.perf_counter()
        tokens = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=32, ignore_eos=True))]
        wall = time.perf_counter() - start
        logprobs = [o.prompt_logprobs for o in llm.generate(PROMPTS, SamplingParams(max_tokens=1,
                                                                                    prompt_logprobs=True))]
    finally:
        llm.close()
    return {"tokens": tokens, "logprobs": logprobs, "wall_s": wall}


def main() -> None:
    """TP=1 once, TP=2 per precision; print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    base = run(1, "fp32")
    rows = {}
    print(f"{'configuration':<22} {'prompts with identical greedy tokens':>38} {'max rel diff log-probs':>24} "
          f"{'greedy batch s':>15}")
    print(f"{'TP=1 fp32':<22} {'(reference)':>38} {'-':>24} {base['wall_s']:>15.2f}")
    for precision in ("fp32", "reduced", "3-pass"):
        result = run(2, precision)
        same = sum(a == b for a, b in zip(result["tokens"], base["tokens"]))
        diff = max(float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())
                   for a, b in zip(result["logprobs"], base["logprobs"]))
        rows[precision] = {"identical": same, "max_rel_diff": diff, "wall_s": result["wall_s"]}
        print(f"{'TP=2 ' + precision:<22} {f'{same}/{len(PROMPTS)}':>38} {diff:>24.2e} {result['wall_s']:>15.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tp1_wall_s": base["wall_s"], "tp2": rows, "threads_per_rank": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main()
