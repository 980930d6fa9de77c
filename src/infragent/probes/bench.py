"""The bench probe: microbenchmarks with real statistics, and A/B comparisons that reach a verdict fast.

Design (why it is right on a noisy 2-core VM where process-to-process spread beats small effects):
- one process, warm-up, then an inner loop calibrated so each sample lasts at least `min_sample_s`;
- A and B are measured in pairs, in random order within each pair, so slow drifts cancel in the ratio;
- the statistic is the median of per-pair ratios B/A with a percentile-bootstrap CI;
- sampling stops as soon as the 99% CI decides (entirely above 1+ε, below 1−ε, or inside ±δ), or when
  the budget runs out; a Mann–Whitney U p-value on the unpaired samples is reported beside it.
- the budget is wall time for the whole probe, warm-up included: a pair is started only when the time it
  took last still fits, so a probe overruns by at most one pair (a call longer than the budget: one call
  each, then "inconclusive: budget" with what it has). Fewer pairs than a bootstrap needs are judged on a
  t interval of the log ratios.
- metric "time" compares wall time per call; metric "return" compares work per second, the callable
  returning how much work it did (a fixed-duration loop). In time mode a pair whose wall times agree while
  their returned values differ is flagged: the wrong metric would read "no change".
Without --vs, the function is paired with itself (A/A): the same run gives its time and the noise floor.
- contention (contention.py: our threads' run delay, steal, other processes' CPU) is read as it measures.
  On a busy machine a sample shorter than the scheduler's time slices is either untouched or pays a whole
  slice of waiting, so the longer of A and B pays more often and a median ratio can be off by more than its
  own interval shows. Once contended, the pairs so far are set aside, samples are made to last at least
  CONTENDED_SAMPLE_S (many slices: the waits become a share both pay alike), A/A pairs are interleaved with
  the A/B pairs, and every interval is widened by the spread of those A/A pairs (2.5th to 97.5th
  percentile). When the widened interval decides nothing, the answer is "inconclusive: contended".
"""
from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from infragent.analysis.blocks import block_estimate
from infragent.analysis.stats import Summary, bootstrap_median, mann_whitney_p, paired_ratio
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.inputs import Case, call, draw, tensors_of
from infragent.probes.contention import Contention, ContentionWatch, merged
from infragent.probes.pools import thread_pools
from infragent.probes.workload_libraries import libraries

DECIDE_CONFIDENCE = 0.99
METRICS = ("time", "return")
FLOOR_PAIRS = 3  # pairs an interval (and so a noise floor) needs at all
FEW_PAIRS = 4  # below min_pairs and at the budget: a t interval of log ratios needs at least this many
SAME_TIME = 0.05  # wall times within 5% of each other ...
OTHER_WORK = 0.25  # ... while the returned values differ by more than 25%: a fixed-duration loop
MIN_AA_PAIRS = 8  # A/A pairs a contended interval needs before it can be widened (and decide anything)
MIN_CONTENDED_PAIRS = 8  # A/B pairs of long samples a contended verdict needs
CONTENDED_SAMPLE_S = 0.03  # contended: each sample spans many scheduler slices
CONTENTION_EVERY_S = 0.1  # how often the signals are read while measuring (from 0.2 s of window on)


class BenchError(ValueError):
    """A callable that cannot be benched as asked (metric "return" without a number returned)."""


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
    metric: str = "time"  # time: wall time per call; return: wall time per unit of the work returned

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise BenchError(f"metric {self.metric!r}: use 'time' (wall time per call) or 'return' (the callable "
                             "returns the work it did; bench compares work per second)")


@dataclass
class BenchResult:
    """Raw paired samples (ns per call) and the statistics computed from them."""

    a_ns: list[float] = field(default_factory=list)  # per call, or per unit of work (metric "return")
    b_ns: list[float] = field(default_factory=list)
    b_first: list[bool] = field(default_factory=list)
    a_work: list[float | None] = field(default_factory=list)  # what each sample's calls returned, per call
    b_work: list[float | None] = field(default_factory=list)
    first_calls_s: tuple[float, float] = (0.0, 0.0)  # the warm-up call of A and of B
    budget_hit: bool = False  # stopped by the budget before the interval decided
    inner: int = 1
    measuring_s: float = 0.0
    ratio: Summary | None = None  # 99% CI of median(B/A)
    outcome: str = "no_change"  # faster | slower | no_change | undecided
    confidence: float = DECIDE_CONFIDENCE  # of the interval the outcome rests on
    mann_whitney_p: float = float("nan")
    others_cores: float | None = None  # CPU other processes used while measuring, in cores
    contention: Contention | None = None  # the signals over the measuring window; contended: the reading that said so
    contended: bool = False  # the signals said busy at some point: the rest was measured the contended way
    set_aside: int = 0  # pairs measured before contention was seen, left out of the statistics
    aa_ns: list[tuple[float, float]] = field(default_factory=list)  # A/A pairs, interleaved once contended
    raw_ratio: Summary | None = None  # the interval before widening (contended only)

    def aa_spread(self) -> tuple[float, float] | None:
        """The 2.5th and 97.5th percentiles of the A/A pairs' ratios, 1 inside; None with too few pairs."""
        if len(self.aa_ns) < MIN_AA_PAIRS:
            return None
        ratios = [second / first for first, second in self.aa_ns if first > 0]
        lo, hi = np.percentile(ratios, [2.5, 97.5])
        return min(float(lo), 1.0), max(float(hi), 1.0)


Timer = Callable[[Callable[[], Any], int], tuple[float, Any]]


def timer_for(case: Case, metric: str = "time") -> Timer:
    """A function timing `inner` calls: (ns per call, what the calls returned — their mean as a number for
    metric "return", else the last value); CUDA events if the inputs are on a GPU."""
    if any(t.is_cuda for t in tensors_of((case.args, case.kwargs))):
        return _cuda_timer()
    return _work_timer if metric == "return" else _cpu_timer


def _cpu_timer(thunk: Callable[[], Any], inner: int) -> tuple[float, Any]:
    out = None
    start = time.perf_counter_ns()
    for _ in range(inner):
        out = thunk()
    return (time.perf_counter_ns() - start) / inner, out


def _work_timer(thunk: Callable[[], Any], inner: int) -> tuple[float, Any]:
    work = 0.0
    start = time.perf_counter_ns()
    for _ in range(inner):
        work += work_of(thunk())
    return (time.perf_counter_ns() - start) / inner, work / inner


def work_of(value: Any) -> float:
    """The work a call reports (metric "return"): a positive number."""
    number = as_number(value)
    if number is None or number <= 0:
        raise BenchError(f"metric 'return' needs the callable to return the work it did as a positive number "
                         f"(e.g. iterations done); it returned {type(value).__name__} {str(value)[:60]!r}")
    return number


def as_number(value: Any) -> float | None:
    """value as a float when it is a plain number, a 0-d tensor or a numpy scalar; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return float(value.item())
    return None


def _cuda_timer() -> Timer:
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # larger than any L2

    def timed(thunk: Callable[[], Any], inner: int) -> tuple[float, Any]:
        total, out = 0.0, None
        for _ in range(inner):
            scratch.zero_()  # flush L2 so every call starts cold, as in serving
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = thunk()
            end.record()
            end.synchronize()
            total += begin.elapsed_time(end) * 1e6
        return total / inner, out
    return timed


def calibrate(thunk: Callable[[], Any], timer: Timer, min_sample_s: float) -> int:
    """Smallest power-of-two inner loop whose sample lasts at least min_sample_s."""
    inner = 1
    while inner < 1 << 20 and timer(thunk, inner)[0] * inner < min_sample_s * 1e9:
        inner *= 2
    return inner


def time_pair(a: Callable[[], Any], b: Callable[[], Any], timer: Timer, config: BenchConfig) -> BenchResult:
    """Measure A and B in randomly ordered pairs until the 99% CI of median(B/A) decides or the budget (wall
    time, warm-up included) cannot fit another pair."""
    rng = random.Random(config.seed)
    start = time.perf_counter()
    first = []
    for thunk in (a, b):  # warm-up: first calls pay for allocation, caches, lazy init
        began = time.perf_counter()
        value = thunk()
        first.append(time.perf_counter() - began)
        if config.metric == "return":
            work_of(value)  # a callable that reports no work fails now, with the fix, not after the budget
    result = BenchResult(first_calls_s=(first[0], first[1]))
    quick = sum(first) < min(0.05, config.budget_s / 20)
    if quick:  # a second warm-up round and an inner loop long enough to time
        a(), b()
        result.inner = calibrate(a, timer, config.min_sample_s)
    pair_s = sum(first)  # how long the next pair is expected to take
    gc_was_enabled = gc.isenabled()
    gc.disable()
    watch = ContentionWatch()
    measuring = checked = time.perf_counter()
    aa_turn = False
    try:
        while time.perf_counter() - start + pair_s <= config.budget_s:
            began = time.perf_counter()
            if not result.contended and began - checked >= CONTENTION_EVERY_S and began - measuring >= 0.2:
                checked, result.contention = began, watch.now()
                if result.contention.contended:
                    _measure_contended(result, a, timer, watch)
                    continue  # pair_s is the last short pair's: the next one (long samples) measures itself
            aa_turn = result.contended and not aa_turn
            if aa_turn:  # every other round an A/A pair: the floor under this load
                (t1, _), (t2, _) = timer(a, result.inner), timer(a, result.inner)
                result.aa_ns.append((t1, t2))
                pair_s = time.perf_counter() - began
                continue
            b_first = rng.random() < 0.5
            one, two = (b, a) if b_first else (a, b)
            (t1, w1), (t2, w2) = timer(one, result.inner), timer(two, result.inner)
            (ta, wa), (tb, wb) = ((t2, w2), (t1, w1)) if b_first else ((t1, w1), (t2, w2))
            if config.metric == "return":
                ta, tb = ta / wa, tb / wb
            result.a_ns.append(ta)
            result.b_ns.append(tb)
            result.a_work.append(as_number(wa))
            result.b_work.append(as_number(wb))
            result.b_first.append(b_first)
            pair_s = time.perf_counter() - began
            n = len(result.a_ns)
            if (n >= MIN_CONTENDED_PAIRS and len(result.aa_ns) >= MIN_AA_PAIRS) if result.contended else \
                    (n >= config.min_pairs and n % config.check_every == 0):
                if not result.contended:  # no verdict on samples taken while the machine was busy
                    checked, result.contention = time.perf_counter(), watch.now()
                    if result.contention.contended:
                        _measure_contended(result, a, timer, watch)
                        continue
                _decide(result, config, final=False)
                if result.outcome != "undecided":
                    break
        else:
            _decide_at_budget(result, config)
    finally:
        watch.close()  # the census's samples stay readable
        if gc_was_enabled:
            gc.enable()
    result.measuring_s = time.perf_counter() - measuring
    whole = watch.now()
    if not result.contended:  # a contended call keeps the reading that said busy: the whole window's average
        result.contention = whole  # can fall under the thresholds once the other work ends, and then names nothing
    elif result.contention is not None:  # completed by the whole window (others' CPU needs a long one)
        result.contention = merged(result.contention, whole)
    result.others_cores = whole.others_cores
    if result.contended and result.outcome == "undecided":
        result.outcome, result.budget_hit = "contended", False  # the machine, not the budget, left it open
    result.mann_whitney_p = mann_whitney_p(result.a_ns, result.b_ns)
    return result


def _measure_contended(result: BenchResult, a: Callable[[], Any], timer: Timer, watch: ContentionWatch) -> None:
    """Switch to the contended way of measuring: the short-sample pairs so far set aside, samples of at least
    CONTENDED_SAMPLE_S from now on, and the threads that want a CPU at once counted while the workload runs."""
    watch.count_threads()
    result.contended, result.set_aside = True, len(result.a_ns)
    for samples in (result.a_ns, result.b_ns, result.a_work, result.b_work, result.b_first):
        samples.clear()
    result.inner = max(result.inner, calibrate(a, timer, CONTENDED_SAMPLE_S))


def _decide_at_budget(result: BenchResult, config: BenchConfig) -> None:
    """The budget ended the sampling: decide on what there is, or say the budget was too small."""
    n = len(result.a_ns)
    if n >= (MIN_CONTENDED_PAIRS if result.contended else config.min_pairs):
        _decide(result, config, final=True)
    elif n >= FEW_PAIRS and not result.contended:  # a t interval of the log ratios (honest when small)
        estimate = block_estimate([math.log(b / a) for a, b in zip(result.a_ns, result.b_ns)], 0.95)
        result.ratio, result.confidence = Summary(estimate.ratio, estimate.lo, estimate.hi, n, "geometric mean"), 0.95
        up, down = 1 + config.margin, 1 - config.margin
        result.outcome = "slower" if estimate.lo > up else "faster" if estimate.hi < down else "undecided"
    else:
        result.outcome = "undecided"
    result.budget_hit = result.outcome == "undecided"


def _interval(result: BenchResult, confidence: float) -> Summary | None:
    """The paired ratio's interval; contended, widened by the A/A spread (None: too few A/A pairs yet)."""
    ratio = paired_ratio(result.a_ns, result.b_ns, confidence=confidence, resamples=2000)
    if not result.contended:
        return ratio
    result.raw_ratio = ratio
    spread = result.aa_spread()
    if spread is None:
        return None
    return Summary(ratio.center, ratio.lo * spread[0], ratio.hi * spread[1], ratio.n, ratio.statistic)


def _decide(result: BenchResult, config: BenchConfig, final: bool) -> None:
    ratio = _interval(result, DECIDE_CONFIDENCE)
    if ratio is None:  # contended, and not yet enough A/A pairs to say how much
        result.outcome = "undecided"
        return
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
        r95 = _interval(result, 0.95) or ratio
        result.outcome = "slower" if r95.lo > up else "faster" if r95.hi < down else "undecided"
        if result.outcome != "undecided":
            result.ratio, result.confidence = r95, 0.95
    else:
        result.outcome = "undecided"


def run_bench(fn: Callable[..., Any], other: Callable[..., Any] | None = None,
              factory: Callable[..., Any] | None = None, budget_s: float = 2.0, threads: int = 2,
              names: tuple[str | None, str | None] = (None, None), config: BenchConfig | None = None,
              metric: str = "time") -> Feedback:
    """Time fn, or compare fn (the candidate, B) against other (the baseline, A): the ratio is fn/other.

    Without other, fn is paired with itself (A/A), which gives its time and the noise floor. metric
    "return": fn returns the work it did, and the comparison is of work per second.
    """
    config = config or BenchConfig(budget_s=budget_s, threads=threads, metric=metric)
    case = draw(factory, 0) if factory is not None else Case(label="no inputs (called with no arguments)")
    if factory is not None and not case.label:  # the factory's case, named by the factory
        name = getattr(factory, "__name__", "<factory>")
        case.label = f"{'the inputs factory' if name.startswith('<') else name}(trial 0)"
    candidate_name = names[0] or getattr(fn, "__name__", "fn")
    baseline = other if other is not None else fn
    baseline_name = (names[1] or getattr(other, "__name__", "other")) if other is not None else candidate_name
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        result = time_pair(lambda: call(baseline, case), lambda: call(fn, case), timer_for(case, config.metric), config)
    finally:
        torch.set_num_threads(previous_threads)
    if result.contention is not None and result.contention.source == "self":  # name the pools its code runs
        reached = libraries(fn, baseline, case.args, case.kwargs)
        result.contention = replace(result.contention, pools=thread_pools(torch_used=reached is None or "torch" in reached))
    return _feedback(result, baseline_name, candidate_name, other is None, case, config)


def fixed_duration(result: BenchResult, aa: bool) -> float | None:
    """The returned-value ratio B/A when wall times agree while what the calls return does not (a loop that
    runs for a fixed time and returns its work), else None."""
    works = [(wa, wb) for wa, wb in zip(result.a_work, result.b_work) if wa and wb]
    if len(works) < 2:
        return None
    times = [b / a for a, b in zip(result.a_ns, result.b_ns) if a > 0]
    if aa:  # one callable: its time steady while its return wanders
        values = [w for w, _ in works] + [w for _, w in works]
        spread = float(np.std(values) / np.mean(values)) if np.mean(values) > 0 else 0.0
        steady = float(np.std(result.a_ns) / np.mean(result.a_ns)) < SAME_TIME / 2
        return 1 + spread if steady and spread > OTHER_WORK else None
    time_ratio = float(np.median(times)) if times else 1.0
    work_ratio = float(np.median([wb / wa for wa, wb in works]))
    same_time = abs(time_ratio - 1) < SAME_TIME
    other_work = not (1 / (1 + OTHER_WORK) < work_ratio < 1 + OTHER_WORK)
    return work_ratio if same_time and other_work else None


def _feedback(result: BenchResult, a_name: str, b_name: str, aa: bool, case: Case, config: BenchConfig) -> Feedback:
    n = len(result.a_ns)
    per = "per unit of work" if config.metric == "return" else "per call"
    evidence = save_json("bench", {"a": a_name, "b": b_name, "metric": config.metric, "a_ns": result.a_ns,
                                   "b_ns": result.b_ns, "unit": f"ns {per}", "a_returned": result.a_work,
                                   "b_returned": result.b_work, "b_first": result.b_first,
                                   "first_calls_s": list(result.first_calls_s), "inner": result.inner,
                                   "threads": config.threads, "label": case.label, "aa_ns": result.aa_ns,
                                   "set_aside_pairs": result.set_aside},
                         "raw samples, pair by pair")
    details = {"outcome": result.outcome, "confidence": result.confidence, "pairs": n, "inner": result.inner,
               "metric": config.metric, "budget_hit": result.budget_hit,
               "raw": {"a_ns": result.a_ns, "b_ns": result.b_ns, "b_first": result.b_first, "aa_ns": result.aa_ns}}
    locality = {"a": a_name, "b": b_name, "inputs": case.label, "threads": config.threads,
                "metric": config.metric}
    if result.contention is not None:
        details["contention"] = {**result.contention.to_dict(), "aa_pairs": len(result.aa_ns),
                                 "aa_spread": result.aa_spread()}
    if n == 0:
        return _no_pairs(result, a_name, b_name, aa, config, evidence, details, locality)
    ratio = result.ratio or paired_ratio(result.a_ns, result.b_ns, confidence=DECIDE_CONFIDENCE)
    # measured on a busy machine without the A/A pairs to widen it by: a raw interval nobody should judge
    details["ratio_trusted"] = not (result.contended and result.ratio is None)
    a_time, b_time = bootstrap_median(result.a_ns), bootstrap_median(result.b_ns)
    # one or two pairs (a busy machine's long samples) give no interval: its width is unknown, not zero
    half_width = (ratio.hi - ratio.lo) / 2 if ratio.n >= FLOOR_PAIRS and ratio.hi > ratio.lo else math.nan
    numbers = {
        f"time[{a_name}]": Measure(a_time.median / 1e3, f"µs {per}", a_time.lo / 1e3, a_time.hi / 1e3, a_time.n),
        "ratio": Measure(ratio.center, f"× (B/A time {per}, {result.confidence:.0%} CI)", ratio.lo, ratio.hi, ratio.n),
        "min_detectable_effect": Measure(half_width * 100, f"% ({result.confidence:.0%} CI half-width)"),
        "mann_whitney_p": Measure(result.mann_whitney_p),
        "measuring_s": Measure(result.measuring_s, "s"),
    }
    if not aa:
        numbers[f"time[{b_name}]"] = Measure(b_time.median / 1e3, f"µs {per}", b_time.lo / 1e3, b_time.hi / 1e3,
                                             b_time.n)
    if config.metric == "return":  # work per second, B over A: the inverse of the time per unit of work
        numbers["work_rate_ratio"] = Measure(1 / ratio.center, f"× (B/A work per second, {result.confidence:.0%} CI)",
                                             1 / ratio.hi if ratio.hi else None, 1 / ratio.lo if ratio.lo else None,
                                             ratio.n)
    change = (ratio.center - 1) * 100
    next_probes = []
    if aa:
        verdict = "pass" if result.outcome == "no_change" else "inconclusive"
        floor = (f"noise floor ±{half_width * 100:.2f}%" if half_width == half_width else
                 f"noise floor unknown ({ratio.n} pairs: too few for an interval)")
        finding = f"{a_name}: {a_time.median / 1e3:.4g} µs {per}; {floor} (A/A {result.outcome.replace('_', ' ')})"
    else:
        verdict = {"faster": "pass", "slower": "fail"}.get(result.outcome, "inconclusive")
        interval = f"x{ratio.center:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}]"
        if config.metric == "return" and ratio.lo > 0:  # a ratio of work per second, never a percentage of time
            work = f"does x{1 / ratio.center:.3g} [{1 / ratio.hi:.3g}, {1 / ratio.lo:.3g}] the work per second of {a_name}"
            faster, slower = f"{b_name} is faster: it {work}", f"{b_name} is slower: it {work}"
        else:
            faster = (f"{b_name} is faster than {a_name}: {interval} the time {per}, "
                      f"{1 / ratio.center:.2f}x as fast")
            slower = f"{b_name} is slower than {a_name}: {interval} the time {per}"
        finding = {"faster": faster, "slower": slower,
                   "no_change": f"no detectable change: {interval} lies within the ±{config.equivalence * 100:.0f}% "
                                "equivalence band",
                   "undecided": f"undecided: ratio {ratio.center:.3f}, smallest detectable effect "
                                + (f"±{half_width * 100:.1f}%" if half_width == half_width else
                                   f"unknown ({ratio.n} pairs)"),
                   "contended": f"ratio x{ratio.center:.3f} (not trusted)"}[result.outcome]
    if result.budget_hit:
        verdict, finding = "inconclusive", f"inconclusive: budget: {finding}; {_budget_note(result, config)}"
        next_probes.append(f"bench again with budget_s={_budget_needed(result, config):.0f} (--budget-s)")
    if result.contended:
        verdict, finding = _contended(result, verdict, finding, numbers)
        next_probes.insert(0, _contended_next(result.contention))
    if config.metric == "time" and (works := fixed_duration(result, aa)) is not None:
        verdict = "inconclusive"
        finding += (f"; WARNING: the wall time barely changes while the returned value does (x{works:.3g}): a "
                    "fixed-duration loop that returns its work? Time per call cannot see that: use "
                    "metric='return' (--metric return) to compare work per second")
        # first even on a busy machine: a quiet rerun timed the same way would still measure the wrong thing
        next_probes.insert(0, "bench with metric='return' (--metric return)")
    if result.outcome == "undecided" and not result.budget_hit:
        next_probes.append("bench again with a larger budget_s")
    if result.outcome == "slower":
        next_probes.append(f"infragent roofline {b_name} --inputs ... (what bounds the slower one?)")
    return Feedback("bench", verdict, finding, numbers=numbers, locality=locality, evidence=[evidence],
                    next_probes=next_probes, details=details)


def _contended_next(contention: Contention) -> str:
    """The probe to run next on a contended measurement, by the source of the contention."""
    if contention.source == "self":
        return f"bench again after capping the workload's own thread pools ({contention.remedy})"
    if contention.source == "hypervisor":
        return f"bench again on unshared CPUs ({contention.remedy})"
    return f"bench again once the machine is quiet ({contention.remedy or 'nothing else running'})"


def _contended(result: BenchResult, verdict: str, finding: str, numbers: dict[str, Measure]) -> tuple[str, str]:
    """The verdict and finding of a measurement made on a busy machine: what was busy, the interval before and
    after widening by the A/A spread, and "inconclusive: contended" when the widened interval decides nothing."""
    contention = result.contention
    numbers["run_delay_share"] = Measure(contention.wait_share, "of our threads' runnable time spent waiting")
    if contention.others_cores is not None:
        numbers["other_processes_cores"] = Measure(contention.others_cores, "cores")
    spread, raw = result.aa_spread(), result.raw_ratio
    measured = (f"measured x{raw.center:.3f} [{raw.lo:.3f}, {raw.hi:.3f}]" if raw is not None else
                "measured without an interval")
    widening = (f"widened by the spread of {len(result.aa_ns)} A/A pairs measured in the same call "
                f"(x{spread[0]:.2f} to x{spread[1]:.2f})" if spread else
                f"not widened: {len(result.aa_ns)} A/A pairs are too few to estimate the spread it needs")
    if result.outcome == "contended":
        return "inconclusive", f"inconclusive: contended: {contention.why}; {finding}: {measured}, {widening}"
    return verdict, f"{finding} [contended: {contention.why}; the interval, {measured}, is {widening}]"


def _no_pairs(result: BenchResult, a_name: str, b_name: str, aa: bool, config: BenchConfig, evidence: Any,
              details: dict, locality: dict) -> Feedback:
    """The warm-up calls alone used the budget: what they took, and the budget a verdict needs."""
    first_a, first_b = result.first_calls_s
    finding = (f"inconclusive: budget: one call each took {first_a:.3g} s ({a_name})"
               + ("" if aa else f" and {first_b:.3g} s ({b_name})") + f", so budget_s={config.budget_s:g} fits no "
               f"measured pair; {_budget_note(result, config)}")
    if result.contended:  # the pairs so far were set aside, and no pair of long samples fit what was left
        finding = (f"inconclusive: contended: {result.contention.why}; {result.set_aside} short pairs set aside "
                   f"and no pair of {CONTENDED_SAMPLE_S * 1e3:g} ms samples fit the rest of budget_s="
                   f"{config.budget_s:g}")
    numbers = {f"first_call[{a_name}]": Measure(first_a, "s (warm-up, not a measurement)"),
               "measuring_s": Measure(result.measuring_s, "s")}
    if not aa:
        numbers[f"first_call[{b_name}]"] = Measure(first_b, "s (warm-up, not a measurement)")
    next_probes = [f"bench again with budget_s={_budget_needed(result, config):.0f} (--budget-s)"]
    if result.contended:
        next_probes.insert(0, _contended_next(result.contention))
    return Feedback("bench", "inconclusive", finding, numbers=numbers, locality=locality, evidence=[evidence],
                    next_probes=next_probes, details=details)


def _budget_needed(result: BenchResult, config: BenchConfig) -> float:
    pair_s = sum(result.first_calls_s)
    return max(config.budget_s * 2, pair_s * (config.min_pairs + 1) * 1.2)


def _budget_note(result: BenchResult, config: BenchConfig) -> str:
    return (f"{len(result.a_ns)} measured pairs; a verdict needs about {config.min_pairs} "
            f"(budget_s={_budget_needed(result, config):.0f})")
