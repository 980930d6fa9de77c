"""Traces in columnar form: one numpy array per field, names and categories interned, events on tracks.

A track is one timeline: a CPU thread (pid, tid) or a GPU stream (Kineto puts a stream's kernels on
pid = device, tid = stream). Events are intervals [start_ns, end_ns) with a name, a category, a track and a
nesting depth on that track; instants have start == end. Flows link a source event to a destination event
(Kineto's launch → kernel arrows). Selectors pick events by name glob, `cat:NAME` or `thread:NAME`.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infragent.trace_model import CPU_NS_KEY

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})  # what makes a stream
# track; which of its events are GPU work is kineto.py's device_work


@dataclass(frozen=True)
class Track:
    """One timeline: a thread, or a GPU stream."""

    pid: int
    tid: int
    name: str
    kind: str  # "thread" | "stream"


@dataclass
class TraceColumns:
    """A whole trace as parallel arrays (sorted by track, then start, then longest first)."""

    names: list[str]
    cats: list[str]
    tracks: list[Track]
    name: np.ndarray  # int32 index into names
    cat: np.ndarray  # int32 index into cats
    track: np.ndarray  # int32 index into tracks
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    depth: np.ndarray = field(default=None)  # type: ignore[assignment]  # int16 nesting level on its track
    args: list[Any] | None = None  # per event: decoded dict, raw JSON (msgspec.Raw) or None
    flows: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # (src, dst) event rows
    counters: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # name -> (ts_ns, value)
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if self.depth is None:
            self.depth = nesting_depth(self.track, self.start, self.end)

    def __len__(self) -> int:
        return int(self.start.size)

    @property
    def dur(self) -> np.ndarray:
        """Durations in ns."""
        return self.end - self.start

    def window(self) -> tuple[int, int]:
        """(first start, last end) over all events, in ns."""
        if not len(self):
            return 0, 0
        return int(self.start.min()), int(self.end.max())

    def track_label(self, index: int) -> str:
        """A readable track name: the thread or stream name, with its ids."""
        t = self.tracks[index]
        return f"{t.name} (pid {t.pid}, {'stream' if t.kind == 'stream' else 'tid'} {t.tid})"

    def select(self, selector: str) -> np.ndarray:
        """Boolean mask of the events a selector picks: a name or glob, `cat:NAME` or `thread:NAME` (globs allowed)."""
        kind, _, pattern = selector.partition(":") if selector.startswith(("cat:", "thread:", "stream:")) \
            else ("name", "", selector)
        if kind == "name":
            return np.isin(self.name, _matching(self.names, pattern))
        if kind == "cat":
            return np.isin(self.cat, _matching(self.cats, pattern))
        labels = [t.name for t in self.tracks]
        ids = [i for i, t in enumerate(self.tracks) if fnmatch.fnmatchcase(labels[i], pattern)
               or fnmatch.fnmatchcase(str(t.tid), pattern)]
        return np.isin(self.track, np.asarray(ids, np.int32))

    def where(self, predicate: Callable[[str], bool], on: str = "name") -> np.ndarray:
        """Boolean mask of events whose name (or category) satisfies predicate (evaluated once per distinct string)."""
        table, column = (self.names, self.name) if on == "name" else (self.cats, self.cat)
        return np.isin(column, np.asarray([i for i, s in enumerate(table) if predicate(s)], np.int32))

    def cpu_ns(self, mask: np.ndarray) -> np.ndarray:
        """Thread CPU time inside each selected event (from the recorder's cpu_ns arg); -1 where unknown."""
        rows = np.flatnonzero(mask)
        if self.args is None:
            return np.full(rows.size, -1, np.int64)
        return np.asarray([self.attrs(r).get(CPU_NS_KEY, -1) for r in rows.tolist()], np.int64)

    def attrs(self, row: int) -> dict[str, Any]:
        """The args of one event, decoded (empty when the trace kept none)."""
        if self.args is None or self.args[row] is None:
            return {}
        value = self.args[row]
        if isinstance(value, dict):
            return value
        import msgspec

        decoded = msgspec.json.decode(value)
        return decoded if isinstance(decoded, dict) else {}


def _matching(table: list[str], pattern: str) -> np.ndarray:
    if any(c in pattern for c in "*?["):
        return np.asarray([i for i, s in enumerate(table) if fnmatch.fnmatchcase(s, pattern)], np.int32)
    return np.asarray([i for i, s in enumerate(table) if s == pattern], np.int32)


def nesting_depth(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Depth of each event inside the events that enclose it on the same track (0 = top level).

    Events must be sorted by (track, start, -end). The events open when row i starts are the rows before it
    on its track minus those that already ended (end <= start_i): one searchsorted per track, no Python loop.
    """
    depth = np.zeros(start.size, np.int16)
    bounds = np.flatnonzero(np.diff(track)) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), start.size]):
        ended = np.searchsorted(np.sort(end[a:b]), start[a:b], side="right")
        depth[a:b] = np.arange(b - a) - ended
    return depth
