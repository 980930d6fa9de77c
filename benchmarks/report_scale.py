"""The report at scale: a ledger with 200 trials and 5,000 probe records (each trial's gates, its end-to-end
loadgen sides with raw per-request records, and the tool calls a code proposer makes), plus a 20,000-event
baseline trace. Prints how long building the page takes, its size, and how long headless Chromium takes to
load and lay it out (repeated; median and max), against the issue's limits (≤ 2 s, ≤ 5 MB).

    .venv/bin/python benchmarks/report_scale.py [--trials 200] [--records 5000] [--loads 5] [--keep DIR]

Needs node, playwright-core (make test installs it under .venv/node_modules) and Debian's chromium.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from infragent.lab.ledger import Ledger
from infragent.report.run_page import write_report

ROOT = Path(__file__).resolve().parents[1]
SPEC = """[target]
kind = "engine"
model = "hybrid"

[knobs.max_num_seqs]
type = "int"
domain = [1, 64]

[[scenarios]]
name = "chat"
num_prompts = 24
random_input_len = 300
random_output_len = 24
goodput_ms = { ttft = 800, tpot = 60 }

[[criteria]]
scenario = "chat"
metric = "goodput"
min = 0.5

[[criteria]]
scenario = "chat"
metric = "e2el_median_ms"
max_regression = 0.05
"""


def measure(value: float, spread: float) -> dict:
    return {"value": value, "unit": "", "ci_low": value - spread, "ci_high": value + spread, "n": 3}


def loadgen_file(folder: Path, rng: random.Random, side: str, speed: float) -> tuple[str, str]:
    """A loadgen result with 3 repeats of 24 requests (raw records with token gaps); (path, sha256)."""
    runs = []
    for _ in range(3):
        records = []
        for i in range(24):
            ttft = rng.lognormvariate(-1.2, 0.4) / speed
            itl = [rng.lognormvariate(-3.3, 0.3) / speed for _ in range(23)]
            records.append({"index": i, "prompt_len": rng.choice([100, 300, 700]), "output_len": 24, "start_s": i * 0.1,
                            "success": True, "ttft_s": ttft, "latency_s": ttft + sum(itl), "itl_s": itl,
                            "prompt_tokens": 300, "output_tokens": 24, "error": "", "warmup": False})
        ttfts = sorted(r["ttft_s"] * 1e3 for r in records)
        tpots = sorted((r["latency_s"] - r["ttft_s"]) / 23 * 1e3 for r in records)
        runs.append({"duration_s": 10.0, "records": records, "metrics": {
            "completed": 24, "output_throughput": 57.6 * speed * rng.uniform(0.9, 1.1), "goodput": 2.0 * speed,
            "ttft_ms": {"p99": ttfts[-1]}, "tpot_ms": {"p99": tpots[-1]}}})
    data = json.dumps({"config": {"request_rate": float("inf"), "scenario": "chat", "side": side}, "runs": runs})
    path = folder / f"loadgen-{hashlib.sha256(data.encode()).hexdigest()[:16]}.json"
    path.write_text(data)
    return str(path), hashlib.sha256(data.encode()).hexdigest()


def trace_file(folder: Path, events: int) -> tuple[str, str]:
    """A Chrome trace of engine steps on two threads."""
    out, t = [], 0.0
    for step in range(events // 5):
        out.append({"ph": "X", "name": "step", "ts": t, "dur": 900.0, "pid": 1, "tid": 1})
        for k, name in enumerate(("attention", "mlp", "kda", "sample")):
            out.append({"ph": "X", "name": name, "ts": t + 5 + 200 * k, "dur": 190.0, "pid": 1, "tid": 1 + (k == 3)})
        t += 1000.0
    data = json.dumps({"traceEvents": out})
    path = folder / "trace-baseline.json"
    path.write_text(data)
    return str(path), hashlib.sha256(data.encode()).hexdigest()


def build_ledger(folder: Path, trials: int, records: int, trace_events: int = 20_000) -> Path:
    """The ledger of a long run, written through the Ledger's own API."""
    rng = random.Random(0)
    (folder / "spec.toml").write_text(SPEC)
    ledger = Ledger(folder / "ledger.sqlite")
    run = ledger.start_run("optimize", str(folder / "spec.toml"), "x", ledger.environment({"cpu": "synthetic"}))
    ledger.experiment(run, "baseline", {"max_num_seqs": 1})
    path, sha = trace_file(folder, trace_events)
    ledger.record_probe(run, "ladder/trace", {"probe": "analyze", "verdict": "pass", "finding": "top span mlp",
                                              "evidence": [{"path": path, "sha256": sha, "description": "the analyzed trace"}],
                                              "details": {"cost_s": 3.0}}, artifacts=[(path, "the analyzed trace")])
    tools_per_trial = max(-(-(records - 1 - 5 * trials) // trials), 0)  # at least `records` in all
    for trial in range(trials):
        speed = rng.uniform(0.7, 1.6)
        feasible = speed > 1.0
        judgements = [{"scenario": "chat", "metric": "goodput", "phase": "request", "bucket": "all",
                       "verdict": "pass" if feasible else "fail", "value": 2.0 * speed, "ci": [1.9 * speed, 2.1 * speed],
                       "limit": 0.5, "rule": "min", "confidence": 0.95, "message": "goodput judged"},
                      {"scenario": "chat", "metric": "e2el_median_ms", "phase": "request", "bucket": "all",
                       "verdict": "pass", "value": 900 / speed, "ci": [-0.2, -0.1], "regression": -0.15, "limit": 0.05,
                       "rule": "max_regression", "confidence": 0.95, "message": "e2el judged"}]
        keys = []
        for k in range(tools_per_trial):
            key = f"trial/{trial}/tool/{k}"
            ledger.record_probe(run, key, {"probe": "bench", "verdict": "pass", "finding": f"tool call {k}: bench "
                                           "of the worktree's step", "details": {"cost_s": 0.4, "charged": False}})
        for gate in ("check", "local_ab"):
            key = f"trial/{trial}/{gate}"
            ledger.record_probe(run, key, {"probe": gate, "verdict": "pass", "finding": f"{gate} passed",
                                           "details": {"cost_s": 4.0}})
            keys.append(key)
        ledger.record_probe(run, f"trial/{trial}/e2e", {
            "probe": "end_to_end", "verdict": "pass" if feasible else "fail", "finding": "objective judged",
            "numbers": {"objective_baseline": measure(2.0, 0.1), "objective_candidate": measure(2.0 * speed, 0.1),
                        "objective_ratio": measure(speed, 0.05)},
            "details": {"judgements": judgements, "cost_s": 30.0}})
        keys.append(f"trial/{trial}/e2e")
        for side, factor in (("baseline", 1.0), ("candidate", speed)):
            path, sha = loadgen_file(folder, rng, side, factor)
            key = f"trial/{trial}/chat/{side}"
            ledger.record_probe(run, key, {"probe": "loadgen", "verdict": "pass", "finding": f"{side} measured",
                                           "evidence": [{"path": path, "sha256": sha, "description": "raw records"}],
                                           "details": {"charged": False}}, artifacts=[(path, "raw records")])
            keys.append(key)
        ledger.record_candidate(run, trial, {"trial": trial, "knobs": {"max_num_seqs": rng.randint(2, 64)},
                                             "status": "measured", "feasible": feasible, "objective": 2.0 * speed,
                                             "proposer": "search", "why": "end to end", "judgements": judgements,
                                             "records": keys})
    ledger.set_run(run, status="completed", note="budget: 1000 probes of 1000")
    return folder / "ledger.sqlite"


def load_times(report: Path, loads: int) -> list[float]:
    """Headless Chromium's load of the page (navigation start to load event end), in ms, `loads` times."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    playwright = ROOT / ".venv" / "node_modules"
    if chromium is None or shutil.which("node") is None or not (playwright / "playwright-core").exists():
        raise SystemExit("needs node, playwright-core under .venv/node_modules and Debian's chromium")
    times = []
    for _ in range(loads):
        out = subprocess.run(["node", str(ROOT / "tests" / "render_report.cjs"), report.as_uri(), chromium],
                             capture_output=True, text=True, env={**os.environ, "NODE_PATH": str(playwright)},
                             timeout=300, check=True)
        times.append(json.loads(out.stdout)["timing"]["loadMs"])
    return times


def main() -> None:
    """Build the ledger, write the report, load it in Chromium; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="Build in this folder and keep it (default: a temporary one).")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="report-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    ledger_path = build_ledger(folder, args.trials, args.records)
    ledger = Ledger(ledger_path)
    count = ledger.db.execute("SELECT COUNT(*) FROM probe_results").fetchone()[0]
    started = time.perf_counter()
    report = write_report(ledger, 1, folder / "report.html")
    build_s = time.perf_counter() - started
    times = load_times(report, args.loads)
    size_mb = report.stat().st_size / 1e6
    print(f"{args.trials} trials, {count} probe records: report built in {build_s:.2f} s, {size_mb:.2f} MB "
          f"(limit 5 MB: {'met' if size_mb <= 5 else 'NOT met'})")
    print(f"headless Chromium load, {len(times)} loads: median {statistics.median(times) / 1e3:.2f} s, "
          f"max {max(times) / 1e3:.2f} s, all {[round(t / 1e3, 2) for t in times]} "
          f"(limit 2 s: {'met by every load' if max(times) <= 2000 else 'NOT met'})")
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
