"""A step worker forked from the zygote runs its own copy of the code (not the zygote's infragent), gives the
tokens a fresh interpreter gives, says why when it dies, and the zygote can be turned off; two children run a
unit in lockstep, one engine step each in turn, with the answers a unit run whole gives."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from engine_checkout import planted_checkout
from infragent.engine.config import EngineConfig
from infragent.probes.step_bench import StepBenchError, StepWorker, Unit, lockstep
from infragent.probes.step_child import ForkedChild

CONFIG = json.loads(EngineConfig(model="llama", max_model_len=256, max_num_seqs=2).to_json())
UNIT = Unit([[1, 504, 3458, 282, 4649, 314], [1, 563, 14881, 26]], 4)


def test_a_forked_child_runs_its_own_code_and_matches_a_fresh_interpreter(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = planted_checkout(tmp_path / "checkout")
    forked = StepWorker(checkout, CONFIG, "forked").ready()
    monkeypatch.setenv("INFRAGENT_STEP_ZYGOTE", "0")
    fresh = StepWorker(checkout, CONFIG, "fresh").ready()
    try:
        assert isinstance(forked.proc, ForkedChild) and not isinstance(fresh.proc, ForkedChild)
        assert forked.code == fresh.code == str((checkout / "src" / "infragent").resolve())
        assert forked.tokens(UNIT) == fresh.tokens(UNIT)
    finally:
        forked.close()
        fresh.close()


def test_a_dead_child_is_seen_dead_with_its_stderr(tmp_path: Path) -> None:
    worker = StepWorker(None, CONFIG, "doomed").ready()
    assert worker.alive()
    os.kill(worker.proc.pid, signal.SIGKILL)
    with pytest.raises(StepBenchError, match="doomed engine's step worker died"):
        worker.run(UNIT)
    assert not worker.alive()
    broken = StepWorker(None, {**CONFIG, "no_such_field": 1}, "broken")
    with pytest.raises(StepBenchError, match="no_such_field"):
        broken.ready()


def test_a_child_reports_the_run_queue_wait_another_process_adds(tmp_path: Path) -> None:
    """With a spinning process pinned to the child's one CPU, the scheduler splits that CPU: the child's
    steps spend a large share of their wall time runnable but waiting, and it says so per phase."""
    import subprocess
    import sys

    worker = StepWorker(None, CONFIG, "pinned").ready()
    cpu = {sorted(os.sched_getaffinity(0))[0]}
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(worker.proc.pid, cpu)
        os.sched_setaffinity(hog.pid, cpu)
        worker.warm(UNIT)
        answers = [worker.run(UNIT) for _ in range(3)]
    finally:
        hog.kill()
        hog.wait()
        worker.close()
    for answer in answers:
        for phase in ("prefill", "decode"):
            assert 0 <= answer[f"{phase}_wait_ns"] <= answer[f"{phase}_ns"]
    wall = sum(a["prefill_ns"] + a["decode_ns"] for a in answers)
    waited = sum(a["prefill_wait_ns"] + a["decode_wait_ns"] for a in answers)
    assert waited / wall > 0.25, (waited, wall)


def test_two_children_in_lockstep_take_their_steps_in_turn_and_answer_as_a_whole_unit() -> None:
    a, b = StepWorker(None, CONFIG, "a"), StepWorker(None, CONFIG, "b")
    try:
        a.ready(), b.ready()
        whole = a.run(UNIT)
        turns: list[str] = []
        for worker in (a, b):
            step = worker.step
            worker.step = lambda step=step, name=worker.name: (turns.append(name), step())[1]  # type: ignore[method-assign]
        ran_a, ran_b = lockstep(a, b, UNIT)
        assert ran_a["tokens"] == ran_b["tokens"] == whole["tokens"]
        assert ran_a["steps"] == ran_b["steps"] == whole["steps"] == UNIT.max_tokens  # a step per token here
        assert turns == ["a", "b"] * whole["steps"]
        assert a.run(UNIT)["tokens"] == whole["tokens"]  # the protocol is back to whole units after
    finally:
        a.close()
        b.close()
