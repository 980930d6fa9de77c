"""POST /start_profile and /stop_profile, as vLLM and SGLang take them: torch.profiler over the engine's steps,
started and stopped on the engine thread itself (between steps, so no step is cut in two), each step marked
ProfilerStep#N, the Kineto trace written as gzipped JSON to the server's --profile-dir.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import torch

WAIT_S = 60.0  # the engine thread acts between steps: a long step (a big prefill) delays it


class ProfileError(RuntimeError):
    """A start or stop that cannot be done: the message says why and what to do."""


class StepProfiler:
    """Start/stop requests from the HTTP side; poll() and step() called by the engine thread."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._asked: str | None = None  # "start" | "stop", waiting for the engine thread
        self._done = threading.Event()
        self._error: str | None = None
        self._written: str | None = None
        self._profile: torch.profiler.profile | None = None
        self._count = 0
        self._steps = 0

    def start(self) -> None:
        """Ask the engine thread to start profiling; raise ProfileError when it already is."""
        self._ask("start")

    def stop(self) -> str:
        """Ask the engine thread to stop profiling and write the trace; its path."""
        self._ask("stop")
        return self._written or ""

    def _ask(self, what: str) -> None:
        with self._lock:
            if self._asked is not None:
                raise ProfileError(f"a {self._asked}_profile is still being handled; try again")
            if what == "start" and self._profile is not None:
                raise ProfileError("already profiling: POST /stop_profile first")
            if what == "stop" and self._profile is None:
                raise ProfileError("not profiling: POST /start_profile first")
            self._done.clear()
            self._error = None
            self._asked = what
        if not self._done.wait(WAIT_S):
            raise ProfileError(f"the engine thread did not take the {what} within {WAIT_S:g} s")
        if self._error:
            raise ProfileError(self._error)

    def poll(self) -> None:
        """On the engine thread, between steps: carry out a pending start or stop."""
        if self._asked is None:
            return
        try:
            if self._asked == "start":
                self.directory.mkdir(parents=True, exist_ok=True)
                self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self._profile.__enter__()
            else:
                profile, self._profile = self._profile, None
                profile.__exit__(None, None, None)
                self._count += 1
                path = self.directory / f"infragent-{os.getpid()}-{int(time.time())}-{self._count}.pt.trace.json.gz"
                profile.export_chrome_trace(str(path))
                self._written = str(path)
        except Exception as err:  # noqa: BLE001 - the server keeps serving; the caller gets the reason
            self._error = f"{self._asked}_profile failed: {type(err).__name__}: {err}"
            self._profile = None
        finally:
            self._asked = None
            self._done.set()

    def marked(self) -> contextlib.AbstractContextManager:
        """On the engine thread, around a step: a ProfilerStep#N range while profiling (analyze's steps)."""
        if self._profile is None:
            return contextlib.nullcontext()
        self._steps += 1
        return torch.profiler.record_function(f"ProfilerStep#{self._steps}")
