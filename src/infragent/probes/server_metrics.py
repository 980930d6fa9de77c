"""A serving stack's Prometheus /metrics, read while load runs: whichever known family the server exposes
(vLLM, SGLang, llama.cpp's server, TGI, ours) mapped to one vocabulary.

  running      requests in the running batch          waiting       requests queued for it
  kv_usage     fraction of the KV cache in use (0-1)  preemptions   requests evicted and recomputed (counter)
  prompt_tokens, generation_tokens                    token counters

A poller thread scrapes every PERIOD_S; the series and what the server did not expose are kept, so a
finding can say what it could not see.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PERIOD_S = 0.25
GAUGES = ("running", "waiting", "kv_usage")
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens")
# family -> quantity -> metric family names (as the parser reports them: a counter without its _total),
# the first one present wins; vLLM renamed some across versions
FAMILIES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
             "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
             "preemptions": ("vllm:num_preemptions",), "prompt_tokens": ("vllm:prompt_tokens",),
             "generation_tokens": ("vllm:generation_tokens",)},
    "sglang": {"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
               "kv_usage": ("sglang:token_usage",), "preemptions": ("sglang:num_retracted_reqs",),
               "prompt_tokens": ("sglang:prompt_tokens",), "generation_tokens": ("sglang:generation_tokens",)},
    "llamacpp": {"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",),
                 "kv_usage": ("llamacpp:kv_cache_usage_ratio",), "prompt_tokens": ("llamacpp:prompt_tokens",),
                 "generation_tokens": ("llamacpp:tokens_predicted",)},
    "tgi": {"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
    "infragent": {"running": ("infragent:num_requests_running",), "waiting": ("infragent:num_requests_waiting",),
                  "kv_usage": ("infragent:kv_cache_usage_perc",), "preemptions": ("infragent:num_preemptions",),
                  "prompt_tokens": ("infragent:prompt_tokens",),
                  "generation_tokens": ("infragent:generation_tokens",)},
}


@dataclass
class Scrape:
    """One reading: seconds since the watch began, and each quantity the family exposes."""

    t_s: float
    values: dict[str, float]


@dataclass
class MetricsSeries:
    """What the watch saw: the family, its readings, and why anything is missing."""

    url: str
    family: str | None = None
    scrapes: list[Scrape] = field(default_factory=list)
    missing: str | None = None  # "no /metrics (404)", "no known family (names: ...)", a connection error

    def values(self, quantity: str) -> list[float]:
        """A quantity's readings in time order ([] when the server does not expose it)."""
        return [s.values[quantity] for s in self.scrapes if quantity in s.values]

    def increase(self, quantity: str) -> float | None:
        """A counter's increase over the watch (None when not exposed or read fewer than twice)."""
        seen = self.values(quantity)
        return seen[-1] - seen[0] if len(seen) >= 2 else None

    def exposes(self) -> list[str]:
        """The quantities this server exposes."""
        return [q for q in GAUGES + COUNTERS if self.values(q)]

    def to_dict(self) -> dict:
        """A JSON-ready copy (scrapes as rows)."""
        return {"url": self.url, "family": self.family, "missing": self.missing,
                "scrapes": [{"t_s": round(s.t_s, 3), **s.values} for s in self.scrapes]}


def parse(text: str) -> tuple[str | None, dict[str, float], list[str]]:
    """(family, quantities, every metric name) of one exposition; gauges and counters summed over their labels
    (one value per engine or model), kv_usage the largest. A percentage given as 0-100 is brought to 0-1."""
    totals: dict[str, float] = {}
    names = []
    for metric in text_string_to_metric_families(text):
        names.append(metric.name)
        own = [s.value for s in metric.samples if s.name in (metric.name, metric.name + "_total")]
        if own:
            totals[metric.name] = max(own) if "usage" in metric.name else sum(own)
    for family, quantities in FAMILIES.items():
        found: dict[str, float] = {}
        for quantity, candidates in quantities.items():
            hit = next((totals[c] for c in candidates if c in totals), None)
            if hit is not None:
                found[quantity] = hit / 100.0 if quantity == "kv_usage" and hit > 1.0 else hit
        if "running" in found or "waiting" in found:
            return family, found, names
    return None, {}, names


class MetricsWatch:
    """Scrape base_url/metrics every period until stopped (a context manager); .series holds the readings."""

    def __init__(self, base_url: str, api_key: str | None = None, period_s: float = PERIOD_S) -> None:
        self.url = f"{base_url.rstrip('/')}/metrics"
        self.series = MetricsSeries(self.url)
        self.period_s = period_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="infragent-metrics-watch", daemon=True)

    def __enter__(self) -> "MetricsWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        start = time.monotonic()
        with httpx.Client(timeout=5.0, headers=self._headers) as client:
            while True:
                if not self.scrape_once(client, time.monotonic() - start):
                    return
                if self._stop.wait(self.period_s):
                    self.scrape_once(client, time.monotonic() - start)  # the state as the load ends
                    return

    def scrape_once(self, client: httpx.Client, t_s: float) -> bool:
        """One reading into the series; False when the server has no usable /metrics (stop asking)."""
        series = self.series
        try:
            reply = client.get(self.url)
        except httpx.HTTPError as err:
            series.missing = series.missing or f"{self.url}: {type(err).__name__}: {err}"
            return bool(series.scrapes)  # a server that answered before may just be busy
        if reply.status_code != 200:
            series.missing = f"no /metrics ({self.url} answered {reply.status_code})"
            return False
        try:
            family, values, names = parse(reply.text)
        except ValueError as err:
            series.missing = f"{self.url}: not Prometheus text ({err})"
            return False
        if family is None:
            shown = ", ".join(sorted({n.split(":")[0].split("_")[0] for n in names})[:6]) or "none"
            series.missing = (f"{self.url}: no known family (vllm, sglang, llamacpp, tgi, infragent) among its "
                              f"metrics (prefixes: {shown})")
            return False
        series.family = family
        series.scrapes.append(Scrape(t_s, values))
        return True
