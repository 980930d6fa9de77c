"""Overlap on a GPU, across its streams: copies under computation, computation on two streams at once,
communication under computation (HTA's comm/compute overlap), for the whole trace and step by step.

Only GPU work counts (kernels, memcpy, memset). Host threads are not GPU streams: a CPU op and a kernel that
never overlap say nothing about the GIL, so nothing here pairs a thread with a stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infragent.analysis.gpu_steps import Step
from infragent.analysis.gpu_time import computation
from infragent.analysis.intervals import intersect, merge
from infragent.analysis.kernel_names import hta_kind
from infragent.analysis.kineto import DEVICE_COPY, Launches, category_mask, device_of, device_work
from infragent.analysis.trace_columns import TraceColumns


@dataclass
class DeviceOverlap:
    """One device's cross-stream overlap."""

    device: int
    streams: int
    copy_ns: int  # time with a memcpy/memset running
    copy_under_compute_ns: int  # ... while a computation kernel ran too
    compute_ns: int
    compute_concurrent_ns: int  # time with computation kernels on two or more streams at once
    comm_ns: int
    comm_under_compute_ns: int

    @property
    def copy_overlap_share(self) -> float | None:
        """Fraction of copy time hidden under computation (None without copies)."""
        return self.copy_under_compute_ns / self.copy_ns if self.copy_ns else None

    @property
    def comm_overlap_share(self) -> float | None:
        """Fraction of communication time hidden under computation (None without communication)."""
        return self.comm_under_compute_ns / self.comm_ns if self.comm_ns else None


@dataclass
class StepGpu:
    """One step on the GPU: its work's window, idle share, mode (eager or CUDA-graph replay) and copy overlap."""

    index: int
    name: str
    work: int
    mode: str  # graph (half its work or more from CUDA-graph replays) | eager | none
    window_ns: int
    busy_ns: int
    copy_ns: int
    copy_under_compute_ns: int

    @property
    def idle_share(self) -> float:
        """Idle fraction of the step's GPU window."""
        return 1 - self.busy_ns / self.window_ns if self.window_ns else 0.0

    @property
    def copy_overlap_share(self) -> float | None:
        """Fraction of the step's copy time under computation."""
        return self.copy_under_compute_ns / self.copy_ns if self.copy_ns else None


def _masks(c: TraceColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """GPU work, computation kernels, copies (memcpy/memset) and communication kernels."""
    work = device_work(c)
    comm_names = np.asarray([hta_kind(n) == "communication" for n in c.names] or [False])
    copies = work & (category_mask(c, DEVICE_COPY) | np.asarray([hta_kind(n) == "memory" for n in c.names]
                                                                or [False])[c.name])
    return work, computation(c, work), copies, work & comm_names[c.name] & ~copies


def device_overlaps(c: TraceColumns) -> list[DeviceOverlap]:
    """Per device: copy under computation, computation on several streams at once, communication under computation."""
    work, comp, copies, comm = _masks(c)
    device = device_of(c)[c.track] if len(c) else np.zeros(0, np.int64)
    result = []
    for d in sorted(set(device[work].tolist())):
        on = device == d
        computing = merge(c.start[comp & on], c.end[comp & on])
        copy = merge(c.start[copies & on], c.end[copies & on])
        talk = merge(c.start[comm & on], c.end[comm & on])
        result.append(DeviceOverlap(
            int(d), int(np.unique(c.track[work & on]).size), _len(copy), _len(intersect(copy, computing)),
            _len(computing), _concurrent(c, comp & on), _len(talk), _len(intersect(talk, computing))))
    return result


def comm_comp_overlap(c: TraceColumns) -> float:
    """HTA's communication/computation overlap: merged comm time that compute kernels overlap, as a percentage."""
    _, comp, _, comm = _masks(c)
    talk = merge(c.start[comm], c.end[comm])
    total = _len(talk)
    return 100.0 * _len(intersect(talk, merge(c.start[comp], c.end[comp]))) / total if total else 0.0


def step_gpu(c: TraceColumns, steps: list[Step], launched: Launches) -> list[StepGpu]:
    """Each step's GPU window, idle share, mode and copy overlap (computation from any step counts)."""
    work, comp, copies, _ = _masks(c)
    computing = merge(c.start[comp], c.end[comp])
    result = []
    for s in steps:
        rows = s.work
        if not rows.size:
            result.append(StepGpu(s.index, s.name, 0, "none", 0, 0, 0, 0))
            continue
        mode = "graph" if launched.graph[rows].mean() >= 0.5 else "eager"  # a replay may copy its inputs eagerly
        mine = rows[copies[rows]]
        copy = merge(c.start[mine], c.end[mine])
        result.append(StepGpu(s.index, s.name, int(rows.size), mode, int(c.end[rows].max() - c.start[rows].min()),
                              _len(merge(c.start[rows], c.end[rows])), _len(copy), _len(intersect(copy, computing))))
    return result


def _concurrent(c: TraceColumns, mask: np.ndarray) -> int:
    """Time during which two or more streams run selected work at once."""
    spans = [merge(c.start[mask & (c.track == t)], c.end[mask & (c.track == t)]) for t in np.unique(c.track[mask])]
    if len(spans) < 2:
        return 0
    times = np.concatenate([x for s, e in spans for x in (s, e)])
    deltas = np.concatenate([x for s, e in spans for x in (np.ones(s.size, np.int64), -np.ones(e.size, np.int64))])
    order = np.lexsort((deltas, times))
    times, running = times[order], np.cumsum(deltas[order])
    return int((np.diff(times) * (running[:-1] >= 2)).sum())


def _len(intervals: tuple[np.ndarray, np.ndarray]) -> int:
    return int((intervals[1] - intervals[0]).sum())
