"""The optimization loop: trace and attribute the baseline, derive hypotheses, measure the A/A floor (the
baseline against a twin launch of it), then for each proposal run the cheapest probe that could refute it
first: check → local A/B over blocks → end-to-end (only after a local win beyond the floor; more repeats
while a criterion is inconclusive) → criteria → ledger. Every launch is its own process group on its own
port; a target that dies voids its trial. Stops at a budget of probes or minutes; an interrupted or killed
run resumes from the ledger.

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
from infragent.agent.steps import aa_calibration, check_outputs, end_to_end, local_ab, quality_gate
from infragent.lab.ledger import Ledger
from infragent.lab.lifecycle import guarded_run, launched, open_run
from infragent.lab.measure import default_knobs
from infragent.lab.spec import QUALITY_METRICS, Spec, load_spec
from infragent.lab.target import TargetDied, TargetError, TargetProcess, engine_config, require_own_ports
from infragent.probes.artifacts import artifact_dir
from infragent.probes.feedback import Feedback


MAX_REPEATS = 3  # consecutive proposals of already-tried knob values before the search stops


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
    require_own_ports(spec.target, "optimize runs the baseline and each candidate at the same time")
    run_id = _start(spec_path, ledger, resume, log)
    with guarded_run(ledger, run_id, f"infragent optimize {spec_path} --ledger {ledger.path}", log):
        outcome = _optimize(spec, run_id, ledger, budget, log, seed)
        ledger.set_run(run_id, status="completed")
    return outcome


def _optimize(spec: Spec, run_id: int, ledger: Ledger, budget: Budget, log: Callable[[str], None],
              seed: int) -> Outcome:
    done = {r["key"]: r for r in ledger.probe_results(run_id)}
    clock = _Clock(budget, sum(1 for k, r in done.items() if _counts(k, r)))
    baseline_knobs = default_knobs(spec)

    def record(key: str, feedback: Feedback, experiment: int | None, started: float) -> dict:
        key = fresh_key(done, key)  # a trial interrupted part-way is run again: its earlier probes stay as they are
        feedback.details["cost_s"] = round(time.monotonic() - started, 2)
        ledger.record_probe(run_id, key, feedback.to_dict(), experiment, [(e.path, e.description) for e in feedback.evidence])
        clock.probes += _counts(key, {"probe": feedback.probe})
        log(f"  [{key}] {feedback.verdict.upper()} ({feedback.details['cost_s']:.0f} s): {clip(feedback.finding)}")
        done[key] = {"key": key, "feedback": feedback.to_dict(), "verdict": feedback.verdict}
        return done[key]

    base_exp = ledger.experiment(run_id, "baseline", baseline_knobs)
    hypotheses = _hypotheses(spec, baseline_knobs, done, record, base_exp, ledger, run_id, log)
    proposer = SearchProposer(spec.knobs, suspects(hypotheses) or None, seed=seed)
    log(f"searching {', '.join(proposer.knobs)} (knobs acting on the suspects); fixed: {proposer.fixed or '-'}")
    outcome = Outcome(run_id, {"knobs": baseline_knobs}, None, hypotheses=hypotheses)
    with launched(spec.target, baseline_knobs, ledger, run_id, "baseline") as base:
        floor = _aa_floor(spec, base, baseline_knobs, done, record, base_exp, ledger, run_id)
        trial = repeats = 0
        while True:
            key = f"trial/{trial}"
            replay = _replay(done, key)
            if replay is None and out_of_budget(clock, outcome):
                break
            number, knobs = proposer.propose() if replay is None else _enqueue(proposer, replay["knobs"])
            if replay is None and known_point(proposer, number, knobs, outcome.trials, baseline_knobs):
                repeats += 1
                if search_exhausted(proposer, outcome, baseline_knobs, repeats):
                    break
                continue
            repeats = 0
            result = replay or _trial(spec, key, knobs, base, floor, ledger, run_id, record, clock, trial, log)
            outcome.trials.append(result)
            tell(proposer, number, result)
            trial += 1
    outcome.best, limits = _best(outcome.trials)
    outcome.limits += limits
    return outcome


def _aa_floor(spec: Spec, base: TargetProcess, knobs: dict, done: dict, record: Callable, experiment: int,
              ledger: Ledger, run_id: int) -> float:
    """The A/A floor for local wins: measured once per run between the baseline and a second launch of it
    (kept in the ledger, so a resumed run reuses it)."""
    key = "calibration/aa"
    if key not in done:
        started = time.monotonic()
        with launched(spec.target, knobs, ledger, run_id, "baseline-twin") as twin:
            feedback = _probe(lambda: aa_calibration(spec.scenarios[0], base.base_url, twin.base_url, seed=7),
                              base, twin)
        record(key, feedback, experiment, started)
    return float(done[key]["feedback"]["numbers"]["aa_floor"]["value"])


def _probe(run: Callable[[], Feedback], base: TargetProcess, cand: TargetProcess) -> Any:
    """Run a probe against live targets; a probe that errs because a target died says so, and a target found
    dead afterwards voids the probe (nothing a dead target served is a measurement)."""
    try:
        result = run()
    except Exception:
        _alive(base, cand)
        raise
    _alive(base, cand)
    return result


def _alive(base: TargetProcess, cand: TargetProcess) -> None:
    """Raise TargetDied for the candidate, or RunError when the baseline itself died (the run cannot go on)."""
    try:
        base.check_alive()
    except TargetDied as err:
        raise RunError(f"the baseline target died, so no comparison can be trusted: {err}") from None
    cand.check_alive()


class RunError(RuntimeError):
    """The run cannot continue (the baseline died); resume it once the cause is fixed."""


def clip(text: str, limit: int = 600) -> str:
    """text cut at a word boundary near limit, with a mark that it goes on (the ledger keeps it whole)."""
    return text if len(text) <= limit else text[:text.rfind(" ", 0, limit)] + " …"


def fresh_key(done: dict, key: str) -> str:
    """key, or key@2, key@3... when an earlier (interrupted) attempt already recorded it."""
    attempt, fresh = 1, key
    while fresh in done:
        attempt += 1
        fresh = f"{key}@{attempt}"
    return fresh


def known_point(search: SearchProposer, number: int, knobs: dict, trials: list[dict], baseline_knobs: dict) -> bool:
    """The baseline or an already tried point: told to the sampler again (nothing spent) and, in a finite
    space, the next untried point queued in its place. False for a new point."""
    seen = next((t for t in trials if t["knobs"] == knobs), None)
    if seen is None and knobs != baseline_knobs:
        return False
    tell(search, number, seen or {"status": "baseline"})
    fresh = search.unmeasured(_tried(trials, baseline_knobs))
    if fresh is not None:
        search.start_from(fresh)
    return True


def search_exhausted(search: SearchProposer, outcome: Outcome, baseline_knobs: dict, repeats: int) -> bool:
    """True (and the limit noted) when every point of a finite space was tried, or the search keeps proposing
    tried points."""
    exhausted = search.finite and search.unmeasured(_tried(outcome.trials, baseline_knobs)) is None
    if exhausted or repeats > MAX_REPEATS:
        outcome.limits.append("every combination of the searched knobs was tried" if exhausted
                              else f"the search proposed tried points {repeats} times in a row")
        return True
    return False


def _tried(trials: list[dict], baseline_knobs: dict) -> list[dict]:
    return [t["knobs"] for t in trials] + [baseline_knobs]


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


def _trial(spec: Spec, key: str, knobs: dict, base: TargetProcess, floor: float, ledger: Ledger, run_id: int,
           record: Callable, clock: _Clock, number: int, log: Callable[[str], None]) -> dict:
    """One proposal through the gates; returns its status, knobs, objective and feasibility."""
    log(f"{key}: {knobs}")
    experiment = ledger.experiment(run_id, key, knobs)
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
                          f"quality gate: {gate['verdict']}")
    base_url = base.base_url
    try:
        with launched(spec.target, knobs, ledger, run_id, key) as cand:
            started = time.monotonic()
            if not gated and record(f"{key}/check", _probe(lambda: check_outputs(base_url, cand.base_url), base, cand),
                                    experiment, started)["verdict"] != "pass":
                return _store(record, key, result, experiment, "check: greedy outputs differ from the baseline's")
            started = time.monotonic()
            local = record(f"{key}/local_ab", _probe(lambda: local_ab(spec.scenarios[0], base_url, cand.base_url,
                                                                      seed=100 + number, floor=floor), base, cand),
                           experiment, started)
            if local["verdict"] != "pass":
                what = "a real local loss" if local["verdict"] == "fail" else "no win beyond the A/A floor"
                return _store(record, key, result, experiment, f"local A/B: {what}; not worth an end-to-end run")
            if not clock.left():
                return _store(record, key, result, experiment, "local A/B: a win, but no budget left for end-to-end")
            started = time.monotonic()
            e2e, score, raw = end_to_end(spec, base_url, cand.base_url, repeats_offset=1000 * (number + 1),
                                         more=lambda: clock.minutes() < clock.budget.minutes,
                                         alive=lambda: _alive(base, cand))
            record(f"{key}/e2e", e2e, experiment, started)
            for name, fb in raw.items():  # the raw records of the e2e probe above (its cost is there)
                record(f"{key}/{name}", fb, experiment, time.monotonic())
            result.update(status="measured", objective=score["objective"], feasible=score["feasible"],
                          finding=e2e.finding, judgements=quality_judgements + e2e.details["judgements"])
            return _store(record, key, result, experiment, f"end to end: criteria {e2e.verdict}")
    except TargetDied as err:
        return _store(record, key, result | {"status": "target died"}, experiment, str(err)[:400])
    except TargetError as err:
        return _store(record, key, result | {"status": "not started"}, experiment,
                      f"target did not start: {str(err)[:300]}")


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
