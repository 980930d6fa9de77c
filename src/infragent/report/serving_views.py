"""What a serving run's loadgen evidence shows, as data: per-request latencies of baseline and best for CDFs
(by scenario and prompt-length bucket), and each trial's operating point (throughput against tail latency)
for the Pareto view. Everything is read from the raw records the ledger kept, never from a summary line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from infragent.analysis.serving_metrics import bucket_of
from infragent.lab.ledger import Ledger, LedgerError

CDF_POINTS = 120  # quantiles kept per drawn CDF: enough for the eye, small for a page of 200 trials
LATENCIES = {"TTFT": "time to first token", "TPOT": "time per output token", "ITL": "inter-token latency",
             "E2EL": "end-to-end latency"}


def stored_artifact(ledger: Ledger, evidence: dict[str, Any]) -> Path | None:
    """The ledger's own copy of an evidence file (content-addressed), or None when it is missing."""
    sha = evidence.get("sha256", "")
    if not sha:
        return None
    try:
        path = ledger.artifact_path(sha)
    except LedgerError:
        return None
    return path if path.exists() else None


def loadgen_result(ledger: Ledger, feedback: dict[str, Any]) -> dict[str, Any] | None:
    """A loadgen probe's raw result (config and runs with their records), or None without stored evidence."""
    for evidence in feedback.get("evidence", []):
        path = stored_artifact(ledger, evidence)
        if path is not None:
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                return None
    return None


def latencies_ms(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per latency metric, the successful measured requests' values in ms."""
    ok = [r for r in records if r.get("success") and not r.get("warmup")]
    return {"TTFT": [r["ttft_s"] * 1e3 for r in ok],
            "TPOT": [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) * 1e3 for r in ok
                     if r.get("output_tokens", 0) > 1],
            "ITL": [x * 1e3 for r in ok for x in r.get("itl_s", [])],
            "E2EL": [r["latency_s"] * 1e3 for r in ok]}


def add_cdf_samples(cdfs: dict[str, dict[str, dict[str, list[float]]]], result: dict[str, Any], scenario: str,
                    side: str, buckets: tuple[int, ...] | None = None) -> None:
    """Add one loadgen result's latencies under metric -> "scenario · bucket" -> side (all buckets and each)."""
    for run in result.get("runs", []):
        records = run.get("records", [])
        groups: dict[str, list[dict]] = {f"{scenario} · all": records}
        for r in records:
            bucket = bucket_of(r.get("prompt_len", 0), buckets) if buckets else bucket_of(r.get("prompt_len", 0))
            groups.setdefault(f"{scenario} · {bucket}", []).append(r)
        if len(groups) == 2:  # one bucket only: "all" already says it
            groups = {f"{scenario} · all": records}
        for group, rows in groups.items():
            for metric, values in latencies_ms(rows).items():
                cdfs.setdefault(metric, {}).setdefault(group, {}).setdefault(side, []).extend(values)


def cdf_points(values: list[float], points: int = CDF_POINTS) -> tuple[list[float], list[float]]:
    """(x, F(x)) of the empirical CDF at up to `points` quantiles (the whole sample when smaller)."""
    xs = np.sort(np.asarray(values, float))
    if xs.size <= points:
        return xs.tolist(), (np.arange(1, xs.size + 1) / xs.size).tolist()
    qs = np.linspace(0, 1, points)
    return np.quantile(xs, qs).tolist(), qs.tolist()


def operating_point(result: dict[str, Any]) -> dict[str, float] | None:
    """Median over a loadgen result's repeats of throughput and tail latencies (None without runs)."""
    runs = [run["metrics"] for run in result.get("runs", []) if run.get("metrics", {}).get("completed")]
    if not runs:
        return None

    def median(get) -> float:  # noqa: ANN001 (a getter over one run's metrics)
        values = [v for v in (get(m) for m in runs) if v is not None]
        return float(np.median(values)) if values else float("nan")

    return {"output_tok_s": median(lambda m: m.get("output_throughput")),
            "goodput": median(lambda m: m.get("goodput")),
            "ttft_p99_ms": median(lambda m: m.get("ttft_ms", {}).get("p99")),
            "tpot_p99_ms": median(lambda m: m.get("tpot_ms", {}).get("p99"))}


def pareto_front(points: list[dict[str, Any]], x: str, y: str) -> list[dict[str, Any]]:
    """The points no other point beats on both (x lower is better, y higher is better), by x."""
    finite = [p for p in points if np.isfinite(p[x]) and np.isfinite(p[y])]
    front = [p for p in finite if not any(q[x] <= p[x] and q[y] >= p[y] and (q[x] < p[x] or q[y] > p[y])
                                          for q in finite)]
    return sorted(front, key=lambda p: p[x])
