"""Weights kept at the bits they are stored in: GGUF Q4_1 and Q8_0 blocks as the file holds them, or int8 with
one scale per output row, and a linear that computes with them (fp32 activations, fp32 accumulation).

A BlockWeight is W [n, k] row by row (rows are the output features), each row a run of 32-element blocks:

- q4_1: qs uint8 [n, k/2] (byte j of a block: element j in its low nibble, j + 16 in its high), d and mins
  fp16 [n, k/32]: w = d * q + m;
- q8_0: qs int8 [n, k], d fp16 [n, k/32]: w = d * q;
- int8: qs int8 [n, k], no block scales.

Any of them may carry row_scale, fp32 [n], that multiplies each output (int8's channel scales; a constant
folded into some rows, as attention folds the softmax scale into W_q). Rows can be taken, reordered and
stacked without touching a block, which is all the model's fusions (q|k|v, gate|up) and GGUF's q/k row
order need.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import torch

KIND_CODES = {"q4_1": 0, "q8_0": 1, "int8": 2}  # the native kernels' `kind`
DEQUANTIZED_ROWS = 4096  # W rows dequantized at a time for a BLAS product (16 MB of fp32 at most, for k=1024)
GGML_KINDS = {3: "q4_1", 8: "q8_0"}  # GGUF tensor types read as blocks; others load as fp32

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockWeight:
    """W [n, k] in stored blocks (see the module docstring)."""

    kind: str
    qs: torch.Tensor
    d: torch.Tensor | None = None
    mins: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(n, k): output features, input features."""
        rows, width = self.qs.shape
        return rows, width * 2 if self.kind == "q4_1" else width

    @property
    def dtype(self) -> torch.dtype:
        """The dtype this weight computes in (its activations and outputs)."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes held: quants, block scales and row scales."""
        return sum(t.nbytes for t in (self.qs, self.d, self.mins, self.row_scale) if t is not None)

    def rows(self, index: torch.Tensor | slice) -> "BlockWeight":
        """The rows at index (a slice or int64 indices), blocks untouched."""
        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index].contiguous()

        return BlockWeight(self.kind, pick(self.qs), pick(self.d), pick(self.mins), pick(self.row_scale))

    def scaled(self, factor: float) -> "BlockWeight":
        """This weight times a constant, kept as a row scale (the blocks are not rounded again)."""
        base = self.row_scale if self.row_scale is not None else torch.ones(self.shape[0])
        return replace(self, row_scale=(base * factor).contiguous())

    def dequantize(self, rows: torch.Tensor | None = None, native: bool = False) -> torch.Tensor:
        """W (or its rows at rows, int64) in fp32, row scales applied."""
        if native:
            return torch.ops.infragent.qdequantize(self.qs, self.d, self.mins, self.row_scale, KIND_CODES[self.kind],
                                                   rows)
        picked = self if rows is None else self.rows(rows)
        return picked._dequantize_torch()

    def _dequantize_torch(self) -> torch.Tensor:
        n, k = self.shape
        if self.kind == "q4_1":
            qs = self.qs.view(n, k // 32, 16)
            q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # [n, blocks, 32]: low nibbles first
            w = q.mul_(self.d.float()[..., None]).add_(self.mins.float()[..., None])
        elif self.kind == "q8_0":
            w = self.qs.view(n, k // 32, 32).float().mul_(self.d.float()[..., None])
        else:
            w = self.qs.float()
        w = w.reshape(n, k)
        return w if self.row_scale is None else w.mul_(self.row_scale[:, None])


def stack_rows(parts: list[BlockWeight]) -> BlockWeight:
    """One weight whose rows are the parts' rows in order (all of one kind; row scales kept)."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"cannot stack rows of different block kinds {sorted(kinds)}")

    def cat(name: str) -> torch.Tensor | None:
        tensors = [getattr(p, name) for p in parts]
        if all(t is None for t in tensors):
            return None
        if name == "row_scale":
            tensors = [t if t is not None else torch.ones(p.shape[0]) for t, p in zip(tensors, parts)]
        return torch.cat(tensors).contiguous()

    return BlockWeight(parts[0].kind, cat("qs"), cat("d"), cat("mins"), cat("row_scale"))


def from_gguf(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> BlockWeight:
    """A GGUF tensor's raw bytes (Q4_1 or Q8_0, shape [n, k]) as a BlockWeight, the bytes regrouped per field."""
    kind = GGML_KINDS[ggml_type]
    n, k = shape
    size = 20 if kind == "q4_1" else 34
    blocks = torch.from_numpy(raw.reshape(n, k // 32, size))
    d = blocks[..., 0:2].contiguous().view(torch.float16).reshape(n, k // 32)
    if kind == "q4_1":
        mins = blocks[..., 2:4].contiguous().view(torch.float16).reshape(n, k // 32)
        return BlockWeight(kind, blocks[..., 4:].reshape(n, k // 2).contiguous(), d.contiguous(), mins.contiguous())
    return BlockWeight(kind, blocks[..., 2:].contiguous().view(torch.int8).reshape(n, k), d.contiguous())


def quantize_int8(weight: torch.Tensor) -> BlockWeight:
    """W [n, k] fp32 as int8 with one symmetric scale per row (max |w| / 127)."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    qs = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return BlockWeight("int8", qs.contiguous(), row_scale=scale.contiguous())


class BlockLinear:
    """y = x · Wᵀ with W in stored blocks, through the native kernel, which reads the blocks directly (one row:
    dequantized in registers; more: one cached tile of W at a time against every row). From blas_from rows on
    (weight_choice.py measures where, if anywhere, that pays), W is dequantized for the product, a slice of
    rows at a time, and BLAS runs: the weights stay stored once, at their bits. Without the native kernels, W
    is dequantized per call and BLAS runs."""

    gemm = None  # the projections' `gemm` switch does not apply: these weights are not fp32

    def __init__(self, weight: BlockWeight, native: bool, blas_from: int | None = None) -> None:
        self.weight, self.native = weight, native
        self.code = KIND_CODES[weight.kind]
        self.blas_from = blas_from

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not self.native:
            return torch.mm(x, w.dequantize().t())
        if self.blas_from is not None and x.shape[0] >= self.blas_from:
            return dequantized_product(x, w)
        return torch.ops.infragent.qlinear(x.contiguous(), w.qs, w.d, w.mins, w.row_scale, self.code)

    def weight_bytes(self) -> int:
        """Bytes of the stored blocks and scales."""
        return self.weight.nbytes


def dequantized_product(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """x · Wᵀ by BLAS on W dequantized natively, DEQUANTIZED_ROWS rows of W at a time (a large W, such as an LM
    head, is never whole in fp32)."""
    n = weight.shape[0]
    if n <= DEQUANTIZED_ROWS:
        return torch.mm(x, weight.dequantize(native=True).t())
    out = torch.empty(x.shape[0], n, dtype=x.dtype)
    for r in range(0, n, DEQUANTIZED_ROWS):
        rows = torch.arange(r, min(n, r + DEQUANTIZED_ROWS))
        out[:, r:r + len(rows)] = torch.mm(x, weight.dequantize(rows, native=True).t())
    return out
