"""StepInputs: the flattened tensors and per-group metadata one model forward consumes."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillChunk:
    """A run of query tokens of one sequence (query length > 1, or the sequence's first tokens)."""

    start: int  # first row in the flattened token batch
    length: int
    context_start: int  # tokens of this sequence already in the cache before this chunk
    context_blocks: torch.Tensor | None  # block table covering the context, when context_start > 0 (paged)
    region: int  # the sequence's region (contiguous layout) / first block
    state_slot: int | None  # KDA state slot


@dataclass
class StepInputs:
    """Everything the layers need for one step; decodes occupy the first num_decodes rows."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_blocks: torch.Tensor  # [T] cache block each token's K/V is written to
    slot_offsets: torch.Tensor  # [T] position inside that block
    num_decodes: int
    decode_blocks: torch.Tensor | None  # [B * width] block ids of each decode's padded block table (paged)
    decode_regions: torch.Tensor | None  # [B] region of each decode (contiguous)
    decode_mask: torch.Tensor | None  # [B, L] additive mask over gathered positions; None if none padded
    decode_context_len: int  # L: positions gathered per decode
    decode_state_slots: torch.Tensor | None  # [B] KDA slots
    prefills: list[PrefillChunk] = field(default_factory=list)
    logits_rows: torch.Tensor | None = None  # rows whose next-token logits are needed
    # speculative decoding: each sequence's last token and drafts, after the plain decodes and counted in
    # num_decodes (attention runs them as decodes); KDA runs them token by token with a rollback
    verifies: list[PrefillChunk] = field(default_factory=list)
    transfer_rows: torch.Tensor | None = None  # with a KV transfer: the rows at prompt positions (they go out)
    decode_context_lens: torch.Tensor | None = None  # [B] context length of each decode row
    rope_cos: torch.Tensor | None = None  # [T, 1, head_dim] rotary tables at this step's positions
    rope_sin: torch.Tensor | None = None

    @property
    def num_verify_rows(self) -> int:
        """Rows of the verifications (the last num_verify_rows of the decode rows)."""
        return sum(v.length for v in self.verifies)
