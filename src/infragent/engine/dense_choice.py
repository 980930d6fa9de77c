"""Dense fp32 products at decode batch sizes: the native kernel or BLAS, per weight shape and row count,
measured once per machine and kept beside the native kernels.

The BLAS in torch's CPU wheel (MKL) takes a generic path on AMD CPUs, and there a product of a few rows can
cost several times one row: on an EPYC, the hybrid model's LM head (49152 x 512) took 5 ms for one row and
24 ms for five, so batching decode bought almost nothing. The native kernel (dense_linear, the tile product
of kernels/qgemm_impl.h on fp32 rows) streams W once for every row of x. Which is faster depends on the CPU,
the BLAS and the shape, so nothing is assumed: each (out, in) shape is timed both ways at 1 to 64 rows, in
interleaved rounds, and a row count runs the native kernel only where its median round was faster. More than
64 rows (prefill chunks) always run BLAS.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from infragent.engine.kernels.build import cache_directory
from infragent.engine.weight_choice import CONTENDED, run_queue_ns, seconds_per_call

ROWS = (1, 2, 4, 8, 16, 32, 64)  # a product of m rows takes the choice measured at the first of these >= m
ROUNDS = 3
MEASUREMENT = "dense-v1"  # in the cache file's name: a new way of measuring measures again

log = logging.getLogger(__name__)
_measured: dict[tuple[int, int, int], "ShapeChoice"] = {}  # this process's choices, by (out, in, threads)


@dataclass
class ShapeChoice:
    """For one W [out, in]: per measured row count, BLAS time over native time in each round."""

    out_features: int
    in_features: int
    threads: int
    speedups: dict[int, list[float]]
    kept: bool = True  # False: measured while contended, for this process only

    def native_rows(self) -> tuple[bool, ...]:
        """[m] for m in 0..64: whether a product of m rows runs the native kernel (median round faster)."""
        wins = {rows: statistics.median(s) > 1.0 for rows, s in self.speedups.items()}
        return tuple(m > 0 and wins[next(r for r in ROWS if r >= m)] for m in range(ROWS[-1] + 1))

    def describe(self) -> str:
        """One line: the shape and its median speedup at each row count."""
        medians = " ".join(f"{rows}:x{statistics.median(s):.2f}" for rows, s in self.speedups.items())
        return f"{self.out_features}x{self.in_features} ({medians})"


def choose(out_features: int, in_features: int, threads: int) -> ShapeChoice:
    """The measured choice for W [out_features, in_features] at `threads` threads: from this process, from
    this machine's cache, or measured now (and kept unless the machine was too busy to trust it)."""
    key = (out_features, in_features, threads)
    if key in _measured:
        return _measured[key]
    path = _cache_file(*key)
    if path.exists():
        try:
            kept = json.loads(path.read_text())
            choice = ShapeChoice(out_features, in_features, threads,
                                 {int(r): s for r, s in kept["speedups"].items()})
            _measured[key] = choice
            return choice
        except (OSError, ValueError, KeyError) as exc:
            log.warning("dense products: %s is unreadable (%s); measuring again", path, exc)
    waited, start = run_queue_ns(), time.perf_counter_ns()
    choice = ShapeChoice(out_features, in_features, threads, measure(out_features, in_features))
    wait_share = (run_queue_ns() - waited) / max(1, (time.perf_counter_ns() - start) * threads)
    if wait_share > CONTENDED:
        choice.kept = False
        log.info("dense products: %s measured while this process waited for a CPU %.0f%% of the time; "
                 "not kept", choice.describe(), 100 * wait_share)
    else:
        _keep(path, choice)
    _measured[key] = choice
    return choice


def measure(out_features: int, in_features: int) -> dict[int, list[float]]:
    """Per row count, per round: BLAS's time over the native kernel's for a random W of this shape (the
    layout each runs in the engine: BLAS reads W transposed, the kernel reads its rows)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen)
    weight_t = weight.t()

    def native(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.infragent.dense_linear(x, weight)

    def blas(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, weight_t)

    speedups: dict[int, list[float]] = {rows: [] for rows in ROWS}
    for r in range(ROUNDS):
        for rows in ROWS:
            x = torch.randn(rows, in_features, generator=gen)
            order = (native, blas) if r % 2 == 0 else (blas, native)
            times = {fn: seconds_per_call(fn, x) for fn in order}
            speedups[rows].append(times[blas] / times[native])
    return speedups


def _keep(path: Path, choice: ShapeChoice) -> None:
    """Write the measurement (to a temporary name first: a reader never sees half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(choice), indent=1))
        partial.replace(path)
    except OSError as exc:
        log.warning("dense products: could not keep the measurement in %s (%s)", path, exc)


def _cache_file(out_features: int, in_features: int, threads: int) -> Path:
    """Where this machine's measurement of one shape is kept (the folder is keyed by kernel sources and CPU)."""
    return cache_directory() / "dense" / f"{MEASUREMENT}-t{threads}-{out_features}x{in_features}.json"
