"""How many of this process's threads want a CPU at once, sampled while the workload runs: the N of
"self-contended: N threads of BLAS on 2 cores". Threads a workload starts and joins inside one call are gone
by the time a window ends, so only a reading taken while they run can count them.

The census is a daemon thread that reads the state of every thread in /proc/self/task a few times a second
(a runnable thread, on a CPU or waiting for one, reads 'R'; a BLAS worker that spins reads 'R' too). It is
started only once a measurement is already contended, so it never costs an uncontended one anything.
"""
from __future__ import annotations

import threading
from pathlib import Path

EVERY_S = 0.05
PEAK_QUANTILE = 0.9  # of the samples: one odd sample does not make the peak


def runnable_threads(skip: int | None = None) -> int | None:
    """This process's threads in state R (running, or runnable and waiting for a CPU) now; None without /proc."""
    count = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        if skip is not None and task.name == str(skip):
            continue
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        count += stat.rsplit(")", 1)[-1].split()[0] == "R"
    return count


class ThreadCensus:
    """Started by start(); peak() is the number of runnable threads seen at once (a high quantile of the samples)."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ThreadCensus":
        """Begin sampling in a daemon thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="infragent-thread-census", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        me = threading.get_native_id()
        while not self._stop.wait(self.every_s):
            count = runnable_threads(skip=me)
            if count is None:
                return
            self.samples.append(count)

    def stop(self) -> None:
        """End sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def peak(self) -> int | None:
        """Runnable threads at once, at the PEAK_QUANTILE of the samples so far; None before any sample."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(PEAK_QUANTILE * len(ordered)))]
