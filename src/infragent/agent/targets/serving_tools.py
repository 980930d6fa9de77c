"""The probes a code proposer may run on its worktree of a serving target's code, each one charged to the
run's probe budget and recorded under the candidate's key (trial/N/tool/NAME): the in-process output check
and step bench against the baseline's code, a traced run of the worktree's engine (record + analyze), the
gil probe on it (which thread holds the GIL, which waits), the candidate's cheap gates (tests, check, step
bench), and a scenario run of the worktree's server interleaved with the baseline's. Each answers with the
probe's Feedback as text, as the model reads it.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol

from infragent.agent.context import RunContext, fresh_key
from infragent.agent.proposal import Probe
from infragent.agent.targets.serving_gates import objective, run_tests, step_unit
from infragent.agent.workspace import Workspace
from infragent.lab.measure import interleaved_repeat
from infragent.lab.spec import Spec
from infragent.lab.target import TargetProcess
from infragent.probes.artifacts import artifact_dir
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.step_bench import StepWorker, check_tokens, span_table, trace_engine_code



class ServingHost(Protocol):
    """What the tools need from the serving target that offers them (agent/serving_target.ServingTarget)."""

    spec: Spec
    baseline_knobs: dict[str, Any]

    def beside_baseline(self, ctx: RunContext, knobs: dict, role: str,
                        code: Path | None = None) -> ContextManager[tuple[TargetProcess, TargetProcess]]:
        """(the baseline's server, a launch of knobs from code)."""

    def engine_pair(self, workspace: Workspace, knobs: dict) -> ContextManager[tuple[StepWorker, StepWorker]]:
        """Step workers of the baseline's code and the worktree's."""

    def step_bench(self, ctx: RunContext, base: StepWorker, cand: StepWorker, config: dict) -> Feedback:
        """The step bench of cand against base."""

    def engine_fields(self, knobs: dict) -> dict:
        """The engine config fields of knobs."""


def serving_tools(target: ServingHost, ctx: RunContext, ws: Workspace, key: str) -> dict[str, Probe]:
    """The probes by name (engine targets get the in-process ones; every serving target gets the scenario)."""
    def charged(name: str, run: Callable[[], Feedback]) -> Probe:
        def probe(arguments: dict) -> str:
            started = time.monotonic()
            record = ctx.record(fresh_key(ctx.done, f"{key}/tool/{name}"), run(), None, started)
            return Feedback(**{k: v for k, v in record["feedback"].items()
                               if k in ("probe", "verdict", "finding", "next_probes")}).render()
        probe.__doc__ = run.__doc__
        return probe

    tools: dict[str, Probe] = {"scenario": charged("scenario", lambda: _scenario(target, ctx, ws, key))}
    if target.spec.target.kind == "engine":
        tools.update(check=charged("check", _check(target, ws)), bench=charged("bench", _bench(target, ctx, ws)),
                     record=charged("record", _record(target, ws)), gil=charged("gil", _gil(target, ws)),
                     gates=charged("gates", _gates(target, ctx, ws)))
    return tools


def _gates(target: ServingHost, ctx: RunContext, ws: Workspace) -> Callable[[], Feedback]:
    def gates() -> Feedback:
        """the candidate's cheap gates on your worktree: the spec's tests, the output check, the step bench"""
        said: list[Feedback] = []
        if target.spec.target.tests:
            said.append(run_tests(target.spec.target.tests, ws.path, target.spec.target.kind))
        if not said or said[-1].verdict == "pass":
            said.append(_check(target, ws)())
        if said[-1].verdict == "pass":
            said.append(_bench(target, ctx, ws)())
        verdict = said[-1].verdict
        return Feedback("gates", verdict, "; ".join(f"[{f.probe}] {f.verdict.upper()}: {f.finding}" for f in said),
                        details={"gates": [f.to_dict() for f in said]})
    return gates


@contextlib.contextmanager
def _pair(target: ServingHost, ws: Workspace) -> Iterator[tuple[StepWorker, StepWorker]]:
    with target.engine_pair(ws, target.baseline_knobs) as pair:
        yield pair


def _check(target: ServingHost, ws: Workspace) -> Callable[[], Feedback]:
    def check() -> Feedback:
        """greedy tokens of fixed prompts, your worktree's engine against the baseline's"""
        with _pair(target, ws) as (base, cand):
            return check_tokens(base, cand)
    return check


def _bench(target: ServingHost, ctx: RunContext, ws: Workspace) -> Callable[[], Feedback]:
    def bench() -> Feedback:
        """prefill and decode step times, your worktree's engine against the baseline's (seconds)"""
        with _pair(target, ws) as (base, cand):
            return target.step_bench(ctx, base, cand, target.engine_fields(target.baseline_knobs))
    return bench


def _gil(target: ServingHost, ws: Workspace) -> Callable[[], Feedback]:
    def gil() -> Feedback:
        """per thread and span, GIL held (py-spy) and waited while your worktree's engine runs a few batches"""
        from infragent.probes.gil import run_gil

        unit = step_unit(target.spec)
        batch = {"config": target.engine_fields(target.baseline_knobs), "prompts": unit.prompts,
                 "max_tokens": unit.max_tokens, "units": 3}
        return run_gil("infragent.probes.step_worker:gil_workload", code=ws.path,
                       env={"INFRAGENT_STEP_UNIT": json.dumps(batch)})
    return gil


def _record(target: ServingHost, ws: Workspace) -> Callable[[], Feedback]:
    def record() -> Feedback:
        """record + analyze: a traced batch on your worktree's engine, attributed: the top spans by own time and
        the spans with time in no child span (with their code ranges)"""
        worker = StepWorker(ws.path, target.engine_fields(target.baseline_knobs), "candidate").ready()
        try:
            path = artifact_dir() / f"trace-worktree-{time.strftime('%Y%m%d-%H%M%S')}.json"
            feedback = trace_engine_code(worker, step_unit(target.spec), path)
            feedback.finding += f"; {span_table(feedback.details)}"
            return feedback
        finally:
            worker.close()
    return record


def _scenario(target: ServingHost, ctx: RunContext, ws: Workspace, key: str) -> Feedback:
    """the first scenario once, your worktree's server interleaved with the baseline's: latency and throughput"""
    scenario = target.spec.scenarios[0].model_copy(update={"repeats": 1})
    with target.beside_baseline(ctx, target.baseline_knobs, f"{key}/tool", ws.path) as (base, cand):
        runs = interleaved_repeat(scenario, {"baseline": base.base_url, "candidate": cand.base_url}, seed=31)
    values = {side: objective(run) for side, run in runs.items()}
    latency = {side: sorted(r.latency_s for r in run.records if r.success and not r.warmup)
               for side, run in runs.items()}
    medians: dict[str, Any] = {side: (xs[len(xs) // 2] * 1000 if xs else float("nan")) for side, xs in latency.items()}
    ratio = values["candidate"] / values["baseline"] if values["baseline"] else float("nan")
    return Feedback("loadgen", "pass" if ratio > 1 else "fail",
                    f"{scenario.name} once, interleaved: objective {values['candidate']:.3g} vs baseline "
                    f"{values['baseline']:.3g} (x{ratio:.3f}); median E2E latency {medians['candidate']:.0f} ms vs "
                    f"{medians['baseline']:.0f} ms (one repeat: a hint, not a verdict)",
                    numbers={"objective_ratio": Measure(ratio, "x"),
                             "e2el_median_ms_candidate": Measure(medians["candidate"], "ms"),
                             "e2el_median_ms_baseline": Measure(medians["baseline"], "ms")})
