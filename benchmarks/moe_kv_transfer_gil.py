"""Case study 2 in its real setting: an expert-parallel MoE prefill whose dispatch/combine hold the GIL,
starving the KV-transfer thread (the pack's MoE workload: kv-transfer-gil/moe_workload.py).

One hybrid-MoE engine on two expert-parallel ranks (the second in its own process), three modes per round in
random order, each on a fresh random prompt:
  none      no KV transfer (the baseline prefill)
  held      KV transfer on; dispatch/combine through the native exchange loaded with ctypes.PyDLL (the bug)
  released  KV transfer on; the same calls through ctypes.CDLL (the fix)
Prints each mode's prefill regression against `none` (median of the per-round ratios, 95% bootstrap CI), then
from one traced prefill per mode: how much of the transfer ran alongside dispatch/combine, their share of the
prefill, and what `analyze` reports. With --gemm, the same figures for the GEMM-based case
(benchmarks/kv_transfer_gil.py's modes) in the same run, for comparison.

    PYTHONPATH=src .venv/bin/python benchmarks/moe_kv_transfer_gil.py [--rounds 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from pathlib import Path

from infragent.analysis.overlap import overlap
from infragent.analysis.stats import paired_ratio
from infragent.analysis.trace_load import columns_from_trace
from infragent.probes.analyze import analyze
from infragent.trace import Recorder

PACK = Path(__file__).parents[1] / "src" / "infragent" / "scenarios" / "kv-transfer-gil"
MODES = {"none": dict(transfer=False, release_gil=True), "held": dict(transfer=True, release_gil=False),
         "released": dict(transfer=True, release_gil=True)}
EXCHANGE = ("moe.dispatch", "moe.combine")


def load_workload():  # noqa: ANN201 (a module)
    """The pack's MoE workload module (the pack folder is not a package)."""
    spec = importlib.util.spec_from_file_location("moe_workload", PACK / "moe_workload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prefill_s(workload, mode: str, prompt: list[int]) -> float:  # noqa: ANN001
    """Wall time of one prefill in mode (until its KV is in the store)."""
    start = time.perf_counter()
    workload._run(prompt, **MODES[mode])
    return time.perf_counter() - start


def traced(workload, mode: str, prompt: list[int]) -> dict:  # noqa: ANN001
    """One prefill under the recorder (thread CPU time): overlap of kv.transfer with dispatch/combine, the
    exchange's share of the prefill, analyze's finding."""
    with Recorder(thread_cpu=True) as rec:
        prefill_s(workload, mode, prompt)
    trace = columns_from_trace(rec.trace())
    row: dict = {}
    if mode != "none":
        shares = [overlap(trace, "kv.transfer", name) for name in EXCHANGE]
        row.update(overlap_wall={n: o.share_of_a for n, o in zip(EXCHANGE, shares)},
                   overlap_executing={n: o.executing_share_of_a for n, o in zip(EXCHANGE, shares)},
                   never={n: o.never for n, o in zip(EXCHANGE, shares)})
        feedback = analyze(trace, overlaps=[("kv.transfer", name) for name in EXCHANGE])
        row.update(verdict=feedback.verdict, finding=feedback.finding)
    span_s = {n: float(trace.dur[trace.select(n)].sum()) / 1e9 for n in (*EXCHANGE, "prefill")}
    row["exchange_share_of_prefill"] = (span_s["moe.dispatch"] + span_s["moe.combine"]) / max(span_s["prefill"], 1e-9)
    return row


def main() -> None:
    """Interleaved rounds, then one traced prefill per mode; print ratios, overlaps and analyze's finding."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    workload = load_workload()
    rng = random.Random(0)
    tokens = workload.PROMPT_TOKENS
    prompt = lambda: [rng.randrange(*workload.TOKEN_RANGE) for _ in range(tokens)]  # noqa: E731
    workload.engine()  # build, start the second rank, warm up
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in rng.sample(list(MODES), len(MODES)):
            samples[mode].append(prefill_s(workload, mode, prompt()))
    result: dict = {"tokens": tokens, "samples_s": samples, "modes": {}}
    for mode in MODES:
        row = traced(workload, mode, prompt())
        if mode != "none":
            s = paired_ratio(samples["none"], samples[mode])  # each round ran all three back to back
            row["ratio"] = s.__dict__
            print(f"{mode:8s} prefill vs no transfer: {s.median - 1:+.1%} [{s.lo - 1:+.1%}, {s.hi - 1:+.1%}] "
                  f"({len(samples[mode])} rounds); transfer alongside dispatch "
                  f"{row['overlap_executing']['moe.dispatch']:.1%} / combine "
                  f"{row['overlap_executing']['moe.combine']:.1%} of its running time; never: {row['never']}")
            print(f"         analyze: {row['verdict'].upper()}: {row['finding'][:400]}")
        print(f"{mode:8s} dispatch + combine: {row['exchange_share_of_prefill']:.1%} of the prefill span")
        result["modes"][mode] = row
    workload.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
