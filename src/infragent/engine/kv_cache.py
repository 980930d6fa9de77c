"""KV cache storage for attention layers (paged or contiguous) and KDA recurrent-state storage."""
from __future__ import annotations

import torch

from infragent.engine.step_inputs import PrefillChunk, StepInputs


class KVCache:
    """Per attention layer, K and V stored head-major as [kv_heads, num_blocks * block_size, head_dim].

    Head-major storage lets decode attention batch its matmuls over (kv_head, sequence) with no
    transposing copy. Paged layout gathers a sequence's context block by block through its block
    table; contiguous layout gives each sequence one region of max_model_len slots and slices it.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, layout: str) -> None:
        shape = (num_kv_heads, num_blocks * block_size, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.block_size = block_size
        self.layout = layout
        # Decode gathers land in reused buffers: fresh multi-MB allocations fault in new pages every layer.
        self._workspace = [torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype)]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's K/V rows ([T, kv_heads, head_dim]) at their slots."""
        self.k[layer].index_copy_(1, slot_mapping, k.transpose(0, 1))
        self.v[layer].index_copy_(1, slot_mapping, v.transpose(0, 1))

    def decode_context(self, layer: int, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every decode's context, padded: [kv_heads, B, L, head_dim]."""
        heads, _, dim = self.k[layer].shape
        shape = (heads, inputs.num_decodes, inputs.decode_context_len, dim)
        k, v = self._blocks(self.k[layer]), self._blocks(self.v[layer])
        if self.layout == "paged":  # whole blocks are copied, not single token rows
            index = inputs.decode_blocks
        else:
            k, v, index = k[:, :, :inputs.decode_context_len], v[:, :, :inputs.decode_context_len], inputs.decode_regions
        return self._gather(0, k, index).view(shape), self._gather(1, v, index).view(shape)

    def _gather(self, which: int, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """index_select along dim 1 into a reused workspace buffer."""
        shape = (source.shape[0], index.numel(), *source.shape[2:])
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        if self._workspace[which].numel() < numel:
            self._workspace[which] = torch.empty(numel, dtype=source.dtype)
        out = self._workspace[which][:numel].view(shape)
        return torch.index_select(source, 1, index, out=out)

    def _blocks(self, t: torch.Tensor) -> torch.Tensor:
        """A layer's storage viewed as [kv_heads, num_blocks, block_size, head_dim]."""
        return t.view(t.shape[0], -1, self.block_size, t.shape[2])

    def chunk_context(self, layer: int, chunk: PrefillChunk) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a prefill chunk's whole context (cached prefix plus chunk): [kv_heads, L, head_dim]."""
        if self.layout == "paged":
            return self.k[layer][:, chunk.context_slots], self.v[layer][:, chunk.context_slots]
        start = chunk.region * self.block_size
        end = start + chunk.context_start + chunk.length
        return self.k[layer][:, start:end], self.v[layer][:, start:end]

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
