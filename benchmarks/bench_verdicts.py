"""Does `infragent bench` reach correct A/B verdicts, and how fast, next to pyperf on the same functions?

    PYTHONPATH=src .venv/bin/python benchmarks/bench_verdicts.py [--repeats 20] [--pyperf-runs 3]

Planted case: benchmarks/planted.py, a ~2 ms function and a copy doing exactly 5% more work. Must show
(issue 3): the 5% slowdown detected in >= 19 of 20 repeats, A/A reported as no change in >= 19 of 20,
each verdict in <= 5 s of measuring. pyperf runs its default (worker processes, then compare_to's t-test)
on the same functions; its wall time per comparison and its verdicts are printed beside ours.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import planted  # noqa: E402

from infragent.probes.bench import BenchConfig, run_bench  # noqa: E402


def ours(repeats: int, budget_s: float) -> dict[str, list[dict]]:
    """Run `repeats` slowdown comparisons and `repeats` A/A comparisons, alternating."""
    rows: dict[str, list[dict]] = {"slow": [], "aa": []}
    for i in range(repeats):
        for kind, candidate in (("slow", planted.slow), ("aa", planted.work_again)):
            start = time.perf_counter()
            fb = run_bench(candidate, planted.work, config=BenchConfig(budget_s=budget_s, seed=i))
            rows[kind].append({"outcome": fb.details["outcome"], "wall_s": time.perf_counter() - start,
                               "measuring_s": fb.numbers["measuring_s"].value, "ratio": fb.numbers["ratio"].value,
                               "pairs": fb.details["pairs"]})
    return rows


def pyperf_compare(candidate: str, workdir: Path, index: int) -> dict:
    """pyperf default run of work and of candidate, then compare_to; wall time of the whole comparison."""
    start = time.perf_counter()
    paths = []
    for name in ("work", candidate):
        out = workdir / f"{name}-{index}.json"
        subprocess.run([sys.executable, str(HERE / "pyperf_worker.py"), name, "-o", str(out), "--quiet"],
                       check=True, capture_output=True)
        paths.append(str(out))
    compared = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", *paths], check=True,
                              capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    verdict = compared.lower()
    outcome = "no_change" if "not significant" in verdict else "slower" if "slower" in verdict else "faster"
    return {"outcome": outcome, "wall_s": wall, "output": compared.strip()}


def summarize(name: str, rows: list[dict], expected: str) -> str:
    """'name: 19/20 correct, wall s per verdict median/max'."""
    correct = sum(r["outcome"] == expected for r in rows)
    walls = sorted(r["wall_s"] for r in rows)
    return (f"{name:34s} {correct:2d}/{len(rows)} correct ({expected}); wall per verdict "
            f"median {walls[len(walls) // 2]:.2f} s, max {walls[-1]:.2f} s")


def main() -> None:
    """Run both tools and print correctness and time to verdict."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=5.0)
    parser.add_argument("--pyperf-runs", type=int, default=3, help="pyperf comparisons per case (~40 s each)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = ours(args.repeats, args.budget_s)
    print(summarize("infragent bench, planted +5%", rows["slow"], "slower"))
    print(summarize("infragent bench, A/A", rows["aa"], "no_change"))
    longest = max(r["measuring_s"] for r in rows["slow"] + rows["aa"])
    print(f"  longest measuring time of one verdict: {longest:.2f} s (limit 5 s)")
    result = {"infragent": rows}
    for kind, expected in (("slow", "slower"), ("aa", "no_change")):
        misses = [(r["outcome"], round(r["ratio"], 4), r["pairs"]) for r in rows[kind] if r["outcome"] != expected]
        if misses:
            print(f"  {kind} misses (outcome, ratio, pairs): {misses}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.pyperf_runs:
        with tempfile.TemporaryDirectory() as tmp:
            perf = {"slow": [pyperf_compare("slow", Path(tmp), i) for i in range(args.pyperf_runs)],
                    "aa": [pyperf_compare("work_again", Path(tmp), 100 + i) for i in range(args.pyperf_runs)]}
        print(summarize("pyperf default, planted +5%", perf["slow"], "slower"))
        print(summarize("pyperf default, A/A", perf["aa"], "no_change"))
        result["pyperf"] = perf
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
