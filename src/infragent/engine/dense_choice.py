"""Dense fp32 products at decode batch sizes: the native kernel or BLAS, per weight shape and row count,
measured once per machine and kept beside the native kernels.

The BLAS in torch's CPU wheel (MKL) takes a generic path on AMD CPUs, and there a product of a few rows can
cost several times one row: on an EPYC, the hybrid model's LM head (49152 x 512) took 5 ms for one row and
24 ms for five, so batching decode bought almost nothing. The native kernel (dense_linear, the tile product
of kernels/qgemm_impl.h on fp32 rows) streams W once for every row of x. Which is faster depends on the CPU,
the BLAS and the shape, so nothing is assumed: each (out, in) shape is timed at 1 to 64 rows, in interleaved
rounds, three ways: BLAS on W transposed ([in, out], the layout the engine keeps without the kernel), the
native kernel and BLAS on W as [out, in] (the layout the kernel needs, which BLAS then reads for the other row
counts). The kernel takes a row count where its median round beat both; the shape switches layout only if no
row count then runs slower than it did before (within TOLERANCE). More than 64 rows (prefill chunks) run BLAS.
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
TOLERANCE = 0.95  # a row count may run at most 5% slower (median round) for the others' sake: noise
MEASUREMENT = "dense-v2"  # in the cache file's name: a new way of measuring measures again

log = logging.getLogger(__name__)
_measured: dict[tuple[int, int, int], "ShapeChoice"] = {}  # this process's choices, by (out, in, threads)


@dataclass
class ShapeChoice:
    """For one W [out, in]: per measured row count and round, BLAS time on W transposed over the native
    kernel's time (speedups) and over BLAS's time on W as it is (blas_rows)."""

    out_features: int
    in_features: int
    threads: int
    speedups: dict[int, list[float]]
    blas_rows: dict[int, list[float]]
    kept: bool = True  # False: measured while contended, for this process only

    def native_rows(self, both_layouts: bool = False) -> tuple[bool, ...]:
        """[m] for m in 0..64: whether a product of m rows runs the native kernel. both_layouts: W is held as
        [out, in] anyway (a tied LM head's embedding), so BLAS keeps W transposed for the other row counts and
        the kernel need only beat that; otherwise W has one layout, which must cost no row count."""
        native = {rows: statistics.median(s) for rows, s in self.speedups.items()}
        blas = {rows: statistics.median(s) for rows, s in self.blas_rows.items()}
        if both_layouts:
            blas = {rows: 0.0 for rows in ROWS}
        elif any(max(native[rows], blas[rows]) < TOLERANCE for rows in ROWS):
            return (False,) * (ROWS[-1] + 1)  # the switch of layout would cost some row count: keep BLAS
        wins = {rows: native[rows] > max(1.0, blas[rows]) for rows in ROWS}
        return tuple(m > 0 and wins[next(r for r in ROWS if r >= m)] for m in range(ROWS[-1] + 1))

    def describe(self) -> str:
        """One line: the shape and its median speedups at each row count (native, BLAS on [out, in])."""
        medians = " ".join(f"{rows}:x{statistics.median(s):.2f}/x{statistics.median(self.blas_rows[rows]):.2f}"
                           for rows, s in self.speedups.items())
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
                                 {int(r): s for r, s in kept["speedups"].items()},
                                 {int(r): s for r, s in kept["blas_rows"].items()})
            _measured[key] = choice
            return choice
        except (OSError, ValueError, KeyError) as exc:
            log.warning("dense products: %s is unreadable (%s); measuring again", path, exc)
    waited, start = run_queue_ns(), time.perf_counter_ns()
    choice = ShapeChoice(out_features, in_features, threads, *measure(out_features, in_features))
    wait_share = (run_queue_ns() - waited) / max(1, (time.perf_counter_ns() - start) * threads)
    if wait_share > CONTENDED:
        choice.kept = False
        log.info("dense products: %s measured while this process waited for a CPU %.0f%% of the time; "
                 "not kept", choice.describe(), 100 * wait_share)
    else:
        _keep(path, choice)
    _measured[key] = choice
    return choice


def measure(out_features: int, in_features: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per row count, per round: BLAS's time on W transposed (the engine's layout without the kernel) over the
    native kernel's, and over BLAS's on W as [out, in] (the kernel's layout), for a random W of this shape."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen)
    weight_t = weight.t().contiguous()

    def native(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.infragent.dense_linear(x, weight)

    def blas(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, weight_t)

    def blas_rows(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, weight.t())

    speedups: dict[int, list[float]] = {rows: [] for rows in ROWS}
    blas_speedups: dict[int, list[float]] = {rows: [] for rows in ROWS}
    ways = [native, blas, blas_rows]
    for r in range(ROUNDS):
        for rows in ROWS:
            x = torch.randn(rows, in_features, generator=gen)
            order = ways[r % 3:] + ways[:r % 3]  # each way first in turn
            times = {fn: seconds_per_call(fn, x) for fn in order}
            speedups[rows].append(times[blas] / times[native])
            blas_speedups[rows].append(times[blas] / times[blas_rows])
    return speedups, blas_speedups


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
