"""The optimization loop: trace and attribute the baseline, derive hypotheses, then for each proposal run
the cheapest probe that could refute it first: check → local A/B → end-to-end (only after a real local
win) → criteria → ledger. Stops at a budget of probes or minutes; a killed run resumes from the ledger.

Every step is one ledger record (its Feedback, with what it cost in details.cost_s), so the trajectory
reads top to bottom with `infragent show RUN`.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infragent.agent.hypotheses import Hypothesis, engine_workload, from_analysis, suspects
from infragent.agent.search import SearchProposer
from infragent.agent.steps import check_outputs, end_to_end, local_ab, quality_gate
from infragent.lab.ledger import Ledger
from infragent.lab.measure import open_run
from infragent.lab.spec import QUALITY_METRICS, Spec, load_spec
from infragent.lab.target import TargetError, TargetProcess, engine_config
from infragent.probes.artifacts import artifact_dir
from infragent.probes.feedback import Feedback


@dataclass
class Budget:
    """When to stop: whichever comes first."""

    probes: int = 12
    minutes: float = 8.0


@dataclass
class Outcome:
    """What an optimize run found."""

    run_id: int
    baseline: dict[str, Any]
    best: dict[str, Any] | None  # knobs, objective, trial, end-to-end finding
    limits: list[str] = field(default_factory=list)
    hypotheses: list[Hypothesis] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)


class _Clock:
    """Counts probes and minutes against the budget."""

    def __init__(self, budget: Budget, used_probes: int) -> None:
        self.budget, self.probes, self.start = budget, used_probes, time.monotonic()

    def minutes(self) -> float:
        return (time.monotonic() - self.start) / 60

    def left(self, probes_needed: int = 1) -> bool:
        return self.probes + probes_needed <= self.budget.probes and self.minutes() < self.budget.minutes


def optimize(spec_path: str | Path, ledger: Ledger, budget: Budget, resume: int | None = None,
             log: Callable[[str], None] = print, seed: int = 0) -> Outcome:
    """Run (or resume) the loop with the search proposer; returns what it found."""
    spec = load_spec(spec_path)
    run_id = _start(spec_path, ledger, resume, log)
    done = {r["key"]: r for r in ledger.probe_results(run_id)}
    clock = _Clock(budget, sum(1 for k, r in done.items() if _counts(k, r)))
    baseline_knobs = {name: knob.default for name, knob in spec.knobs.items() if knob.default is not None}

    def record(key: str, feedback: Feedback, experiment: int | None, started: float) -> dict:
        feedback.details["cost_s"] = round(time.monotonic() - started, 2)
        ledger.record_probe(run_id, key, feedback.to_dict(), experiment, [(e.path, e.description) for e in feedback.evidence])
        clock.probes += _counts(key, {"probe": feedback.probe})
        log(f"  [{key}] {feedback.verdict.upper()} ({feedback.details['cost_s']:.0f} s): {feedback.finding[:300]}")
        done[key] = {"key": key, "feedback": feedback.to_dict(), "verdict": feedback.verdict}
        return done[key]

    base_exp = ledger.experiment(run_id, "baseline", baseline_knobs)
    hypotheses = _hypotheses(spec, baseline_knobs, done, record, base_exp, ledger, run_id, log)
    proposer = SearchProposer(spec.knobs, suspects(hypotheses) or None, seed=seed)
    log(f"searching {', '.join(proposer.knobs)} (knobs acting on the suspects); fixed: {proposer.fixed or '-'}")
    outcome = Outcome(run_id, {"knobs": baseline_knobs}, None, hypotheses=hypotheses)
    logs = ledger.path.parent / "logs"
    with TargetProcess(spec.target, baseline_knobs, logs / f"run-{run_id}-baseline.log") as base:
        ledger.set_run(run_id, target_pgid=base.pgid)
        trial = 0
        while True:
            key = f"trial/{trial}"
            replay = _replay(done, key)
            if replay is None and out_of_budget(clock, outcome):
                break
            number, knobs = proposer.propose() if replay is None else _enqueue(proposer, replay["knobs"])
            result = replay or _trial(spec, key, knobs, base.base_url, ledger, run_id, record, clock, trial, log)
            outcome.trials.append(result)
            tell(proposer, number, result)
            trial += 1
        ledger.set_run(run_id, target_pgid=None)
    outcome.best, limits = _best(outcome.trials)
    outcome.limits += limits
    ledger.set_run(run_id, status="completed")
    return outcome


def out_of_budget(clock: _Clock, outcome: Outcome) -> bool:
    """True (and the limit noted in the outcome) when another trial's two probes would overrun the budget."""
    if clock.left(probes_needed=2):
        return False
    outcome.limits.append(f"budget: {clock.probes} probes of {clock.budget.probes}, "
                          f"{clock.minutes():.1f} of {clock.budget.minutes:g} minutes")
    return True


def tell(search: SearchProposer, number: int, result: dict) -> None:
    """Tell the search proposer a trial's result: its objective and feasibility, or that it failed."""
    if result["status"] == "measured":
        search.tell(number, result["objective"], result["feasible"])
    else:
        search.reject(number)


def _counts(key: str, row: dict) -> bool:
    """Whether a ledger record was a probe run (not a hypothesis, a trial's outcome or its raw records); a code
    proposal counts (it is a step with a cost, e.g. a model's turns)."""
    probe = row.get("probe") or row.get("feedback", {}).get("probe")
    return probe not in ("hypothesis", "trial", "loadgen")


def _start(spec_path: str | Path, ledger: Ledger, resume: int | None, log: Callable[[str], None]) -> int:
    run_id = open_run(ledger, "optimize", spec_path, resume, log)
    log(f"run {run_id}: " + (f"optimize {spec_path}" if resume is None else "resuming"))
    return run_id


def _hypotheses(spec: Spec, knobs: dict, done: dict, record: Callable, experiment: int, ledger: Ledger,
                run_id: int, log: Callable[[str], None]) -> list[Hypothesis]:
    """Trace the baseline (engine targets: in-process, offline) and attribute it; hypotheses from the findings."""
    if spec.target.kind != "engine":
        log("command target: no trace to attribute; every knob is a suspect")
        return []
    if "trace/baseline" not in done:
        started = time.monotonic()
        record("trace/baseline", trace_engine(spec, knobs), experiment, started)
    analysis = Feedback(**{k: v for k, v in done["trace/baseline"]["feedback"].items()
                           if k in ("probe", "verdict", "finding", "details")})
    return record_hypotheses(from_analysis(analysis, spec.knobs), done, ledger, run_id, experiment, log)


def record_hypotheses(found: list[Hypothesis], done: dict, ledger: Ledger, run_id: int, experiment: int,
                      log: Callable[[str], None]) -> list[Hypothesis]:
    """Each hypothesis not yet in the ledger as its own record (claim, probe, prediction, what it cites)."""
    for i, h in enumerate(found):
        key = f"hypothesis/{i}"
        if key not in done:
            ledger.record_probe(run_id, key, {"probe": "hypothesis", "verdict": "inconclusive", "finding": h.claim,
                                              "numbers": {}, "details": asdict(h)}, experiment)
            log(f"  [hypothesis] {h.claim}; probe: {h.probe}; predicts {h.predicted}")
    return found


def trace_engine(spec: Spec, knobs: dict) -> Feedback:
    """Run a few requests shaped like the first scenario through the engine in-process, traced; analyze."""
    from infragent.engine.llm_engine import LLMEngine
    from infragent.engine.sampling import SamplingParams
    from infragent.probes.analyze import analyze
    from infragent.trace import Recorder

    engine = LLMEngine(engine_config(spec.target, knobs))
    with Recorder(thread_cpu=True) as rec:
        for ids, out in engine_workload(spec, knobs):
            engine.add_request(ids, SamplingParams(max_tokens=out, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    path = rec.trace().save(artifact_dir() / f"trace-baseline-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return analyze(path)


def _trial(spec: Spec, key: str, knobs: dict, base_url: str, ledger: Ledger, run_id: int, record: Callable,
           clock: _Clock, number: int, log: Callable[[str], None]) -> dict:
    """One proposal through the gates; returns its status, knobs, objective and feasibility."""
    log(f"{key}: {knobs}")
    experiment = ledger.experiment(run_id, key, knobs)
    logs = ledger.path.parent / "logs"
    result: dict[str, Any] = {"trial": number, "knobs": knobs, "status": "rejected", "objective": None,
                              "feasible": False}
    gated = any(c.metric in QUALITY_METRICS for c in spec.criteria)
    quality_judgements: list[dict] = []
    if gated:  # outputs may differ by design (quantization): the quality gates replace the identity check
        started = time.monotonic()
        gate = record(f"{key}/quality", quality_gate(spec, knobs), experiment, started)
        quality_judgements = gate["feedback"]["details"].get("judgements", [])
        if gate["verdict"] != "pass":
            return _store(record, key, result | {"judgements": quality_judgements}, experiment,
                          "did not pass the quality gates")
    try:
        with TargetProcess(spec.target, knobs, logs / f"run-{run_id}-{key.replace('/', '-')}.log") as cand:
            ledger.set_run(run_id, candidate_pgid=cand.pgid)  # a kill -9 of the loop leaves it; resume stops it
            started = time.monotonic()
            if not gated and record(f"{key}/check", check_outputs(base_url, cand.base_url), experiment,
                                    started)["verdict"] != "pass":
                return _store(record, key, result, experiment, "failed the correctness check")
            started = time.monotonic()
            local = record(f"{key}/local_ab", local_ab(spec.scenarios[0], base_url, cand.base_url, seed=100 + number),
                           experiment, started)
            if local["verdict"] != "pass":
                return _store(record, key, result, experiment, "no real local win: not worth an end-to-end run")
            if not clock.left():
                return _store(record, key, result, experiment, "local win, but no budget left for end-to-end")
            started = time.monotonic()
            e2e, score, raw = end_to_end(spec, base_url, cand.base_url, repeats_offset=1000 * (number + 1))
            record(f"{key}/e2e", e2e, experiment, started)
            for name, fb in raw.items():
                ledger.record_probe(run_id, f"{key}/{name}", fb.to_dict(), experiment,
                                    [(e.path, e.description) for e in fb.evidence])
            result.update(status="measured", objective=score["objective"], feasible=score["feasible"],
                          finding=e2e.finding, judgements=quality_judgements + e2e.details["judgements"])
            return _store(record, key, result, experiment, "measured end to end")
    except TargetError as err:
        return _store(record, key, result, experiment, f"target did not start: {str(err)[:300]}")
    finally:
        ledger.set_run(run_id, candidate_pgid=None)


def _store(record: Callable, key: str, result: dict, experiment: int, why: str) -> dict:
    """The trial's outcome as its own ledger record (what resume replays)."""
    result["why"] = why
    fb = Feedback("trial", "pass" if result["status"] == "measured" and result["feasible"] else "fail",
                  f"{why}; knobs {result['knobs']}" + (f"; objective {result['objective']:.3g}"
                                                      if result["objective"] is not None else ""),
                  details={"result": result})
    record(f"{key}/outcome", fb, experiment, time.monotonic())
    return result


def _replay(done: dict, key: str) -> dict | None:
    row = done.get(f"{key}/outcome")
    return row["feedback"]["details"]["result"] if row else None


def _enqueue(proposer: SearchProposer, knobs: dict) -> tuple[int, dict]:
    proposer.start_from(knobs)
    return proposer.propose()


def _best(trials: list[dict]) -> tuple[dict | None, list[str]]:
    """The best feasible measured trial, and what limited the result."""
    measured = [t for t in trials if t["status"] == "measured"]
    feasible = [t for t in measured if t["feasible"]]
    limits = []
    if not measured:
        limits.append("no proposal reached an end-to-end run (" + "; ".join(sorted({t.get("why", "") for t in trials}))
                      + ")")
    elif not feasible:
        limits.append("every measured proposal failed a criterion")
    return (max(feasible, key=lambda t: t["objective"]) if feasible else None), limits
