"""Quantized linears, drop-in for layers.Linear (same call, same [in, out] weight): W8A8 and weight-only int8.

W8A8: weights int8 with one scale per output channel, activations int8 with a dynamic scale per token (row),
the integer product exact, then y = acc * x_scale * w_scale. The exact product is torch._int_mm where it is
fast; where it is not (on an AMD EPYC, torch 2.13's CPU _int_mm ran 20x slower than an fp32 matmul of the same
shape), the same integers multiplied in fp32, the int8 weights widened per product (they stay stored at a
quarter of fp32): products of int8 are at most 127², so any sum of up to EXACT_K of them stays below 2**24 and
is exact, and longer rows are summed in slices of EXACT_K in float64. Both give the same bits; which runs is
measured once per process (int_mm_is_fast). With SmoothQuant factors s (one per
input channel) the weight rows are multiplied by s before quantizing and the activations divided by s, which
moves outliers from activations to weights (y is unchanged in exact arithmetic).

Weight-only int8: the same weights; activations stay fp32.
"""
from __future__ import annotations

import functools
import time

import torch

from infragent.engine.quant.formats import FORMATS, quantize

INT8 = FORMATS["int8"]
QUANTIZATIONS = ("w8a8", "int8-weight")
EXACT_K = 1024  # 1024 * 127**2 < 2**24: a sum of this many int8 products is exact in fp32


@functools.lru_cache(maxsize=1)
def int_mm_is_fast() -> bool:
    """Whether torch._int_mm beats the exact fp32 product on a layer-sized shape here (median of 3 tries)."""
    gen = torch.Generator().manual_seed(0)
    qx = torch.randint(-127, 128, (64, 576), dtype=torch.int8, generator=gen)
    qw = torch.randint(-127, 128, (576, 576), dtype=torch.int8, generator=gen)

    def seconds(fn) -> float:
        fn()
        tries = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            tries.append(time.perf_counter() - start)
        return sorted(tries)[1]

    return seconds(lambda: torch._int_mm(qx, qw)) < seconds(lambda: exact_int_product(qx.float(), qw.float()))


def exact_int_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [m, k] · w [k, n] for integer-valued fp32 x and w in [-127, 127]: exactly the integer product, as fp32
    (rounded once, as int32 -> fp32 rounds)."""
    k = x.shape[1]
    if k <= EXACT_K:
        return torch.mm(x, w)
    total = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64)
    for start in range(0, k, EXACT_K):
        total += torch.mm(x[:, start:start + EXACT_K], w[start:start + EXACT_K]).double()
    return total.float()


class W8A8Linear:
    """y ≈ x · W with int8 x (per-token scale) and int8 W (per-output-channel scale), int32 accumulation."""

    def __init__(self, weight_t: torch.Tensor, smooth: torch.Tensor | None = None) -> None:
        weight_t = weight_t.float()
        self.inv_smooth = None
        if smooth is not None:
            weight_t = weight_t * smooth[:, None]
            self.inv_smooth = (1.0 / smooth).contiguous()
        self.qweight, scale = quantize(weight_t, INT8, dim=0)  # [in, out] int8, [1, out]
        self.scale = scale.reshape(-1).contiguous()
        self.int_mm = int_mm_is_fast()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.inv_smooth is not None:
            x = x * self.inv_smooth
        qx, x_scale = quantize(x, INT8, dim=-1)  # per token
        if self.int_mm:
            acc = torch._int_mm(qx, self.qweight).float()
        else:
            acc = exact_int_product(qx.float(), self.qweight.float())
        return acc.mul_(x_scale).mul_(self.scale)

    def weight_bytes(self) -> int:
        """Bytes of stored weights, scales and smoothing factors."""
        extra = self.inv_smooth.numel() * 4 if self.inv_smooth is not None else 0
        return self.qweight.numel() + self.scale.numel() * 4 + extra


class Int8WeightLinear:
    """y ≈ x · W with int8 W (per-output-channel scale) and fp32 x: W is widened to fp32 for each product.

    Stored weights take a quarter of the memory; the product still streams an fp32 copy. (torch's
    aten._weight_int8pack_mm measured 7-100x slower than this on the session-5 CPU, so it is not used.)
    """

    def __init__(self, weight_t: torch.Tensor) -> None:
        self.qweight, scale = quantize(weight_t.float(), INT8, dim=0)  # [in, out] int8, [1, out]
        self.scale = scale.reshape(-1).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.qweight.to(x.dtype)).mul_(self.scale)

    def weight_bytes(self) -> int:
        """Bytes of stored weights and scales."""
        return self.qweight.numel() + self.scale.numel() * 4
