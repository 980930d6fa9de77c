"""How often each span runs per call of a root span, and inside which parent: the shape of work that
is redone (a normalization inside every tile of a loop shows up as N per call under a span also N per call).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infragent.analysis.breakdown import parents
from infragent.analysis.trace_columns import TraceColumns


@dataclass
class Repeat:
    """One span name's count per root call."""

    name: str
    per_call: float
    parent: str | None  # the name of its most frequent direct parent
    parent_per_call: float | None
    share: float  # its inclusive time as a share of the root spans' time


def repeats(c: TraceColumns, root: str) -> list[Repeat]:
    """Per span name under `root`: occurrences per root span, the usual parent and its rate; most frequent first."""
    root_id = c.names.index(root) if root in c.names else -1
    calls = int((c.name == root_id).sum())
    if calls == 0:
        return []
    parent = parents(c)
    root_time = float(c.dur[c.name == root_id].sum())
    counts = np.bincount(c.name, minlength=len(c.names))
    time = np.bincount(c.name, weights=c.dur.astype(np.float64), minlength=len(c.names))
    rows = []
    for name_id in np.flatnonzero(counts):
        if name_id == root_id:
            continue
        mine = np.flatnonzero(c.name == name_id)
        above = parent[mine]
        above = above[above >= 0]
        usual = int(np.bincount(c.name[above]).argmax()) if above.size else None
        rows.append(Repeat(c.names[name_id], counts[name_id] / calls, c.names[usual] if usual is not None else None,
                           counts[usual] / calls if usual is not None else None,
                           float(time[name_id]) / root_time if root_time else 0.0))
    return sorted(rows, key=lambda r: (-r.per_call, r.name))


def redone(rows: list[Repeat]) -> list[Repeat]:
    """Spans that run more than once per call inside a parent that itself runs as often (work per iteration)."""
    return [r for r in rows if r.per_call > 1 and r.parent_per_call is not None
            and abs(r.parent_per_call - r.per_call) < 1e-9 and r.parent is not None]
