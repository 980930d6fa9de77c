"""Workloads that outlast any budget a test gives a probe."""
from __future__ import annotations

from infragent.trace import span


def endless_steps() -> None:
    """Instrumented steps of pure-Python work, forever."""
    step = 0
    while True:
        with span("step", step=step):
            sum(range(20_000))
        step += 1
