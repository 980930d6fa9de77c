"""fp32 vs bf16 (and int8 torch._int_mm where it runs) matmul GFLOP/s on engine-like shapes."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infragent.analysis.stats import bootstrap_median, ratio_summary  # noqa: E402

# (M, K, N): x[M, K] @ W[K, N]. 576x1536 is SmolLM2-135M's MLP up-projection.
SHAPES = [(512, 576, 1536), (1, 576, 1536), (1, 8192, 16384)]
DTYPES = ["fp32", "bf16", "int8"]
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "int8": 1}


def _operands(dtype: str, m: int, k: int, n: int) -> Callable[[], torch.Tensor]:
    """A zero-argument function computing the matmul in dtype (raises if the dtype cannot run)."""
    if dtype == "int8":
        a = torch.randint(-128, 127, (m, k), dtype=torch.int8)
        b = torch.randint(-128, 127, (k, n), dtype=torch.int8)
        fn = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
        a = torch.randn(m, k).to(torch_dtype)
        b = torch.randn(n, k).to(torch_dtype).t()  # weight stored [N, K] as in nn.Linear
        fn = lambda: torch.mm(a, b)  # noqa: E731
    fn()  # fail fast and warm up
    return fn


def time_gflops(fn: Callable[[], torch.Tensor], flops: float, target_s: float) -> float:
    """GFLOP/s of fn averaged over a loop lasting about target_s."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    iters = max(1, int(target_s / once))
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return flops * iters / (time.perf_counter() - start) / 1e9


def run(repeats: int, target_s: float, threads: int) -> dict:
    """Raw GFLOP/s samples per shape and dtype, dtypes interleaved within each repeat."""
    torch.set_num_threads(threads)
    samples: dict[str, dict[str, list[float]]] = {}
    errors: dict[str, str] = {}
    for m, k, n in SHAPES:
        shape = f"{m}x{k}x{n}"
        fns = {}
        for dtype in DTYPES:
            try:
                fns[dtype] = _operands(dtype, m, k, n)
            except Exception as err:  # int8 _int_mm has shape/platform limits
                errors[f"{shape}/{dtype}"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        samples[shape] = {d: [] for d in fns}
        for _ in range(repeats):
            for dtype, fn in fns.items():
                samples[shape][dtype].append(time_gflops(fn, 2.0 * m * k * n, target_s))
    return {"threads": threads, "torch": torch.__version__, "samples": samples, "errors": errors}


def report(result: dict) -> str:
    """Table of median [95% CI] GFLOP/s and the bf16/fp32 and int8/fp32 ratios."""
    lines = [f"matmul GFLOP/s, {result['threads']} threads, torch {result['torch']} "
             f"(median [95% bootstrap CI])"]
    for shape, by_dtype in result["samples"].items():
        cells = [f"{d}={bootstrap_median(v).fmt()}" for d, v in by_dtype.items()]
        lines.append(f"  {shape:>16}: " + "  ".join(cells))
        if shape.startswith("1x"):  # one input row: a GEMV, so report the weight bytes streamed per second
            streams = [f"{d}={bootstrap_median(v).median * ELEMENT_BYTES[d] / 2:.1f}" for d, v in by_dtype.items()]
            lines.append(f"  {'':>16}  weight GB/s: " + "  ".join(streams))
        fp32 = by_dtype.get("fp32", [])
        for other in ("bf16", "int8"):
            if other in by_dtype and fp32:
                lines.append(f"  {'':>16}  {other}/fp32 = {ratio_summary(by_dtype[other], fp32).fmt(2)}")
    for key, err in result["errors"].items():
        lines.append(f"  skipped {key}: {err}")
    return "\n".join(lines)


def main() -> None:
    """Measure, print, optionally dump JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3, help="timed loop length per sample")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = run(args.repeats, args.seconds, args.threads)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
