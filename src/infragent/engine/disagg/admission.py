"""A decode worker's admission: a request prefilled elsewhere joins the running batch with its prompt's K/V,
its KDA states and its first token copied in."""
from __future__ import annotations

import time

import torch

from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sequence import Sequence


def fits(engine: LLMEngine, seq: Sequence) -> bool:
    """Whether a request prefilled elsewhere fits now (a running place, blocks for its prompt)."""
    return engine.scheduler.can_admit_running(seq, len(seq.prompt_token_ids))


def admit_prefilled(engine: LLMEngine, seq: Sequence, first_token: int, k: torch.Tensor, v: torch.Tensor,
                    kda_state: torch.Tensor | None) -> None:
    """Admit a request prefilled elsewhere (check fits first): its prompt's K/V rows (k, v:
    [attention layers, prompt, row]), its KDA states [kda layers, heads, dk, dv] and its first token."""
    n = seq.num_computed_tokens = len(seq.prompt_token_ids)
    engine.scheduler.admit_running(seq)
    size = engine.kv_cache.block_size
    positions = torch.arange(n)
    blocks, offsets = torch.tensor(seq.block_table)[positions // size], positions % size
    heads = engine.shape.num_kv_heads
    for layer in range(k.shape[0]):
        engine.kv_cache.fill(layer, k[layer].view(n, heads, -1), v[layer].view(n, heads, -1), blocks, offsets)
    if kda_state is not None:
        engine.kda_states.reset([seq.state_slot])  # a speculative rollback's history starts here too
        for layer, state in enumerate(engine.kda_states.states):
            state[seq.state_slot] = kda_state[layer]
    seq.first_token_time = time.perf_counter()
    engine.append_tokens(seq, [first_token], seq.first_token_time)
