"""How the engine's scheduler shaped a traced run: prefill cut into chunks at the token budget, and requests
waiting for a slot while the batch is full. Read from the engine's own spans ("prefill" with its
prefill_tokens) and counters ("running", "waiting") — what a top-spans view cannot say, because the time
is spread evenly over steps that should not have been that many.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from infragent.trace_model import Trace


@dataclass
class Scheduling:
    """What the scheduler did in one traced run."""

    prefill_steps: int
    prefill_tokens: int
    steps_at_budget: int  # prefill steps whose batch (prefill and decode tokens) filled max_num_batched_tokens
    token_budget: int
    max_running: int
    seq_limit: int
    waiting_samples: int  # counter samples with requests waiting while the batch was at its limit
    samples: int
    step_share: float  # the share of traced step time spent in prefill steps

    def to_dict(self) -> dict:
        """Plain data."""
        return asdict(self)


def scheduling(trace: Trace, token_budget: int, seq_limit: int) -> Scheduling:
    """The scheduler's view of a traced engine run with this token budget and sequence limit."""
    prefills = [s for s in trace.spans if s.name == "prefill"]
    tokens = [int(s.attrs.get("prefill_tokens", s.attrs.get("tokens", 0)) or 0) for s in prefills]
    batched = [int(s.attrs.get("tokens", 0) or 0) for s in prefills]  # the budget counts decodes mixed in too
    steps = [s for s in trace.spans if s.name in ("prefill", "decode")]
    total = sum(s.dur_ns for s in steps) or 1
    running = [c for c in trace.counters if c.name == "running"]
    waiting = [c for c in trace.counters if c.name == "waiting"]  # sampled right after running, once per step
    full = [r for r, w in zip(running, waiting) if r.value >= seq_limit and w.value > 0]
    return Scheduling(prefill_steps=len(prefills), prefill_tokens=sum(tokens),
                      steps_at_budget=sum(1 for t in batched if t >= token_budget), token_budget=token_budget,
                      max_running=int(max((c.value for c in running), default=0)), seq_limit=seq_limit,
                      waiting_samples=len(full), samples=len(running),
                      step_share=sum(s.dur_ns for s in prefills) / total)
