"""One trial's steps, shared by the local loop (agent/core.py) and the Ray executor (agent/executors/ray_executor.py):
a proposal made concrete as a candidate (a repeat or a failed proposal is stored at once), the target's
verdict settled into the trial's result and stored, and what it teaches about the hypothesis it tested.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from infragent.agent.context import RunContext
from infragent.agent.diagnosis import add_hypothesis
from infragent.agent.hypotheses import Hypothesis, closed_knobs
from infragent.agent.proposal import Proposal, ProposalContext, ProposalError, Proposer, SearchDone
from infragent.agent.proposers.search import SearchProposer
from infragent.agent.targets import Candidate, LoopTarget
from infragent.agent.workspace import Workspace
from infragent.probes.feedback import Feedback

REFUTING_TRIALS = 2  # candidates for a hypothesis without a local win before it counts as refuted
MAX_FAILED_PROPOSALS = 3  # consecutive proposals without a usable patch before the loop stops


def fresh_result(number: int, target: LoopTarget, proposer: Proposer) -> dict[str, Any]:
    """A trial's result before anything is known: rejected until the target measures it."""
    return {"trial": number, "knobs": target.baseline_knobs, "status": "rejected", "objective": None,
            "feasible": False, "proposer": proposer.name}


def propose(ctx: RunContext, target: LoopTarget, proposer: Proposer, result: dict[str, Any],
            hypotheses: list[Hypothesis], trials: list[dict], ws: Workspace | None,
            started: float) -> tuple[Candidate, Hypothesis | None] | dict[str, Any]:
    """The proposer's next change as a candidate and the hypothesis it tests; or, when there is nothing to
    judge (no patch, a repeat of an earlier trial), the trial's stored result. trials: every trial so far,
    those still running included (a repeat of one is not judged twice). SearchDone passes through."""
    number = result["trial"]
    key = f"trial/{number}"
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
        return store(ctx, result, f"no patch: {str(err)[:300]}")
    proposal.knobs = proposal.knobs or dict(target.baseline_knobs)
    result.update(knobs=proposal.knobs, hypothesis=proposal.hypothesis, rationale=proposal.rationale)
    same = next((t for t in trials if t["knobs"] == proposal.knobs and t.get("patch", "") == proposal.patch), None)
    if same is not None:  # nothing new to learn: not judged again
        return store(ctx, result, f"repeat: the same change as trial {same['trial']} ({same.get('why', 'running')[:200]})")
    experiment = ctx.ledger.experiment(ctx.run_id, key, proposal.knobs)
    if proposal.patch:
        ctx.record(f"{key}/proposal", _proposal_feedback(proposal, "", None), experiment, started)
        result["patch"] = proposal.patch
    ctx.log(f"{key}: {proposal.knobs}" + (f" + a {proposal.patch.count(chr(10))}-line patch"
                                          if proposal.patch else ""))
    hypothesis = next((h for h in hypotheses if h.key == proposal.hypothesis), None)
    return Candidate(number, key, proposal.knobs, ws, proposal, experiment), hypothesis


def settle(ctx: RunContext, hypotheses: list[Hypothesis], result: dict[str, Any], judged: dict[str, Any],
           candidate: Candidate, proposer: Proposer) -> dict[str, Any]:
    """The target's verdict folded into the trial's result: hypotheses its probes posed added, the win
    attributed to the span it came from, an accepted patch exported with its evidence; then stored."""
    for posed in judged.pop("posed", []):  # what a candidate's probes found about the cause
        add_hypothesis(ctx, hypotheses, posed)
    result.update(judged)
    _attribute(ctx, hypotheses, result)
    ws = candidate.workspace
    if ws is not None and result["status"] == "measured" and result["feasible"]:
        path = ws.export(ctx.artifact_home("patches"), {
            "run": ctx.run_id, "trial": result["trial"], "rationale": candidate.proposal.rationale,
            "proposer": proposer.name, "hypothesis": candidate.proposal.hypothesis,
            "judgements": result.get("judgements"), "objective": result["objective"],
            "records": _records_of(ctx, candidate.key)})
        result["exported"] = str(path)
        ctx.log(f"  accepted: patch exported to {path}")
    return store(ctx, result, result.pop("why"))


def conclude(ctx: RunContext, proposer: Proposer, hypotheses: list[Hypothesis], trials: list[dict],
             result: dict[str, Any], failures: int) -> int:
    """A trial's result (fresh or replayed) told to the proposer and learnt from, appended to trials; returns
    how many proposals in a row have now given nothing new."""
    proposer.tell(result)
    learn(ctx, hypotheses, result, proposer)
    trials.append(result)
    return failures + 1 if result["why"].startswith(("no patch", "workspace", "repeat")) else 0


def _attribute(ctx: RunContext, hypotheses: list[Hypothesis], result: dict) -> None:
    """A win localized to a span bears on the hypothesis about that span, whichever one the proposal named."""
    spans = (result.get("local") or {}).get("spans") or []
    named = next((h for h in hypotheses if set(spans) & set(h.spans)), None)
    if named is not None and named.key != result.get("hypothesis"):
        ctx.log(f"  the win came from {spans[0]!r}: it bears on {named.key}, not {result.get('hypothesis')}")
        result["hypothesis"] = named.key


def store(ctx: RunContext, result: dict, why: str) -> dict:
    """The trial's outcome as its own ledger record (what resume replays), citing its probe records."""
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


def learn(ctx: RunContext, hypotheses: list[Hypothesis], result: dict, proposer: Proposer) -> None:
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
        closed = proposer.close(closed_knobs(hypotheses)) if isinstance(proposer, SearchProposer) else []
        if closed:
            ctx.log(f"  closed {', '.join(closed)}: {h.key} is refuted")
    ctx.ledger.record_hypothesis(ctx.run_id, h.key, asdict(h))
    ctx.log(f"  [{h.key}] {h.status.upper()} by {h.settled_by}: {h.claim}")
    ctx.note(f"{h.key} {h.status}: {h.claim}")


def _proposal_feedback(proposal: Proposal | None, error: str, transcript: list | None) -> dict:
    """The proposal (patch, rationale, transcript) as a ledger record."""
    if proposal is None:
        return Feedback("proposal", "fail", f"no patch: {error[:400]}", details={"transcript": transcript or []}).to_dict()
    lines = proposal.patch.count("\n")
    return Feedback("proposal", "pass", f"{proposal.proposer} proposed a {lines}-line patch: {proposal.rationale[:300]}",
                    details={"patch": proposal.patch, "rationale": proposal.rationale, "hypothesis": proposal.hypothesis,
                             "transcript": proposal.transcript, "cost_s": round(proposal.cost_s, 2)}).to_dict()
