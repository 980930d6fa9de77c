"""Two engine variants A/B'd on real decode steps: the loop native_kernels.py and huge_pages.py share.

Both engines hold the same batch of sequences 128 tokens into their context; rounds alternate which one
steps first (ABBA), and each round times a few decode steps of each.
"""
from __future__ import annotations

import time

import torch

from infragent.analysis.stats import bootstrap_median, paired_ratio
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams


def fill(llm: LLM, batch: int, max_tokens: int) -> None:
    """Add `batch` 128-token prompts and run their prefill."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        llm.engine.add_request(torch.randint(100, 40000, (128,), generator=gen).tolist(),
                               SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while any(s.num_computed_tokens < len(s.prompt_token_ids) for s in llm.engine.scheduler.running) \
            or llm.engine.scheduler.waiting:
        llm.engine.step()


def step_ms(llm: LLM, steps: int) -> float:
    """Mean wall time of `steps` engine decode steps."""
    start = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    return (time.perf_counter() - start) / steps * 1e3


def ab_steps(a: LLM, b: LLM, batch: int, rounds: int, steps: int) -> tuple[list[float], list[float]]:
    """ms per decode step of a and of b, one sample per round, rounds in ABBA order."""
    for llm in (a, b):
        fill(llm, batch, 2 + 2 * rounds * steps)
    samples: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = (0, 1) if r % 4 in (0, 3) else (1, 0)
        for i in order:
            samples[i].append(step_ms((a, b)[i], steps))
    for llm in (a, b):
        while llm.engine.has_unfinished():
            llm.engine.step()
    return samples


def ab_line(batch: int, names: tuple[str, str], samples: tuple[list[float], list[float]]) -> str:
    """One batch size's result: ms per step of both and the per-round ratio a/b with its CI."""
    ratio = paired_ratio(samples[1], samples[0])  # per round: a / b
    return (f"batch {batch:3d}: {names[0]} {bootstrap_median(samples[0]).fmt(1)} ms/step, "
            f"{names[1]} {bootstrap_median(samples[1]).fmt(1)} ms/step, {names[0]}/{names[1]} {ratio.fmt(3)}")
