"""Budgets kept: a probe on endless work stopped by its budget comes back, says "inconclusive: budget", and
answers from what it had. How soon it comes back is a figure, not a test: benchmarks/agent_feedback.py."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from infragent.probes.budget import BudgetExceeded, Deadline
from infragent.probes.gil import find_pyspy, run_gil
from infragent.probes.record import run_record
from budget_cases import endless_steps

TESTS = Path(__file__).parent


def test_deadline_stops_python_work_and_lets_finished_work_be() -> None:
    with Deadline(0.2) as d:
        endless_steps()
    assert d.stopped and d.elapsed_s >= 0.2  # stopped, not before its budget (figures: benchmarks/agent_feedback.py)
    with Deadline(5.0) as quick:
        total = sum(range(1000))
    assert not quick.stopped and total == 499500
    time.sleep(0.05)  # nothing pending is raised later


def test_deadline_lets_a_workload_catching_exception_be_stopped() -> None:
    def stubborn() -> None:
        while True:
            try:
                sum(range(10_000))
            except Exception:  # a workload's broad handler must not swallow the budget
                pass
    with Deadline(0.1) as d:
        stubborn()
    assert d.stopped
    assert issubclass(BudgetExceeded, BaseException) and not issubclass(BudgetExceeded, Exception)


def test_record_stops_at_its_budget_with_the_spans_closed_until_then(tmp_path) -> None:
    feedback = run_record(endless_steps, tmp_path / "trace.json", budget_s=1.0)  # endless: only the budget ends it
    assert feedback.verdict == "inconclusive"
    assert feedback.finding.startswith("inconclusive: budget")
    assert "step" in feedback.finding  # the attribution of what ran
    assert feedback.numbers["spans"].value > 10
    assert any("budget_s=2" in p for p in feedback.next_probes)


@pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")
def test_gil_interrupts_a_long_workload_and_answers_from_what_ran(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(TESTS)  # where gil_cases resolves
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    # endless: only the budget ends it. The child's start-up comes out of the budget: beside a CPU hog and the
    # suite it once took over 4 s (then the honest answer is "stopped before it started"), so 4 s are left for it.
    budget = 8.0
    feedback = run_gil("gil_cases:contended_endless_bare", timeout_s=budget)
    assert feedback.verdict == "inconclusive", feedback.finding
    assert feedback.finding.startswith("inconclusive: budget")
    assert "kv-transfer" in feedback.finding  # the holder, from the samples taken until the interrupt


def test_gil_stopped_before_the_workload_started_asks_for_a_larger_budget(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(TESTS)
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    feedback = run_gil("gil_cases:contended_endless_bare", timeout_s=0.05)  # far less than any child's start-up
    assert feedback.verdict == "inconclusive", feedback.finding
    assert "stopped before it started" in feedback.finding and "start-up" in feedback.finding
    assert feedback.next_probes == ["infragent gil gil_cases:contended_endless_bare --budget-s 30 (a budget that "
                                    "leaves the child time to start)"]


@pytest.fixture()
def mock_url():
    """The mock OpenAI endpoint, served from its own event loop in a thread."""
    import asyncio
    import threading

    from infragent.probes.mock_endpoint import serve_mock

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(serve_mock(), loop).result(10)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_loadgen_stops_sending_at_its_budget_and_reports_what_finished(mock_url) -> None:
    from infragent.probes.loadgen import LoadConfig, run_loadgen

    config = LoadConfig(base_url=mock_url, num_prompts=100, request_rate=10.0, arrival="constant", warmup=1,
                        random_input_len=16, random_output_len=4, repeats=3, progress=False, budget_s=1.5)
    feedback = run_loadgen(config)  # 3 repeats of 10 s of arrivals: only the budget ends it after the first
    assert feedback.verdict == "inconclusive" and feedback.finding.startswith("inconclusive: budget")
    assert "1 of 3 repeats" in feedback.finding
    done = feedback.numbers["request_throughput"]
    assert done.value > 0  # the requests that finished are measured, the unsent ones are not counted as failed
    assert "failed" not in feedback.finding


def test_quality_scores_no_batch_past_its_budget() -> None:
    from infragent.probes.quality import QualityPlan, quality_of

    plan = QualityPlan(windows=16, window=64, prompts=16, batch=4, max_tokens=4)
    feedback = quality_of("llama", {"kv_cache_dtype": "int8"}, plan, budget_s=0.01)  # spent loading the models
    assert feedback.verdict == "inconclusive" and feedback.finding.startswith("inconclusive: budget")
    assert "4 of 16 windows and 4 of 16 prompts" in feedback.finding  # one batch of each: what it has
    assert feedback.numbers["kl_divergence"].n == 4
