"""Judge acceptance criteria on loadgen records: per scenario, phase and prompt-length bucket, never averaged.

Every criterion is judged the same way: an estimate with a (1 − alpha) confidence interval, where alpha is
the criterion's alpha split across the buckets it is judged in (Bonferroni), against the limit. It passes
when the whole interval is on the allowed side of the limit, fails when the whole interval is past it, and
is otherwise inconclusive (more samples would decide): a pass proves the claim at that confidence, so a
true regression at or past the limit passes about alpha/2 of the time (a little more with under ~20 pairs,
where percentile-bootstrap intervals of a median run narrow).

Absolute criteria (max/min) use the metric of each repeat; the estimate is their median, with a bootstrap
CI across repeats. Relative criteria (max_regression) estimate the regression (worse > 0) against the
baseline. The default test pairs each request with its twin in the baseline (loadgen's seeds give both the
same prompts): the estimate is the median per-request ratio, with a bootstrap CI over the pairs. With three
or more twin repeats a median is also estimated from the repeats' own medians, each way at alpha/2, and the
one that decides is kept (a batching change scatters twin requests across queue waves; see _decisive).
"mann-whitney", tail metrics (p90, p99) and unmatched runs compare the two samples' statistics unpaired.
Run-level metrics (throughputs) compare repeats: paired when the repeats are twins (the same prompts, run
interleaved, as the loop's end-to-end gate runs them), as the ratio per twin repeat with a 20% trimmed mean
and Yuen's t interval (analysis/blocks), since both sides of a twin share the machine's state of the moment;
unpaired otherwise, and under "bootstrap". Output throughput over twins sent block by block is paired finer,
per block (twin_block_ratios): three repeats of four blocks give twelve pairs, not three. The p-value of a
one-sided rank test (Wilcoxon on the pairs, Mann–Whitney unpaired) is kept as information; it does not decide.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu, wilcoxon

from infragent.analysis.blocks import block_estimate, block_log_ratios
from infragent.analysis.serving_metrics import RequestRecord, bucket_of, serving_metrics
from infragent.analysis.stats import bootstrap_median
from infragent.lab.spec import Criterion

RESAMPLES = 2000
REPEAT_TRIM = 0.2  # twin repeats: the share cut from each end before the mean of their log ratios
WHY = {"pass": "the whole CI is within the limit", "fail": "the whole CI is past the limit",
       "inconclusive": "the CI reaches past the limit; more samples would decide"}


@dataclass
class Run:
    """One loadgen repeat: its records and duration."""

    records: list[RequestRecord]
    duration_s: float
    slos_ms: dict[str, float] | None = None  # goodput SLOs of the scenario, e.g. {"ttft": 2000, "tpot": 150}
    block: int | None = None  # requests per interleaved block when the run is one side of twins sent block by block


@dataclass
class Judgement:
    """A criterion judged for one bucket: estimate, CI, limit and verdict."""

    scenario: str
    metric: str
    phase: str
    bucket: str
    verdict: str  # pass | fail | inconclusive
    value: float  # candidate's metric (median across repeats, or on pooled records)
    ci: tuple[float, float]  # of the regression for relative criteria, of value for absolute ones
    baseline: float | None = None
    regression: float | None = None  # fraction worse than the baseline (negative: better)
    p_value: float | None = None  # one-sided rank test that the candidate is worse; information only
    message: str = ""
    limit: float | None = None  # max, min or max_regression of the criterion
    rule: str = ""  # max | min | max_regression
    method: str = ""  # what the estimate is, e.g. "paired median ratio over 412 pairs"
    confidence: float | None = None  # of ci


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


def _quantile(metric: str) -> float:
    return 99.0 if "_p99_" in metric else 90.0 if "_p90_" in metric else 50.0


def statistic(values: list[float], metric: str) -> float:
    """The metric's statistic over per-request values: median, p90, p99 or (rates) median."""
    return float(np.percentile(values, _quantile(metric))) if len(values) else float("nan")


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


def verdict_of(lo: float, hi: float, limit: float, rule: str) -> str:
    """pass when [lo, hi] is wholly on the allowed side of the limit, fail when wholly past it."""
    if rule == "min":
        return "pass" if lo >= limit else "fail" if hi < limit else "inconclusive"
    return "pass" if hi <= limit else "fail" if lo > limit else "inconclusive"


def limit_text(rule: str, limit: float) -> str:
    """The limit as a reader sees it: '<= 500', '>= 0.4' or 'regression <= +5%'."""
    return {"max": f"<= {limit:g}", "min": f">= {limit:g}"}.get(rule, f"regression <= {limit:+.0%}")


def _unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return " ms"
    return " tok/s" if metric.endswith("tok_s") else " req/s" if metric in ("request_per_s", "goodput") else ""


def _close(verdict: str, rule: str, limit: float, why: str = "") -> str:
    return f"limit {limit_text(rule, limit)}: {verdict} ({why or WHY[verdict]})"


def judge_interval(criterion: Criterion, value: float, lo: float, hi: float, phase: str,
                   confidence: float = 0.95, method: str = "") -> Judgement:
    """An absolute criterion on one estimate with its CI (lo == hi: an exact value, such as a worst case):
    pass when the whole interval is on the allowed side of the limit, fail when it is wholly on the other
    side, otherwise inconclusive."""
    rule = "max" if criterion.max is not None else "min"
    limit = criterion.max if rule == "max" else criterion.min
    verdict = verdict_of(lo, hi, limit, rule)
    exact = lo == hi
    why = ("not measured" if np.isnan([lo, hi]).any() else
           f"the value is {'within' if verdict == 'pass' else 'past'} the limit" if exact else "")
    how = ", ".join(part for part in (method, "" if exact else f"{confidence:.1%} CI") if part)
    message = (f"{criterion.metric} {value:.4g}" + ("" if exact else f" [{lo:.4g}, {hi:.4g}]")
               + _unit(criterion.metric) + (f" ({how})" if how else "")
               + f" in phase {phase}, bucket all; {_close(verdict, rule, limit, why)}")
    return Judgement(criterion.scenario, criterion.metric, phase, "all", verdict, value, (lo, hi), message=message,
                     limit=limit, rule=rule, method=method, confidence=None if exact else confidence)


def describe(j: dict[str, Any]) -> str:
    """One judgement (a Judgement's asdict) as 'estimate [lo, hi] (how it was estimated); limit: verdict'."""
    lo, hi = j["ci"]
    relative = j.get("rule") == "max_regression" or j.get("regression") is not None
    how = [j.get("method") or "", f"{j['confidence']:.1%} CI" if j.get("confidence") else ""]
    if j.get("regression") is not None:
        estimate = f"regression {j['regression']:+.1%} [{lo:+.1%}, {hi:+.1%}]"
        paired = (j.get("method") or "").startswith("paired")
        how.append(f"{'unpaired ' if paired else ''}candidate {j['value']:.4g} vs baseline {j['baseline']:.4g}")
    elif relative:
        estimate = "no estimate"
    else:
        exact = lo == hi and not j.get("confidence")
        estimate = f"{j['value']:.4g}" + ("" if exact else f" [{lo:.4g}, {hi:.4g}]")
    how_text = "; ".join(part for part in how if part)
    rule = j.get("rule") or ("max_regression" if relative else "")
    limit = f"; limit {limit_text(rule, j['limit'])}" if j.get("limit") is not None else ""
    return f"{estimate}" + (f" ({how_text})" if how_text else "") + f"{limit}: {j['verdict']}"


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

    With several buckets the criterion's alpha is split between them (Bonferroni) and each bucket's CI has
    confidence 1 − alpha share, so that the chance of a wrong verdict anywhere stays at alpha.
    """
    buckets = buckets_for(criterion, candidate, bounds)
    share = criterion.model_copy(update={"alpha": criterion.alpha / len(buckets)})
    return [_judge_bucket(share, candidate, baseline, bucket, bounds, seed) for bucket in buckets]


def _judge_bucket(c: Criterion, candidate: list[Run], baseline: list[Run] | None, bucket: str,
                  bounds: tuple[int, ...], seed: int) -> Judgement:
    where = dict(scenario=c.scenario, metric=c.metric, phase=c.phase, bucket=bucket)
    if c.max_regression is None:
        per_run = [run_value(run, c.metric, _in_bucket(run.records, bucket, bounds)) for run in candidate]
        return _absolute(c, per_run, seed, where)
    if not baseline:
        return Judgement(**where, verdict="inconclusive", value=float("nan"), ci=(float("nan"),) * 2,
                         limit=c.max_regression, rule="max_regression",
                         message=f"{c.metric}: a relative criterion needs baseline runs; "
                                 + _close("inconclusive", "max_regression", c.max_regression, "nothing to compare"))
    return _relative(c, candidate, baseline, bucket, bounds, seed, where)


def _place(where: dict) -> str:
    return f"in phase {where['phase']}, bucket {where['bucket']}"


def _absolute(c: Criterion, per_run: list[float], seed: int, where: dict) -> Judgement:
    confidence = 1 - c.alpha
    summary = bootstrap_median(per_run, confidence=confidence, resamples=RESAMPLES, seed=seed)
    rule = "max" if c.max is not None else "min"
    limit = c.max if rule == "max" else c.min
    method = f"median across {len(per_run)} repeats"
    if len(per_run) < 2:
        verdict, why = "inconclusive", "one repeat is not evidence: run at least 2"
    else:
        verdict, why = verdict_of(summary.lo, summary.hi, limit, rule), ""
    message = (f"{c.metric} {summary.median:.4g} [{summary.lo:.4g}, {summary.hi:.4g}]{_unit(c.metric)} "
               f"({method}, {confidence:.1%} CI) {_place(where)}; {_close(verdict, rule, limit, why)}")
    return Judgement(**where, verdict=verdict, value=summary.median, ci=(summary.lo, summary.hi), message=message,
                     limit=limit, rule=rule, method=method, confidence=confidence)


@dataclass
class _Estimate:
    """A regression (worse > 0) with its CI, the p-value, and what it was computed on."""

    regression: float
    lo: float
    hi: float
    p_value: float
    method: str  # e.g. "paired median ratio over 412 pairs"
    stat: str  # the statistic of the candidate and baseline values printed beside it: median, p90, p99


def _relative(c: Criterion, candidate: list[Run], baseline: list[Run], bucket: str, bounds: tuple[int, ...],
              seed: int, where: dict) -> Judgement:
    cand_values = request_values([r for run in candidate for r in _in_bucket(run.records, bucket, bounds)], c.metric)
    base_values = request_values([r for run in baseline for r in _in_bucket(run.records, bucket, bounds)], c.metric)
    def per_repeat(runs: list[Run]) -> list[float]:
        return [run_value(r, c.metric, _in_bucket(r.records, bucket, bounds)) for r in runs]

    by_repeat = cand_values is None or c.test == "bootstrap"  # run-level metric, or asked for: compare repeats
    if by_repeat:
        cand_values, base_values = per_repeat(candidate), per_repeat(baseline)
    q = 50.0 if by_repeat else _quantile(c.metric)
    if len(cand_values) < 2 or len(base_values) < 2:
        return Judgement(**where, verdict="inconclusive", value=float("nan"), ci=(float("nan"),) * 2,
                         limit=c.max_regression, rule="max_regression",
                         message=f"{c.metric}: too few samples {_place(where)} to compare; "
                                 + _close("inconclusive", "max_regression", c.max_regression, "no samples to judge"))
    cand_stat, base_stat = float(np.percentile(cand_values, q)), float(np.percentile(base_values, q))
    pairs = _paired(c.metric, candidate, baseline, bucket, bounds) if c.test == "paired" else []
    rng = np.random.default_rng(seed)
    confidence = 1 - c.alpha
    if len(pairs) >= 10 and q == 50.0 and len(candidate) >= 3 and _twins(candidate, baseline):
        est, confidence = _decisive(c, np.asarray(pairs), np.asarray(per_repeat(candidate)),
                                    np.asarray(per_repeat(baseline)), rng)
    elif len(pairs) >= 10 and q == 50.0:
        est = _paired_estimate(np.asarray(pairs), c.higher_is_better, c.alpha, rng)
    elif blocks := (by_repeat and c.test == "paired" and c.metric == "output_tok_s" and bucket == "all"
                    and _twins(candidate, baseline) and twin_block_ratios(baseline, candidate)):
        est = _twin_blocks_estimate(blocks, len(candidate), c.alpha)
    elif by_repeat and c.test == "paired" and _twins(candidate, baseline) and _positive(cand_values + base_values):
        est = _twin_repeats_estimate(np.asarray(cand_values), np.asarray(base_values), c.higher_is_better, c.alpha)
    else:  # tails (p90/p99), repeats and unmatched runs: compare the two samples as they are
        est = _unpaired_estimate(np.asarray(cand_values), np.asarray(base_values), q, c.higher_is_better, c.alpha,
                                 rng, "repeats" if by_repeat else "requests")
    verdict = verdict_of(est.lo, est.hi, c.max_regression, "max_regression")
    return Judgement(**where, verdict=verdict, value=cand_stat, ci=(est.lo, est.hi), baseline=base_stat,
                     regression=est.regression, p_value=est.p_value,
                     message=_relative_message(c, est, cand_stat, base_stat, verdict, where, confidence),
                     limit=c.max_regression, rule="max_regression", method=est.method, confidence=confidence)


def _relative_message(c: Criterion, est: _Estimate, cand_stat: float, base_stat: float, verdict: str,
                      where: dict, confidence: float) -> str:
    """The direction word comes from the sign of the estimate printed beside it; the medians printed beside
    a paired estimate are named unpaired, since the two can disagree in sign."""
    direction = ("regressed" if est.regression > 0 else "improved" if est.regression < 0
                 else "unchanged" if est.regression == 0 else "not comparable")
    why = "" if np.isfinite([est.lo, est.hi]).all() else "a statistic of zero leaves no finite ratio"
    unpaired = "unpaired " if est.method.startswith("paired") else ""
    return (f"{c.metric} {direction}: regression {est.regression:+.1%} [{est.lo:+.1%}, {est.hi:+.1%}] ({est.method}, "
            f"{confidence:.1%} CI, worse > 0; {unpaired}candidate {est.stat} {cand_stat:.4g} vs baseline "
            f"{base_stat:.4g}{_unit(c.metric)}; p={est.p_value:.3g}) {_place(where)}; "
            + _close(verdict, "max_regression", c.max_regression, why))


def _paired_estimate(pairs: np.ndarray, higher_is_better: bool, alpha: float, rng: np.random.Generator) -> _Estimate:
    """Median per-request ratio of twins (worse > 0): it cancels the spread of prompt lengths that unpaired
    medians carry."""
    cand, base = pairs.T
    worse_log = np.log(base / cand) if higher_is_better else np.log(cand / base)
    lo, hi = np.expm1(_interval(_bootstrap_percentile(worse_log, 50.0, rng), alpha))
    p = float(wilcoxon(worse_log, alternative="greater").pvalue) if np.any(worse_log != 0) else 1.0
    return _Estimate(float(np.expm1(np.median(worse_log))), lo, hi, p,
                     f"paired median ratio over {worse_log.size} pairs", "median")


def _decisive(c: Criterion, pairs: np.ndarray, cand_repeats: np.ndarray, base_repeats: np.ndarray,
              rng: np.random.Generator) -> tuple[_Estimate, float]:
    """A median over twin repeats, estimated two ways at alpha/2 each (Bonferroni, so a wrong verdict from
    either stays under alpha): twin requests paired (which cancels the spread of prompt lengths) and the
    repeats' own medians paired (which holds where a request's place in the queue, not its prompt, sets its
    latency: a batching change moves requests between waves, so twin requests differ widely while the
    median moves steadily). The estimate that decides is kept; if they decide opposite ways, or neither
    does, the verdict is inconclusive. Returns the estimate and its confidence."""
    half = c.alpha / 2
    by_request = _paired_estimate(pairs, c.higher_is_better, half, rng)
    if not _positive(list(cand_repeats) + list(base_repeats)):
        return by_request, 1 - half
    by_repeat = _twin_repeats_estimate(cand_repeats, base_repeats, c.higher_is_better, half)
    verdicts = [verdict_of(e.lo, e.hi, c.max_regression, "max_regression") for e in (by_request, by_repeat)]
    decided = [e for e, v in zip((by_request, by_repeat), verdicts) if v != "inconclusive"]
    if len(set(verdicts) - {"inconclusive"}) == 1:
        return decided[0], 1 - half
    method = (f"{by_request.method}; by twin repeats: regression {by_repeat.regression:+.1%} "
              f"[{by_repeat.lo:+.1%}, {by_repeat.hi:+.1%}]")
    if len(decided) == 2:  # opposite verdicts: the interval spanning both reaches across the limit
        return replace(by_request, lo=min(by_request.lo, by_repeat.lo), hi=max(by_request.hi, by_repeat.hi),
                       method=f"{method}; they disagree, so both intervals are shown as one"), 1 - half
    return replace(by_request, method=method), 1 - half


def _twins(candidate: list[Run], baseline: list[Run]) -> bool:
    """Whether the runs are twin repeats: as many on each side, each pair with the same requests (index and
    prompt length), so the i-th repeats ran the same prompts (interleaved, when the loop measured them)."""
    def requests(run: Run) -> list[tuple[int, int]]:
        return sorted((r.index, r.prompt_len) for r in run.records if not r.warmup)

    return (len(candidate) == len(baseline) >= 2
            and all(requests(c) == requests(b) and requests(c) for c, b in zip(candidate, baseline)))


def _positive(values: list[float]) -> bool:
    return bool(np.all(np.isfinite(values)) and np.all(np.asarray(values) > 0))


def _twin_repeats_estimate(cand: np.ndarray, base: np.ndarray, higher_is_better: bool, alpha: float) -> _Estimate:
    """The regression (worse > 0) as the trimmed mean of per-twin-repeat log ratios, with Yuen's t interval."""
    worse_log = np.log(base / cand) if higher_is_better else np.log(cand / base)
    est = block_estimate(worse_log.tolist(), 1 - alpha, trim=REPEAT_TRIM)
    p = float(wilcoxon(worse_log, alternative="greater").pvalue) if np.any(worse_log != 0) else 1.0
    trimmed = f", {REPEAT_TRIM:.0%} trimmed" if est.df and est.df < est.blocks - 1 else ""
    return _Estimate(est.ratio - 1, est.lo - 1, est.hi - 1, p,
                     f"paired ratio of {est.blocks} twin repeats (mean of logs{trimmed}, t interval)", "median")


def twin_block_ratios(baseline: list[Run], candidate: list[Run]) -> list[float]:
    """Per interleaved block of twin repeats, pooled over the repeats: log(candidate / baseline) of the block's
    makespan per output token (analysis/blocks), the inverse ratio of its output throughput. Empty unless every
    run was sent block by block with one block size and every request on both sides succeeded: a block with
    a failure is left out there, which would hide a candidate that fails requests."""
    sizes = {run.block for run in baseline + candidate}
    served = all(r.success for run in baseline + candidate for r in run.records if not r.warmup)
    if len(sizes) != 1 or None in sizes or not served:
        return []
    size = sizes.pop()
    return [x for b, c in zip(baseline, candidate) for x in block_log_ratios(b.records, c.records, size, "makespan")]


def _twin_blocks_estimate(worse_log: list[float], repeats: int, alpha: float) -> _Estimate:
    """The throughput regression (worse > 0) as the trimmed mean of per-block log ratios over twin repeats,
    with Yuen's t interval. A repeat's ratio pools its blocks' (both pair the machine's phases the
    same way, twins seconds apart), so pairing per block estimates the same ratio from blocks × repeats samples
    where three repeats leave the interval two degrees of freedom (t = 4.3 at 95%)."""
    est = block_estimate(worse_log, 1 - alpha, trim=REPEAT_TRIM)
    p = float(wilcoxon(worse_log, alternative="greater").pvalue) if np.any(np.asarray(worse_log) != 0) else 1.0
    trimmed = f", {REPEAT_TRIM:.0%} trimmed" if est.df and est.df < est.blocks - 1 else ""
    return _Estimate(est.ratio - 1, est.lo - 1, est.hi - 1, p, f"paired ratio of {est.blocks} twin blocks over "
                     f"{repeats} repeats (mean of logs{trimmed}, t interval)", "median")


def _unpaired_estimate(cand: np.ndarray, base: np.ndarray, q: float, higher_is_better: bool, alpha: float,
                       rng: np.random.Generator, unit: str) -> _Estimate:
    """Ratio of the two samples' statistics (worse > 0), each side resampled on its own."""
    def worse(c: np.ndarray | float, b: np.ndarray | float) -> np.ndarray | float:
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero throughput: inf or nan, never a pass
            return np.asarray(b) / c - 1 if higher_is_better else np.asarray(c) / b - 1

    lo, hi = _interval(worse(_bootstrap_percentile(cand, q, rng), _bootstrap_percentile(base, q, rng)), alpha)
    alternative = "less" if higher_is_better else "greater"  # the candidate being worse
    p = float(mannwhitneyu(cand, base, alternative=alternative).pvalue)
    name = {50.0: "median", 90.0: "p90", 99.0: "p99"}[q]
    return _Estimate(float(worse(np.percentile(cand, q), np.percentile(base, q))), lo, hi, p,
                     f"unpaired {name} of {cand.size} vs {base.size} {unit}", name)


def _bootstrap_percentile(x: np.ndarray, q: float, rng: np.random.Generator) -> np.ndarray:
    """The q-th percentile of each of RESAMPLES resamples of x, drawn in blocks to bound memory."""
    rows = max(1, 2_000_000 // x.size)
    blocks = [min(rows, RESAMPLES - start) for start in range(0, RESAMPLES, rows)]
    return np.concatenate([np.percentile(x[rng.integers(0, x.size, (block, x.size), dtype=np.int32)], q, axis=1)
                           for block in blocks])


def _interval(estimates: np.ndarray, alpha: float) -> tuple[float, float]:
    """The (1 − alpha) percentile interval of bootstrap estimates."""
    lo, hi = np.percentile(estimates, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


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
