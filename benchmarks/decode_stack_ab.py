"""The native decode stack against the Python layer path, side by side in one engine (rounds interleaved).

Each round times real decode steps at each batch size with the stack on and off (order alternating by round)
and a c=1 request end to end (128 prompt tokens, 128 generated); prints each ratio off/on as a median with a
95% bootstrap interval over rounds, and keeps the raw samples.
    PYTHONPATH=src .venv/bin/python benchmarks/decode_stack_ab.py [--format auto] [--batch 1 8] [--rounds 10]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time

import torch

from decode_floor import engine_step_ms  # benchmarks/ is this script's folder
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams


def request_s(llm: LLM, seed: int) -> float:
    """Seconds for one request alone: 128 prompt tokens, 128 generated."""
    prompt = torch.randint(100, 40000, (128,), generator=torch.Generator().manual_seed(seed)).tolist()
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=128, ignore_eos=True))
    return time.perf_counter() - start


def cpu() -> str:
    """The CPU's model name and its widest vector extension, as /proc/cpuinfo says."""
    text = open("/proc/cpuinfo").read()
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {'AVX-512' if 'avx512f' in text else 'AVX2' if 'avx2' in text else 'no AVX2'}"


def interval(ratios: list[float], draws: int = 4000) -> tuple[float, float, float]:
    """Median and 95% bootstrap interval of the median."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return statistics.median(ratios), meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def main() -> None:
    """Interleaved rounds of stack on and off; print the ratios, write the samples."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--format", default="auto", help="weight_format")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    llm = LLM(model="llama", enable_prefix_caching=False, max_num_batched_tokens=4096, weight_format=args.format)
    model = llm.engine.model
    print(f"weight_format {llm.engine.weight_choice.format}; CPU {cpu()}")
    samples: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            model.use_decode_stack = on
            way = "on" if on else "off"
            for batch in args.batch:
                samples.setdefault(f"step_ms_b{batch}", {}).setdefault(way, []).append(
                    statistics.median(engine_step_ms(llm, batch, args.steps)))
            samples.setdefault("request_s_c1", {}).setdefault(way, []).append(request_s(llm, seed=r))
        assert model._stack is not None, "the stack did not build: see the engine log"
    result = {"format": llm.engine.weight_choice.format, "rounds": args.rounds, "cpu": cpu(), "samples": samples,
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()}
    for name, ways in samples.items():
        ratios = [off / on for off, on in zip(ways["off"], ways["on"])]
        med, lo, hi = interval(ratios)
        result[name] = {"off_over_on": [med, lo, hi], "on_median": statistics.median(ways["on"]),
                        "off_median": statistics.median(ways["off"])}
        print(f"{name:>14}: on {statistics.median(ways['on']):8.3f}  off {statistics.median(ways['off']):8.3f}  "
              f"off/on x{med:.3f} [{lo:.3f}, {hi:.3f}]")
    llm.close()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
