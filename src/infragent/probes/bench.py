"""The bench probe: microbenchmarks with real statistics, and A/B comparisons that reach a verdict fast.

Design (why it is right on a noisy 2-core VM where process-to-process spread beats small effects):
- one process, warm-up, then an inner loop calibrated so each sample lasts at least `min_sample_s`;
- A and B are measured in pairs, in random order within each pair, so slow drifts cancel in the ratio;
- the statistic is the median of per-pair ratios B/A with a percentile-bootstrap CI;
- sampling stops as soon as the 99% CI decides (entirely above 1+ε, below 1−ε, or inside ±δ), or when
  the budget runs out; a Mann–Whitney U p-value on the unpaired samples is reported beside it.
Without --vs, the function is paired with itself (A/A): the same run gives its time and the noise floor.
"""
from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from infragent.analysis.stats import Summary, bootstrap_median, mann_whitney_p, paired_ratio
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.inputs import Case, call, draw, tensors_of
from infragent.probes.machine import CONTENDED_CORES, CpuWatch

DECIDE_CONFIDENCE = 0.99


@dataclass
class BenchConfig:
    """Knobs of one bench run; defaults give a verdict in about a second for millisecond functions."""

    budget_s: float = 2.0  # most seconds spent measuring
    min_sample_s: float = 0.0005  # calibrate the inner loop so each sample lasts at least this
    min_pairs: int = 30  # below ~30 pairs a bootstrap CI of the median is too narrow to stop on
    check_every: int = 10
    equivalence: float = 0.02  # δ: a change smaller than this counts as "no change"
    margin: float = 0.01  # ε: "faster"/"slower" need the CI to clear 1 ± ε: effects under 1% are not claimed
    threads: int = 2
    seed: int = 0


@dataclass
class Comparison:
    """Raw paired samples (ns per call) and the statistics computed from them."""

    a_ns: list[float] = field(default_factory=list)
    b_ns: list[float] = field(default_factory=list)
    b_first: list[bool] = field(default_factory=list)
    inner: int = 1
    measuring_s: float = 0.0
    ratio: Summary | None = None  # 99% CI of median(B/A)
    outcome: str = "no_change"  # faster | slower | no_change | undecided
    confidence: float = DECIDE_CONFIDENCE  # of the interval the outcome rests on
    mann_whitney_p: float = float("nan")
    others_cores: float | None = None  # CPU other processes used while measuring, in cores


def timer_for(case: Case) -> Callable[[Callable[[], Any], int], float]:
    """A function timing `inner` calls and returning ns per call: CUDA events if the inputs are on a GPU."""
    if any(t.is_cuda for t in tensors_of((case.args, case.kwargs))):
        return _cuda_timer()
    return _cpu_timer


def _cpu_timer(thunk: Callable[[], Any], inner: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(inner):
        thunk()
    return (time.perf_counter_ns() - start) / inner


def _cuda_timer() -> Callable[[Callable[[], Any], int], float]:
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # larger than any L2

    def timed(thunk: Callable[[], Any], inner: int) -> float:
        total = 0.0
        for _ in range(inner):
            scratch.zero_()  # flush L2 so every call starts cold, as in serving
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            thunk()
            end.record()
            end.synchronize()
            total += begin.elapsed_time(end) * 1e6
        return total / inner
    return timed


def calibrate(thunk: Callable[[], Any], timer: Callable, min_sample_s: float) -> int:
    """Smallest power-of-two inner loop whose sample lasts at least min_sample_s."""
    inner = 1
    while inner < 1 << 20 and timer(thunk, inner) * inner < min_sample_s * 1e9:
        inner *= 2
    return inner


def compare(a: Callable[[], Any], b: Callable[[], Any], timer: Callable, config: BenchConfig) -> Comparison:
    """Measure A and B in randomly ordered pairs until the 99% CI of median(B/A) decides or time runs out."""
    rng = random.Random(config.seed)
    for thunk in (a, b, a, b):
        thunk()  # warm-up: first calls pay for allocation, caches, lazy init
    result = Comparison(inner=calibrate(a, timer, config.min_sample_s))
    gc_was_enabled = gc.isenabled()
    gc.disable()
    watch = CpuWatch()
    start = time.perf_counter()
    try:
        while True:
            b_first = rng.random() < 0.5
            first, second = (b, a) if b_first else (a, b)
            t1, t2 = timer(first, result.inner), timer(second, result.inner)
            result.a_ns.append(t2 if b_first else t1)
            result.b_ns.append(t1 if b_first else t2)
            result.b_first.append(b_first)
            n = len(result.a_ns)
            out_of_time = time.perf_counter() - start >= config.budget_s
            if n >= config.min_pairs and (n % config.check_every == 0 or out_of_time):
                _decide(result, config, final=out_of_time)
                if result.outcome != "undecided" or out_of_time:
                    break
    finally:
        if gc_was_enabled:
            gc.enable()
    result.measuring_s = time.perf_counter() - start
    result.others_cores = watch.others_cores()
    result.mann_whitney_p = mann_whitney_p(result.a_ns, result.b_ns)
    return result


def _decide(result: Comparison, config: BenchConfig, final: bool) -> None:
    ratio = paired_ratio(result.a_ns, result.b_ns, confidence=DECIDE_CONFIDENCE, resamples=2000)
    result.ratio = ratio
    up, down = 1 + config.margin, 1 - config.margin
    if ratio.lo > up:
        result.outcome = "slower"
    elif ratio.hi < down:
        result.outcome = "faster"
    elif 1 - config.equivalence <= ratio.lo and ratio.hi <= 1 + config.equivalence:
        result.outcome = "no_change"
    elif final:
        # Out of time: the 99% interval straddles a margin. Call it only if the 95% interval clears it.
        r95 = paired_ratio(result.a_ns, result.b_ns, confidence=0.95, resamples=2000)
        result.outcome = "slower" if r95.lo > up else "faster" if r95.hi < down else "undecided"
        if result.outcome != "undecided":
            result.ratio, result.confidence = r95, 0.95
    else:
        result.outcome = "undecided"


def run_bench(fn: Callable[..., Any], other: Callable[..., Any] | None = None,
              factory: Callable[..., Any] | None = None, budget_s: float = 2.0, threads: int = 2,
              names: tuple[str | None, str | None] = (None, None), config: BenchConfig | None = None) -> Feedback:
    """Time fn, or compare fn (the candidate, B) against other (the baseline, A): the ratio is fn/other.

    Without other, fn is paired with itself (A/A), which gives its time and the noise floor.
    """
    config = config or BenchConfig(budget_s=budget_s, threads=threads)
    case = draw(factory, 0) if factory is not None else Case()
    candidate_name = names[0] or getattr(fn, "__name__", "fn")
    baseline = other if other is not None else fn
    baseline_name = (names[1] or getattr(other, "__name__", "other")) if other is not None else candidate_name
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        result = compare(lambda: call(baseline, case), lambda: call(fn, case), timer_for(case), config)
    finally:
        torch.set_num_threads(previous_threads)
    return _feedback(result, baseline_name, candidate_name, other is None, case, config)


def _feedback(result: Comparison, a_name: str, b_name: str, aa: bool, case: Case, config: BenchConfig) -> Feedback:
    ratio = result.ratio or paired_ratio(result.a_ns, result.b_ns, confidence=DECIDE_CONFIDENCE)
    a_time, b_time = bootstrap_median(result.a_ns), bootstrap_median(result.b_ns)
    half_width = (ratio.hi - ratio.lo) / 2
    evidence = save_json("bench", {"a": a_name, "b": b_name, "a_ns_per_call": result.a_ns,
                                   "b_ns_per_call": result.b_ns, "b_first": result.b_first,
                                   "inner": result.inner, "threads": config.threads, "label": case.label},
                         "raw per-call samples, pair by pair")
    numbers = {
        f"time[{a_name}]": Measure(a_time.median / 1e3, "µs", a_time.lo / 1e3, a_time.hi / 1e3, a_time.n),
        "ratio": Measure(ratio.median, f"× (B/A, {result.confidence:.0%} CI)", ratio.lo, ratio.hi, ratio.n),
        "min_detectable_effect": Measure(half_width * 100, f"% ({result.confidence:.0%} CI half-width)"),
        "mann_whitney_p": Measure(result.mann_whitney_p),
        "measuring_s": Measure(result.measuring_s, "s"),
    }
    if not aa:
        numbers[f"time[{b_name}]"] = Measure(b_time.median / 1e3, "µs", b_time.lo / 1e3, b_time.hi / 1e3, b_time.n)
    change = (ratio.median - 1) * 100
    if aa:
        verdict = "pass" if result.outcome == "no_change" else "inconclusive"
        finding = (f"{a_name}: {a_time.median / 1e3:.4g} µs per call; noise floor ±{half_width * 100:.2f}% "
                   f"(A/A {result.outcome.replace('_', ' ')})")
    else:
        verdict = {"faster": "pass", "slower": "fail"}.get(result.outcome, "inconclusive")
        finding = {"faster": f"{b_name} is faster than {a_name} by {-change:.1f}%",
                   "slower": f"{b_name} is slower than {a_name} by {change:.1f}%",
                   "no_change": f"no detectable change (any effect is within ±{config.equivalence * 100:.0f}%)",
                   "undecided": f"undecided within {config.budget_s:.1f}s: ratio {ratio.median:.3f}, "
                                f"smallest detectable effect ±{half_width * 100:.1f}%"}[result.outcome]
    if result.others_cores is not None and result.others_cores > CONTENDED_CORES:
        numbers["other_processes_cores"] = Measure(result.others_cores, "cores")
        finding += f" [contended: other processes used {result.others_cores:.1f} cores while measuring]"
    next_probes = [] if result.outcome != "undecided" else ["bench again with a larger --budget-s"]
    if result.outcome == "slower":
        next_probes.append(f"infragent roofline {b_name} --inputs ... (what bounds the slower one?)")
    return Feedback("bench", verdict, finding, numbers=numbers,
                    locality={"a": a_name, "b": b_name, "inputs": case.label or "default", "threads": config.threads},
                    evidence=[evidence], next_probes=next_probes,
                    details={"outcome": result.outcome, "confidence": result.confidence,
                             "pairs": len(result.a_ns), "inner": result.inner,
                             "raw": {"a_ns": result.a_ns, "b_ns": result.b_ns, "b_first": result.b_first}})
