"""A linear layer whose tensor-parallel shards lose precision (the brief's first case study).

`linear` dispatches on the local output width the way GEMM heuristics do: a narrow shard (N <= 512, what
each rank sees under TP=2 of a 1024-wide layer) takes the tensor-core path, which multiplies operands
rounded to `precision`; the full width (TP=1) takes the FP32 path. So TP=1 and TP=2 disagree, and only
the partitioned check sees it. The tensor-core path accepts reduced-precision operands only; the fix is
the 3-pass split (bf16x3 / tf32x3: hi·hi + hi·lo + lo·hi), which recovers near-FP32 accuracy.
"""
from __future__ import annotations

import torch

from infragent.probes.inputs import Case
from infragent.probes.precision import matmul

TENSOR_CORE_MAX_N = 512  # output widths up to this take the tensor-core path
N = 1024  # the layer's full output width (TP=1)


def linear(x: torch.Tensor, w: torch.Tensor, precision: str = "bf16") -> torch.Tensor:
    """y = x @ w; narrow outputs go through the tensor-core path in `precision`."""
    if w.shape[1] <= TENSOR_CORE_MAX_N:
        return matmul(x, w, precision)
    return x @ w


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ w in FP32 (TP=1 semantics, whatever the width)."""
    return x @ w


def inputs(trial: int, gen: torch.Generator) -> Case:
    """x[M, K] @ w[K, 1024]: token counts and reduction lengths of a small model's projections."""
    m, k = [(8, 576), (33, 1536), (1, 576), (128, 1024)][trial % 4]
    return Case((torch.randn(m, k, generator=gen), torch.randn(k, N, generator=gen)), label=f"{m}x{k}x{N}",
                reduction=k)


def shard_inputs(trial: int, gen: torch.Generator) -> Case:
    """What one TP=2 rank multiplies: 32 tokens, K 1024, half the output width."""
    return Case((torch.randn(32, 1024, generator=gen), torch.randn(1024, N // 2, generator=gen)),
                label=f"32x1024x{N // 2} (one TP=2 shard)", reduction=1024)
