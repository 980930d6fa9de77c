"""Which span did which arithmetic: one call run under the tracer and the op counter at once, each op
attributed to the innermost span open when it ran. Ties the roofline's per-op FLOPs to the code's spans.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np

from infragent.analysis.trace_load import columns_from_trace
from infragent.probes.inputs import Case
from infragent.probes.work import count_work
from infragent.trace import Recorder, span

ROOT = "call"


def work_by_span(fn: Callable[..., Any], case: Case) -> dict[str, dict[str, list[Any]]]:
    """span name -> op -> [calls, FLOPs, output dtype] for one call of fn (ops outside inner spans: 'call')."""
    timeline: list[tuple[int, str, float, str]] = []

    def traced() -> None:
        with span(ROOT):
            fn(*case.args, **case.kwargs)

    with Recorder() as rec:
        count_work(lambda: traced(), Case(), timeline)
    c = columns_from_trace(rec.trace())
    out: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0, ""]))
    for t, op, flops, dtype in timeline:
        inside = np.flatnonzero((c.start <= t) & (c.end >= t))
        name = c.names[c.name[inside[np.argmax(c.depth[inside])]]] if inside.size else ROOT
        row = out[name][op]
        row[0] += 1
        row[1] += float(flops)
        row[2] = row[2] if row[2] in ("", dtype) else "mixed"
        row[2] = row[2] or dtype
    return {name: dict(ops) for name, ops in out.items()}
