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


def oversubscribed() -> None:
    """Four threads, each multiplying numpy matrices (BLAS with a pool of its own): more threads than cores."""
    import threading

    import numpy as np

    def work() -> None:
        a = np.ones((192, 192))
        for _ in range(6):
            a = a @ a / 192.0

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
