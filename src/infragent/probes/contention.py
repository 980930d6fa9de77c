"""Is the machine busy while we measure? Three signals over the measuring window, read from /proc:

- run delay: the share of this process's runnable time its threads spent waiting for a CPU (schedstat);
- steal: CPU time the hypervisor gave to other guests;
- others' CPU: cores' worth of CPU every other process used (CpuWatch).

Any one past its threshold makes a measurement contended: its wall times carry waits that are not the
code's, and a ratio of two of them can be off by more than any interval computed from them shows.

The source is named, because the remedy differs: other processes (wait for a quiet machine), the hypervisor
(steal), or this process itself — more of its own threads running than there are cores, typically thread
pools (BLAS, OpenMP, torch's) inside threads of its own. Self-contention is fixed in the workload, by capping
the pools that pools.py finds.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from infragent.probes.machine import CONTENDED_CORES, CpuWatch
from infragent.probes.pools import ThreadPool, cap_advice, describe_pools, pool_kinds, thread_pools
from infragent.probes.thread_census import ThreadCensus

WAIT_SHARE = 0.10  # threads runnable but not running this share of the time: contended
STEAL_SHARE = 0.05  # the hypervisor took this share of all CPUs
TICK_WINDOW_S = 0.5  # steal and others' CPU are read only over windows at least this long


@dataclass(frozen=True)
class Contention:
    """The signals over one window, and whether they make it contended (why names the ones that do)."""

    wait_share: float | None
    steal_share: float | None
    others_cores: float | None
    window_s: float
    threads_running: int | None = None  # our live threads that ran RUNNING_SHARE of the window, or the census's peak
    cores: int = 1
    pools: tuple[ThreadPool, ...] = ()
    cores_used: float | None = None  # this process's CPU time over the window, exited threads included

    @property
    def source(self) -> str:
        """Who made it contended: "others", "hypervisor", "self" (our own threads beyond the cores), or ""."""
        if self.others_cores is not None and self.others_cores > CONTENDED_CORES:
            return "others"
        if self.steal_share is not None and self.steal_share > STEAL_SHARE:
            return "hypervisor"
        if self.wait_share is not None and self.wait_share > WAIT_SHARE and self.oversubscribed:
            return "self"
        return ""

    @property
    def oversubscribed(self) -> bool:
        """More of our threads than cores ran, or several of ours ran at once (more than one core's worth, threads
        that have exited included) and kept at least SELF_BUSY of the cores busy while they waited."""
        return ((self.threads_running or 0) > self.cores
                or (self.cores_used is not None and self.cores_used > max(1.0, SELF_BUSY * self.cores)))

    @property
    def why(self) -> str:
        """The signals past their thresholds, in words ('' when none is); self-contention named as such."""
        if self.source == "self":
            others = f"; other processes used {self.others_cores:.2f} cores" if self.others_cores is not None else ""
            who = (f"{self.threads_running} threads of {pool_kinds(self.pools)}"
                   if (self.threads_running or 0) > self.cores else
                   f"more threads of {pool_kinds(self.pools)} than fit")
            used = f", {self.cores_used:.1f} cores' worth busy" if self.cores_used is not None else ""
            return (f"self-contended: {who} on {self.cores} cores ({describe_pools(self.pools)}; this process's own{used}) waited for a "
                    f"CPU {self.wait_share:.0%} of their runnable time{others}")
        said = []
        if self.wait_share is not None and self.wait_share > WAIT_SHARE:
            said.append(f"our threads waited for a CPU {self.wait_share:.0%} of their runnable time")
        if self.steal_share is not None and self.steal_share > STEAL_SHARE:
            said.append(f"the hypervisor stole {self.steal_share:.0%} of the CPUs")
        if self.others_cores is not None and self.others_cores > CONTENDED_CORES:
            said.append(f"contended by other processes: they used {self.others_cores:.1f} cores")
        return "; ".join(said)

    @property
    def remedy(self) -> str:
        """What to do about it, by source ('' when not contended)."""
        if self.source == "self":
            return cap_advice(self.pools, self.cores)
        if self.source == "others":
            return "measure when the other processes are done (or on a machine of its own)"
        if self.source == "hypervisor":
            return "measure on a machine whose CPUs are not shared (the hypervisor takes them)"
        return ""

    @property
    def contended(self) -> bool:
        """Whether any signal is past its threshold."""
        return bool(self.why)

    def to_dict(self) -> dict[str, float | bool | None]:
        """Plain data for a Feedback's details."""
        return {"wait_share": self.wait_share, "steal_share": self.steal_share, "others_cores": self.others_cores,
                "window_s": self.window_s, "contended": self.contended, "source": self.source,
                "threads_running": self.threads_running, "cores": self.cores, "cores_used": self.cores_used,
                "pools": [p.to_dict() for p in self.pools]}


RUNNING_SHARE = 0.05  # of the window: a thread on a CPU this long counts as running in it
SELF_BUSY = 0.5  # of the cores: our process this busy (and beyond one core) while its threads wait oversubscribes them


def _threads_schedstat() -> tuple[int, int, dict[str, int]] | None:
    """(ns on a CPU, ns waiting on a run queue) summed over this process's threads, and ns on a CPU per
    thread id; None without schedstat."""
    on_cpu = waiting = 0
    per_thread = {}
    try:
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "schedstat").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
            on_cpu += int(fields[0])
            waiting += int(fields[1])
            per_thread[task.name] = int(fields[0])
    except (OSError, ValueError, IndexError):
        return None
    return on_cpu, waiting, per_thread


def _steal_s() -> float | None:
    """Seconds of steal on all CPUs since boot (/proc/stat's eighth field)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
    except (OSError, ValueError):
        return None


class ContentionWatch:
    """Started at construction; now() gives the signals since then. count_threads() adds a census of the threads
    that want a CPU at once (started only once a reading is contended: it samples in a thread of its own)."""

    def __init__(self) -> None:
        self.wall0, self.sched0, self.steal0, self.cpu = time.perf_counter(), _threads_schedstat(), _steal_s(), CpuWatch()
        self.process0 = time.process_time()
        self.census: ThreadCensus | None = None

    def count_threads(self) -> None:
        """Start the census of runnable threads (once); later readings count at least its peak."""
        if self.census is None:
            self.census = ThreadCensus().start()

    def close(self) -> None:
        """Stop the census, if one runs."""
        if self.census is not None:
            self.census.stop()

    def now(self) -> Contention:
        """The signals over the window so far."""
        window = time.perf_counter() - self.wall0
        sched, steal = _threads_schedstat(), _steal_s()
        wait_share = steal_share = running = None
        if sched is not None and self.sched0 is not None:
            on_cpu, waiting = sched[0] - self.sched0[0], sched[1] - self.sched0[1]
            wait_share = waiting / (on_cpu + waiting) if on_cpu + waiting > 0 else 0.0
            running = sum(1 for tid, ns in sched[2].items()
                          if ns - self.sched0[2].get(tid, 0) >= RUNNING_SHARE * window * 1e9)
        peak = self.census.peak() if self.census is not None else None
        if peak is not None:  # threads that ran and ended inside the window, counted while they ran
            running = max(running or 0, peak)
        cores = len(os.sched_getaffinity(0))
        used = (time.process_time() - self.process0) / window if window > 0 else None
        if window < TICK_WINDOW_S:  # /proc/stat counts in ticks of 10 ms: too coarse for a shorter window
            return with_pools(Contention(wait_share, None, None, window, running, cores, cores_used=used))
        if steal is not None and self.steal0 is not None:
            steal_share = (steal - self.steal0) / window / (os.cpu_count() or 1)
        return with_pools(Contention(wait_share, steal_share, self.cpu.others_cores(), window, running, cores,
                                     cores_used=used))


def with_pools(found: Contention) -> Contention:
    """found with this process's thread pools named when it is self-contended (read only when it matters)."""
    return replace(found, pools=thread_pools()) if found.source == "self" and not found.pools else found


def merged(early: Contention, whole: Contention) -> Contention:
    """The reading that said contended, completed by the whole window's: each signal at its larger value (so it
    stays contended), others' CPU and steal known even when the early window was too short for them."""
    def larger(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else max(a, b)

    return with_pools(Contention(larger(early.wait_share, whole.wait_share), larger(early.steal_share, whole.steal_share),
                                 larger(early.others_cores, whole.others_cores), whole.window_s,
                                 max(early.threads_running or 0, whole.threads_running or 0) or None, whole.cores,
                                 early.pools or whole.pools, larger(early.cores_used, whole.cores_used)))
