"""Load traces into TraceColumns: Chrome Trace Event JSON (X, B/E, i, C, M, flows; gzipped or not; object or
array form, the array's closing bracket optional as the format allows), Kineto (torch.profiler) traces, and
our own recorder's Trace.

Big files are decoded by msgspec into typed structs (args stay raw JSON until asked for), then turned into
numpy columns with one list comprehension per field. A malformed or truncated file raises TraceFormatError
naming the file and the byte offset or event index.
"""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from infragent.analysis.trace_columns import GPU_CATEGORIES, Track, TraceColumns
from infragent.trace_model import CPU_NS_KEY, Trace, TraceFormatError

KEEP_ARGS_BELOW_BYTES = 256 << 20  # past this, args are dropped after loading (they pin the whole file)
_NAN = float("nan")
_NO_ARGS = msgspec.Raw(b"{}")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = _NAN
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    id: int | str | None = None
    bp: str | None = None
    args: msgspec.Raw = _NO_ARGS


class _File(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    otherData: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None


def load_columns(path: str | Path, keep_args: bool | None = None) -> TraceColumns:
    """Read a Chrome/Kineto trace file (.json or .json.gz) into columns."""
    path = Path(path)
    data = _read_bytes(path)
    events, meta = _decode(data, str(path))
    keep = len(data) < KEEP_ARGS_BELOW_BYTES if keep_args is None else keep_args
    columns = _columns(events, meta, str(path), keep)
    del events, data
    return columns


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


def _read_bytes(path: Path) -> bytes:
    try:
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


def _decode(data: bytes, source: str) -> tuple[list[_Event], dict[str, Any]]:
    start = data.lstrip()[:1]
    if start not in (b"{", b"["):
        raise TraceFormatError(f"{source}: not a Chrome trace: byte 0 should open a JSON object or array "
                               f"(found {data[:16]!r})")
    try:
        if start == b"[":
            return _decode_array(data, source), {}
        file = msgspec.json.decode(data, type=_File)
    except msgspec.ValidationError as err:
        raise TraceFormatError(f"{source}: {_where(str(err))}") from None
    except msgspec.DecodeError as err:
        raise TraceFormatError(f"{source}: {_decode_message(err, data)}") from None
    meta = dict(file.otherData or {})
    if file.baseTimeNanoseconds is not None:
        meta["baseTimeNanoseconds"] = file.baseTimeNanoseconds
    return file.traceEvents, meta


def _decode_array(data: bytes, source: str) -> list[_Event]:
    """The JSON Array Format; its closing ']' may be missing (the format allows it), and a trailing comma too."""
    try:
        return msgspec.json.decode(data, type=list[_Event])
    except msgspec.DecodeError as err:
        body = data.rstrip()
        if not str(err).startswith("Input data was truncated") or body.endswith(b"]"):
            raise
        try:
            return msgspec.json.decode(body.rstrip(b",") + b"]", type=list[_Event])
        except msgspec.DecodeError:
            raise err from None


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


def _columns(events: list[_Event], meta: dict[str, Any], source: str, keep_args: bool) -> TraceColumns:
    ph = np.asarray([e.ph for e in events])
    is_x, is_b, is_e = ph == "X", ph == "B", ph == "E"
    is_i = np.isin(ph, ["i", "I", "n", "R"])
    threads: dict[tuple[Any, Any], str] = {}
    for i in np.flatnonzero(ph == "M").tolist():
        e = events[i]
        if e.name == "thread_name":
            threads[(e.pid, e.tid)] = str(msgspec.json.decode(e.args).get("name", ""))
    rows = np.flatnonzero(is_x | is_i)
    picked = [events[i] for i in rows.tolist()]
    ts = np.asarray([e.ts for e in picked], float)
    if np.isnan(ts).any():
        bad = int(rows[np.flatnonzero(np.isnan(ts))[0]])
        raise TraceFormatError(f"{source}: traceEvents[{bad}] ({events[bad].ph} {events[bad].name!r}) has no ts")
    dur = np.where(is_x[rows], np.asarray([e.dur for e in picked], float), 0.0)
    if (dur < 0).any():
        bad = int(rows[np.flatnonzero(dur < 0)[0]])
        raise TraceFormatError(f"{source}: traceEvents[{bad}] ({events[bad].name!r}) has a negative dur")
    begins, ends, names_b, cats_b, keys_b, args_b = _match_begin_end(events, is_b, is_e, source)
    origin = float(np.floor(ts.min())) if ts.size else 0.0
    start_ns = _ns(ts, origin)
    end_ns = start_ns + np.rint(dur * 1000).astype(np.int64)
    keys = [(e.pid, e.tid) for e in picked] + keys_b
    track_ids: dict[tuple[Any, Any], int] = {}
    track = np.asarray([track_ids.setdefault(k, len(track_ids)) for k in keys], np.int32)
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    name = np.asarray([names.setdefault(e.name, len(names)) for e in picked]
                      + [names.setdefault(n, len(names)) for n in names_b], np.int32)
    cat = np.asarray([cats.setdefault(e.cat, len(cats)) for e in picked]
                     + [cats.setdefault(c, len(cats)) for c in cats_b], np.int32)
    start = np.concatenate([start_ns, _ns(begins, origin)])
    end = np.concatenate([end_ns, _ns(ends, origin)])
    cat_list = list(cats)
    gpu_cat = np.asarray([c in GPU_CATEGORIES for c in cat_list], bool)
    on_gpu = np.zeros(len(track_ids), bool)
    np.logical_or.at(on_gpu, track, gpu_cat[cat] if cat.size else np.zeros(0, bool))
    tracks = [Track(_int(pid), _int(tid), threads.get((pid, tid)) or f"{'stream' if gpu else 'thread'} {tid}",
                    "stream" if gpu else "thread") for ((pid, tid), gpu) in zip(track_ids, on_gpu.tolist())]
    args = [a if a is not _NO_ARGS else None for a in [e.args for e in picked] + args_b] if keep_args else None
    meta = dict(meta, ts_origin_ns=int(origin * 1000))
    columns = TraceColumns(list(names), cat_list, tracks, name, cat, track, start, end,
                           depth=np.zeros(start.size, np.int16), args=args,
                           counters=_counters(events, ph, origin, source), meta=meta, source=source)
    columns = _sorted(columns, names, cats)
    columns.flows = _flows(events, ph, columns, track_ids, origin)
    return columns


def _match_begin_end(events: list[_Event], is_b: np.ndarray, is_e: np.ndarray, source: str):  # noqa: ANN202
    """B/E pairs → intervals: each E closes the most recent open B on its thread (as the format defines)."""
    begins: list[float] = []
    ends: list[float] = []
    names: list[str] = []
    cats: list[str] = []
    keys: list[tuple[Any, Any]] = []
    args: list[Any] = []
    open_: dict[tuple[Any, Any], list[_Event]] = {}
    for i in np.flatnonzero(is_b | is_e).tolist():
        e = events[i]
        if e.ts != e.ts:
            raise TraceFormatError(f"{source}: traceEvents[{i}] ({e.ph} {e.name!r}) has no ts")
        stack = open_.setdefault((e.pid, e.tid), [])
        if e.ph == "B":
            stack.append(e)
        elif stack:
            b = stack.pop()
            begins.append(b.ts)
            ends.append(max(e.ts, b.ts))
            names.append(b.name or e.name)
            cats.append(b.cat or e.cat)
            keys.append((e.pid, e.tid))
            args.append(b.args)
    return np.asarray(begins, float), np.asarray(ends, float), names, cats, keys, args


def _counters(events: list[_Event], ph: np.ndarray, origin: float,
              source: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    series: dict[str, tuple[list[float], list[float]]] = {}
    for i in np.flatnonzero(ph == "C").tolist():
        e = events[i]
        values = msgspec.json.decode(e.args)
        if not isinstance(values, dict):
            raise TraceFormatError(f"{source}: traceEvents[{i}] (counter {e.name!r}) args must be an object")
        for key, value in values.items():
            if isinstance(value, (int, float)):
                label = e.name if len(values) == 1 else f"{e.name}.{key}"
                ts, vs = series.setdefault(label, ([], []))
                ts.append(e.ts)
                vs.append(float(value))
    return {k: (_ns(np.asarray(t, float), origin), np.asarray(v, float)) for k, (t, v) in series.items()}


def _flows(events: list[_Event], ph: np.ndarray, columns: TraceColumns, track_ids: dict, origin: float) -> np.ndarray:
    """Flow arrows (s → f, by id and category) bound to the events that enclose their endpoints."""
    rows = np.flatnonzero(np.isin(ph, ["s", "f", "t"]))
    if not rows.size:
        return np.zeros((0, 2), np.int64)
    sources: dict[tuple[str, Any], int] = {}
    pairs = []
    for i in rows.tolist():
        e = events[i]
        track = track_ids.get((e.pid, e.tid))
        if track is None or e.id is None:
            continue
        row = _enclosing(columns, track, int(_ns(np.asarray([e.ts]), origin)[0]))
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
    order = np.lexsort((-(columns.end - columns.start), columns.start, columns.track))
    args = [columns.args[i] for i in order.tolist()] if columns.args is not None else None
    return TraceColumns(list(names), list(cats), columns.tracks, columns.name[order], columns.cat[order],
                        columns.track[order], columns.start[order], columns.end[order], args=args,
                        counters=columns.counters, meta=columns.meta, source=columns.source)


def _ns(us: np.ndarray, origin: float) -> np.ndarray:
    """µs floats → int64 ns relative to origin µs (subtracting first keeps sub-µs digits of large timestamps)."""
    return np.rint((us - origin) * 1000).astype(np.int64)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return zlib.crc32(str(value).encode()) & 0x7FFFFFFF
