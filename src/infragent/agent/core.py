"""The optimization loop, one for every target (engine, command, kernel) and every proposer (search, llm,
command): diagnose the baseline hypothesis by hypothesis (cheapest refuting probe first), then ask the
proposer for candidates — knob values and/or a patch in a fresh git worktree — each judged by the target's
ladder of probes, cheapest first, until one refutes it or the end-to-end criteria decide. A candidate's
result settles the hypothesis it tests: a local win supports it (the proposer keeps to its locality), and
repeated non-wins refute it (its knobs are closed). Accepted patches are exported with their evidence.

Every probe is one ledger record with its cost; hypotheses and candidates are their own ledger records.
The loop stops at the budget (probes, minutes) or when the proposer has nothing new; an interrupted run
resumes from the ledger: recorded probes and candidates are replayed, not re-run.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infragent.agent.context import Budget, RunContext
from infragent.agent.diagnosis import add_hypothesis, diagnose
from infragent.agent.hypotheses import Hypothesis, suspects
from infragent.agent.proposal import Proposal, ProposalContext, ProposalError, Proposer, SearchDone
from infragent.agent.search import SearchProposer
from infragent.agent.kernel_target import KernelTarget
from infragent.agent.serving_target import ServingTarget
from infragent.agent.targets import Candidate, LoopTarget
from infragent.agent.workspace import WorkspaceError
from infragent.lab.ledger import Ledger
from infragent.lab.lifecycle import guarded_run, open_run
from infragent.lab.spec import Spec, load_spec
from infragent.lab.trajectory import best_of
from infragent.probes.feedback import Feedback

MAX_FAILED_PROPOSALS = 3  # consecutive proposals without a usable patch before the loop stops
REFUTING_TRIALS = 2  # candidates for a hypothesis without a local win before it counts as refuted


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


def make_target(spec: Spec, spec_path: Path) -> LoopTarget:
    """The loop's view of the spec's target."""
    if spec.target.kind == "kernel":
        return KernelTarget(spec, spec_path)
    return ServingTarget(spec, spec_path)


def optimize(spec_path: str | Path, ledger: Ledger, budget: Budget, proposer: Proposer | None = None,
             resume: int | None = None, log: Callable[[str], None] = print, seed: int = 0,
             feedback: str = "ladder") -> Outcome:
    """Run (or resume) the loop on the spec's target; proposer None means the search proposer over the knobs."""
    spec_path = Path(spec_path).resolve()
    spec = load_spec(spec_path)
    target = make_target(spec, spec_path)
    run_id = open_run(ledger, "optimize", spec_path, resume, log)
    log(f"run {run_id}: " + (f"optimize {spec_path}" if resume is None else "resuming")
        + f" ({proposer.name if proposer else 'search'} proposer, feedback {feedback})")
    with guarded_run(ledger, run_id, f"infragent optimize {spec_path} --ledger {ledger.location}", log):
        ctx = RunContext(spec, spec_path, ledger, run_id, budget, log, seed, feedback)
        ledger.set_run(run_id, budget=json.dumps(asdict(budget)))
        outcome = _optimize(ctx, target, proposer)
        ledger.set_run(run_id, status="completed", note="; ".join(outcome.limits) or None)
    return outcome


def _optimize(ctx: RunContext, target: LoopTarget, proposer: Proposer | None) -> Outcome:
    base_exp = ctx.ledger.experiment(ctx.run_id, "baseline", target.baseline_knobs)
    with target.session(ctx, base_exp):  # the diagnosis runs inside it: on the baseline's code
        diagnostics = target.diagnostics(ctx) if ctx.feedback == "ladder" else None
        if diagnostics is None:
            ctx.log("no diagnosis: " + ("every proposal is judged end to end only" if ctx.feedback == "e2e-only"
                                        else f"a {ctx.spec.target.kind} target has no probes to trace; every knob is a suspect"))
        hypotheses = diagnose(ctx, diagnostics, base_exp) if diagnostics is not None else []
        if proposer is None:
            proposer = SearchProposer(ctx.spec.knobs, suspects(hypotheses) or None, seed=ctx.seed)
            proposer.close(_closed_knobs(hypotheses))  # directions refuted before a resume stay closed
            ctx.log(f"searching {', '.join(proposer.knobs)} (knobs acting on the suspects); fixed: {proposer.fixed or '-'}")
        outcome = Outcome(ctx.run_id, {"knobs": target.baseline_knobs}, None, hypotheses=hypotheses, events=ctx.events)
        replays = {c["trial"]: c for c in ctx.ledger.candidates(ctx.run_id)}
        number = failures = 0
        while True:
            result = replays.get(number)
            if result is not None:
                proposer.tell(result)
            else:
                if not ctx.left(probes_needed=2):
                    outcome.limits.append(ctx.spent())
                    break
                try:
                    result = _trial(ctx, target, proposer, number, hypotheses, outcome.trials)
                except SearchDone as done:
                    outcome.limits.append(str(done))
                    break
            _learn(ctx, hypotheses, result, proposer)
            outcome.trials.append(result)
            number += 1
            failures = failures + 1 if result["why"].startswith(("no patch", "workspace", "repeat")) else 0
            if failures >= MAX_FAILED_PROPOSALS:
                outcome.limits.append(f"the {proposer.name} proposer gave no new change {failures} times in a row: "
                                      f"{result['why']}")
                break
    outcome.best, limits = best_of(outcome.trials)
    outcome.limits += limits
    return outcome


def _trial(ctx: RunContext, target: LoopTarget, proposer: Proposer, number: int, hypotheses: list[Hypothesis],
           trials: list[dict]) -> dict:
    """One candidate: proposed (in its own worktree for a code proposer), judged by the target, recorded."""
    key = f"trial/{number}"
    result: dict[str, Any] = {"trial": number, "knobs": target.baseline_knobs, "status": "rejected",
                              "objective": None, "feasible": False, "proposer": proposer.name}
    started = time.monotonic()
    try:
        with (target.workspace(ctx, number) if proposer.edits_code else contextlib.nullcontext()) as ws:
            context = ProposalContext(target.info(ctx, hypotheses, trials), hypotheses, trials, target.baseline_knobs,
                                      ws, target.tools(ctx, ws, key) if ws is not None else {})
            if proposer.edits_code:
                ctx.log(f"{key}: asking the {proposer.name} proposer for a patch")
            try:
                proposal = proposer.propose(context)
            except SearchDone:
                raise
            except ProposalError as err:
                ctx.record(f"{key}/proposal", _proposal_feedback(None, str(err), err.transcript), None, started)
                return _store(ctx, result, f"no patch: {str(err)[:300]}")
            proposal.knobs = proposal.knobs or dict(target.baseline_knobs)
            result.update(knobs=proposal.knobs, hypothesis=proposal.hypothesis, rationale=proposal.rationale)
            same = next((t for t in trials if t["knobs"] == proposal.knobs and t.get("patch", "") == proposal.patch),
                        None)
            if same is not None:  # nothing new to learn: not judged again
                return _store(ctx, result, f"repeat: the same change as trial {same['trial']} ({same['why'][:200]})")
            experiment = ctx.ledger.experiment(ctx.run_id, key, proposal.knobs)
            if proposal.patch:
                ctx.record(f"{key}/proposal", _proposal_feedback(proposal, "", None), experiment, started)
                result["patch"] = proposal.patch
            ctx.log(f"{key}: {proposal.knobs}" + (f" + a {proposal.patch.count(chr(10))}-line patch"
                                                  if proposal.patch else ""))
            candidate = Candidate(number, key, proposal.knobs, ws, proposal, experiment)
            hypothesis = next((h for h in hypotheses if h.key == proposal.hypothesis), None)
            judged = target.judge(ctx, candidate, hypothesis)
            for posed in judged.pop("posed", []):  # what a candidate's probes found about the cause
                add_hypothesis(ctx, hypotheses, posed)
            result.update(judged)
            _attribute(ctx, hypotheses, result)
            if ws is not None and result["status"] == "measured" and result["feasible"]:
                path = ws.export(ctx.artifact_home("patches"), {
                    "run": ctx.run_id, "trial": number, "rationale": proposal.rationale, "proposer": proposer.name,
                    "hypothesis": proposal.hypothesis, "judgements": result.get("judgements"),
                    "objective": result["objective"], "records": _records_of(ctx, key)})
                result["exported"] = str(path)
                ctx.log(f"  accepted: patch exported to {path}")
            return _store(ctx, result, result.pop("why"))
    except WorkspaceError as err:
        return _store(ctx, result, f"workspace: {str(err)[:300]}")


def _attribute(ctx: RunContext, hypotheses: list[Hypothesis], result: dict) -> None:
    """A win localized to a span bears on the hypothesis about that span, whichever one the proposal named."""
    spans = (result.get("local") or {}).get("spans") or []
    named = next((h for h in hypotheses if set(spans) & set(h.spans)), None)
    if named is not None and named.key != result.get("hypothesis"):
        ctx.log(f"  the win came from {spans[0]!r}: it bears on {named.key}, not {result.get('hypothesis')}")
        result["hypothesis"] = named.key


def _store(ctx: RunContext, result: dict, why: str) -> dict:
    """The candidate's outcome as its own ledger record (what resume replays), citing its probe records."""
    result["why"] = why
    result["records"] = _records_of(ctx, f"trial/{result['trial']}")
    ctx.ledger.record_candidate(ctx.run_id, result["trial"], result)
    accepted = result["status"] == "measured" and result["feasible"]
    ctx.log(f"  [trial/{result['trial']}] {'ACCEPTED' if accepted else result['status'].upper()}: {why[:400]}")
    if accepted:
        ctx.note(f"trial/{result['trial']} accepted")
    return result


def _records_of(ctx: RunContext, key: str) -> list[str]:
    return [k for k in ctx.done if k == key or k.startswith(key + "/")]


def _learn(ctx: RunContext, hypotheses: list[Hypothesis], result: dict, proposer: Proposer) -> None:
    """Settle the hypothesis a candidate tested by its local probe: a win supports it; REFUTING_TRIALS knob
    candidates without one refute it, and the search closes the knobs only it pointed at. (A bad patch
    refutes the patch, not the hypothesis: the time may still be where the hypothesis says.)"""
    local = result.get("local")
    h = next((h for h in hypotheses if h.key == result.get("hypothesis")), None)
    if h is None or local is None or h.status not in ("open", "inconclusive"):
        return
    if local["verdict"] == "pass":
        h.settle("supported", local["key"], local["finding"])
    elif result.get("patch"):
        return
    else:
        tried = [t for t in ctx.ledger.candidates(ctx.run_id)
                 if t.get("hypothesis") == h.key and t.get("local") and not t.get("patch")]
        if len(tried) < REFUTING_TRIALS:
            return
        h.settle("refuted", local["key"], f"{len(tried)} candidates for it showed no local win; last: "
                                          f"{local['finding']}")
        closed = proposer.close(_closed_knobs(hypotheses)) if isinstance(proposer, SearchProposer) else []
        if closed:
            ctx.log(f"  closed {', '.join(closed)}: {h.key} is refuted")
    ctx.ledger.record_hypothesis(ctx.run_id, h.key, asdict(h))
    ctx.log(f"  [{h.key}] {h.status.upper()} by {h.settled_by}: {h.claim}")
    ctx.note(f"{h.key} {h.status}: {h.claim}")


def _closed_knobs(hypotheses: list[Hypothesis]) -> list[str]:
    """Knobs that only refuted hypotheses point at."""
    alive = {k for h in hypotheses if h.status != "refuted" for k in h.knobs}
    return [k for h in hypotheses if h.status == "refuted" for k in h.knobs if k not in alive]


def _proposal_feedback(proposal: Proposal | None, error: str, transcript: list | None) -> dict:
    """The proposal (patch, rationale, transcript) as a ledger record."""
    if proposal is None:
        return Feedback("proposal", "fail", f"no patch: {error[:400]}", details={"transcript": transcript or []}).to_dict()
    lines = proposal.patch.count("\n")
    return Feedback("proposal", "pass", f"{proposal.proposer} proposed a {lines}-line patch: {proposal.rationale[:300]}",
                    details={"patch": proposal.patch, "rationale": proposal.rationale, "hypothesis": proposal.hypothesis,
                             "transcript": proposal.transcript, "cost_s": round(proposal.cost_s, 2)}).to_dict()
