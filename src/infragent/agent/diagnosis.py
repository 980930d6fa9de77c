"""Diagnosis of the baseline, hypothesis by hypothesis: run the observation probes, pose the hypotheses their
findings and next_probes call for, then run the cheapest probe that can refute an open hypothesis and settle
every hypothesis that probe decides; repeat while hypotheses are open and the budget lasts.

Each probe runs once and is one ledger record (key `ladder/NAME`); each hypothesis is its own ledger
record, updated as it is settled, citing the record that settled it.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable, Protocol

from infragent.agent.context import RunContext
from infragent.agent.dispatch import cost_of
from infragent.agent.hypotheses import Hypothesis
from infragent.probes.feedback import Feedback

Record = dict  # a probe's Feedback as the ledger keeps it


class Diagnostics(Protocol):
    """What a target offers the diagnosis: its probes on the baseline, and how findings become hypotheses."""

    observe: list[str]  # the probes every diagnosis starts with, cheapest first
    probes: dict[str, Callable[[], Feedback]]  # every probe it can run on the baseline, by name

    def pose(self, results: dict[str, Record]) -> list[Hypothesis]:
        """Open hypotheses the results so far (keyed ladder/NAME) call for, each naming the probe that settles
        it and, in locality["question"], what it asks (so a question is posed once)."""

    def settle(self, probe: str, hypothesis: Hypothesis, results: dict[str, Record]) -> Hypothesis:
        """The hypothesis settled by its probe's record in results: supported, refuted or inconclusive."""


def diagnose(ctx: RunContext, diagnostics: Diagnostics, experiment: int) -> list[Hypothesis]:
    """Observation probes, then hypothesis-chosen probes cheapest first; every hypothesis as it stands."""
    hypotheses = [Hypothesis(**h) for h in ctx.ledger.hypotheses(ctx.run_id)]
    for name in diagnostics.observe:
        _run(ctx, diagnostics, name, experiment)
    while True:
        results = {k: r["feedback"] for k, r in ctx.done.items() if k.startswith("ladder/")}
        for posed in diagnostics.pose(results):
            add_hypothesis(ctx, hypotheses, posed)
        for i, h in enumerate(hypotheses):
            if h.status == "open" and f"ladder/{h.probe}" in results:
                settled = diagnostics.settle(h.probe, h, results)
                if settled.status == "open":  # a probe that ran decides, or says it cannot
                    settled.settle("inconclusive", f"ladder/{h.probe}", results[f"ladder/{h.probe}"]["finding"])
                hypotheses[i] = settled
                _store(ctx, settled)
        runnable = [h for h in hypotheses if h.status == "open" and h.probe in diagnostics.probes]
        if not runnable or not ctx.probes_left():
            return hypotheses
        _run(ctx, diagnostics, min(runnable, key=lambda h: cost_of(h.probe)).probe, experiment)


def _run(ctx: RunContext, diagnostics: Diagnostics, name: str, experiment: int) -> None:
    key = f"ladder/{name}"
    if key not in ctx.done:
        started = time.monotonic()
        ctx.record(key, diagnostics.probes[name](), experiment, started)


def add_hypothesis(ctx: RunContext, hypotheses: list[Hypothesis], posed: Hypothesis) -> None:
    """A newly posed (or already settled) hypothesis joins the run's list and the ledger, unless the same
    question is already there."""
    if not any(_same(posed, h) for h in hypotheses):
        posed.key = f"hypothesis/{len(hypotheses)}"
        hypotheses.append(posed)
        _store(ctx, posed)


def _same(a: Hypothesis, b: Hypothesis) -> bool:
    """The same question (its claim may have been refined since it was posed)."""
    return a.probe == b.probe and a.locality.get("question") == b.locality.get("question")


def _store(ctx: RunContext, h: Hypothesis) -> None:
    ctx.ledger.record_hypothesis(ctx.run_id, h.key, asdict(h))
    if h.status == "open":
        ctx.log(f"  [{h.key}] posed: {h.claim}; probe: {h.probe}; predicts {h.predicted}")
    else:
        ctx.log(f"  [{h.key}] {h.status.upper()} by {h.settled_by}: {h.claim}")
    ctx.note(f"{h.key} {h.status}: {h.claim}")
