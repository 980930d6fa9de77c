"""weight_format gguf-a8: the file's Q4_1 and Q8_0 blocks times activations quantized to int8 per 32-element
block, as llama.cpp computes them. Each block product is an exact integer sum, scaled once per block into
fp32; the activations' rounding changes the numbers (a little: the quality gates measure how much), which is
why this is a knob value of its own and never chosen by weight_format auto.

For activation row x and weight row w, block b (32 elements): x ≈ xd_b · xq_b with xq_b int8 =
round(x_b · 127 / max|x_b|), and
    y = Σ_b  d_b · xd_b · (q_b · xq_b)  +  m_b · Σ x_b        (Q4_1: w = d·q + m; Q8_0: m = 0)
where Σ x_b is the exact fp32 sum (llama.cpp uses xd_b · Σ xq_b there).
"""
from __future__ import annotations

import torch

from infragent.engine.quant.blocks import KIND_CODES, BlockWeight

A8_KINDS = ("q4_1", "q8_0")  # block kinds the int8-activation kernels take


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [m, k] fp32 per 32-element block: (xq int8 [m, k], xd [m, k/32] scales, xs [m, k/32] exact sums),
    rounded to nearest even as the native kernels round."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // 32, 32)
    amax = blocks.abs().amax(dim=-1)
    # a tensor over a tensor: IEEE division, as the kernels divide (a number over a tensor rounds differently)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(blocks * inverse[..., None]).to(torch.int8).reshape(m, k)
    return xq, amax / 127.0, blocks.sum(dim=-1)


def reference_a8(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """y = x · Wᵀ the int8-activation way, in torch (the kernels' reference, and the path without them)."""
    n, k = weight.shape
    xq, xd, xs = quantize_activations(x)
    xhat = (xq.float().reshape(-1, k // 32, 32) * xd[..., None]).reshape(-1, k)
    mins = None if weight.mins is None else torch.zeros_like(weight.mins)
    scaled = BlockWeight(weight.kind, weight.qs, weight.d, mins).dequantize()  # d · q: no mins, no row scale
    y = xhat.double() @ scaled.double().t()
    if weight.mins is not None:
        y += xs.double() @ weight.mins.double().t()
    if weight.row_scale is not None:
        y *= weight.row_scale.double()
    return y.float()


class BlockLinearA8:
    """y = x · Wᵀ with W in Q4_1/Q8_0 blocks and x quantized to int8 per block. With the native kernels W is
    regrouped once (16 rows side by side, torch.ops.infragent.qpack_a8) and the stored blocks are let go;
    without them, reference_a8 runs on the blocks."""

    gemm = None  # the projections' `gemm` switch does not apply: these weights are not fp32

    def __init__(self, weight: BlockWeight, native: bool) -> None:
        if weight.kind not in A8_KINDS:
            raise ValueError(f"int8 activations take {' or '.join(A8_KINDS)} blocks, not {weight.kind}")
        self.kind, self.shape, self.row_scale = weight.kind, weight.shape, weight.row_scale
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
                                                  self.shape[0])
        return reference_a8(x, self.weight)

    def weight_bytes(self) -> int:
        """Bytes held: the packed blocks and scales, or the stored blocks."""
        held = self.packed if self.packed is not None else (self.weight.qs, self.weight.d, self.weight.mins)
        extra = self.row_scale.nbytes if self.row_scale is not None else 0
        return sum(t.nbytes for t in held if t is not None) + extra
