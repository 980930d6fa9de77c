"""Colocated vs disaggregated serving of the real model under the same load: what the split buys (decode
no longer waits behind prefills: ITL) and what it costs (TTFT: a prefill worker with one core, the KV
transfer, the admission).

    PYTHONPATH=src .venv/bin/python benchmarks/disagg_serving.py [--rounds 4] [--num-prompts 30] [--rate 0.8]
        [--json out.json]

Both servers run side by side for the whole benchmark on the 2 cores: colocated `infragent serve --threads 2`,
and `serve --disagg` with one prefill and one decode worker of one thread each. Each round sends the same
seeded Poisson workload (random prompts of 256-768 tokens, 64 output tokens) to each server, in a fresh
random order; the idle server only polls. Reported per server: medians over rounds of TTFT p50/p99, ITL
p50/p99 and output tok/s, and the paired per-round ratio disagg/colocated [95% bootstrap CI].
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from infragent.analysis.stats import bootstrap_median
from infragent.probes.loadgen import LoadConfig, run_once

SERVERS = {"colocated": ["--threads", "2"], "disagg": ["--threads", "1", "--disagg"]}
FIGURES = {"ttft p50": lambda m: m.ttft_ms.median, "ttft p99": lambda m: m.ttft_ms.p99,
           "itl p50": lambda m: m.itl_ms.median, "itl p99": lambda m: m.itl_ms.p99,
           "output tok/s": lambda m: m.output_throughput}


def start(extra: list[str]) -> tuple[subprocess.Popen, str]:
    """A real-model server on a free port; returns it and its URL once healthy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "infragent.cli", "serve", "--model", "llama", "--port", str(port),
                             "--kv-cache-gb", "0.3", "--max-model-len", "1024", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"server {extra} did not become healthy")


def main() -> None:
    """Interleaved rounds against both servers; print medians and paired ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    servers = {name: start(extra) for name, extra in SERVERS.items()}
    samples: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIGURES} for name in servers}
    failed = {name: 0 for name in servers}
    try:
        order = list(servers)
        for r in range(args.rounds):
            random.Random(r).shuffle(order)
            for name in order:
                config = LoadConfig(base_url=servers[name][1], num_prompts=args.num_prompts, request_rate=args.rate,
                                    arrival="poisson", random_input_len=512, random_output_len=64,
                                    length_dist="uniform", random_range_ratio=0.5, progress=False)
                run = asyncio.run(run_once(config, "llama", seed=r))
                failed[name] += run.metrics.failed
                for figure, get in FIGURES.items():
                    samples[name][figure].append(float(get(run.metrics)))
                print(f"round {r + 1} {name}: " + ", ".join(f"{f} {samples[name][f][-1]:.1f}" for f in FIGURES),
                      flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    print(f"\n{args.rounds} rounds × {args.num_prompts} requests at {args.rate} req/s (Poisson), prompts 256-768 "
          f"tokens, 64 output tokens; failed requests: {failed}")
    print(f"{'figure':<14} {'colocated':>12} {'disagg':>12} {'disagg / colocated':>26}")
    for figure in FIGURES:
        a, b = np.asarray(samples["colocated"][figure]), np.asarray(samples["disagg"][figure])
        ratio = bootstrap_median(list(b / a))
        print(f"{figure:<14} {np.median(a):>12.1f} {np.median(b):>12.1f} {ratio.fmt(3):>26}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "samples": samples, "failed": failed}, f, indent=1)


if __name__ == "__main__":
    main()
