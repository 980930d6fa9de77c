"""Interval arithmetic on numpy arrays: merge, total length, intersection by sweep line, gaps.

Intervals are half-open [start, end) in integer ns. Merging joins intervals that overlap or touch, as HTA
does (a kernel starting exactly when the previous one ends continues the same busy period).
"""
from __future__ import annotations

import numpy as np


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint, non-touching intervals."""
    if start.size == 0:
        return start.astype(np.int64), end.astype(np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > reach[:-1]
    group_start = np.flatnonzero(new)
    group_end = np.append(group_start[1:], s.size) - 1
    return s[group_start], reach[group_end]


def length(start: np.ndarray, end: np.ndarray) -> int:
    """Total time covered by the union of the intervals."""
    s, e = merge(start, end)
    return int((e - s).sum())


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two merged interval sets (sweep line over both sorted boundary lists)."""
    (sa, ea), (sb, eb) = a, b
    if sa.size == 0 or sb.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    times = np.concatenate([sa, ea, sb, eb])
    deltas = np.concatenate([np.ones(sa.size, np.int8), -np.ones(ea.size, np.int8),
                             2 * np.ones(sb.size, np.int8), -2 * np.ones(eb.size, np.int8)])
    order = np.lexsort((deltas, times))  # at equal times ends (negative) come first: touching is not overlap
    times, running = times[order], np.cumsum(deltas[order])
    both = np.flatnonzero(running[:-1] == 3)
    keep = times[both + 1] > times[both]
    return times[both][keep], times[both + 1][keep]


def overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Time during which both merged interval sets are busy."""
    s, e = intersect(a, b)
    return int((e - s).sum())


def gaps(start: np.ndarray, end: np.ndarray, lo: int | None = None,
         hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Idle intervals between the merged intervals (and from lo / to hi when given)."""
    s, e = merge(start, end)
    gap_start, gap_end = e[:-1], s[1:]
    if lo is not None and (s.size == 0 or s[0] > lo):
        gap_start, gap_end = np.append(lo, gap_start), np.append(s[0] if s.size else hi, gap_end)
    if hi is not None and s.size and e[-1] < hi:
        gap_start, gap_end = np.append(gap_start, e[-1]), np.append(gap_end, hi)
    return gap_start.astype(np.int64), gap_end.astype(np.int64)


def covered(start: np.ndarray, end: np.ndarray, busy: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For each interval [start_i, end_i), how much of it the merged intervals busy cover (prefix sums)."""
    bs, be = busy
    if bs.size == 0:
        return np.zeros(start.size, np.int64)
    before = np.concatenate([[0], np.cumsum(be - bs)])  # busy time before each busy interval starts

    def upto(t: np.ndarray) -> np.ndarray:  # busy time in (-inf, t)
        i = np.searchsorted(bs, t, side="right") - 1
        inside = np.clip(t - bs[np.maximum(i, 0)], 0, (be - bs)[np.maximum(i, 0)])
        return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)

    return upto(end) - upto(start)
