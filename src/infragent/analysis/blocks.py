"""The local A/B's statistics: one number per interleaved block, a CI over blocks, a verdict against the A/A floor.

Requests inside one block share the server's state and the machine's phase, so they are not independent
samples; a CI over requests is over-confident (two identical servers then "differ" by 10-20%). Each block
is one sample here: the log of the candidate's time per output token over the baseline's on the same
requests sent back to back — their summed latencies, or the block's makespan where throughput is what
counts. A t interval over blocks covers what really varies between blocks. A win needs the whole interval beyond
the A/A floor: MIN_FLOOR where two identical launches of the baseline showed no bias on this machine (their
interval contains no change), and their interval's outer bound where it showed one. The whole interval, not
its centre: identical servers drift between looks by more than one look's interval shows (session 36: 20 A/A
looks spread with a 2.3% sd), and a centre beyond a 1% floor called 3 of 20 of them wins. Not the A/A's centre
either, where its interval contains 1: that centre is noise (17-25% per block on a latency SLO scenario), and
stacked on the candidate's own interval it cost a real 24% win its verdict in 2 of 3 CI runs (session 39).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import t as student_t

from infragent.analysis.serving_metrics import RequestRecord

MIN_FLOOR = 0.02  # the least local effect worth calling, whatever an A/A happened to show


@dataclass
class BlockEstimate:
    """The candidate/baseline latency ratio over blocks: geometric mean with a t interval."""

    ratio: float
    lo: float
    hi: float
    blocks: int
    log_ratios: list[float]
    confidence: float
    df: int = 0  # the t interval's degrees of freedom (blocks kept − 1); 0: blocks − 1
    trim: float = 0.0  # the share of blocks cut from each end before the mean (see block_estimate)

    @property
    def half_width(self) -> float:
        """Half the interval's width in log space (a relative effect size)."""
        return (math.log(self.hi) - math.log(self.lo)) / 2 if self.blocks > 1 else math.inf


BLOCK_METRICS = ("latency", "makespan")


def block_log_ratios(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
                     block: int, metric: str = "latency") -> list[float]:
    """Per block (request index // block), log(candidate / baseline) of the time per output token over the
    requests both sides completed. metric "latency": the requests' summed latencies, so with equal outputs
    (ignore_eos) the ratio of mean latencies — what a latency objective feels. metric "makespan": the block's
    first send to its last completion, so the inverse of the block's throughput — what a throughput objective
    feels (a larger batch finishes a block sooner even where each request takes as long). Where a side returned
    fewer tokens (a server that cut requests short) it compares the same work. A block where either side failed
    a request is left out; one where a side counted no tokens compares times."""
    if metric not in BLOCK_METRICS:
        raise ValueError(f"block metric {metric!r}: use one of {', '.join(BLOCK_METRICS)}")

    def by_block(records: Sequence[RequestRecord]) -> dict[int, dict[int, RequestRecord | None]]:
        out: dict[int, dict[int, RequestRecord | None]] = {}
        for r in records:
            if not r.warmup:
                out.setdefault(r.index // block, {})[r.index] = r if r.success and r.latency_s > 0 else None
        return out

    def time_taken(served: list[RequestRecord]) -> float:
        if metric == "latency":
            return sum(r.latency_s for r in served)
        return max(r.start_s + r.latency_s for r in served) - min(r.start_s for r in served)

    base, cand = by_block(baseline), by_block(candidate)
    ratios = []
    for number in sorted(base.keys() & cand.keys()):
        b, c = base[number], cand[number]
        if b.keys() != c.keys() or None in b.values() or None in c.values():
            continue
        served_b, served_c = list(b.values()), list(c.values())
        tokens_b, tokens_c = (sum(r.output_tokens for r in served) for served in (served_b, served_c))
        per = (tokens_c, tokens_b) if tokens_b > 0 and tokens_c > 0 else (1, 1)
        ratios.append(math.log((time_taken(served_c) / per[0]) / (time_taken(served_b) / per[1])))
    return ratios


def output_shortfall(records: Sequence[RequestRecord]) -> float:
    """The share of the asked output tokens that completed requests did not get (0 when all were delivered)."""
    done = [r for r in records if r.success and not r.warmup and r.output_len > 0 and r.output_tokens > 0]
    asked = sum(r.output_len for r in done)
    return 0.0 if not asked else max(0.0, 1.0 - sum(min(r.output_tokens, r.output_len) for r in done) / asked)


def block_estimate(log_ratios: Sequence[float], confidence: float = 0.95, trim: float = 0.0) -> BlockEstimate:
    """Geometric-mean ratio over blocks with a two-sided t interval (blocks − 1 degrees of freedom).

    trim > 0: Yuen's trimmed mean. The int(trim × blocks) lowest and highest log ratios are cut before the
    mean, and the interval uses the winsorized variance with (blocks kept − 1) degrees of freedom. Then a
    few wild blocks (a child that started slow, a burst on the machine) neither move the centre nor widen the
    interval the way they widen a plain t interval. With no cut (fewer than 1/trim blocks) it is the plain t
    interval."""
    data = np.asarray(log_ratios, dtype=float)
    if data.size == 0:
        return BlockEstimate(math.nan, math.nan, math.nan, 0, [], confidence)
    if data.size < 2:
        return BlockEstimate(math.exp(float(data.mean())), 0.0, math.inf, 1, data.tolist(), confidence)
    n = data.size
    cut = int(trim * n)
    kept = n - 2 * cut
    ordered = np.sort(data)
    centre = float(ordered[cut:n - cut].mean())
    winsorized = np.clip(data, ordered[cut], ordered[n - cut - 1])
    se = math.sqrt((n - 1) * float(winsorized.var(ddof=1)) / (kept * (kept - 1)))
    half = float(student_t.ppf(0.5 + confidence / 2, kept - 1)) * se
    return BlockEstimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half), int(n), data.tolist(),
                         confidence, kept - 1, trim)


def aa_floor(estimate: BlockEstimate, least: float = MIN_FLOOR) -> float:
    """The A/A floor (log) from an A/A estimate: `least` when its interval contains 1 (no bias shown: its offset
    is noise, and noise is in the candidate's own interval already), its outer bound when the interval excludes
    1 (a bias, held against by how far it may reach), never below `least`."""
    if estimate.blocks < 2:
        return math.inf
    if estimate.lo <= 1.0 <= estimate.hi:
        return least
    return max(least, abs(math.log(estimate.lo)), abs(math.log(estimate.hi)))


def block_verdict(estimate: BlockEstimate, floor: float) -> str:
    """"win" (the whole interval faster than the floor), "loss" (the whole interval slower than it), or
    "inconclusive"."""
    if estimate.blocks < 2:
        return "inconclusive"
    if estimate.hi < math.exp(-floor):
        return "win"
    if estimate.lo > math.exp(floor):
        return "loss"
    return "inconclusive"


def could_still_win(estimate: BlockEstimate, floor: float) -> bool:
    """Whether more blocks could turn this estimate into a win (its interval reaches below the floor)."""
    return estimate.blocks >= 2 and math.log(estimate.lo) < -floor


def could_win_by(estimate: BlockEstimate, floor: float, blocks: int) -> bool:
    """Whether a win is still within reach by `blocks` blocks: were the truth at the optimistic end of
    today's interval, the interval there (the spread seen so far) would lie below the floor."""
    n = estimate.blocks
    if n < 2:
        return True
    if n >= blocks:
        return False
    q = 0.5 + estimate.confidence / 2
    spread = estimate.half_width * math.sqrt(n) / float(student_t.ppf(q, estimate.df or n - 1))
    kept_then = blocks - 2 * int(estimate.trim * blocks)
    half_then = float(student_t.ppf(q, kept_then - 1)) * spread / math.sqrt(blocks)
    return math.log(estimate.lo) + half_then < -floor
