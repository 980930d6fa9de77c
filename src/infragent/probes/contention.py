"""Is the machine busy while we measure? Three signals over the measuring window, read from /proc:

- run delay: the share of this process's runnable time its threads spent waiting for a CPU (schedstat);
- steal: CPU time the hypervisor gave to other guests;
- others' CPU: cores' worth of CPU every other process used (CpuWatch).

Any one past its threshold makes a measurement contended: its wall times carry waits that are not the
code's, and a ratio of two of them can be off by more than any interval computed from them shows.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from infragent.probes.machine import CONTENDED_CORES, CpuWatch

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

    @property
    def why(self) -> str:
        """The signals past their thresholds, in words ('' when none is)."""
        said = []
        if self.wait_share is not None and self.wait_share > WAIT_SHARE:
            said.append(f"our threads waited for a CPU {self.wait_share:.0%} of their runnable time")
        if self.steal_share is not None and self.steal_share > STEAL_SHARE:
            said.append(f"the hypervisor stole {self.steal_share:.0%} of the CPUs")
        if self.others_cores is not None and self.others_cores > CONTENDED_CORES:
            said.append(f"other processes used {self.others_cores:.1f} cores")
        return "; ".join(said)

    @property
    def contended(self) -> bool:
        """Whether any signal is past its threshold."""
        return bool(self.why)

    def to_dict(self) -> dict[str, float | bool | None]:
        """Plain data for a Feedback's details."""
        return {"wait_share": self.wait_share, "steal_share": self.steal_share, "others_cores": self.others_cores,
                "window_s": self.window_s, "contended": self.contended}


def _threads_schedstat() -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) summed over this process's threads; None without schedstat."""
    on_cpu = waiting = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "schedstat").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
            on_cpu += int(fields[0])
            waiting += int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    return on_cpu, waiting


def _steal_s() -> float | None:
    """Seconds of steal on all CPUs since boot (/proc/stat's eighth field)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
    except (OSError, ValueError):
        return None


class ContentionWatch:
    """Started at construction; now() gives the signals since then."""

    def __init__(self) -> None:
        self.wall0, self.sched0, self.steal0, self.cpu = time.perf_counter(), _threads_schedstat(), _steal_s(), CpuWatch()

    def now(self) -> Contention:
        """The signals over the window so far."""
        window = time.perf_counter() - self.wall0
        sched, steal = _threads_schedstat(), _steal_s()
        wait_share = steal_share = None
        if sched is not None and self.sched0 is not None:
            on_cpu, waiting = sched[0] - self.sched0[0], sched[1] - self.sched0[1]
            wait_share = waiting / (on_cpu + waiting) if on_cpu + waiting > 0 else 0.0
        if window < TICK_WINDOW_S:  # /proc/stat counts in ticks of 10 ms: too coarse for a shorter window
            return Contention(wait_share, None, None, window)
        if steal is not None and self.steal0 is not None:
            steal_share = (steal - self.steal0) / window / (os.cpu_count() or 1)
        return Contention(wait_share, steal_share, self.cpu.others_cores(), window)
