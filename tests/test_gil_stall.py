"""The gil probe on a workload that stops working: a child that hangs deaf to the interrupt is found idle,
its threads' stacks are kept and named, and it is run once more (a hang measured nothing); one that hangs
but hears the interrupt gives its samples as "stalled". Idleness tells a stalled process from a busy one,
or from one whose children do the work.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from infragent.probes import gil as gil_probe
from infragent.probes.gil import find_pyspy
from infragent.probes.stall import Idleness, main_thread_frame

from test_gil import probe  # noqa: F401 (the module-scoped fixture: run_gil from tests/)

STALL_S = 3.0


@pytest.fixture
def quick(monkeypatch):
    """A short grace after the interrupt and a short retry floor, so a hang costs seconds, not minutes."""
    monkeypatch.setattr(gil_probe, "STOP_GRACE_S", 2.0)
    monkeypatch.setattr(gil_probe, "MIN_RETRY_S", 5.0)


def test_idleness_tells_a_sleeping_process_from_a_busy_one_or_one_whose_child_works():
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    delegating = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                                   "'-c', 'while True: pass'])"], start_new_session=True)  # its child works
    try:
        watches = {p.pid: Idleness(1.5) for p in (sleeping, busy, delegating)}
        said: dict[int, bool] = {}
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            said = {pid: watch.stalled(pid) for pid, watch in watches.items()}
            time.sleep(0.25)
        assert said == {sleeping.pid: True, busy.pid: False, delegating.pid: False}
    finally:
        sleeping.kill()
        busy.kill()
        os.killpg(delegating.pid, signal.SIGKILL)
        for p in (sleeping, busy, delegating):
            p.wait()


def test_the_main_threads_place_is_read_from_a_dump():
    dump = ('Process 7: python -m work\n\nThread 9 (idle): "kv-transfer"\n    wait (threading.py:320)\n'
            'Thread 7 (idle): "MainThread"\n    0x7f5fd4ca412b (libc.so.6)\n    clock_nanosleep (libc.so.6)\n'
            '    sleep (libc.so.6)\n'
            '    hung (gil_cases.py:146)\n    workload (run.py:3)\nthread 7 (python): state S, waiting in hrtimer')
    assert main_thread_frame(dump) == "hung (gil_cases.py:146), in clock_nanosleep (libc.so.6)"
    only_python = 'Thread 7 (idle): "MainThread"\n    hung (gil_cases.py:146)\n'
    assert main_thread_frame(only_python) == "hung (gil_cases.py:146)"
    assert main_thread_frame("thread 7 (python): state S") is None


def test_a_workload_hung_with_the_gil_is_run_twice_and_named_where_it_hung(probe, quick):
    feedback = probe("gil_cases:hung", timeout_s=40, stall_s=STALL_S)
    assert feedback.verdict == "inconclusive"
    assert feedback.finding.startswith("inconclusive: stuck: the workload's process did no CPU work for 3 s and "
                                       "did not stop when interrupted (both tries)"), feedback.finding
    if find_pyspy() is not None:  # py-spy reads the hung interpreter's stack
        assert "hung (gil_cases.py:" in feedback.finding, feedback.finding
        assert '"MainThread"' in feedback.details["stack_dump"]
    assert "waiting in" in feedback.details["stack_dump"]  # each thread's kernel wait channel, from /proc
    assert feedback.evidence and feedback.evidence[0].path.endswith("stuck-2.txt")
    assert "was still running at budget_s" not in feedback.finding  # found idle, not at the 40 s budget


def test_a_workload_that_hangs_once_is_run_again_and_judged(probe, quick, monkeypatch, tmp_path):
    monkeypatch.setenv("HUNG_ONCE_MARKER", str(tmp_path / "hung-once"))
    feedback = probe("gil_cases:hung_once", timeout_s=60, stall_s=STALL_S)
    assert feedback.verdict == "fail", feedback.finding  # contended(): compute is starved of the GIL
    assert "starved" in feedback.finding
    assert "try 1: the workload's process did no CPU work for 3 s and did not stop when interrupted" \
        in feedback.finding and "ran it again" in feedback.finding


def test_an_idle_workload_that_hears_the_interrupt_gives_what_it_had_as_stalled(probe, quick):
    feedback = probe("gil_cases:idle", timeout_s=40, stall_s=STALL_S)
    assert feedback.verdict == "inconclusive"
    assert feedback.finding.startswith("inconclusive: stalled: the workload did no CPU work for 3 s"), feedback.finding
    assert feedback.details["stalled_s"] == STALL_S  # interrupted as idle, not at the budget


def _started(code: str) -> subprocess.Popen:
    """A child running code in its own session; returns once it printed its first line."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_interrupt_is_sent_again_until_the_child_ends(monkeypatch):
    monkeypatch.setattr(gil_probe, "STOP_GRACE_S", 8.0)
    proc = _started("import signal, sys, time\n"
                    "heard = []\n"
                    "def on_interrupt(signum, frame):\n"
                    "    heard.append(signum)\n"  # the first is lost, as a SIGINT sometimes was in the gil child
                    "    if len(heard) == 2:\n"
                    "        print('stopped after', len(heard)); sys.exit(0)\n"
                    "signal.signal(signal.SIGINT, on_interrupt)\n"
                    "print('ready', flush=True)\n"
                    "while True: time.sleep(0.05)\n")
    output = gil_probe._interrupt(proc, proc.pid)
    assert "stopped after 2" in output and proc.returncode == 0  # the second interrupt ended it, within the grace


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"),
                    reason="exits the main thread alone with the raw exit syscall")
def test_a_child_whose_main_thread_has_exited_is_ended_not_called_stuck(monkeypatch):
    monkeypatch.setattr(gil_probe, "STOP_GRACE_S", 2.0)
    sys_exit = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
    proc = _started("import ctypes, threading, time\n"
                    "threading.Thread(target=lambda: [time.sleep(0.05) for _ in iter(int, 1)]).start()\n"
                    "print('ready', flush=True)\n"
                    f"ctypes.CDLL(None).syscall({sys_exit}, 0)\n")  # only this thread ends: the other lingers
    deadline = time.monotonic() + 10
    while not gil_probe._exiting(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gil_probe._exiting(proc.pid) and proc.poll() is None  # a zombie main thread, the process still there
    output = gil_probe._interrupt(proc, proc.pid)  # no TimeoutExpired: this is an exit under way, not a hang
    assert proc.returncode == -signal.SIGKILL and output == ""  # killed at the grace; what it wrote stands


def test_the_child_interrupts_a_workload_that_swallowed_the_first_interrupt() -> None:
    import threading

    from infragent.probes import gil_child

    finished = []

    def swallows_the_first() -> None:
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            pass
        time.sleep(30)
        finished.append(True)

    def interrupt_twice() -> None:
        for _ in range(2):
            time.sleep(0.3)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    before = signal.signal(signal.SIGINT, gil_child._on_interrupt)
    try:
        threading.Thread(target=interrupt_twice, daemon=True).start()
        _, stopped = gil_child._run_workload(swallows_the_first)
    finally:
        signal.signal(signal.SIGINT, before)
        gil_child._Stop.requested = False
    assert stopped and not finished  # the second interrupt stopped it inside its second sleep
