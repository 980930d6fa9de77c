"""A serving target under the loop (the built-in engine, or any server a command launches): the baseline traced
and attributed in an engine child of its own code (engine only), its server launched with the first
candidate's (and a twin of it for the A/A floor), each candidate launched on its own port (its listener proven
to be its process group) and judged cheapest first: the output check (or the quality gates) → the local probe
its hypothesis calls for (a short A/B over blocks, a win beyond the A/A floor) → end to end, interleaved with
the baseline, every criterion per phase and bucket (more repeats while one is inconclusive). A candidate that
dies voids its trial; a baseline that dies ends the run. With --feedback e2e-only, end to end only: the
candidate's greedy outputs are then judged there too (identical on twin requests), not by a check first.

With `code = PATH` the target's code is patchable: the baseline runs from a worktree of PATH as it stands,
each patch from its own worktree. A patch to the engine goes first through the spec's tests, then the
in-process checks — greedy tokens identical, then the step microbenchmark (seconds, no server) — and only
then is its server launched; a command target's patch runs its command inside the candidate's worktree.
A patch is kept only with an improvement to its name: its local win (the ladder: the step bench or the
local A/B), or under e2e-only its objective end to end beyond the A/A floor. The baseline's engine children
for the step bench live for the whole run.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from infragent.agent.targets.command_diagnosis import CommandDiagnostics, diagnose_config
from infragent.agent.context import RunContext
from infragent.agent.hypotheses import Hypothesis, engine_workload, from_analysis, from_scheduling
from infragent.analysis.scheduling import scheduling
from infragent.agent.proposal import Probe
from infragent.agent.targets.quality_cause import known_quality_cost, quality_causes
from infragent.agent.targets.serving_gates import (aa_calibration, check_outputs, end_to_end, local_ab, quality_gate,
                                          run_tests, step_unit)
from infragent.agent.targets.serving_tools import serving_tools
from infragent.agent.targets import Candidate, proposal_info
from infragent.agent.workspace import Workspace
from infragent.lab.lifecycle import launched
from infragent.lab.measure import default_knobs
from infragent.lab.spec import QUALITY_METRICS, Spec
from infragent.lab.target import TargetDied, TargetError, TargetProcess, engine_config, require_own_ports
from infragent.probes.artifacts import artifact_dir
from infragent.probes.diagnose import DiagnoseError, run_diagnose
from infragent.probes.feedback import Feedback
from infragent.probes.step_bench import (StepAA, StepBenchError, StepWorker, Unit, check_tokens, locate_self_time,
                                         span_shift, step_bench)



class RunError(RuntimeError):
    """The run cannot continue (the baseline died); resume it once the cause is fixed."""


class EngineDiagnostics:
    """The engine's baseline traced and attributed: hypotheses about its top spans and threads that never
    overlap. The trace runs in the baseline's engine child (its own code copy: a patched checkout is traced
    as it is, not the installed package). Their probes run on candidates (the local A/B, or for a patch the
    step bench), not on the baseline."""

    observe = ["trace"]

    def __init__(self, spec: Spec, knobs: dict, trace: Callable[[], Feedback]) -> None:
        self.spec, self.knobs = spec, knobs
        self.probes: dict[str, Callable[[], Feedback]] = {"trace": trace}

    def pose(self, results: dict[str, dict]) -> list[Hypothesis]:
        """Hypotheses from the trace's analysis, one question per span or pair of threads."""
        trace = results.get("ladder/trace")
        if trace is None:
            return []
        analysis = Feedback(**{k: v for k, v in trace.items() if k in ("probe", "verdict", "finding", "details")})
        found = from_scheduling(trace.get("details", {}).get("scheduling"), self.spec.knobs)
        found += from_analysis(analysis, self.spec.knobs)
        for h in found:
            if self.spec.target.code and not h.knobs and h.probe == "roofline":
                h.probe = "step_bench"  # no knob acts on it, but a patch can: the step bench refutes one in seconds
            h.locality = {"question": f"{h.probe}:{'|'.join(h.spans)}"}
        return found

    def settle(self, probe: str, hypothesis: Hypothesis, results: dict[str, dict]) -> Hypothesis:
        """Only the trace runs on the baseline here; the hypotheses it poses are settled by candidates."""
        return hypothesis


class ServingTarget:
    """The built-in engine or a command-launched server, each launch on its own port."""

    def __init__(self, spec: Spec, spec_path: Path) -> None:
        require_own_ports(spec.target, "optimize runs the baseline and each candidate at the same time")
        self.spec, self.spec_path = spec, spec_path
        self.baseline_knobs = default_knobs(spec)
        self.base: TargetProcess | None = None
        self.launches: contextlib.ExitStack | None = None  # the session's: the baseline's launch joins it
        self.base_experiment: int | None = None
        self.code_dir = (spec_path.parent / spec.target.code).resolve() if spec.target.code else None
        self.base_code: Workspace | None = None  # the baseline's worktree of code_dir, for the whole run
        self.step_workers: dict[str, StepWorker] = {}  # the baseline's engine children, per config, for the run
        self.step_aas: dict[str, StepAA] = {}  # their A/A twins and rounds, per config, for the run

    def diagnostics(self, ctx: RunContext) -> EngineDiagnostics | CommandDiagnostics:
        """The engine's trace (in the baseline's engine child); a command target's baseline launch seen from
        outside, as `infragent diagnose` sees any server."""
        if self.spec.target.kind != "engine":
            return CommandDiagnostics(self.spec, lambda: self.diagnose_baseline(ctx))
        return EngineDiagnostics(self.spec, self.baseline_knobs, self.trace_baseline)

    def diagnose_baseline(self, ctx: RunContext) -> Feedback:
        """`diagnose` on the baseline's launch (kept for the run): its metrics, threads, stacks, profile."""
        base = self.baseline_server(ctx)
        try:
            return run_diagnose(diagnose_config(self.spec, base.base_url, base.pgid))
        except DiagnoseError as err:
            return Feedback("diagnose", "inconclusive", f"inconclusive: {err}")

    def trace_baseline(self) -> Feedback:
        """The diagnosis trace in the baseline's engine child (kept for the step bench when there is code to
        patch, else stopped: nothing else runs in it)."""
        worker = self.baseline_worker(self.baseline_knobs)
        try:
            return trace_engine(self.spec, self.baseline_knobs, worker)
        finally:
            if self.code_dir is None:
                worker.close()

    @contextlib.contextmanager
    def session(self, ctx: RunContext, experiment: int) -> Iterator[None]:
        """The baseline for the whole run: a worktree of the code (when it has one); its server is launched
        with the first candidate's, the two loading in parallel (a patch the step bench refutes needs none)."""
        with contextlib.ExitStack() as stack:
            if self.code_dir is not None:
                self.base_code = stack.enter_context(Workspace.create(
                    self.code_dir, ctx.artifact_home("workspaces"), f"run-{ctx.run_id}-baseline-{_stamp()}"))
            self.launches, self.base_experiment = stack, experiment
            try:
                yield
            finally:
                self.base, self.launches = None, None
                for worker in self.step_workers.values():
                    worker.close()
                for aa in self.step_aas.values():
                    aa.close()
                self.step_workers.clear()
                self.step_aas.clear()

    @contextlib.contextmanager
    def beside_baseline(self, ctx: RunContext, knobs: dict, role: str,
                        code: Path | None = None) -> Iterator[tuple[TargetProcess, TargetProcess]]:
        """(the baseline's server, a launch of knobs from code): the baseline is launched, for the rest of the
        run, when this is the first launch that needs it, the two loading in parallel."""
        self._spawn_baseline(ctx)
        with launched(self.spec.target, knobs, ctx.ledger, ctx.run_id, role, code=code, wait=False) as other:
            base = self.baseline_server(ctx)
            yield base, other.ready()

    def baseline_server(self, ctx: RunContext) -> TargetProcess:
        """The baseline's server, launched on first use and kept for the run; one that cannot start ends it."""
        self._spawn_baseline(ctx)
        try:
            return self.base.ready()  # type: ignore[union-attr]
        except TargetError as err:
            raise RunError(f"the baseline target did not start, so nothing can be compared: {err}") from None

    def _spawn_baseline(self, ctx: RunContext) -> None:
        if self.base is None:
            assert self.launches is not None, "the baseline is launched only inside session()"
            try:
                self.base = self.launches.enter_context(launched(
                    self.spec.target, self.baseline_knobs, ctx.ledger, ctx.run_id, "baseline",
                    code=self._code(self.base_code), wait=False))
            except TargetError as err:
                raise RunError(f"the baseline target did not start, so nothing can be compared: {err}") from None

    def _aa_floor(self, ctx: RunContext) -> float:
        """The A/A floor for local wins: the baseline against a twin launch of it, measured once per run when a
        local A/B first needs it (a resumed run reuses it from the ledger)."""
        key = "calibration/aa"
        if key not in ctx.done:
            started = time.monotonic()
            with self.beside_baseline(ctx, self.baseline_knobs, "baseline-twin", self._code(self.base_code)) as (base, twin):
                feedback = self._probe(lambda: aa_calibration(self.spec.scenarios[0], base.base_url,
                                                              twin.base_url, seed=7), twin)
            ctx.record(key, feedback, self.base_experiment, started)
        value = ctx.done[key]["feedback"]["numbers"].get("aa_floor", {}).get("value")
        if value is None or not math.isfinite(value):  # nothing to compare with: stop the run, saying why
            raise RunError(f"the A/A calibration gave no floor, so no local A/B can be judged: "
                           f"{ctx.done[key]['feedback']['finding']}")
        return float(value)

    def workspace(self, ctx: RunContext, number: int) -> Workspace:
        """A worktree of the target's code for candidate number."""
        if self.code_dir is None:
            raise ValueError(f"a code proposer needs the target's code: add code = \"PATH\" to [target] in "
                             f"{ctx.spec_path} (for an engine target, a git checkout of infragent; for a command "
                             "target, the repository its command runs from)")
        return Workspace.create(self.code_dir, ctx.artifact_home("workspaces"),
                                f"run-{ctx.run_id}-trial-{number}-{_stamp()}")

    def tools(self, ctx: RunContext, workspace: Workspace, key: str) -> dict[str, Probe]:
        """The probes a code proposer may run on its worktree (agent/targets/serving_tools.py)."""
        return serving_tools(self, ctx, workspace, key)

    def info(self, ctx: RunContext, hypotheses: list[Hypothesis], trials: list[dict]) -> dict[str, Any]:
        """The JSON context for a code proposer."""
        findings = {k: r["feedback"]["finding"] for k, r in ctx.done.items() if k.startswith(("ladder/", "calibration/"))}
        return proposal_info(ctx, hypotheses, trials, findings)

    def judge(self, ctx: RunContext, candidate: Candidate, hypothesis: Hypothesis | None) -> dict[str, Any]:
        """A patch's tests and in-process probes first (engine), then check (or quality gates) → local probe →
        end to end; the first that says no rejects."""
        key, experiment = candidate.key, candidate.experiment
        checked = False
        if candidate.workspace is not None:
            rejected = self._code_probes(ctx, candidate)
            if rejected is not None:
                return rejected
            checked = self.spec.target.kind == "engine" and ctx.feedback == "ladder"
        gated = any(c.metric in QUALITY_METRICS for c in self.spec.criteria)
        judgements: list[dict] = []
        if gated:  # outputs may differ by design (quantization): the quality gates replace the identity check
            known = known_quality_cost(ctx, candidate.knobs)
            if known is not None:
                return {"why": f"quality: known to fail the gates ({known[:300]})"}
            started = time.monotonic()
            gate = ctx.record(f"{key}/quality", quality_gate(self.spec, candidate.knobs), experiment, started)
            judgements = gate["feedback"]["details"].get("judgements", [])
            if gate["verdict"] != "pass":  # which change costs the quality (the ladder's diagnosis, not e2e-only's)
                return {"judgements": judgements, "why": f"quality gate: {gate['verdict']}",
                        "posed": quality_causes(ctx, self.spec, self.baseline_knobs, candidate, gate)
                        if ctx.feedback == "ladder" else []}
        try:
            with self.beside_baseline(ctx, candidate.knobs, key, self._code(candidate.workspace)) as (base, cand):
                base_url = base.base_url
                if not gated and not checked and ctx.feedback == "ladder":  # e2e-only: outputs judged end to end
                    started = time.monotonic()
                    check = ctx.record(f"{key}/check", self._probe(lambda: check_outputs(base_url, cand.base_url),
                                                                   cand), experiment, started)
                    if check["verdict"] != "pass":
                        return {"why": "check: greedy outputs differ from the baseline's"}
                local = candidate.local
                if ctx.feedback == "ladder" and local is None:
                    floor = self._aa_floor(ctx)
                    started = time.monotonic()
                    record = ctx.record(f"{key}/local_ab", self._probe(lambda: local_ab(
                        self.spec.scenarios[0], base_url, cand.base_url, seed=100 + candidate.number,
                        floor=floor), cand), experiment, started)
                    local = {"key": record["key"], "verdict": record["verdict"], "finding": record["feedback"]["finding"]}
                    if record["verdict"] == "fail":
                        return {"local": local, "why": "local A/B: a real local loss; not worth an end-to-end run"}
                    if record["verdict"] != "pass":  # no evidence either way: not shown, not refuted
                        return {"local": local, "status": "not shown",
                                "why": "local A/B: not shown (inconclusive: no win beyond the A/A floor that its "
                                       "blocks could show); no end-to-end run"}
                    if not ctx.left():
                        return {"local": local, "why": "local A/B: a win, but no budget left for end-to-end"}
                # a patch is kept only if it shows an improvement (it must pay for the risk of a code change):
                # a local win beyond its floor (the ladder), else the objective end to end beyond the A/A floor
                # (e2e-only); knob values only need to pass the criteria, and the search keeps the best of them
                floor = self._aa_floor(ctx) if candidate.workspace is not None and local is None else None
                started = time.monotonic()
                e2e, score, raw = end_to_end(self.spec, base_url, cand.base_url, floor=floor,
                                             repeats_offset=1000 * (candidate.number + 1),
                                             more=lambda: ctx.minutes() < ctx.budget.minutes,
                                             alive=lambda: self._alive(cand), same_outputs=not gated)
                ctx.record(f"{key}/e2e", e2e, experiment, started)
                for name, fb in raw.items():  # the raw records of the e2e probe above (its cost is there)
                    ctx.record(f"{key}/{name}", fb, experiment, time.monotonic(), charge=False)
                return {"status": "measured", "objective": score["objective"], "feasible": score["feasible"],
                        "objective_ratio": score["objective_ratio"],
                        "finding": e2e.finding, "judgements": judgements + e2e.details["judgements"], "local": local,
                        "why": f"end to end: criteria {e2e.verdict}"}
        except TargetDied as err:
            return {"status": "target died", "why": str(err)[:400]}
        except TargetError as err:
            return {"status": "not started", "why": f"target did not start: {str(err)[:300]}"}

    def _code_probes(self, ctx: RunContext, candidate: Candidate) -> dict[str, Any] | None:
        """The spec's tests in the worktree, then (engine, ladder) the in-process token check and step
        microbenchmark against the baseline's code; a rejection, or None to go on."""
        ws = candidate.workspace
        assert ws is not None
        if self.spec.target.tests:
            started = time.monotonic()
            tests = ctx.record(f"{candidate.key}/tests", run_tests(self.spec.target.tests, ws.path, self.spec.target.kind),
                               candidate.experiment, started)
            if tests["verdict"] != "pass":
                return {"why": f"the spec's tests fail: {tests['feedback']['finding'][:300]}"}
        if self.spec.target.kind != "engine" or ctx.feedback != "ladder":
            return None
        config = self.engine_fields(candidate.knobs)
        started = time.monotonic()
        try:
            with self.engine_pair(ws, candidate.knobs) as (base, cand):
                check = ctx.record(f"{candidate.key}/check", check_tokens(base, cand), candidate.experiment, started)
                if check["verdict"] != "pass":
                    return {"why": f"check: {check['feedback']['finding'][:300]}"}
                started = time.monotonic()
                bench = self.step_bench(ctx, base, cand, config)
                bench = ctx.record(f"{candidate.key}/step_bench", bench, candidate.experiment, started)
                if bench["verdict"] == "pass":  # which span the win came from: the hypothesis it supports
                    started = time.monotonic()
                    where = ctx.record(f"{candidate.key}/record", span_shift(base, cand, step_unit(self.spec),
                                                                            artifact_dir()),
                                       candidate.experiment, started)
                    candidate.spans = [span for span in [where["feedback"]["locality"]["span"]] if span]
        except StepBenchError as err:
            ctx.record(f"{candidate.key}/check", Feedback("check", "fail", str(err)[:600]), candidate.experiment, started)
            return {"why": f"check: {str(err)[:300]}"}
        candidate.local = {"key": bench["key"], "verdict": bench["verdict"], "finding": bench["feedback"]["finding"],
                           "spans": candidate.spans}
        if bench["verdict"] == "fail":
            return {"local": candidate.local, "why": "step bench: a real loss; not worth a server launch"}
        if bench["verdict"] != "pass":  # no evidence either way: not shown, not refuted
            return {"local": candidate.local, "status": "not shown",
                    "why": f"step bench: not shown (inconclusive after {bench['feedback'].get('details', {}).get('rounds')} "
                           "blocks: no win beyond its floor that they could show); no server launch"}
        return None

    def step_bench(self, ctx: RunContext, base: StepWorker, cand: StepWorker, config: dict) -> Feedback:
        """The step bench against the A/A of this config; its cost leaves out the A/A's (a record of its own)."""
        started, aa_spent = time.monotonic(), [0.0]

        def aa(margin: float) -> float:
            begun = time.monotonic()
            floor = self.step_floor(ctx, base, config, margin)
            aa_spent[0] += time.monotonic() - begun
            return floor

        feedback = step_bench(base, cand, step_unit(self.spec), aa=aa)
        feedback.details["cost_s"] = round(time.monotonic() - started - aa_spent[0], 2)
        return feedback

    def step_floor(self, ctx: RunContext, base: StepWorker, config: dict, margin: float) -> float:
        """The step bench's A/A floor for this config, measured (and recorded) only as far as telling whether it
        lies below margin needs; a second engine of the baseline's code is kept for the run."""
        aa = self.step_aas.setdefault(json.dumps(config, sort_keys=True), StepAA(self._code(self.base_code), config))
        started = time.monotonic()
        floor, measured = aa.floor(base, step_unit(self.spec), margin)
        if measured is not None:
            ctx.record("calibration/step_aa", measured, None, started)
        return floor

    @contextlib.contextmanager
    def engine_pair(self, workspace: Workspace, knobs: dict) -> Iterator[tuple[StepWorker, StepWorker]]:
        """The baseline's engine child for these knobs (started once, kept for the run: its warm-up is paid
        once) and a fresh child of the worktree's engine, loaded in parallel."""
        cand = StepWorker(workspace.path, self.engine_fields(knobs), "candidate")
        try:
            base = self.baseline_worker(knobs, ready=False)
            yield base.ready(), cand.ready()
        finally:
            cand.close()

    def baseline_worker(self, knobs: dict, ready: bool = True) -> StepWorker:
        """The baseline's engine child for these knobs, from the baseline's code, started once for the run."""
        config = self.engine_fields(knobs)
        name = json.dumps(config, sort_keys=True)
        base = self.step_workers.get(name)
        if base is None or not base.alive():
            base = self.step_workers[name] = StepWorker(self._code(self.base_code), config, "baseline")
        return base.ready() if ready else base

    def engine_fields(self, knobs: dict) -> dict:
        """The EngineConfig an engine child builds for these knobs, as plain data (it may be another code copy)."""
        return json.loads(engine_config(self.spec.target, knobs).to_json())

    def _code(self, workspace: Workspace | None) -> Path | None:
        return None if workspace is None else workspace.path

    def _probe(self, run: Callable[[], Any], cand: TargetProcess) -> Any:
        """Run a probe against live targets; a target found dead afterwards voids it (nothing a dead target
        served is a measurement)."""
        try:
            result = run()
        except Exception:
            self._alive(cand)
            raise
        self._alive(cand)
        return result

    def _alive(self, cand: TargetProcess) -> None:
        """Raise TargetDied for the candidate, or RunError when the baseline itself died."""
        try:
            if self.base is not None:
                self.base.check_alive()
        except TargetDied as err:
            raise RunError(f"the baseline target died, so no comparison can be trusted: {err}") from None
        cand.check_alive()


TRACE_OUTPUT_TOKENS = 16  # the spans' shares are the same as at 32 tokens (mlp 52% vs 51%) in half the time


def trace_engine(spec: Spec, knobs: dict, worker: StepWorker) -> Feedback:
    """A few requests shaped like the first scenario (at most TRACE_OUTPUT_TOKENS tokens each), traced in an
    engine child (worker: the baseline's code); analyzed, with how the scheduler shaped them
    (analysis/scheduling.py)."""
    from infragent.probes.analyze import analyze
    from infragent.trace_model import Trace

    workload = engine_workload(spec, knobs)
    unit = Unit([ids for ids, _ in workload], min(TRACE_OUTPUT_TOKENS, max(out for _, out in workload)))
    answer = worker.run(unit, trace=artifact_dir() / f"trace-baseline-{time.strftime('%Y%m%d-%H%M%S')}.json")
    feedback = analyze(answer["trace"])
    config = engine_config(spec.target, knobs)
    feedback.details["scheduling"] = scheduling(Trace.load(answer["trace"]), config.max_num_batched_tokens,
                                                config.max_num_seqs).to_dict()
    feedback.locality["code"] = worker.code
    return locate_self_time(feedback, worker.code)


def _stamp() -> str:
    return time.strftime("%H%M%S") + f"-{os.getpid()}"
