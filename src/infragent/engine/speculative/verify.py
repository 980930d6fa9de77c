"""Greedy verification: drafts are accepted while each equals the target's argmax at its position."""
from __future__ import annotations

import torch


def accept_greedy(logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """logits [1 + d, vocab] at the last token and each of the d drafts → the accepted drafts and the
    target's own token after them (1 to d + 1 tokens): exactly what greedy decoding would have produced."""
    best = logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == best[accepted]:
        accepted += 1
    return drafts[:accepted] + [best[accepted]]
