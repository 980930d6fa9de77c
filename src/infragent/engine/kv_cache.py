"""KV cache storage for attention layers (paged or contiguous) and KDA recurrent-state storage."""
from __future__ import annotations

import torch

from infragent.engine.step_inputs import PrefillChunk, StepInputs


class KVCache:
    """Per attention layer, K and V stored flat as [num_blocks * block_size, kv_heads, head_dim].

    Paged layout gathers a sequence's context through its block table; contiguous layout gives
    each sequence one region of max_model_len slots and reads it as a slice.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, layout: str) -> None:
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.block_size = block_size
        self.layout = layout

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's K/V rows at their slots."""
        self.k[layer].index_copy_(0, slot_mapping, k)
        self.v[layer].index_copy_(0, slot_mapping, v)

    def decode_context(self, layer: int, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every decode's context, padded: [B, Lmax, kv_heads, head_dim]."""
        batch = inputs.num_decodes
        k, v = self.blocks(layer)
        if self.layout == "paged":  # whole blocks are gathered: one contiguous copy per block, not per token
            shape = (batch, inputs.decode_context_len, *k.shape[2:])
            return k.index_select(0, inputs.decode_blocks).view(shape), v.index_select(0, inputs.decode_blocks).view(shape)
        length = inputs.decode_context_len
        return k[:, :length].index_select(0, inputs.decode_regions), v[:, :length].index_select(0, inputs.decode_regions)

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer viewed as [num_blocks, block_size, kv_heads, head_dim]."""
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, self.block_size, *k.shape[1:]), v.view(-1, self.block_size, *v.shape[1:])

    def chunk_context(self, layer: int, chunk: PrefillChunk) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a prefill chunk's whole context (cached prefix plus chunk): [L, kv_heads, head_dim]."""
        if self.layout == "paged":
            return self.k[layer][chunk.context_slots], self.v[layer][chunk.context_slots]
        start = chunk.region * self.block_size
        end = start + chunk.context_start + chunk.length
        return self.k[layer][start:end], self.v[layer][start:end]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class KDAStateCache:
    """Per KDA layer, fp32 recurrent states [num_slots, heads, dk, dv]."""

    def __init__(self, num_layers: int, num_slots: int, num_heads: int, dk: int, dv: int) -> None:
        self.states = [torch.zeros(num_slots, num_heads, dk, dv) for _ in range(num_layers)]

    def reset(self, slots: list[int]) -> None:
        """Zero the states of newly assigned slots."""
        if slots:
            index = torch.tensor(slots)
            for s in self.states:
                s.index_fill_(0, index, 0.0)

    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.states)
