"""Whether a load run measured the prefix cache by accident: the server's prefix-cache counters read before
and after the run, against the reuse the run's own prompts allow (the share of each prompt that repeats the
start of an earlier one). A hit rate well above that means the prompts were served from an earlier run's
cache, and the latencies are not the ones a fresh workload gets.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import httpx

# (hits, queries) counter names, in tokens: ours, then vLLM's (V1), then SGLang's has none we can read
COUNTERS = (("infragent:prefix_cache_hits_total", "infragent:prefix_cache_queries_total"),
            ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
MARGIN = 0.10  # a hit rate this far above the dataset's own reuse is flagged


def read_counters(base_url: str, api_key: str | None = None) -> tuple[float, float] | None:
    """The server's (prefix-cache hit tokens, query tokens) from /metrics, summed over labels; None when it
    exposes neither counter pair (or no /metrics)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers, timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    totals: dict[str, float] = {}
    for line in response.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            totals[name.split("{", 1)[0]] = totals.get(name.split("{", 1)[0], 0.0) + float(value)
        except ValueError:
            continue
    for hits, queries in COUNTERS:
        if hits in totals and queries in totals:
            return totals[hits], totals[queries]
    return None


def implied_reuse(prompts: Sequence[str | list[int]]) -> float:
    """The share of all prompt items (tokens or characters) that repeat the start of an earlier prompt: the
    most a prefix cache could serve from this run's own prompts."""
    seen: list[str | list[int]] = []
    shared = total = 0
    for prompt in prompts:
        total += len(prompt)
        shared += max((len(os.path.commonprefix([prompt, other])) for other in seen), default=0)
        seen.append(prompt)
    return shared / total if total else 0.0


@dataclass
class CacheCheck:
    """A run's prefix-cache use as the server counted it, and what the prompts themselves allow."""

    hit_tokens: float
    query_tokens: float
    implied: float

    @property
    def hit_rate(self) -> float:
        """Hit tokens over query tokens during the run (0 when nothing was queried)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def flagged(self) -> bool:
        """Served from the cache well beyond the run's own reuse: earlier requests warmed it."""
        return self.hit_rate > self.implied + MARGIN

    def to_dict(self) -> dict[str, float | bool]:
        """Plain data."""
        return {"hit_tokens": self.hit_tokens, "query_tokens": self.query_tokens, "hit_rate": self.hit_rate,
                "implied": self.implied, "flagged": self.flagged}


def cache_check(before: tuple[float, float] | None, after: tuple[float, float] | None,
                prompts: Sequence[str | list[int]]) -> CacheCheck | None:
    """The run's CacheCheck from counters read before and after it (None when the server has none)."""
    if before is None or after is None:
        return None
    return CacheCheck(after[0] - before[0], after[1] - before[1], implied_reuse(prompts))
