"""GPU time per device: the temporal breakdown (idle, compute, non-compute) over the device's own window.

Definitions (one device, all its streams together):
- window: from the first GPU work's start to the last one's end (work = kernel, memcpy, memset; a
  `gpu_user_annotation` range is not work);
- idle: time in the window with no work on any stream;
- compute: time covered by computation kernels (HTA's class: not NCCL, not Memcpy/Memset, not `*Sync*`);
- non-compute: time covered by other work (copies, memsets, communication) and by no computation kernel.
The three add up to the window. These are HTA's definitions, on exact timestamps: HTA 0.5 rounds each ts and
dur down to whole µs, so its kernels shrink (up to 1 µs each, a lot for a 5 µs kernel) and its idle grows;
on traces with overlapping work its non-compute can come out negative, and it asserts (crashes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infragent.analysis.intervals import merge
from infragent.analysis.kernel_names import hta_kind
from infragent.analysis.kineto import DEVICE_COPY, category_mask, device_of, device_work
from infragent.analysis.trace_columns import TraceColumns


@dataclass
class TemporalBreakdown:
    """One device's (or several devices' summed) window split into idle, compute and non-compute time."""

    kernel_ns: int  # the window: first work start to last work end (HTA's "kernel time")
    idle_ns: int
    compute_ns: int
    non_compute_ns: int
    device: int = -1  # -1: all devices summed

    def pct(self, part: str) -> float:
        """Percentage of the window."""
        return 100.0 * getattr(self, f"{part}_ns") / self.kernel_ns if self.kernel_ns else 0.0


def computation(c: TraceColumns, work: np.ndarray | None = None) -> np.ndarray:
    """Mask of computation kernels (HTA's class) among GPU work."""
    work = device_work(c) if work is None else work
    computing = np.asarray([hta_kind(n) == "computation" for n in c.names] or [False])
    return work & computing[c.name] & ~category_mask(c, DEVICE_COPY)


def device_breakdowns(c: TraceColumns) -> list[TemporalBreakdown]:
    """The temporal breakdown of each device that ran work, by device index."""
    work = device_work(c)
    comp = computation(c, work)
    device = device_of(c)[c.track] if len(c) else np.zeros(0, np.int64)
    result = []
    for d in sorted(set(device[work].tolist())):
        on = device == d
        busy_s, busy_e = merge(c.start[work & on], c.end[work & on])
        window = int(busy_e[-1] - busy_s[0])
        idle = window - int((busy_e - busy_s).sum())
        cs, ce = merge(c.start[comp & on], c.end[comp & on])
        compute = int((ce - cs).sum())
        result.append(TemporalBreakdown(window, idle, compute, window - compute - idle, int(d)))
    return result


def temporal_breakdown(c: TraceColumns) -> TemporalBreakdown:
    """Idle, compute and non-compute GPU time, summed over devices (each over its own window)."""
    parts = device_breakdowns(c)
    if len(parts) == 1:
        return parts[0]
    return TemporalBreakdown(*(sum(getattr(p, f) for p in parts)
                               for f in ("kernel_ns", "idle_ns", "compute_ns", "non_compute_ns")))
