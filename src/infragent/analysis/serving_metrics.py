"""Serving metrics over per-request records, with exactly the definitions of vLLM's `bench serve`.

- TTFT: first streamed chunk arrival − request start.
- ITL: gaps between consecutive chunk arrivals after the first (pooled over all requests).
- E2EL (latency): last chunk arrival − request start.
- TPOT: (E2EL − TTFT) / (output_tokens − 1) per request with more than one output token; for goodput a
  request with at most one output token counts TPOT as 0.
- Throughputs divide by the benchmark duration; goodput counts requests meeting every SLO.
Phases: prefill is TTFT (and prompt tokens / TTFT); decode is TPOT, ITL (and (out − 1) / (E2EL − TTFT)).
Breakdowns are per prompt-length bucket, and phases are never averaged together.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

PERCENTILES = (50, 90, 99)
DEFAULT_BUCKETS = (128, 512, 2048, 8192)  # prompt-token upper bounds; longer prompts go in the last bucket


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from the benchmark start."""

    index: int
    prompt_len: int  # tokens the client meant to send
    output_len: int  # tokens it asked for
    start_s: float = 0.0
    success: bool = False
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0  # from the server's usage
    output_tokens: int = 0  # from the server's usage
    error: str = ""
    warmup: bool = False
    output_digest: str = ""  # a hash of the generated text (greedy runs of two servers should match)
    output_counted: str = ""  # where output_tokens came from: "usage" (the server's), "text" (re-tokenized)
    output_text: str = ""  # the text, kept only until it is counted when the server gave no usage
    finish_reason: str = ""  # the stream's last finish_reason ("" when it ended without one: cut off)

    @property
    def tpot_s(self) -> float:
        """(E2EL − TTFT) / (output − 1), 0 when there is at most one output token."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class Distribution:
    """mean, std, median and percentiles of one quantity (latencies in ms, rates in tokens/s)."""

    mean: float
    std: float
    median: float
    p90: float
    p99: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float], scale: float = 1e3) -> "Distribution":
        """Summarize samples times scale (default: seconds to ms); NaN everywhere when empty."""
        ms = np.asarray(list(values), dtype=float) * scale
        if ms.size == 0:
            return cls(*(float("nan"),) * 5, 0)
        p50, p90, p99 = np.percentile(ms, PERCENTILES)
        return cls(float(ms.mean()), float(ms.std()), float(np.median(ms)), float(p90), float(p99), int(ms.size))


@dataclass
class ServingMetrics:
    """The bench-serve summary of one set of records."""

    completed: int
    failed: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None  # requests/s meeting every SLO; None without SLOs
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    prefill_tok_s: Distribution  # per request: prompt tokens / TTFT
    decode_tok_s: Distribution  # per request: (output − 1) / (E2EL − TTFT)

    def phases(self) -> dict[str, dict[str, Any]]:
        """The same numbers grouped by phase: prefill (TTFT) and decode (TPOT, ITL)."""
        return {"prefill": {"ttft_ms": asdict(self.ttft_ms), "tok_s": asdict(self.prefill_tok_s)},
                "decode": {"tpot_ms": asdict(self.tpot_ms), "itl_ms": asdict(self.itl_ms),
                           "tok_s": asdict(self.decode_tok_s)}}


def serving_metrics(records: list[RequestRecord], duration_s: float,
                    slos_ms: dict[str, float] | None = None) -> ServingMetrics:
    """Summarize measured (non-warm-up) records over a benchmark that lasted duration_s."""
    done = [r for r in records if r.success and not r.warmup]
    failed = sum(1 for r in records if not r.success and not r.warmup)
    total_in = sum(r.prompt_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    per_s = 1.0 / duration_s if duration_s > 0 else float("nan")
    goodput = None
    if slos_ms:
        goodput = sum(1 for r in done if _meets(r, slos_ms)) * per_s
    prefill_rates = [r.prompt_tokens / r.ttft_s for r in done if r.ttft_s > 0]
    decode_rates = [(r.output_tokens - 1) / (r.latency_s - r.ttft_s)
                    for r in done if r.output_tokens > 1 and r.latency_s > r.ttft_s]
    return ServingMetrics(
        completed=len(done), failed=failed, duration_s=duration_s, total_input=total_in, total_output=total_out,
        request_throughput=len(done) * per_s, output_throughput=total_out * per_s,
        total_token_throughput=(total_in + total_out) * per_s, goodput=goodput,
        ttft_ms=Distribution.of(r.ttft_s for r in done),
        tpot_ms=Distribution.of(r.tpot_s for r in done if r.output_tokens > 1),
        itl_ms=Distribution.of(gap for r in done for gap in r.itl_s),
        e2el_ms=Distribution.of(r.latency_s for r in done),
        prefill_tok_s=Distribution.of(prefill_rates, scale=1.0),
        decode_tok_s=Distribution.of(decode_rates, scale=1.0))


def _meets(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    values = {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2el": record.latency_s}
    return all(values[name] * 1e3 <= limit for name, limit in slos_ms.items())


def bucket_of(prompt_tokens: int, bounds: tuple[int, ...] = DEFAULT_BUCKETS) -> str:
    """'≤128', '≤512', ... or '>8192'."""
    for bound in bounds:
        if prompt_tokens <= bound:
            return f"<={bound}"
    return f">{bounds[-1]}"


def by_bucket(records: list[RequestRecord], duration_s: float, slos_ms: dict[str, float] | None = None,
              bounds: tuple[int, ...] = DEFAULT_BUCKETS) -> dict[str, ServingMetrics]:
    """serving_metrics per prompt-length bucket (by the client's prompt length)."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup:
            groups.setdefault(bucket_of(r.prompt_len, bounds), []).append(r)
    return {name: serving_metrics(group, duration_s, slos_ms) for name, group in sorted(groups.items())}
