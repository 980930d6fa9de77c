"""The scheduler state of every thread of the gil probe's child, sampled from the parent process.

A sampler inside the child has to take the GIL to run, so whenever it looks, the threads that wanted the GIL
have just been woken or are about to be: it cannot see them waiting. From outside, /proc/<pid>/task/<tid>
(state letter and kernel wait channel) is read without touching the child's GIL, at a jittered period so
that it does not fall into step with the child's own timers. Each sample is one of:

  run    runnable or running (R): on a core or in the run queue
  futex  asleep on a futex (S/D, wait channel futex_*): how CPython waits for the GIL — and for a lock,
         condition, queue or join, which the child's frames tell apart (analysis/gil_threads.py)
  sleep  asleep on anything else: a timer (time.sleep), I/O, select/poll
"""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psutil

PERIOD_S = (0.004, 0.009)  # jittered between these


def classify(state: str, wchan: str) -> str | None:
    """'run', 'futex' or 'sleep' for one reading; None when the reading says nothing (a zombie, no channel)."""
    if state == "R":
        return "run"
    if state in ("S", "D"):
        if "futex" in wchan:
            return "futex"
        if wchan not in ("", "0"):
            return "sleep"
    return None


class ThreadStates:
    """A background sampler of one process tree's Python child: (perf_counter_ns, tid, kind) samples."""

    def __init__(self, root_pid: int, marker: str, wrapped: bool = False) -> None:
        self.root_pid, self.marker, self.wrapped = root_pid, marker, wrapped
        self.samples: list[tuple[int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="infragent-thread-states", daemon=True)

    def __enter__(self) -> "ThreadStates":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def child(self) -> int | None:
        """The pid of the deepest process of the tree whose command line holds the marker (under py-spy, the
        Python child, not py-spy, whose own command line holds it too). When the root wraps the child, None
        until the child exists: sampling the wrapper's threads instead would see none of the workload's."""
        try:
            root = psutil.Process(self.root_pid)
            found = [p.pid for p in [root] + root.children(recursive=True)
                     if any(self.marker in part for part in p.cmdline())]
        except (psutil.Error, OSError):
            return None
        deeper = [pid for pid in found if pid != self.root_pid]
        return (deeper or ([] if self.wrapped else found) or [None])[-1]

    def _loop(self) -> None:
        pid = None
        rng = random.Random(0)
        while not self._stop.wait(rng.uniform(*PERIOD_S)):
            pid = pid or self.child()
            if pid is None:
                continue
            now = time.perf_counter_ns()
            try:
                tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
            except OSError:
                return  # the child is gone
            for tid in tids:
                kind = classify(*read_state(pid, tid))
                if kind is not None:
                    self.samples.append((now, tid, kind))


def read_state(pid: int, tid: int) -> tuple[str, str]:
    """(state letter, kernel wait channel) of a thread of another process; ("", "") when unreadable."""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"{base}/wchan") as f:
            return state, f.read().strip()
    except (OSError, IndexError):
        return "", ""
