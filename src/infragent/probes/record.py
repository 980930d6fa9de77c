"""The record probe: run a workload with the span recorder on and keep the Chrome trace as evidence."""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from infragent.probes.budget import Deadline, over_budget
from infragent.probes.feedback import Evidence, Feedback, Measure
from infragent.trace import Recorder
from infragent.trace_model import Trace


def span_totals(trace: Trace) -> list[tuple[str, int, int]]:
    """(name, count, total ns) per span name, largest total first (nested spans count in their parents too)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in trace.spans:
        totals[s.name][0] += 1
        totals[s.name][1] += s.dur_ns
    return sorted(((name, c, ns) for name, (c, ns) in totals.items()), key=lambda row: -row[2])


def run_record(workload: Callable[[], Any], output: str | Path = "trace.json", top: int = 8,
               budget_s: float | None = 120.0) -> Feedback:
    """Call workload() once under a Recorder (with thread CPU time) and write the trace to output; a workload
    still running at budget_s is stopped, and the spans it closed so far are the (inconclusive) answer."""
    with Recorder(thread_cpu=True) as recorder:
        start = time.perf_counter_ns()
        with Deadline(budget_s) as deadline:
            workload()
        wall_ns = time.perf_counter_ns() - start
    feedback = _attribute(recorder.trace(), output, wall_ns, top)
    if deadline.stopped:
        return over_budget(feedback, budget_s or 0.0, deadline.elapsed_s, "the spans closed until then")
    return feedback


def _attribute(trace: Trace, output: str | Path, wall_ns: int, top: int) -> Feedback:
    path = trace.save(output)
    rows = span_totals(trace)
    if not trace.spans:
        return Feedback("record", "inconclusive", "the workload emitted no spans (is it instrumented with trace.span?)",
                        numbers={"wall_ms": Measure(wall_ns / 1e6, "ms")},
                        evidence=[Evidence.of(path, "Chrome trace (open in ui.perfetto.dev)")],
                        next_probes=["wrap the suspect code in `with span(...)` and record again"])
    top_rows = rows[:top]
    finding = "most time in " + ", ".join(f"{name} ({ns / wall_ns:.0%})" for name, _, ns in top_rows[:3])
    return Feedback(
        "record", "pass", finding,
        numbers={"wall_ms": Measure(wall_ns / 1e6, "ms"), "spans": Measure(len(trace.spans)),
                 "threads": Measure(len(trace.threads))},
        locality={"threads": ", ".join(sorted(set(trace.threads.values())))},
        evidence=[Evidence.of(path, "Chrome trace (open in ui.perfetto.dev)")],
        next_probes=["infragent gil WORKLOAD (if several threads share the work)",
                     "infragent roofline FN --inputs FACTORY (for the top span's kernel)"],
        details={"span_totals": [{"name": n, "count": c, "total_ms": ns / 1e6, "share_of_wall": ns / wall_ns}
                                 for n, c, ns in rows]})
