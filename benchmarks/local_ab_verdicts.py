"""Is the loop's local A/B right at its own confidence? Three real SmolLM2 servers: A and A2 identical, P with
a planted 25% decode slowdown (a sleep after each decode step, benchmarks/planted_server.py). The A/A floor
is measured once (A vs A2, its own seed), as the loop does per run; then for each of N seeds, interleaved:

  A/A      local_ab(baseline A, candidate A2)  -> a "win" (verdict pass) is a false win
  planted  local_ab(baseline P, candidate A)   -> a "win" is the 25% detected

Must show (issue 28): at most 1 false win in 20, detected in at least 19 of 20; the time per verdict.

    PYTHONPATH=src .venv/bin/python benchmarks/local_ab_verdicts.py [--seeds 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from infragent.agent.targets.serving_gates import aa_calibration, local_ab
from infragent.lab.environment import capture
from infragent.lab.spec import Scenario, Target
from infragent.lab.target import TargetProcess

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Calibrate the floor, run the verdicts, print the rates and the time per verdict."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--slowdown", type=float, default=0.25)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    scenario = Scenario(name="local", max_concurrency=args.concurrency, random_input_len=64, random_output_len=16)
    serve = ["--threads", "2", "--max-model-len", "512", "--kv-cache-gb", "0.1"]
    baseline = Target(kind="engine", model="llama", serve_args=serve)
    planted = Target(kind="command", base_url="http://127.0.0.1:{port}", ready_url="http://127.0.0.1:{port}/health",
                     command=f"{sys.executable} {HERE / 'planted_server.py'} --decode-slowdown {args.slowdown} "
                             f"serve --model llama --port {{port}} {' '.join(serve)}")
    logs = Path(".infragent/logs")
    env = capture()
    print(f"cpu: {env['cpu']}, {env['cores']} cores; commit {env['git_commit']}", flush=True)
    rows: list[dict] = []
    with TargetProcess(baseline, {}, logs / "local-ab-A.log") as a, \
            TargetProcess(baseline, {}, logs / "local-ab-A2.log") as a2, \
            TargetProcess(planted, {}, logs / "local-ab-P.log") as p:
        started = time.monotonic()
        calibration = aa_calibration(scenario, a.base_url, a2.base_url, seed=7)
        floor = calibration.numbers["aa_floor"].value
        print(f"calibration ({time.monotonic() - started:.0f} s): {calibration.finding}", flush=True)
        for k in range(args.seeds):
            for kind, base, cand, seed in (("A/A", a, a2, 1000 + k), ("planted", p, a, 2000 + k)):
                started = time.monotonic()
                fb = local_ab(scenario, base.base_url, cand.base_url, seed=seed, floor=floor)
                took = time.monotonic() - started
                for proc in (a, a2, p):
                    proc.check_alive()
                rows.append({"kind": kind, "seed": seed, "verdict": fb.verdict, "seconds": round(took, 2),
                             "ratio": fb.numbers["block_ratio"].value, "lo": fb.numbers["block_ratio"].ci_low,
                             "hi": fb.numbers["block_ratio"].ci_high, "looks": fb.details["looks"],
                             "log_ratios": fb.details["log_ratios"]})
                print(f"{kind:8s} seed {seed}: {fb.verdict.upper():12s} ({took:4.1f} s) {fb.finding}", flush=True)
    aa = [r for r in rows if r["kind"] == "A/A"]
    planted_rows = [r for r in rows if r["kind"] == "planted"]
    false_wins = sum(r["verdict"] == "pass" for r in aa)
    false_losses = sum(r["verdict"] == "fail" for r in aa)
    detected = sum(r["verdict"] == "pass" for r in planted_rows)
    seconds = [r["seconds"] for r in rows]
    print(f"A/A floor: {calibration.finding}")
    print(f"false wins (A/A): {false_wins}/{len(aa)}  (false losses {false_losses}/{len(aa)}; must show: <= 1 win)")
    print(f"planted {args.slowdown:.0%} decode slowdown detected: {detected}/{len(planted_rows)}  (must show: >= 19)")
    print(f"time per verdict: median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s; "
          f"second looks: {sum(r['looks'] == 2 for r in rows)}/{len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"floor": floor, "calibration": calibration.finding, "rows": rows},
                                              indent=1))


if __name__ == "__main__":
    main()
