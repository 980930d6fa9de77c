"""Idle time per thread and stream, each gap classified.

A gap is time between a track's merged top-level events, inside the track's own active window. Its class:
- "gil": GIL samples (events of category `gil` on that thread, such as `gil.wait`) cover most of it;
- "lock/queue": it ends right after an event on another thread ended (a hand-off: a queue put, a lock
  release, a future set), and that event is named;
- "idle": neither (the host had nothing to do, or waited on something the trace does not show).

Each gap also has its neighbours: the top-level event that ended where it starts and the one that starts
where it ends. Gaps that recur between the same two spans (every engine step, say) are code between them that
no span names, or a wait there: `between` ranks those pairs by the time in them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import breakdown
from infragent.analysis.intervals import gaps, intersect, merge
from infragent.analysis.trace_columns import TraceColumns

HANDOFF_NS = 500_000  # a wake-up within 500 µs of another thread's event ending counts as that hand-off (a woken
# thread still has to get the GIL and a core back, which takes hundreds of µs on a busy machine)
GIL_COVER = 0.5
NO_SPAN = "(no span)"  # time on a thread between its top-level spans
RECURRING_SHARE = 0.5  # of a track's idle time: one pair of neighbouring spans holding this much recurs


@dataclass
class Gap:
    """One idle interval on a track."""

    track: str
    start_ns: int
    end_ns: int
    kind: str  # gil | lock/queue | idle
    cause: str = ""  # for lock/queue: the event on the other thread whose end woke this one

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Between:
    """Gaps that sit between the same two top-level spans on a track."""

    before: str  # the span that ended where the gaps start
    after: str  # the span that starts where they end
    gaps: int
    idle_ns: int
    median_ns: int


@dataclass
class TrackIdle:
    """Idle summary of one track."""

    track: str
    kind: str  # thread | stream
    active_ns: int  # first start to last end
    idle_ns: int
    by_kind: dict[str, int] = field(default_factory=dict)
    largest: list[Gap] = field(default_factory=list)
    between: list[Between] = field(default_factory=list)

    @property
    def idle_share(self) -> float:
        """Idle fraction of the active window."""
        return self.idle_ns / self.active_ns if self.active_ns else 0.0


def idle(c: TraceColumns, min_gap_ns: int = 1_000, keep: int = 5) -> list[TrackIdle]:
    """Per-track idle time with every gap of at least min_gap_ns classified; largest idle share first."""
    top = c.depth == 0
    gil = c.select("cat:gil")
    other_ends = _ends_by_track(c, ~gil)  # any depth: a hand-off happens at the end of a nested span too
    result = []
    for t, track in enumerate(c.tracks):
        mine = (c.track == t) & top & ~gil
        if not mine.any():
            continue
        lo, hi = int(c.start[mine].min()), int(c.end[mine].max())
        gs, ge = gaps(c.start[mine], c.end[mine])
        wide = (ge - gs) >= min_gap_ns
        gs, ge = gs[wide], ge[wide]
        kinds = np.full(gs.size, "idle", dtype=object)
        causes = np.full(gs.size, "", dtype=object)
        if track.kind == "thread":
            _classify_gil(c, gil & (c.track == t), gs, ge, kinds)
            _classify_handoff(c, t, other_ends, gs, ge, kinds, causes)
        label = c.track_label(t)
        by_kind = {k: int((ge - gs)[kinds == k].sum()) for k in ("gil", "lock/queue", "idle") if (kinds == k).any()}
        order = np.argsort(-(ge - gs))[:keep]
        largest = [Gap(label, int(gs[i]), int(ge[i]), str(kinds[i]), str(causes[i])) for i in order]
        result.append(TrackIdle(label, track.kind, hi - lo, int((ge - gs).sum()), by_kind, largest,
                                _between(c, mine, gs, ge)))
    return sorted(result, key=lambda r: -r.idle_share)


def recurring(track: TrackIdle) -> Between | None:
    """The pair of neighbouring spans whose gaps hold RECURRING_SHARE of the track's idle time, in at least
    three gaps; None when no pair does."""
    top = track.between[0] if track.between else None
    return top if top is not None and top.gaps >= 3 and top.idle_ns >= RECURRING_SHARE * track.idle_ns > 0 else None


def pair_words(before: str, after: str) -> str:
    """"between 'step' and the next 'step'" or "between 'a' and 'b'"."""
    return f"between {before!r} and " + (f"the next {after!r}" if after == before else repr(after))


def own_time(c: TraceColumns) -> dict[str, int]:
    """Exclusive ns per span name, and NO_SPAN: the threads' gaps between their top-level spans."""
    own = {row.key: row.exclusive_ns for row in breakdown(c)}
    own[NO_SPAN] = sum(t.idle_ns for t in idle(c) if t.kind == "thread")
    return own


def _between(c: TraceColumns, mine: np.ndarray, gs: np.ndarray, ge: np.ndarray, keep: int = 3) -> list[Between]:
    """The (span before, span after) pairs of a track's gaps, most idle time first."""
    if not gs.size:
        return []
    rows = np.flatnonzero(mine)
    by_end = rows[np.argsort(c.end[rows], kind="stable")]
    by_start = rows[np.argsort(c.start[rows], kind="stable")]
    before = by_end[np.clip(np.searchsorted(c.end[by_end], gs, side="right") - 1, 0, rows.size - 1)]
    after = by_start[np.clip(np.searchsorted(c.start[by_start], ge, side="left"), 0, rows.size - 1)]
    pairs: dict[tuple[int, int], list[int]] = {}
    for b, a, dur in zip(c.name[before], c.name[after], ge - gs):
        pairs.setdefault((int(b), int(a)), []).append(int(dur))
    found = [Between(c.names[b], c.names[a], len(d), sum(d), int(np.median(d))) for (b, a), d in pairs.items()]
    return sorted(found, key=lambda x: -x.idle_ns)[:keep]


def _classify_gil(c: TraceColumns, gil: np.ndarray, gs: np.ndarray, ge: np.ndarray, kinds: np.ndarray) -> None:
    if not gil.any() or not gs.size:
        return
    samples = merge(c.start[gil], c.end[gil])
    s, e = intersect((gs, ge), samples)
    covered = np.zeros(gs.size)
    np.add.at(covered, np.searchsorted(gs, s, side="right") - 1, e - s)
    kinds[covered >= GIL_COVER * (ge - gs)] = "gil"


def _ends_by_track(c: TraceColumns, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(end time, row, track) of every selected event on a thread track, sorted by end time."""
    threads = np.asarray([t.kind == "thread" for t in c.tracks] or [False])
    rows = np.flatnonzero(mask & threads[c.track])
    order = np.argsort(c.end[rows], kind="stable")
    rows = rows[order]
    return c.end[rows], rows, c.track[rows]


def _classify_handoff(c: TraceColumns, t: int, ends: tuple[np.ndarray, np.ndarray, np.ndarray], gs: np.ndarray,
                      ge: np.ndarray, kinds: np.ndarray, causes: np.ndarray) -> None:
    end_ts, rows, tracks = ends
    for i in np.flatnonzero(kinds == "idle"):
        lo = np.searchsorted(end_ts, max(ge[i] - HANDOFF_NS, gs[i]), side="left")
        hi = np.searchsorted(end_ts, ge[i], side="right")
        others = [r for r, tr in zip(rows[lo:hi], tracks[lo:hi]) if tr != t]
        if others:
            row = others[-1]
            kinds[i] = "lock/queue"
            causes[i] = f"{c.names[c.name[row]]} on {c.tracks[c.track[row]].name}"
