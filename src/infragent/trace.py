"""Spans and counters: a near-zero-cost no-op until a Recorder is active; per-thread buffers.

    with span("decode", tokens=32): ...        # context manager
    @span("sample")                             # decorator (checks for a recorder at each call)
    counter("kv_blocks_used", 118)
    with Recorder() as rec: run(); rec.trace().save("trace.json")   # Chrome trace, opens in Perfetto

Leaf module: imports nothing of ours. The Trace model, Chrome export/import and the PyTorch-profiler
(Kineto) importer live in trace_model.py.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable

from infragent.trace_model import CounterEvent, SpanEvent, Trace

_recorder: "Recorder | None" = None
_perf_ns = time.perf_counter_ns
_cpu_ns = time.thread_time_ns


class _NullSpan(tuple):
    """What span() returns when nothing records: the tuple (name, attrs).

    __enter__/__exit__ are static (no bound-method object is made per `with`, which halves their cost), and
    __exit__ returns None so exceptions propagate; being a tuple, it is built without a Python __init__.
    Called as a decorator it wraps the function so that a recorder started later still sees it.
    """

    __slots__ = ()
    __enter__ = staticmethod(lambda: None)
    __exit__ = staticmethod(lambda exc_type, exc, traceback: None)

    def __call__(self, fn: Callable) -> Callable:
        return _decorate(fn, self[0], self[1])


_null_by_name: dict[str, _NullSpan] = {}


class _Span:
    """An open span of the active recorder (wall time only)."""

    __slots__ = ("buffer", "name", "attrs", "start", "cpu")

    def __init__(self, buffer: list, name: str, attrs: dict[str, Any]) -> None:
        self.buffer, self.name, self.attrs = buffer, name, attrs

    def __enter__(self) -> "_Span":
        self.start = _perf_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.buffer.append((self.name, self.start, _perf_ns(), None, self.attrs))

    def __call__(self, fn: Callable) -> Callable:
        return _decorate(fn, self.name, self.attrs)


class _CpuSpan(_Span):
    """An open span that also records the thread's CPU time inside it (for GIL and off-CPU analysis)."""

    __slots__ = ()

    def __enter__(self) -> "_CpuSpan":
        self.cpu = _cpu_ns()
        self.start = _perf_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        end = _perf_ns()
        self.buffer.append((self.name, self.start, end, _cpu_ns() - self.cpu, self.attrs))


def span(name: str, **attrs: Any) -> Any:
    """A timed interval named `name` with attributes; a context manager or a decorator."""
    recorder = _recorder
    if recorder is None:
        if attrs:
            return _NullSpan((name, attrs))
        try:
            return _null_by_name[name]  # one shared null object per name: no allocation
        except KeyError:
            return _null_by_name.setdefault(name, _NullSpan((name, {})))
    return recorder.span_type(recorder._thread_buffers()[0], name, attrs)


def _decorate(fn: Callable, name: str, attrs: dict[str, Any]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is None:
            return fn(*args, **kwargs)
        with recorder.span_type(recorder._thread_buffers()[0], name, attrs):
            return fn(*args, **kwargs)
    return wrapper


def counter(name: str, value: float) -> None:
    """Record a sampled value (queue depth, blocks in use) at this instant, if recording."""
    recorder = _recorder
    if recorder is not None:
        recorder._thread_buffers()[1].append((name, _perf_ns(), float(value)))


def recording() -> bool:
    """Whether a recorder is active."""
    return _recorder is not None


class Recorder:
    """Collects spans and counters from every thread between start() and stop(); one active at a time.

    With thread_cpu=True each span also records the CPU time its thread used inside it (one more
    clock syscall per edge); the GIL probe needs that, plain timing does not.
    """

    def __init__(self, thread_cpu: bool = False) -> None:
        self.span_type = _CpuSpan if thread_cpu else _Span
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: list[tuple[int, str, list, list]] = []  # (tid, name, spans, counters)
        self.start_ns = self.stop_ns = self.wall_offset_ns = 0

    def start(self) -> "Recorder":
        """Begin recording; raises if another recorder is already active."""
        global _recorder
        if _recorder is not None:
            raise RuntimeError("a trace Recorder is already recording; stop it before starting another")
        self.start_ns = _perf_ns()
        self.wall_offset_ns = time.time_ns() - _perf_ns()  # lines up wall-clock traces (Kineto, py-spy)
        _recorder = self
        return self

    def stop(self) -> "Recorder":
        """Stop recording (buffers stay readable)."""
        global _recorder
        if _recorder is self:
            _recorder = None
        self.stop_ns = _perf_ns()
        return self

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_buffers(self) -> tuple[list, list]:
        """This thread's (spans, counters) lists, created and registered on first use."""
        try:
            return self._local.buffers
        except AttributeError:
            buffers: tuple[list, list] = ([], [])
            self._local.buffers = buffers
            with self._lock:
                self._threads.append((threading.get_native_id(), threading.current_thread().name, *buffers))
            return buffers

    def trace(self) -> Trace:
        """Everything recorded so far, as a Trace (spans sorted by start time)."""
        spans: list[SpanEvent] = []
        counters: list[CounterEvent] = []
        threads: dict[int, str] = {}
        with self._lock:
            buffers = list(self._threads)
        for tid, thread_name, span_buffer, counter_buffer in buffers:
            threads[tid] = thread_name
            spans.extend(SpanEvent(name, start, end, tid, dict(attrs), cpu_ns=cpu)
                         for name, start, end, cpu, attrs in list(span_buffer))
            counters.extend(CounterEvent(name, ts, value, tid) for name, ts, value in list(counter_buffer))
        spans.sort(key=lambda s: (s.start_ns, -s.end_ns))
        counters.sort(key=lambda c: c.ts_ns)
        return Trace(spans=spans, counters=counters, threads=threads,
                     meta={"clock": "perf_counter_ns", "start_ns": self.start_ns, "stop_ns": self.stop_ns,
                           "wall_offset_ns": self.wall_offset_ns, "pid": os.getpid()})
