"""Load traces into TraceColumns: Chrome Trace Event JSON (X, B/E, i, C, M, flows; gzipped or not; object or
array form, the array's closing bracket optional as the format allows), Kineto (torch.profiler) traces, and
our own recorder's Trace.

Big files are split by msgspec into raw event slices in one pass, then decoded into typed structs a batch
at a time (args stay raw JSON until asked for) and turned into numpy columns, one list comprehension per
field per batch. A malformed or truncated file raises TraceFormatError
naming the file and the byte offset or event index.
"""
from __future__ import annotations

import contextlib
import gzip
import mmap
import os
import threading
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from infragent.analysis import trace_halves
from infragent.analysis.forked import start_in_child
from infragent.analysis.trace_columns import GPU_CATEGORIES, Track, TraceColumns
from infragent.trace_model import CPU_NS_KEY, Trace, TraceFormatError

KEEP_ARGS_BELOW_BYTES = 256 << 20  # past this, args are dropped after loading (they pin the whole file)
PARALLEL_ABOVE = 400_000  # events: past this, a forked child decodes half of the batches
MAP_ABOVE_BYTES = 64 << 20  # files this big are memory-mapped rather than read into a bytes object
BATCH = 100_000  # events decoded to structs at a time: peak memory is the file, not the file plus its structs
_NAN = float("nan")
_NO_ARGS = msgspec.Raw(b"{}")


class _LeanEvent(msgspec.Struct, gc=False):
    """The fields spans need; big traces decode these only (rare event types are decoded again in full)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = _NAN
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0


class _Event(_LeanEvent, gc=False):
    """Every field any event type needs: flows' id and binding point, counters' and names' args."""

    id: int | str | None = None
    bp: str | None = None
    args: msgspec.Raw = _NO_ARGS


class _File(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]
    otherData: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None


def load_columns(path: str | Path, keep_args: bool | None = None) -> TraceColumns:
    """Read a Chrome/Kineto trace file (.json or .json.gz) into columns."""
    path = Path(path)
    fast = _fast(path, keep_args)
    if fast is not None:
        return fast
    data = _read_bytes(path)
    keep = len(data) < KEEP_ARGS_BELOW_BYTES if keep_args is None else keep_args
    raws, meta = _split(data, str(path))
    builder = _Builder(str(path), keep)
    if len(raws) >= PARALLEL_ABOVE and not keep and _can_fork():
        _decode_in_two_processes(data, raws, builder)
    else:
        for first in range(0, len(raws), BATCH):
            builder.add(_decode_batch(raws[first:first + BATCH], first, str(path)), first)
    del raws
    return builder.finish(meta)


def _fast(path: Path, keep_args: bool | None) -> TraceColumns | None:
    """Big plain files without args kept: two processes decode the two halves in place (trace_halves.py)."""
    try:
        size = path.stat().st_size if path.is_file() else 0
    except OSError:
        return None
    if size < MAP_ABOVE_BYTES or keep_args or not _can_fork():
        return None
    with path.open("rb") as f:
        if f.read(2) == b"\x1f\x8b":
            return None
    data = trace_halves.open_private(str(path))
    cut = trace_halves.halves(data)
    if cut is None:
        return None
    builder = _Builder(str(path), False)
    if not trace_halves.decode_halves(cut[0], cut[1], builder):
        return None  # the careful path reports what is wrong, with its location
    return builder.finish(cut[2])


def _can_fork() -> bool:
    """Forking is safe only from a single-threaded process on a machine with a second core."""
    return hasattr(os, "fork") and (os.cpu_count() or 1) > 1 and threading.active_count() == 1


def _decode_in_two_processes(data: bytes | mmap.mmap, raws: list[msgspec.Raw], builder: _Builder) -> None:
    """Decode odd batches in a forked child (it shares the file's memory) and even ones here, then merge.

    Decoding is CPU-bound and holds the GIL, so a second process is the only way to use the second core.
    """
    def decode(builder_: _Builder, parity: int) -> _Builder:
        region = _Region(data)
        for first in range(parity * BATCH, len(raws), 2 * BATCH):
            batch = raws[first:first + BATCH]
            builder_.add(_decode_batch(batch, first, builder.source, lean=True, region=region), first, batch)
        return builder_

    join = start_in_child(lambda: decode(_Builder(builder.source, False), 1).export())
    try:
        decode(builder, 0)
    except BaseException:
        with contextlib.suppress(Exception):
            join()  # reap the child; our own error is the one to report
        raise
    builder.merge(join())  # or the child's error, with its event's index


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


def _read_bytes(path: Path) -> bytes | mmap.mmap:
    """The file's bytes: memory-mapped when big and not gzipped (no copy), decompressed when gzipped."""
    try:
        if path.is_file() and path.stat().st_size >= MAP_ABOVE_BYTES:
            with path.open("rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if mapped[:2] != b"\x1f\x8b":
                return mapped
            mapped.close()
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory; give one trace file") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise TraceFormatError(f"{path}: broken gzip data ({err}); the compressed file is {len(raw)} bytes, "
                               "probably truncated: re-export or re-copy it") from None


def _split(data: bytes, source: str) -> tuple[list[msgspec.Raw], dict[str, Any]]:
    """The events as raw JSON slices (one fast pass that also checks the syntax), and the file's metadata."""
    start = bytes(data[:4096]).lstrip()[:1]
    if start not in (b"{", b"["):
        raise TraceFormatError(f"{source}: not a Chrome trace: byte 0 should open a JSON object or array "
                               f"(found {data[:16]!r})")
    try:
        if start == b"[":
            return _split_array(data), {}
        file = msgspec.json.decode(data, type=_File)
    except msgspec.ValidationError as err:
        raise TraceFormatError(f"{source}: {_where(str(err))}") from None
    except msgspec.DecodeError as err:
        raise TraceFormatError(f"{source}: {_decode_message(err, data)}") from None
    meta = dict(file.otherData or {})
    if file.baseTimeNanoseconds is not None:
        meta["baseTimeNanoseconds"] = file.baseTimeNanoseconds
    return file.traceEvents, meta


def _split_array(data: bytes) -> list[msgspec.Raw]:
    """The JSON Array Format; its closing ']' may be missing (the format allows it), and a trailing comma too."""
    try:
        return msgspec.json.decode(data, type=list[msgspec.Raw])
    except msgspec.DecodeError as err:
        body = bytes(data).rstrip()
        if not str(err).startswith("Input data was truncated") or body.endswith(b"]"):
            raise
        try:
            return msgspec.json.decode(body.rstrip(b",") + b"]", type=list[msgspec.Raw])
        except msgspec.DecodeError:
            raise err from None


_FULL = msgspec.json.Decoder(list[_Event])
_LEAN = msgspec.json.Decoder(list[_LeanEvent])
_ONE = msgspec.json.Decoder(_Event)


def _decode_batch(raws: list[msgspec.Raw], first: int, source: str, lean: bool = False,
                  region: "_Region | None" = None) -> list[_Event]:
    """Typed events of one batch (lean: span fields only); a bad field is reported at its trace-wide index."""
    try:
        text = region.around(raws) if region is not None and lean else b"[" + b",".join(raws) + b"]"
        return (_LEAN if lean else _FULL).decode(text)
    except msgspec.ValidationError as err:
        where = _where(str(err))
        index, _, rest = where.removeprefix("[").partition("]")
        if index.isdigit():
            where = f"traceEvents[{first + int(index)}]{rest}"
        raise TraceFormatError(f"{source}: {where}") from None


class _Region:
    """Batches as one copy of their byte range in the file, into a reused buffer (lean decoding keeps no
    reference into it): no per-event join, no fresh multi-MB allocation per batch."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self.view = memoryview(data)
        self.base = np.frombuffer(data, np.uint8).ctypes.data
        self.buffer = bytearray()

    def offset(self, raw: msgspec.Raw) -> int:
        return np.frombuffer(raw, np.uint8).ctypes.data - self.base

    def around(self, raws: list[msgspec.Raw]) -> memoryview:
        """'[' + the bytes from the first raw's start to the last raw's end + ']'."""
        lo, hi = self.offset(raws[0]), self.offset(raws[-1]) + len(raws[-1])
        if not 0 <= lo < hi <= len(self.view):  # not slices of this buffer after all
            return memoryview(b"[" + b",".join(raws) + b"]")
        size = hi - lo + 2
        if len(self.buffer) < size:
            self.buffer = bytearray(size + (size >> 3))
        self.buffer[0] = 0x5B  # [
        self.buffer[1:size - 1] = self.view[lo:hi]
        self.buffer[size - 1] = 0x5D  # ]
        return memoryview(self.buffer)[:size]


def _decode_message(err: msgspec.DecodeError, data: bytes) -> str:
    text = str(err)
    if text.startswith("Input data was truncated"):
        return (f"truncated JSON: the file ends at byte {len(data)} in the middle of the trace "
                "(was the profiler stopped before it finished writing?)")
    return f"malformed JSON: {text}"


def _where(message: str) -> str:
    """msgspec's `... - at `$.traceEvents[12].ts`` as `traceEvents[12].ts: ...`."""
    what, _, at = message.partition(" - at `")
    return f"{at.rstrip('`').removeprefix('$.').removeprefix('$')}: {what}" if at else message


class _Builder:
    """Accumulates column chunks batch by batch; rare events (M, B/E, C, flows) are kept aside until the end."""

    def __init__(self, source: str, keep_args: bool) -> None:
        self.source, self.keep_args = source, keep_args
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.track_ids: dict[tuple[Any, Any], int] = {}
        self.chunks: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "dur", "name", "cat", "track")}
        self.firsts: list[int] = []  # the first event index of each chunk: chunks are joined in file order
        self.args: list[Any] = []
        self.rare: list[tuple[int, _Event]] = []

    def add(self, events: list[_Event], first: int, raws: list[msgspec.Raw] | None = None) -> None:
        """Turn one batch of events into column chunks (lean events: raws gives the rare ones in full)."""
        phs = [e.ph for e in events]
        if phs.count("X") == len(phs):  # the common case: complete events only
            ph, rows, picked = None, np.arange(len(events)), events
        else:
            ph = np.asarray(phs)
            spans = (ph == "X") | np.isin(ph, ["i", "I", "n", "R"])
            rare = np.flatnonzero(~spans & (ph != "")).tolist()
            self.rare.extend((first + i, _ONE.decode(raws[i]) if raws is not None else events[i]) for i in rare)
            rows = np.flatnonzero(spans)
            picked = [events[i] for i in rows.tolist()]
        ts = np.asarray([e.ts for e in picked], float)
        dur = np.asarray([e.dur for e in picked], float)
        if ph is not None:
            dur[ph[rows] != "X"] = 0.0
        for bad, what in ((np.isnan(ts), "has no ts"), (dur < 0, "has a negative dur")):
            if bad.any():
                i = int(rows[np.flatnonzero(bad)[0]])
                raise TraceFormatError(f"{self.source}: traceEvents[{first + i}] ({events[i].ph} "
                                       f"{events[i].name!r}) {what}")
        names, cats, tracks = self.names, self.cats, self.track_ids
        self.firsts.append(first)
        self.chunks["ts"].append(ts)
        self.chunks["dur"].append(dur)
        self.chunks["name"].append(np.asarray([names.setdefault(e.name, len(names)) for e in picked], np.int32))
        self.chunks["cat"].append(np.asarray([cats.setdefault(e.cat, len(cats)) for e in picked], np.int32))
        self.chunks["track"].append(np.asarray([tracks.setdefault((e.pid, e.tid), len(tracks)) for e in picked],
                                               np.int32))
        if self.keep_args:
            self.args.extend(a if a is not _NO_ARGS else None for a in [e.args for e in picked])

    def export(self) -> tuple:
        """What merge() needs, picklable: string tables, chunks with their first indices, rare events."""
        return list(self.names), list(self.cats), list(self.track_ids), self.chunks, self.firsts, self.rare

    def merge(self, exported: tuple) -> None:
        """Add another builder's export, renumbering its names, categories and tracks into ours."""
        names, cats, tracks, chunks, firsts, rare = exported
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
        threads = {(e.pid, e.tid): str(msgspec.json.decode(e.args).get("name", ""))
                   for _, e in self.rare if e.ph == "M" and e.name == "thread_name"}
        begins, ends = self._begin_end()
        ts = np.concatenate(self.chunks["ts"] + [begins])
        dur = np.concatenate(self.chunks["dur"] + [ends - begins])
        self.chunks["ts"], self.chunks["dur"] = [], []
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
        columns = _sorted(columns, self.names, self.cats)
        columns.flows = self._flows(columns, origin)
        return columns

    def _begin_end(self) -> tuple[np.ndarray, np.ndarray]:
        """B/E pairs → intervals appended to the chunks: each E closes the most recent open B on its thread."""
        begins: list[float] = []
        ends: list[float] = []
        open_: dict[tuple[Any, Any], list[_Event]] = {}
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
                    self.args.append(b.args if b.args is not _NO_ARGS else None)
        for key, values in (("name", name), ("cat", cat), ("track", track)):
            self.chunks[key].append(np.asarray(values, np.int32))
        return np.asarray(begins, float), np.asarray(ends, float)

    def _counters(self, origin: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for i, e in self.rare:
            if e.ph != "C":
                continue
            values = msgspec.json.decode(e.args)
            if not isinstance(values, dict):
                raise TraceFormatError(f"{self.source}: traceEvents[{i}] (counter {e.name!r}) args must be an object")
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    label = e.name if len(values) == 1 else f"{e.name}.{key}"
                    ts, vs = series.setdefault(label, ([], []))
                    ts.append(e.ts)
                    vs.append(float(value))
        return {k: (_ns(np.asarray(t, float), origin), np.asarray(v, float)) for k, (t, v) in series.items()}

    def _flows(self, columns: TraceColumns, origin: float) -> np.ndarray:
        """Flow arrows (s → f, by id and category) bound to the events that enclose their endpoints."""
        sources: dict[tuple[str, Any], int] = {}
        pairs = []
        for _, e in self.rare:
            if e.ph not in ("s", "t", "f") or e.id is None or (e.pid, e.tid) not in self.track_ids:
                continue
            row = _enclosing(columns, self.track_ids[(e.pid, e.tid)], int(_ns(np.asarray([e.ts]), origin)[0]))
            if row < 0:
                continue
            if e.ph == "s":
                sources[(e.cat, e.id)] = row
            elif (e.cat, e.id) in sources:
                pairs.append((sources[(e.cat, e.id)], row))
        return np.asarray(pairs, np.int64).reshape(-1, 2)


def _enclosing(columns: TraceColumns, track: int, ts: int) -> int:
    """The deepest event on a track whose interval holds ts (or starts at it); -1 when none."""
    lo, hi = np.searchsorted(columns.track, [track, track + 1])
    i = int(np.searchsorted(columns.start[lo:hi], ts, side="right")) - 1 + lo
    best = -1
    while i >= lo:
        if columns.end[i] > ts or columns.start[i] == ts:
            if best < 0 or columns.depth[i] > columns.depth[best]:
                best = i
            if columns.depth[i] == 0:
                break
        elif columns.depth[i] == 0:
            break
        i -= 1
    return best


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


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return zlib.crc32(str(value).encode()) & 0x7FFFFFFF
