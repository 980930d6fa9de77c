"""`infragent diagnose` against bottlenecks planted through a server's launch flags, and against the same server
with none planted: how often each is named (and named on the clean server: a false alarm), and what a
diagnosis costs in wall time.

    PYTHONPATH=src .venv/bin/python benchmarks/diagnose_planted.py [--runs 5] [--json out.json]

The server is our own `infragent serve` (the tiny hybrid model, random weights), launched as a subprocess that
diagnose reaches only over HTTP, /proc and py-spy. Cases, each under the load that exposes it:
  cap        --max-num-seqs 2 at concurrency 8 (64-token prompts)        expect "queueing at the batch limit"
  tokenizer  --tokenizer-mode slow, 900-token text prompts, 16 out       expect "tokenization"
and the clean server (--max-num-seqs 16, the native tokenizer) under both loads, where neither may be named.
Run alone on the machine: the diagnosis reads CPU time, and a neighbour's load is what it must tell apart.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from infragent.probes.diagnose import DiagnoseConfig, run_diagnose  # noqa: E402
from server_fixture import process_server  # noqa: E402

LOADS = {"cap": dict(seconds=6, concurrency=8, input_len=64, output_len=32),
         "tokenizer": dict(seconds=8, concurrency=8, input_len=900, output_len=16)}
EXPECTED = {"cap": "queueing at the batch limit", "tokenizer": "tokenization"}
PLANTED = {"cap": ("--max-num-seqs", "2"), "tokenizer": ("--max-num-seqs", "16", "--tokenizer-mode", "slow")}
CLEAN = ("--max-num-seqs", "16")


def diagnosed(url: str, load: dict) -> tuple[list[str], float, str]:
    """The bottleneck kinds one diagnosis named, its wall seconds and its finding."""
    started = time.monotonic()
    fb = run_diagnose(DiagnoseConfig(url, **load))
    return [b["kind"] for b in fb.details["bottlenecks"]], time.monotonic() - started, fb.finding


def main() -> None:
    """Run each case and its clean control --runs times (interleaved) and print the rates."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {model}, {os.cpu_count()} cores")
    results: dict[str, dict[str, list]] = {}
    flags = ("--max-model-len", "1024", "--kv-cache-gb", "0.1")
    with process_server(*flags, *CLEAN) as (clean, _):
        for case, load in LOADS.items():
            with process_server(*flags, *PLANTED[case]) as (planted, _):
                runs = results[case] = {"planted": [], "clean": []}
                for i in range(args.runs):
                    order = [("planted", planted), ("clean", clean)]
                    for side, url in (order if i % 2 == 0 else order[::-1]):
                        kinds, wall, finding = diagnosed(url, load)
                        runs[side].append({"kinds": kinds, "wall_s": round(wall, 1), "finding": finding[:400]})
                        print(f"{case:9s} {side:7s} run {i}: {wall:5.1f} s  {', '.join(kinds) or '-'}")
    print()
    for case, runs in results.items():
        named = sum(EXPECTED[case] in r["kinds"] for r in runs["planted"])
        false = sum(EXPECTED[case] in r["kinds"] for r in runs["clean"])
        walls = [r["wall_s"] for side in runs.values() for r in side]
        print(f"{case:9s} named {named}/{len(runs['planted'])} on the planted server, {false}/{len(runs['clean'])} "
              f"on the clean one; wall per diagnosis median {statistics.median(walls):.1f} s "
              f"({min(walls):.1f}-{max(walls):.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": model, "results": results}, indent=1))


if __name__ == "__main__":
    main()
