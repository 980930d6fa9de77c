"""Our trace analysis against Holistic Trace Analysis (HTA) on the same Kineto trace: the same two answers
(comm/compute overlap, temporal breakdown), wall time of the whole process and peak memory of each.

Each run is a fresh process doing exactly: load the trace, temporal breakdown, comm/compute overlap. Runs
alternate between the tools. Peak memory is the largest sum of PSS over the run's process tree (our loader
forks a child that shares the file's pages; PSS counts shared pages once), sampled every 20 ms.

    PYTHONPATH=src .venv/bin/python benchmarks/analyze_vs_hta.py [--kernels 1000000] [--hta-runs 2] [--our-runs 5]

Needs HTA: pip install -e .[hta] (or `pip install --no-deps holistictraceanalysis` plus pandas, plotly,
pydot, networkx).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kineto_synth import write  # noqa: E402

OURS = """
import json, sys
from infragent.analysis.trace_load import load_columns
from infragent.analysis.breakdown import temporal_breakdown
from infragent.analysis.overlap import comm_comp_overlap
c = load_columns(sys.argv[1])
tb = temporal_breakdown(c)
print(json.dumps({"overlap": comm_comp_overlap(c), "idle": tb.pct("idle"), "compute": tb.pct("compute"),
                  "non_compute": tb.pct("non_compute")}))
"""
HTA = """
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
o = a.get_comm_comp_overlap(visualize=False).iloc[0]
t = a.get_temporal_breakdown(visualize=False).iloc[0]
print(json.dumps({"overlap": float(o["comp_comm_overlap_pctg"]), "idle": float(t["idle_time_pctg"]),
                  "compute": float(t["compute_time_pctg"]), "non_compute": float(t["non_compute_time_pctg"])}))
"""


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(tool: str, target: Path) -> dict:
    """One fresh process: wall seconds, peak PSS of its tree (GB) and its answers."""
    code = OURS if tool == "ours" else HTA
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_pss_kb(p) for p in _tree(proc.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{tool} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"tool": tool, "wall_s": wall, "peak_gb": peak[0] / 1e6, "answers": json.loads(out.strip().splitlines()[-1])}


def main() -> None:
    """Generate the trace if needed, alternate the tools, print times, memory, ratio and agreement."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--dir", default="/tmp/infragent-hta-bench")
    parser.add_argument("--hta-runs", type=int, default=2)
    parser.add_argument("--our-runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = Path(args.dir) / f"k{args.kernels}"
    trace = folder / "rank0.json"
    if not trace.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write(trace, args.kernels)
    print(f"trace: {trace} ({trace.stat().st_size / 1e6:.0f} MB, {3 * args.kernels} events)", flush=True)
    plan = ["ours"] * args.our_runs
    for k in range(args.hta_runs):  # spread HTA's runs among ours
        plan.insert(min(len(plan), (k + 1) * (args.our_runs // (args.hta_runs + 1) + 1) + k), "hta")
    runs = []
    for tool in plan:
        r = run(tool, trace if tool == "ours" else folder)
        runs.append(r)
        print(f"  {tool:4s} {r['wall_s']:7.2f} s  peak {r['peak_gb']:.2f} GB  {r['answers']}", flush=True)
    ours = [r for r in runs if r["tool"] == "ours"]
    hta = [r for r in runs if r["tool"] == "hta"]
    med = lambda xs: sorted(xs)[len(xs) // 2] if len(xs) % 2 else sum(sorted(xs)[len(xs) // 2 - 1:len(xs) // 2 + 1]) / 2  # noqa: E731
    o_wall, h_wall = med([r["wall_s"] for r in ours]), med([r["wall_s"] for r in hta])
    o_mem, h_mem = max(r["peak_gb"] for r in ours), max(r["peak_gb"] for r in hta)
    lo = min(r["wall_s"] for r in hta) / max(r["wall_s"] for r in ours)
    hi = max(r["wall_s"] for r in hta) / min(r["wall_s"] for r in ours)
    print(f"wall time: ours median {o_wall:.2f} s, HTA median {h_wall:.1f} s -> {h_wall / o_wall:.1f}x faster "
          f"(range over runs {lo:.1f}x-{hi:.1f}x; goal >= 25x)")
    print(f"peak memory: ours {o_mem:.2f} GB, HTA {h_mem:.2f} GB -> {o_mem / h_mem:.0%} of HTA's (goal <= 50%)")
    worst = max(abs(r["answers"][k] - hta[0]["answers"][k]) for r in ours for k in hta[0]["answers"])
    print(f"agreement: largest difference {worst:.3f} percentage points (goal <= 0.1) "
          f"ours {ours[0]['answers']} HTA {hta[0]['answers']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"trace_mb": trace.stat().st_size / 1e6, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
