"""What a code proposer hands the loop: a patch, why, who made it and how (the transcript the ledger keeps)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proposal:
    """One candidate code change."""

    patch: str
    rationale: str
    proposer: str
    transcript: list[dict[str, Any]] = field(default_factory=list)
    cost_s: float = 0.0


class ProposalError(RuntimeError):
    """A proposer could not produce a patch; `transcript` holds what happened up to the failure."""

    def __init__(self, message: str, transcript: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.transcript = transcript or []


def truncate(text: str, limit: int = 4000) -> str:
    """Text of at most about `limit` characters: the head and tail halves around a note of what was cut."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - limit
    note = f"[... {cut} characters cut: showing the first {head} and last {tail} ...]"
    return f"{text[:head]}\n{note}\n{text[len(text) - tail:]}"
