"""The loop for kernel targets: the feedback ladder on the baseline → hypotheses → proposals (knob values
from the search proposer, or patches from the llm / command proposers, each in its own git worktree) →
the gates in a child process with a timeout and a memory limit → criteria → ledger. Accepted patches are
exported with their evidence. Resumable like the serving loop: recorded ladder rungs and trial outcomes
are replayed, not re-run.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from infragent.agent.hypotheses import Hypothesis, suspects
from infragent.agent.kernel_gates import GATE_OF, gates_argv
from infragent.agent.kernel_hypotheses import from_ladder
from infragent.agent.kernel_ladder import ladder
from infragent.agent.kernel_target import load_kernel_target
from infragent.agent.loop import (Budget, Outcome, _best, _Clock, _counts, _enqueue, _replay, _start, _store,
                                  clip, known_point, out_of_budget, record_hypotheses, search_exhausted, tell)
from infragent.agent.proposal import Proposal, ProposalError
from infragent.agent.search import SearchProposer
from infragent.agent.workspace import Workspace, WorkspaceError, run_limited
from infragent.lab.ledger import Ledger
from infragent.lab.lifecycle import guarded_run
from infragent.lab.spec import Spec, load_spec
from infragent.probes.artifacts import artifact_dir
from infragent.probes.feedback import Feedback

GATES_TIMEOUT_S = 600.0
GATES_MEMORY_GB = 12.0
MAX_FAILED_PROPOSALS = 3  # consecutive proposals without a usable patch before the loop stops


def optimize_kernel(spec_path: str | Path, ledger: Ledger, budget: Budget, proposer: Any = None,
                    resume: int | None = None, log: Callable[[str], None] = print, seed: int = 0) -> Outcome:
    """Run (or resume) the loop on a kernel target; proposer None means the search proposer over the knobs."""
    spec_path = Path(spec_path).resolve()
    spec = load_spec(spec_path)
    run_id = _start(spec_path, ledger, resume, log)
    with guarded_run(ledger, run_id, f"infragent optimize {spec_path} --ledger {ledger.path}", log):
        outcome = _optimize_kernel(spec, spec_path, run_id, ledger, budget, proposer, log, seed)
        ledger.set_run(run_id, status="completed")
    return outcome


def _optimize_kernel(spec: Spec, spec_path: Path, run_id: int, ledger: Ledger, budget: Budget, proposer: Any,
                     log: Callable[[str], None], seed: int) -> Outcome:
    done = {r["key"]: r for r in ledger.probe_results(run_id)}
    clock = _Clock(budget, sum(1 for k, r in done.items() if _counts(k, r)))
    baseline_knobs = {n: k.default for n, k in spec.knobs.items() if k.default is not None}
    base_exp = ledger.experiment(run_id, "baseline", baseline_knobs)

    def record(key: str, feedback: Feedback | dict, experiment: int | None, started: float) -> dict:
        data = feedback.to_dict() if isinstance(feedback, Feedback) else feedback
        data.setdefault("details", {}).setdefault("cost_s", round(time.monotonic() - started, 2))  # the child's own
        evidence = [(e["path"], e["description"]) for e in data.get("evidence", [])]
        ledger.record_probe(run_id, key, data, experiment, evidence)
        clock.probes += _counts(key, data)
        log(f"  [{key}] {data['verdict'].upper()} ({data['details']['cost_s']:.0f} s): {data['finding'][:400]}")
        done[key] = {"key": key, "feedback": data, "verdict": data["verdict"]}
        return done[key]

    hypotheses = _ladder_and_hypotheses(spec, spec_path, baseline_knobs, done, record, base_exp, ledger, run_id, log)
    outcome = Outcome(run_id, {"knobs": baseline_knobs}, None, hypotheses=hypotheses)
    search = None
    if proposer is None:
        search = SearchProposer(spec.knobs, suspects(hypotheses) or None, seed=seed)
        log(f"searching {', '.join(search.knobs)} (knobs acting on the suspects); fixed: {search.fixed or '-'}")
    trial = repeats = failures = 0
    while True:
        key = f"trial/{trial}"
        replay = _replay(done, key)
        if replay is None and out_of_budget(clock, outcome):
            break
        if search is not None:
            number, knobs = search.propose() if replay is None else _enqueue(search, replay["knobs"])
            if replay is None and known_point(search, number, knobs, outcome.trials, baseline_knobs):
                repeats += 1
                if search_exhausted(search, outcome, baseline_knobs, repeats):
                    break
                continue
            repeats = 0
            result = replay or _knob_trial(spec_path, key, knobs, baseline_knobs, ledger, run_id, record, trial, log)
            tell(search, number, result)
        else:
            context = _context(spec, spec_path, hypotheses, done, outcome.trials)
            result = replay or _code_trial(spec, spec_path, key, baseline_knobs, proposer, context, ledger, run_id,
                                           record, trial, log)
            failures = failures + 1 if result["why"].startswith(("no patch", "workspace")) else 0
            if failures >= MAX_FAILED_PROPOSALS:
                outcome.trials.append(result)
                outcome.limits.append(f"the {proposer.name} proposer failed {failures} times in a row: {result['why']}")
                break
        outcome.trials.append(result)
        trial += 1
    outcome.best, limits = _best(outcome.trials)
    outcome.limits += limits
    return outcome


def _ladder_and_hypotheses(spec: Spec, spec_path: Path, knobs: dict, done: dict, record: Callable, experiment: int,
                           ledger: Ledger, run_id: int, log: Callable[[str], None]) -> list[Hypothesis]:
    """Each ladder rung not yet recorded, then hypotheses from all of them (recorded with what they cite)."""
    target = load_kernel_target(spec.target, spec_path.parent, knobs)
    workload_ref = None
    if spec.target.workload:
        file, _, name = spec.target.workload.partition(":")
        workload_ref = f"{spec_path.parent / file}:{name}"
    for name, probe in ladder(target, knobs, workload_ref):
        key = f"ladder/{name}"
        if key not in done:
            started = time.monotonic()
            record(key, probe(), experiment, started)
    found = from_ladder({k: r["feedback"] for k, r in done.items() if k.startswith("ladder/")}, spec.knobs)
    return record_hypotheses(found, done, ledger, run_id, experiment, log)


def _home(ledger: Ledger, folder: str) -> Path:
    """A folder beside the ledger, as an absolute path: the gates run in the pack's folder or a worktree, so
    every path handed to them must not depend on the folder the loop started in."""
    return (ledger.path.parent / folder).resolve()


def _run_gates(spec_path: Path, root: Path, knobs: dict, baseline_knobs: dict, out: Path) -> dict:
    """The gates in a child process (its working folder: root); its result, or a failed check naming why the
    child died. Every path the child gets is absolute."""
    spec_path, root, out = spec_path.resolve(), root.resolve(), out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    done = run_limited(gates_argv(spec_path, root, spec_path.parent, knobs, baseline_knobs, out), cwd=root,
                       timeout_s=GATES_TIMEOUT_S, memory_gb=GATES_MEMORY_GB,
                       env={"INFRAGENT_ARTIFACTS": str(artifact_dir())})  # absolute; evidence stays out of the patch
    if done.rc == 0 and out.exists():
        return json.loads(out.read_text())
    why = (f"timed out after {GATES_TIMEOUT_S:g} s" if done.timed_out else
           f"exited {done.rc}: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
    failed = Feedback("check", "fail", f"the candidate's gates did not finish: {why}",
                      details={"stderr_tail": done.stderr[-3000:]})
    return {"feedback": {"check": failed.to_dict()}, "judgements": [], "objective": None, "feasible": False}


def _gate_trial(gates: dict, key: str, result: dict, experiment: int, record: Callable, started: float) -> dict:
    """Record each gate's feedback and the trial's outcome."""
    for name, fb in gates["feedback"].items():
        record(f"{key}/{name}", fb, experiment, started)
        started = time.monotonic()
    check = gates["feedback"]["check"]
    if check["verdict"] != "pass":
        why = f"failed the check: {clip(check['finding'], 320)}"
    else:
        why = decision(gates["judgements"])
        result.update(status="measured", objective=gates["objective"], feasible=gates["feasible"],
                      judgements=gates["judgements"], finding=trial_finding(gates))
    return _store(record, key, result, experiment, why)


def trial_finding(gates: dict) -> str:
    """A measured trial in one line: which criteria decided it (each with its gate), then what each bench gate
    measured, in its own direction, and whether that was within the bound of the criterion reading it."""
    judgements = gates["judgements"]
    failed = [j for j in judgements if j["verdict"] != "pass"]
    named = ", ".join(f"[{GATE_OF.get(j['metric'], 'gates')}] {j['metric']} {j['verdict']}"
                      for j in failed or judgements)
    parts = [f"not accepted ({named})" if failed else f"every criterion passes ({named})" if judgements else
             "no criterion to judge: measured only"]
    for name, fb in gates["feedback"].items():
        if fb.get("probe") != "bench":
            continue
        direction = fb.get("details", {}).get("direction", fb["finding"])
        decided = [j for j in judgements if j["metric"] in fb.get("details", {}).get("decided_by", [])]
        if decided:
            verdicts = {j["verdict"] for j in decided}
            where = ("outside" if "fail" in verdicts else "not clearly within" if "inconclusive" in verdicts
                     else "within")
            parts.append(f"[{name}] {direction}, {where} its {' and '.join(j['metric'] for j in decided)} bound")
        else:
            parts.append(f"[{name}] {direction} (informational: no criterion reads it)")
    return "; ".join(parts)


def decision(judgements: list[dict]) -> str:
    """What decided a measured trial, each criterion named with the gate whose numbers it read: the ones that
    did not pass when any did not (they decided), else every criterion."""
    def said(j: dict) -> str:
        return f"[{GATE_OF.get(j['metric'], 'gates')}] {j['message']}"

    failed = [j for j in judgements if j["verdict"] != "pass"]
    if failed:
        return "; ".join(said(j) for j in failed)
    return "every criterion passes: " + "; ".join(said(j) for j in judgements) if judgements else \
        "no criterion to judge: measured only"


def _knob_trial(spec_path: Path, key: str, knobs: dict, baseline_knobs: dict, ledger: Ledger, run_id: int,
                record: Callable, number: int, log: Callable[[str], None]) -> dict:
    log(f"{key}: {knobs}")
    experiment = ledger.experiment(run_id, key, knobs)
    result = {"trial": number, "knobs": knobs, "status": "rejected", "objective": None, "feasible": False}
    started = time.monotonic()
    gates = _run_gates(spec_path, spec_path.parent, knobs, baseline_knobs,
                       _home(ledger, "gates") / f"run-{run_id}-{number}.json")
    return _gate_trial(gates, key, result, experiment, record, started)


def _code_trial(spec: Spec, spec_path: Path, key: str, knobs: dict, proposer: Any, context: dict, ledger: Ledger,
                run_id: int, record: Callable, number: int, log: Callable[[str], None]) -> dict:
    """One patch: a fresh worktree, the proposer's change, the gates on it; export it when accepted."""
    log(f"{key}: asking the {proposer.name} proposer for a patch")
    experiment = ledger.experiment(run_id, key, knobs)
    result: dict[str, Any] = {"trial": number, "knobs": knobs, "status": "rejected", "objective": None,
                              "feasible": False, "proposer": proposer.name}
    home = _home(ledger, "workspaces")
    code_dir = (spec_path.parent / spec.target.code).resolve()
    started = time.monotonic()
    try:
        with Workspace.create(code_dir, home, f"run-{run_id}-trial-{number}") as ws:
            root = ws.root / spec_path.parent.relative_to(code_dir)
            out = _home(ledger, "gates") / f"run-{run_id}-{number}.json"
            try:
                proposal = _propose(proposer, context, ws, spec_path, root, knobs, out)
            except ProposalError as err:
                record(f"{key}/proposal", _proposal_feedback(None, str(err), getattr(err, "transcript", None)),
                       experiment, started)
                return _store(record, key, result, experiment, f"no patch: {str(err)[:300]}")
            record(f"{key}/proposal", _proposal_feedback(proposal, "", None), experiment, started)
            result["patch"] = proposal.patch
            started = time.monotonic()
            outcome = _gate_trial(_run_gates(spec_path, root, knobs, knobs, out), key, result, experiment, record,
                                  started)
            if outcome["status"] == "measured" and outcome["feasible"]:
                path = ws.export(_home(ledger, "patches"), {
                    "run": run_id, "trial": number, "rationale": proposal.rationale, "proposer": proposer.name,
                    "judgements": outcome.get("judgements"), "objective": outcome["objective"]})
                outcome["exported"] = str(path)
                log(f"  accepted: patch exported to {path}")
            return outcome
    except WorkspaceError as err:
        return _store(record, key, result, experiment, f"workspace: {str(err)[:300]}")


def _propose(proposer: Any, context: dict, ws: Workspace, spec_path: Path, root: Path, knobs: dict,
             out: Path) -> Proposal:
    if proposer.name != "llm":
        return proposer.propose(context, ws)

    def gates_probe(arguments: dict) -> str:
        gates = _run_gates(spec_path, root, knobs, knobs, out.with_suffix(".probe.json"))
        lines = [f"[{name}] {fb['verdict'].upper()}: {fb['finding']}" for name, fb in gates["feedback"].items()]
        return "\n".join(lines + [j["message"] for j in gates["judgements"]])

    return proposer.propose(context, ws, {"gates": gates_probe})


def _proposal_feedback(proposal: Proposal | None, error: str, transcript: list | None) -> dict:
    """The proposal (patch, rationale, transcript) as a ledger record."""
    if proposal is None:
        return Feedback("proposal", "fail", f"no patch: {error[:400]}", details={"transcript": transcript or []}).to_dict()
    lines = proposal.patch.count("\n")
    return Feedback("proposal", "pass", f"{proposal.proposer} proposed a {lines}-line patch: {proposal.rationale[:300]}",
                    details={"patch": proposal.patch, "rationale": proposal.rationale,
                             "transcript": proposal.transcript}).to_dict()


def _context(spec: Spec, spec_path: Path, hypotheses: list[Hypothesis], done: dict, trials: list[dict]) -> dict:
    """What a code proposer is told: the target, the criteria, the ladder's findings, hypotheses, past trials."""
    return {"spec": str(spec_path), "target": spec.target.model_dump(exclude_none=True),
            "knobs": {n: k.model_dump() for n, k in spec.knobs.items()},
            "criteria": [c.model_dump(exclude_none=True) for c in spec.criteria],
            "ladder": {k: r["feedback"]["finding"] for k, r in done.items() if k.startswith("ladder/")},
            "hypotheses": [asdict(h) for h in hypotheses],
            "previous_trials": [{k: t.get(k) for k in ("trial", "status", "why", "objective", "feasible")}
                                for t in trials]}



