"""The optimization loop, one for every target (engine, command, kernel) and every proposer (search, llm,
command): diagnose the baseline hypothesis by hypothesis (cheapest refuting probe first), then ask the
proposer for candidates — knob values and/or a patch in a fresh git worktree — each judged by the target's
ladder of probes, cheapest first, until one refutes it or the end-to-end criteria decide. A candidate's
result settles the hypothesis it tests: a local win supports it (the proposer keeps to its locality), and
repeated non-wins refute it (its knobs are closed). Accepted patches are exported with their evidence.

Every probe is one ledger record with its cost; hypotheses and candidates are their own ledger records.
The loop stops at the budget (probes, minutes) or when the proposer has nothing new; an interrupted run
resumes from the ledger: recorded probes and candidates are replayed, not re-run. With executor "ray" the
diagnosis runs here and the trials run concurrently on a Ray cluster's nodes (agent/executors/ray_executor.py).
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infragent.agent.context import Budget, RunContext
from infragent.agent.diagnosis import diagnose
from infragent.agent.hypotheses import Hypothesis, closed_knobs, suspects
from infragent.agent.proposal import Proposer, SearchDone
from infragent.agent.proposers.search import SearchProposer
from infragent.agent.target_kinds import make_target
from infragent.agent.targets import LoopTarget
from infragent.agent.trial import MAX_FAILED_PROPOSALS, conclude, fresh_result, propose, settle, store
from infragent.agent.workspace import WorkspaceError
from infragent.lab.ledger import Ledger
from infragent.lab.lifecycle import guarded_run, open_run
from infragent.lab.spec import Executor, load_spec
from infragent.lab.trajectory import best_of


@dataclass
class Outcome:
    """What an optimize run found."""

    run_id: int
    baseline: dict[str, Any]
    best: dict[str, Any] | None  # knobs, objective, trial, end-to-end finding
    limits: list[str] = field(default_factory=list)
    hypotheses: list[Hypothesis] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)  # (seconds, what): diagnoses, acceptances


def optimize(spec_path: str | Path, ledger: Ledger, budget: Budget, proposer: Proposer | None = None,
             resume: int | None = None, log: Callable[[str], None] = print, seed: int = 0,
             feedback: str = "ladder", executor: Executor | None = None) -> Outcome:
    """Run (or resume) the loop on the spec's target; proposer None means the search proposer over the knobs;
    executor None means the spec's [executor] (local unless it says ray)."""
    spec_path = Path(spec_path).resolve()
    spec = load_spec(spec_path)
    executor = executor or spec.executor
    target = make_target(spec, spec_path)
    run_id = open_run(ledger, "optimize", spec_path, resume, log)
    log(f"run {run_id}: " + (f"optimize {spec_path}" if resume is None else "resuming")
        + f" ({proposer.name if proposer else 'search'} proposer, feedback {feedback}, executor {executor.kind})")
    how = f"infragent optimize {spec_path} --ledger {ledger.location}" + (
        " --executor ray" + (f" --ray-address {executor.address}" if executor.address else "")
        if executor.kind == "ray" else "")
    with guarded_run(ledger, run_id, how, log):
        ctx = RunContext(spec, spec_path, ledger, run_id, budget, log, seed, feedback)
        ledger.set_run(run_id, budget=json.dumps({k: v for k, v in asdict(budget).items() if v is not None}))
        outcome = _optimize(ctx, target, proposer, executor)
        ledger.set_run(run_id, status="completed", note="; ".join(outcome.limits) or None)
    return outcome


def _optimize(ctx: RunContext, target: LoopTarget, proposer: Proposer | None, executor: Executor) -> Outcome:
    base_exp = ctx.ledger.experiment(ctx.run_id, "baseline", target.baseline_knobs)
    with target.session(ctx, base_exp):  # the diagnosis runs inside it: on the baseline's code
        diagnostics = target.diagnostics(ctx) if ctx.feedback == "ladder" else None
        if diagnostics is None:
            ctx.log("no diagnosis: " + ("every proposal is judged end to end only" if ctx.feedback == "e2e-only"
                                        else f"a {ctx.spec.target.kind} target has no probes to trace; every knob is a suspect"))
        hypotheses = diagnose(ctx, diagnostics, base_exp) if diagnostics is not None else []
        if proposer is None:
            proposer = SearchProposer(ctx.spec.knobs, suspects(hypotheses) or None, seed=ctx.seed,
                                      parallel=executor.kind == "ray")
            proposer.close(closed_knobs(hypotheses))  # directions refuted before a resume stay closed
            ctx.log(f"searching {', '.join(proposer.knobs)} (knobs acting on the suspects); fixed: {proposer.fixed or '-'}")
        outcome = Outcome(ctx.run_id, {"knobs": target.baseline_knobs}, None, hypotheses=hypotheses, events=ctx.events)
        replays = {c["trial"]: c for c in ctx.ledger.candidates(ctx.run_id)}
        if executor.kind == "ray":
            from infragent.agent.executors.ray_executor import run_trials

            outcome.trials, outcome.limits = run_trials(ctx, target, proposer, hypotheses, replays, executor.address)
        else:
            _run_trials(ctx, target, proposer, hypotheses, replays, outcome)
    outcome.best, limits = best_of(outcome.trials)
    outcome.limits += limits
    return outcome


def _run_trials(ctx: RunContext, target: LoopTarget, proposer: Proposer, hypotheses: list[Hypothesis],
                replays: dict[int, dict], outcome: Outcome) -> None:
    """The local executor: trials one after another in this process, replayed ones told, not re-run."""
    number = failures = 0
    while True:
        result = replays.get(number)
        if result is None:
            if not ctx.left(probes_needed=2) or not ctx.trials_left(number):
                outcome.limits.append(ctx.spent())
                break
            try:
                result = _trial(ctx, target, proposer, number, hypotheses, outcome.trials)
            except SearchDone as done:
                outcome.limits.append(str(done))
                break
        failures = conclude(ctx, proposer, hypotheses, outcome.trials, result, failures)
        number += 1
        if failures >= MAX_FAILED_PROPOSALS:
            outcome.limits.append(f"the {proposer.name} proposer gave no new change {failures} times in a row: "
                                  f"{result['why']}")
            break


def _trial(ctx: RunContext, target: LoopTarget, proposer: Proposer, number: int, hypotheses: list[Hypothesis],
           trials: list[dict]) -> dict:
    """One candidate: proposed (in its own worktree for a code proposer), judged by the target, recorded."""
    result = fresh_result(number, target, proposer)
    started = time.monotonic()
    try:
        with (target.workspace(ctx, number) if proposer.edits_code else contextlib.nullcontext()) as ws:
            proposed = propose(ctx, target, proposer, result, hypotheses, trials, ws, started)
            if isinstance(proposed, dict):
                return proposed
            candidate, hypothesis = proposed
            return settle(ctx, hypotheses, result, target.judge(ctx, candidate, hypothesis), candidate, proposer)
    except WorkspaceError as err:
        return store(ctx, result, f"workspace: {str(err)[:300]}")
