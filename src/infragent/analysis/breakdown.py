"""Where the time goes: inclusive and exclusive time per span name, category, track or phase; top-N.
GPU time (idle, compute, non-compute) is gpu_time.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infragent.analysis.trace_columns import TraceColumns

PHASES = ("prefill", "decode")


def parents(c: TraceColumns) -> np.ndarray:
    """Row of each event's direct parent on its track (-1 at top level)."""
    parent = np.full(len(c), -1, np.int64)
    rows = np.arange(len(c))
    for d in range(1, int(c.depth.max(initial=0)) + 1):
        child, above = rows[c.depth == d], rows[c.depth == d - 1]
        # the parent is the last shallower row before the child (rows are sorted by track, then start)
        parent[child] = above[np.searchsorted(above, child) - 1]
    return parent


def exclusive(c: TraceColumns, parent: np.ndarray | None = None) -> np.ndarray:
    """Each event's own time: its duration minus its direct children's (ns)."""
    parent = parents(c) if parent is None else parent
    own = (c.end - c.start).astype(np.int64)
    nested = parent >= 0
    np.subtract.at(own, parent[nested], (c.end - c.start)[nested])
    return np.maximum(own, 0)


def phase_of(c: TraceColumns, parent: np.ndarray | None = None) -> np.ndarray:
    """Phase index per event (into PHASES, or len(PHASES) for 'other'): the nearest enclosing prefill/decode."""
    parent = parents(c) if parent is None else parent
    phase = np.full(len(c), len(PHASES), np.int8)
    for k, name in enumerate(PHASES):
        phase[c.where(lambda s, name=name: s == name or s.startswith(name + "."))] = k
    for d in range(1, int(c.depth.max(initial=0)) + 1):
        rows = np.flatnonzero((c.depth == d) & (phase == len(PHASES)))
        phase[rows] = phase[parent[rows]]
    return phase


@dataclass
class Row:
    """One line of a breakdown."""

    key: str
    inclusive_ns: int
    exclusive_ns: int
    count: int
    share: float  # exclusive time / total busy time of the rows' tracks


def breakdown(c: TraceColumns, by: str = "name", top: int | None = None,
              mask: np.ndarray | None = None) -> list[Row]:
    """Inclusive and exclusive time per name, cat, track or phase, largest exclusive first."""
    parent = parents(c)
    own = exclusive(c, parent)
    keys, labels = _keys(c, by, parent)
    mask = np.ones(len(c), bool) if mask is None else mask
    keys, own, dur = keys[mask], own[mask], (c.end - c.start)[mask]
    n = len(labels)
    inclusive = np.bincount(keys, weights=dur * (c.depth[mask] == _outermost_same(c, parent)[mask]), minlength=n)
    mine = np.bincount(keys, weights=own, minlength=n)
    count = np.bincount(keys, minlength=n)
    total = float(own.sum()) or 1.0
    order = np.argsort(-mine, kind="stable")
    rows = [Row(labels[k], int(inclusive[k]), int(mine[k]), int(count[k]), float(mine[k] / total))
            for k in order if count[k]]
    return rows[:top] if top else rows


def _keys(c: TraceColumns, by: str, parent: np.ndarray) -> tuple[np.ndarray, list[str]]:
    if by == "name":
        return c.name, c.names
    if by == "cat":
        return c.cat, c.cats
    if by == "track":
        return c.track, [c.track_label(i) for i in range(len(c.tracks))]
    if by == "phase":
        return phase_of(c, parent).astype(np.int32), [*PHASES, "other"]
    raise ValueError(f"breakdown by {by!r}: choose name, cat, track or phase")


def _outermost_same(c: TraceColumns, parent: np.ndarray) -> np.ndarray:
    """For inclusive time: the depth of each event if no ancestor has its name, else -1 (counted once)."""
    keep = c.depth.astype(np.int32).copy()
    ancestor = parent.copy()
    while (ancestor >= 0).any():
        live = ancestor >= 0
        same = np.zeros(len(c), bool)
        same[live] = c.name[ancestor[live]] == c.name[live]
        keep[same] = -1
        ancestor[live] = parent[ancestor[live]]
    return keep
