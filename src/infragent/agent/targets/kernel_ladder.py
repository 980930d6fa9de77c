"""The probes a kernel target's baseline can be diagnosed with: check (partitioned when declared), a trace
(the threaded workload's, or a few traced calls), roofline against the reference, the GIL probe (workload
only) and the bench against the reference. Each is one probe run and one Feedback; the diagnosis chooses
which run (agent/diagnosis.py).
"""
from __future__ import annotations

import time
from typing import Callable

from infragent.agent.targets.kernel_code import KernelCode
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


def kernel_probes(target: KernelCode, knobs: dict, workload_ref: str | None) -> dict[str, Callable[[], Feedback]]:
    """The baseline's probes by name; workload_ref is 'path/FILE.py:function' for the GIL child."""
    candidate = target.bind(knobs)
    probes: dict[str, Callable[[], Feedback]] = {
        "check": lambda: run_check(candidate, target.reference, target.inputs, target.target.partition, trials=12,
                                   rtol=target.target.rtol),
        "trace": (lambda: trace_workload(target, knobs)) if target.workload is not None else
                 (lambda: trace_calls(candidate, target)),
        "roofline": lambda: run_roofline(candidate, target.bench_inputs, target.reference, quick_peaks=True),
        "bench_reference": lambda: run_bench(candidate, target.reference, target.bench_inputs, budget_s=3.0,
                                             names=("candidate", "reference")),
    }
    if workload_ref is not None:
        from infragent.probes.gil import run_gil

        probes["gil"] = lambda: run_gil(workload_ref, timeout_s=240)
    return probes


def trace_calls(candidate: Callable, target: KernelCode, calls: int = TRACED_CALLS) -> Feedback:
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
    suggest = ["roofline against the reference (is the repeated work redundant?)"] if loops or not rows else []
    return Feedback("trace", "fail" if loops else "pass", finding, numbers, next_probes=suggest,
                    details={"repeats": [r.__dict__ for r in rows], "redone": [r.name for r in loops],
                             "span_ops": work_by_span(candidate, case)})


def trace_workload(target: KernelCode, knobs: dict) -> Feedback:
    """The threaded workload under the tracer with thread CPU time, analyzed (overlap, idle, breakdown)."""
    from infragent.probes.analyze import analyze

    run = target.bound_workload(knobs)
    with Recorder(thread_cpu=True) as rec:
        run()
    path = rec.trace().save(artifact_dir() / f"trace-workload-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return analyze(path)
