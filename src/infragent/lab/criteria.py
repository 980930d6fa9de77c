"""Judge acceptance criteria on loadgen records: per scenario, phase and prompt-length bucket, never averaged.

Absolute criteria (max/min) use the metric of each repeat and a bootstrap CI across repeats: pass when the
whole interval is on the right side, fail when it is wholly on the wrong side, otherwise inconclusive.
Relative criteria (max_regression) compare candidate and baseline: the regression estimate is the ratio of
the metric on the pooled records (with a bootstrap CI). The default test pairs each request with its twin
in the baseline (loadgen's seeds give both the same prompts) and runs a one-sided Wilcoxon signed-rank
test on the log ratios; "mann-whitney" compares the two samples unpaired, "bootstrap" compares repeats. A criterion fails only when the regression is
both larger than allowed and significant at alpha (split across buckets): statistical and practical
significance together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu, wilcoxon

from infragent.analysis.serving_metrics import RequestRecord, bucket_of, serving_metrics
from infragent.analysis.stats import bootstrap_median
from infragent.lab.spec import Criterion


@dataclass
class Run:
    """One loadgen repeat: its records and duration."""

    records: list[RequestRecord]
    duration_s: float
    slos_ms: dict[str, float] | None = None  # goodput SLOs of the scenario, e.g. {"ttft": 2000, "tpot": 150}


@dataclass
class Judgement:
    """A criterion judged for one bucket."""

    scenario: str
    metric: str
    phase: str
    bucket: str
    verdict: str  # pass | fail | inconclusive
    value: float  # candidate's metric (median across repeats, or on pooled records)
    ci: tuple[float, float]
    baseline: float | None = None
    regression: float | None = None  # fraction worse than the baseline (negative: better)
    p_value: float | None = None
    message: str = ""


_PER_REQUEST = {"ttft": lambda r: [r.ttft_s * 1e3], "tpot": lambda r: [r.tpot_s * 1e3] if r.output_tokens > 1 else [],
                "itl": lambda r: [g * 1e3 for g in r.itl_s], "e2el": lambda r: [r.latency_s * 1e3],
                "prefill": lambda r: [r.prompt_tokens / r.ttft_s] if r.ttft_s > 0 else [],
                "decode": lambda r: ([(r.output_tokens - 1) / (r.latency_s - r.ttft_s)]
                                     if r.output_tokens > 1 and r.latency_s > r.ttft_s else [])}


def request_values(records: list[RequestRecord], metric: str) -> list[float] | None:
    """Per-request samples behind a metric (None for run-level throughputs)."""
    key = metric.split("_")[0]
    extract = _PER_REQUEST.get(key)
    if extract is None:
        return None
    return [v for r in records if r.success and not r.warmup for v in extract(r)]


def statistic(values: list[float], metric: str) -> float:
    """The metric's statistic over per-request values: median, p90, p99 or (rates) median."""
    if not values:
        return float("nan")
    for stat, q in (("p99", 99), ("p90", 90)):
        if f"_{stat}_" in metric:
            return float(np.percentile(values, q))
    return float(np.median(values))


def run_value(run: Run, metric: str, records: list[RequestRecord]) -> float:
    """The metric of one repeat, restricted to records (a bucket)."""
    values = request_values(records, metric)
    if values is not None:
        return statistic(values, metric)
    m = serving_metrics(records, run.duration_s, run.slos_ms)
    if metric == "goodput" and not run.slos_ms:
        raise ValueError("metric goodput needs the scenario's goodput_ms SLOs (e.g. goodput_ms = {ttft = 2000})")
    return {"output_tok_s": m.output_throughput, "request_per_s": m.request_throughput,
            "goodput": m.goodput or 0.0}[metric]


def judge_interval(criterion: Criterion, value: float, lo: float, hi: float, phase: str) -> Judgement:
    """An absolute criterion on one estimate with its CI: pass when the whole interval is on the allowed
    side of the limit, fail when it is wholly on the other side, otherwise inconclusive."""
    upper = criterion.max is not None
    limit = criterion.max if upper else criterion.min
    if (hi <= limit) if upper else (lo >= limit):
        verdict = "pass"
    elif (lo > limit) if upper else (hi < limit):
        verdict = "fail"
    else:
        verdict = "inconclusive"
    rule = f"<= {limit:g}" if upper else f">= {limit:g}"
    message = f"{criterion.metric} {value:.4g} [{lo:.4g}, {hi:.4g}] {rule}: {verdict}"
    return Judgement(criterion.scenario, criterion.metric, phase, "all", verdict, value, (lo, hi), message=message)


def _in_bucket(records: list[RequestRecord], bucket: str, bounds: tuple[int, ...]) -> list[RequestRecord]:
    return records if bucket == "all" else [r for r in records if bucket_of(r.prompt_len, bounds) == bucket]


def buckets_for(criterion: Criterion, runs: list[Run], bounds: tuple[int, ...]) -> list[str]:
    """The buckets a criterion is judged in ("each": every bucket the records fall in)."""
    if criterion.bucket != "each":
        return [criterion.bucket]
    return sorted({bucket_of(r.prompt_len, bounds) for run in runs for r in run.records if not r.warmup})


def judge(criterion: Criterion, candidate: list[Run], baseline: list[Run] | None = None,
          bounds: tuple[int, ...] = (128, 512, 2048, 8192), seed: int = 0) -> list[Judgement]:
    """Judge one criterion in each of its buckets.

    With several buckets the criterion's alpha is split between them (Bonferroni), so that the chance of a
    false failure anywhere stays at alpha: an A/A pair then passes at least 1 − alpha of the time.
    """
    buckets = buckets_for(criterion, candidate, bounds)
    share = criterion.model_copy(update={"alpha": criterion.alpha / len(buckets)})
    return [_judge_bucket(share, candidate, baseline, bucket, bounds, seed) for bucket in buckets]


def _judge_bucket(c: Criterion, candidate: list[Run], baseline: list[Run] | None, bucket: str,
                  bounds: tuple[int, ...], seed: int) -> Judgement:
    where = dict(scenario=c.scenario, metric=c.metric, phase=c.phase, bucket=bucket)
    per_run = [run_value(run, c.metric, _in_bucket(run.records, bucket, bounds)) for run in candidate]
    summary = bootstrap_median(per_run, seed=seed)
    if c.max_regression is None:
        return _absolute(c, per_run, summary, where)
    if not baseline:
        return Judgement(**where, verdict="inconclusive", value=summary.median, ci=(summary.lo, summary.hi),
                         message="a relative criterion needs baseline runs")
    return _relative(c, candidate, baseline, bucket, bounds, seed, where)


def _absolute(c: Criterion, per_run: list[float], summary, where: dict) -> Judgement:  # noqa: ANN001
    ci = (summary.lo, summary.hi)
    if len(per_run) < 2:
        verdict, why = "inconclusive", "one repeat is not evidence: run at least 2"
    elif c.max is not None:
        verdict = "pass" if summary.hi <= c.max else "fail" if summary.lo > c.max else "inconclusive"
        why = f"{c.metric} {summary.median:.4g} [{ci[0]:.4g}, {ci[1]:.4g}] vs max {c.max:g}"
    else:
        verdict = "pass" if summary.lo >= c.min else "fail" if summary.hi < c.min else "inconclusive"
        why = f"{c.metric} {summary.median:.4g} [{ci[0]:.4g}, {ci[1]:.4g}] vs min {c.min:g}"
    return Judgement(**where, verdict=verdict, value=summary.median, ci=ci,
                     message=f"{why} in phase {where['phase']}, bucket {where['bucket']}")


def _relative(c: Criterion, candidate: list[Run], baseline: list[Run], bucket: str, bounds: tuple[int, ...],
              seed: int, where: dict) -> Judgement:
    cand_records = [r for run in candidate for r in _in_bucket(run.records, bucket, bounds)]
    base_records = [r for run in baseline for r in _in_bucket(run.records, bucket, bounds)]
    cand_values, base_values = request_values(cand_records, c.metric), request_values(base_records, c.metric)
    if cand_values is None or c.test == "bootstrap":  # run-level metric, or asked for: compare repeats
        cand_values = [run_value(r, c.metric, _in_bucket(r.records, bucket, bounds)) for r in candidate]
        base_values = [run_value(r, c.metric, _in_bucket(r.records, bucket, bounds)) for r in baseline]
        stat = np.median
    else:
        stat = lambda v: statistic(list(v), c.metric)  # noqa: E731
    if len(cand_values) < 2 or len(base_values) < 2:
        return Judgement(**where, verdict="inconclusive", value=float("nan"), ci=(float("nan"),) * 2,
                         message=f"too few samples in bucket {bucket} to compare")
    worse = (lambda cand, base: base / cand - 1) if c.higher_is_better else (lambda cand, base: cand / base - 1)
    cand_stat, base_stat = float(stat(cand_values)), float(stat(base_values))
    pairs = _paired(c.metric, candidate, baseline, bucket, bounds) if c.test == "paired" else []
    if len(pairs) >= 10 and not any(s in c.metric for s in ("_p90_", "_p99_")):
        # Same seeds give the same prompts: each request against its twin. The estimate is the median
        # log ratio (worse > 0), which cancels the spread of prompt lengths that unpaired medians carry.
        cand_p, base_p = np.asarray(pairs).T
        worse_log = np.log(base_p / cand_p) if c.higher_is_better else np.log(cand_p / base_p)
        p = float(wilcoxon(worse_log, alternative="greater").pvalue)
        estimate = float(np.expm1(np.median(worse_log)))
        lo, hi = _bootstrap_regression(worse_log, None, lambda v: np.expm1(np.median(v)), None, seed)
    else:  # tails (p90/p99) and unmatched runs: compare the two samples as they are
        estimate = worse(cand_stat, base_stat)
        lo, hi = _bootstrap_regression(np.asarray(cand_values), np.asarray(base_values), stat, worse, seed)
        alternative = "less" if c.higher_is_better else "greater"  # the candidate being worse
        p = float(mannwhitneyu(cand_values, base_values, alternative=alternative).pvalue)
    failed = estimate > c.max_regression and p < c.alpha
    verdict = "fail" if failed else "pass"
    message = (f"{c.metric} {'regressed' if estimate > 0 else 'improved'} {abs(estimate):.1%} [{lo:+.1%}, {hi:+.1%}] "
               f"vs baseline in phase {where['phase']}, bucket {bucket} (p={p:.3g}, allowed {c.max_regression:.0%})")
    return Judgement(**where, verdict=verdict, value=cand_stat, ci=(lo, hi), baseline=base_stat,
                     regression=estimate, p_value=p, message=message)


def _paired(metric: str, candidate: list[Run], baseline: list[Run], bucket: str,
            bounds: tuple[int, ...]) -> list[tuple[float, float]]:
    """(candidate, baseline) values of the same request (same repeat, index and prompt length)."""
    extract = _PER_REQUEST.get(metric.split("_")[0])
    if extract is None or metric.startswith("itl"):  # run-level, or many gaps per request: nothing to pair
        return []
    pairs = []
    for cand_run, base_run in zip(candidate, baseline):
        twins = {r.index: r for r in base_run.records if r.success and not r.warmup}
        for r in _in_bucket(cand_run.records, bucket, bounds):
            twin = twins.get(r.index)
            if not r.success or r.warmup or twin is None or twin.prompt_len != r.prompt_len:
                continue
            a, b = extract(r), extract(twin)
            if a and b and a[0] > 0 and b[0] > 0:
                pairs.append((a[0], b[0]))
    return pairs


def _bootstrap_regression(cand: np.ndarray, base: np.ndarray | None, stat, worse, seed: int,  # noqa: ANN001
                          resamples: int = 1000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the regression (one paired sample when base is None)."""
    rng = np.random.default_rng(seed)
    if base is None:
        estimates = [float(stat(cand[rng.integers(0, cand.size, cand.size)])) for _ in range(resamples)]
    else:
        estimates = [worse(float(stat(cand[rng.integers(0, cand.size, cand.size)])),
                           float(stat(base[rng.integers(0, base.size, base.size)]))) for _ in range(resamples)]
    lo, hi = np.percentile(estimates, [2.5, 97.5])
    return float(lo), float(hi)
