"""Critical path: the chain of events that set the end time, walked backwards by last-arriving dependency.

From the event that ends last, each step goes to whichever predecessor finished latest: the previous event
on the same track (at the same or a shallower depth), or the source of a flow arrow into the event (a
kernel's launch). With no flows in the trace this is the longest chain on the track that finished last,
step by step. Time on the path is attributed to event names and tracks; waits between a predecessor's end
and the next start are attributed to the track that waited.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import exclusive
from infragent.analysis.trace_columns import TraceColumns

MAX_STEPS = 500_000


@dataclass
class CriticalPath:
    """The path (rows, latest first), its length and where its time went."""

    rows: list[int]
    total_ns: int
    by_name: dict[str, int] = field(default_factory=dict)
    by_track: dict[str, int] = field(default_factory=dict)
    wait_ns: int = 0
    used_flows: int = 0
    truncated: bool = False


def critical_path(c: TraceColumns, window: tuple[int, int] | None = None, top_level_only: bool = True) -> CriticalPath:
    """The critical path of the trace (or of the events inside window = (start, end) ns)."""
    inside = np.ones(len(c), bool) if window is None else (c.start >= window[0]) & (c.end <= window[1])
    eligible = inside & ((c.depth == 0) if top_level_only else True)
    has_flow_in = np.zeros(len(c), np.int64) - 1
    if c.flows.size:
        has_flow_in[c.flows[:, 1]] = c.flows[:, 0]
        eligible |= inside & (has_flow_in >= 0)  # kernels and their launches join the path whatever their depth
        eligible[c.flows[:, 0][inside[c.flows[:, 0]]]] = True
    rows = np.flatnonzero(eligible)
    if not rows.size:
        return CriticalPath([], 0)
    by_track = {t: rows[c.track[rows] == t] for t in np.unique(c.track[rows]).tolist()}
    ends_by_track = {t: np.maximum.accumulate(c.end[r]) for t, r in by_track.items()}
    current = int(rows[np.argmax(c.end[rows])])
    first = int(c.start[rows].min())
    path, by_name, by_track_ns = [current], defaultdict(int), defaultdict(int)
    wait = used = 0
    truncated = False
    while len(path) < MAX_STEPS:
        s = int(c.start[current])
        pred = _previous_on_track(c, by_track, ends_by_track, current, s)
        flow_src = int(has_flow_in[current])
        if flow_src >= 0 and eligible[flow_src] and (pred < 0 or c.end[flow_src] > c.end[pred]):
            pred, used = flow_src, used + 1
        segment_start = max(s, int(c.end[pred])) if pred >= 0 else s
        by_name[c.names[c.name[current]]] += int(c.end[current]) - segment_start
        by_track_ns[c.track_label(int(c.track[current]))] += int(c.end[current]) - segment_start
        if pred < 0:
            break
        gap = s - int(c.end[pred])
        if gap > 0:
            wait += gap
            by_track_ns[c.track_label(int(c.track[current]))] += gap
        path.append(pred)
        current = pred
    else:
        truncated = True
    total = int(c.end[path[0]]) - (first if not truncated else int(c.start[path[-1]]))
    if top_level_only:
        by_name = _own_time_inside(c, path)
    return CriticalPath(path, total, dict(sorted(by_name.items(), key=lambda kv: -kv[1])),
                        dict(sorted(by_track_ns.items(), key=lambda kv: -kv[1])), wait, used, truncated)


def _own_time_inside(c: TraceColumns, path: list[int]) -> dict[str, int]:
    """Critical-path time by span name, descending into each path event: its descendants' own time."""
    own = exclusive(c)
    totals: dict[str, int] = defaultdict(int)
    for row in path:
        if c.depth[row] != 0:  # a flow endpoint below the top level: counted as itself
            totals[c.names[c.name[row]]] += int(own[row])
            continue
        lo, hi = np.searchsorted(c.track, [c.track[row], c.track[row] + 1])
        first = lo + int(np.searchsorted(c.start[lo:hi], c.start[row], side="left"))
        last = lo + int(np.searchsorted(c.start[lo:hi], c.end[row], side="left"))
        inside = np.arange(first, last)
        inside = inside[c.end[inside] <= c.end[row]]
        weights = np.bincount(c.name[inside], weights=own[inside])
        for name_id in np.flatnonzero(weights):
            totals[c.names[name_id]] += int(weights[name_id])
    return totals


def _previous_on_track(c: TraceColumns, by_track: dict[int, np.ndarray], ends: dict[int, np.ndarray],
                       row: int, start: int) -> int:
    """The latest-ending eligible event on row's track that ended by start (-1 if none)."""
    rows = by_track[int(c.track[row])]
    k = int(np.searchsorted(rows, row)) - 1  # rows before this one on the track (sorted by start)
    if k < 0:
        return -1
    running = ends[int(c.track[row])]
    # the running max of ends is sorted: find the last predecessor whose end is <= start
    j = int(np.searchsorted(running[:k + 1], start, side="right")) - 1
    if j < 0:
        return -1
    best = j
    target = running[j]
    while c.end[rows[best]] != target:  # the row that set this running maximum
        best -= 1
    return int(rows[best])
