"""Prefill throughput with KV transfer off and on, per transfer mode and implementation (issue 9's acceptance
benchmark, first form: the real model, one process, the transfer thread beside the engine thread).

    PYTHONPATH=src .venv/bin/python benchmarks/kv_transfer_overhead.py [--rounds 7] [--gemm blas] [--json out.json]

Every configuration's engine is built once (prefix caching off); each round prefills one fresh 512-token
random prompt per configuration, in a fresh random order. Reported: median prefill tokens/s [95% CI] and
the per-round regression against transfer off (target for layerwise: at most 5%). --gemm blas runs the
projections through native BLAS with the GIL released (the fix of case study 2); blas-gil-held holds it.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from infragent.analysis.stats import bootstrap_median
from infragent.engine.config import EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams

PROMPT_TOKENS = 512


def configs(gemm: str) -> dict[str, dict]:
    """Transfer off, and each mode × implementation, all with the same GEMM."""
    out = {"off": dict(gemm=gemm)}
    for mode in ("layerwise", "after_prefill"):
        for impl in ("serialize", "bulk"):
            out[f"{mode} {impl}"] = dict(gemm=gemm, kv_transfer=True, kv_transfer_mode=mode, kv_transfer_impl=impl)
    return out


def prefill_tok_s(engine: LLMEngine, rng: random.Random) -> float:
    """Tokens/s of one prompt's prefill, its KV landed in the store when transfer is on."""
    engine.add_request([rng.randrange(1000, 40000) for _ in range(PROMPT_TOKENS)], SamplingParams(max_tokens=1))
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return PROMPT_TOKENS / (time.perf_counter() - start)


def main() -> None:
    """Interleave rounds; print tok/s and the regression against transfer off."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gemm", default="blas")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engines = {name: LLMEngine(EngineConfig(model="llama", kv_cache_gb=0.3, max_model_len=1024,
                                            max_num_batched_tokens=PROMPT_TOKENS, enable_prefix_caching=False,
                                            **knobs)) for name, knobs in configs(args.gemm).items()}
    rng = random.Random(0)
    for engine in engines.values():
        prefill_tok_s(engine, rng)  # warm-up
    samples = {name: [] for name in engines}
    order = list(engines)
    for r in range(args.rounds):
        random.Random(r).shuffle(order)
        for name in order:
            samples[name].append(prefill_tok_s(engines[name], rng))
    base = np.asarray(samples["off"])
    print(f"gemm {args.gemm}, {PROMPT_TOKENS}-token prefills, {args.rounds} interleaved rounds, median [95% CI]")
    print(f"{'transfer':<26} {'prefill tok/s':>22} {'regression vs off':>24}")
    for name, values in samples.items():
        tok = bootstrap_median(values)
        regression = bootstrap_median(list(base / np.asarray(values) - 1))
        print(f"{name:<26} {tok.fmt(1):>22} {regression.fmt(4):>24}")
    for engine in engines.values():
        engine.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gemm": args.gemm, "samples": samples}, f)


if __name__ == "__main__":
    main()
