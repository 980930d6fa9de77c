"""The search proposer: Optuna over the knobs that touch the spans under suspicion.

TPE by default; CMA-ES when every searched knob is continuous (float). With trials running concurrently (the
Ray executor) it asks while earlier asks are still pending, and TPE treats the pending ones as a constant liar. Criteria are constraints: a trial
that failed one is told to Optuna as infeasible (constraint value > 0), so the sampler learns where the
feasible region is rather than treating a fast-but-wrong trial as good. The baseline and tried points are
never proposed again: in a finite space the next untried point takes their place, and the search ends
(SearchDone) when none is left or it keeps landing on tried points. A refuted hypothesis closes its knobs:
they stay at their defaults from then on. When every point of the suspects' knobs is tried, the search widens
to the other knobs (closed ones excepted) before it ends.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import optuna

from infragent.agent.proposal import Proposal, ProposalContext, SearchDone
from infragent.lab.spec import Knob
from infragent.lab.trajectory import ranking

optuna.logging.set_verbosity(logging.WARNING)

MAX_REPEATS = 3  # consecutive proposals of already-tried knob values before the search stops


class SearchProposer:
    """Asks for knob values, learns from (objective, feasible) told back. Higher objective is better."""

    name = "search"
    edits_code = False

    def __init__(self, knobs: dict[str, Knob], suspects: list[str] | None = None, seed: int = 0,
                 parallel: bool = False) -> None:
        self.all_knobs = knobs
        self.suspects = suspects
        chosen = {n: k for n, k in knobs.items() if suspects is None or set(k.touches + k.acts_on) & set(suspects)}
        self.knobs = chosen or dict(knobs)  # nothing matched the suspects: search everything
        self.fixed = {n: k.default for n, k in knobs.items() if n not in self.knobs and k.default is not None}
        continuous = all(k.type == "float" for k in self.knobs.values())
        self.finite = all(_finite_values(k) is not None for k in self.knobs.values())
        sampler: optuna.samplers.BaseSampler
        if continuous and len(self.knobs) > 1:
            sampler = optuna.samplers.CmaEsSampler(seed=seed)
        else:
            # parallel: trials still running count as a pessimistic guess ("constant liar"), so concurrent
            # asks spread out instead of all landing on the same promising point
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, constant_liar=parallel)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._open: dict[int, optuna.Trial] = {}
        self._proposed: dict[int, dict[str, Any]] = {}
        self.closed: set[str] = set()
        self.widened: list[str] = []

    def start_from(self, values: dict[str, Any]) -> None:
        """Make the first proposal a known point (e.g. the spec's defaults, to learn from the baseline)."""
        self.study.enqueue_trial({n: v for n, v in values.items() if n in self.knobs})

    def unmeasured(self, measured: list[dict[str, Any]]) -> dict[str, Any] | None:
        """In a finite space (choice, bool and small int knobs only): the first point not yet measured, else None."""
        grid = [{}]
        for name, knob in self.knobs.items():
            values = _finite_values(knob)
            if values is None:
                return None
            grid = [{**point, name: v} for point in grid for v in values]
        seen = [{n: m.get(n) for n in self.knobs} for m in measured]
        return next(({**self.fixed, **point} for point in grid if point not in seen), None)

    def propose(self, context: ProposalContext) -> Proposal:
        """The next untried knob values (never the baseline's); SearchDone when there are none."""
        tried = [t["knobs"] for t in context.trials] + [context.baseline_knobs]
        for repeat in range(MAX_REPEATS + 1):
            number, knobs = self.ask()
            if knobs not in tried:
                return Proposal(knobs=knobs, proposer=self.name, rationale=self._why(),
                                hypothesis=_tested(context, knobs))
            seen = next((t for t in context.trials if t["knobs"] == knobs), {"status": "baseline"})
            self._told(number, seen)  # the sampler learns it again; nothing spent
            fresh = self.unmeasured(tried)
            if fresh is not None:
                self.start_from(fresh)
            elif self.finite and self.widen():
                fresh = self.unmeasured(tried)
                if fresh is not None:
                    self.start_from(fresh)
            elif self.finite:
                raise SearchDone("every combination of the searched knobs was tried")
        raise SearchDone(f"the search proposed tried points {MAX_REPEATS + 1} times in a row")

    def tell(self, result: dict[str, Any]) -> None:
        """A candidate's result; one this search did not propose (replayed on resume) is taught as a known point."""
        number = next((n for n, knobs in self._proposed.items() if knobs == result["knobs"]), None)
        if number is None:
            self.start_from(result["knobs"])
            number, _ = self.ask()
        self._told(number, result)

    def close(self, knobs: list[str]) -> list[str]:
        """Stop searching these knobs (a refuted direction): they keep their defaults. Returns those closed;
        the last searched knob is never closed."""
        closed = [n for n in knobs if n in self.knobs and len(self.knobs) > 1]
        self.closed.update(n for n in knobs if n in self.all_knobs and (n not in self.knobs or n in closed))
        for name in closed:
            del self.knobs[name]
            if self.all_knobs[name].default is not None:
                self.fixed[name] = self.all_knobs[name].default
        self.finite = all(_finite_values(k) is not None for k in self.knobs.values())
        return closed

    def widen(self) -> list[str]:
        """The suspects' knobs tried out: search the other knobs too (a closed one stays at its default).
        Returns the knobs added (none when every open knob is already searched)."""
        more = [n for n in self.all_knobs if n not in self.knobs and n not in self.closed]
        for name in more:
            self.knobs[name] = self.all_knobs[name]
            self.fixed.pop(name, None)
        self.widened += more
        self.finite = all(_finite_values(k) is not None for k in self.knobs.values())
        return more

    def _why(self) -> str:
        if self.widened:
            return (f"knob values for {', '.join(self.knobs)} (the suspects' knobs were tried out; widened to "
                    f"{', '.join(self.widened)})")
        return (f"knob values for {', '.join(self.knobs)}" + (f" (acting on {', '.join(self.suspects[:4])})"
                                                              if self.suspects else ""))

    def _told(self, number: int, result: dict[str, Any]) -> None:
        self._proposed.pop(number, None)
        value = ranking(result) if result.get("status") == "measured" else -math.inf
        if math.isfinite(value):
            self.tell_objective(number, value, result["feasible"])
        else:
            self.reject(number)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """(trial number, knob values); the values include the fixed knobs."""
        trial = self.study.ask()
        values = dict(self.fixed)
        for name, knob in self.knobs.items():
            values[name] = _suggest(trial, name, knob)
        self._open[trial.number] = trial
        self._proposed[trial.number] = values
        return trial.number, values

    def tell_objective(self, number: int, objective: float, feasible: bool) -> None:
        """Report a trial's objective (higher is better) and whether it met every criterion."""
        trial = self._open.pop(number)
        trial.set_constraint("criteria", 0.0 if feasible else 1.0)  # > 0: infeasible (a criterion failed)
        self.study.tell(trial, objective)

    def reject(self, number: int) -> None:
        """A trial that could not be measured (failed check, failed launch): tell Optuna it failed."""
        self.study.tell(self._open.pop(number), state=optuna.trial.TrialState.FAIL)


def _suggest(trial: optuna.Trial, name: str, knob: Knob) -> Any:
    if knob.type == "int":
        low, high = knob.domain
        return trial.suggest_int(name, int(low), int(high), log=high / max(low, 1) >= 16)
    if knob.type == "float":
        return trial.suggest_float(name, float(knob.domain[0]), float(knob.domain[1]))
    if knob.type == "bool":
        return trial.suggest_categorical(name, [False, True])
    return trial.suggest_categorical(name, list(knob.domain))


def _finite_values(knob: Knob) -> list[Any] | None:
    if knob.type == "choice":
        return list(knob.domain)
    if knob.type == "bool":
        return [False, True]
    if knob.type == "int" and knob.domain[1] - knob.domain[0] <= 16:
        return list(range(int(knob.domain[0]), int(knob.domain[1]) + 1))
    return None


def _tested(context: ProposalContext, knobs: dict[str, Any]) -> str | None:
    """The hypothesis whose knobs this point changes from the baseline (the first open or supported one)."""
    changed = {n for n, v in knobs.items() if context.baseline_knobs.get(n) != v}
    for h in context.hypotheses:
        if h.status in ("open", "supported") and changed & set(h.knobs):
            return h.key
    return None
