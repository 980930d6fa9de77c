"""Does this BLAS run y = x·Wᵀ faster with W stored [out, in] (F.linear) or [in, out] (x @ Wᵀ-contiguous)?

Weights are 60 distinct 3072×576 matrices (424 MB, like SmolLM2's MLP) so they stream from DRAM
as in a real decode step. The two layouts alternate within each round; the ratio is printed per
batch size with a bootstrap CI over rounds.
    .venv/bin/python benchmarks/linear_layout.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infragent.analysis.stats import ratio_summary  # noqa: E402


def sweep(fn, weights: list[torch.Tensor]) -> float:
    """Seconds to apply fn to every weight once."""
    start = time.perf_counter()
    for w in weights:
        fn(w)
    return time.perf_counter() - start


def main() -> None:
    """Print F.linear / transposed-layout time ratios for decode and prefill batch sizes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_in = [torch.randn(3072, 576) for _ in range(60)]
    in_out = [w.t().contiguous() for w in out_in]
    for batch in (1, 8, 32, 512):
        x = torch.randn(batch, 576)
        linear, transposed = [], []
        for _ in range(2):  # warm-up
            sweep(lambda w: F.linear(x, w), out_in)
            sweep(lambda w: torch.mm(x, w), in_out)
        for _ in range(args.rounds):
            linear.append(sweep(lambda w: F.linear(x, w), out_in))
            transposed.append(sweep(lambda w: torch.mm(x, w), in_out))
        ratio = ratio_summary(linear, transposed)
        print(f"batch {batch:4d}: F.linear[out,in] / mm[in,out] time = {ratio.fmt(2)}  "
              f"(median {sorted(transposed)[len(transposed) // 2] * 1e3:.1f} ms per 424 MB sweep)")


if __name__ == "__main__":
    main()
