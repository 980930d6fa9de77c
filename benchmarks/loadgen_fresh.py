"""Does a second loadgen run measure the cache the first one warmed? Back-to-back runs with default flags
(fresh prompts each) against back-to-back runs with a pinned --seed (the same prompts twice).

    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_fresh.py [--rounds 3] [--json out.json]

One real-model server (`infragent serve --model llama --threads 2`, prefix caching on, as by default). Each
round: two default runs, then two runs with seed = the round number, 12 prompts of 512 tokens, 8 output
tokens, 2 at a time. Per run: the TTFT mean, the server's prefix-cache hit rate over the run and whether
loadgen flagged it. Reported: the ratio of the second run's TTFT mean to the first's, per mode, with a 95%
t interval over rounds.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from disagg_serving import start  # benchmarks/: the real-model server on a free port
from infragent.analysis.stats import t_interval
from infragent.probes.loadgen import LoadConfig, run_loadgen


def one_run(url: str, seed: int | None) -> dict:
    """A loadgen run; its TTFT mean (ms), cache hit rate, flag and verdict."""
    feedback = run_loadgen(LoadConfig(base_url=url, model="llama", num_prompts=12, max_concurrency=2,
                                      random_input_len=512, random_output_len=8, warmup=1, progress=False,
                                      seed=seed))
    run = json.loads(Path(feedback.evidence[0].path).read_text())["runs"][0]
    ttfts = [r["ttft_s"] for r in run["records"] if r["success"] and not r["warmup"]]
    cache = run["prefix_cache"] or {}
    return {"seed": feedback.locality["seed"], "ttft_ms": 1e3 * float(np.mean(ttfts)), "verdict": feedback.verdict,
            "hit_rate": cache.get("hit_rate"), "flagged": cache.get("flagged")}


def main() -> None:
    """Rounds of (default, default, pinned, pinned); print the second/first TTFT ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    proc, url = start(["--threads", "2"])
    rounds = []
    try:
        one_run(url, None)  # warm the server
        for k in range(args.rounds):
            runs = {"default": [one_run(url, None), one_run(url, None)], "pinned": [one_run(url, k), one_run(url, k)]}
            rounds.append(runs)
            for mode, pair in runs.items():
                print(f"round {k} {mode:7s}: " + " | ".join(
                    f"TTFT {r['ttft_ms']:.0f} ms, hits {r['hit_rate']:.0%}, {r['verdict']}" for r in pair), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    summary = {}
    for mode in ("default", "pinned"):
        logs = [math.log(r[mode][1]["ttft_ms"] / r[mode][0]["ttft_ms"]) for r in rounds]
        lo, hi = t_interval(logs) or (math.nan, math.nan)
        summary[mode] = {"second_over_first": math.exp(float(np.mean(logs))), "ci": [math.exp(lo), math.exp(hi)],
                         "flagged_second": sum(bool(r[mode][1]["flagged"]) for r in rounds)}
        print(f"{mode}: second run's TTFT mean / first's x{summary[mode]['second_over_first']:.3f} "
              f"[{summary[mode]['ci'][0]:.3f}, {summary[mode]['ci'][1]:.3f}]; second run flagged in "
              f"{summary[mode]['flagged_second']} of {len(rounds)} rounds")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
