"""Does one client's huge prompt stall another client's stream? The streaming client's token gaps with and
without a second client sending 1 MB prompts back to back, in alternating phases on one server.

    PYTHONPATH=src .venv/bin/python benchmarks/serving_stalls.py [--pairs 6] [--tokens 96] [--big-rate 10]
        [--code CHECKOUT] [--json out.json]

A real-model server (`infragent serve --model llama --threads 1`, a process of its own) serves one stream
at a time: a 32-token prompt, `--tokens` output tokens, greedy, ignore_eos. Phases alternate quiet / loaded
(the order of each pair drawn at random); in a loaded phase another process posts 1 MB prompts (refused by
the server: they cannot fit the context) for the whole stream, `--big-rate` per second (0: back to back, as
fast as the server answers: a flood that saturates the 2 cores by itself). Per phase: the p99 and the
median of the gaps between text-bearing chunks. Reported: pooled p99 per condition, and the per-pair ratio
loaded/quiet of the p99 with a 95% t interval of its geometric mean; the must-show is a growth of at most 20%.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import time
from pathlib import Path

import httpx
import numpy as np

from disagg_serving import start  # benchmarks/: the real-model server on a free port
from infragent.analysis.stats import t_interval

BIG = 1_000_000  # characters in the large prompt


def flood(url: str, rate: float, go: mp.Event, stop: mp.Event, counts: mp.Array) -> None:
    """While go is set, post the 1 MB prompt rate times a second (0: back to back); counts: [sent, 400s,
    other statuses, errors]."""
    body = json.dumps({"prompt": "word " * (BIG // 5), "max_tokens": 4}).encode()
    with httpx.Client(base_url=url, timeout=30) as client:
        due = time.perf_counter()
        while not stop.is_set():
            if not go.wait(0.1):
                due = time.perf_counter()
                continue
            if rate:
                due += 1.0 / rate
                time.sleep(max(0.0, due - time.perf_counter()))
            try:
                status = client.post("/v1/completions", content=body,
                                     headers={"content-type": "application/json"}).status_code
                counts[0] += 1
                counts[1 if status == 400 else 2] += 1
            except httpx.HTTPError:
                counts[3] += 1


def stream_gaps(url: str, tokens: int) -> list[float]:
    """One streamed completion: seconds between consecutive text-bearing chunks."""
    body = {"prompt": list(range(2000, 2032)), "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    times = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or []
            if choices and choices[0].get("text"):
                times.append(time.perf_counter())
    return list(np.diff(times))


def main() -> None:
    """Alternate quiet and loaded phases; print the p99 gaps and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--big-rate", type=float, default=10.0, help="1 MB prompts per second; 0: back to back")
    parser.add_argument("--code", default=None, help="serve from this checkout's src/ (e.g. a commit before a fix)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.code:  # only the server's code: this process has imported its own already
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(args.code) / "src"), os.environ.get("PYTHONPATH", "")])
    proc, url = start(["--threads", "1"])  # the real model, max_model_len 1024
    go, stop = mp.Event(), mp.Event()
    counts = mp.Array("i", 4)
    loader = mp.Process(target=flood, args=(url, args.big_rate, go, stop, counts), daemon=True)
    loader.start()
    order = random.Random(0)
    phases: list[dict] = []
    try:
        stream_gaps(url, 8)  # warm-up
        for pair in range(args.pairs):
            for loaded in order.sample([False, True], 2):
                sent = counts[0]
                if loaded:
                    go.set()
                    time.sleep(0.2)  # the flood is under way before the stream starts
                gaps = stream_gaps(url, args.tokens)
                go.clear()
                phases.append({"pair": pair, "loaded": loaded, "gaps_s": gaps, "big_prompts": counts[0] - sent,
                               "p99_ms": float(np.percentile(gaps, 99)) * 1e3,
                               "median_ms": float(np.median(gaps)) * 1e3, "max_ms": max(gaps) * 1e3})
                print(f"pair {pair} {'loaded' if loaded else 'quiet '}: p99 {phases[-1]['p99_ms']:.1f} ms, median "
                      f"{phases[-1]['median_ms']:.1f} ms, max {phases[-1]['max_ms']:.1f} ms, "
                      f"{phases[-1]['big_prompts']} big prompts", flush=True)
    finally:
        stop.set()
        go.set()
        loader.join(10)
        proc.terminate()
        proc.wait(30)
    ratios = [math.log(next(p["p99_ms"] for p in phases if p["pair"] == k and p["loaded"])
                       / next(p["p99_ms"] for p in phases if p["pair"] == k and not p["loaded"]))
              for k in range(args.pairs)]
    lo, hi = t_interval(ratios) or (math.nan, math.nan)
    pooled = {name: float(np.percentile([g for p in phases if p["loaded"] == loaded for g in p["gaps_s"]], 99)) * 1e3
              for name, loaded in (("quiet", False), ("loaded", True))}
    summary = {"p99_ratio": math.exp(float(np.mean(ratios))), "ci": [math.exp(lo), math.exp(hi)],
               "pooled_p99_ms": pooled, "big_prompts": {"sent": counts[0], "400": counts[1], "other": counts[2],
                                                        "errors": counts[3]}}
    print(f"1 MB prompts at {args.big_rate:g}/s (0: back to back); p99 token gap loaded/quiet: x{summary['p99_ratio']:.3f} [{summary['ci'][0]:.3f}, {summary['ci'][1]:.3f}] "
          f"over {args.pairs} pairs; pooled p99 quiet {pooled['quiet']:.1f} ms, loaded {pooled['loaded']:.1f} ms; "
          f"big prompts sent {counts[0]} (400: {counts[1]}, other: {counts[2]}, errors: {counts[3]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "phases": phases, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
