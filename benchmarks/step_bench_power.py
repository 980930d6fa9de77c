"""Whether the step bench decides: A/A intervals that contain 1, a planted slowdown's fix found, a no-op patch
never accepted. Engine children from copies of this project's src/ (the llama model, SmolLM2 weights).

    PYTHONPATH=src .venv/bin/python benchmarks/step_bench_power.py [--aa-runs 20] [--fix-runs 10] [--noop-runs 10]
        [--sleep-ms 6]

- A/A: the baseline's code against itself (step_floor, every block), fresh children per run; counts the
  95% intervals that contain 1.
- fix: a copy whose every engine step sleeps --sleep-ms (the planted slowdown) as the baseline, the same
  code without the sleep as the candidate; step_bench with its A/A floor (StepAA), as the loop runs it.
- no-op: a copy with a comment added as the candidate against the baseline; step_bench with its A/A floor.
Prints each run's verdict, ratio, blocks and seconds; raw rows to --out. Run alone: it times things.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import infragent  # noqa: E402
from infragent.analysis.blocks import block_estimate  # noqa: E402
from infragent.probes.step_bench import STEP_TRIM, StepAA, StepWorker, step_bench, step_floor  # noqa: E402
from step_unit_spread import CONFIG, shapes  # noqa: E402

STEP_LINE = '        with span("step"):\n'


def copy_of(dest: Path, edit: str = "") -> Path:
    """src/infragent copied to dest/src; edit: "sleep:MS" (a sleep in every step) or "comment"."""
    shutil.copytree(Path(infragent.__file__).resolve().parent, dest / "src" / "infragent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    engine = dest / "src" / "infragent" / "engine" / "llm_engine.py"
    text = engine.read_text()
    assert STEP_LINE in text, "LLMEngine.step_updates moved: update benchmarks/step_bench_power.py"
    if edit.startswith("sleep:"):
        seconds = float(edit.split(":")[1]) / 1000
        text = text.replace(STEP_LINE, f"        __import__('time').sleep({seconds})  # planted\n" + STEP_LINE)
    elif edit == "comment":
        text = text.replace(STEP_LINE, "        # a comment: a patch that changes nothing\n" + STEP_LINE)
    engine.write_text(text)
    return dest


def row(kind: str, run: int, fb, seconds: float) -> dict:  # noqa: ANN001
    """One run's result as data."""
    ratio = fb.numbers.get("total_ratio") or fb.numbers.get("aa_ratio")
    logs = fb.details.get("log_ratios", {}).get("total", [])
    wide = block_estimate(logs, 0.99, STEP_TRIM) if len(logs) > 1 else None  # the bench's own decision interval
    return {"kind": kind, "run": run, "verdict": fb.verdict, "ratio": ratio.value, "lo": ratio.ci_low,
            "hi": ratio.ci_high, "lo99": wide.lo if wide else None, "hi99": wide.hi if wide else None,
            "blocks": ratio.n, "floor": (fb.numbers.get("floor") or fb.numbers["aa_floor"]).value,
            "seconds": round(seconds, 1), "log_ratios": logs, "finding": fb.finding}


def compare(base_code: Path, cand_code: Path, unit) -> object:  # noqa: ANN001
    """step_bench as the loop runs it: a kept A/A of the baseline's code for the floor."""
    base, cand = StepWorker(base_code, CONFIG, "baseline"), StepWorker(cand_code, CONFIG, "candidate")
    aa = StepAA(base_code, CONFIG)
    try:
        base.ready(), cand.ready()
        return step_bench(base, cand, unit, aa=lambda margin: aa.floor(base, unit, margin)[0])
    finally:
        base.close(), cand.close(), aa.close()


def main() -> None:
    """A/A runs, fix runs, no-op runs; a summary line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--aa-runs", type=int, default=20)
    parser.add_argument("--fix-runs", type=int, default=10)
    parser.add_argument("--noop-runs", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=6.0)
    parser.add_argument("--shape", default="2 x 32 x 4")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "step_bench_power.json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="step-power-"))
    plain, slow, noop = copy_of(folder / "plain"), copy_of(folder / "slow", f"sleep:{args.sleep_ms}"), \
        copy_of(folder / "noop", "comment")
    unit = shapes()[args.shape]
    rows = []

    def report(r: dict) -> None:
        rows.append(r)
        print(f"{r['kind']} {r['run']}: {r['verdict']} x{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] "
              f"{r['blocks']} blocks, floor {r['floor']:.3f}, {r['seconds']} s", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # kept after every run: an interrupted run keeps its rows
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))

    for run in range(args.aa_runs):
        started = time.monotonic()
        base, twin = StepWorker(plain, CONFIG, "baseline"), StepWorker(plain, CONFIG, "twin")
        try:
            base.ready(), twin.ready()
            fb = step_floor(base, twin, unit, margin=-1.0)  # never settled: every block
        finally:
            base.close(), twin.close()
        report(row("aa", run, fb, time.monotonic() - started))
    for run in range(args.fix_runs):
        started = time.monotonic()
        report(row("fix", run, compare(slow, plain, unit), time.monotonic() - started))
    for run in range(args.noop_runs):
        started = time.monotonic()
        report(row("noop", run, compare(plain, noop, unit), time.monotonic() - started))
    aa = [r for r in rows if r["kind"] == "aa"]
    fix = [r for r in rows if r["kind"] == "fix"]
    noops = [r for r in rows if r["kind"] == "noop"]
    if aa:
        print(f"A/A: the 95% interval contains 1 in {sum(r['lo'] <= 1 <= r['hi'] for r in aa)}/{len(aa)} runs, "
              f"the 99% one (the bench's decisions) in {sum(r['lo99'] <= 1 <= r['hi99'] for r in aa)}/{len(aa)}; "
              f"mean ratio x{math.exp(sum(math.log(r['ratio']) for r in aa) / len(aa)):.4f}")
    if fix:
        print(f"fix (sleep {args.sleep_ms} ms a step): accepted {sum(r['verdict'] == 'pass' for r in fix)}/{len(fix)}, "
              f"mean {sum(r['seconds'] for r in fix) / len(fix):.0f} s a run")
    if noops:
        print(f"no-op patch: accepted {sum(r['verdict'] == 'pass' for r in noops)}/{len(noops)}")
    print(f"raw: {args.out}")


if __name__ == "__main__":
    main()
