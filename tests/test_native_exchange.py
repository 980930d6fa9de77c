"""The MoE exchange's shared-memory all-to-all between two real processes: rows arrive where they were sent,
uneven and empty splits included, and a peer that exits fails the call at once with its rank, not a hang."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from infragent.engine.parallel.group import RankDiedError, init_group, spawn_ranks, stop_ranks
from infragent.engine.parallel.native_exchange import NativeAllToAll, NativeExchangeError

CAPACITY = 1 << 16
SPLITS = [[[1, 3], [0, 2]],  # SPLITS[call][rank][destination]: rows rank sends to destination in that call
          [[0, 0], [5, 1]],
          [[2, 2], [2, 2]]]


def rows_of(call: int, rank: int, destination: int) -> torch.Tensor:
    """The rows rank sends destination in one call: values that say who sent them, to whom, in which call."""
    n = SPLITS[call][rank][destination]
    return (1000 * call + 100 * rank + 10 * destination + torch.arange(n * 3, dtype=torch.float32)).view(n, 3)


def exchange_all(rank: int, release_gil: bool) -> list[torch.Tensor]:
    exchange = NativeAllToAll(rank, 2, CAPACITY, release_gil)
    received = []
    for call in range(len(SPLITS)):
        send = torch.cat([rows_of(call, rank, d) for d in range(2)])
        recv_rows = [SPLITS[call][s][rank] for s in range(2)]
        received.append(exchange(send, SPLITS[call][rank], recv_rows))
    return received


def peer(mode: str, release_gil: bool, rank: int, world: int, port: int) -> None:
    init_group(rank, world, port)
    if mode == "exchange":
        exchange_all(rank, release_gil)
        dist.broadcast_object_list([None], src=0)  # stop_ranks' goodbye
    else:
        NativeAllToAll(rank, world, CAPACITY, release_gil)  # joins the segment, then dies before any call
    dist.destroy_process_group()


@pytest.mark.parametrize("release_gil", [True, False])
def test_rows_arrive_from_every_rank_in_order(release_gil):
    workers, port = spawn_ranks(peer, "exchange-peer", 2, "exchange", release_gil)
    init_group(0, 2, port)
    try:
        received = exchange_all(0, release_gil)
    finally:
        stop_ranks(workers)
    for call, got in enumerate(received):
        assert torch.equal(got, torch.cat([rows_of(call, s, 0) for s in range(2)])), call


def test_a_peer_that_exits_fails_the_call_with_its_rank():
    workers, port = spawn_ranks(peer, "exchange-peer", 2, "exit", True)
    init_group(0, 2, port)
    try:
        exchange = NativeAllToAll(0, 2, CAPACITY, release_gil=False)
        workers[0].join(timeout=30)
        start = time.perf_counter()
        with pytest.raises(RankDiedError, match=r"moe exchange: rank 1 \(pid \d+\) exited"):
            exchange(torch.zeros(2, 3), [1, 1], [1, 1])
        assert time.perf_counter() - start < 5  # noticed by the liveness look, not the 120 s timeout
        with pytest.raises(NativeExchangeError, match="more rows for one rank than the segment holds"):
            exchange(torch.zeros(CAPACITY, 3), [CAPACITY, 0], [0, 0])
    finally:
        stop_ranks(workers)
