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
        if self.layout == "paged":
            return self.k[layer][inputs.decode_slots], self.v[layer][inputs.decode_slots]
        regions, length = inputs.decode_regions, inputs.decode_max_len
        k = self.k[layer].view(-1, self.block_size, *self.k[layer].shape[1:])[:, :length]
        v = self.v[layer].view(-1, self.block_size, *self.v[layer].shape[1:])[:, :length]
        return k.index_select(0, regions), v.index_select(0, regions)

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
