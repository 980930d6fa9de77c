"""The mixture-of-experts feed-forward layer: a router picks top-k of N SwiGLU experts per token, each expert
runs one GEMM over the rows routed to it, and the results are weighted and summed in slot order; an optional
shared expert sees every token.

The four stages are spans (moe.route, moe.dispatch, moe.experts, moe.combine). On one process, dispatch
is the gather of each expert's rows and combine the weighted sum; under expert parallelism
(parallel/expert.py) the same two stages are where tokens cross ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infragent.engine.models.layers import GatedMLP, Linear
from infragent.engine.options import ROUTER_SCORINGS as SCORINGS
from infragent.trace import span

@dataclass
class Routing:
    """Which experts each token goes to: expert ids [T, k] (int64) and their weights [T, k] (fp32, each row
    summing to 1)."""

    expert_ids: torch.Tensor
    weights: torch.Tensor

    @property
    def top_k(self) -> int:
        return self.expert_ids.shape[1]


class Router:
    """Scores every expert for every token (softmax or sigmoid of x · W_gate), keeps the k best and normalizes
    their weights to sum to 1. Equal scores go to the lower expert id, on every rank and every run."""

    def __init__(self, weight: torch.Tensor, top_k: int, scoring: str, bias: torch.Tensor | None = None) -> None:
        """bias [experts]: added to the scores to choose the experts only, not to weight them (DeepSeek-V3's
        e_score_correction_bias); None: no bias."""
        if scoring not in SCORINGS:
            raise ValueError(f"router scoring: {scoring!r}; choose one of {', '.join(SCORINGS)}")
        if not 1 <= top_k <= weight.shape[0]:
            raise ValueError(f"num_experts_per_tok: {top_k} must be between 1 and the {weight.shape[0]} experts")
        self.gate = Linear(weight.float())  # routing stays fp32 whatever the experts' dtype
        self.top_k, self.scoring = top_k, scoring
        self.bias = None if bias is None else bias.float()

    @property
    def num_experts(self) -> int:
        return self.gate.weight_t.shape[1]

    def __call__(self, x: torch.Tensor) -> Routing:
        logits = self.gate(x.float())
        scores = torch.softmax(logits, dim=-1) if self.scoring == "softmax" else torch.sigmoid(logits)
        choice = scores if self.bias is None else scores + self.bias
        # a stable descending sort keeps the lower expert id first among equal scores (topk does not promise it)
        ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :self.top_k]
        top = scores.gather(1, ids)
        return Routing(ids, top / top.sum(dim=-1, keepdim=True))


@dataclass
class Dispatched:
    """Token rows grouped by expert: rows [A, hidden] (A = tokens x k assignments) in expert order, counts
    [experts] of rows per expert, and slot [A]: the flat (token * k + j) position each row came from."""

    rows: torch.Tensor
    counts: list[int]
    slot: torch.Tensor


def group_by_expert(x: torch.Tensor, routing: Routing, num_experts: int) -> Dispatched:
    """Gather every (token, slot) assignment's row of x into runs, one per expert, in expert order (within a
    run, in token order)."""
    flat = routing.expert_ids.reshape(-1)
    slot = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return Dispatched(x.index_select(0, slot // routing.top_k), counts, slot)


def run_experts(experts: list[GatedMLP], rows: torch.Tensor, counts: list[int], native: bool) -> torch.Tensor:
    """Each expert's SwiGLU on its run of rows: one GEMM per expert and projection (experts with no rows
    are skipped)."""
    out = torch.empty(rows.shape[0], rows.shape[1], dtype=rows.dtype)
    start = 0
    for expert, count in zip(experts, counts):
        if count:
            out[start:start + count] = expert(rows[start:start + count], native)
        start += count
    return out


def combine(expert_out: torch.Tensor, slot: torch.Tensor, routing: Routing) -> torch.Tensor:
    """out[t] = sum over j = 0..k-1 of weight[t, j] * (expert j's output for t), added in slot order so the
    result does not depend on which rank or in which order the experts ran."""
    tokens, k = routing.expert_ids.shape
    by_slot = torch.empty(tokens * k, expert_out.shape[1], dtype=expert_out.dtype)
    by_slot[slot] = expert_out
    weighted = by_slot.view(tokens, k, expert_out.shape[1]) * routing.weights.to(expert_out.dtype).unsqueeze(-1)
    out = weighted[:, 0].clone()
    for j in range(1, k):
        out += weighted[:, j]
    return out


class MoE:
    """The MoE feed-forward layer of one decoder layer; called like GatedMLP."""

    def __init__(self, router: Router, experts: list[GatedMLP], shared: GatedMLP | None,
                 first_expert: int = 0) -> None:
        """experts: those this process holds, ids first_expert onwards (all of them without expert parallelism)."""
        if first_expert + len(experts) > router.num_experts:
            raise ValueError(f"MoE: the router scores {router.num_experts} experts; experts {first_expert}.."
                             f"{first_expert + len(experts) - 1} were given")
        self.router, self.experts, self.shared = router, experts, shared
        self.local_experts = (first_expert, first_expert + len(experts))
        self.exchange = None  # expert parallelism: parallel/expert.py's ExpertExchange; None runs every expert here
        # load balance over all experts (every rank's tokens): assignments since load, and in the last step
        self.tokens_per_expert = torch.zeros(router.num_experts, dtype=torch.long)
        self.last_step = torch.zeros(router.num_experts, dtype=torch.long)

    def __call__(self, x: torch.Tensor, native: bool = False) -> torch.Tensor:
        if self.exchange is not None:
            return self.exchange(self, x, native)
        if len(self.experts) != self.router.num_experts:
            raise RuntimeError("MoE: this process holds only some experts; it needs an expert exchange")
        with span("moe.route", tokens=x.shape[0]):
            routing = self.router(x)
            self.record(torch.bincount(routing.expert_ids.reshape(-1), minlength=len(self.experts)))
        with span("moe.dispatch", tokens=x.shape[0]):
            grouped = group_by_expert(x, routing, len(self.experts))
        with span("moe.experts", tokens=grouped.rows.shape[0]):
            expert_out = run_experts(self.experts, grouped.rows, grouped.counts, native)
        with span("moe.combine", tokens=x.shape[0]):
            out = combine(expert_out, grouped.slot, routing)
            if self.shared is not None:
                out += self.shared(x, native)
        return out

    def record(self, per_expert: torch.Tensor) -> None:
        """This step's assignments per expert [experts]: kept as last_step, added to tokens_per_expert."""
        self.last_step = per_expert
        self.tokens_per_expert += per_expert


def reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The layer token by token, slot by slot (no grouping): what the grouped path must reproduce."""
    routing = moe.router(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(routing.top_k):
            expert = moe.experts[int(routing.expert_ids[t, j])]
            out[t] += routing.weights[t, j].to(x.dtype) * expert(x[t:t + 1])[0]
        if moe.shared is not None:
            out[t] += moe.shared(x[t:t + 1])[0]
    return out
