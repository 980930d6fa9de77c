"""The criteria engine on real runs: a planted 8% prefill regression must fail (naming phase and bucket),
and an A/A pair must pass. Three real `infragent serve` targets with SmolLM2-135M: two identical baselines
(A, A2) and one with prefill steps made 8% slower (benchmarks/planted_server.py). Each repeat sends the same
prompts (seed = repeat) to all three, request by request in shuffled order (lab.measure.interleaved_repeat).

    PYTHONPATH=src .venv/bin/python benchmarks/criteria_planted.py [--repeats 3] [--prompts 24]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from infragent.lab.criteria import Run, judge
from infragent.lab.measure import interleaved_repeat
from infragent.lab.spec import Criterion, Scenario, Target
from infragent.lab.target import TargetProcess

HERE = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    """Measure baseline twice and the planted candidate once per repeat; judge both comparisons."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--slowdown", type=float, default=0.08)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    scenario = Scenario(name="mixed", num_prompts=args.prompts, max_concurrency=1, random_input_len=300,
                        random_output_len=4, length_dist="uniform", random_range_ratio=0.7, repeats=args.repeats)
    port = _port()
    base_url = f"http://127.0.0.1:{port}"
    planted = Target(kind="command", base_url=base_url, ready_url=f"{base_url}/health",
                     command=f"{sys.executable} {HERE / 'planted_server.py'} --prefill-slowdown {args.slowdown} "
                             f"serve --model llama --port {port} --threads 2")
    baseline = Target(kind="engine", model="llama", serve_args=["--threads", "2"])
    logs = Path(".infragent/logs")
    runs: dict[str, list[Run]] = {"A": [], "A2": [], "B": []}
    # A2 is a second baseline server: the same prompts sent twice to one server would hit its prefix cache.
    with TargetProcess(baseline, {}, logs / "baseline.log") as a, \
            TargetProcess(baseline, {}, logs / "baseline2.log") as a2, \
            TargetProcess(planted, {}, logs / "planted.log") as b:
        for repeat in range(args.repeats):  # each request goes to all three back to back, in random order
            trio = interleaved_repeat(scenario, {"A": a.base_url, "A2": a2.base_url, "B": b.base_url}, repeat)
            for name, run in trio.items():
                runs[name].append(run)
    criterion = Criterion(scenario="mixed", metric="ttft_median_ms", bucket="each", max_regression=0.05)
    result = {}
    for label, cand, base in (("planted +8% prefill vs baseline", runs["B"], runs["A"]),
                              ("A/A (baseline vs baseline)", runs["A2"], runs["A"])):
        judgements = judge(criterion, cand, base, bounds=tuple(scenario.buckets))
        print(f"{label}:")
        for j in judgements:
            print(f"  {j.verdict.upper():4s} {j.message}")
        result[label] = [j.__dict__ for j in judgements]
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
