"""The trace model (spans, counters, threads) and its Chrome Trace Event JSON form, both ways.

Also imports PyTorch profiler (Kineto) traces, which are Chrome JSON with wall-clock timestamps,
into the same model. Times are integer nanoseconds on one clock (perf_counter_ns for our recorder).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CPU_NS_KEY = "infragent.cpu_ns"  # thread CPU time inside a span, kept in the Chrome event's args


@dataclass
class SpanEvent:
    """One timed interval on one thread."""

    name: str
    start_ns: int
    end_ns: int
    tid: int
    attrs: dict[str, Any] = field(default_factory=dict)
    cpu_ns: int | None = None  # CPU time the thread used inside the span, when recorded
    category: str = "span"

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class CounterEvent:
    """A sampled value at an instant."""

    name: str
    ts_ns: int
    value: float
    tid: int = 0


class TraceFormatError(ValueError):
    """A trace file that is not Chrome Trace Event JSON; the message names the file and the problem."""


@dataclass
class Trace:
    """Spans and counters of one recording, with thread names and clock metadata."""

    spans: list[SpanEvent] = field(default_factory=list)
    counters: list[CounterEvent] = field(default_factory=list)
    threads: dict[int, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def thread_name(self, tid: int) -> str:
        """Thread name, or 'thread <tid>' when unnamed."""
        return self.threads.get(tid, f"thread {tid}")

    def named(self, name: str) -> list[SpanEvent]:
        """Spans with this name."""
        return [s for s in self.spans if s.name == name]

    def to_chrome(self) -> dict[str, Any]:
        """Chrome Trace Event JSON (as a dict): X events for spans, C for counters, M for thread names."""
        pid = int(self.meta.get("pid", os.getpid()))
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            for tid, name in self.threads.items()]
        for s in self.spans:
            args = dict(s.attrs)
            if s.cpu_ns is not None:
                args[CPU_NS_KEY] = s.cpu_ns
            events.append({"ph": "X", "cat": s.category, "name": s.name, "pid": pid, "tid": s.tid,
                           "ts": s.start_ns / 1e3, "dur": s.dur_ns / 1e3, "args": _jsonable(args)})
        for c in self.counters:
            events.append({"ph": "C", "name": c.name, "pid": pid, "tid": c.tid, "ts": c.ts_ns / 1e3,
                           "args": {c.name: c.value}})
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": _jsonable(self.meta)}

    def save(self, path: str | Path) -> Path:
        """Write Chrome trace JSON (opens in ui.perfetto.dev)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a Chrome trace JSON written by save() (or any Chrome trace with X/B/E/C events)."""
        return cls.from_chrome(_read_json(path), source=str(path))

    @classmethod
    def from_chrome(cls, data: Any, source: str = "<dict>", ts_offset_ns: int = 0) -> "Trace":
        """Build a Trace from Chrome JSON; ts_offset_ns is added to every timestamp (clock alignment)."""
        if isinstance(data, list):
            data = {"traceEvents": data}
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise TraceFormatError(f"{source}: not a Chrome trace (expected a 'traceEvents' list)")
        trace = cls(meta=dict(data.get("otherData") or {}))
        open_spans: dict[tuple[int, str], list[dict]] = {}
        for i, event in enumerate(data["traceEvents"]):
            if not isinstance(event, dict) or "ph" not in event:
                raise TraceFormatError(f"{source}: traceEvents[{i}] has no 'ph' field")
            ph = event["ph"]
            tid = _tid(event.get("tid", 0))
            if ph == "M" and event.get("name") == "thread_name":
                trace.threads[tid] = str(event.get("args", {}).get("name", ""))
            elif ph == "X":
                trace.spans.append(_span_from(event, tid, ts_offset_ns, source, i))
            elif ph == "B":
                open_spans.setdefault((tid, event.get("name", "")), []).append(event)
            elif ph == "E":
                stack = open_spans.get((tid, event.get("name", "")))
                if stack:
                    begin = stack.pop()
                    begin = dict(begin, dur=float(event["ts"]) - float(begin["ts"]))
                    trace.spans.append(_span_from(begin, tid, ts_offset_ns, source, i))
            elif ph == "C":
                ts = _ns(event.get("ts"), source, i) + ts_offset_ns
                for name, value in (event.get("args") or {}).items():
                    label = event.get("name", name) if len(event.get("args", {})) == 1 else f"{event.get('name')}.{name}"
                    trace.counters.append(CounterEvent(label, ts, float(value), tid))
        trace.spans.sort(key=lambda s: (s.start_ns, -s.end_ns))
        trace.counters.sort(key=lambda c: c.ts_ns)
        return trace

    @classmethod
    def from_kineto(cls, path: str | Path, wall_offset_ns: int | None = None) -> "Trace":
        """Import a torch.profiler chrome trace. Kineto timestamps are wall-clock µs from
        baseTimeNanoseconds; with wall_offset_ns (time_ns() - perf_counter_ns(), as our Recorder stores
        it) they are moved onto our recorder's clock so both traces line up."""
        data = _read_json(path)
        if not isinstance(data, dict):
            raise TraceFormatError(f"{path}: not a torch.profiler trace (expected a JSON object)")
        base = int(data.get("baseTimeNanoseconds", 0))
        offset = base - (wall_offset_ns or 0)
        trace = cls.from_chrome(data, source=str(path), ts_offset_ns=offset)
        trace.meta.update(source="kineto", trace_file=str(path),
                          clock="perf_counter_ns" if wall_offset_ns is not None else "unix_ns")
        return trace

    def merged(self, other: "Trace") -> "Trace":
        """Both traces' spans and counters on one timeline (they must share a clock)."""
        spans = sorted(self.spans + other.spans, key=lambda s: (s.start_ns, -s.end_ns))
        counters = sorted(self.counters + other.counters, key=lambda c: c.ts_ns)
        return Trace(spans, counters, {**other.threads, **self.threads}, {**other.meta, **self.meta})


def _read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such trace file") from None
    except json.JSONDecodeError as err:
        raise TraceFormatError(f"{path}: not JSON ({err}); expected a Chrome trace") from None


def _span_from(event: dict, tid: int, offset: int, source: str, index: int) -> SpanEvent:
    args = dict(event.get("args") or {})
    cpu = args.pop(CPU_NS_KEY, None)
    start = _ns(event.get("ts"), source, index) + offset
    dur = _ns(event.get("dur", 0), source, index)
    return SpanEvent(str(event.get("name", "")), start, start + dur, tid, args,
                     cpu_ns=int(cpu) if cpu is not None else None, category=str(event.get("cat", "span")))


def _ns(us: Any, source: str, index: int) -> int:
    try:
        return round(float(us) * 1000)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{source}: traceEvents[{index}] has a non-numeric time {us!r}") from None


def _tid(tid: Any) -> int:
    try:
        return int(tid)
    except (TypeError, ValueError):
        return hash(tid) & 0x7FFFFFFF


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
