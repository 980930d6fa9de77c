"""Workloads an outside agent would hand the probes: a fixed-duration pair whose work differs 10x, slow
callables for budgets, a zeroed output column, and factories written the wrong way round."""
from __future__ import annotations

import time

import torch

FIXED_S = 0.02  # each fixed-duration call runs this long, whatever it does


def _fixed(per_unit: int) -> int:
    """Run for FIXED_S; a unit of work is per_unit steps (each a sum of 300 numbers and a clock read, so the
    loop's own overhead is a few percent); return the whole units done."""
    deadline, done = time.perf_counter() + FIXED_S, 0
    while True:
        for _ in range(per_unit):
            sum(range(300))
            if time.perf_counter() >= deadline:
                return done
        done += 1


def fixed_slow() -> int:
    """A fixed-duration loop whose unit of work is 10 steps."""
    return _fixed(10)


def fixed_fast() -> int:
    """The same loop whose unit is 1 step: 10x the work in the same time."""
    return _fixed(1)


def one_second() -> None:
    """A callable that takes one second."""
    time.sleep(1.0)


def one_second_too() -> None:
    """Another one."""
    time.sleep(1.0)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The reference."""
    return x @ w


def zeroed_column(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A matmul that loses output column 700 of the full output (it comes back zero)."""
    out = x @ w
    if out.shape[1] == 1024:
        out[:, 700] = 0.0
    return out


def inputs(trial: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """x[M, 256] @ w[256, 1024]."""
    m = (1, 8, 33)[trial % 3]
    return torch.randn(m, 256, generator=generator), torch.randn(256, 1024, generator=generator)


def seeded_inputs(seed: int, m: int = 8, k: int = 64, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A factory written the other way: (seed, m, k, n)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def seed_only_inputs(seed: int, m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seed, m, k, n) with no defaults: neither style can call it."""
    return seeded_inputs(seed, m, k, n)


def raising_inputs(trial: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A factory that breaks: shapes that do not fit each other, multiplied while drawing."""
    x, w = torch.randn(4, 8, generator=generator), torch.randn(9, 4, generator=generator)
    return x, x @ w


def spans_workload() -> None:
    """A small traced workload for record."""
    from infragent.trace import span

    for i in range(5):
        with span("step", i=i):
            torch.randn(64, 64) @ torch.randn(64, 64)


def failing_workload() -> None:
    """A workload that raises."""
    raise ValueError("the workload broke on purpose")
