"""The stored-block kernels against MKL's fp32 GEMM on SmolLM2-135M's own linear shapes, per batch size.

    PYTHONPATH=src .venv/bin/python benchmarks/qgemm_shapes.py [--rows 1,8,32,128,512] [--isa avx2] [--rounds 7]
        [--a8]

For each shape (qkv, o, gate_up, down: Q4_1; the LM head: Q8_0, as the file holds them) and each number of
activation rows: torch.ops.infragent.qlinear on random blocks of that kind (fp32 activations: weight_format
gguf) against torch.mm on the same weights dequantized to fp32 and kept transposed (the fp32 engine's
layout), and, with --a8, the int8-activation products of gguf-a16 and gguf-a8 on the same blocks; timed in
interleaved rounds; the median per-call time, its GFLOP/s, and the model's total per forward (30 layers of
each projection plus one LM head). Random weights: the LM head's 30 MB may stay in L3 between calls, so batch-1 rates here are above
what a real decode step streams (engine_throughput.py measures that).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_weight_format import random_weight  # noqa: E402

from infragent.engine.kernels import build  # noqa: E402
from infragent.engine.quant.blocks import KIND_CODES  # noqa: E402
from infragent.engine.quant.blocks_a8 import BlockLinearA8  # noqa: E402
from infragent.engine.weight_choice import seconds_per_call  # noqa: E402

SHAPES = [("qkv", "q4_1", 960, 576, 30), ("o", "q4_1", 576, 576, 30), ("gate_up", "q4_1", 3072, 576, 30),
          ("down", "q4_1", 576, 1536, 30), ("lm_head", "q8_0", 49152, 576, 1)]  # name, kind, n, k, per forward
MIN_S = 0.05  # each timing repeats a call for at least this long


def main() -> None:
    """Print the per-shape table and the per-forward totals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,128,512")
    parser.add_argument("--isa", default=None, help="avx512, avx2 or generic (default: the widest here)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--a8", action="store_true", help="also time gguf-a16 and gguf-a8's products")
    args = parser.parse_args()
    build.load()
    torch.set_num_threads(args.threads)
    if args.isa:
        torch.ops.infragent.qgemm_set_isa(args.isa)
    print(f"ISA {torch.ops.infragent.qgemm_isa()}, {args.threads} threads, torch {torch.__version__}, "
          f"median of {args.rounds} interleaved rounds")
    for rows in (int(r) for r in args.rows.split(",")):
        total: dict[str, float] = {}
        for name, kind, n, k, count in SHAPES:
            w = random_weight(kind, n, k, seed=0)
            dense = w.dequantize().t().contiguous()
            x = torch.randn(rows, k)

            def blocks(a: torch.Tensor, w=w, code=KIND_CODES[kind]) -> torch.Tensor:
                return torch.ops.infragent.qlinear(a, w.qs, w.d, w.mins, w.row_scale, code)

            def fp32(a: torch.Tensor, dense=dense) -> torch.Tensor:
                return torch.mm(a, dense)

            contenders = [("blocks", blocks), ("fp32", fp32)]
            if args.a8:
                contenders += [(f"a{8 * digits}", BlockLinearA8(w, native=True, digits=digits)) for digits in (2, 1)]
            times: dict[str, list[float]] = {label: [] for label, _ in contenders}
            for r in range(args.rounds):
                for label, fn in contenders[::1 if r % 2 == 0 else -1]:
                    times[label].append(seconds_per_call(fn, x, MIN_S))
            medians = {label: statistics.median(t) for label, t in times.items()}
            for label, m in medians.items():
                total[label] = total.get(label, 0.0) + count * m
            flops = 2 * rows * n * k
            print(f"rows {rows:4d} {name:8s} " + " | ".join(
                f"{label} {m * 1e6:9.1f} us {flops / m / 1e9:6.1f} GFLOP/s" for label, m in medians.items()))
        print(f"rows {rows}: the model's linears per forward: " + ", ".join(
            f"{label} {t * 1e3:.2f} ms (x{total['blocks'] / t:.2f} of blocks)" for label, t in total.items()))


if __name__ == "__main__":
    main()
