"""Workloads an outside agent would hand the probes: a fixed-duration pair whose work differs 10x, slow
callables for budgets, a zeroed output column, and factories written the wrong way round."""
from __future__ import annotations

import time

import torch

FIXED_S = 0.02  # each fixed-duration call runs this long, whatever it does


def fixed_slow() -> int:
    """A fixed-duration loop with a slow inner step (10x the per-unit cost of fixed_fast)."""
    deadline, done = time.perf_counter() + FIXED_S, 0
    while time.perf_counter() < deadline:
        for _ in range(10):
            sum(range(20))
        done += 1
    return done


def fixed_fast() -> int:
    """The same loop whose step is 10x cheaper: 10x the work in the same time."""
    deadline, done = time.perf_counter() + FIXED_S, 0
    while time.perf_counter() < deadline:
        sum(range(20))
        done += 1
    return done


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
