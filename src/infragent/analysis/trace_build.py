"""Building TraceColumns: typed events batch by batch into numpy column chunks (spans; rare events such as
metadata, B/E pairs, counters and flows kept aside and resolved at the end), and our recorder's Trace as columns."""
from __future__ import annotations

import zlib
from typing import Any

import msgspec
import numpy as np

from infragent.analysis.kineto import BOOKKEEPING
from infragent.analysis.trace_columns import GPU_CATEGORIES, Track, TraceColumns
from infragent.analysis.trace_read import NO_ARGS, ONE_EVENT, TraceEvent
from infragent.trace_model import CPU_NS_KEY, Trace, TraceFormatError

NS_LIMIT = 2 ** 62  # ns after the trace's start: int64 with room to add a duration


def columns_from_trace(trace: Trace) -> TraceColumns:
    """Our recorder's Trace as columns (spans, counters, thread names; span attrs kept as args)."""
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    tids = sorted({s.tid for s in trace.spans} | set(trace.threads))
    pid = int(trace.meta.get("pid", 0))
    tracks = [Track(pid, tid, trace.thread_name(tid), "thread") for tid in tids]
    track_of = {tid: i for i, tid in enumerate(tids)}
    spans = trace.spans
    args = [dict(s.attrs, **({CPU_NS_KEY: s.cpu_ns} if s.cpu_ns is not None else {})) for s in spans]
    counters: dict[str, tuple[list[int], list[float]]] = {}
    for c in trace.counters:
        ts, values = counters.setdefault(c.name, ([], []))
        ts.append(c.ts_ns)
        values.append(c.value)
    return _sorted(TraceColumns(
        names=list(names), cats=list(cats), tracks=tracks,
        name=np.asarray([names.setdefault(s.name, len(names)) for s in spans], np.int32),
        cat=np.asarray([cats.setdefault(s.category, len(cats)) for s in spans], np.int32),
        track=np.asarray([track_of[s.tid] for s in spans], np.int32),
        start=np.asarray([s.start_ns for s in spans], np.int64),
        end=np.asarray([s.end_ns for s in spans], np.int64), depth=np.zeros(len(spans), np.int16), args=args,
        counters={k: (np.asarray(t, np.int64), np.asarray(v, float)) for k, (t, v) in counters.items()},
        meta=dict(trace.meta), source="<recorder>"), names, cats)


class ColumnBuilder:
    """Accumulates column chunks batch by batch; rare events (M, B/E, C, flows) are kept aside until the end."""

    def __init__(self, source: str, keep_args: bool) -> None:
        self.source, self.keep_args = source, keep_args
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.track_ids: dict[tuple[Any, Any], int] = {}
        self.chunks: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "dur", "name", "cat", "track")}
        self.firsts: list[int] = []  # the first event index of each chunk: chunks are joined in file order
        self.args: list[Any] = []
        self.rare: list[tuple[int, TraceEvent]] = []
        self.extents: list[tuple[float, int, float, int]] = []  # per chunk: earliest ts, its event, latest end, its

    def add(self, events: list[TraceEvent], first: int, raws: list[msgspec.Raw] | None = None) -> None:
        """Turn one batch of events into column chunks (lean events: raws gives the rare ones in full)."""
        phs = [e.ph for e in events]
        if phs.count("X") == len(phs):  # the common case: complete events only
            ph, rows, picked = None, np.arange(len(events)), events
        else:
            ph = np.asarray(phs)
            spans = (ph == "X") | np.isin(ph, ["i", "I", "n", "R"])
            rare = np.flatnonzero(~spans & (ph != "")).tolist()
            self.rare.extend((first + i, self._in_full(raws[i], first + i) if raws is not None else events[i])
                             for i in rare)
            rows = np.flatnonzero(spans)
            picked = [events[i] for i in rows.tolist()]
        ts = np.asarray([e.ts for e in picked], float)
        dur = np.asarray([e.dur for e in picked], float)
        if ph is not None:
            dur[ph[rows] != "X"] = 0.0
        for bad, what in ((np.isnan(ts), "has no ts"), (np.isinf(ts), "has an infinite ts"),
                          (dur < 0, "has a negative dur"), (np.isinf(dur), "has an infinite dur")):
            if bad.any():
                i = int(rows[np.flatnonzero(bad)[0]])
                raise TraceFormatError(f"{self.source}: traceEvents[{first + i}] ({events[i].ph} "
                                       f"{events[i].name!r}) {what}")
        if ts.size:
            end = ts + dur
            a, b = int(np.argmin(ts)), int(np.argmax(end))
            self.extents.append((float(ts[a]), first + int(rows[a]), float(end[b]), first + int(rows[b])))
        names, cats, tracks = self.names, self.cats, self.track_ids
        self.firsts.append(first)
        self.chunks["ts"].append(ts)
        self.chunks["dur"].append(dur)
        self.chunks["name"].append(np.asarray([names.setdefault(e.name, len(names)) for e in picked], np.int32))
        self.chunks["cat"].append(np.asarray([cats.setdefault(e.cat, len(cats)) for e in picked], np.int32))
        self.chunks["track"].append(np.asarray([tracks.setdefault((e.pid, e.tid), len(tracks)) for e in picked],
                                               np.int32))
        if self.keep_args:
            self.args.extend(a if a is not NO_ARGS else None for a in [e.args for e in picked])

    def export(self) -> tuple:
        """What merge() needs, picklable: string tables, chunks with their first indices, rare events."""
        return (list(self.names), list(self.cats), list(self.track_ids), self.chunks, self.firsts, self.rare,
                self.extents)

    def merge(self, exported: tuple) -> None:
        """Add another builder's export, renumbering its names, categories and tracks into ours."""
        names, cats, tracks, chunks, firsts, rare, extents = exported
        self.extents = self.extents + extents
        remap = {"name": (names, self.names), "cat": (cats, self.cats), "track": (tracks, self.track_ids)}
        tables = {key: np.asarray([ours.setdefault(x, len(ours)) for x in theirs] or [0], np.int32)
                  for key, (theirs, ours) in remap.items()}
        order = sorted(range(len(self.firsts) + len(firsts)), key=lambda i: (self.firsts + firsts)[i])
        for key, values in chunks.items():
            if key in tables:
                values = [tables[key][v] for v in values]
            joined = self.chunks[key] + values
            self.chunks[key] = [joined[i] for i in order]
        self.firsts = sorted(self.firsts + firsts)
        self.rare = sorted(self.rare + rare, key=lambda pair: pair[0])

    def finish(self, meta: dict[str, Any]) -> TraceColumns:
        """The sorted columns, with B/E intervals, thread names, counters and flows."""
        threads = {(e.pid, e.tid): _name_arg(self._args(i, e)) for i, e in self.rare
                   if e.ph == "M" and e.name == "thread_name"}
        begins, ends = self._begin_end()
        ts = np.concatenate(self.chunks["ts"] + [begins])
        dur = np.concatenate(self.chunks["dur"] + [ends - begins])
        self.chunks["ts"], self.chunks["dur"] = [], []
        self._check_extent(begins, ends)
        origin = float(np.floor(ts.min())) if ts.size else 0.0
        start = _ns(ts, origin)
        dur *= 1000
        end = start + np.rint(dur, out=dur).astype(np.int64)
        name, cat, track = (np.concatenate(self.chunks[k]) for k in ("name", "cat", "track"))
        cat_list = list(self.cats)
        gpu_cat = np.asarray([c in GPU_CATEGORIES for c in cat_list] or [False], bool)
        on_gpu = np.bincount(track, weights=gpu_cat[cat], minlength=len(self.track_ids)) > 0
        tracks = [Track(_int(pid), _int(tid), threads.get((pid, tid)) or f"{'stream' if gpu else 'thread'} {tid}",
                        "stream" if gpu else "thread") for ((pid, tid), gpu) in zip(self.track_ids, on_gpu.tolist())]
        columns = TraceColumns(list(self.names), cat_list, tracks, name, cat, track, start, end,
                               depth=np.zeros(start.size, np.int16), args=self.args if self.keep_args else None,
                               counters=self._counters(origin), meta=dict(meta, ts_origin_ns=int(origin * 1000)),
                               source=self.source)
        columns = _sorted(_without_bookkeeping(columns), self.names, self.cats)
        columns.flows = self._flows(columns, origin)
        return columns

    def _in_full(self, raw: msgspec.Raw, index: int) -> TraceEvent:
        """A rare event decoded again with every field (its id, bp and args); a bad one is located."""
        try:
            return ONE_EVENT.decode(raw)
        except msgspec.DecodeError as err:  # ValidationError too: a flow's id or bp of the wrong type
            what, _, at = str(err).partition(" - at `")
            raise TraceFormatError(f"{self.source}: traceEvents[{index}]{at.rstrip('`').removeprefix('$')}: "
                                   f"{what}") from None

    def _args(self, index: int, e: TraceEvent) -> Any:
        """A rare event's args, decoded (its text is checked here on the paths that skip args)."""
        try:
            return msgspec.json.decode(e.args)
        except msgspec.DecodeError as err:
            raise TraceFormatError(f"{self.source}: traceEvents[{index}].args: {err}") from None

    def _check_extent(self, begins: np.ndarray, ends: np.ndarray) -> None:
        """Every start and end, as ns after the earliest start, must fit an int64 (with room to add durations):
        checked on each chunk's earliest start and latest end, and the B/E intervals'."""
        if not self.extents and not begins.size:
            return
        lo = min([p[0] for p in self.extents] + ([float(begins.min())] if begins.size else []))
        hi = max([p[2] for p in self.extents] + ([float(ends.max())] if ends.size else []))
        if (hi - lo) * 1000 < NS_LIMIT:
            return
        points = self.extents + [(e.ts, i, e.ts, i) for i, e in self.rare if e.ph in ("B", "E")]
        first = next((_event(i) for t, i, _, _ in points if t == lo), "an event")
        last = next((_event(i) for _, _, t, i in points if t == hi), "an event")
        raise TraceFormatError(f"{self.source}: {last} ends at {hi:.6g} µs, {(hi - lo) / 3.156e13:.3g} years after "
                               f"{first} starts (at {lo:.6g} µs): too far apart for ns timestamps; is a ts or dur "
                               "wrong?")

    def _begin_end(self) -> tuple[np.ndarray, np.ndarray]:
        """B/E pairs → intervals appended to the chunks: each E closes the most recent open B on its thread."""
        begins: list[float] = []
        ends: list[float] = []
        open_: dict[tuple[Any, Any], list[TraceEvent]] = {}
        names, cats, tracks = self.names, self.cats, self.track_ids
        name, cat, track = [], [], []
        for i, e in self.rare:
            if e.ph not in ("B", "E"):
                continue
            if e.ts != e.ts:
                raise TraceFormatError(f"{self.source}: traceEvents[{i}] ({e.ph} {e.name!r}) has no ts")
            stack = open_.setdefault((e.pid, e.tid), [])
            if e.ph == "B":
                stack.append(e)
            elif stack:
                b = stack.pop()
                begins.append(b.ts)
                ends.append(max(e.ts, b.ts))
                name.append(names.setdefault(b.name or e.name, len(names)))
                cat.append(cats.setdefault(b.cat or e.cat, len(cats)))
                track.append(tracks.setdefault((e.pid, e.tid), len(tracks)))
                if self.keep_args:
                    self.args.append(b.args if b.args is not NO_ARGS else None)
        for key, values in (("name", name), ("cat", cat), ("track", track)):
            self.chunks[key].append(np.asarray(values, np.int32))
        return np.asarray(begins, float), np.asarray(ends, float)

    def _counters(self, origin: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for i, e in self.rare:
            if e.ph != "C":
                continue
            values = self._args(i, e)
            if not isinstance(values, dict):
                raise TraceFormatError(f"{self.source}: traceEvents[{i}] (counter {e.name!r}) args must be an object")
            for key, value in values.items():
                if isinstance(value, int) and not -2 ** 1023 < value < 2 ** 1023:
                    raise TraceFormatError(f"{self.source}: traceEvents[{i}].args.{key}: counter value too large")
                if isinstance(value, (int, float)):
                    label = e.name if len(values) == 1 else f"{e.name}.{key}"
                    ts, vs = series.setdefault(label, ([], []))
                    ts.append(e.ts)
                    vs.append(float(value))
            if not abs(e.ts - origin) * 1000 < NS_LIMIT:  # NaN too
                what = "has no ts" if e.ts != e.ts else f"has ts {e.ts:.6g} µs, outside the trace's time range"
                raise TraceFormatError(f"{self.source}: traceEvents[{i}] (counter {e.name!r}) {what}")
        return {k: (_ns(np.asarray(t, float), origin), np.asarray(v, float)) for k, (t, v) in series.items()}

    def _flows(self, columns: TraceColumns, origin: float) -> np.ndarray:
        """Flow arrows (s → f, by id and category) bound to the events that enclose their endpoints."""
        track_of = {(t.pid, t.tid): i for i, t in enumerate(columns.tracks)}
        points = [e for _, e in self.rare if e.ph in ("s", "t", "f") and e.id is not None
                  and abs(e.ts - origin) * 1000 < NS_LIMIT  # a flow point outside the trace binds to nothing
                  and (_int(e.pid), _int(e.tid)) in track_of]
        tracks = np.asarray([track_of[(_int(e.pid), _int(e.tid))] for e in points], np.int64)
        rows = _bound_rows(columns, tracks, _ns(np.asarray([e.ts for e in points], float), origin))
        sources = {(e.cat, e.id): row for e, row in zip(points, rows.tolist()) if e.ph == "s" and row >= 0}
        # Kineto writes a kernel's flow end before its launch's flow start: pair them once all are read
        pairs = [(sources[(e.cat, e.id)], row) for e, row in zip(points, rows.tolist())
                 if e.ph != "s" and row >= 0 and (e.cat, e.id) in sources]
        return np.asarray(pairs, np.int64).reshape(-1, 2)


def _bound_rows(columns: TraceColumns, tracks: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The event each flow endpoint binds to: the shortest one starting exactly there (Kineto binds flows to
    event starts; one search per track), else the deepest one enclosing it."""
    rows = np.full(ts.size, -1, np.int64)
    for t in np.unique(tracks).tolist():
        mine = np.flatnonzero(tracks == t)
        lo, hi = np.searchsorted(columns.track, [t, t + 1])
        i = np.searchsorted(columns.start[lo:hi], ts[mine], side="right") - 1 + lo
        exact = (i >= lo) & (columns.start[np.maximum(i, 0)] == ts[mine])
        rows[mine[exact]] = i[exact]
    top = np.flatnonzero(columns.depth == 0)
    for k in np.flatnonzero(rows < 0).tolist():
        rows[k] = _enclosing(columns, top, int(tracks[k]), int(ts[k]))
    return rows


def _without_bookkeeping(columns: TraceColumns) -> TraceColumns:
    """The columns without the profiler's own events (Kineto's `Trace` and `overhead`) and the tracks only they
    were on, so that no analysis counts them as the program's work."""
    drop = np.isin(columns.cat, np.asarray([i for i, s in enumerate(columns.cats) if s in BOOKKEEPING], np.int32))
    if not drop.any():
        return columns
    keep = np.flatnonzero(~drop)
    used = np.unique(columns.track[keep])
    renumber = np.full(len(columns.tracks), -1, np.int32)
    renumber[used] = np.arange(used.size, dtype=np.int32)
    args = [columns.args[i] for i in keep.tolist()] if columns.args is not None else None
    meta = dict(columns.meta, dropped_events={columns.cats[k]: int(n) for k, n in
                                              zip(*np.unique(columns.cat[drop], return_counts=True))})
    return TraceColumns(columns.names, columns.cats, [columns.tracks[i] for i in used.tolist()],
                        columns.name[keep], columns.cat[keep], renumber[columns.track[keep]], columns.start[keep],
                        columns.end[keep], depth=np.zeros(keep.size, np.int16), args=args,
                        counters=columns.counters, meta=meta, source=columns.source)


def _enclosing(columns: TraceColumns, top: np.ndarray, track: int, ts: int) -> int:
    """The deepest event on a track whose interval holds ts (or starts at it); -1 when none.

    Only the rows from the last top-level event starting at or before ts (top: the rows of depth 0) can hold it:
    top-level events do not overlap, so everything before that one ended earlier."""
    lo, hi = np.searchsorted(columns.track, [track, track + 1])
    i = int(np.searchsorted(columns.start[lo:hi], ts, side="right")) - 1 + lo
    if i < lo:
        return -1
    j = max(int(top[max(int(np.searchsorted(top, i, side="right")) - 1, 0)]) if top.size else lo, lo)
    j = j if j <= i else lo
    ok = (columns.end[j:i + 1] > ts) | (columns.start[j:i + 1] == ts)
    if not ok.any():
        return -1
    depth = np.where(ok, columns.depth[j:i + 1].astype(np.int64), -1)
    return j + int(depth.size - 1 - np.argmax(depth[::-1]))


def _sorted(columns: TraceColumns, names: dict, cats: dict) -> TraceColumns:
    """Rows sorted by (track, start, longest first), with depth computed; names/cats tables from the dicts."""
    order = sort_order(columns.track, columns.start, columns.end)
    args = [columns.args[i] for i in order.tolist()] if columns.args is not None else None
    return TraceColumns(list(names), list(cats), columns.tracks, columns.name[order], columns.cat[order],
                        columns.track[order], columns.start[order], columns.end[order], args=args,
                        counters=columns.counters, meta=columns.meta, source=columns.source)


def sort_order(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The permutation sorting rows by (track, start, longest first).

    Traces are mostly written in time order per thread or stream, so: a stable radix sort by track, then a
    full sort only of the tracks whose rows are not already in order.
    """
    key = track.astype(np.int16) if len(track) and track.max() < np.iinfo(np.int16).max else track
    order = np.argsort(key, kind="stable")
    s, e, t = start[order], end[order], track[order]
    bounds = np.flatnonzero(np.diff(t)) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(t)]):
        ds = np.diff(s[a:b])
        # in order: starts never decrease, and where two starts are equal the longer comes first
        if (ds < 0).any() or ((ds == 0) & (np.diff(e[a:b]) > 0)).any():
            local = np.lexsort((-(e[a:b] - s[a:b]), s[a:b]))
            order[a:b] = order[a:b][local]
    return order


def _ns(us: np.ndarray, origin: float) -> np.ndarray:
    """µs floats → int64 ns relative to origin µs (subtracting first keeps sub-µs digits of large timestamps).

    In place where it can: fresh multi-MB arrays cost page faults, which are slow on virtual machines."""
    us = us - origin
    us *= 1000
    return np.rint(us, out=us).astype(np.int64)


def _event(index: int) -> str:
    """traceEvents[i], or where the two-halves path (trace_halves) numbered its second half from 2**40."""
    return f"traceEvents[{index}]" if index < 1 << 40 else "an event in the file's second half"


def _name_arg(args: Any) -> str:
    """A metadata event's args.name ('' when its args are not an object or name no name)."""
    return str(args.get("name") or "") if isinstance(args, dict) else ""


def _int(value: Any) -> int:
    """A pid or tid as an int64 (strings and ints past int64, as in a mangled file, by their hash)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is not None and -(1 << 63) <= number < (1 << 63):
        return number
    return zlib.crc32(str(value).encode()) & 0x7FFFFFFF
