"""Quantize KV rows on write into scaled blocks, one scale per block and head; dequantize whole blocks on read.

A block's scale covers every row written to it so far. When a new row is larger than the scale allows, the
scale grows and the block's earlier rows are re-encoded to it: one more rounding, at most half a step of the
new scale. So a row's error is at most (1 + growths after it) half-steps of the block's final scale. Prefill
writes a block's rows at once (one rounding); decode grows a block token by token, and a new maximum among
16 tokens comes about 3 times. A row at offset 0 starts the block afresh: stale contents never count.
"""
from __future__ import annotations

import torch

from infragent.engine.quant.formats import Format


def write_scaled(data: torch.Tensor, scale: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor,
                 rows: torch.Tensor, fmt: Format) -> None:
    """Store rows [T, heads, d] at (blocks[t], offsets[t]) of data [num_blocks, heads, block_size, d]."""
    fresh = blocks[offsets == 0]
    if fresh.numel():
        scale.index_fill_(0, fresh, 0.0)
    touched, inverse = torch.unique(blocks, return_inverse=True)
    row_amax = rows.abs().amax(dim=-1).float()  # [T, heads]
    needed = torch.zeros(touched.numel(), rows.shape[1]).scatter_reduce_(
        0, inverse[:, None].expand(-1, rows.shape[1]), row_amax, "amax")
    old = scale.index_select(0, touched)
    new = torch.maximum(old, fmt.scale_of(needed))
    grown = ((old > 0) & (new > old)).any(dim=1)
    if bool(grown.any()):
        rescaled = touched[grown]
        ratio = (old[grown] / new[grown])[:, :, None, None]
        data[rescaled] = fmt.encode(data[rescaled].float() * ratio)
    new = torch.where(new > 0, new, torch.ones_like(new))  # all-zero rows: any scale stores them exactly
    scale[touched] = new
    data[blocks, :, offsets] = fmt.encode(rows.float() / new[inverse][:, :, None])


def read_blocks(data: torch.Tensor, scale: torch.Tensor | None, index: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
    """Whole blocks data[index] as out's dtype into out ([n, heads, block_size, d]), times their scales."""
    out.copy_(data.index_select(0, index))
    if scale is not None:
        out.mul_(scale.index_select(0, index)[:, :, None, None])
    return out
