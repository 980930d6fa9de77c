"""Proposing drafts before a step: for each running greedy sequence past its prompt, up to
num_speculative_tokens from the draft model or from n-gram lookup in its own tokens."""
from __future__ import annotations

from infragent.engine.config import EngineConfig
from infragent.engine.sequence import Sequence
from infragent.engine.speculative.draft_model import DraftModel
from infragent.engine.speculative.ngram import propose_ngram


def propose_drafts(running: list[Sequence], config: EngineConfig, draft_model: DraftModel | None,
                   max_model_len: int) -> None:
    """Set draft_token_ids on every running sequence that can be verified this step (greedy, no logit
    adjustments, its prompt computed); never past max_tokens or the context."""
    for seq in running:
        if seq.num_computed_tokens != len(seq) - 1 or not seq.params.greedy or seq.params.adjusts_logits:
            continue
        room = min(seq.params.max_tokens - len(seq.output_token_ids), max_model_len - len(seq)) - 1
        k = min(config.num_speculative_tokens, room)
        if draft_model is not None:
            seq.draft_token_ids = draft_model.propose(seq.token_ids, k) if k > 0 else []
        else:
            seq.draft_token_ids = propose_ngram(seq.token_ids, k, config.prompt_lookup_max, config.prompt_lookup_min)
