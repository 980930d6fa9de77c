"""GIL shares of whole threads, for workloads with no spans: where each Python thread's time went, window by
window over its life, from the child's samples (probes/gil_child.py).

Per window of a thread's life (wall time):
  on CPU      = schedstat on-CPU time
  run queue   = schedstat run-queue wait (runnable, no free core: the machine, not the GIL)
  off CPU     = wall - on CPU - run queue: asleep, for the GIL or for anything else
  GIL wait    = off CPU x the share of its sleep the thread spent on a futex outside a waiting frame: the
                parent samples each thread's state from outside (probes/thread_states.py: futex or other
                sleep, never biased by holding the GIL), the child's sampler says how often the thread's frame
                was in a lock, condition, queue or join (a futex sleep that is not the GIL)
  blocked     = off CPU - GIL wait: a timer, I/O, a lock, a queue, a join
  unseen      = the part of blocked in windows where the parent never saw the thread asleep: nothing tells
                GIL wait from blocking there, so a large unseen share makes a pass unfounded
  native wait = the part of that futex sleep no holder covers: a thread can wait for the GIL only while
                another holds it, so with py-spy's held times a thread's GIL wait is capped at the other
                threads' held time, and the rest is a futex wait outside the GIL (a BLAS or OpenMP pool's
                synchronization, a native lock)
The starvation share is a thread's GIL-wait share; its 95% t interval over the windows is what a verdict
rests on, so one run near the threshold reads as inconclusive rather than flipping. Held time and the
function a thread held the GIL in come from py-spy --gil samples (analysis/gil_shares.parse_speedscope).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infragent.analysis.gil_shares import CPU, RUN_DELAY, WAITING_FRAME, HeldSamples, Series, per_thread_series
from infragent.analysis.stats import t_interval
from infragent.trace_model import Trace

WINDOW_NS = 100_000_000  # about 100 ms per window, between MIN_WINDOWS and MAX_WINDOWS of them
MIN_WINDOWS = 4
MAX_WINDOWS = 20
CONFIDENCE = 0.95
PARTS = ("gil_wait", "run_queue", "blocked")  # the ways a thread spends time off CPU


@dataclass
class ThreadShares:
    """One thread's life split into on-CPU, run-queue, blocked and GIL-wait time, with per-window shares."""

    thread: str
    tid: int
    wall_ns: float
    cpu_ns: float
    run_queue_ns: float
    blocked_ns: float
    gil_wait_ns: float
    held_ns: float | None  # py-spy; None without it
    function: str | None  # where it held the GIL most often (py-spy)
    unseen_ns: float = 0.0  # off CPU in windows with no state sample of this thread (counted in blocked_ns)
    native_wait_ns: float = 0.0  # futex sleep no GIL holder covers (counted in blocked_ns, not gil_wait_ns)
    others_held_ns: float | None = None  # the GIL held by the other threads over its life (py-spy)
    windows: list[float] = field(default_factory=list)  # GIL-wait share per window

    def share(self, part: str) -> float:
        """part ('cpu', 'run_queue', 'blocked', 'gil_wait', 'unseen' or 'held'): a share of the thread's wall."""
        value = getattr(self, f"{part}_ns")
        return float("nan") if value is None or not self.wall_ns else value / self.wall_ns

    def interval(self) -> tuple[float, float]:
        """95% t interval of the GIL-wait share over the windows."""
        found = t_interval(self.windows, self.share("gil_wait"), CONFIDENCE)
        return (0.0, 1.0) if found is None else (max(0.0, found[0]), min(1.0, found[1]))

    def dominant(self) -> str:
        """Which of PARTS takes most of the thread's off-CPU time."""
        return max(PARTS, key=self.share)

    def to_dict(self) -> dict[str, Any]:
        """Plain data with the shares and the interval."""
        lo, hi = self.interval()
        return {**asdict(self), **{f"{p}_share": self.share(p) for p in ("cpu", "run_queue", "blocked", "gil_wait",
                                                                           "unseen", "native_wait")},
                "held_share": self.share("held") if self.held_ns is not None else None, "gil_wait_ci": [lo, hi]}


def thread_shares(trace: Trace, held: dict[int, HeldSamples] | None, states: list[tuple[int, int, str]],
                  skip: set[str] = frozenset()) -> list[ThreadShares]:
    """Every sampled thread (but those named in skip) over its life; most GIL wait first. states: the
    parent's (perf_counter_ns, tid, 'run' | 'futex' | 'sleep') samples."""
    cpu, delay, framed = (per_thread_series(trace, p) for p in (CPU, RUN_DELAY, WAITING_FRAME))
    names = {int(k): v for k, v in trace.meta.get("thread_names", {}).items()}
    tick = int(trace.meta.get("sample_interval_ns", 25_000_000))
    by_tid: dict[int, list[tuple[int, str]]] = {}
    for ts, tid, kind in states:
        by_tid.setdefault(tid, []).append((ts, kind))
    rows = []
    for tid, series in cpu.items():
        name = names.get(tid) or trace.thread_name(tid)
        start, end = series.ts[0], series.ts[-1]
        if name in skip or end - start < 2 * tick or tid not in delay:
            continue
        count = int(min(MAX_WINDOWS, max(MIN_WINDOWS, (end - start) // WINDOW_NS)))
        edges = np.linspace(start, end, count + 1)
        seen = by_tid.get(tid, [])
        parts = [_window(series, delay[tid], framed.get(tid), seen, int(a), int(b))
                 for a, b in zip(edges[:-1], edges[1:])]
        wall, on, queue, stuck, wait, unseen = (sum(p[i] for p in parts) for i in range(6))
        mine = held.get(tid) if held is not None else None
        rows.append(ThreadShares(name, tid, wall, on, queue, stuck, wait,  # py-spy's weights can add past wall
                                 None if held is None else min(wall, float(mine.held_ns if mine else 0)),
                                 mine.top_function() if mine else None, unseen,
                                 windows=[p[4] / p[0] for p in parts if p[0] > 0]))
    if held is not None:
        rows = [_covered(r, rows) for r in rows]
    return sorted(rows, key=lambda r: -r.share("gil_wait"))


def _covered(row: ThreadShares, rows: list[ThreadShares]) -> ThreadShares:
    """row with its GIL wait capped at what the other threads held (a wait no holder covers is not for the
    GIL); the excess moves to native_wait_ns (and stays in blocked_ns)."""
    others = sum(r.held_ns or 0.0 for r in rows if r.tid != row.tid)
    row.others_held_ns = others
    if row.gil_wait_ns <= others:
        return row
    excess = row.gil_wait_ns - others
    scale = others / row.gil_wait_ns if row.gil_wait_ns > 0 else 0.0
    row.native_wait_ns, row.blocked_ns, row.gil_wait_ns = excess, row.blocked_ns + excess, others
    row.windows = [w * scale for w in row.windows]
    return row


def _window(cpu: Series, delay: Series, framed: Series | None, seen: list[tuple[int, str]], start: int,
            end: int) -> tuple[float, ...]:
    """(wall, on CPU, run queue, blocked, GIL wait, unseen) ns of one window."""
    wall = float(end - start)
    on, queue = cpu.delta(start, end), delay.delta(start, end)
    off = max(0.0, wall - on - queue)
    futex = sum(1 for t, kind in seen if start < t <= end and kind == "futex")
    sleep = sum(1 for t, kind in seen if start < t <= end and kind == "sleep")
    if futex + sleep == 0:  # never seen asleep here: whatever off-CPU time there is, unattributed
        return wall, on, queue, off, 0.0, off
    in_locks = _mean_between(framed, start, end) if framed is not None else 0.0  # share of the window
    gil = max(0.0, futex / (futex + sleep) - in_locks * wall / max(off, 1.0))  # futex sleep outside lock frames
    wait = off * min(1.0, gil)
    return wall, on, queue, off - wait, wait, 0.0


def _mean_between(series: Series, start: int, end: int) -> float:
    """Mean of the ticks in (start, end], or the value at the window's middle when no tick falls in it."""
    values = [v for t, v in zip(series.ts, series.values) if start < t <= end]
    return float(np.mean(values)) if values else series.at((start + end) // 2)
