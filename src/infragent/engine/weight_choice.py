"""weight_format auto: of the formats that give the model's own outputs, the one that runs this model's
linears fastest on this machine, measured once per machine and kept beside the native kernels.

fp32 (the file's blocks dequantized at load) and gguf (the blocks as stored, fp32 activations and
accumulation) compute the same model up to summation order (benchmarks/weight_format_exactness.py), so the
choice between them is a matter of speed alone; int8 changes the numbers and is never chosen for you. The
measurement times the model's own linears, one of each shape (a slice of the LM head), at the row counts the
engine runs: decode at 1, 8 and 32 rows, prefills of 128 and 512 rows, and the prefill chunk
(max_num_batched_tokens; no count above it; the LM head at most max_num_seqs rows, as many as a step
samples), three ways in interleaved rounds: the blocks through the tile kernel, fp32 through BLAS, and the
blocks dequantized per product then BLAS. Row ranges may favour different ways: gguf may run the tile kernel
below some row count and dequantize + BLAS from there on (blas_from: from where BLAS is faster by more than
SPLIT_MARGIN at every count measured), the weights still stored once at their bits. On an AMD EPYC (AVX-512),
512-row products ran x1.28-1.34 faster through BLAS, and 128 rows within 4% either way. The choice is gguf when
the blocks, each row count run its faster way, beat fp32 in the geometric mean over the row counts of the
median round.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from infragent.engine.config import EngineConfig
from infragent.engine.kernels.build import cache_directory
from infragent.engine.models.layers import Linear
from infragent.engine.quant.blocks import BlockLinear, BlockWeight

EQUAL_OUTPUTS = ("fp32", "gguf")  # the formats whose outputs are the model's (up to summation order)
# rows per product: decode at three concurrencies, and prefills up to the chunk. With only 128 and a 2048 chunk
# measured, an AVX2 EPYC ran 512-row prefills through the tile kernel (BLAS x1.02 at 128, x1.37 at 2048), where
# dequantize + BLAS was x1.15 faster (layer 0's four linears at 512 rows: 27.6 vs 24.0 ms).
BATCHES = (1, 8, 32, 128, 512)
LARGEST_CHUNK = 2048  # a larger prefill chunk is measured at this many rows (its choice holds above)
SPLIT_MARGIN = 1.05  # dequantize + BLAS takes a row count only when faster than the tile kernel by more than this
ROUNDS = 5
LM_HEAD_ROWS = 8192  # the LM head is timed on this many rows and counted for all of them
MIN_CALL_S = 0.002  # each timed product repeats until it has run this long
CONTENDED = 0.1  # a measurement whose threads waited for a CPU more than this share of the time is not kept
MEASUREMENT = "linears-v2"  # in the cache key: a new way of measuring measures again

log = logging.getLogger(__name__)


@dataclass
class WeightChoice:
    """The weight_format an engine runs, and why: set by hand, the only one that applies, or measured."""

    format: str
    reason: str
    speedups: dict[int, list[float]] = field(default_factory=dict)  # rows -> per-round fp32 time / gguf time
    cache: str | None = None  # the file the measurement is kept in
    blas_speedups: dict[int, list[float]] = field(default_factory=dict)  # rows -> tile time / dequantize+BLAS
    blas_from: int | None = None  # gguf: from this many rows on, dequantize + BLAS instead of the tile kernel

    def to_dict(self) -> dict:
        """Plain data."""
        return asdict(self)


def candidates(config: EngineConfig) -> tuple[str, ...]:
    """The weight formats config may run: the one it names, or (auto) those with the model's outputs that
    combine with its other knobs."""
    if config.weight_format != "auto":
        return (config.weight_format,)
    clash = (config.quantization is not None or config.gemm != "torch" or config.dtype != "float32"
             or config.tensor_parallel_size > 1 or config.pipeline_parallel_size > 1)
    return ("fp32",) if config.model != "llama" or clash else EQUAL_OUTPUTS


def choose(config: EngineConfig, model_file: Path, linears: list[tuple[object, str]], native: bool,
           layers: int) -> WeightChoice:
    """The weight_format for config, given the model built with blocks (linears: its (owner, attribute) of
    one layer's projections then the LM head; layers: how many layers share those shapes; native: whether
    the block kernels run here)."""
    options = candidates(config)
    if len(options) == 1:
        why = "set" if config.weight_format != "auto" else "the only format with the model's outputs here"
        return WeightChoice(options[0], why)
    if not native:
        return WeightChoice("fp32", "auto: no native block kernels here (blocks would be dequantized per product)")
    path = _cache_file(config, model_file)
    if path.exists():
        try:
            kept = json.loads(path.read_text())  # decided again from the kept ratios: the rule may have changed
            choice = decide({int(k): v for k, v in kept["speedups"].items()},
                            {int(k): v for k, v in kept["blas_speedups"].items()})
            choice.cache = str(path)
            return choice
        except (OSError, ValueError, KeyError) as exc:
            log.warning("weight_format auto: %s is unreadable (%s); measuring again", path, exc)
    waited, start = run_queue_ns(), time.perf_counter_ns()
    speedups, blas_speedups = measure(linears, layers, row_counts(config), config.max_num_seqs)
    wait_share = (run_queue_ns() - waited) / max(1, (time.perf_counter_ns() - start) * config.resolved_threads())
    choice = decide(speedups, blas_speedups)
    if wait_share > CONTENDED:  # the ratios are suspect: decide for this process only, measure again next time
        choice.reason += (f" (contended: this process waited for a CPU {wait_share:.0%} of the time; not kept, "
                          "measured again at the next start)")
    else:
        choice.cache = str(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(choice.to_dict(), indent=1))
        except OSError as exc:
            log.warning("weight_format auto: could not keep the measurement in %s (%s)", path, exc)
    return choice


def run_queue_ns() -> int:
    """Nanoseconds this process's threads have waited, runnable, for a CPU (schedstat's run delay)."""
    total = 0
    for task in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(task.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def row_counts(config: EngineConfig) -> tuple[int, ...]:
    """The row counts measured: the prefill chunk config runs (at most LARGEST_CHUNK) and those of BATCHES up to
    it (a step never multiplies more rows than its chunk)."""
    chunk = min(config.max_num_batched_tokens, LARGEST_CHUNK)
    return tuple(sorted({rows for rows in BATCHES if rows <= chunk} | {chunk}))


def decide(speedups: dict[int, list[float]], blas_speedups: dict[int, list[float]] | None = None) -> WeightChoice:
    """gguf when the blocks, each row count run its faster way (the tile kernel, or from blas_from rows on
    dequantize + BLAS), are faster than fp32 in the geometric mean over row counts of the median round."""
    medians = {rows: statistics.median(s) for rows, s in speedups.items()}
    split = {rows: statistics.median(s) for rows, s in (blas_speedups or {}).items()}
    blas_from = None  # the least row count from which dequantize + BLAS beats the tile kernel at every count
    for rows in sorted(split, reverse=True):
        if rows == 1 or split[rows] <= SPLIT_MARGIN:  # a tie within noise keeps the tile kernel
            break
        blas_from = rows
    effective = {rows: m * (split[rows] if blas_from is not None and rows >= blas_from else 1.0)
                 for rows, m in medians.items()}
    overall = math.exp(statistics.fmean(math.log(m) for m in effective.values()))
    each = ", ".join(f"{rows} rows x{m:.2f}" for rows, m in effective.items())
    winner = "gguf" if overall > 1.0 else "fp32"
    reason = f"auto: measured here, blocks against fp32 {each}; geometric mean x{overall:.2f}"
    if winner == "gguf":
        reason += ("; the tile kernel at every row count" if blas_from is None else
                   f"; the tile kernel below {blas_from} rows, from {blas_from} on the blocks dequantized + BLAS "
                   f"(x{split[blas_from]:.2f} over the tile kernel there)")
    return WeightChoice(winner, reason, speedups, blas_speedups=blas_speedups or {},
                        blas_from=blas_from if winner == "gguf" else None)


def measure(linears: list[tuple[object, str]], layers: int, counts: tuple[int, ...] = BATCHES,
            max_seqs: int = 32) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per row count, per round: the fp32 linears' time over the tile kernel's, and the tile kernel's over the
    blocks dequantized + BLAS, each summed over the model (each layer linear counted `layers` times, the LM
    head for all its rows, at most max_seqs of them: a step samples no more)."""
    pairs = []
    for i, (owner, name) in enumerate(linears):
        block = getattr(owner, name)
        weight: BlockWeight = block.weight
        count, head = float(layers), i == len(linears) - 1
        if head:
            rows = min(LM_HEAD_ROWS, weight.shape[0])
            count = weight.shape[0] / rows
            weight = weight.rows(slice(0, rows))
        ways = {"gguf": BlockLinear(weight, native=True), "fp32": Linear(weight.dequantize()),
                "blas": BlockLinear(weight, native=True, blas_from=1)}
        pairs.append((ways, count, weight.shape[1], head))
    gen = torch.Generator().manual_seed(0)
    speedups: dict[int, list[float]] = {rows: [] for rows in counts}
    blas_speedups: dict[int, list[float]] = {rows: [] for rows in counts}
    for r in range(ROUNDS):
        for rows in counts:
            times = {"gguf": 0.0, "fp32": 0.0, "blas": 0.0}
            for ways, count, width, head in pairs:
                x = torch.randn(min(rows, max_seqs) if head else rows, width, generator=gen)
                order = list(ways.items())
                order = order[r % 3:] + order[:r % 3]  # each way first in turn
                for fmt, fn in order:
                    times[fmt] += count * seconds_per_call(fn, x)
            speedups[rows].append(times["fp32"] / times["gguf"])
            blas_speedups[rows].append(times["gguf"] / times["blas"])
    return speedups, blas_speedups


def seconds_per_call(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     min_s: float = MIN_CALL_S) -> float:
    """Mean seconds per call of fn(x), repeated for at least min_s after one warm call."""
    fn(x)
    calls, start = 0, time.perf_counter()
    while True:
        fn(x)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def _cache_file(config: EngineConfig, model_file: Path) -> Path:
    """Where this machine's measurement for this model file, thread count and kernels choice is kept."""
    size = model_file.stat().st_size if model_file.exists() else 0
    key = hashlib.sha256(f"{MEASUREMENT}|{model_file.name}|{size}|{config.resolved_threads()}|{config.kernels}|"
                         f"{row_counts(config)}|{config.max_num_seqs}".encode()).hexdigest()[:16]
    return cache_directory() / "weight_format" / f"{key}.json"
