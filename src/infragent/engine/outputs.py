"""RequestOutput: what a finished (or rejected) request returns to the caller."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infragent.engine.sampling import TokenLogprob
from infragent.engine.sequence import Sequence


@dataclass
class RequestOutput:
    """The completion of one request, or the error that rejected it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop", "length", or None when rejected
    error: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # with SamplingParams.prompt_logprobs: [prompt tokens, vocab], row i = log p(next token | prompt[:i + 1])
    prompt_logprobs: torch.Tensor | None = None
    logprobs: list[TokenLogprob] | None = None  # with SamplingParams.logprobs: one per generated token
    prompt_top_logprobs: list[TokenLogprob] | None = None  # with prompt_top_logprobs: prompt tokens 1.. in order

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


def request_output(seq: Sequence) -> RequestOutput:
    """The RequestOutput of a finished sequence."""
    return RequestOutput(
        request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
        token_ids=list(seq.output_token_ids), text=seq.text, finish_reason=seq.finish_reason,
        arrival_time=seq.arrival_time, first_token_time=seq.first_token_time, finish_time=seq.finish_time,
        num_cached_tokens=seq.num_cached_tokens, num_preemptions=seq.num_preemptions,
        prompt_logprobs=_prompt_logprobs(seq), logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None
        else None, prompt_top_logprobs=prompt_top_logprobs(seq))


def prompt_top_logprobs(seq: Sequence) -> list[TokenLogprob] | None:
    """With params.prompt_top_logprobs: prompt tokens 1.. each with its log-probability and alternatives, in
    order, each position once (a preempted sequence recomputes its prefix, possibly in other chunks)."""
    if seq.params.prompt_top_logprobs is None:
        return None
    rows: list[TokenLogprob] = []
    for position in sorted(seq.prompt_top):
        chunk = seq.prompt_top[position]
        rows += chunk[len(rows) - position:] if position + len(chunk) > len(rows) else []
    return rows


def _prompt_logprobs(seq: Sequence) -> torch.Tensor | None:
    """The prompt's log-probability rows in position order, each position once (a preempted sequence
    recomputes its prefix, possibly in other chunks)."""
    if not seq.prompt_logprobs:
        return None
    rows, covered = [], 0
    for position in sorted(seq.prompt_logprobs):
        chunk = seq.prompt_logprobs[position]
        if position + len(chunk) > covered:
            rows.append(chunk[covered - position:])
            covered = position + len(chunk)
    return torch.cat(rows)
