"""Untimed work (the quality gates) runs on the cores other processes leave free: a torch thread team that
shares a core with a busy process waits at every parallel region for its descheduled member (beside one spinner
on 2 cores a quality batch took 41-221 s at 2 threads and 23-25 s at 1)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from infragent.engine.config import EngineConfig
from infragent.probes import machine, quality
from infragent.probes.machine import free_cores
from infragent.probes.quality import untimed_threads

CORES = len(os.sched_getaffinity(0))


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores: one for the spinner, one left free")
def test_a_spinning_process_takes_a_core_from_the_free_ones() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert free_cores(0.5) < CORES
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.parametrize("others, expected", [(0.0, 2), (0.3, 2), (0.9, 1), (1.2, 1), (3.5, 1), (None, 2)])
def test_free_cores_round_what_others_use_and_leave_at_least_one(monkeypatch: pytest.MonkeyPatch,
                                                                   others: float | None, expected: int) -> None:
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(machine, "others_cores_now", lambda window_s: others)
    assert free_cores() == expected


def test_busy_cores_cap_configs_that_name_no_threads_and_the_process_count_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quality.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(quality, "free_cores", lambda: 2)
    before = torch.get_num_threads()
    named, plain = EngineConfig(model="llama", num_threads=3), EngineConfig(model="llama")
    with untimed_threads([named, plain]) as (configs, note):
        torch.set_num_threads(1)  # what building an engine does
        assert [c.num_threads for c in configs] == [3, 2]
        assert "2 free cores" in note and "2 of 4 busy" in note
    assert torch.get_num_threads() == before
    monkeypatch.setattr(quality, "free_cores", lambda: 4)
    with untimed_threads([plain]) as (configs, note):
        assert configs == [plain] and note == ""  # a quiet machine: the engine's own default
