"""Join GIL measurements to trace spans: per thread and span name, how long it held the GIL and waited for it.

Inputs: a Trace recorded with thread CPU time per span (Recorder(thread_cpu=True)) and, as counters,
cumulative per-thread schedstat values (sched.cpu_ns/<tid>, sched.run_delay_ns/<tid>) and windowed
gilknocker values (gil.contention), as probes/gil_child.py writes them; optionally py-spy --gil samples.

  waited  = wall - on-CPU - run-queue wait, inside the spans: time the thread was off CPU and not
            runnable. Inside non-blocking work (no I/O, sleeps or locks) that is time blocked on the GIL.
  held    = py-spy --gil samples of the thread x sample period. py-spy's outputs carry no per-sample
            timestamps (its chrometrace merges a thread's samples across the ticks where it did not hold
            the GIL), so held time is measured per thread and spread over its spans in proportion to
            the time the thread was on CPU or runnable in them: a thread can hold the GIL only then.
"""
from __future__ import annotations

import bisect
import re
import sysconfig
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from infragent.trace_model import SpanEvent, Trace

RUN_DELAY = "sched.run_delay_ns/"
CPU = "sched.cpu_ns/"
CONTENTION = "gil.contention"
WAITING_FRAME = "sched.waiting_frame/"  # 1/0 per tick: the thread's frame was in a lock, queue or join
WORKLOAD_FRAME = "_run_workload"  # the child's frame around the workload call on the main thread
_NOT_USER = ("site-packages", "dist-packages", "<frozen", str(Path(__file__).resolve().parents[1]))  # ours too
_STDLIB = sysconfig.get_paths()["stdlib"]
_THREAD_PROFILE = re.compile(r'^Thread (\d+)(?: "(.*)")?$')


@dataclass
class HeldSamples:
    """py-spy --gil samples of one thread: how often and how long it held the GIL."""

    tid: int
    name: str
    samples: int
    held_ns: int
    functions: dict[str, int] = field(default_factory=dict)  # 'function (file:line)' -> samples holding

    def top_function(self) -> str | None:
        """The function this thread was in most often while it held the GIL."""
        return max(self.functions, key=self.functions.__getitem__) if self.functions else None


def parse_speedscope(data: dict[str, Any], main_tid: int | None = None,
                     workload_frame: str = WORKLOAD_FRAME) -> dict[int, HeldSamples]:
    """Held samples per native thread id from py-spy's speedscope JSON ('Thread <tid> "<name>"' profiles).

    On main_tid only samples inside workload_frame count (the rest is interpreter start-up and imports).
    """
    frames = data.get("shared", {}).get("frames", [])
    marker = {i for i, f in enumerate(frames) if f.get("name") == workload_frame}
    held: dict[int, HeldSamples] = {}
    for profile in data.get("profiles", []):
        match = _THREAD_PROFILE.match(str(profile.get("name", "")))
        if not match:
            continue
        tid = int(match.group(1))
        samples, weights = profile.get("samples", []), profile.get("weights", [])
        keep = [i for i, stack in enumerate(samples) if tid != main_tid or marker.intersection(stack)]
        seconds = sum(float(weights[i]) for i in keep if i < len(weights))
        functions: dict[str, int] = defaultdict(int)
        for i in keep:
            functions[_user_frame(frames, samples[i])] += 1
        held[tid] = HeldSamples(tid, match.group(2) or "", len(keep), round(seconds * 1e9), dict(functions))
    return held


def _user_frame(frames: list[dict[str, Any]], stack: list[int]) -> str:
    """'function (file:line)' of the innermost frame of a stack in the user's code (not the standard library,
    an installed package or infragent), else of the innermost frame."""
    def label(f: dict[str, Any]) -> str:
        return f"{f.get('name', '?')} ({Path(str(f.get('file', '?'))).name}:{f.get('line', '?')})"

    chosen = [frames[i] for i in stack if 0 <= i < len(frames)]
    for f in reversed(chosen):
        path = str(f.get("file", ""))
        if path and not any(part in path for part in _NOT_USER) and not path.startswith(_STDLIB):
            return label(f)
    return label(chosen[-1]) if chosen else "?"


@dataclass
class Series:
    """A sampled cumulative (or windowed) counter of one thread: timestamps and values, time-ordered."""

    ts: list[int]
    values: list[float]

    def at(self, t: int) -> float:
        """Value at time t by linear interpolation, held flat outside the sampled range."""
        i = bisect.bisect_left(self.ts, t)
        if i == 0:
            return self.values[0]
        if i == len(self.ts):
            return self.values[-1]
        t0, t1, v0, v1 = self.ts[i - 1], self.ts[i], self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1

    def delta(self, start: int, end: int) -> float:
        """Increase of a cumulative counter between start and end."""
        return self.at(end) - self.at(start)


def per_thread_series(trace: Trace, prefix: str) -> dict[int, Series]:
    """Counters named prefix<tid>, one Series per thread id."""
    points: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for c in trace.counters:
        if c.name.startswith(prefix):
            try:
                points[int(c.name[len(prefix):])].append((c.ts_ns, c.value))
            except ValueError:
                continue
    out = {}
    for tid, pts in points.items():
        pts.sort()
        out[tid] = Series([t for t, _ in pts], [v for _, v in pts])
    return out


def thread_activity_ns(trace: Trace) -> dict[int, float]:
    """On-CPU plus run-queue time of each thread over the recording (when it could have held the GIL).

    A thread first seen after the sampler's first tick started during the recording, from zero.
    """
    cpu, delay = per_thread_series(trace, CPU), per_thread_series(trace, RUN_DELAY)
    if not cpu:
        return {}
    first_tick = min(s.ts[0] for s in cpu.values())
    tick = int(trace.meta.get("sample_interval_ns", 0))
    out = {}
    for tid, series in cpu.items():
        other = delay.get(tid)
        total = series.values[-1] + (other.values[-1] if other else 0.0)
        if series.ts[0] <= first_tick + tick // 2:  # alive at the start: count only the recording
            total -= series.values[0] + (other.values[0] if other else 0.0)
        out[tid] = total
    return out


def top_level(spans: Iterable[SpanEvent]) -> list[SpanEvent]:
    """The spans not nested in another span of the same thread (so their times do not double count)."""
    out: list[SpanEvent] = []
    end_by_tid: dict[int, int] = {}
    for s in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        if s.start_ns >= end_by_tid.get(s.tid, -1):
            out.append(s)
            end_by_tid[s.tid] = s.end_ns
    return out


def window_mean(trace: Trace, name: str, spans: list[SpanEvent]) -> float | None:
    """Time-weighted mean of a windowed counter (each value covers the time since the previous one)
    over the spans' intervals; None when no window overlaps them."""
    points = sorted((c.ts_ns, c.value) for c in trace.counters if c.name == name)
    if not points:
        return None
    start = int(trace.meta.get("start_ns", points[0][0]))
    windows = [(max(start, points[i - 1][0]) if i else start, t, v) for i, (t, v) in enumerate(points)]
    ends = [w[1] for w in windows]
    total = weight = 0.0
    for s in spans:
        for i in range(bisect.bisect_left(ends, s.start_ns), len(windows)):
            w0, w1, v = windows[i]
            if w0 >= s.end_ns:
                break
            overlap = min(w1, s.end_ns) - max(w0, s.start_ns)
            if overlap > 0:
                total += v * overlap
                weight += overlap
    return total / weight if weight else None


@dataclass
class ShareRow:
    """GIL shares of one thread over a group of its spans (one span name, or all its top-level spans)."""

    thread: str
    tid: int
    span: str
    spans: int
    wall_ns: int
    cpu_ns: int
    run_queue_ns: float | None  # None when schedstat was not sampled
    waited_ns: float
    held_ns: float | None  # None without py-spy
    contention: float | None  # gilknocker, process-wide, while these spans ran

    @property
    def on_cpu_share(self) -> float:
        """Fraction of the spans' wall time the thread was on CPU."""
        return self.cpu_ns / self.wall_ns if self.wall_ns else 0.0

    @property
    def waited_share(self) -> float:
        """Fraction of the spans' wall time the thread was blocked (waiting for the GIL)."""
        return self.waited_ns / self.wall_ns if self.wall_ns else 0.0

    @property
    def held_share(self) -> float | None:
        """Fraction of the spans' wall time the thread held the GIL (None without py-spy)."""
        if self.held_ns is None or not self.wall_ns:
            return None
        return self.held_ns / self.wall_ns

    def to_dict(self) -> dict[str, Any]:
        """Plain data, shares included."""
        return {**asdict(self), "on_cpu_share": self.on_cpu_share, "waited_share": self.waited_share,
                "held_share": self.held_share}


def _row(trace: Trace, tid: int, label: str, spans: list[SpanEvent], run_delay: dict[int, Series],
         activity: dict[int, float], held: dict[int, HeldSamples] | None) -> ShareRow:
    wall = sum(s.dur_ns for s in spans)
    cpu = sum(s.cpu_ns or 0 for s in spans)
    series = run_delay.get(tid)
    queue = sum(series.delta(s.start_ns, s.end_ns) for s in spans) if series else None
    # clamped over the group, not per span: run-queue wait is interpolated between samples, so per span
    # it is spread evenly and clamping each span would bias waited time upwards
    waited = max(0.0, wall - cpu - (queue or 0.0))
    held_ns = None
    if held is not None:
        thread_held = held[tid].held_ns if tid in held else 0
        busy = cpu + (queue or 0.0)
        total = activity.get(tid) or busy  # without schedstat: all of the thread's holding is in spans
        held_ns = min(float(wall), thread_held * min(1.0, busy / total)) if total else 0.0
    return ShareRow(trace.thread_name(tid), tid, label, len(spans), wall, cpu, queue, waited, held_ns,
                    window_mean(trace, CONTENTION, spans))


def _timed_spans(trace: Trace) -> list[SpanEvent]:
    return [s for s in trace.spans if s.cpu_ns is not None and s.dur_ns > 0]


def span_rows(trace: Trace, held: dict[int, HeldSamples] | None = None) -> list[ShareRow]:
    """One row per (thread, span name), nested spans included; most waited time first."""
    groups: dict[tuple[int, str], list[SpanEvent]] = defaultdict(list)
    for s in _timed_spans(trace):
        groups[(s.tid, s.name)].append(s)
    run_delay, activity = per_thread_series(trace, RUN_DELAY), thread_activity_ns(trace)
    rows = [_row(trace, tid, name, spans, run_delay, activity, held) for (tid, name), spans in groups.items()]
    return sorted(rows, key=lambda r: -r.waited_ns)


def thread_rows(trace: Trace, held: dict[int, HeldSamples] | None = None) -> list[ShareRow]:
    """One row per thread over its top-level spans; largest waited share first."""
    groups: dict[int, list[SpanEvent]] = defaultdict(list)
    for s in top_level(_timed_spans(trace)):
        groups[s.tid].append(s)
    run_delay, activity = per_thread_series(trace, RUN_DELAY), thread_activity_ns(trace)
    rows = [_row(trace, tid, "+".join(sorted({s.name for s in spans})), spans, run_delay, activity, held)
            for tid, spans in groups.items()]
    return sorted(rows, key=lambda r: -r.waited_share)


def waited_windows(trace: Trace, tid: int, most: int = 20) -> list[float]:
    """The thread's waited share (wall - CPU - run queue over wall) in up to `most` consecutive groups of its
    top-level spans, about equally many spans each: the samples of an interval for its waited share."""
    spans = sorted((s for s in top_level(_timed_spans(trace)) if s.tid == tid), key=lambda s: s.start_ns)
    series = per_thread_series(trace, RUN_DELAY).get(tid)
    shares = []
    for group in np.array_split(np.arange(len(spans)), min(most, len(spans))) if spans else []:
        chosen = [spans[i] for i in group]
        wall = sum(s.dur_ns for s in chosen)
        queue = sum(series.delta(s.start_ns, s.end_ns) for s in chosen) if series else 0.0
        waited = wall - sum(s.cpu_ns or 0 for s in chosen) - queue
        if wall > 0:
            shares.append(min(max(waited / wall, 0.0), 1.0))
    return shares


def starving_thread(rows: list[ShareRow], threshold: float) -> ShareRow | None:
    """The thread row with the largest waited share, if that share exceeds threshold."""
    worst = max(rows, key=lambda r: r.waited_share, default=None)
    return worst if worst is not None and worst.waited_share > threshold else None


def span_records(trace: Trace) -> list[dict[str, Any]]:
    """Every timed span with its on-CPU, run-queue and waited time (ms), for the evidence file.

    Run-queue wait per span is interpolated from samples a few ms apart, so single spans are approximate;
    waited_ms here is wall - cpu - run queue, unclamped (it can be slightly negative).
    """
    run_delay = per_thread_series(trace, RUN_DELAY)
    out = []
    for s in _timed_spans(trace):
        series = run_delay.get(s.tid)
        queue = series.delta(s.start_ns, s.end_ns) if series else 0.0
        out.append({"thread": trace.thread_name(s.tid), "span": s.name, "start_ms": s.start_ns / 1e6,
                    "wall_ms": s.dur_ns / 1e6, "cpu_ms": (s.cpu_ns or 0) / 1e6, "run_queue_ms": queue / 1e6,
                    "waited_ms": (s.dur_ns - (s.cpu_ns or 0) - queue) / 1e6})
    return out
