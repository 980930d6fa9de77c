"""The gil probe: which thread holds the GIL, which one waits for it, per thread and span.

run_gil runs the workload in a child process (probes/gil_child.py) under `py-spy record --gil` when py-spy
is available, and in any case with in-process measurements: thread CPU time per span, per-thread run-queue
wait from /proc schedstat, and gilknocker's contention metric. analysis/gil_shares.py joins them to spans.

Waited time is the time a thread was off CPU and not runnable inside its spans. That is GIL waiting only
inside non-blocking work (no I/O, sleeps or locks in the spans) and when native ops do not oversubscribe
the cores (e.g. torch.set_num_threads(1) per worker thread); run-queue wait is measured and excluded, so a
busy machine does not read as GIL contention, and a thread blocked while gilknocker found the GIL mostly
free is reported as waiting on something else (inconclusive), not as starved. Held time comes from py-spy
(see gil_shares for how it is spread over spans); without py-spy it is reported as n/a.

A workload with no spans is judged over whole threads (probes/gil_threads.py): the parent samples each of the
child's threads' scheduler state from outside (probes/thread_states.py) to split off-CPU time into GIL wait
and blocking, and the verdict rests on the interval of the starved thread's GIL-wait share over windows.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import infragent
from infragent.analysis.gil_shares import (CONTENTION, HeldSamples, ShareRow, parse_speedscope, span_records,
                                           span_rows, starving_thread, thread_rows, waited_windows)
from infragent.analysis.stats import t_interval
from infragent.probes.artifacts import artifact_dir
from infragent.probes.budget import over_budget
from infragent.probes.feedback import Evidence, Feedback, Measure
from infragent.probes.gil_child import SAMPLER_THREAD
from infragent.probes.gil_threads import threads_feedback
from infragent.probes.stall import Idleness, main_thread_frame, stack_dump
from infragent.probes.thread_states import ThreadStates
from infragent.trace_model import Trace, TraceFormatError

CHILD_MODULE = "infragent.probes.gil_child"
WAIT_THRESHOLD = 0.25  # a thread blocked more than this share of its span time is starved
STOP_GRACE_S = 10.0  # after the interrupt at the budget, the child's time to write what it has
STALL_S = 60.0  # a workload that does no CPU work this long is interrupted as stalled
MIN_RETRY_S = 30.0  # the least budget left for which a stuck child is run again
POLL_S = 1.0
FREE_GIL = 0.2  # gilknocker contention below this while a thread was blocked: it waited on something else


class ChildFailed(RuntimeError):
    """The child process failed: the workload raised (traceback kept) or no trace came back."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


class ChildStuck(RuntimeError):
    """The child did not stop when interrupted (at the budget, or stalled); dump: what its threads were doing."""

    def __init__(self, message: str, dump: str) -> None:
        super().__init__(message)
        self.dump = dump
        self.dump_path: Path | None = None  # where the probe kept the dump
        self.notes: list[str] = []  # the probe's notes, every try's included

    @property
    def where(self) -> str:
        """Where its main thread was, from the dump."""
        return main_thread_frame(self.dump) or "unknown (no stack could be read)"


@dataclass
class GilRecording:
    """What one run of the child left behind: the trace, py-spy's samples, and why any source is missing."""

    trace_path: Path
    pyspy_path: Path | None
    held: dict[int, HeldSamples] | None
    notes: list[str] = field(default_factory=list)
    states: list[tuple[int, int, str]] = field(default_factory=list)  # the child's threads, sampled from here
    stalled_s: float | None = None  # interrupted after doing no CPU work this long (None: it was not)

@dataclass
class GilReport:
    """The joined result: per-thread and per-(thread, span) shares, the starving thread and the GIL holder."""

    workload: str
    threads: list[ShareRow]
    spans: list[ShareRow]
    starving: ShareRow | None
    holder: ShareRow | None  # the thread with the largest held share (py-spy), else the most on-CPU one
    contention: float | None  # gilknocker over the whole run
    threshold: float
    pyspy: bool
    notes: list[str]
    gil_was_free: bool = False  # the blocked thread waited while the GIL was mostly free: not a GIL problem
    holder_function: str | None = None  # where the holder held the GIL most often (py-spy)
    waited_ci: tuple[float, float] | None = None  # 95% interval of the most-waiting thread's share (None: 1 span)

    @property
    def near_threshold(self) -> bool:
        """No thread is starved beyond doubt, but the most-waiting one's interval reaches the threshold."""
        return self.starving is None and self.waited_ci is not None and self.waited_ci[1] >= self.threshold

    def worst_span(self, row: ShareRow) -> ShareRow:
        """The span name on row's thread with the most waited time."""
        same = [r for r in self.spans if r.tid == row.tid]
        return max(same, key=lambda r: r.waited_ns) if same else row

    def busiest_span(self, row: ShareRow) -> ShareRow:
        """The span name on row's thread with the most held (else on-CPU) time."""
        same = [r for r in self.spans if r.tid == row.tid]
        return max(same, key=lambda r: (r.held_ns or 0.0, r.cpu_ns)) if same else row


def find_pyspy() -> str | None:
    """The py-spy executable: on PATH or next to this Python."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def _child_env(code: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the workload's folders first on PYTHONPATH: `code` (a checkout's src/, where
    the child's infragent then comes from) or else the current folder and this infragent's."""
    env = {**os.environ, **(extra or {})}
    if code is not None:
        first = [str(code / "src" if (code / "src" / "infragent").is_dir() else code)]
    else:
        first = [os.getcwd(), str(Path(infragent.__file__).resolve().parents[1])]
    paths = first + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


@dataclass
class _Ran:
    returncode: int
    output: str
    states: list[tuple[int, int, str]]
    stalled_s: float | None


def _run(cmd: list[str], timeout_s: float, env: dict[str, str], stall_s: float = STALL_S) -> _Ran:
    """Run cmd in its own process group (py-spy and its child), its threads' states sampled from here. At
    timeout_s, or once the workload's process has done no CPU work for stall_s, interrupt it (it writes what it
    has; py-spy, seeing it end, its samples); if it has not ended STOP_GRACE_S later, take its threads'
    stacks, kill the group and raise ChildStuck (TimeoutExpired when py-spy had not started it yet)."""
    wrapped = Path(cmd[0]).name == "py-spy"
    end, idle = time.monotonic() + timeout_s, Idleness(stall_s)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc, \
            ThreadStates(proc.pid, CHILD_MODULE, wrapped=wrapped) as states:
        while True:
            try:
                output, _ = proc.communicate(timeout=max(0.0, min(POLL_S, end - time.monotonic())))
                return _Ran(proc.returncode, output, states.samples, None)
            except subprocess.TimeoutExpired:
                workload = states.child() or proc.pid
                started = workload != proc.pid or not wrapped  # under py-spy: once py-spy started the child
                stalled = started and idle.stalled(workload)
                if stalled or time.monotonic() >= end:
                    break
        if not started:  # nothing to keep
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout_s)
        try:
            output = _interrupt(proc, workload)
        except subprocess.TimeoutExpired:
            dump = stack_dump(workload, find_pyspy())
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            why = f"did no CPU work for {stall_s:g} s" if stalled else f"was still running at budget_s={timeout_s:g}"
            raise ChildStuck(f"the workload's process {why} and did not stop when interrupted", dump) from None
    return _Ran(proc.returncode, output, states.samples, stall_s if stalled else None)


def _interrupt(proc: subprocess.Popen, workload: int) -> str:
    """SIGINT the workload's process (py-spy then ends too) once a second until proc ends, STOP_GRACE_S at most;
    its output, or TimeoutExpired. Once was not always enough: 2 of ~160 single interrupts here left the child
    running, once with its main thread waiting in a join, once with its main thread gone (its os._exit under
    way) and one thread not yet dead. A lost interrupt is sent again rather than waited on; a process whose main
    thread has exited is not stuck, and what it wrote stands: it is killed, py-spy given the grace to write."""
    grace_end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < grace_end:
        with contextlib.suppress(ProcessLookupError):  # it ended (py-spy reaped it) since the last wait
            os.kill(workload, signal.SIGINT)  # the child's handler acts until the workload has stopped
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.communicate(timeout=max(0.0, min(POLL_S, grace_end - time.monotonic())))[0]
    if not _exiting(workload):
        raise subprocess.TimeoutExpired(proc.args, STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.kill(workload, signal.SIGKILL)  # py-spy, seeing it end, writes its samples
    try:
        return proc.communicate(timeout=STOP_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0]


def _exiting(pid: int) -> bool:
    """Whether pid's main thread has exited (a zombie leader: the process is ending, or has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].startswith("Z")


def record_child(workload: str, out_dir: Path, pyspy: bool = True, rate: int = 500,
                 interval_ms: float = 25.0, timeout_s: float = 300.0, code: Path | None = None,
                 env: dict[str, str] | None = None, stall_s: float = STALL_S) -> GilRecording:
    """Run the workload in a child process (its code from `code` when given, with env added), under py-spy
    when asked and available; raise ChildFailed (with the child's traceback) when the workload fails, and
    ChildStuck when it hung twice (once, when too little budget was left to run it again)."""
    trace_path, pyspy_path = out_dir / "trace.json", out_dir / "pyspy.speedscope.json"
    child = [sys.executable, "-m", CHILD_MODULE, workload, str(trace_path),
             "--interval-ms", str(interval_ms)]
    notes: list[str] = []
    exe = find_pyspy() if pyspy else None
    if pyspy and exe is None:
        notes.append("py-spy not found (pip install py-spy): held shares are n/a")
    elif not pyspy:
        notes.append("py-spy disabled: held shares are n/a")
    runs = [[exe, "record", "--gil", "--nonblocking", "--format", "speedscope", "--rate", str(rate),
             "-o", str(pyspy_path), "--"] + child] if exe else []
    runs.append(child)
    ran = _Ran(0, "", [], None)
    end = time.monotonic() + timeout_s  # one budget for every try
    for cmd in runs:
        ran = _run_unstuck(cmd, end, _child_env(code, env), stall_s, out_dir, notes)
        error = Path(str(trace_path) + ".error")
        if error.exists():
            text = error.read_text()
            last = (text.strip().splitlines() or ["?"])[-1]
            raise ChildFailed(f"workload {workload} failed in the child process: {last}", text)
        if trace_path.exists():
            break
        if Path(str(trace_path) + ".stopped").exists() or time.monotonic() >= end:  # no time for another try
            raise subprocess.TimeoutExpired(cmd, timeout_s)
        tail = ran.output.strip().splitlines()[-3:]
        notes.append(f"{Path(cmd[0]).name} exited {ran.returncode} without a trace: {' | '.join(tail)}")
    if not trace_path.exists():
        raise ChildFailed("the gil child process wrote no trace: " + "; ".join(notes))
    held = None
    if exe and pyspy_path.exists():
        try:
            pid = Trace.load(trace_path).meta.get("pid")
            held = parse_speedscope(json.loads(pyspy_path.read_text()), main_tid=pid)
        except (ValueError, TraceFormatError) as err:
            notes.append(f"py-spy output unreadable ({err}): held shares are n/a")
    elif exe:
        notes.append("py-spy wrote no samples (ptrace not permitted?): held shares are n/a")
    return GilRecording(trace_path, pyspy_path if held is not None else None, held, notes, ran.states,
                        ran.stalled_s)


def _run_unstuck(cmd: list[str], end: float, env: dict[str, str], stall_s: float, out_dir: Path,
                 notes: list[str]) -> _Ran:
    """_run, once more when the child hung (its stacks kept in out_dir and named in notes) and at least
    MIN_RETRY_S of the budget is left: a hung run measured nothing, and the next may not hang."""
    attempt = 1
    while True:
        try:
            return _run(cmd, end - time.monotonic(), env, stall_s)
        except ChildStuck as stuck:
            stuck.dump_path = out_dir / f"stuck-{attempt}.txt"
            stuck.dump_path.write_text(stuck.dump)
            again = attempt == 1 and end - time.monotonic() >= MIN_RETRY_S
            notes.append(f"try {attempt}: {stuck}; its main thread was in {stuck.where} (every thread: "
                         f"{stuck.dump_path.name}){'; ran it again' if again else ''}")
            if not again:
                stuck.notes = list(notes)
                raise
        attempt += 1


def gil_report(workload: str, trace: Trace, held: dict[int, HeldSamples] | None,
            threshold: float = WAIT_THRESHOLD, notes: list[str] | None = None) -> GilReport:
    """Join the recording into a GilReport (pure: no processes, no files)."""
    threads = [r for r in thread_rows(trace, held) if r.thread != SAMPLER_THREAD]
    spans = [r for r in span_rows(trace, held) if r.thread != SAMPLER_THREAD]
    worst = max(threads, key=lambda r: r.waited_share, default=None)
    interval = t_interval(waited_windows(trace, worst.tid), worst.waited_share) if worst is not None else None
    if interval is not None:
        interval = (max(0.0, interval[0]), min(1.0, interval[1]))
        starving = worst if interval[0] > threshold else None  # judged on the interval, not one estimate
    else:
        starving = starving_thread(threads, threshold)
    others = [r for r in threads if starving is None or r.tid != starving.tid] or threads
    if held is not None:
        holder = max(others, key=lambda r: r.held_share or 0.0, default=None)
    else:
        holder = max(others, key=lambda r: r.on_cpu_share, default=None)
    windows = [c.value for c in trace.counters if c.name == CONTENTION]
    contention = sum(windows) / len(windows) if windows else None
    notes = list(notes or [])
    if not trace.meta.get("schedstat", True):
        notes.append("no /proc schedstat: run-queue wait is not excluded from waited time")
    if not trace.meta.get("gilknocker", True):
        notes.append("gilknocker not installed: no contention metric")
    free = starving is not None and starving.contention is not None and starving.contention < FREE_GIL
    function = held[holder.tid].top_function() if held and holder is not None and holder.tid in held else None
    return GilReport(workload, threads, spans, starving, holder, contention, threshold, held is not None, notes,
                     gil_was_free=free, holder_function=function, waited_ci=interval)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _ci(report: GilReport) -> str:
    return "" if report.waited_ci is None else f" (thread's 95% interval {_pct(report.waited_ci[0])}–{_pct(report.waited_ci[1])})"


def finding(report: GilReport) -> str:
    """The one-line conclusion, e.g. 'thread compute is starved: waited 63% of step spans; ...'."""
    holder = report.holder
    if report.gil_was_free:
        worst = report.worst_span(report.starving)
        return (f"thread {worst.thread} was blocked {_pct(worst.waited_share)} of {worst.span} spans, but the GIL "
                f"was mostly free then (gilknocker contention {report.starving.contention:.2f}): it waits on "
                "something else (I/O, sleep, a lock)")
    if report.starving is not None:
        worst = report.worst_span(report.starving)
        text = (f"thread {worst.thread} is starved of the GIL: waited {_pct(worst.waited_share)} of "
                f"{worst.span} spans{_ci(report)} (on CPU {_pct(worst.on_cpu_share)})")
    elif report.near_threshold:
        top = max(report.threads, key=lambda r: r.waited_share)
        text = (f"inconclusive: thread {top.thread}'s waited share is near the {_pct(report.threshold)} threshold: "
                f"{_pct(top.waited_share)} of its span time, 95% interval {_pct(report.waited_ci[0])}–"
                f"{_pct(report.waited_ci[1])}")
    else:
        top = max(report.threads, key=lambda r: r.waited_share)
        text = (f"no GIL starvation: no thread waits more than {_pct(report.threshold)} of its span time "
                f"(most: {top.thread} {_pct(top.waited_share)} of {report.worst_span(top).span} spans{_ci(report)})")
    if holder is not None:
        busy = report.busiest_span(holder)
        if report.pyspy:
            text += f"; thread {busy.thread} held the GIL {_pct(busy.held_share)} of {busy.span} spans"
            if report.holder_function:
                text += f", mostly in {report.holder_function}"
        else:
            text += (f"; thread {busy.thread} was on CPU {_pct(busy.on_cpu_share)} of {busy.span} spans "
                     "(GIL holding n/a without py-spy)")
    return text


def share_table(report: GilReport) -> list[str]:
    """Per (thread, span) rows as text lines: held, waited, on-CPU shares and the contention metric."""
    lines = ["thread | span | spans | wall ms | held | waited | on CPU | run queue | contention"]
    for r in sorted(report.spans, key=lambda r: (r.thread, r.span)):
        queue = "n/a" if r.run_queue_ns is None else _pct(r.run_queue_ns / r.wall_ns)
        knock = "n/a" if r.contention is None else f"{r.contention:.2f}"
        lines.append(f"{r.thread} | {r.span} | {r.spans} | {r.wall_ns / 1e6:.0f} | {_pct(r.held_share)} | "
                     f"{_pct(r.waited_share)} | {_pct(r.on_cpu_share)} | {queue} | {knock}")
    return lines


def to_feedback(report: GilReport, evidence: list[Evidence]) -> Feedback:
    """The report as the probe's Feedback (verdict, numbers, locality, next probes)."""
    nan = float("nan")
    numbers: dict[str, Measure] = {}
    worst = max(report.threads, key=lambda r: r.waited_share, default=None)  # the thread waited_ci is of
    for r in report.threads:
        numbers[f"{r.thread}.held"] = Measure(nan if r.held_share is None else 100 * r.held_share, "%", n=r.spans)
        waited = numbers[f"{r.thread}.waited"] = Measure(100 * r.waited_share, "%", n=r.spans)
        if report.waited_ci is not None and r is worst:
            waited.ci_low, waited.ci_high = (100 * x for x in report.waited_ci)
        numbers[f"{r.thread}.on_cpu"] = Measure(100 * r.on_cpu_share, "%", n=r.spans)
    if report.contention is not None:
        numbers["gil_contention"] = Measure(report.contention, "(gilknocker, 0-1)")
    details: dict[str, Any] = {"table": share_table(report), "threads": [r.to_dict() for r in report.threads],
                               "spans": [r.to_dict() for r in report.spans], "threshold": report.threshold,
                               "sources": {"py-spy": report.pyspy, "gilknocker": report.contention is not None},
                               "notes": report.notes}
    if not report.threads:
        return Feedback("gil", "inconclusive", "the workload recorded no spans with CPU time on any thread",
                        numbers, evidence=evidence, details=details,
                        next_probes=["wrap each thread's units of work in `with span(...)` and rerun"])
    text = finding(report)
    if report.notes:
        text += f" [{'; '.join(report.notes)}]"
    locality: dict[str, Any] = {}
    if report.gil_was_free:
        worst = report.worst_span(report.starving)
        return Feedback("gil", "inconclusive", text, numbers, {"thread": worst.thread, "span": worst.span},
                        evidence, [f"infragent record {report.workload} and look at what {worst.thread} "
                                   f"blocks on inside {worst.span}"], details)
    if report.starving is not None:
        worst = report.worst_span(report.starving)
        locality = {"thread": worst.thread, "span": worst.span}
        if report.holder is not None:
            locality.update(holder=report.holder.thread, holder_span=report.busiest_span(report.holder).span)
            if report.holder_function:
                locality["holder_function"] = report.holder_function
        holder = report.holder.thread if report.holder else "the holding thread"
        next_probes = [f"move {holder}'s per-item Python work into torch ops that release the GIL, "
                       "or into one batched call per step",
                       f"rerun infragent gil {report.workload} to confirm {worst.thread} stops waiting"]
        return Feedback("gil", "fail", text, numbers, locality, evidence, next_probes, details)
    if report.near_threshold:
        return Feedback("gil", "inconclusive", text, numbers, locality, evidence,
                        [f"rerun infragent gil {report.workload} with a longer workload (more spans narrow the "
                         "interval)"], details)
    return Feedback("gil", "pass", text, numbers, locality, evidence,
                    [f"infragent record {report.workload} (where the time goes, if not the GIL)"], details)


def run_gil(workload_name: str, pyspy: bool = True, rate: int = 500, interval_ms: float = 25.0,
            threshold: float = WAIT_THRESHOLD, timeout_s: float = 300.0, code: Path | None = None,
            env: dict[str, str] | None = None, stall_s: float = STALL_S) -> Feedback:
    """Run module:function in a child process (from the checkout `code`, with env added, when given) and
    report, per thread and span, GIL held and waited shares. A child that hangs (no CPU work for stall_s, and
    deaf to the interrupt) is run once more while the budget allows; its stacks are kept."""
    out_dir = artifact_dir() / f"gil-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 1_000_000:06d}"
    out_dir.mkdir(parents=True)
    try:
        rec = record_child(workload_name, out_dir, pyspy=pyspy, rate=rate, interval_ms=interval_ms,
                           timeout_s=timeout_s, code=code, env=env, stall_s=stall_s)
    except ChildFailed as err:
        return Feedback("gil", "inconclusive", str(err), details={"traceback": err.traceback},
                        next_probes=[f"run {workload_name} directly to check that it works"])
    except ChildStuck as stuck:
        return stuck_feedback(workload_name, stuck)
    except subprocess.TimeoutExpired:  # the child was still starting (Python, torch, the workload's module)
        return Feedback("gil", "inconclusive", f"inconclusive: budget: workload {workload_name} gave nothing within "
                        f"budget_s={timeout_s:g} (stopped before it started: the child's start-up alone took "
                        "longer than the budget)",
                        next_probes=[f"infragent gil {workload_name} --budget-s {max(30.0, 4 * timeout_s):g} "
                                     "(a budget that leaves the child time to start)"])
    feedback = _judge(workload_name, rec, threshold, out_dir)
    meta = Trace.load(rec.trace_path).meta
    if meta.get("stopped_at_budget") and rec.stalled_s is not None:
        return replace(feedback, verdict="inconclusive",
                       finding=f"inconclusive: stalled: the workload did no CPU work for {rec.stalled_s:g} s and was "
                               f"interrupted after {meta['workload_wall_ns'] / 1e9:.3g} s; from the samples until "
                               f"then: {feedback.finding}",
                       details={**feedback.details, "stalled_s": rec.stalled_s})
    if meta.get("stopped_at_budget"):  # interrupted at timeout_s: the trace holds what ran until then
        return over_budget(feedback, timeout_s, meta["workload_wall_ns"] / 1e9, "the samples of the run until then")
    return feedback


def stuck_feedback(workload_name: str, stuck: ChildStuck) -> Feedback:
    """A workload that hung in every try: inconclusive, naming where its main thread was, its stacks the evidence."""
    evidence = [Evidence.of(stuck.dump_path, "the hung child's thread stacks (py-spy dump) and kernel wait channels")]
    tries = sum(note.startswith("try ") for note in stuck.notes)
    return Feedback("gil", "inconclusive", f"inconclusive: stuck: {stuck}{' (both tries)' if tries > 1 else ''}; "
                                           f"its main thread was in {stuck.where}",
                    evidence=evidence, details={"stack_dump": stuck.dump, "notes": stuck.notes},
                    next_probes=[f"run {workload_name} directly: does it finish on its own?",
                                 f"read {stuck.dump_path} for the lock or call it waits on"])


def _judge(workload_name: str, rec: GilRecording, threshold: float, out_dir: Path) -> Feedback:
    trace = Trace.load(rec.trace_path)
    if not any(s.cpu_ns is not None and s.dur_ns > 0 for s in trace.spans):  # no spans: whole threads
        evidence = [Evidence.of(rec.trace_path, "child trace: schedstat, blocked-state and gilknocker counters")]
        if rec.pyspy_path is not None:
            evidence.append(Evidence.of(rec.pyspy_path, "py-spy --gil samples (speedscope)"))
        return threads_feedback(workload_name, trace, rec.held, rec.states, threshold, rec.notes, evidence,
                                {SAMPLER_THREAD})
    report = gil_report(workload_name, trace, rec.held, threshold, rec.notes)
    shares = out_dir / "shares.json"
    shares.write_text(json.dumps({"threads": [r.to_dict() for r in report.threads],
                                  "spans": [r.to_dict() for r in report.spans],
                                  "span_intervals": span_records(trace)}))
    evidence = [Evidence.of(rec.trace_path, "child trace: spans with CPU time, schedstat and gilknocker counters")]
    if rec.pyspy_path is not None:
        evidence.append(Evidence.of(rec.pyspy_path, "py-spy --gil samples (speedscope)"))
    evidence.append(Evidence.of(shares, "per thread, span name and span interval: held/waited shares"))
    return to_feedback(report, evidence)
