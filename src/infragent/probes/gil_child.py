"""Child process of the gil probe: run a workload under the span recorder and sample GIL-related counters.

    python -m infragent.probes.gil_child module:function TRACE.json [--interval-ms 25]

Records spans with thread CPU time (Recorder(thread_cpu=True)) and, from a sampler thread, counters:
  sched.cpu_ns/<tid>, sched.run_delay_ns/<tid>   cumulative on-CPU and run-queue wait time of each Python
                                                 thread (/proc/self/task/<tid>/schedstat), every interval
  sched.waiting_frame/<tid>                      1 when the thread's innermost Python frame is in a waiting
                                                 stdlib module (a lock, condition, queue, join or select:
                                                 a futex sleep there is not the GIL), else 0, every interval
  gil.contention                                 gilknocker's contention metric over the last window
                                                 (reset after each read), every second interval
The threads' names (native id -> name, every thread seen) go into the trace's meta, for threads that
record no spans.
SIGINT (the parent's budget) stops the workload; the trace of what ran until then is still written, with
meta stopped_at_budget (stopped before the workload started: TRACE.json.stopped). Writes the Chrome trace to TRACE.json, or the workload's traceback to TRACE.json.error, then exits with
os._exit so that gilknocker's native threads cannot abort interpreter shutdown.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from infragent.analysis.gil_shares import CONTENTION, CPU, RUN_DELAY, WAITING_FRAME
from infragent.probes.callables import resolve
from infragent.trace import Recorder, counter

SAMPLER_THREAD = "infragent-gil-sampler"
WAITING_MODULES = ("threading.py", "queue.py", "selectors.py", "socket.py", "ssl.py", "subprocess.py",
                   "concurrent/futures/", "asyncio/", "multiprocessing/")  # in the standard library
STDLIB = sysconfig.get_paths()["stdlib"].replace("\\", "/").rstrip("/") + "/"


def _waiting_module(filename: str) -> bool:
    name = filename.replace("\\", "/")
    if not name.startswith(STDLIB):
        return False
    rest = name[len(STDLIB):]
    return any(rest.startswith(m) if m.endswith("/") else rest == m for m in WAITING_MODULES)


def read_schedstat(tid: int) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) of one thread of this process, or None if it is gone or unsupported."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def _start_knocker() -> Any:
    try:
        from gilknocker import KnockKnock
    except ImportError:
        return None
    intervals = dict(polling_interval_micros=1000, sampling_interval_micros=10_000)
    try:  # sleeping_interval_micros=0 would make its monitor thread spin on a core; 1 ms keeps it idle
        knocker = KnockKnock(**intervals, sleeping_interval_micros=1000)
    except TypeError:  # gilknocker < 0.4.1 has no sleeping interval
        knocker = KnockKnock(**intervals)
    knocker.start()
    return knocker


class Sampler:
    """A daemon thread emitting schedstat and gilknocker counters every interval until stop()."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.knocker = _start_knocker()
        self.schedstat = read_schedstat(threading.get_native_id()) is not None
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=SAMPLER_THREAD, daemon=True)

    def start(self) -> "Sampler":
        """Take a first sample, then sample in the background."""
        self._thread.start()
        return self

    def _sample(self, tick: int) -> None:
        # only what is needed of each frame, and at once: a frame held on to keeps its function's locals alive
        # after it returns, and the workload's objects must live as long as they would unobserved
        waiting = {ident: _waiting_module(frame.f_code.co_filename)
                   for ident, frame in sys._current_frames().items()}
        for thread in threading.enumerate():  # Python threads: the only ones that can hold the GIL
            if not thread.native_id or thread.name == SAMPLER_THREAD:
                continue
            self.names[thread.native_id] = thread.name
            stat = read_schedstat(thread.native_id) if self.schedstat else None
            if stat is not None:
                counter(f"{CPU}{thread.native_id}", stat[0])
                counter(f"{RUN_DELAY}{thread.native_id}", stat[1])
                counter(f"{WAITING_FRAME}{thread.native_id}", float(waiting.get(thread.ident, False)))
        if self.knocker is not None and tick % 2 == 1:
            counter(CONTENTION, self.knocker.contention_metric)
            self.knocker.reset_contention_metric()

    def _loop(self) -> None:
        tick = 0
        self._sample(tick)
        while not self._stop.wait(self.interval_s):
            tick += 1
            self._sample(tick)
        self._sample(tick + 1)

    def stop(self) -> None:
        """Take a last sample and stop the thread and the knocker."""
        self._stop.set()
        self._thread.join()
        if self.knocker is not None:
            self.knocker.stop()


class _Stop:
    """The parent's SIGINT at the budget: before the workload runs it only marks the stop (an interrupt inside
    an import could be swallowed there); while the workload runs it interrupts it, each time (the parent sends
    it again when the first did not end the process) until the workload has stopped."""

    requested = False
    running = False


def _on_interrupt(signum: int, frame: Any) -> None:
    _Stop.requested = True
    if _Stop.running:
        raise KeyboardInterrupt


def _run_workload(fn: Callable[[], Any]) -> tuple[int, bool]:
    """Call the workload; wall ns and whether the parent stopped it (SIGINT at its budget). The parent keeps
    only the main thread's py-spy samples under this frame."""
    start = time.perf_counter_ns()
    _Stop.running = True
    try:
        try:
            if not _Stop.requested:  # a stop that came before running was set is seen here
                fn()
        finally:
            _Stop.running = False  # from here on an interrupt only marks the stop: none escapes the except below
    except KeyboardInterrupt:
        pass
    return time.perf_counter_ns() - start, _Stop.requested


def record(workload: str, out: Path, interval_s: float = 0.025) -> Path | None:
    """Run the workload once under the recorder and the sampler; save the trace to out (None: stopped before
    the workload started)."""
    fn = resolve(workload, "workload")
    if _Stop.requested:
        return None
    recorder = Recorder(thread_cpu=True).start()
    sampler = Sampler(interval_s).start()
    try:
        wall_ns, stopped = _run_workload(fn)
    finally:
        sampler.stop()
        recorder.stop()
    trace = recorder.trace()
    trace.meta.update(workload=workload, workload_wall_ns=wall_ns, stopped_at_budget=stopped,
                      sampler_thread=SAMPLER_THREAD,
                      sample_interval_ns=int(interval_s * 1e9), schedstat=sampler.schedstat,
                      gilknocker=sampler.knocker is not None, switch_interval_s=sys.getswitchinterval(),
                      thread_names={str(tid): name for tid, name in sampler.names.items()})
    return trace.save(out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("trace")
    parser.add_argument("--interval-ms", type=float, default=25.0)
    args = parser.parse_args(argv)
    out = Path(args.trace)
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        if record(args.workload, out, args.interval_ms / 1e3) is None:  # the budget ran out while importing it
            Path(str(out) + ".stopped").write_text("interrupted before the workload started")
    except BaseException:
        Path(str(out) + ".error").write_text(traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
