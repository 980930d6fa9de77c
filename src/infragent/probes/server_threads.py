"""A running server's threads, read from outside while load runs: what each thread was doing (on a core or
in the run queue, asleep on a futex, asleep on I/O or a timer), its CPU time and how long it waited for a
core (/proc schedstat). Works on any process this user may read, Python or not; nothing is injected.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from infragent.probes.thread_states import classify, read_state

PERIOD_S = (0.015, 0.03)  # jittered between these: a server has dozens of threads
KINDS = ("run", "futex", "sleep")


@dataclass
class ThreadReading:
    """One thread over the watch: state samples by kind, CPU seconds, seconds it waited for a core."""

    pid: int
    tid: int
    name: str
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    cpu_s: float = 0.0
    runqueue_s: float = 0.0

    def share(self, kind: str) -> float:
        """The fraction of this thread's samples in one state."""
        total = sum(self.states.values())
        return self.states[kind] / total if total else 0.0

    def to_dict(self) -> dict:
        """A JSON-ready copy."""
        return {"pid": self.pid, "tid": self.tid, "name": self.name, "states": self.states,
                "cpu_s": round(self.cpu_s, 4), "runqueue_s": round(self.runqueue_s, 4)}


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting in the run queue) of a thread so far; None when unreadable."""
    try:
        on_cpu, waited, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waited) / 1e9


def thread_name(pid: int, tid: int) -> str:
    """The thread's name as the kernel has it (15 characters at most)."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


class ThreadWatch:
    """Sample every thread of the given processes until stopped (a context manager); .readings() after."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.elapsed_s = 0.0
        self._found: dict[tuple[int, int], ThreadReading] = {}
        self._first: dict[tuple[int, int], tuple[float, float]] = {}
        self._last: dict[tuple[int, int], tuple[float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="infragent-server-threads", daemon=True)

    def __enter__(self) -> "ThreadWatch":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.elapsed_s = time.monotonic() - self._started

    def readings(self) -> list[ThreadReading]:
        """Every thread seen, with its CPU and run-queue seconds over the watch, busiest first."""
        for key, reading in self._found.items():
            if key in self._first and key in self._last:
                reading.cpu_s = self._last[key][0] - self._first[key][0]
                reading.runqueue_s = self._last[key][1] - self._first[key][1]
        return sorted(self._found.values(), key=lambda r: -r.cpu_s)

    def _loop(self) -> None:
        rng = random.Random(0)
        while True:
            self._sample()
            if self._stop.wait(rng.uniform(*PERIOD_S)):
                self._sample()
                return

    def _sample(self) -> None:
        for pid in self.pids:
            try:
                tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
            except OSError:
                continue  # that process is gone
            for tid in tids:
                key = (pid, tid)
                if key not in self._found:
                    self._found[key] = ThreadReading(pid, tid, thread_name(pid, tid))
                kind = classify(*read_state(pid, tid))
                if kind is not None:
                    self._found[key].states[kind] += 1
                stat = schedstat(pid, tid)
                if stat is not None:
                    self._first.setdefault(key, stat)
                    self._last[key] = stat
