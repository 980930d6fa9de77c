"""The engine-slo pack on a local Ray cluster: a head that holds no trials and two worker nodes of one CPU each
(ray.cluster_utils.Cluster, on this machine), `infragent optimize engine-slo --executor ray --budget-trials 4`.
Prints each trial's node and clock from the ledger, how long trials overlapped, the criteria of the best
trial and the report's path; --local also runs the local executor with the same budget for comparison.

    PYTHONPATH=src .venv/bin/python benchmarks/ray_engine_slo.py --out /tmp/ray-slo [--local] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from infragent.lab.ledger import Ledger

SRC = Path(__file__).parents[1] / "src"


def optimize(out: Path, *flags: str) -> tuple[int, float]:
    """One `infragent optimize engine-slo` run into out/ledger.sqlite; (return code, seconds)."""
    argv = [sys.executable, "-m", "infragent.cli", "optimize", "engine-slo", "--ledger", str(out / "ledger.sqlite"),
            "--budget-trials", "4", "--budget-probes", "60", "--budget-minutes", "40", *flags]
    begun = time.monotonic()
    done = subprocess.run(argv, cwd=out, env={**os.environ, "PYTHONPATH": str(SRC)})
    return done.returncode, time.monotonic() - begun


def summary(ledger: Ledger, run: int) -> dict:
    """Per trial: node, clock, status, objective; the overlap of trials in time; the run's note."""
    trials = ledger.candidates(run)
    rows = [{k: t.get(k) for k in ("trial", "node", "started_at", "finished_at", "status", "objective", "feasible",
                                   "knobs", "why")} for t in trials]
    timed = sorted((t["started_at"], t["finished_at"]) for t in trials if t.get("started_at"))
    overlap = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for i, a in enumerate(timed) for b in timed[i + 1:])
    return {"run": ledger.run(run), "trials": rows, "overlap_s": overlap,
            "trial_seconds": sum(b - a for a, b in timed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local", action="store_true", help="also the local executor, same budget")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        out = args.out / "ray"
        out.mkdir(parents=True, exist_ok=True)
        rc, seconds = optimize(out, "--executor", "ray", "--ray-address", cluster.address)
        results["ray"] = {"rc": rc, "wall_s": seconds, **summary(Ledger(out / "ledger.sqlite"), 1)}
    finally:
        ray.shutdown()
        cluster.shutdown()
    if args.local:
        out = args.out / "local"
        out.mkdir(parents=True, exist_ok=True)
        rc, seconds = optimize(out)
        results["local"] = {"rc": rc, "wall_s": seconds, **summary(Ledger(out / "ledger.sqlite"), 1)}
    for name, r in results.items():
        print(f"\n{name}: rc {r['rc']}, {r['wall_s']:.0f} s wall, trials' own time {r['trial_seconds']:.0f} s, "
              f"overlap {r['overlap_s']:.0f} s; run {r['run']['status']}: {r['run']['note'] or ''}")
        for t in r["trials"]:
            clock = (f"{t['started_at'] - r['run']['created']:6.0f} → {t['finished_at'] - r['run']['created']:6.0f} s"
                     if t["started_at"] else "")
            print(f"  trial {t['trial']} {t['node'] or 'here'} {clock} {t['status']} objective {t['objective']} "
                  f"{t['knobs']}: {t['why'][:120]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
