"""Shared fixtures (the real model's weights) and the suite's memory: what each module
built is released after it, and the peak resident set is reported at the end."""
from __future__ import annotations

import gc
import resource
import signal
import sys
from pathlib import Path

import pytest

from infragent.engine.build import give_back_freed_memory

sys.path.insert(0, str(Path(__file__).parent))  # tests import their reference helpers by name

# A suite started in the background (`make test &`, nohup, a CI runner's shell) inherits SIGINT ignored, and so
# would every process it starts: a Python child then never installs its Ctrl-C handler, and the tests that
# interrupt a run with SIGINT see it finish instead. The suite runs as if started from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def llama_weights():
    """Shape and fp32 weights of SmolLM2-135M from the GGUF, per test: loading takes about 0.6 s, and the
    0.54 GB is not held under the engines the module's later tests build."""
    from infragent.engine.models.llama import load_llama

    return load_llama()


@pytest.fixture(autouse=True, scope="module")
def _release_module_objects():
    """Collect a module's engines, servers and models once its tests are done (cycles hold them otherwise),
    so that the next module's do not pile on top: the suite's peak RSS stays bounded."""
    yield
    gc.collect()
    give_back_freed_memory()


_MARKS: list[tuple[str, int]] = []  # (test id, the resident set's high-water mark it raised, bytes)


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmRSS, VmHWM), in bytes; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _rss_bytes() -> int:
    return _status_bytes("VmRSS")


def pytest_runtest_logfinish(nodeid, location):  # noqa: ANN001, ANN201 - pytest's hook signature
    """Note the test (setup and teardown included) that raised the high-water mark of the resident set."""
    mark = _status_bytes("VmHWM")
    if mark > (_MARKS[-1][1] if _MARKS else 0):
        _MARKS.append((nodeid, mark))


@pytest.fixture(autouse=True)
def _release_after_growth():
    """After a test that grew the resident set, collect and give freed memory back (big engines freed in a
    cycle would wait for a full collection, and glibc keeps freed arenas)."""
    before = _rss_bytes()
    yield
    if _rss_bytes() - before > 100e6:
        gc.collect()
        give_back_freed_memory()


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ANN001, ANN201
    """The suite's peak RSS (the budget is 4 GB) and the tests that reached the highest."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    terminalreporter.write_line(f"peak RSS of the pytest process: {peak / 1e9:.2f} GB")
    raised = [(name, mark, mark - (_MARKS[i - 1][1] if i else 0)) for i, (name, mark) in enumerate(_MARKS)]
    if raised:
        terminalreporter.write_line("the tests that raised the high-water mark last: " + "; ".join(
            f"{name} to {mark / 1e9:.2f} GB (+{by / 1e6:.0f} MB)" for name, mark, by in raised[-12:]))


@pytest.fixture
def isa_restored():
    """Whatever instruction set a test chooses for the quantized-weight kernels, the next test starts from auto."""
    yield
    import torch

    torch.ops.infragent.qgemm_set_isa("auto")


@pytest.fixture(scope="module")
def kernels_built() -> None:
    """Where a compiler exists the native kernels must build: a compile error (KernelBuildError names it) fails
    the module's tests instead of skipping them. Without one, tests marked as needing them skip."""
    import shutil

    if shutil.which("c++") is not None:
        from infragent.engine.kernels import build

        build.load()
