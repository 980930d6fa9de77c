"""Overlap, thread-aware: how much of A's time B overlaps (sweep line over merged intervals), which threads
the two run on, an all-pairs matrix for the top categories, and the pairs that never overlapped although
both were busy in the same stretch of time: the timeline signature of a starved thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import parents
from infragent.analysis.intervals import covered, length, merge, overlap_ns
from infragent.analysis.trace_columns import TraceColumns

NEVER_BELOW = 0.01  # "never overlaps": under 1% of the smaller side's busy time (span edges blur a handoff)
# From CPU times the bound is looser: a span's GIL waits may sit at its start, not only at its end, and a
# loaded machine puts more of them there; 0.4% (idle) to 1.1% (loaded) measured with the GIL held, 33% released.
NEVER_BELOW_EXECUTING = 0.05


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
    executing_overlap_ns: int | None = None  # time A must have run while B ran (from thread CPU times)

    @property
    def share_of_a(self) -> float:
        """Fraction of A's busy time during which B was busy too."""
        return self.overlap_ns / self.a_busy_ns if self.a_busy_ns else 0.0

    @property
    def executing_share_of_a(self) -> float | None:
        """Fraction of A's busy time during which A was on CPU and B busy (None without CPU times)."""
        if self.executing_overlap_ns is None or not self.a_busy_ns:
            return None
        return self.executing_overlap_ns / self.a_busy_ns

    @property
    def never(self) -> bool:
        """Both busy in the same stretch of time, yet (almost) never at the same time.

        With thread CPU times, "at the same time" means A executing while B is busy: a span of A that was
        waiting (say for the GIL) through B's interval does not count as overlapping it.
        """
        smaller = min(self.a_busy_ns, self.b_busy_ns)
        if self.executing_overlap_ns is None:
            return self.interleaved and smaller > 0 and self.overlap_ns < NEVER_BELOW * smaller
        return self.interleaved and smaller > 0 and self.executing_overlap_ns < NEVER_BELOW_EXECUTING * smaller


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
                   interleaved, _executing(c, ma, mb))


def _executing(c: TraceColumns, ma: np.ndarray, mb: np.ndarray) -> int | None:
    """The overlap A's execution must have had with B's: per A event, max(0, CPU time - wall time outside B).

    An event that ran cpu ns inside a wall window of which only w ns lay outside B ran at least cpu - w ns
    while B was busy, wherever inside the window it ran. B's events are cut to [start, start + CPU time]:
    a thread computes first and may then wait (a native call holding the GIL runs to its end, then the
    thread waits to get the GIL back while another runs, before its span closes). A span that waited for the
    GIL through B's interval therefore adds nothing, and one that ran inside B adds its CPU time. Without
    recorded CPU times, or when A's spans have children, there is no executing overlap (None). Ask it from the side of the thread that
    waited (A): its spans need not compute first.
    """
    outer_a = ma & (c.depth == _min_depth_per_row(c, ma))
    outer_b = mb & (c.depth == _min_depth_per_row(c, mb))
    leaves = _leaves(c)
    if not leaves[outer_a].all():  # a parent's CPU time is its children's too: no bound from it
        return None
    cpu_a, cpu_b = c.cpu_ns(outer_a), c.cpu_ns(outer_b)
    if not cpu_a.size or (cpu_a < 0).all():
        return None
    start_b, end_b = c.start[outer_b], c.end[outer_b]
    leaf_b = leaves[outer_b]  # only leaves are cut: a span with children waits wherever they do
    end_b = np.where((cpu_b >= 0) & leaf_b, np.minimum(end_b, start_b + np.maximum(cpu_b, 0)), end_b)
    start_a, end_a = c.start[outer_a], c.end[outer_a]
    inside = covered(start_a, end_a, merge(start_b, end_b))
    ran = np.where(cpu_a >= 0, np.minimum(cpu_a, end_a - start_a), end_a - start_a)
    return int(np.maximum(ran - (end_a - start_a - inside), 0).sum())


def _leaves(c: TraceColumns) -> np.ndarray:
    """Mask of events with no child events."""
    parent = parents(c)
    leaf = np.ones(len(c), bool)
    leaf[parent[parent >= 0]] = False
    return leaf


def cpu_share(c: TraceColumns, mask: np.ndarray) -> float | None:
    """CPU time / wall time of the selected outermost events (None without CPU times)."""
    outer = mask & (c.depth == _min_depth_per_row(c, mask))
    cpu = c.cpu_ns(outer)
    known = cpu >= 0
    if not known.any():
        return None
    return float(cpu[known].sum() / max(int((c.end - c.start)[outer][known].sum()), 1))


def _min_depth_per_row(c: TraceColumns, mask: np.ndarray) -> np.ndarray:
    """Per row, the smallest depth among the selected events on its track (their outermost level)."""
    shallowest = np.full(len(c.tracks), np.iinfo(np.int16).max, np.int64)
    np.minimum.at(shallowest, c.track[mask], c.depth[mask])
    return shallowest[c.track]


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


def never_overlapping(c: TraceColumns, top: int = 12, min_share: float = 0.01,
                      min_thread_share: float = 1e-4) -> list[Overlap]:
    """Pairs of span names on different threads of one process, each over min_share of its own thread's busy time,
    both busy in the same stretch of time, that (almost) never ran at the same time. GPU streams take no part.

    A starved thread may be tiny next to the busiest one (a KV transfer of a few ms beside seconds of GEMM),
    so names are taken per thread, round robin: each thread's largest name first, then each one's second,
    up to top names. Only threads idler than min_thread_share of the busiest are left out.
    """
    if not len(c):
        return []
    threads = np.asarray([t.kind == "thread" for t in c.tracks])
    busy_by_track = np.bincount(c.track[c.depth == 0], weights=(c.end - c.start)[c.depth == 0],
                                minlength=len(c.tracks)) * threads  # GPU streams have no GIL to starve on
    pairs, inverse = np.unique(np.stack([c.name, c.track], axis=1), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    summed = np.bincount(inverse, weights=c.end - c.start, minlength=len(pairs))  # >= busy time
    ranked = []  # (rank within its thread, -summed, pair)
    for track in np.flatnonzero((busy_by_track > 0) &
                                (busy_by_track >= min_thread_share * busy_by_track.max())).tolist():
        on_track = np.flatnonzero(pairs[:, 1] == track)
        on_track = on_track[np.argsort(-summed[on_track])]
        ranked += [(rank, -summed[k], int(k)) for rank, k in enumerate(on_track.tolist())
                   if summed[k] >= min_share * busy_by_track[track]]
    candidates = []
    for _, _, k in sorted(ranked):
        if len(candidates) == top:
            break
        name, track = int(pairs[k][0]), int(pairs[k][1])
        mask = inverse == k
        busy = length(c.start[mask], c.end[mask])
        if busy >= min_share * busy_by_track[track]:
            candidates.append((busy, name, track, mask))
    found = []
    for i, (_, na, ta, ma) in enumerate(candidates):
        for _, nb, tb, mb in candidates[i + 1:]:
            if ta == tb or c.tracks[ta].pid != c.tracks[tb].pid:  # one GIL per process
                continue
            first, second = ((ma, na, ta), (mb, nb, tb))
            share_a, share_b = cpu_share(c, ma), cpu_share(c, mb)
            if share_a is not None and share_b is not None and share_b < share_a:
                first, second = second, first  # ask from the side that waited more
            (m1, n1, t1), (m2, n2, t2) = first, second
            result = overlap(c, m1, m2, f"{c.names[n1]} @ {c.tracks[t1].name}", f"{c.names[n2]} @ {c.tracks[t2].name}")
            if result.never:
                found.append(result)
    return found
