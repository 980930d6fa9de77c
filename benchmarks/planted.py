"""Planted workloads for bench-verdict tests: work() takes ~2 ms; slow() does exactly 5% more of the same work."""
from __future__ import annotations

import torch

_A = torch.randn(192, 192)
REPS = 20


def work() -> None:
    """REPS identical 192×192 matmuls (about 2 ms on the project VM)."""
    for _ in range(REPS):
        _A @ _A


def work_again() -> None:
    """The same work as work(), a separate function object (for A/A pairs)."""
    for _ in range(REPS):
        _A @ _A


def slow() -> None:
    """REPS + 5%: one extra matmul per 20, a planted 5% slowdown."""
    for _ in range(REPS + REPS // 20):
        _A @ _A
