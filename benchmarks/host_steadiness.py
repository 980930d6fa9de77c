"""How fast and how steady this host runs a fixed pure-Python loop right now: print it beside timing figures.

The loop's work never changes, so its median moves only with the host (another tenant, frequency, steal the
guest cannot see). On the project's AMD EPYC (Zen 3) VMs a quiet hour reads ~11 ms with sd/median ~0.2; slow
hours read 16-34 ms.
    .venv/bin/python benchmarks/host_steadiness.py [--repeats 60]
"""
from __future__ import annotations

import argparse
import statistics
import time


def loop_ms(iterations: int = 200_000) -> float:
    """Milliseconds for one fixed loop of additions."""
    start = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    """Time the loop `repeats` times; print the median and the spread."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=60)
    times = [loop_ms() for _ in range(parser.parse_args().repeats)]
    median = statistics.median(times)
    print(f"fixed loop: median {median:.2f} ms, sd/median {statistics.pstdev(times) / median:.3f}")


if __name__ == "__main__":
    main()
