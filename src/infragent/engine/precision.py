"""Matmul precision modes, emulated on CPU and real on CUDA (TF32): what reduced-precision GEMMs do to results.

Precision modes of `matmul(a, b, mode)` (fp32 operands, fp32 result):

- fp32:   IEEE fp32 products and accumulation (TF32 switched off on CUDA).
- bf16:   operands rounded to bf16 (8-bit significand), exact products, fp32 accumulation.
- bf16x3: a = hi + lo with hi = bf16(a), lo = bf16(a - hi); hi·hi + hi·lo + lo·hi, fp32 accumulation.
          Two bf16 pieces hold ~16 significand bits and the dropped lo·lo term is ~2^-16 relative, so
          bf16x3 is ~2^-16 per product: far better than bf16, yet 10-30x worse than fp32 on
          zero-mean data at small K (fp32's own accumulation error narrows the gap as K grows).
- bf16x6: a = hi + mid + lo (three bf16 pieces) and the six products of order <= 2; fp32 parity.
- tf32:   operands rounded to TF32 (11-bit significand, round to nearest even), fp32 accumulation.
          On CUDA the hardware TF32 path is used (it converts operands itself).
- tf32x3: a = hi + lo with TF32 pieces (~22 bits); hi·hi + hi·lo + lo·hi recovers ~fp32 accuracy.
          On CUDA the three products run on the TF32 tensor-core path with pre-rounded operands.

On CPU every mode is emulated: the pieces are exactly representable, a bf16 or TF32 product is exact
in fp32, so emulation differs from the hardware only in summation order.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

MODES = ("fp32", "bf16", "bf16x3", "bf16x6", "tf32", "tf32x3")


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to the nearest bf16 (ties to even) and return them as fp32."""
    return x.to(torch.bfloat16).to(x.dtype)


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32's 10 stored mantissa bits (nearest, ties to even); Inf/NaN kept.

    Works on the bit pattern: adding 0xFFF plus the lowest kept bit to the magnitude bits and masking
    off the low 13 bits rounds the magnitude; the sign bit is untouched (the carry stops at the
    exponent, and an overflow becomes ±Inf as IEEE rounding requires).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_tf32 takes float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + (0xFFF + ((bits >> 13) & 1))) & ~0x1FFF
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def split(x: torch.Tensor, rounding: Callable[[torch.Tensor], torch.Tensor], parts: int) -> list[torch.Tensor]:
    """x ≈ sum of `parts` pieces, each representable after `rounding` (hi first; residuals in fp32)."""
    pieces, rest = [], x
    for _ in range(parts):
        piece = rounding(rest)
        pieces.append(piece)
        rest = rest - piece
    return pieces


@contextmanager
def _cuda_tf32(enabled: bool) -> Iterator[None]:
    """Switch cuBLAS fp32 matmuls to TF32 (or IEEE) for the block, restoring the setting after."""
    matmul_backend = torch.backends.cuda.matmul
    if hasattr(matmul_backend, "fp32_precision"):  # torch >= 2.9; do not mix with the legacy flag
        previous = matmul_backend.fp32_precision
        matmul_backend.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul_backend.fp32_precision = previous
    else:
        previous_flag = matmul_backend.allow_tf32
        matmul_backend.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul_backend.allow_tf32 = previous_flag


def _sum_of_products(a_parts: list[torch.Tensor], b_parts: list[torch.Tensor], order: int) -> torch.Tensor:
    """Σ a_i @ b_j over i + j <= order, smallest terms first (fp32 accumulation)."""
    terms = [(i + j, i, j) for i in range(len(a_parts)) for j in range(len(b_parts)) if i + j <= order]
    out = None
    for _, i, j in sorted(terms, reverse=True):
        product = a_parts[i] @ b_parts[j]
        out = product if out is None else out + product
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, mode: str = "fp32") -> torch.Tensor:
    """a @ b (fp32 tensors) computed in one of MODES; see the module docstring for each mode."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    a, b = a.float(), b.float()
    cuda = a.is_cuda
    if mode == "fp32":
        if cuda:
            with _cuda_tf32(False):
                return a @ b
        return a @ b
    if mode == "tf32" and cuda:
        with _cuda_tf32(True):
            return a @ b
    rounding = round_tf32 if mode.startswith("tf32") else round_bf16
    parts, order = {"bf16": (1, 0), "tf32": (1, 0), "bf16x3": (2, 1), "tf32x3": (2, 1), "bf16x6": (3, 2)}[mode]
    a_parts, b_parts = split(a, rounding, parts), split(b, rounding, parts)
    if cuda:  # pieces are exact in TF32, so the tensor-core path computes exact products
        with _cuda_tf32(True):
            return _sum_of_products(a_parts, b_parts, order)
    return _sum_of_products(a_parts, b_parts, order)
