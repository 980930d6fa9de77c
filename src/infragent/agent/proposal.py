"""What a proposer hands the loop, and the one interface every proposer has.

A Proposal is knob values and/or a patch, the hypothesis it tests, why, who made it and how (the
transcript the ledger keeps). A Proposer is asked with a ProposalContext (what is known so far, and for a
code proposer a fresh worktree and the probes it may call) and told each candidate's result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from infragent.agent.hypotheses import Hypothesis
    from infragent.agent.workspace import Workspace

Probe = Callable[[dict], str]  # a probe a code proposer may call: arguments in, its verdict as text out


@dataclass
class Proposal:
    """One candidate change: knob values, a patch, or both."""

    patch: str = ""
    rationale: str = ""
    proposer: str = ""
    transcript: list[dict[str, Any]] = field(default_factory=list)
    cost_s: float = 0.0
    knobs: dict[str, Any] = field(default_factory=dict)  # every knob's value for this candidate
    hypothesis: str | None = None  # the key of the hypothesis it tests


@dataclass
class ProposalContext:
    """What a proposer is told when asked for one candidate."""

    info: dict[str, Any]  # the target, criteria, hypotheses, earlier trials: JSON for an outside proposer
    hypotheses: list["Hypothesis"]
    trials: list[dict[str, Any]]
    baseline_knobs: dict[str, Any]
    workspace: "Workspace | None" = None  # a fresh worktree of the target's code (code proposers)
    probes: dict[str, Probe] = field(default_factory=dict)  # the probes a code proposer may call, charged


class Proposer(Protocol):
    """Proposes one candidate at a time and learns from each result."""

    name: str
    edits_code: bool  # True: each proposal gets a fresh worktree of the target's code

    def propose(self, context: ProposalContext) -> Proposal:
        """One candidate; raises ProposalError when there is none to give (SearchDone when a search is over)."""

    def tell(self, result: dict[str, Any]) -> None:
        """A candidate's result: status, objective, feasible, why (also for replayed results on resume)."""


class ProposalError(RuntimeError):
    """A proposer could not produce a patch; `transcript` holds what happened up to the failure."""

    def __init__(self, message: str, transcript: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.transcript = transcript or []


class SearchDone(ProposalError):
    """The search has nothing new to propose (a finite space exhausted, or it keeps proposing tried points)."""


def truncate(text: str, limit: int = 4000) -> str:
    """Text of at most about `limit` characters: the head and tail halves around a note of what was cut."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - limit
    note = f"[... {cut} characters cut: showing the first {head} and last {tail} ...]"
    return f"{text[:head]}\n{note}\n{text[len(text) - tail:]}"
