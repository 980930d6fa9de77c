"""The playbook proposer: a tuning guide's moves, tried one at a time on the best launch so far.

A spec's [[playbook]] lists moves (knob values and why) in the order a guide would try them. With a diagnosis,
the moves whose knobs act on a standing hypothesis go first: those on supported hypotheses, then open, then
inconclusive ones, each in the diagnosis's order. Moves on knobs that only refuted hypotheses point at are
skipped. Without a diagnosis (--feedback e2e-only) the moves run as written. Each move is applied to the
incumbent (the best accepted trial, else the baseline), so a later move keeps what an earlier one won. A move
counts as tried once some trial has set its knobs to its values, which holds across a resume.
"""
from __future__ import annotations

from typing import Any

from infragent.agent.hypotheses import Hypothesis, closed_knobs
from infragent.agent.proposal import Proposal, ProposalContext, ProposalError, SearchDone
from infragent.lab.spec import Move
from infragent.lab.trajectory import ranking

STANDING = ("supported", "open", "inconclusive")  # the order in which hypotheses pull their moves forward


class PlaybookProposer:
    """Proposes the spec's playbook moves, the diagnosed ones first."""

    name = "playbook"
    edits_code = False

    def __init__(self, moves: list[Move]) -> None:
        if not moves:
            raise ProposalError("--proposer playbook: the spec has no [[playbook]] moves; add one per change a "
                                "tuning guide would try, e.g. [[playbook]] knobs = { max_num_seqs = 8 }")
        self.moves = moves

    def propose(self, context: ProposalContext) -> Proposal:
        """The first untried move in the diagnosis's order, applied to the incumbent; SearchDone when none is left."""
        start = incumbent(context)
        closed = set(closed_knobs(context.hypotheses))
        points = [t["knobs"] for t in context.trials] + [context.baseline_knobs]
        for index, hypothesis in self.order(context.hypotheses):
            move = self.moves[index]
            if set(move.knobs) & closed or tried(move, context.trials):
                continue
            knobs = {**start, **move.knobs}
            if knobs in points:
                continue
            why = f"playbook move {index + 1}: {', '.join(f'{n} = {v!r}' for n, v in move.knobs.items())}"
            why += f" ({move.why})" if move.why else ""
            if hypothesis is not None:
                why += f"; it acts on {hypothesis.key} ({hypothesis.status})"
            return Proposal(knobs=knobs, proposer=self.name, rationale=why,
                            hypothesis=hypothesis.key if hypothesis is not None else None)
        raise SearchDone("every playbook move was tried or acts only on refuted hypotheses")

    def tell(self, result: dict[str, Any]) -> None:
        """Nothing to learn beyond the trials the context carries."""

    def order(self, hypotheses: list[Hypothesis]) -> list[tuple[int, Hypothesis | None]]:
        """(move index, the hypothesis it acts on) in the order to try them."""
        ranked: dict[int, Hypothesis | None] = {}  # insertion order is the order to try them
        for h in sorted((h for h in hypotheses if h.status in STANDING), key=lambda h: STANDING.index(h.status)):
            for i, move in enumerate(self.moves):
                if set(move.knobs) & set(h.knobs):
                    ranked.setdefault(i, h)
        for i in range(len(self.moves)):
            ranked.setdefault(i, None)
        return list(ranked.items())


def incumbent(context: ProposalContext) -> dict[str, Any]:
    """The knobs of the best accepted trial so far, else the baseline's."""
    accepted = [t for t in context.trials if t.get("status") == "measured" and t.get("feasible")]
    return dict(max(accepted, key=ranking)["knobs"]) if accepted else dict(context.baseline_knobs)


def tried(move: Move, trials: list[dict[str, Any]]) -> bool:
    """Whether some trial (running ones included) has set the move's knobs to its values."""
    return any(all(t["knobs"].get(n) == v for n, v in move.knobs.items()) for t in trials)
