"""Expert parallelism: each rank holds a contiguous share of every MoE layer's experts, and tokens travel to
the experts they were routed to.

Every rank runs the same forward in lock step (tp_runner.py), so attention and KDA see every token on every
rank (replicated, or split by heads under tensor parallelism on the same ranks). In an MoE layer each rank
takes its own slice of the step's tokens, as a data-parallel attention rank would hold its own requests:
  route     the slice's top-k experts;
  dispatch  every rank learns every rank's per-expert counts (all-gather), then one all-to-all sends each
            (token, slot) row to the rank that owns its expert, sorted by expert (so the counts tell the
            receiver which expert each row is for: no ids travel with the rows);
  experts   one GEMM per local expert over the rows it received, from every rank;
  combine   the all-to-all back, in the order the rows were sent, then the weighted sum in slot order (the
            same arithmetic as one process), plus the shared expert on the slice;
and the slices are gathered so the next layer sees every token again.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from infragent.engine.models.moe import MoE, combine, run_experts
from infragent.engine.models.shape import ModelShape
from infragent.engine.parallel.shard import bounds
from infragent.trace import span


def expert_bounds(num_experts: int, world: int, rank: int) -> tuple[int, int]:
    """[first, last) expert ids rank holds (world divides num_experts: config checks it)."""
    per = num_experts // world
    return rank * per, (rank + 1) * per


def drop_foreign_experts(shape: ModelShape, weights: dict[str, torch.Tensor], rank: int, world: int) -> ModelShape:
    """Remove the experts other ranks hold from weights (in place); the shape this rank builds."""
    first, last = expert_bounds(shape.num_experts, world, rank)
    for name in [n for n in weights if ".mlp.experts." in n]:
        if not first <= int(name.split(".mlp.experts.")[1].split(".")[0]) < last:
            del weights[name]
    return replace(shape, local_experts=(first, last))


class GlooTransport:
    """Dispatch and combine over torch.distributed (gloo); torch releases the GIL while it waits."""

    name = "gloo"

    def all_to_all(self, send: torch.Tensor, send_rows: list[int], recv_rows: list[int]) -> torch.Tensor:
        """send_rows[d] rows of send to each rank d; the rows each rank sent here, in rank order."""
        received = torch.empty(sum(recv_rows), send.shape[1], dtype=send.dtype)
        dist.all_to_all_single(received, send.contiguous(), recv_rows, send_rows)
        return received

    def all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's rows (the same shape on every rank), in rank order."""
        pieces = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, rows.contiguous())
        return pieces


class NativeTransport:
    """Dispatch and combine through the shared-memory all-to-all (native_exchange.py), the GIL held or
    released in its calls; the segment is joined at the first call (every rank makes it in lock step)."""

    def __init__(self, rank: int, world: int, capacity: int, release_gil: bool) -> None:
        self.rank, self.world, self.capacity, self.release_gil = rank, world, capacity, release_gil
        self._exchange = None

    @property
    def name(self) -> str:
        return "native" if self.release_gil else "native-gil-held"

    def all_to_all(self, send: torch.Tensor, send_rows: list[int], recv_rows: list[int]) -> torch.Tensor:
        if self._exchange is None:
            from infragent.engine.parallel.native_exchange import NativeAllToAll

            self._exchange = NativeAllToAll(self.rank, self.world, self.capacity, self.release_gil)
        self._exchange.release_gil = self.release_gil  # this process's choice (set_exchange_gil may change it)
        return self._exchange(send, send_rows, recv_rows)

    def all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        n = rows.shape[0]
        return list(self.all_to_all(rows.repeat(self.world, 1), [n] * self.world, [n] * self.world).split(n))


def make_transport(name: str, rank: int, world: int, capacity: int) -> GlooTransport | NativeTransport:
    """The transport the moe_exchange knob names (capacity: the most bytes one rank sends another at once)."""
    return GlooTransport() if name == "gloo" else NativeTransport(rank, world, capacity, name == "native")


class ExpertExchange:
    """One MoE layer's dispatch and combine across the expert-parallel ranks."""

    def __init__(self, rank: int, world: int, transport: GlooTransport | NativeTransport) -> None:
        self.rank, self.world, self.transport = rank, world, transport

    def __call__(self, moe: MoE, x: torch.Tensor, native: bool) -> torch.Tensor:
        tokens = x.shape[0]
        t0, t1 = bounds(tokens, self.world, self.rank)
        mine = x[t0:t1]
        num_experts = moe.router.num_experts
        first, last = moe.local_experts
        with span("moe.route", tokens=t1 - t0):
            routing = moe.router(mine)
            flat = routing.expert_ids.reshape(-1)
            local_counts = torch.bincount(flat, minlength=num_experts)
        with span("moe.dispatch", tokens=t1 - t0, transport=self.transport.name) as s:
            counts = torch.stack(self.transport.all_gather(local_counts.unsqueeze(0))).view(self.world, num_experts)
            moe.record(counts.sum(dim=0))
            per_rank = counts.view(self.world, self.world, -1).sum(dim=2)  # [source, destination] rows
            order = torch.sort(flat, stable=True).indices  # grouped by expert, hence by destination rank
            send = mine.index_select(0, order // routing.top_k)
            send_rows, recv_rows = per_rank[self.rank].tolist(), per_rank[:, self.rank].tolist()
            received = self.transport.all_to_all(send, send_rows, recv_rows)
            if s is not None:  # recording: the rows this rank sent to and received from each rank
                s.attrs.update(sent=send_rows, received=recv_rows)
        with span("moe.experts", rows=received.shape[0], rows_per_rank=per_rank.sum(dim=0).tolist()):
            # each source sent its rows for this rank's experts in expert order, so the counts say whose is whose
            local = counts[:, first:last]
            expert_of = torch.arange(first, last).repeat(self.world).repeat_interleave(local.reshape(-1))
            grouped = torch.sort(expert_of, stable=True).indices
            out = run_experts(moe.experts, received[grouped], local.sum(dim=0).tolist(), native)
            result = torch.empty_like(out)
            result[grouped] = out
        with span("moe.combine", tokens=t1 - t0, transport=self.transport.name):
            back = self.transport.all_to_all(result, recv_rows, send_rows)
            y = combine(back, order, routing)
            if moe.shared is not None:
                y += moe.shared(mine, native)
            return self.gather(y, tokens)

    def gather(self, y: torch.Tensor, tokens: int) -> torch.Tensor:
        """Every rank's slice of the step's tokens, in token order (slices padded to one size)."""
        padded = torch.zeros(-(-tokens // self.world), y.shape[1], dtype=y.dtype)
        padded[:y.shape[0]] = y
        pieces = self.transport.all_gather(padded)
        return torch.cat([p[:b - a] for p, (a, b) in
                          zip(pieces, (bounds(tokens, self.world, r) for r in range(self.world)))])


def set_exchange_gil(model, release: bool) -> None:  # noqa: ANN001 (DecoderModel)
    """Make this process's native dispatch/combine calls release the GIL (True) or hold it (False): only the
    process whose other threads need the GIL cares, so a benchmark may flip rank 0 alone between twins."""
    for _, _, _, mlp in model.layers:
        if isinstance(mlp, MoE) and isinstance(getattr(mlp.exchange, "transport", None), NativeTransport):
            mlp.exchange.transport.release_gil = release


def make_expert_parallel(model, rank: int, world: int, transport: str, max_tokens: int) -> None:  # noqa: ANN001
    """Route every MoE layer of a rank's model through an ExpertExchange over one shared transport (max_tokens:
    the most tokens one step runs, which sizes the native transport's mailboxes)."""
    shape = model.shape
    slice_rows = -(-max_tokens // world)
    # fp32 rows (the widest dtype): a slice's top-k rows, or the counts (int64 per expert)
    capacity = max(4 * slice_rows * shape.num_experts_per_tok * shape.hidden_size, 8 * shape.num_experts)
    shared = make_transport(transport, rank, world, capacity)
    for _, _, _, mlp in model.layers:
        if isinstance(mlp, MoE):
            mlp.exchange = ExpertExchange(rank, world, shared)
