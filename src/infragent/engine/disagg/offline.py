"""Disaggregated generation without HTTP: start the router and workers, run prompts, stop (for checks
and benchmarks that compare against the colocated engine)."""
from __future__ import annotations

import asyncio

from infragent.engine.config import EngineConfig
from infragent.engine.deltas import Delta
from infragent.engine.disagg.router import DisaggConfig, DisaggEngine
from infragent.engine.sampling import SamplingParams


def generate(config: EngineConfig, disagg: DisaggConfig, prompts: list[str | list[int]],
             params: SamplingParams | list[SamplingParams]) -> list[Delta]:
    """Each prompt's whole output (text, tokens, finish reason or error), all submitted at once."""
    every = params if isinstance(params, list) else [params] * len(prompts)

    async def run() -> list[Delta]:
        engine = DisaggEngine(config, disagg, max_waiting=len(prompts) + 1)
        engine.start(asyncio.get_running_loop())
        try:
            streams = [engine.submit(p, sp) for p, sp in zip(prompts, every)]
            return [await stream.collect() for stream in streams]
        finally:
            engine.shutdown()

    return asyncio.run(run())
