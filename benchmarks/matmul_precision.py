"""Error against fp64 of each matmul precision mode (fp32, bf16, bf16x3, bf16x6, tf32, tf32x3), by K.

    PYTHONPATH=src .venv/bin/python benchmarks/matmul_precision.py [--device cuda]

On CPU the reduced-precision modes are emulated (operands rounded, products in fp32); on CUDA tf32 and
tf32x3 use the real TF32 tensor-core path. Prints max relative error per mode and K, and each mode's
ratio to fp32 (issue 3: bf16x3 at most 10x fp32, plain bf16 at least 100x worse).
"""
from __future__ import annotations

import argparse

from infragent.probes.precision import MODES, matmul_error, render_matmul_error


def main() -> None:
    """Measure and print the error table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, nargs="+", default=[64, 256, 1024, 4096, 16384])
    args = parser.parse_args()
    rows = matmul_error(MODES, tuple(args.k), device=args.device)
    print(render_matmul_error(rows))
    fp32 = {r.k: r.max_rel_err for r in rows if r.mode == "fp32"}
    print("\nratio to fp32 (max rel err):")
    for mode in MODES[1:]:
        ratios = "  ".join(f"K={r.k}: {r.max_rel_err / fp32[r.k]:8.1f}x" for r in rows if r.mode == mode)
        print(f"  {mode:7s} {ratios}")


if __name__ == "__main__":
    main()
