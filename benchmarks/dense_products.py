"""Dense fp32 products at decode batch sizes: the native kernel against BLAS (engine/dense_choice.py), and what
that does to batching on the wide hybrid model the optimize tests serve.

Part 1, per weight shape and row count: BLAS time / native time, median of interleaved rounds with a 95%
bootstrap CI (above 1: the native kernel is faster), BLAS on W transposed being the engine's layout without
the kernel; and BLAS time / BLAS time on W as [out, in] (the layout the kernel needs).
Part 2, the engine: the wide hybrid (tests/server_fixture.py WIDE_HYBRID, one thread) decoding 8 greedy
requests of 32 tokens one at a time and all 8 at once (max_num_seqs 8), with kernels=torch (BLAS only) and
kernels=auto (the measured choice), in interleaved rounds; prints each's batching gain (time one at a time /
time at once) with a 95% CI. On a BLAS whose small-m products cost nearly one row (MKL on Intel) the gain is
large either way; on MKL's generic AMD path it was small with BLAS only.

    PYTHONPATH=src .venv/bin/python benchmarks/dense_products.py [--rounds 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from infragent.analysis.stats import bootstrap_median, paired_ratio
from infragent.engine import dense_choice
from infragent.engine.config import HybridConfig
from infragent.engine.kernels import build
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from server_fixture import WIDE_HYBRID  # noqa: E402

SHAPES = [(49152, 512), (3072, 512), (512, 1536), (1024, 512), (49152, 576), (3072, 576), (576, 1536)]
PROMPTS = [f"Request {i}: describe the sea in a few words" for i in range(8)]


def shapes_table(rounds: int) -> list[dict]:
    """Per shape and row count: the speedup's median and CI over rounds."""
    dense_choice.ROUNDS = rounds
    rows = []
    for out_features, in_features in SHAPES:
        native, blas_rows = dense_choice.measure(out_features, in_features)
        for count, ratios in native.items():
            s, b = bootstrap_median(ratios), bootstrap_median(blas_rows[count])
            rows.append({"shape": f"{out_features}x{in_features}", "rows": count, "speedup": s.center,
                         "low": s.lo, "high": s.hi, "samples": ratios, "blas_rows": b.center,
                         "blas_rows_samples": blas_rows[count]})
    return rows


def batching_gain(rounds: int) -> dict[str, dict]:
    """Per kernels choice: seconds for the 8 requests one at a time and all at once, per round."""
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    times: dict[str, dict[str, list[float]]] = {k: {"one": [], "all": []} for k in ("torch", "auto")}
    engines = {k: LLM(model="hybrid", hybrid=HybridConfig(**WIDE_HYBRID), num_threads=1, max_model_len=512,
                      kv_cache_gb=0.05, max_num_seqs=8, kernels=k) for k in times}
    try:
        for llm in engines.values():
            llm.generate(PROMPTS[:2], greedy)  # warm
        for r in range(rounds):
            for kernels in (("torch", "auto") if r % 2 == 0 else ("auto", "torch")):
                llm = engines[kernels]
                start = time.perf_counter()
                for prompt in PROMPTS:
                    llm.generate([prompt], greedy)
                times[kernels]["one"].append(time.perf_counter() - start)
                start = time.perf_counter()
                llm.generate(PROMPTS, greedy)
                times[kernels]["all"].append(time.perf_counter() - start)
    finally:
        for llm in engines.values():
            llm.close()
    out = {}
    for kernels, t in times.items():
        gain = paired_ratio(t["all"], t["one"])  # one-at-a-time / at-once, per round
        out[kernels] = {"gain": gain.center, "low": gain.lo, "high": gain.hi, **t}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    build.load()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"CPU: {cpu}; ISA {torch.ops.infragent.qgemm_isa()}; torch {torch.__version__}; 1 thread; "
          f"{args.rounds} rounds")
    table = shapes_table(args.rounds)
    print("\nBLAS time on W transposed (the engine's layout without the kernel) / native time (median, 95% CI);"
          " and / BLAS time on W as [out, in]:")
    for row in table:
        print(f"  {row['shape']:>10} {row['rows']:>3} rows  native x{row['speedup']:.2f} [{row['low']:.2f}, "
              f"{row['high']:.2f}]   BLAS [out, in] x{row['blas_rows']:.2f}")
    gains = batching_gain(args.rounds)
    print("\nwide hybrid, 8 requests x 32 tokens: time one at a time / time all at once (median, 95% CI):")
    for kernels, g in gains.items():
        one, together = sorted(g["one"])[len(g["one"]) // 2], sorted(g["all"])[len(g["all"]) // 2]
        print(f"  kernels={kernels:<5} x{g['gain']:.2f} [{g['low']:.2f}, {g['high']:.2f}]  "
              f"(median {one:.2f} s one at a time, {together:.2f} s at once)")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "shapes": table, "batching": gains}, indent=1))


if __name__ == "__main__":
    main()
