"""Shared fixtures: the real model and tokenizer are loaded once per test session."""
from __future__ import annotations

import gc
import os
import resource
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import their reference helpers by name


@pytest.fixture(scope="session")
def llama_weights():
    """Spec and fp32 weights of SmolLM2-135M from the GGUF."""
    from infragent.engine.models.llama import load_llama

    return load_llama()


@pytest.fixture(autouse=True, scope="module")
def _release_module_objects():
    """Collect a module's engines, servers and models once its tests are done (cycles hold them otherwise),
    so that the next module's do not pile on top: the suite's peak RSS stays bounded."""
    yield
    gc.collect()


_RSS_STEPS: list[tuple[int, str]] = []  # (resident bytes after the test, test id)


def _resident_bytes() -> int:
    """This process's resident set now (Linux /proc; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@pytest.hookimpl(trailing=True)
def pytest_runtest_teardown(item, nextitem):  # noqa: ANN001, ANN201 - pytest's hook signature
    _RSS_STEPS.append((_resident_bytes(), item.nodeid))


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ANN001, ANN201
    """The suite's peak RSS (the budget is 4 GB) and where the resident set grew most."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    terminalreporter.write_line(f"peak RSS of the pytest process: {peak / 1e9:.2f} GB")
    growth = sorted(((after - before, name) for (before, _), (after, name) in zip(_RSS_STEPS, _RSS_STEPS[1:])),
                    reverse=True)[:5]
    if growth and growth[0][0] > 0:
        terminalreporter.write_line("largest resident-set growth after a test: " + "; ".join(
            f"{name} +{delta / 1e6:.0f} MB" for delta, name in growth if delta > 0))
