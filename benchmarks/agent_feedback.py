"""Issue 21's figures: budgets kept, bench on the right metric, gil on uninstrumented code, compact replies.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/agent_feedback.py [--gil-runs 10] [--json out.json]

Prints, each measured here and now:
- bench with budget_s=2 on two 1-second callables: wall seconds and the verdict;
- a fixed-duration pair whose work differs 10x: bench --metric return's work-rate ratio with its CI, and
  what wall-time mode says of the same pair;
- gil on the uninstrumented contended and fixed workloads: verdict, the starved thread's GIL-wait share with
  its interval, the holder and its function, over N runs each;
- the compact reply's size for each of those results;
- every other probe past its budget (record, gil, loadgen, quality on work longer than the budget): wall
  seconds against the budget and the verdict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
os.environ.setdefault("INFRAGENT_ARTIFACTS", tempfile.mkdtemp(prefix="agent-feedback-"))

import agent_cases as cases  # noqa: E402
from infragent.probes.bench import run_bench  # noqa: E402
from infragent.probes.compact import compact_json  # noqa: E402
from infragent.probes.gil import run_gil  # noqa: E402


def budget() -> dict:
    """bench, budget 2 s, two 1-s callables."""
    started = time.monotonic()
    fb = run_bench(cases.one_second, cases.one_second_too, budget_s=2.0)
    return {"wall_s": round(time.monotonic() - started, 2), "verdict": fb.verdict, "finding": fb.finding,
            "reply_bytes": len(compact_json(fb).encode())}


def metric() -> dict:
    """The fixed-duration pair under both metrics."""
    ret = run_bench(cases.fixed_fast, cases.fixed_slow, budget_s=3.0, metric="return")
    rate = ret.numbers["work_rate_ratio"]
    wall = run_bench(cases.fixed_fast, cases.fixed_slow, budget_s=2.0)
    return {"return": {"verdict": ret.verdict, "work_rate_ratio": [rate.value, rate.ci_low, rate.ci_high],
                       "pairs": ret.details["pairs"], "finding": ret.finding},
            "time": {"verdict": wall.verdict, "finding": wall.finding}}


def _timed(budget_s: float, probe) -> dict:
    started = time.monotonic()
    fb = probe()
    return {"budget_s": budget_s, "wall_s": round(time.monotonic() - started, 2), "verdict": fb.verdict,
            "finding": fb.finding[:200], "reply_bytes": len(compact_json(fb).encode())}


def past_budget() -> dict:
    """record, gil, loadgen and quality on work that outlasts their budgets."""
    import asyncio
    import threading

    from budget_cases import endless_steps
    from infragent.probes.loadgen import LoadConfig, run_loadgen
    from infragent.probes.mock_endpoint import serve_mock
    from infragent.probes.quality import quality_of
    from infragent.probes.record import run_record

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(serve_mock(), loop).result(10)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    load = LoadConfig(base_url=url, num_prompts=100, request_rate=10.0, arrival="constant", warmup=1,
                      random_input_len=16, random_output_len=4, repeats=3, progress=False, budget_s=1.5)
    trace = Path(os.environ["INFRAGENT_ARTIFACTS"]) / "endless.json"
    here = os.getcwd()
    os.chdir(ROOT / "tests")
    try:
        return {"record": _timed(1.0, lambda: run_record(endless_steps, trace, budget_s=1.0)),
                "gil": _timed(4.0, lambda: run_gil("gil_cases:contended_endless_bare", timeout_s=4.0)),
                "loadgen": _timed(1.5, lambda: run_loadgen(load)),
                "quality": _timed(20.0, lambda: quality_of("llama", {"kv_cache_dtype": "int8"}, budget_s=20.0))}
    finally:
        os.chdir(here)


def gil(runs: int) -> dict:
    """Uninstrumented contended and fixed workloads, runs each, alternating."""
    os.chdir(ROOT / "tests")
    out: dict[str, list] = {"contended_bare": [], "released_bare": []}
    for _ in range(runs):
        for name in out:
            fb = run_gil(f"gil_cases:{name}")
            worst = fb.details["threads"][0] if fb.details.get("threads") else {}
            out[name].append({"verdict": fb.verdict, "thread": worst.get("thread"),
                              "gil_wait": worst.get("gil_wait_share"), "ci": worst.get("gil_wait_ci"),
                              "holder": fb.locality.get("holder"), "function": fb.locality.get("holder_function"),
                              "reply_bytes": len(compact_json(fb).encode())})
    return out


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gil-runs", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = Path(args.json).resolve() if args.json else None  # gil() runs from tests/
    results = {"budget": budget(), "metric": metric(), "past_budget": past_budget(), "gil": gil(args.gil_runs)}
    b = results["budget"]
    print(f"bench budget_s=2, two 1-s callables: {b['wall_s']} s, {b['verdict']}; reply {b['reply_bytes']} B")
    m = results["metric"]
    r = m["return"]["work_rate_ratio"]
    print(f"fixed-duration pair, --metric return: {m['return']['verdict']}, work per second x{r[0]:.2f} "
          f"[{r[1]:.2f}, {r[2]:.2f}] over {m['return']['pairs']} pairs")
    print(f"same pair, wall time: {m['time']['verdict']}: {m['time']['finding'][:160]}")
    for name, row in results["past_budget"].items():
        print(f"{name} past its budget_s={row['budget_s']:g}: {row['wall_s']} s, {row['verdict']}; "
              f"reply {row['reply_bytes']} B: {row['finding'][:120]}")
    for name, rows in results["gil"].items():
        if not rows:
            continue
        verdicts = [row["verdict"] for row in rows]
        print(f"gil {name}: {verdicts.count('fail')} fail, {verdicts.count('pass')} pass, "
              f"{verdicts.count('inconclusive')} inconclusive of {len(rows)}; largest reply "
              f"{max(row['reply_bytes'] for row in rows)} B")
        for row in rows:
            ci = row["ci"] or [float("nan")] * 2
            print(f"    {row['verdict']:12s} {row['thread']}: GIL wait {row['gil_wait']:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"
                  f"; holder {row['holder']} in {row['function']}")
    if out is not None:
        out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
