"""The roofline on a GPU, in one go: measure the device's peaks, print them as JSON, then roofline a bf16 GEMM
(compute-bound), a large elementwise add (memory-bound) and 24 tiny ops (overhead-bound), plus an fp32 GEMM with
TF32 off and on (the fp32 and tf32 roofs), printing each classification. About a minute on an H200.

    PYTHONPATH=src python benchmarks/gpu_roofline_check.py [--device cuda:0] [--cached] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from infragent.probes.gpu_peaks import fp32_matmul_tf32, gpu_peaks, measure_gpu_peaks, tf32_allowed
from infragent.probes.machine import store_json
from infragent.probes.roofline import run_roofline


def on(device: str, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Callable[..., tuple]:
    """An inputs factory of random tensors of these shapes, drawn on device."""
    def factory(trial: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device).manual_seed(trial)
        return tuple(torch.randn(*s, device=device, dtype=dtype, generator=g) for s in shapes)
    return factory


def tiny_ops(x: torch.Tensor) -> torch.Tensor:
    """24 tiny kernels in a row."""
    for _ in range(24):
        x = x + 1
    return x


def cases(device: str, n: int) -> list[tuple[str, Callable[..., Any], Callable[..., tuple], bool]]:
    """(label, callable, inputs factory, TF32 allowed) of each example."""
    return [
        (f"bf16 GEMM {n}^3", torch.mm, on(device, (n, n), (n, n), dtype=torch.bfloat16), False),
        ("fp32 add 2 x 256M elements", torch.add, on(device, (1 << 28,), (1 << 28,)), False),
        ("24 tiny adds", tiny_ops, on(device, (4,)), False),
        (f"fp32 GEMM {n}^3, TF32 off", torch.mm, on(device, (n, n), (n, n)), False),
        (f"fp32 GEMM {n}^3, TF32 on", torch.mm, on(device, (n, n), (n, n)), True),
    ]


def main() -> int:
    """Measure, print, roofline, print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--n", type=int, default=8192, help="GEMM size")
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget per callable")
    parser.add_argument("--cached", action="store_true", help="use the cached peaks (measure on a miss)")
    parser.add_argument("--out", help="also write peaks and classifications to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2

    tf32_before = tf32_allowed()
    began = time.perf_counter()
    peaks = gpu_peaks(args.device) if args.cached else measure_gpu_peaks(args.device)
    print(json.dumps({"peaks": peaks.to_dict(),
                      "tf32_setting_restored": tf32_allowed() == tf32_before},
                     indent=2), flush=True)

    rows = []
    for label, fn, factory, tf32 in cases(args.device, args.n):
        with fp32_matmul_tf32(tf32):
            fb = run_roofline(fn, factory, peaks=peaks, budget_s=args.budget_s)
        d, nums = fb.details, fb.numbers
        row = {"case": label, "bound": d["bound"], "roof": d["roof"], "compute_roof": d["roofs"]["compute_name"],
               "pct_of_peak": round(nums["pct_of_peak"].value, 1), "time_us": round(nums["time_us"].value, 2),
               "flops": nums["flops"].value, "bytes": nums["bytes"].value, "ops": d["counts"]["ops"],
               "verdict": fb.verdict, "finding": fb.finding}
        rows.append(row)
        print(f"{label:34s} {row['bound']:15s} {row['pct_of_peak']:6.1f}% of {row['roof']}  "
              f"({row['time_us']} µs; compute roof: {row['compute_roof']})\n    {fb.finding}", flush=True)
        torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - began:.1f} s")
    if args.out:
        store_json(Path(args.out), {"peaks": peaks.to_dict(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
