"""The GEMM-only floor of one decode step: every linear of SmolLM2-135M plus the LM head, nothing else.

Compares it with a real engine decode step at the same batch size, so the gap is the cost of
everything that is not a weight GEMM (attention, norms, rotary, KV writes, sampling, Python). With --ops, the
trace of the real steps too: each op's share of their CPU time (torch.profiler), the largest first.
    PYTHONPATH=src .venv/bin/python benchmarks/decode_floor.py [--batch 1 32] [--rounds 20]
        [--formats gguf,gguf-a16] [--ops 8]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import ContextManager

import torch

from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams


def gemm_only_step(llm: LLM, x: torch.Tensor) -> None:
    """Apply every linear of the model (and the LM head) to x, in layer order."""
    model = llm.engine.model
    inter = model.shape.intermediate_size
    for _, mixer, _, mlp in model.layers:
        mixer.qkv(x)
        mixer.o(x)
        mlp.down(mlp.gate_up(x)[:, :inter])
    model.lm_head(x)


def engine_step_ms(llm: LLM, batch: int, steps: int, around: ContextManager | None = None) -> list[float]:
    """Per-step wall times of real decode steps with `batch` sequences 128 tokens into their context (the
    timed steps only run inside `around`, e.g. a profiler)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        llm.engine.add_request(torch.randint(100, 40000, (128,), generator=gen).tolist(),
                               SamplingParams(max_tokens=steps + 2, ignore_eos=True))
    llm.engine.step()  # prefill
    llm.engine.step()
    times = []
    with around if around is not None else contextlib.nullcontext():
        for _ in range(steps):
            start = time.perf_counter()
            llm.engine.step()
            times.append((time.perf_counter() - start) * 1e3)
    while llm.engine.has_unfinished():
        llm.engine.step()
    return times


def op_shares(llm: LLM, batch: int, steps: int, top: int) -> list[tuple[str, float, int]]:
    """(op, ms per step, calls per step) of the `top` ops by self CPU time over `steps` real decode steps."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    engine_step_ms(llm, batch, steps, around=prof)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [(e.key, e.self_cpu_time_total / 1e3 / steps, round(e.count / steps)) for e in events]


def main() -> None:
    """Print GEMM-only and real decode-step medians per weight format and batch size (and, --ops, the trace)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--formats", default="auto", help="comma-separated weight_format values")
    parser.add_argument("--ops", type=int, default=0, help="also print this many ops of the real steps' trace")
    args = parser.parse_args()
    for fmt in args.formats.split(","):
        llm = LLM(model="llama", enable_prefix_caching=False, max_num_batched_tokens=4096, weight_format=fmt)
        nbytes = llm.engine.model.nbytes()
        for batch in args.batch:
            x = torch.randn(batch, llm.engine.shape.hidden_size)
            gemm_only_step(llm, x)
            floor = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                gemm_only_step(llm, x)
                floor.append((time.perf_counter() - start) * 1e3)
            real = engine_step_ms(llm, batch, args.rounds)
            f, r = statistics.median(floor), statistics.median(real)
            print(f"{fmt} batch {batch:3d}: GEMM-only {f:6.2f} ms ({nbytes / f / 1e6:.1f} GB/s of weights)   "
                  f"engine step {r:6.2f} ms   non-GEMM share {1 - f / r:.0%}")
            if args.ops:
                for name, ms, calls in op_shares(llm, batch, args.rounds, args.ops):
                    print(f"    {name:<40} {ms:7.3f} ms/step  {calls:5d} calls/step")
        llm.close()


if __name__ == "__main__":
    main()
