"""Robust statistics for timing samples: medians and means with bootstrap CIs, paired ratios, rank tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Summary:
    """A point estimate of raw samples (their median unless `statistic` says otherwise) with a bootstrap
    confidence interval."""

    center: float
    lo: float
    hi: float
    n: int
    statistic: str = "median"  # or "mean", "ratio of medians"

    @property
    def median(self) -> float:
        """The center of a median summary (an error for any other statistic: read center)."""
        if self.statistic != "median":
            raise AttributeError(f"this summary's center is a {self.statistic}, not a median; read .center")
        return self.center

    def fmt(self, digits: int = 1) -> str:
        """Render as 'center [lo, hi]'."""
        if self.n == 0:
            return "n/a"
        return f"{self.center:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def bootstrap(samples: list[float], statistic: str = "median", confidence: float = 0.95, resamples: int = 10_000,
              seed: int = 0) -> Summary:
    """The samples' median or mean and a percentile-bootstrap CI of it (None samples are left out)."""
    data = np.asarray([s for s in samples if s is not None], dtype=float)
    if data.size == 0:
        return Summary(float("nan"), float("nan"), float("nan"), 0, statistic)
    reduce = {"median": np.median, "mean": np.mean}[statistic]
    rng = np.random.default_rng(seed)
    lo, hi = _percentiles(reduce(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1), confidence)
    return Summary(float(reduce(data)), lo, hi, int(data.size), statistic)


def bootstrap_median(samples: list[float], confidence: float = 0.95, resamples: int = 10_000,
                     seed: int = 0) -> Summary:
    """Median of samples and a percentile-bootstrap CI of the median."""
    return bootstrap(samples, "median", confidence, resamples, seed)


def bootstrap_mean(samples: list[float], confidence: float = 0.95, resamples: int = 10_000,
                   seed: int = 0) -> Summary:
    """Mean of samples (Summary.center, statistic "mean") and a percentile-bootstrap CI of the mean."""
    return bootstrap(samples, "mean", confidence, resamples, seed)


def _percentiles(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The two-sided percentile interval of bootstrap estimates."""
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(estimates, [tail, 100 - tail])
    return float(lo), float(hi)


def t_interval(samples: list[float], center: float | None = None,
               confidence: float = 0.95) -> tuple[float, float] | None:
    """Two-sided Student t interval of the samples' mean (placed around center when given, e.g. a
    time-weighted share whose windows are the samples); None under two samples."""
    from scipy.stats import t as student_t

    data = np.asarray(samples, dtype=float)
    if data.size < 2:
        return None
    mid = float(data.mean()) if center is None else center
    half = float(student_t.ppf(0.5 + confidence / 2, data.size - 1) * data.std(ddof=1) / np.sqrt(data.size))
    return mid - half, mid + half


def ratio_summary(num: list[float], den: list[float], confidence: float = 0.95, resamples: int = 10_000,
                  seed: int = 0) -> Summary:
    """Ratio of medians median(num)/median(den) with a bootstrap CI (both resampled independently)."""
    a = np.asarray(num, dtype=float)
    b = np.asarray(den, dtype=float)
    if a.size == 0 or b.size == 0:
        return Summary(float("nan"), float("nan"), float("nan"), 0, "ratio of medians")
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    lo, hi = _percentiles(ra / rb, confidence)
    return Summary(float(np.median(a) / np.median(b)), lo, hi, int(min(a.size, b.size)), "ratio of medians")


def paired_ratio(a: list[float], b: list[float], confidence: float = 0.95, resamples: int = 4000,
                 seed: int = 0) -> Summary:
    """Median of the per-pair ratios b[i]/a[i] with a percentile-bootstrap CI.

    Pairs are measured next to each other in time, so slow drifts of the machine cancel in each ratio.
    """
    ratios = np.asarray(b, dtype=float) / np.asarray(a, dtype=float)
    return bootstrap_median(ratios.tolist(), confidence, resamples, seed)


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided Mann–Whitney U p-value that a and b come from the same distribution."""
    from scipy.stats import mannwhitneyu

    if len(a) < 2 or len(b) < 2:
        return float("nan")
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def min_detectable_effect(summary: Summary) -> float:
    """Smallest relative change the interval could tell apart from none: its half-width relative to the center."""
    if summary.n == 0 or summary.center == 0:
        return float("nan")
    return (summary.hi - summary.lo) / 2 / abs(summary.center)
