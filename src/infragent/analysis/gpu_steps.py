"""Steps of a GPU trace, and the GPU work each step launched.

A step is a `ProfilerStep#N` range when the profiler wrote them, else a top-level `record_function` range that
repeats on the host (`forward_step` ×6, `eager` ×10 then `graphed` ×10). GPU work belongs to the step whose host
range holds the call that launched it (as HTA assigns iterations), so a kernel that runs after its step's
range closed on the host is still that step's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from infragent.analysis.kineto import Launches, category_mask
from infragent.analysis.trace_columns import TraceColumns

PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


@dataclass
class Step:
    """One step: its host range, and its GPU work rows."""

    index: int
    name: str
    start_ns: int  # host range
    end_ns: int
    work: np.ndarray  # rows of GPU work it launched


def step_ranges(c: TraceColumns) -> list[tuple[str, int, int]]:
    """(name, start, end) of each step on the host, in time order; empty when the trace has no repeated ranges."""
    annotations = category_mask(c, frozenset({"user_annotation", "cpu_instant_event"})) & (c.depth == 0)
    threads = np.asarray([t.kind == "thread" for t in c.tracks] or [False])
    rows = np.flatnonzero(annotations & threads[c.track]) if len(c) else np.zeros(0, np.int64)
    profiler = [r for r in rows.tolist() if PROFILER_STEP.match(c.names[c.name[r]])]
    if len(profiler) >= 1:
        picked = profiler
    else:
        names, counts = np.unique(c.name[rows], return_counts=True)
        repeated = set(names[counts >= 2].tolist())
        picked = [r for r in rows.tolist() if int(c.name[r]) in repeated]
        if picked:  # the steps of the one thread that has most of them
            tracks, per = np.unique(c.track[picked], return_counts=True)
            main = int(tracks[np.argmax(per)])
            picked = [r for r in picked if int(c.track[r]) == main]
    picked.sort(key=lambda r: int(c.start[r]))
    return [(c.names[c.name[r]], int(c.start[r]), int(c.end[r])) for r in picked]


def steps(c: TraceColumns, work: np.ndarray, launched: Launches) -> list[Step]:
    """The steps with the GPU work each launched (by its launch call's host time)."""
    ranges = step_ranges(c)
    if not ranges:
        return []
    starts = np.asarray([s for _, s, _ in ranges], np.int64)
    ends = np.asarray([e for _, _, e in ranges], np.int64)
    rows = np.flatnonzero(launched.launched(work))
    when = c.start[launched.launch[rows]]
    at = np.searchsorted(starts, when, side="right") - 1
    inside = (at >= 0) & (when < ends[np.maximum(at, 0)])
    return [Step(i, name, int(starts[i]), int(ends[i]), rows[inside & (at == i)])
            for i, (name, _, _) in enumerate(ranges)]
