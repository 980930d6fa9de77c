"""Quantized linears, drop-in for layers.Linear (same call, same [in, out] weight): W8A8 and weight-only int8.

W8A8: weights int8 with one scale per output channel, activations int8 with a dynamic scale per token (row),
the product in int32 by torch._int_mm, then y = acc * x_scale * w_scale. With SmoothQuant factors s (one per
input channel) the weight rows are multiplied by s before quantizing and the activations divided by s, which
moves outliers from activations to weights (y is unchanged in exact arithmetic).

Weight-only int8: the same weights; activations stay fp32.
"""
from __future__ import annotations

import torch

from infragent.engine.quant.formats import FORMATS, quantize

INT8 = FORMATS["int8"]
QUANTIZATIONS = ("w8a8", "int8-weight")


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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.inv_smooth is not None:
            x = x * self.inv_smooth
        qx, x_scale = quantize(x, INT8, dim=-1)  # per token
        acc = torch._int_mm(qx, self.qweight)
        return acc.float().mul_(x_scale).mul_(self.scale)

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
