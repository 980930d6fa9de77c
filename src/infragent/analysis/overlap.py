"""Overlap, thread-aware: how much of A's time B overlaps (sweep line over merged intervals), which threads
the two run on, an all-pairs matrix for the top categories, and the pairs that never overlapped although
both were busy in the same stretch of time: the timeline signature of a starved thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import kernel_kinds
from infragent.analysis.intervals import intersect, length, merge, overlap_ns
from infragent.analysis.trace_columns import TraceColumns

NEVER_BELOW = 0.01  # "never overlaps": under 1% of the smaller side's busy time (span edges blur a handoff)


@dataclass
class Overlap:
    """B's overlap of A."""

    a: str
    b: str
    a_busy_ns: int
    b_busy_ns: int
    overlap_ns: int
    a_threads: list[str] = field(default_factory=list)
    b_threads: list[str] = field(default_factory=list)
    a_names: list[str] = field(default_factory=list)
    b_names: list[str] = field(default_factory=list)
    interleaved: bool = False  # both busy within one another's active window

    @property
    def share_of_a(self) -> float:
        """Fraction of A's busy time during which B was busy too."""
        return self.overlap_ns / self.a_busy_ns if self.a_busy_ns else 0.0

    @property
    def never(self) -> bool:
        """Both busy in the same stretch of time, yet (almost) never at the same time."""
        smaller = min(self.a_busy_ns, self.b_busy_ns)
        return self.interleaved and smaller > 0 and self.overlap_ns < NEVER_BELOW * smaller


def overlap(c: TraceColumns, a: str | np.ndarray, b: str | np.ndarray, label_a: str = "",
            label_b: str = "") -> Overlap:
    """Overlap of two selections (selectors or masks); A's and B's own nesting is merged away first."""
    ma = c.select(a) if isinstance(a, str) else a
    mb = c.select(b) if isinstance(b, str) else b
    ia, ib = merge(c.start[ma], c.end[ma]), merge(c.start[mb], c.end[mb])
    both = overlap_ns(ia, ib)
    interleaved = bool(ia[0].size and ib[0].size and ia[0][0] < ib[1][-1] and ib[0][0] < ia[1][-1])
    return Overlap(label_a or str(a), label_b or str(b), int((ia[1] - ia[0]).sum()), int((ib[1] - ib[0]).sum()),
                   both, _top(c, ma, "track"), _top(c, mb, "track"), _top(c, ma, "name"), _top(c, mb, "name"),
                   interleaved)


def _top(c: TraceColumns, mask: np.ndarray, what: str, k: int = 3) -> list[str]:
    """The k names (or tracks) holding most of the selection's time."""
    column = c.name if what == "name" else c.track
    if not mask.any():
        return []
    weights = np.bincount(column[mask], weights=(c.end - c.start)[mask])
    order = np.argsort(-weights)[:k]
    return [c.names[i] if what == "name" else c.track_label(i) for i in order if weights[i] > 0]


def matrix(c: TraceColumns, by: str = "cat", top: int = 6) -> tuple[list[str], np.ndarray]:
    """All-pairs overlap share (row's time overlapped by column) for the top categories, threads or names."""
    column, labels = {"cat": (c.cat, c.cats), "name": (c.name, c.names),
                      "track": (c.track, [c.track_label(i) for i in range(len(c.tracks))])}[by]
    top_level = c.depth == 0 if by != "name" else np.ones(len(c), bool)
    busy = np.bincount(column[top_level], weights=(c.end - c.start)[top_level], minlength=len(labels))
    keys = [int(k) for k in np.argsort(-busy)[:top] if busy[k] > 0]
    merged = {k: merge(c.start[column == k], c.end[column == k]) for k in keys}
    share = np.zeros((len(keys), len(keys)))
    for i, ki in enumerate(keys):
        own = float((merged[ki][1] - merged[ki][0]).sum())
        for j, kj in enumerate(keys):
            share[i, j] = overlap_ns(merged[ki], merged[kj]) / own if own else 0.0
    return [labels[k] for k in keys], share


def never_overlapping(c: TraceColumns, top: int = 12, min_share: float = 0.01) -> list[Overlap]:
    """Pairs of span names on different threads, each over min_share of its thread's busy time, both busy in
    the same stretch of time, that (almost) never ran at the same time."""
    busy_by_track = np.bincount(c.track[c.depth == 0], weights=(c.end - c.start)[c.depth == 0],
                                minlength=len(c.tracks))
    pairs = np.unique(np.stack([c.name, c.track], axis=1), axis=0) if len(c) else np.zeros((0, 2), int)
    candidates = []
    for name, track in pairs:
        mask = (c.name == name) & (c.track == track)
        busy = length(c.start[mask], c.end[mask])
        if busy_by_track[track] and busy >= min_share * busy_by_track[track]:
            candidates.append((busy, int(name), int(track), mask))
    candidates = sorted(candidates, key=lambda t: -t[0])[:top]
    found = []
    for i, (_, na, ta, ma) in enumerate(candidates):
        for _, nb, tb, mb in candidates[i + 1:]:
            if ta == tb:
                continue
            result = overlap(c, ma, mb, f"{c.names[na]} @ {c.tracks[ta].name}", f"{c.names[nb]} @ {c.tracks[tb].name}")
            if result.never:
                found.append(result)
    return found


def comm_comp_overlap(c: TraceColumns) -> float:
    """HTA's communication/computation overlap: merged comm time that compute kernels overlap, as a percentage."""
    kinds = kernel_kinds(c)
    comm = merge(c.start[kinds["communication"]], c.end[kinds["communication"]])
    comp = merge(c.start[kinds["computation"]], c.end[kinds["computation"]])
    comm_ns = int((comm[1] - comm[0]).sum())
    if not comm_ns:
        return 0.0
    s, e = intersect(comm, comp)
    return 100.0 * float((e - s).sum()) / comm_ns
