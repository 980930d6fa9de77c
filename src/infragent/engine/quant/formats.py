"""Number formats the engine stores tensors in, with symmetric scales, and the round-trip error each allows.

A scaled format stores x / scale, where scale = amax / qmax over the group that shares it (a token's row, an
output channel, a KV block's head): int8 rounds to the nearest integer in [-127, 127]; fp8 e4m3 rounds to the
nearest of its values in [-448, 448]. Unscaled formats (fp32, bf16) store the values themselves.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    """How values are stored: the storage dtype and, for scaled formats, the largest stored magnitude."""

    name: str
    dtype: torch.dtype
    qmax: float | None  # None: stored as is, no scale

    @property
    def scaled(self) -> bool:
        return self.qmax is not None

    @property
    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()

    def encode(self, scaled: torch.Tensor) -> torch.Tensor:
        """Values already divided by their scale → storage dtype (round to nearest, saturate at ±qmax)."""
        if self.dtype == torch.int8:
            return scaled.round().clamp_(-127, 127).to(torch.int8)
        if self.qmax is not None:
            return scaled.clamp(-self.qmax, self.qmax).to(self.dtype)
        return scaled.to(self.dtype)

    def scale_of(self, amax: torch.Tensor) -> torch.Tensor:
        """The scale a group with this absolute maximum gets (1 for unscaled formats)."""
        if self.qmax is None:
            return torch.ones_like(amax)
        return amax / self.qmax

    def error_bound(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Elementwise bound on |x - decode(encode(x / scale)) * scale| (scale broadcast to x)."""
        if self.dtype == torch.int8:
            return scale / 2 + _ulp_slack(x)  # half a step
        if self.dtype == torch.float32:
            return torch.zeros_like(x)
        info = torch.finfo(self.dtype)
        mantissa = {torch.bfloat16: 7, torch.float16: 10, torch.float8_e4m3fn: 3}[self.dtype]
        # relative half-ulp for normals; below the smallest normal, half the subnormal spacing
        relative = x.abs() * 2.0 ** -(mantissa + 1)
        subnormal = scale * info.smallest_normal * 2.0 ** -(mantissa + 1)
        return torch.maximum(relative, subnormal) + _ulp_slack(x)


def _ulp_slack(x: torch.Tensor) -> torch.Tensor:
    """fp32 rounding in the divide and multiply around the stored value: a few ulps of x."""
    return x.abs() * 4 * torch.finfo(torch.float32).eps


FORMATS: dict[str, Format] = {
    "fp32": Format("fp32", torch.float32, None),
    "bf16": Format("bf16", torch.bfloat16, None),
    "fp8": Format("fp8", torch.float8_e4m3fn, float(torch.finfo(torch.float8_e4m3fn).max)),
    "int8": Format("int8", torch.int8, 127.0),
}


def quantize(x: torch.Tensor, fmt: Format, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored values, scale) with one scale per slice along dim (keepdim, fp32); all-zero slices get scale 1."""
    amax = x.abs().amax(dim=dim, keepdim=True).float()
    scale = fmt.scale_of(amax)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return fmt.encode(x / scale), scale


def dequantize(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values back from stored values and their (broadcastable) scale."""
    return stored.float() * scale
