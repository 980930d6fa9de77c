"""Measured CPU roofline numbers: fp32 GEMV weight-streaming bandwidth, fp32 GEMM GFLOP/s, copy GB/s."""
from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch
import torch.nn.functional as F

GIB = 1 << 30


def _best_seconds(fn: Callable[[], object], iters: int, warmup: int = 1) -> float:
    """Fastest wall time of fn over iters calls, after warmup calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemv_bandwidth(weight_bytes: int = GIB, k: int = 4096, iters: int = 8) -> float:
    """Bytes/s of an fp32 [N, K] weight streamed by F.linear on one input row (decode-like GEMV)."""
    n = weight_bytes // (4 * k)
    weight = torch.randn(n, k)
    x = torch.randn(1, k)
    seconds = _best_seconds(lambda: F.linear(x, weight), iters)
    return weight.numel() * 4 / seconds


def matmul_gflops(m: int = 2048, k: int = 2048, n: int = 2048, iters: int = 5,
                  dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of an [m, k] @ [k, n] matmul in dtype."""
    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    seconds = _best_seconds(lambda: torch.mm(a, b), iters)
    return 2.0 * m * k * n / seconds / 1e9


def copy_bandwidth(nbytes: int = GIB // 2, iters: int = 5) -> float:
    """Bytes/s moved (read + write) by an fp32 tensor copy far bigger than cache."""
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), iters)
    return 2.0 * src.numel() * 4 / seconds


def measure_peaks(threads: int = 2, quick: bool = False) -> dict[str, float]:
    """All roofline numbers for this machine at the given torch thread count."""
    torch.set_num_threads(threads)
    iters = 3 if quick else 8
    return {
        "threads": threads,
        "gemv_fp32_bytes_per_s": gemv_bandwidth(iters=iters),
        "matmul_fp32_gflops": matmul_gflops(iters=max(2, iters // 2)),
        "copy_bytes_per_s": copy_bandwidth(iters=iters),
    }


def format_peaks(peaks: dict[str, float]) -> str:
    """One line per roofline number."""
    return (f"GEMV fp32 weight stream: {peaks['gemv_fp32_bytes_per_s'] / 1e9:.2f} GB/s\n"
            f"matmul fp32:             {peaks['matmul_fp32_gflops']:.1f} GFLOP/s\n"
            f"copy (read+write):       {peaks['copy_bytes_per_s'] / 1e9:.2f} GB/s")


def main() -> None:
    """Measure and print (or dump as JSON) the machine peaks."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    peaks = measure_peaks(args.threads, args.quick)
    print(json.dumps(peaks) if args.json else format_peaks(peaks))


if __name__ == "__main__":
    main()
