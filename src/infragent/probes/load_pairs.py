"""Interleaved loadgen: the same requests against two (or more) endpoints, block by block in random order.

Comparing a candidate with a baseline by running one whole benchmark after the other lets this machine's
slow phases, which last seconds, land on one side more than the other: twin requests are then not
independent pairs, and a paired test is over-confident. Here every block of requests goes to each side
back to back, in a fresh random order, so twins are seconds apart at most and share the machine's state,
as `bench` pairs A and B call by call. At concurrency 1 a block is one request.
"""
from __future__ import annotations

import asyncio
import random
from typing import Mapping

from infragent.analysis.serving_metrics import RequestRecord
from infragent.probes.load_arrivals import arrival_times
from infragent.probes.load_client import ConnectionPool, now_clock
from infragent.probes.loadgen import (LoadConfig, LoadRun, build_requests, finish_run, progress_bar, send_requests,
                                      warm_up)


def default_block(config: LoadConfig) -> int:
    """Requests per block: one per concurrency slot, so a block fills the server once (8 when unlimited)."""
    return config.max_concurrency or 8


async def run_interleaved(configs: Mapping[str, LoadConfig], models: Mapping[str, str], seed: int,
                          block: int | None = None, order_seed: int | None = None) -> dict[str, LoadRun]:
    """One repeat against every side: identical requests (from seed), blocks sent to each side in random order.

    The configs differ only in base URL (and key); the first one sets the workload. Each block keeps its
    slice of the arrival schedule, restarted at the block's start. A side's duration is the sum of its
    blocks' durations.
    """
    names = list(configs)
    workload = configs[names[0]]
    size = block or default_block(workload)
    specs = build_requests(workload, workload.num_prompts, seed)
    offsets = arrival_times(len(specs), workload.request_rate, workload.burstiness, workload.arrival, seed)
    pools = {name: ConnectionPool(c.base_url, c.api_key) for name, c in configs.items()}
    clock = now_clock()
    records: dict[str, list[RequestRecord]] = {}
    for name in names:
        records[name] = await warm_up(configs[name], models[name], pools[name], clock, seed)
    durations = dict.fromkeys(names, 0.0)
    order = random.Random(seed if order_seed is None else order_seed)
    with progress_bar(workload, len(specs) * len(names)) as advance:
        for first in range(0, len(specs), size):
            indexed = list(enumerate(specs))[first:first + size]
            shifted = [t - offsets[first] for t in offsets[first:first + size]]
            for name in order.sample(names, len(names)):
                measured, took = await send_requests(configs[name], models[name], pools[name], clock, indexed,
                                                     shifted, advance)
                for record in measured:  # a side's timeline is its blocks laid end to end
                    record.start_s += durations[name]
                records[name].extend(measured)
                durations[name] += took
    for pool in pools.values():
        pool.close()
    return {name: finish_run(configs[name], records[name], durations[name]) for name in names}


def run_interleaved_sync(configs: Mapping[str, LoadConfig], models: Mapping[str, str], seed: int,
                         block: int | None = None, order_seed: int | None = None) -> dict[str, LoadRun]:
    """run_interleaved from synchronous code."""
    return asyncio.run(run_interleaved(configs, models, seed, block, order_seed))
