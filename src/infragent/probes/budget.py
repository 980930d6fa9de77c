"""Time budgets every probe keeps: a deadline that stops in-process Python work, and the verdict of a probe
the budget stopped ("inconclusive: budget", with what it had).

A Deadline raises BudgetExceeded in the thread that entered it once the budget has passed, at that thread's
next Python bytecode: a workload in pure Python stops within milliseconds, one inside a long native call
stops when the call returns. Context managers unwind on the way out, so spans it opened are closed and
recorded.
"""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import replace
from types import TracebackType

from infragent.probes.feedback import Feedback


class BudgetExceeded(BaseException):
    """Raised into a thread whose budget ran out (a BaseException: a workload's `except Exception` lets it by)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class Deadline:
    """`with Deadline(budget_s) as d:` runs the block for at most budget_s seconds; d.stopped says whether the
    budget cut it short (the BudgetExceeded is swallowed at the block's end)."""

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self.stopped = False
        self.elapsed_s = 0.0
        self._fired = False
        self._done = False
        self._lock = threading.Lock()
        self._thread_id = 0
        self._timer: threading.Timer | None = None
        self._start = 0.0

    def __enter__(self) -> "Deadline":
        self._thread_id = threading.get_ident()
        self._start = time.perf_counter()
        if self.budget_s is not None:
            self._timer = threading.Timer(max(self.budget_s, 0.0), self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _fire(self) -> None:
        with self._lock:
            if not self._done:
                self._fired = True
                _raise_in(self._thread_id, BudgetExceeded)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        while True:  # a pending BudgetExceeded can land here, after the block ended: take it back
            try:
                with self._lock:
                    self._done = True
                    if self._fired:
                        _raise_in(self._thread_id, None)
                break
            except BudgetExceeded:
                continue
        if self._timer is not None:
            self._timer.cancel()
        self.elapsed_s = time.perf_counter() - self._start
        if exc_type is not None and issubclass(exc_type, BudgetExceeded):
            self.stopped = True
            return True
        return False


def over_budget(feedback: Feedback, budget_s: float, elapsed_s: float, had: str) -> Feedback:
    """The feedback of a probe the budget stopped: inconclusive, saying so and what the finding rests on."""
    finding = f"inconclusive: budget: stopped after {elapsed_s:.3g} s (budget_s={budget_s:g}) with {had}; " \
              f"from that: {feedback.finding}"
    hint = f"run again with budget_s={max(2 * budget_s, 1):g} (--budget-s) for a verdict on the whole run"
    return replace(feedback, verdict="inconclusive", finding=finding,
                   next_probes=[hint] + [p for p in feedback.next_probes if p != hint],
                   details={**feedback.details, "budget_s": budget_s, "stopped_after_s": elapsed_s})
