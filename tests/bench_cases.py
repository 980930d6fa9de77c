"""Functions for bench tests: a ~1 ms workload, a copy, one twice as slow, and an inputs factory."""
import torch

_A = torch.randn(128, 128)


def work() -> None:
    for _ in range(10):
        _A @ _A


def work_copy() -> None:
    for _ in range(10):
        _A @ _A


def twice() -> None:
    for _ in range(20):
        _A @ _A


def tiny(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def tiny_inputs(trial: int, generator: torch.Generator) -> tuple:
    return (torch.randn(8, generator=generator),)
