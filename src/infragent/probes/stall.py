"""A probe's child process that stopped working: its CPU time stood still (a deadlock, a wait that never ends),
told apart from one that is merely slow, and what each of its threads was doing when it was found.

Idleness reads the CPU time of the process and its children from outside; the probe's own threads in an idle
child use about 2% of a core (measured: a child sleeping under the gil probe), so under IDLE_SHARE of a core
for stall_s is a stall.
stack_dump is the evidence: py-spy's Python stacks (with native frames where it can) and, from /proc, each
thread's scheduler state and kernel wait channel.
"""
from __future__ import annotations

import re
import subprocess
import time
from collections import deque
from pathlib import Path

import psutil

from infragent.probes.thread_states import read_state

IDLE_SHARE = 0.05  # of one core


class Idleness:
    """Watches one process tree's CPU time: stalled() once it has used under IDLE_SHARE of a core for stall_s."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._pid: int | None = None
        self._readings: deque[tuple[float, float]] = deque()

    def stalled(self, pid: int) -> bool:
        """Take a reading of pid; whether its CPU time has stood still (to IDLE_SHARE) for stall_s."""
        try:
            cpu = tree_cpu_s(pid)
        except psutil.Error:
            return False
        now = time.monotonic()
        if pid != self._pid:
            self._pid, self._readings = pid, deque()
        self._readings.append((now, cpu))
        while len(self._readings) > 1 and now - self._readings[1][0] >= self.stall_s:
            self._readings.popleft()  # keep the newest reading at least stall_s old
        since, cpu_then = self._readings[0]
        return now - since >= self.stall_s and cpu - cpu_then < IDLE_SHARE * (now - since)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of pid and every process under it, the finished ones it has waited for included (a
    workload whose work runs in its children is not idle)."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root] + root.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.Error:
            if process is root:
                raise
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def stack_dump(pid: int, pyspy: str | None, timeout_s: float = 20.0) -> str:
    """Each thread of pid: py-spy's stack (native frames too, where py-spy can unwind them) and its scheduler
    state and kernel wait channel."""
    parts = []
    if pyspy is not None:
        for extra in (["--native"], []):
            try:
                run = subprocess.run([pyspy, "dump", "--pid", str(pid), *extra], capture_output=True, text=True,
                                     timeout=timeout_s)
            except (subprocess.TimeoutExpired, OSError) as err:
                parts.append(f"py-spy dump {' '.join(extra)}: {err}")
                continue
            parts.append(run.stdout.strip() or run.stderr.strip())
            if run.returncode == 0:
                break
    try:
        tids = sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        tids = []
    for tid in tids:
        state, wchan = read_state(pid, tid)
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            name = "?"
        parts.append(f"thread {tid} ({name}): state {state or '?'}, waiting in {wchan or '-'}")
    return "\n".join(parts)


def main_thread_frame(dump: str) -> str | None:
    """Where MainThread was in a stack_dump: its innermost Python frame, with the innermost native one when
    they differ, e.g. 'gil_held (work.py:7), in clock_nanosleep (libc.so.6)'."""
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r'Thread \S+ .*"MainThread"', line.strip()):
            continue
        frames = []
        for frame in lines[i + 1:]:
            if not frame.startswith((" ", "\t")):
                break
            frames.append(frame.strip())
        frames = [f for f in frames if not f.startswith("0x")]  # unnamed native frames say nothing
        python = next((f for f in frames if re.search(r"\.py:\d+\)$", f)), None)
        if python is None or python == frames[0]:
            return python or (frames[0] if frames else None)
        return f"{python}, in {frames[0]}"
    return None
