"""Feedback an outside agent can use: budgets kept, bench on the right metric, check findings that say what
kind of error it is, replies that stay compact, factories adapted or refused with the fix, and user code
re-imported when it changes."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import agent_cases as cases
from infragent.agent.mcp.tool_errors import explain
from infragent.probes.bench import BenchError, run_bench
from infragent.probes.callables import forget_modules, from_file, refresh_modules, resolve, stamp_modules
from infragent.probes.check import run_check
from infragent.probes.compact import REPLY_LIMIT, compact, compact_json
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.inputs import InputsError, inputs_factory

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))


def test_bench_keeps_its_budget_on_one_second_callables():
    fb = run_bench(cases.one_second, cases.one_second_too, budget_s=2.0)
    assert fb.details["pairs"] == 0  # the warm-up calls used the budget: no pair was started past it
    assert fb.verdict == "inconclusive" and fb.finding.startswith("inconclusive: budget"), fb.finding
    assert fb.details["budget_hit"] and "budget_s=" in fb.next_probes[0]
    assert len(json.dumps(compact(fb))) <= REPLY_LIMIT


def test_bench_return_metric_reports_the_work_ratio_and_time_mode_warns():
    fb = run_bench(cases.fixed_fast, cases.fixed_slow, budget_s=3.0, metric="return")
    rate = fb.numbers["work_rate_ratio"]
    assert fb.verdict != "fail" and rate.value > 1, fb.render()  # never the wrong direction
    if fb.details["outcome"] != "contended":  # busy machine: an honest inconclusive; else x9.2 is decided
        assert fb.verdict == "pass" and rate.ci_low > 1 and rate.value >= rate.ci_low, fb.render()  # x9.2 quiet
    assert "the work per second" in fb.finding
    wall = run_bench(cases.fixed_fast, cases.fixed_slow, budget_s=2.0)
    assert wall.verdict == "inconclusive" and "WARNING" in wall.finding and "--metric return" in wall.finding, wall.finding
    assert wall.next_probes[0].startswith("bench with metric='return'")
    with pytest.raises(BenchError, match="return the work it did"):
        run_bench(cases.one_second_too, metric="return", budget_s=0.5)


def test_check_on_a_zeroed_column_names_shard_and_column_and_says_values_not_dtype():
    fb = run_check(cases.zeroed_column, cases.matmul, cases.inputs, partition="column:4", trials=6)
    assert fb.verdict == "fail" and fb.locality["shard"] == 2, fb.finding
    assert "column 700 only" in fb.finding and "values wrong, missing" in fb.finding, fb.finding
    assert "typical of" not in fb.finding and "bf16" not in fb.finding
    plain = run_check(cases.zeroed_column, cases.matmul, cases.inputs, trials=3)
    assert "values wrong, missing" in plain.finding and "typical of" not in plain.finding


@pytest.mark.parametrize("count", [3, 5, 7, 8])
def test_the_zeroed_column_is_localized_the_same_for_any_shard_width(count):
    fb = run_check(cases.zeroed_column, cases.matmul, cases.inputs, partition=f"column:{count}", trials=3)
    start, stop = fb.locality["range"]
    assert start <= 700 < stop and "column 700 only" in fb.finding, fb.finding
    assert f"shard {fb.locality['shard']} of column:{count}" in fb.finding and f"{start}:{stop}" in fb.finding


def test_check_stops_at_its_budget_and_says_so():
    slow = lambda x, w: (time.sleep(0.3), x @ w)[1]  # noqa: E731
    fb = run_check(slow, cases.matmul, cases.inputs, trials=20, guards=False, budget_s=1.0)
    assert fb.details["budget_hit"] and "stopped after" in fb.finding and fb.verdict == "inconclusive"
    assert fb.numbers["trials"].value < 20


def test_compact_replies_fit_4kb_whatever_the_feedback_holds():
    huge = Feedback("check", "fail", "x" * 50_000, {f"n{i}": Measure(i, "ms", i - 1, i + 1, 5) for i in range(500)},
                    {f"k{i}": "v" * 2000 for i in range(50)}, [], [f"probe {i} " * 100 for i in range(20)],
                    {"trials": [{"i": i, "err": [0.1] * 100} for i in range(1000)]})
    reply = compact(huge)
    assert len(json.dumps(reply).encode()) <= REPLY_LIMIT
    assert reply["verdict"] == "fail" and reply["numbers"]["n0"] == {"value": 0, "unit": "ms", "ci_low": -1,
                                                                       "ci_high": 1, "n": 5}
    full = json.loads(Path(reply["full"]).read_text())
    assert len(full["details"]["trials"]) == 1000  # nothing lost: the rest is in the artifact


def test_a_factory_written_as_seed_m_k_n_is_refused_with_the_fix_or_adapted():
    with pytest.raises(InputsError, match=r"your factory takes \(seed, m, k, n\); infragent calls "
                                          r"factory\(trial, generator\).*inputs_style='seed'"):
        inputs_factory(cases.seeded_inputs)
    adapted = inputs_factory(cases.seeded_inputs, "seed")
    fb = run_check(cases.matmul, cases.matmul, adapted, trials=3)
    assert fb.verdict == "pass"
    with pytest.raises(InputsError, match="give its other parameters defaults"):
        inputs_factory(cases.seed_only_inputs, "seed")


def test_an_error_in_user_code_is_answered_with_where_and_a_hint_not_a_traceback():
    try:
        run_check(cases.matmul, cases.matmul, cases.raising_inputs, trials=1)
    except Exception as err:  # noqa: BLE001 — the error an agent's call would raise
        text = explain(err, TESTS, "check")
    assert text.startswith("check: RuntimeError in your code at agent_cases.py:"), text
    assert "Hint: a shape does not fit" in text and "Traceback" not in text and "x @ w" not in text
    try:
        raise ValueError("bad")
    except ValueError as err:
        full = explain(err, TESTS, "check", tracebacks=True)
    assert "Traceback" in full


def test_a_finished_run_forgets_its_modules_and_closes_what_they_cached(tmp_path):
    """What a workload caches (engines and their threads) is freed once its run is over: its own close() is
    called, an imported function named close is not, and the next call imports the module afresh."""
    workload = tmp_path / "cached_workload.py"
    workload.write_text("import json\nCACHE = {'engine': object()}\nCLOSED = []\n\n"
                        "def close():\n    CLOSED.append(1)\n    CACHE.clear()\n\n"
                        "def f():\n    return len(CACHE)\n")
    borrowed = tmp_path / "borrowed_close.py"
    borrowed.write_text("from os import close\n\ndef g():\n    return 7\n")
    f, g = from_file(workload, "f"), from_file(borrowed, "g")
    assert f() == 1 and g() == 7
    module = sys.modules[f.__module__]
    assert forget_modules(tmp_path) == sorted([f.__module__, g.__module__])
    assert module.CLOSED == [1] and module.CACHE == {}  # closed once; os.close was never called on anything
    assert f.__module__ not in sys.modules and forget_modules(tmp_path) == []
    assert from_file(workload, "f")() == 1  # imported afresh


def test_an_edited_module_is_reimported_on_the_next_call(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "edited_kernel.py"
    module.write_text("def f():\n    return 1\n")
    assert resolve("edited_kernel:f")() == 1
    stamp_modules(tmp_path)
    assert refresh_modules(tmp_path) == []  # unchanged: nothing forgotten
    time.sleep(0.01)
    module.write_text("def f():\n    return 2\n\ndef g():\n    return 3\n")
    assert "edited_kernel" in refresh_modules(tmp_path)
    assert resolve("edited_kernel:f")() == 2 and resolve("edited_kernel:g")() == 3
    assert compact_json(Feedback("x", "pass", "ok"))  # a reply is JSON text
