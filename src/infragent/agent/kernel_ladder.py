"""The feedback ladder on a kernel target's baseline, cheapest first: check (partitioned when declared),
roofline against the reference, a trace (the threaded workload's, or a few traced calls), the GIL probe
(workload only), and the bench against the reference. Each rung is one probe run and one Feedback.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

from infragent.agent.kernel_target import KernelTarget
from infragent.analysis.repeats import redone, repeats
from infragent.analysis.trace_load import columns_from_trace
from infragent.probes.artifacts import artifact_dir
from infragent.probes.bench import run_bench
from infragent.probes.check import run_check
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.inputs import call, draw
from infragent.probes.roofline import run_roofline
from infragent.probes.span_work import work_by_span
from infragent.trace import Recorder, span

TRACED_CALLS = 5


def ladder(target: KernelTarget, knobs: dict, workload_ref: str | None) -> Iterator[tuple[str, Callable[[], Feedback]]]:
    """(name, probe) in the order to run them; workload_ref is 'path/FILE.py:function' for the GIL child."""
    candidate = target.bind(knobs)
    yield "check", lambda: run_check(candidate, target.reference, target.inputs, target.target.partition,
                                     trials=12, rtol=target.target.rtol)
    yield "roofline", lambda: run_roofline(candidate, target.bench_inputs, target.reference, quick_peaks=True)
    if target.workload is not None:
        yield "trace", lambda: trace_workload(target, knobs)
    else:
        yield "trace", lambda: trace_calls(candidate, target)
    if workload_ref is not None:
        from infragent.probes.gil import run_gil

        yield "gil", lambda: run_gil(workload_ref, timeout_s=240)
    yield "bench_reference", lambda: run_bench(candidate, target.reference, target.bench_inputs, budget_s=3.0,
                                               names=("candidate", "reference"))


def trace_calls(candidate: Callable, target: KernelTarget, calls: int = TRACED_CALLS) -> Feedback:
    """A few candidate calls under the tracer: spans redone per call inside a parent that repeats as often, and
    (one more call under the op counter) the arithmetic each span did."""
    case = draw(target.bench_inputs, 0)
    with Recorder() as rec:
        for _ in range(calls):
            with span("call"):
                call(candidate, case)
    rows = repeats(columns_from_trace(rec.trace()), "call")
    loops = redone(rows)
    numbers = {f"{r.name}.per_call": Measure(r.per_call, "per call", n=calls) for r in rows}
    if not rows:
        finding = "the candidate emits no spans: only the roofline's op counts say where its work goes"
    elif loops:
        finding = "; ".join(f"{r.name} runs {r.per_call:g}x per call, each inside {r.parent} ({r.parent_per_call:g}x "
                            f"per call), {r.share:.0%} of call time" for r in loops)
    else:
        finding = "no span repeats inside a repeating parent: " + ", ".join(f"{r.name} {r.per_call:g}x" for r in rows[:5])
    return Feedback("trace", "fail" if loops else "pass", finding, numbers,
                    details={"repeats": [r.__dict__ for r in rows], "redone": [r.name for r in loops],
                             "span_ops": work_by_span(candidate, case)})


def trace_workload(target: KernelTarget, knobs: dict) -> Feedback:
    """The threaded workload under the tracer with thread CPU time, analyzed (overlap, idle, breakdown)."""
    from infragent.probes.analyze import analyze

    run = target.bound_workload(knobs)
    with Recorder(thread_cpu=True) as rec:
        run()
    path = rec.trace().save(artifact_dir() / f"trace-workload-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return analyze(path)
