"""weight_format gguf-a8 and gguf-a16: the file's Q4_1 and Q8_0 blocks times activations quantized per
32-element block to one int8 digit (a8, as llama.cpp computes them) or two (a16: the first digit's rounding
remainder quantized again, in steps of 1/128 of the first). Each block product is an exact integer sum,
scaled once per block into fp32. The activations' rounding changes the numbers: one digit measurably (the
quality gates say how much), two digits by at most max|x_b| / 32512 per activation.

For activation row x and weight row w, block b (32 elements), t = x_b · 127 / max|x_b|:
    one digit:   x_b ≈ xd_b · q1,               q1 = round(t),                    xd_b = max|x_b| / 127
    two digits:  x_b ≈ xd_b · (128 q1 + q2),    q2 = round(128 (t - q1)),         xd_b = max|x_b| / 127 / 128
    y = Σ_b  d_b · xd_b · (w_b · xq_b)  +  m_b · Σ x_b        (Q4_1: w = d·q + m; Q8_0: m = 0)
where Σ x_b is the exact fp32 sum (llama.cpp uses xd_b · Σ xq_b there).
"""
from __future__ import annotations

import torch

from infragent.engine.quant.blocks import KIND_CODES, BlockWeight

A8_KINDS = ("q4_1", "q8_0")  # block kinds the int8-activation kernels take
DIGITS = {"gguf-a8": 1, "gguf-a16": 2}  # weight_format -> int8 digits per activation


def quantize_activations(x: torch.Tensor, digits: int = 1) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """x [m, k] fp32 per 32-element block: ([q1, (q2)] int8 [m, k], xd [m, k/32] the scale of 128·q1 + q2 (or
    of q1), xs [m, k/32] exact sums), rounded to nearest even as the native kernels round."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // 32, 32)
    amax = blocks.abs().amax(dim=-1)
    # a tensor over a tensor: IEEE division, as the kernels divide (a number over a tensor rounds differently)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    t = blocks * inverse[..., None]
    first = torch.round(t)
    xq = [first.to(torch.int8).reshape(m, k)]
    if digits == 2:
        xq.append(torch.round((t - first) * 128.0).to(torch.int8).reshape(m, k))
    return xq, amax / 127.0 / (128.0 if digits == 2 else 1.0), blocks.sum(dim=-1)


def reference_a8(x: torch.Tensor, weight: BlockWeight, digits: int = 1) -> torch.Tensor:
    """y = x · Wᵀ the int8-activation way, in torch (the kernels' reference, and the path without them)."""
    n, k = weight.shape
    xq, xd, xs = quantize_activations(x, digits)
    integers = xq[0].double() * 128 + xq[1].double() if digits == 2 else xq[0].double()
    xhat = (integers.reshape(-1, k // 32, 32) * xd.double()[..., None]).reshape(-1, k)
    mins = None if weight.mins is None else torch.zeros_like(weight.mins)
    scaled = BlockWeight(weight.kind, weight.qs, weight.d, mins).dequantize()  # d · q: no mins, no row scale
    y = xhat @ scaled.double().t()
    if weight.mins is not None:
        y += xs.double() @ weight.mins.double().t()
    if weight.row_scale is not None:
        y *= weight.row_scale.double()
    return y.float()


class BlockLinearA8:
    """y = x · Wᵀ with W in Q4_1/Q8_0 blocks and x quantized per block to `digits` int8 digits. With the native
    kernels W is regrouped once (16 rows side by side, torch.ops.infragent.qpack_a8) and the stored blocks are
    let go; without them, reference_a8 runs on the blocks."""

    gemm = None  # the projections' `gemm` switch does not apply: these weights are not fp32

    def __init__(self, weight: BlockWeight, native: bool, digits: int = 1) -> None:
        if weight.kind not in A8_KINDS:
            raise ValueError(f"int8 activations take {' or '.join(A8_KINDS)} blocks, not {weight.kind}")
        if digits not in (1, 2):
            raise ValueError(f"digits: {digits}; 1 (int8 activations) or 2 (two int8 digits)")
        self.kind, self.shape, self.row_scale, self.digits = weight.kind, weight.shape, weight.row_scale, digits
        self.code = KIND_CODES[weight.kind]
        self.weight: BlockWeight | None = weight
        self.packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.native = native

    @property
    def native(self) -> bool:
        """Whether the native kernels run this linear (set True: the weight is packed for them)."""
        return self.packed is not None

    @native.setter
    def native(self, on: bool) -> None:
        if on and self.packed is None:
            w = self.weight
            self.packed = torch.ops.infragent.qpack_a8(w.qs, w.d, w.mins, self.code)
            self.weight = None
        elif not on and self.packed is not None:
            raise ValueError("a packed int8-activation linear cannot go back to the torch path")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            packed, pd, pm = self.packed
            return torch.ops.infragent.qlinear_a8(x.contiguous(), packed, pd, pm, self.row_scale, self.code,
                                                  self.shape[0], self.digits)
        return reference_a8(x, self.weight, self.digits)

    def weight_bytes(self) -> int:
        """Bytes held: the packed blocks and scales, or the stored blocks."""
        held = self.packed if self.packed is not None else (self.weight.qs, self.weight.d, self.weight.mins)
        extra = self.row_scale.nbytes if self.row_scale is not None else 0
        return sum(t.nbytes for t in held if t is not None) + extra
