"""The gil probe: the starved thread is named with its held/waited GIL shares, and the fix clears it.

Synthetic traces pin the arithmetic (waited = wall - CPU - run queue; held spread by CPU + run queue);
the planted workloads in gil_cases.py run in real child processes under py-spy and gilknocker.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infragent.analysis import gil_shares as gs
from infragent.analysis.gil_shares import HeldSamples, Series, parse_speedscope, span_rows, thread_rows, top_level
from infragent.probes import gil as gil_probe
from infragent.probes import gil_child
from infragent.probes.gil import WAIT_THRESHOLD, gil_report, find_pyspy, run_gil, to_feedback
from infragent.trace_model import CounterEvent, SpanEvent, Trace

TESTS = Path(__file__).parent
MS = 1_000_000


# ---------------------------------------------------------------- synthetic traces (fast, exact)

def _trace(threads: dict[int, tuple[str, float, float]], span_ms: int = 100, life_ms: int | None = None,
           schedstat: bool = True, contention: float | None = None) -> Trace:
    """Each tid -> (span name, CPU share, run-queue share): ten contiguous 10 ms spans over span_ms, and
    schedstat counters every 10 ms over life_ms (the thread keeps the same shares outside its spans)."""
    life_ms = life_ms or span_ms
    trace = Trace(threads={tid: f"t{tid}" for tid in threads} | {99: gil_child.SAMPLER_THREAD},
                  meta={"start_ns": 0, "sample_interval_ns": 10 * MS, "schedstat": schedstat})
    step = span_ms // 10
    for tid, (name, cpu, queue) in threads.items():
        for i in range(10):
            trace.spans.append(SpanEvent(name, i * step * MS, (i + 1) * step * MS, tid, cpu_ns=round(cpu * step * MS)))
        if schedstat:
            for t in range(0, life_ms + 1, 10):
                trace.counters.append(CounterEvent(f"{gs.CPU}{tid}", t * MS, cpu * t * MS, 99))
                trace.counters.append(CounterEvent(f"{gs.RUN_DELAY}{tid}", t * MS, queue * t * MS, 99))
    if contention is not None:
        for t in range(10, life_ms + 1, 10):
            trace.counters.append(CounterEvent(gs.CONTENTION, t * MS, contention, 99))
    trace.spans.sort(key=lambda s: s.start_ns)
    trace.counters.sort(key=lambda c: c.ts_ns)
    return trace


def _by_thread(rows):
    return {r.thread: r for r in rows}


def test_waited_is_off_cpu_time_minus_run_queue_wait():
    trace = _trace({1: ("step", 0.2, 0.1), 2: ("transfer", 0.95, 0.0)})
    rows = _by_thread(thread_rows(trace))
    assert rows["t1"].waited_share == pytest.approx(0.7)
    assert rows["t1"].on_cpu_share == pytest.approx(0.2)
    assert rows["t1"].run_queue_ns == pytest.approx(10 * MS)
    assert rows["t2"].waited_share == pytest.approx(0.05)
    assert rows["t1"].held_share is None  # no py-spy samples given
    assert gil_child.SAMPLER_THREAD not in rows  # no spans: never a row
    assert gs.starving_thread(list(rows.values()), WAIT_THRESHOLD).thread == "t1"


def test_an_oversubscribed_machine_is_not_read_as_gil_waiting():
    # on CPU half the time and runnable the other half: the cores were busy, the GIL was not in the way
    busy = _by_thread(thread_rows(_trace({1: ("step", 0.5, 0.5)})))["t1"]
    assert busy.waited_share == pytest.approx(0.0)
    assert gs.starving_thread([busy], WAIT_THRESHOLD) is None
    blind = _by_thread(thread_rows(_trace({1: ("step", 0.5, 0.5)}, schedstat=False)))["t1"]
    assert blind.waited_share == pytest.approx(0.5) and blind.run_queue_ns is None  # without schedstat


def test_held_time_is_spread_over_the_threads_spans_by_cpu_and_run_queue_time():
    held = {2: HeldSamples(2, "t2", 45, 90 * MS), 1: HeldSamples(1, "t1", 1, 2 * MS)}
    rows = _by_thread(thread_rows(_trace({1: ("step", 0.2, 0.1), 2: ("transfer", 0.95, 0.0)}), held))
    assert rows["t2"].held_share == pytest.approx(0.9)
    assert rows["t1"].held_share == pytest.approx(0.02)
    # the thread lives 200 ms but its spans cover the first 100: half its held time falls outside them
    longer = _by_thread(thread_rows(_trace({2: ("transfer", 0.95, 0.0)}, life_ms=200), held))
    assert longer["t2"].held_share == pytest.approx(0.45)
    nothing = _by_thread(thread_rows(_trace({3: ("idle", 0.1, 0.0)}), held))
    assert nothing["t3"].held_share == 0.0  # py-spy never saw it hold the GIL


def test_span_rows_split_by_name_and_nested_spans_do_not_double_count():
    trace = _trace({1: ("step", 0.2, 0.0)})
    trace.spans.append(SpanEvent("matmul", 1 * MS, 3 * MS, 1, cpu_ns=2 * MS))  # inside the first step
    assert len(top_level(trace.spans)) == 10
    rows = {r.span: r for r in span_rows(trace)}
    assert set(rows) == {"step", "matmul"}
    assert rows["matmul"].waited_share == pytest.approx(0.0) and rows["step"].waited_share == pytest.approx(0.8)
    assert _by_thread(thread_rows(trace))["t1"].wall_ns == 100 * MS  # top-level spans only


def test_series_interpolates_and_windowed_contention_joins_spans():
    series = Series([0, 10, 20], [0.0, 5.0, 5.0])
    assert series.at(5) == 2.5 and series.at(-3) == 0.0 and series.at(99) == 5.0
    assert series.delta(5, 15) == pytest.approx(2.5)
    trace = Trace(counters=[CounterEvent(gs.CONTENTION, 10, 0.8), CounterEvent(gs.CONTENTION, 20, 0.2)],
                  meta={"start_ns": 0})
    assert gs.window_mean(trace, gs.CONTENTION, [SpanEvent("s", 5, 15, 1)]) == pytest.approx(0.5)
    assert gs.window_mean(trace, gs.CONTENTION, [SpanEvent("s", 30, 40, 1)]) is None


def test_speedscope_samples_per_thread_and_main_thread_only_inside_the_workload():
    data = {"shared": {"frames": [{"name": gs.WORKLOAD_FRAME}, {"name": "work"}, {"name": "_find_and_load"}]},
            "profiles": [
                {"name": 'Thread 100 "MainThread"', "samples": [[0, 1], [2], [2]], "weights": [0.002] * 3},
                {"name": 'Thread 101 "kv "x" transfer"', "samples": [[1]] * 4, "weights": [0.002] * 4},
                {"name": 'Thread 102 ""', "samples": [[1]], "weights": [0.002]},
                {"name": "not a thread", "samples": [[1]], "weights": [1.0]}]}
    held = parse_speedscope(data, main_tid=100)
    assert set(held) == {100, 101, 102}
    assert (held[100].samples, held[100].held_ns) == (1, 2 * MS)  # import-time samples dropped
    assert (held[101].name, held[101].held_ns) == ('kv "x" transfer', 8 * MS)
    assert gil_child._run_workload.__name__ == gs.WORKLOAD_FRAME  # the frame the filter looks for


def test_report_names_the_starved_thread_and_the_holder():
    held = {2: HeldSamples(2, "t2", 45, 90 * MS)}
    trace = _trace({1: ("step", 0.2, 0.1), 2: ("transfer", 0.95, 0.0)}, contention=0.8)
    fb = to_feedback(gil_report("w:f", trace, held), [])
    assert fb.verdict == "fail"
    assert fb.locality == {"thread": "t1", "span": "step", "holder": "t2", "holder_span": "transfer"}
    assert fb.finding.startswith("thread t1 is starved of the GIL: waited 70% of step spans")
    assert "thread t2 held the GIL 90% of transfer spans" in fb.finding
    assert fb.numbers["t1.waited"].value == pytest.approx(70) and fb.numbers["t2.held"].value == pytest.approx(90)
    assert fb.numbers["gil_contention"].value == pytest.approx(0.8)
    assert "torch ops that release the GIL" in fb.next_probes[0]
    json.loads(fb.to_json())


def test_report_without_pyspy_says_held_is_na_and_without_spans_is_inconclusive():
    fb = to_feedback(gil_report("w:f", _trace({1: ("step", 0.2, 0.1), 2: ("transfer", 0.95, 0.0)}), None), [])
    assert fb.verdict == "fail" and fb.locality["holder"] == "t2"  # the most on-CPU other thread
    assert "GIL holding n/a without py-spy" in fb.finding and fb.numbers["t2.held"].text() == "n/a %"
    assert json.loads(fb.to_json())["numbers"]["t2.held"]["value"] is None
    calm = to_feedback(gil_report("w:f", _trace({1: ("step", 0.9, 0.05)}), None), [])
    assert calm.verdict == "pass" and "no GIL starvation" in calm.finding
    empty = to_feedback(gil_report("w:f", Trace(threads={1: "main"}), None), [])
    assert empty.verdict == "inconclusive"


def test_blocked_while_the_gil_was_free_is_not_called_gil_starvation():
    fb = to_feedback(gil_report("w:f", _trace({1: ("poll", 0.05, 0.0)}, contention=0.02), None), [])
    assert fb.verdict == "inconclusive" and fb.locality == {"thread": "t1", "span": "poll"}
    assert "the GIL was mostly free" in fb.finding and "contention 0.02" in fb.finding


# ---------------------------------------------------------------- planted workloads in a child process

@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """run_gil from the tests directory (so gil_cases resolves) with artifacts in a temporary folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(TESTS)
        mp.setenv("INFRAGENT_ARTIFACTS", str(tmp_path_factory.mktemp("gil")))
        yield run_gil


@pytest.fixture(scope="module")
def contended(probe):
    return probe("gil_cases:contended")


@pytest.fixture(scope="module")
def released(probe):
    return probe("gil_cases:released")


def _rows(fb):
    return {r["thread"]: r for r in fb.details["threads"]}


HAVE_PYSPY = find_pyspy() is not None


def test_planted_contention_names_compute_as_starved_by_kv_transfer(contended):
    fb = contended
    assert fb.verdict == "fail", fb.render()
    assert fb.locality["thread"] == "compute" and fb.locality["span"] == "step"
    assert fb.locality["holder"] == "kv-transfer" and fb.locality["holder_span"] == "transfer"
    rows = _rows(fb)
    assert rows["compute"]["waited_share"] > 0.5, fb.details["table"]  # measured about 0.9
    assert rows["kv-transfer"]["waited_share"] < WAIT_THRESHOLD, fb.details["table"]
    assert fb.finding.startswith("thread compute is starved of the GIL: waited ")
    assert fb.numbers["gil_contention"].value > 0.4  # gilknocker: about 0.8 here
    assert fb.details["sources"]["py-spy"] is HAVE_PYSPY
    if HAVE_PYSPY:
        assert rows["kv-transfer"]["held_share"] > 0.6, fb.details["table"]  # measured about 0.95
        assert rows["compute"]["held_share"] < 0.2, fb.details["table"]
        assert "thread kv-transfer held the GIL" in fb.finding
    for item in fb.evidence:
        assert hashlib.sha256(Path(item.path).read_bytes()).hexdigest() == item.sha256
    names = {Path(e.path).name for e in fb.evidence}
    assert {"trace.json", "shares.json"} <= names and ("pyspy.speedscope.json" in names) is HAVE_PYSPY
    shares = json.loads(Path(next(e.path for e in fb.evidence if e.path.endswith("shares.json"))).read_text())
    assert {s["thread"] for s in shares["span_intervals"]} == {"compute", "kv-transfer"}


def test_moving_the_loop_into_a_torch_op_clears_the_contention(released, contended):
    fb = released
    assert fb.verdict == "pass", fb.render()
    rows = _rows(fb)
    assert rows["compute"]["waited_share"] < WAIT_THRESHOLD, fb.details["table"]  # measured about 0.07
    assert rows["compute"]["waited_share"] < _rows(contended)["compute"]["waited_share"] - 0.4
    assert fb.numbers["gil_contention"].value < contended.numbers["gil_contention"].value
    if HAVE_PYSPY:
        assert rows["kv-transfer"]["held_share"] < 0.5, fb.details["table"]  # measured about 0.1
    assert "no GIL starvation" in fb.finding and fb.locality == {}


def test_without_pyspy_the_in_process_numbers_still_name_the_starved_thread(probe, monkeypatch):
    monkeypatch.setattr(gil_probe, "find_pyspy", lambda: None)
    fb = probe("gil_cases:contended")
    assert fb.verdict == "fail" and fb.locality["thread"] == "compute", fb.render()
    assert all(r["held_share"] is None for r in fb.details["threads"])
    assert "py-spy not found" in fb.finding and "n/a" in fb.finding
    assert fb.details["sources"]["py-spy"] is False


def test_a_thread_that_sleeps_in_its_spans_is_not_blamed_on_the_gil(probe):
    fb = probe("gil_cases:sleepy")
    assert fb.verdict == "inconclusive" and fb.locality == {"thread": "poller", "span": "poll"}, fb.render()
    assert _rows(fb)["poller"]["waited_share"] > 0.5 and "the GIL was mostly free" in fb.finding


def test_a_failing_workload_is_inconclusive_with_its_traceback(probe):
    fb = probe("gil_cases:broken")
    assert fb.verdict == "inconclusive"
    assert "ValueError: planted failure in the workload" in fb.finding
    assert "Traceback" in fb.details["traceback"]


def test_a_timeout_kills_the_child_and_py_spy(probe, tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    fb = probe("gil_cases:contended", timeout_s=1.0)
    assert fb.verdict == "inconclusive" and fb.finding.startswith("inconclusive: budget") and "budget_s=1" in fb.finding
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(tmp_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                leftovers.append(pid)
        except OSError:
            continue
    assert leftovers == []


def test_cli_gil_json(tmp_path):
    env = {"PYTHONPATH": str(TESTS.parent / "src"), "INFRAGENT_ARTIFACTS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "infragent.cli", "gil", "gil_cases:broken", "--json"], cwd=TESTS,
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["probe"] == "gil" and data["verdict"] == "inconclusive" and "planted failure" in data["finding"]
