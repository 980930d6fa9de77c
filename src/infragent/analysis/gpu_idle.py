"""Why a GPU sat idle: every gap explained by what the GPU was waiting for, from the launch → work correlation.

A gap ends when the next piece of work starts. Its launch call (found by correlation id) says why it started
then and not earlier:
- "host": the call that launched it had not returned when the gap began (no launch was pending): the GPU
  waited on the host. The host's side of that time is split by what the launching thread did: in a sync call
  (cudaDeviceSynchronize, cudaStreamSynchronize, a blocking cudaMemcpy...), in launch calls (cuda_runtime and
  cuda_driver calls, the launch of this very work included), or in Python and framework code (the rest).
- "another stream" (a stream's own gaps only): the work was pending, and it started within DEPENDENCY_SLACK_NS
  of work on another stream of the same device ending: a cross-stream dependency (an event wait).
- "other": the work was pending and nothing on the trace explains the wait (launch latency, a wait on an
  event the host records later, or the launch is not in the trace).
Device gaps (no work on any stream) are the idle time of the temporal breakdown (there, "another stream"
means the gap began when work on another stream ended and lasted at most the slack); stream gaps are each
stream's own, as HTA's idle-time breakdown counts them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import exclusive
from infragent.analysis.intervals import covered, merge
from infragent.analysis.kernel_names import short_name
from infragent.analysis.kineto import (HOST_CALLS, HOST_CODE, SYNC_CALL, Launches, category_mask, device_of, device_work,
                                       launches, stream_name)
from infragent.analysis.trace_columns import TraceColumns

DEPENDENCY_SLACK_NS = 10_000
CAUSES = ("host", "another stream", "other")
HOST_PARTS = ("python/cpu", "launch", "sync")


@dataclass
class Gap:
    """One idle interval and what ended it."""

    start_ns: int
    end_ns: int
    cause: str
    next_work: str  # short name of the work that ended the gap


@dataclass
class StreamIdle:
    """A stream's own gaps, by cause."""

    stream: str
    active_ns: int  # its first work start to its last work end
    idle_ns: int
    by_cause: dict[str, int]


@dataclass
class LaunchStats:
    """How work reached the GPU: launch → start lag, work sizes, host time between launches, CUDA graphs."""

    work: int  # pieces of GPU work
    launched: int  # ... whose launch call is known
    eager: int  # launched one by one
    graph: int  # run by CUDA-graph replays
    graph_launches: int
    median_lag_ns: float | None  # eager work: launch call start → work start
    p90_lag_ns: float | None
    median_kernel_ns: float | None  # kernels only
    median_launch_call_ns: float | None  # eager launch calls' own duration
    median_host_interval_ns: float | None  # between consecutive launch calls (graph replays too) on the main thread
    median_work_per_launch_ns: float | None = None  # GPU work time one launch call started (a replay: all of it)


@dataclass
class DeviceIdle:
    """One device's idle time explained."""

    device: int
    window_ns: int
    idle_ns: int
    by_cause: dict[str, int]
    host_parts: dict[str, int]  # the host-caused idle split by what the launching thread did
    after_sync_ns: int = 0  # host-caused idle in gaps that began while the launching thread sat in a sync call
    host_ops: list[tuple[str, int]] = field(default_factory=list)  # host ops' own time inside host-caused gaps
    largest: list[Gap] = field(default_factory=list)
    streams: list[StreamIdle] = field(default_factory=list)
    launch: LaunchStats | None = None

    @property
    def idle_share(self) -> float:
        """Idle fraction of the window."""
        return self.idle_ns / self.window_ns if self.window_ns else 0.0

    def cause_share(self, cause: str) -> float:
        """Fraction of the idle time with this cause."""
        return self.by_cause.get(cause, 0) / self.idle_ns if self.idle_ns else 0.0


def gpu_idle(c: TraceColumns, launched: Launches | None = None, keep: int = 5) -> list[DeviceIdle]:
    """Per device: idle gaps by cause, the host's side of them, each stream's gaps, and launch statistics."""
    work = device_work(c)
    launched = launches(c, work) if launched is None else launched
    device = device_of(c)[c.track] if len(c) else np.zeros(0, np.int64)
    sync = _sync_calls(c)
    result = []
    for d in sorted(set(device[work].tolist())):
        rows = np.flatnonzero(work & (device == d))
        rows = rows[np.lexsort((c.track[rows], c.start[rows]))]
        g0, g1, nxt, prev = _gaps(c, rows)
        after_other = (c.track[prev] != c.track[nxt]) & (g1 - g0 <= DEPENDENCY_SLACK_NS)
        cause = _causes(c, g0, g1, nxt, launched, sync, after_other)
        parts, after_sync, ops = _host_parts(c, g0[cause == "host"], g1[cause == "host"],
                                             launched.launch[nxt[cause == "host"]], sync)
        window = int(c.end[rows].max() - c.start[rows].min())
        order = np.argsort(-(g1 - g0), kind="stable")[:keep]
        largest = [Gap(int(g0[i]), int(g1[i]), str(cause[i]), short_name(c.names[c.name[nxt[i]]])) for i in order]
        result.append(DeviceIdle(int(d), window, int((g1 - g0).sum()), _sums(g1 - g0, cause, CAUSES), parts,
                                 after_sync, ops, largest, _streams(c, rows, launched, sync),
                                 launch_stats(c, rows, launched)))
    return result


def _gaps(c: TraceColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaps between the merged intervals of rows (sorted by start): their bounds, the row that ends each and
    the row whose end began it."""
    if rows.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    end = c.end[rows]
    reach = np.maximum.accumulate(end)
    reached_by = np.maximum.accumulate(np.where(end >= reach, np.arange(rows.size), 0))
    new = np.flatnonzero(c.start[rows][1:] > reach[:-1]) + 1
    return reach[new - 1], c.start[rows][new], rows[new], rows[reached_by[new - 1]]


def _sync_calls(c: TraceColumns) -> np.ndarray:
    """Mask of host calls that wait for the GPU."""
    syncing = np.asarray([bool(SYNC_CALL.search(s)) for s in c.names] or [False])
    return category_mask(c, HOST_CALLS) & syncing[c.name] if len(c) else np.zeros(0, bool)


def _causes(c: TraceColumns, g0: np.ndarray, g1: np.ndarray, nxt: np.ndarray, launched: Launches,
            sync: np.ndarray, after_other: np.ndarray) -> np.ndarray:
    """The cause of each gap (see the module doc); after_other: the gap ended right after work on another stream."""
    cause = np.full(g0.size, "other", dtype=object)
    call = launched.launch[nxt]
    known = call >= 0
    safe = np.maximum(call, 0)
    blocking = sync[safe]  # a blocking copy's call covers the copy itself: it was pending once the call began
    pending = known & np.where(blocking, c.start[safe] < g0, c.end[safe] <= g0)
    cause[known & ~pending] = "host"
    cause[pending & after_other] = "another stream"
    return cause


def _host_parts(c: TraceColumns, g0: np.ndarray, g1: np.ndarray, calls: np.ndarray,
                sync: np.ndarray) -> tuple[dict[str, int], int, list[tuple[str, int]]]:
    """Host-caused idle split by what the launching thread did (sync calls, launch calls, Python/CPU code); the
    part of it in gaps that began inside a sync call (the host drained the queue, then had to refill it); and the
    host ops that held the thread meanwhile, by their own time inside those gaps, largest first."""
    parts = dict.fromkeys(HOST_PARTS, 0)
    after_sync = 0
    ops: dict[str, float] = {}
    api = category_mask(c, HOST_CALLS)
    code = category_mask(c, HOST_CODE)
    own = exclusive(c) if calls.size else np.zeros(0, np.int64)
    for thread in np.unique(c.track[calls]).tolist():
        mine = c.track[calls] == thread
        a, b, call = g0[mine], g1[mine], calls[mine]
        before = np.clip(c.start[call], a, b)  # from the gap's start to the launch call: what was the thread doing?
        on = c.track == thread
        in_sync = covered(a, before, merge(c.start[sync & on], c.end[sync & on]))
        in_api = covered(a, before, merge(c.start[api & ~sync & on], c.end[api & ~sync & on]))
        parts["sync"] += int(in_sync.sum())
        parts["launch"] += int(np.minimum(in_api, before - a - in_sync).sum() + (b - before).sum())
        parts["python/cpu"] += int(np.maximum(before - a - in_sync - in_api, 0).sum())
        began_in_sync = covered(a, a + 1, merge(c.start[sync & on], c.end[sync & on])) > 0
        after_sync += int((b - a)[began_in_sync].sum())
        rows = np.flatnonzero(code & on)
        inside = covered(c.start[rows], c.end[rows], merge(a, before))
        share = inside / np.maximum(c.end[rows] - c.start[rows], 1)
        for name, ns in zip(c.name[rows].tolist(), (own[rows] * share).tolist()):
            ops[c.names[name]] = ops.get(c.names[name], 0.0) + ns
    top = sorted(((k, int(v)) for k, v in ops.items() if v >= 1), key=lambda kv: -kv[1])[:5]
    return parts, after_sync, top


def _streams(c: TraceColumns, rows: np.ndarray, launched: Launches, sync: np.ndarray) -> list[StreamIdle]:
    """Each stream's own gaps by cause (another stream's work ending just before counts as a dependency)."""
    result = []
    for t in np.unique(c.track[rows]).tolist():
        mine = rows[c.track[rows] == t]
        others = np.sort(c.end[rows[c.track[rows] != t]])
        g0, g1, nxt, _ = _gaps(c, mine)
        i = np.searchsorted(others, g1, side="right") - 1
        last = others[np.maximum(i, 0)] if others.size else g0
        after_other = (i >= 0) & (last >= g0) & (g1 - last <= DEPENDENCY_SLACK_NS)
        cause = _causes(c, g0, g1, nxt, launched, sync, after_other)
        active = int(c.end[mine].max() - c.start[mine].min())
        result.append(StreamIdle(stream_name(c, t), active, int((g1 - g0).sum()), _sums(g1 - g0, cause, CAUSES)))
    return result


def launch_stats(c: TraceColumns, rows: np.ndarray, launched: Launches) -> LaunchStats:
    """Launch → start lag, work durations, host time between launches, graph replays, for the given work rows."""
    call = launched.launch[rows]
    known = call >= 0
    graph = launched.graph[rows] & known
    eager = known & ~graph
    lag = (c.start[rows] - c.start[np.maximum(call, 0)])[eager]
    kernels = rows[np.asarray([c.cats[k] == "kernel" for k in c.cat[rows]], bool)] if rows.size else rows
    calls, per_call = np.unique(call[known], return_inverse=True)
    work_per_call = np.bincount(per_call.ravel(), weights=(c.end - c.start)[rows[known]], minlength=calls.size)
    interval = None
    if calls.size > 1:
        main = np.bincount(c.track[calls]).argmax()
        starts = np.sort(c.start[calls[c.track[calls] == main]])
        interval = _median(np.diff(starts))
    eager_calls = np.unique(call[eager])
    return LaunchStats(int(rows.size), int(known.sum()), int(eager.sum()), int(graph.sum()),
                       int(np.unique(call[graph]).size), _median(lag), _pct(lag, 90),
                       _median((c.end - c.start)[kernels]), _median((c.end - c.start)[eager_calls]), interval,
                       _median(work_per_call))


def _sums(dur: np.ndarray, labels: np.ndarray, keys: tuple[str, ...]) -> dict[str, int]:
    return {k: int(dur[labels == k].sum()) for k in keys}


def _median(x: np.ndarray) -> float | None:
    return float(np.median(x)) if x.size else None


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None
