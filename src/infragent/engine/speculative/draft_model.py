"""A draft model made of the target's own first layers plus its final norm and LM head (no extra weights).

It keeps no cache between steps: each draft token re-runs the first layers over the sequence's last
`window` tokens from scratch (KDA state from zero), into small scratch caches. Cheap because the layers are
few and the window short; approximate for the same reasons, which costs acceptance, never correctness:
every draft is verified by the full model.
"""
from __future__ import annotations

import torch

from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.step_inputs import PrefillChunk, StepInputs


class DraftModel:
    """Greedy drafts from model.layers[:num_layers] over a sliding window of the sequence."""

    def __init__(self, model: DecoderModel, num_layers: int, window: int, max_drafts: int) -> None:
        shape = model.shape
        kinds = shape.layer_kinds[:num_layers]
        self.model, self.num_layers, self.window = model, num_layers, window
        length = window + max_drafts
        # one contiguous region holds the window; chunk attention of a fresh sequence never reads it back
        self.kv_cache = KVCache(kinds.count("attention"), 1, length, shape.num_kv_heads, shape.head_dim,
                                model.embed.dtype, "contiguous")
        self.kda_states = (KDAStateCache(kinds.count("kda"), 1, shape.kda_num_heads, shape.kda_head_k_dim,
                                         shape.kda_head_v_dim) if "kda" in kinds else None)

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int) -> list[int]:
        """k greedy draft tokens continuing tokens."""
        drafts: list[int] = []
        for _ in range(k):
            context = (tokens + drafts)[-self.window:]
            first = len(tokens) + len(drafts) - len(context)
            hidden = self.model.forward(self._inputs(context, first), self.kv_cache, self.kda_states,
                                        num_layers=self.num_layers)
            drafts.append(int(self.model.logits(hidden[-1:]).argmax()))
        return drafts

    def _inputs(self, context: list[int], first: int) -> StepInputs:
        """One fresh prefill chunk of the window at its true positions (slot 0, region 0)."""
        if self.kda_states is not None:
            self.kda_states.reset([0])
        n = len(context)
        return StepInputs(
            input_ids=torch.tensor(context), positions=torch.arange(first, first + n),
            slot_blocks=torch.zeros(n, dtype=torch.long), slot_offsets=torch.arange(n), num_decodes=0,
            decode_blocks=None, decode_regions=None, decode_mask=None, decode_context_len=0,
            decode_state_slots=None, prefills=[PrefillChunk(0, n, 0, None, 0, 0)])
