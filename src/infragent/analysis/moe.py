"""MoE in a trace: how evenly the expert-parallel ranks were loaded (the rows each rank's experts ran, from the
moe.experts spans' rows_per_rank), and the share of prefill spent in dispatch and combine."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infragent.analysis.intervals import intersect, length, merge
from infragent.analysis.trace_columns import TraceColumns

EXCHANGE = ("moe.dispatch", "moe.combine")


@dataclass
class MoeBalance:
    """rows_per_rank: rows the experts of each rank ran over the trace (empty without expert parallelism);
    exchange_share_of_prefill: dispatch + combine time inside prefill spans over those spans' time (None when
    the trace has no prefill span)."""

    layers_seen: int
    rows_per_rank: list[int]
    exchange_share_of_prefill: float | None

    @property
    def rank_imbalance(self) -> float | None:
        """The busiest rank's rows over the mean (1 = balanced)."""
        if not self.rows_per_rank or sum(self.rows_per_rank) == 0:
            return None
        return max(self.rows_per_rank) / (sum(self.rows_per_rank) / len(self.rows_per_rank))


def moe_balance(c: TraceColumns) -> MoeBalance | None:
    """The MoE figures of a trace, or None when it has no MoE spans."""
    experts = np.flatnonzero(c.select("moe.experts"))
    if experts.size == 0:
        return None
    per_rank: list[int] = []
    for row in experts.tolist():
        counts = c.attrs(row).get("rows_per_rank") or []
        per_rank = [a + b for a, b in zip(per_rank, counts)] if per_rank else list(counts)
    prefill = c.select("prefill")
    share = None
    if prefill.any():
        windows = merge(c.start[prefill], c.end[prefill])
        exchange = np.isin(c.name, [c.names.index(n) for n in EXCHANGE if n in c.names])
        inside = intersect(windows, merge(c.start[exchange], c.end[exchange]))
        share = length(*inside) / max(length(*windows), 1)
    return MoeBalance(int(experts.size), per_rank, share)


def describe(balance: MoeBalance) -> str:
    """One finding line."""
    parts = [f"MoE: {balance.layers_seen} moe.experts spans"]
    if balance.rank_imbalance is not None:
        parts.append(f"rows per expert-parallel rank {balance.rows_per_rank}: max/mean {balance.rank_imbalance:.2f}")
    if balance.exchange_share_of_prefill is not None:
        parts.append(f"dispatch + combine {balance.exchange_share_of_prefill:.1%} of prefill")
    return ", ".join(parts)
