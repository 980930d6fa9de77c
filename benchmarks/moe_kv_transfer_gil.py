"""Case study 2 in its real setting: an expert-parallel MoE prefill whose dispatch/combine hold the GIL,
starving the KV-transfer thread (the pack's MoE workload: kv-transfer-gil/moe_workload.py).

One hybrid-MoE engine on two expert-parallel ranks (the second in its own process), three modes per round in
random order, each on a fresh random prompt:
  none      no KV transfer (the baseline prefill)
  held      KV transfer on; dispatch/combine through the native exchange loaded with ctypes.PyDLL (the bug)
  released  KV transfer on; the same calls through ctypes.CDLL (the fix)
(the workload's docstring says why its model is shaped as it is: the host-waits-for-the-device analogy)
Prints each mode's prefill regression against `none` (median of the per-round ratios, 95% bootstrap CI), then
from one traced prefill per mode: how much of the transfer ran alongside dispatch/combine, their share of the
prefill, and what `analyze` reports. With --gemm, the same figures for the GEMM-based case
(benchmarks/kv_transfer_gil.py's modes) in the same run, for comparison.

    PYTHONPATH=src .venv/bin/python benchmarks/moe_kv_transfer_gil.py [--rounds 20] [--gemm] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import sys
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


def load_workload(name: str = "moe_workload"):  # noqa: ANN201 (a module)
    """One of the pack's workload modules (the pack folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, PACK / f"{name}.py")
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
    span_s = {n: float(trace.dur[trace.select(n)].sum()) / 1e9 for n in (*EXCHANGE, "prefill", "kv.transfer")}
    row["span_s"] = span_s
    row["exchange_share_of_prefill"] = (span_s["moe.dispatch"] + span_s["moe.combine"]) / max(span_s["prefill"], 1e-9)
    return row


def gemm_prefill_s(workload, mode: str, prompt: list[int]) -> float:  # noqa: ANN001
    """The GEMM-based case (workload.py): one prefill in mode, timed the same way."""
    start = time.perf_counter()
    if mode == "none":
        workload.prefill_without_transfer(prompt)
    else:
        workload.prefill(prompt, release_gil=mode == "released")
    return time.perf_counter() - start


def gemm_traced(workload, mode: str, prompt: list[int]) -> dict:  # noqa: ANN001
    """The GEMM case's trace figures: kv.transfer against the held/released GEMMs."""
    with Recorder(thread_cpu=True) as rec:
        gemm_prefill_s(workload, mode, prompt)
    o = overlap(columns_from_trace(rec.trace()), "kv.transfer", "gemm")
    return {"overlap_wall": o.share_of_a, "overlap_executing": o.executing_share_of_a, "never": o.never}


def main() -> None:
    """Interleaved rounds, then one traced prefill per mode; print ratios, overlaps and analyze's finding."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gemm", action="store_true", help="also the GEMM-based case, in the same rounds")
    parser.add_argument("--json", default=None)
    parser.add_argument("--model", default=None, help="JSON of HybridConfig fields over the workload's MODEL "
                        "(to explore shapes; the pack's own runs use MODEL as written)")
    parser.add_argument("--tokens", type=int, default=None, help="prompt tokens instead of PROMPT_TOKENS")
    parser.add_argument("--block-size", type=int, default=None, help="KV block size instead of BLOCK_SIZE")
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (seconds): "
                        "how long a thread may keep the GIL when another asks for it")
    parser.add_argument("--kv-cache-gb", type=float, default=None, help="KV cache size instead of KV_CACHE_GB")
    args = parser.parse_args()
    workload = load_workload()
    if args.model:
        workload.MODEL = dataclasses.replace(workload.MODEL, **json.loads(args.model))
    if args.tokens:
        workload.PROMPT_TOKENS = args.tokens
    if args.block_size:
        workload.BLOCK_SIZE = args.block_size
    if args.kv_cache_gb:
        workload.KV_CACHE_GB = args.kv_cache_gb
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    print(f"MoE model: {workload.MODEL}; {workload.PROMPT_TOKENS}-token prompts, KV blocks of "
          f"{workload.BLOCK_SIZE} tokens, {workload.KV_CACHE_GB} GB")
    gemm = load_workload("workload") if args.gemm else None
    rng = random.Random(0)

    def prompt(tokens: int) -> list[int]:
        return [rng.randrange(*workload.TOKEN_RANGE) for _ in range(tokens)]

    workload.engine()  # build, start the second rank, warm up
    runs = {("moe", m): lambda m, p: prefill_s(workload, m, p) for m in MODES}
    if gemm is not None:
        for m in MODES:
            gemm.engine({"none": "none", "held": "held", "released": "released"}[m])
            runs[("gemm", m)] = lambda m, p: gemm_prefill_s(gemm, m, p)
    tokens = {"moe": workload.PROMPT_TOKENS, "gemm": gemm.PROMPT_TOKENS if gemm else 0}
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key in rng.sample(list(runs), len(runs)):
            samples[key].append(runs[key](key[1], prompt(tokens[key[0]])))
    result: dict = {"tokens": tokens, "samples_s": {f"{c}/{m}": v for (c, m), v in samples.items()}, "cases": {}}
    for case in ("moe", "gemm") if gemm is not None else ("moe",):
        for mode in MODES:
            row = (traced(workload, mode, prompt(tokens[case])) if case == "moe"
                   else gemm_traced(gemm, mode, prompt(tokens[case])) if mode != "none" else {})
            median = sorted(samples[(case, mode)])[len(samples[(case, mode)]) // 2]
            if mode != "none":
                s = paired_ratio(samples[(case, "none")], samples[(case, mode)])  # same rounds, back to back
                row["ratio"] = s.__dict__
                against = "dispatch/combine" if case == "moe" else "gemm"
                running = (row["overlap_executing"] if case == "gemm" else
                           max(v or 0.0 for v in row["overlap_executing"].values()))
                print(f"{case:4s} {mode:8s} prefill vs no transfer: {s.median - 1:+.1%} [{s.lo - 1:+.1%}, "
                      f"{s.hi - 1:+.1%}] ({len(samples[(case, mode)])} rounds, median {1e3 * median:.0f} ms); "
                      f"transfer running alongside {against} {running or 0.0:.1%} of its CPU time; never: {row['never']}")
                if case == "moe":
                    print(f"          analyze: {row['verdict'].upper()}: {row['finding'][:300]}")
            else:
                print(f"{case:4s} {mode:8s} prefill median {1e3 * median:.0f} ms")
            if case == "moe":
                print(f"          dispatch + combine {row['exchange_share_of_prefill']:.1%} of the prefill span; "
                      f"kv.transfer spans {1e3 * row['span_s']['kv.transfer']:.1f} ms")
            result["cases"].setdefault(case, {})[mode] = row
    workload.close()
    if gemm is not None:
        gemm.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))

if __name__ == "__main__":
    main()
